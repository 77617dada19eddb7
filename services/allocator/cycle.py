"""One allocation pass of the allocator core: the agents a cycle visits, each filled
progressively (DRF with declared demand), the allocations made. Pure; it works on an
AllocatorCore's state, whose events decide what a cycle visits (core.py)."""

from __future__ import annotations

from bisect import bisect_left, insort
from collections.abc import Iterable
from operator import attrgetter
from typing import TYPE_CHECKING

from services.allocator.fill import add_into, headroom, next_unit, refusal, take_unit, usable
from services.allocator.model import Agent, Allocation, Framework, Notes
from services.allocator.quota import apply
from services.allocator.sorter import Key
from services.resources import UNRESERVED, Resources

if TYPE_CHECKING:
    from services.allocator.core import AllocatorCore

NOTHING = Resources()
Order = list[tuple[Key, str]]  # (sort key, framework id), ascending
_BY_SEQ = attrgetter("seq")


def visit(core: AllocatorCore, fresh: set[str], notes: dict[str, Notes],
           allocations: list[Allocation], now: float) -> int:
    """Offer the agents to visit; how many there were."""
    agents, fws, dirty, idle = core.agents, core.frameworks, core._dirty, core._idle
    order = core.sorter.sort(fid for fid, fw in fws.items()
                             if fw.active and not fw.suppressed)
    if core._idle <= dirty:  # no idle agent to try fresh frameworks on
        fresh = set()
    fresh_order = [e for e in order if e[1] in fresh]
    visit = dirty | idle if fresh_order else dirty
    if core.away:  # nothing is offered on an away agent
        visit = visit - core.away
    # In the order agents came (seq); sorted as objects by an attrgetter, not by a Python
    # key function per agent (a cycle at 10,000 agents sorts thousands of them).
    ids: Iterable[str] = (agents if len(visit) == len(agents) else
                          [a.agent_id for a in sorted(map(agents.__getitem__, visit),
                                                      key=_BY_SEQ)])
    fresh_ids = tuple(f for _, f in fresh_order)
    held_back = core.fanout.held_back
    # Beyond this (weighted) share a framework's allocation is revocable: its share were one
    # more framework of weight 1 to arrive ("guaranteed allocation", Mesos paper).
    guaranteed = 1 / (1 + sum(core.weights.get(fws[fid].role, 1.0) for _, fid in order))
    fanout = core.fanout
    for agent_id in ids:
        agent = agents[agent_id]
        changed = agent_id in dirty
        if not changed and fanout.bound and held_back.issuperset(fresh_ids) \
                and agent.offered.keys().isdisjoint(fresh_ids):
            continue  # idle, and every framework it is visited for waits at its bound
        lists = ((order, fresh_order) if changed or _lifts_filter(core, agent_id, fresh)
                 else (fresh_order, order))
        free = agent.free
        beyond: dict[str, Resources] = {}
        for fid, (offer, before) in _fill(core, agent, lists, fresh, notes, now,
                                          (guaranteed, beyond)).items():
            note = notes[fid]
            cut = note.cut.pop(agent_id, None)
            cut = NOTHING if cut is None else cut - offer
            elsewhere = reserved_elsewhere(free, fws[fid].role)
            note.cut_agents += 1 if cut else 0
            note.reserved_agents += 1 if elsewhere else 0
            parts = [(offer, False)]
            revocable = beyond.get(fid)
            if revocable is not None:  # in two: guaranteed and revocable
                note.revocable += 1
                parts = [(offer - revocable, False), (revocable, True)]
                note.split += 1 if parts[0][0] else 0
            for part, rev in parts:
                if part:
                    allocation = Allocation(
                        f"{core.id_prefix}{core.cycle}-{len(allocations)}", fid, agent_id,
                        fws[fid].role, part, *before, core.cycle, cut, elsewhere, rev)
                    allocations.append(allocation)
                    note.allocation_ids.append(allocation.allocation_id)
        if core._allocatable(agent.free):
            idle.add(agent_id)
        else:
            idle.discard(agent_id)
    return len(visit)


