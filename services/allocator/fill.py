"""Progressive filling arithmetic (DRF with declared demand): a framework's next task shape,
whether it fits an agent's free resources, the unit taken from them (reserved first, then
unreserved; the lowest free ports), and the headroom a framework of unknown demand may take
before it passes the next framework's share. Pure functions over resources and vectors."""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from services.allocator.sorter import DRF_RESOURCES, scalar_vector
from services.resources import UNRESERVED, Key, Range, Resources

if TYPE_CHECKING:
    from services.allocator.model import Filter

Vector = Mapping[str, int]  # DRF scalars, milli-units

MAX_DEMAND_COUNT = 100_000  # tasks in one declared shape (the master refuses more)


@dataclass(frozen=True, slots=True)
class Shape:
    """`count` tasks of `resources` (unreserved DRF scalars) each needing `ports` host ports,
    counted in total: held (offered or used) plus wanted."""

    resources: Resources
    count: int
    ports: int = 0
    vector: Mapping[str, int] = field(default_factory=dict, compare=False)

    @classmethod
    def of(cls, resources: Resources, count: int, ports: int = 0) -> Shape:
        vector = scalar_vector(resources)
        if not vector or count < 1 or ports < 0:
            raise ValueError(f"demand needs a positive shape and count, got {resources} "
                             f"x{count} ports {ports}")
        return cls(resources, count, ports, vector)

    def __str__(self) -> str:
        ports = f" +{self.ports} port(s)" if self.ports else ""
        return f"{self.count} x <{self.resources}{ports}>"


def next_unit(demands: Sequence[Shape], held: Vector) -> Shape | None:
    """The first declared shape not yet covered by what the framework holds (shapes are
    covered in the order declared, cumulatively), or None when its demand is met."""
    want: dict[str, int] = {}
    for shape in demands:
        for n, v in shape.vector.items():
            want[n] = want.get(n, 0) + v * shape.count
        if any(held.get(n, 0) < v for n, v in want.items()):
            return shape
    return None


def demand_total(demands: Iterable[Shape]) -> dict[str, int]:
    out: dict[str, int] = {}
    for shape in demands:
        for n, v in shape.vector.items():
            out[n] = out.get(n, 0) + v * shape.count
    return out


def take_unit(usable: Resources, shape: Shape, role: str) -> Resources | None:
    """One task of `shape` out of `usable` (what the framework's role may use): each scalar
    from the role's reservation first, then unreserved; `shape.ports` of the lowest free
    ports likewise. None if it does not fit."""
    scalars: dict[Key, int] = {}
    for name, need in shape.vector.items():
        for key in ((name, role), (name, UNRESERVED)) if role != UNRESERVED else ((name, role),):
            got = min(need, usable.scalars.get(key, 0))
            if got > 0:
                scalars[key] = got
                need -= got
            if not need:
                break
        if need:
            return None
    ranges: dict[Key, tuple[Range, ...]] = {}
    need = shape.ports
    for key in (("ports", role), ("ports", UNRESERVED)) if role != UNRESERVED else (
            ("ports", role),):
        picked: list[Range] = []
        for lo, hi in usable.ranges.get(key, ()):
            if not need:
                break
            n = min(need, hi - lo + 1)
            picked.append((lo, lo + n - 1))
            need -= n
        if picked:
            ranges[key] = tuple(picked)
    if need:
        return None
    return Resources(scalars, ranges, {})


def headroom(usable: Resources, held: Vector, total: Vector, level: float) -> Resources:
    """The DRF scalars of `usable` a framework holding `held` may take before its dominant
    share passes `level` (its weight times the next framework's weighted share): per
    resource, up to level x cluster total. Reserved before unreserved; no ports or sets."""
    room = {n: math.floor(level * total[n]) - held.get(n, 0) for n in DRF_RESOURCES
            if total.get(n)}
    scalars: dict[Key, int] = {}
    for key in sorted(usable.scalars, key=lambda k: k[1] == UNRESERVED):
        name = key[0]
        left = room.get(name, 0)
        got = min(left, usable.scalars[key])
        if got > 0:
            scalars[key] = got
            room[name] = left - got
    return Resources(scalars)


def add_into(into: dict[str, int], resources: Resources, sign: int = 1) -> None:
    """into += (sign=1) or -= (sign=-1) the DRF scalars of `resources`; zeros dropped."""
    for n, v in scalar_vector(resources).items():
        left = into.get(n, 0) + sign * v
        if left:
            into[n] = left
        else:
            into.pop(n, None)


def covers(have: Vector, need: Vector) -> bool:
    return all(have.get(n, 0) >= v for n, v in need.items() if v > 0)


def minus(a: Vector, b: Vector) -> dict[str, int]:
    """a - b per resource, clipped at zero (what is still missing)."""
    return {n: a[n] - b.get(n, 0) for n in a if a[n] - b.get(n, 0) > 0}


def free_ports(usable: Resources, role: str) -> int:
    return sum(hi - lo + 1 for (name, r), rs in usable.ranges.items()
               if name == "ports" and r in (role, UNRESERVED) for lo, hi in rs)


def usable(free: Resources, role: str) -> Resources:
    """free.for_role(role), without a copy when all of it is usable (the common case)."""
    for keys in (free.scalars, free.ranges, free.sets):
        for _, r in keys:
            if r != UNRESERVED and r != role:
                return free.for_role(role)
    return free


def refusal(flts: list[Filter], offer: Resources, now: float) -> float | None:
    """The latest expiry among the filters refusing `offer`, or None."""
    latest = None
    for f in flts:
        if f.refuses(offer, now) and (latest is None or f.expires_at > latest):
            latest = f.expires_at
    return latest
