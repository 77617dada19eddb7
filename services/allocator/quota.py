"""Quota per role for the allocator core: a role's *limit* (its subtree's frameworks are
never offered more than it together: held = used + offered) and its *guarantee* (set aside
while the role has demand: a role beyond its own unmet guarantee may take only what the free
pool holds beyond the unmet guarantees of other roles with demand, Mesos's "headroom").
Pure functions over the core's sorter (which keeps each role's subtree allocation) and
the quota table."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from services.allocator.fill import next_unit
from services.allocator.sorter import DRF_RESOURCES, role_path
from services.resources import MILLI, Key, Resources

if TYPE_CHECKING:
    from services.allocator.core import AllocatorCore
    from services.allocator.model import Framework

Vector = Mapping[str, int]


@dataclass
class Quota:
    guarantee: dict[str, int] = field(default_factory=dict)  # DRF scalars, milli-units
    limit: dict[str, int] = field(default_factory=dict)  # names absent are not limited


class Quotas:
    """role -> Quota, for the roles with a guarantee or a limit."""

    def __init__(self) -> None:
        self.roles: dict[str, Quota] = {}
        self.limited: dict[str, dict[str, int]] = {}
        self.guaranteed: dict[str, dict[str, int]] = {}

    def set(self, role: str, guarantee: Vector, limit: Vector) -> bool:
        """Whether anything changed."""
        new = Quota(dict(guarantee), dict(limit))
        if self.roles.get(role, Quota()) == new:
            return False
        for table, vec in ((self.limited, new.limit), (self.guaranteed, new.guarantee)):
            if vec:
                table[role] = dict(vec)
            else:
                table.pop(role, None)
        if new.guarantee or new.limit:
            self.roles[role] = new
        else:
            self.roles.pop(role, None)
        return True

    def __bool__(self) -> bool:
        return bool(self.roles)


QuotaSpec = Resources | Mapping[str, float] | None  # a guarantee or limit as given


def quota_vector(spec: QuotaSpec) -> dict[str, int]:
    """DRF scalars in milli-units, zeros kept (a limit of cpus:0 is a limit): from
    Resources (summed across reservation roles) or {name: amount}."""
    out: dict[str, int] = {}
    if isinstance(spec, Resources):
        for (n, _), v in spec.scalars.items():
            if n in DRF_RESOURCES:
                out[n] = out.get(n, 0) + v
    elif spec is not None:
        for n, amount in spec.items():
            if n in DRF_RESOURCES:
                out[n] = out.get(n, 0) + round(amount * MILLI)
    return out


def describe(vec: Vector) -> str:
    return ";".join(f"{n}:{v / MILLI:g}" for n, v in sorted(vec.items())) or "-"


def limit_room(core: AllocatorCore, role: str) -> dict[str, int] | None:
    """What the role may still be offered under the limits of itself and its ancestors
    (per DRF scalar; names absent are not limited), or None when none is limited."""
    room: dict[str, int] | None = None
    for p in role_path(role):
        limit = core.quotas.limited.get(p)
        if limit is None:
            continue
        held = core.sorter.role_allocation(p)
        room = room if room is not None else {}
        for n, v in limit.items():
            left = max(0, v - held.get(n, 0))
            room[n] = min(room.get(n, left), left)
    return room


def demanding_roles(core: AllocatorCore) -> set[str]:
    """The roles (and their ancestors) of the eligible frameworks with unmet (or unknown)
    demand: those whose guarantee is set aside."""
    out: set[str] = set()
    for fid, fw in core.frameworks.items():
        if (fw.active and not fw.suppressed and fw.role not in out
                and (not fw.demands
                     or next_unit(fw.demands, core.sorter.allocation(fid)) is not None)):
            out.update(role_path(fw.role))
    return out


def shortfalls(core: AllocatorCore, demanding: set[str], role: str = ""
               ) -> dict[str, dict[str, int]]:
    """The unmet guarantees of the roles with demand other than `role` and its ancestors."""
    mine = set(role_path(role)) if role else set()
    out = {}
    for q, guarantee in core.quotas.guaranteed.items():
        if q in mine or q not in demanding:
            continue
        held = core.sorter.role_allocation(q)
        short = {n: v - held.get(n, 0) for n, v in guarantee.items() if v > held.get(n, 0)}
        if short:
            out[q] = short
    return out


def guard_room(core: AllocatorCore, role: str, demanding: set[str]) -> dict[str, int] | None:
    """What a framework of `role` may take without eating into what other roles with
    demand still need of their guarantees: its own (and its ancestors') unmet guarantee,
    plus the free pool beyond the others' unmet guarantees; None when nothing is set
    aside."""
    need: dict[str, int] = {}
    for short in shortfalls(core, demanding, role).values():
        for n, v in short.items():
            need[n] = need.get(n, 0) + v
    if not need:
        return None
    own = own_shortfall(core, role)
    total, used = core.sorter.total, core.sorter.used
    return {n: own.get(n, 0) + max(0, total.get(n, 0) - used.get(n, 0) - v)
            for n, v in need.items()}


def own_shortfall(core: AllocatorCore, role: str) -> dict[str, int]:
    """What the role's guarantee (or the most an ancestor's) still needs, per resource."""
    own: dict[str, int] = {}
    for p in role_path(role):
        guarantee = core.quotas.guaranteed.get(p)
        if guarantee is not None:
            held = core.sorter.role_allocation(p)
            for n, v in guarantee.items():
                if v > held.get(n, 0):
                    own[n] = max(own.get(n, 0), v - held.get(n, 0))
    return own


def guaranteed_roles(core: AllocatorCore, role: str) -> set[str]:
    """The role and its ancestors that have a guarantee."""
    return {p for p in role_path(role) if p in core.quotas.guaranteed}


def guarded(core: AllocatorCore, demanding: set[str]) -> bool:
    """Whether some role with demand is below its guarantee (so others may be refused
    free resources for it)."""
    return bool(core.quotas.guaranteed) and bool(shortfalls(core, demanding))


Rooms = dict[str, "dict[str, int] | None"]


def guard_rooms(core: AllocatorCore, demanding: set[str]) -> Rooms:
    """`guard_room` of each role a framework has."""
    return {role: guard_room(core, role, demanding)
            for role in {fw.role for fw in core.frameworks.values()}}


def rooms_grew(now: Rooms, before: Rooms) -> bool:
    """Whether some role may take more now than `before` (a role absent from `before`, a
    room gone or a resource of it no longer bounded count as more). Rooms only shrink while
    a cycle allocates, so against the rooms a cycle ended with, no growth means no refusal
    made for a guarantee since can be lifted."""
    for role, room in now.items():
        if role not in before:
            return True
        old = before[role]
        if old is None:
            continue
        if room is None or any(n not in room for n in old) or any(
                v > old.get(n, v) for n, v in room.items()):
            return True
    return False


def protected(core: AllocatorCore, fid: str, delta: Vector) -> bool:
    """Whether taking `delta` back from the framework (reclaiming its offers, revoking its
    tasks) would leave its role, or a role above it, below its guarantee."""
    for p in role_path(core.frameworks[fid].role):
        guarantee = core.quotas.guaranteed.get(p)
        if guarantee is not None:
            held = core.sorter.role_allocation(p)
            if any(delta.get(n, 0) > 0 and held.get(n, 0) - delta[n] < v
                   for n, v in guarantee.items()):
                return True
    return False


def within(take: Resources, room: Vector, whole: bool,
           allocatable: Callable[[Resources], bool]) -> Resources | None:
    """`take` under `room`: whole (a declared task) or not at all, else cut to it (ports
    and sets kept); `take` itself when it fits, None when nothing worth offering is left."""
    scalars = take.scalars
    over = False
    for (n, _), v in scalars.items():
        if n in room and v > room[n]:
            over = True
            break
    if not over:
        need: dict[str, int] = {}
        for (n, _), v in scalars.items():
            if n in room:
                need[n] = need.get(n, 0) + v
        over = any(v > room[n] for n, v in need.items())
    if not over:
        return take
    if whole:
        return None
    left = dict(room)
    cut: dict[Key, int] = {}
    for key, v in scalars.items():
        if key[0] in left:
            v = min(v, left[key[0]])
            left[key[0]] -= v
        if v > 0:
            cut[key] = v
    part = Resources(cut, dict(take.ranges), dict(take.sets))
    return part if allocatable(part) else None


def exhausted(core: AllocatorCore, room: Vector) -> bool:
    """The room leaves less than an offer's worth of cpus or of mem (names absent from
    it are not bounded). It depends on the role's holdings, not on what is offered, so a
    refusal stands while a cycle fills an agent (the incremental cycle needs that)."""
    cpus, mem = room.get("cpus"), room.get("mem")
    return (cpus is not None and cpus < core.min_cpus) or (mem is not None and mem < core.min_mem)


def apply(core: AllocatorCore, fw: Framework, take: Resources, demanding: set[str] | None
          ) -> tuple[Resources | None, str]:
    """`take` under the quotas of the framework's role: (what it may take, "" or what
    bound it: "limit" or "guarantee")."""
    why = ""
    rooms: Iterable[tuple[dict[str, int] | None, str]] = (
        (limit_room(core, fw.role), "limit"),
        (guard_room(core, fw.role, demanding) if demanding is not None else None,
         "guarantee"))
    got: Resources | None = take
    for room, what in rooms:
        if room is None or got is None:
            continue
        if not fw.demands and exhausted(core, room):
            new = None  # no cpus (or mem) left to it: no offer of the other alone
        else:
            new = within(got, room, bool(fw.demands), core.allocatable)
        if new is not got:
            why = why or what
        got = new
    return got, why


def quota_view(core: AllocatorCore, role: str) -> dict[str, dict[str, float]]:
    q = core.quotas.roles.get(role)
    if q is None:
        return {}
    return {k: {n: v / MILLI for n, v in sorted(vec.items())}
            for k, vec in (("guarantee", q.guarantee), ("limit", q.limit)) if vec}
