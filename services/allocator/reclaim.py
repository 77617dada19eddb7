"""Taking resources back for a framework below its fair share (pure): which outstanding
offers of frameworks above it to rescind, and, when offers are not enough, which framework's
tasks to revoke on which agent. The rules keep the outcome stable (no ping-pong):

- a framework with declared demand whose next task fits nowhere reclaims from a holder whose
  weighted share is above what its own will be with that task; it revokes tasks only from a
  holder of declared demand that stays above it after giving them up, whole tasks of its
  declared shape counted (key(H - tasks) >= key(N + task)): each revocation moves resources
  from a higher share to a lower one without inverting them, so the sorted shares rise
  and revocations end;
- a framework below its role's quota guarantee (its next task within what the guarantee
  still needs) reclaims and revokes from any framework outside that role, whatever the
  shares; no holder is ever taken below its own role's guarantee (quota.py `protected`),
  so guarantees never take from each other;
- a framework of unknown demand that just arrived (fresh) reclaims one outstanding offer
  when the holder stays at or above it after the move (key(H - O) >= key(N + O)).

Only one reclaim per wanting framework is in flight: the next waits for its result or for
the reclaim's patience to pass."""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from services.allocator.fill import Shape, covers, free_ports, minus, next_unit
from services.allocator.model import Reclaim, Revocation
from services.allocator.quota import guaranteed_roles, own_shortfall, protected
from services.allocator.sorter import Move, compare, role_path, scalar_vector
from services.resources import UNRESERVED, Resources

if TYPE_CHECKING:
    from services.allocator.core import AllocatorCore

# How long a reclaim of offers may take (rescind, recover, re-offer) before it is tried again;
# a revocation waits its grace on top.
RECLAIM_PATIENCE_S = 5.0
EPS = 1e-9  # shares equal but for rounding (12/18 and 6/9) are equal


@dataclass
class Plan:
    reclaims: list[Reclaim] = field(default_factory=list)
    revocations: list[Revocation] = field(default_factory=list)
    said: dict[str, str] = field(default_factory=dict)  # framework -> what is done for it


def plan(core: AllocatorCore, wanting: Iterable[str], newcomers: Iterable[str],
         now: float) -> Plan:
    """Reclaims and revocations for the wanting frameworks (declared demand unmet) and the
    newcomers (unknown demand, offered nothing), lowest share first."""
    out = Plan()
    claimed: set[tuple[str, str]] = set()  # (holder, agent) offers already reclaimed now
    sorter = core.sorter
    for _, fid in sorter.sort(wanting):
        _for_declared(core, fid, claimed, out, now)
    for _, fid in sorter.sort(newcomers):
        _for_newcomer(core, fid, claimed, out)
    return out


