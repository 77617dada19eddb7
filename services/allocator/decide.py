"""A framework's decision after an allocation cycle (`offerbus why`): offered, suppressed,
inactive, filtered by its declines, out-shared by lower shares, or nothing fits.

Made for the frameworks a cycle concerns (see AllocatorCore): offered, suppressed and
inactive are exactly what a full scan would say. Among the reasons for no offer, the
incremental cycle sees less than a full scan (agents it does not visit, frameworks it does
not consider on idle agents), so it may tell them apart differently, never untruly: it says
filtered only when its filters refuse some agent (and counts every agent they are in
force on, visited or not), nothing fits only when no agent has free resources of its role. The
offers it holds unanswered are named (`reasons.holding_note`)."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from services.allocator.fill import next_unit, take_unit, usable
from services.allocator.model import Decision, Framework, Notes, Outcome
from services.allocator.quota import (
    apply,
    describe,
    exhausted,
    guard_room,
    limit_room,
    shortfalls,
)
from services.allocator.reasons import (
    GUARANTEE_REASON,
    LOWER_SHARES_REASON,
    filtered_reason,
    holding_note,
    quota_limit_reason,
)
from services.resources import MILLI, Resources

if TYPE_CHECKING:
    from services.allocator.core import AllocatorCore

NOTHING = Resources()


def decide(core: AllocatorCore, fw: Framework, note: Notes | None, any_offered: bool,
           now: float) -> Decision:
    """From what the cycle saw of the framework (`note`: None = it was not considered at
    any visited agent). A framework offered nothing and filtered nowhere this cycle may
    still be refused by its filters on idle agents (not visited): that is said first, as a
    full scan would find it there before anything else."""
    share = core.sorter.share(fw.framework_id)
    ids: tuple[str, ...] = ()
    filtered = 0
    if not fw.active:
        outcome, reason = Outcome.INACTIVE, "not subscribed (disconnected or failing over)"
    elif fw.suppressed:
        outcome = Outcome.SUPPRESSED
        reason = f"suppressed offers for role {fw.role}; REVIVE to get offers again"
    else:
        note = note or Notes()
        ids, filtered = tuple(note.allocation_ids), note.agents_filtered
        first = note.first_filtered
        if not ids and first is None:
            idle = idle_filtered(core, fw)
            if idle:
                filtered, first = len(idle), idle[0]
        said = core.said.get(fw.framework_id)
        if ids:
            outcome = Outcome.OFFERED
            tasks = (f" ({note.units} task(s) of its declared demand)" if fw.demands else "")
            reason = (f"offered {len(ids) - note.split} agent(s){tasks} at dominant share "
                      f"{share.dominant_share:.3f} ({share.dominant_resource or '-'}), "
                      f"weight {share.weight:g}")
            if note.revocable:
                reason += (f"; {note.revocable} offer(s) revocable: beyond its guaranteed "
                           f"share")
            if note.cut_agents:
                reason += (f"; on {note.cut_agents} agent(s) fair share kept part for "
                           f"frameworks of declared demand (it got its headroom)")
            if note.reserved_agents:
                reason += (f"; on {note.reserved_agents} agent(s) resources reserved for "
                           f"other roles were skipped")
            if note.held_back:
                reason += f"; {note.held_back} more agent(s) wait {held_back(core, fw)}"
        elif fw.demands and next_unit(fw.demands, core.sorter.allocation(fw.framework_id)) is None:
            outcome = Outcome.DEMAND_MET
            reason = (f"holds all it declared ({'; '.join(map(str, fw.demands))}); a new "
                      f"REQUEST asks for more")
        elif note.quota == "limit" or _at_limit(core, fw):
            outcome = Outcome.QUOTA_LIMIT
            reason = quota_limit_reason(fw.role, _limits(core, fw.role), bool(fw.demands))
        elif fw.framework_id in core.fanout.held_back:
            outcome = Outcome.FAIR_SHARE
            reason = f"not offered more agents {held_back(core, fw)}"
        elif note.quota == "guarantee" or _set_aside(core, fw):
            outcome = Outcome.FAIR_SHARE
            short = shortfalls(core, core._demanding or set(), fw.role)
            reason = (f"{GUARANTEE_REASON} of role(s) "
                      f"{', '.join(f'{r} (short {describe(v)})' for r, v in sorted(short.items()))}"
                      f", which have demand")
        elif said is not None:
            outcome = Outcome.FAIR_SHARE
            reason = (f"below its fair share (weighted share {share.key:.3f}) and its next "
                      f"task fits no free resources: {said}")
        elif first is not None:
            agent_id, until = first
            # The agents its filters are in force on, not only those this cycle visited (a
            # decline per cycle: each cycle visits one agent). O(1), unlike re-checking them.
            filtered = max(filtered, core.filters.filtered_agents(fw.framework_id))
            outcome = Outcome.FILTERED
            reason = filtered_reason(filtered, agent_id, until)
        elif any_offered:
            outcome = Outcome.FAIR_SHARE
            reason = f"{LOWER_SHARES_REASON} (its share {share.key:.3f})"
            if note.unfit is not None:
                reason = (f"its next declared task <{note.unfit.resources}> fits none of the "
                          f"free resources left after frameworks with a lower weighted share "
                          f"took theirs (its share {share.key:.3f})")
        elif note.unfit is not None:
            outcome = Outcome.NO_FIT
            reason = (f"no offer fits its next declared task <{note.unfit.resources}>: no "
                      f"agent has that free for role {fw.role} or '*', and no framework "
                      f"above its share holds any it could reclaim")
        else:
            outcome = Outcome.NO_FIT
            reason = (f"no agent has free resources of role {fw.role} or '*' above "
                      f"cpus {core.min_cpus / MILLI:g} or mem {core.min_mem / MILLI:g}")
    holding = core.fanout.on.get(fw.framework_id)
    if holding and outcome not in (Outcome.OFFERED, Outcome.INACTIVE):
        reason += holding_note(len(holding), min(holding, key=lambda a: core.agents[a].seq))
    return Decision(fw.framework_id, fw.role, outcome, reason, share.dominant_share,
                    share.dominant_resource, share.weight, share.shares, ids, filtered,
                    core.cycle, now)


def held_back(core: AllocatorCore, fw: Framework) -> str:
    """Why a framework at its bound of outstanding offers is offered no more (fanout.py)."""
    return (f"until it answers some of the offers it holds on "
            f"{len(core.fanout.on.get(fw.framework_id, ()))} agent(s) "
            f"(max_offers_per_framework {core.fanout.limit(fw.framework_id)})")


def idle_filtered(core: AllocatorCore, fw: Framework) -> list[tuple[str, float]]:
    """(agent, filter expiry) of the idle agents whose free resources of its role (its
    next declared task, if it declared demand) the framework's filters refuse (why it
    is offered nothing there), in the order agents were added."""
    out = []
    for agent_id, flts in core.filters.of(fw.framework_id):
        if agent_id in core._idle:
            agent = core.agents[agent_id]
            offer = usable(agent.free, fw.role)
            if fw.demands and core._allocatable(offer):  # what it would be offered
                unit = next_unit(fw.demands, core.demand_held(fw.framework_id, agent))
                offer = (None if unit is None else take_unit(offer, unit, fw.role)) or NOTHING
            if core._allocatable(offer):
                until = max((f.expires_at for f in flts if f.refuses(offer, -math.inf)),
                            default=None)
                if until is not None:
                    out.append((agent_id, until))
    return sorted(out, key=lambda e: core.agents[e[0]].seq)


def _limits(core: AllocatorCore, role: str) -> list[tuple[str, str]]:
    """The limits bounding the role (its own and its ancestors'): (role, limit)."""
    return [(p, describe(v)) for p, v in core.quotas.limited.items()
            if role == p or role.startswith(p + "/")]


def _set_aside(core: AllocatorCore, fw: Framework) -> bool:
    """The free pool is set aside for other roles' guarantees beyond what it may take (its
    next declared task, or anything allocatable): what a cycle that did not visit the idle
    agents (nothing set aside grew) would have found there."""
    if not core._guarded or core._demanding is None:
        return False
    if fw.demands:
        unit = next_unit(fw.demands, core.sorter.allocation(fw.framework_id))
        return unit is not None and apply(core, fw, unit.resources, core._demanding) == (
            None, "guarantee")
    room = guard_room(core, fw.role, core._demanding)
    return room is not None and exhausted(core, room)


def _at_limit(core: AllocatorCore, fw: Framework) -> bool:
    """Its role's quota limit leaves nothing worth offering it (its next declared task,
    or anything allocatable)."""
    room = limit_room(core, fw.role) if core.quotas.limited else None
    if room is None:
        return False
    if fw.demands:
        unit = next_unit(fw.demands, core.sorter.allocation(fw.framework_id))
        return unit is not None and apply(core, fw, unit.resources, None)[0] is None
    return exhausted(core, room)