def _lifts_filter(core: AllocatorCore, agent_id: str, fresh: set[str]) -> bool:
    """Whether a fresh framework's take on this idle agent may lift another's decline filter
    there, so that the agent is filled with every framework, as a full scan fills it: a
    framework of declared demand has one, and its next unit is taken from what is free (the
    first free ports, the reserved part first), which a take moves out of what it declined."""
    fws = core.frameworks
    for fid in core.filters.on(agent_id):
        fw = fws[fid]
        if fw.demands and fid not in fresh and fw.active and not fw.suppressed:
            return True
    return False


def reserved_elsewhere(free: Resources, role: str) -> Resources:
    """The part of `free` reserved for roles other than `role`."""
    for keys in (free.scalars, free.ranges, free.sets):
        for _, r in keys:
            if r != UNRESERVED and r != role:
                return free - free.for_role(role)
    return NOTHING


def _fill(core: AllocatorCore, agent: Agent, lists: tuple[Order, Order], fresh: set[str],
          notes: dict[str, Notes], now: float, revocable: tuple[float, dict[str, Resources]],
          ) -> dict[str, tuple[Resources, tuple[float, str, float]]]:
    """Progressive filling of one agent: the candidate with the lowest weighted share
    takes one task of its declared demand (then is re-sorted and may take more), or,
    of unknown demand, what it may hold before it passes the next candidate with
    declared demand, or the whole rest when no such candidate follows (Mesos). What
    each framework took, with its share before. A framework of declared demand (only those
    are revoked) whose weighted share passes `revocable[0]` with a task: the task goes into
    `revocable[1]`."""
    cands, other = lists
    guaranteed, beyond = revocable
    fws, sorter, allocatable, fanout = (core.frameworks, core.sorter, core._allocatable,
                                        core.fanout)
    flts_by_fw = core.filters.on(agent.agent_id)
    done: set[str] = set()  # finished on this agent: took the rest, refused, met, unfit
    stale = False  # a hierarchical role's share grew: keys to refresh
    got: dict[str, tuple[Resources, tuple[float, str, float]]] = {}
    parts: dict[str, tuple[Resources, bool]] = {}  # role -> (its part, allocatable)
    i = 0
    forced: int | None = None  # a declared candidate tied with the one at i goes first
    free_ok = allocatable(agent.free)
    while free_ok and i < len(cands):
        if forced is None:
            pos = i
        else:
            pos, forced = forced, None
        fid = cands[pos][1]
        if done and fid in done:
            i += 1
            continue
        fw = fws[fid]
        note = notes.get(fid)
        if note is None:
            note = notes[fid] = Notes()
        seen = parts.get(fw.role)
        if seen is None:
            part = usable(agent.free, fw.role)
            seen = parts[fw.role] = (part, allocatable(part))
        offer, fits = seen
        flts = flts_by_fw.get(fid)
        take: Resources | None = offer
        whole = True
        j: int | None = None
        if fits and fanout.bound and fanout.holds_back(fid, agent):  # offers unanswered
            note.held_back += 1
            fits = False
        elif not fits:
            note.no_fit += 1
        if not fits:
            if pos == i:
                i += 1
            else:
                done.add(fid)
            continue
        if flts is not None and not fw.demands:
            until = refusal(flts, offer, now)  # the hot path: every framework declines
            if until is not None:
                note.agents_filtered += 1
                if note.first_filtered is None:
                    note.first_filtered = (agent.agent_id, until)
                i += 1
                continue
            flts = None  # not refused whole: what it takes (part of it) is not refused
        if fw.demands:
            unit = next_unit(fw.demands, core.demand_held(fid, agent))
            whole = False
            if unit is None:
                note.demand_met, take = True, None
            else:
                take = take_unit(offer, unit, fw.role)
                if take is None:
                    note.unfit = unit
        else:
            j = _next_declared(core, cands, i, done, agent, now)
            if j is not None:
                basis, level = sorter.room_to(fid, cands[j][0])
                take = headroom(offer, basis, sorter.total, level)
                whole = False
                note.cut.setdefault(agent.agent_id, offer)  # what it would take (Mesos)
                if not take:  # at the next one's share already: that one goes first
                    forced = j
                    continue
        if take is not None and core.quotas.roles:
            limited, why = apply(core, fw, take, core._demanding)
            if why:  # cut or refused; cut, it may come back for what its quota leaves
                note.quota = note.quota or why
                core._guard_refused |= core._guarded  # may be lifted as a room grows
                if limited is None and j is not None and not whole:
                    forced = j  # its headroom, all beyond its quota: the next one first
                    continue
                take = limited
        if take is not None and flts:  # declared: its unit against its filters
            until = refusal(flts, take, now)
            if until is not None:
                note.agents_filtered += 1
                if note.first_filtered is None:
                    note.first_filtered = (agent.agent_id, until)
                take = None
        if take is None:
            if pos == i:
                i += 1
            else:  # a forced candidate: passed over when the loop reaches it
                done.add(fid)
            continue
        held = got.get(fid)
        got[fid] = ((take, sorter.dominant(fid)) if held is None  # share before it took
                    else (held[0] + take, held[1]))
        _hold(core, agent, fw, take)
        if fw.demands:
            note.units += 1
            if sorter.key(fid)[-1] > guaranteed + 1e-9:  # its weighted share (float sums)
                beyond[fid] = beyond[fid] + take if fid in beyond else take
        if whole:
            done.add(fid)
        if sorter.hierarchical(fid):  # its roles' shares grew: its siblings' keys too
            stale = True
            cands[i:] = sorted((sorter.key(c), c) for _, c in cands[i:])
        else:
            _resort(core, fid, cands, other, fresh, cands[pos])
        parts.clear()
        free_ok = allocatable(agent.free)
    if stale:  # for the next agent: every key as it is now
        for order in (cands, other):
            order[:] = sorter.sort(c for _, c in order)
    return got