def _for_declared(core: AllocatorCore, fid: str, claimed: set[tuple[str, str]], out: Plan,
                  now: float) -> None:
    sorter, fws, agents = core.sorter, core.frameworks, core.agents
    fw = fws[fid]
    unit = next_unit(fw.demands, sorter.allocation(fid))
    if unit is None:
        return
    after = sorter.key_after(fid, [(fid, unit.vector, 1)])
    role = fw.role
    guarantees = bool(core.quotas.guaranteed)
    # Below its role's guarantee (the task within what it still needs): it takes back from
    # any framework outside that role, down to the holder's own guarantee, whatever the shares.
    mine = guaranteed_roles(core, role) if guarantees else set()
    short = own_shortfall(core, role) if mine else {}
    below = bool(short) and all(unit.vector.get(n, 0) <= short.get(n, 0) for p in mine
                                for n in core.quotas.guaranteed[p])
    above = {h: sorter.key(h) for h in fws if h != fid and fws[h].agents}
    above = {h: k for h, k in above.items() if k > after or (
        below and not mine.intersection(role_path(fws[h].role)))}
    if not above:
        return
    unit_res = unit.resources
    why_below = "below its role's quota guarantee" if below else "below its share"
    revoke: tuple[str, list[str], str, dict[str, int]] | None = None
    seen: set[str] = set()
    for agent_id in sorted({a for h in above for a in fws[h].agents} - core.away,
                           key=lambda a: agents[a].seq):
        agent = agents[agent_id]
        flts = core.filters.on(agent_id).get(fid)
        if flts and any(f.refuses(unit_res, now) for f in flts):
            continue
        seen.add(agent_id)
        free = agent.free.for_role(role)
        have, ports = scalar_vector(free), free_ports(free, role)
        picked: list[str] = []
        for h in sorted((h for h in above if h in agent.offered and (h, agent_id) not in claimed),
                        key=above.__getitem__, reverse=True):
            if covers(have, unit.vector) and ports >= unit.ports:
                break
            offered = agent.offered[h].for_role(role)
            if not offered or (guarantees and protected(core, h, scalar_vector(offered))):
                continue
            picked.append(h)
            for n, v in scalar_vector(offered).items():
                have[n] = have.get(n, 0) + v
            ports += free_ports(offered, role)
        if covers(have, unit.vector) and ports >= unit.ports:
            _reclaim(out, claimed, picked, agent_id, fid, f"for {fid}, {why_below}, "
                     f"which needs {unit.resources}")
            out.said[fid] = f"reclaiming offers of {', '.join(picked)} on {agent_id}"
            core.reclaim_started(fid, now + RECLAIM_PATIENCE_S)
            return
        if revoke is None and core.revocation_grace_s is not None and ports >= unit.ports:
            need = minus(dict(unit.vector), have)
            for h in sorted(above, key=above.__getitem__, reverse=True):
                used = agent.used.get(h)
                freed = _whole_tasks(fws[h].demands, need)
                if (used is None or freed is None or core.revoking(h, agent_id, now)
                        or not covers(scalar_vector(used.for_role(role)), freed)
                        or (guarantees and protected(core, h, freed))):
                    continue
                moves: list[Move] = [  # the offers picked go back too (shares of roles)
                    *((p, scalar_vector(agent.offered[p]), -1) for p in picked),
                    (h, freed, -1), (fid, unit.vector, 1)]
                if below or compare(sorter.key_after(h, moves), sorter.key_after(fid, moves),
                                    EPS) >= 0:
                    revoke = (agent_id, picked, h, need)
                    break
    if revoke is not None:
        agent_id, picked, h, need = revoke
        grace = core.revocation_grace_s or 0.0
        _reclaim(out, claimed, picked, agent_id, fid, f"for {fid}, {why_below}")
        resources = Resources({(n, UNRESERVED): v for n, v in need.items()})
        why = (f"{fid} is {why_below} and needs {unit.resources} on {agent_id}; {h} is "
               + ("outside that role" if below else "above its share"))
        out.revocations.append(Revocation(h, agent_id, resources, grace, fid, why))
        out.said[fid] = (f"revoking {resources} of {h}'s tasks on {agent_id} "
                         f"(grace {grace:g} s)")
        core.revocation_started(fid, h, agent_id, now + grace + RECLAIM_PATIENCE_S)


def _for_newcomer(core: AllocatorCore, fid: str, claimed: set[tuple[str, str]],
                  out: Plan) -> None:
    sorter, fws, agents = core.sorter, core.frameworks, core.agents
    fw = fws[fid]
    own = sorter.key(fid)
    for h in sorted((h for h in fws if h != fid and fws[h].agents), key=sorter.key,
                    reverse=True):
        if sorter.key(h) <= own:
            return
        for agent_id in sorted(fws[h].agents - core.away, key=lambda a: agents[a].seq):
            offered = agents[agent_id].offered.get(h)
            if offered is None or (h, agent_id) in claimed:
                continue
            part = offered.for_role(fw.role)
            vec = scalar_vector(part)
            if not core.allocatable(part) or protected(core, h, vec):
                continue
            flts = core.filters.on(agent_id).get(fid)
            if flts and any(f.refuses(part, -math.inf) for f in flts):
                continue
            moves: list[Move] = [(h, vec, -1), (fid, vec, 1)]
            if compare(sorter.key_after(h, moves), sorter.key_after(fid, moves), 0.0) >= 0:
                _reclaim(out, claimed, [h], agent_id, fid, f"for {fid}, a new framework "
                         f"below its share")
                out.said[fid] = f"reclaiming offers of {h} on {agent_id}"
                return


def _whole_tasks(demands: Sequence[Shape], need: Mapping[str, int]) -> dict[str, int] | None:
    """What killing whole tasks to free `need` frees, estimated from the holder's declared
    task shape (the largest): tasks are killed whole, so a holder gives back more than
    asked, and the rule that it stays above the claimant must count that. None for a holder
    of unknown demand: its task sizes are unknown, so its tasks are not revoked."""
    if not demands:
        return None
    shape = max(demands, key=lambda d: sorted(d.vector.values(), reverse=True))
    n = max((-(-v // shape.vector[k]) if shape.vector.get(k) else 0 for k, v in need.items()),
            default=0)
    if any(v > 0 and not shape.vector.get(k) for k, v in need.items()):
        return None  # its tasks hold none of what is needed
    return {k: v * n for k, v in shape.vector.items()}


def _reclaim(out: Plan, claimed: set[tuple[str, str]], holders: list[str], agent_id: str,
             fid: str, reason: str) -> None:
    for h in holders:
        claimed.add((h, agent_id))
        out.reclaims.append(Reclaim(h, agent_id, fid, reason))