def _next_declared(core: AllocatorCore, cands: Order, i: int, done: set[str], agent: Agent,
                   now: float) -> int | None:
    """Where the next candidate after `i` that would take something of the agent stands,
    if it declared demand (else None: the one at `i` may take the rest). Candidates that
    would refuse are passed over, as they are absent from an incremental visit."""
    if not core._declared:
        return None
    flts_by_fw = core.filters.on(agent.agent_id)
    for j in range(i + 1, len(cands)):
        fid = cands[j][1]
        if fid in done:
            continue
        fw = core.frameworks[fid]
        offer = usable(agent.free, fw.role)
        if not core._allocatable(offer) or core.fanout.full(fid, agent):
            continue
        if fw.demands:
            unit = next_unit(fw.demands, core.demand_held(fid, agent))
            take = None if unit is None else take_unit(offer, unit, fw.role)
            if take is None:
                continue
            offer = take
        if core.quotas.roles:
            limited = apply(core, fw, offer, core._demanding)[0]
            if limited is None:
                continue
            offer = limited
        flts = flts_by_fw.get(fid)
        if flts and refusal(flts, offer, now) is not None:
            continue
        return j if fw.demands else None
    return None

def _hold(core: AllocatorCore, agent: Agent, fw: Framework, take: Resources) -> None:
    fid = fw.framework_id
    held = agent.offered.get(fid)
    agent.offered[fid] = take if held is None else held + take
    if fw.demands:
        add_into(fw.offered, take)
    agent.free = NOTHING if take is agent.free else agent.free - take
    fw.agents.add(agent.agent_id)
    core.fanout.note(fid, agent)
    core.sorter.allocated(fid, take)

def _resort(core: AllocatorCore, fid: str, cands: Order, other: Order, fresh: set[str],
            entry: tuple[Key, str]) -> None:
    """Its share grew: move it (to where the loop will reach it again, as its key only
    grows) in the candidates, and in the other list if it is there too."""
    new = (core.sorter.key(fid), fid)
    _remove(cands, entry)
    insort(cands, new)
    if fid in fresh:  # fresh ones are in both lists
        _remove(other, entry)
        insort(other, new)


def _remove(order: Order, entry: tuple[Key, str]) -> None:
    i = bisect_left(order, entry)
    if i < len(order) and order[i] == entry:
        del order[i]
