"""The allocator core's invariants (AllocatorCore.validate, run after every step in tests):
resources add up on every agent and framework, the sorter agrees with what is held, and
what makes the incremental cycle sound (an allocatable agent is dirty or idle, and an idle
one is refused by every eligible framework that is not fresh)."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from services.allocator.fill import next_unit, take_unit, usable
from services.allocator.model import NOTHING
from services.allocator.quota import apply
from services.allocator.sorter import scalar_vector
from services.resources import Resources

if TYPE_CHECKING:
    from services.allocator.core import AllocatorCore


def check(core: AllocatorCore) -> None:
    """AllocatorCore's invariants, checked after every step in tests."""
    held: dict[str, Resources] = {fid: Resources() for fid in core.frameworks}
    for agent_id, agent in core.agents.items():
        assert agent.agent_id == agent_id
        for fid, r in (*agent.offered.items(), *agent.used.items()):
            assert fid in core.frameworks, f"{agent_id}: unknown framework {fid}"
            assert r, f"{agent_id}: empty entry for {fid}"
            assert agent_id in core.frameworks[fid].agents
            held[fid] += r
        allocated = agent.allocated()
        for r in (agent.total, agent.free, allocated):
            assert all(v >= 0 for v in r.scalars.values()), f"{agent_id}: negative {r}"
        assert agent.total.contains(allocated), f"{agent_id}: {allocated} > {agent.total}"
        assert (allocated + agent.free).same(agent.total), (
            f"{agent_id}: allocated {allocated} + free {agent.free} != {agent.total}")
    total = Resources()
    for agent in core.agents.values():
        total += agent.total
    assert dict(core.sorter.total) == scalar_vector(total), (core.sorter.total, total)
    for fid, fw in core.frameworks.items():
        assert fw.framework_id == fid
        assert all(a in core.agents and (fid in core.agents[a].offered
                                         or fid in core.agents[a].used)
                   for a in fw.agents), f"{fid}: stale agents {fw.agents}"
        assert dict(core.sorter.allocation(fid)) == scalar_vector(held[fid]), fid
        offered = Resources.total(core.agents[a].offered[fid] for a in fw.agents
                                  if fid in core.agents[a].offered)
        assert fw.offered == (scalar_vector(offered) if fw.demands else {}), fid
    assert core._declared == sum(1 for fw in core.frameworks.values() if fw.demands)
    core.filters.validate(core.agents, core.frameworks)
    core.fanout.validate(core.agents, core.frameworks)
    core.sorter.validate()
    _incremental(core)

def _incremental(core: AllocatorCore) -> None:
    """What makes skipping agents sound: an agent with allocatable free resources is
    dirty or idle, and an idle one is refused by every eligible framework that is not
    fresh (a filter in the table, expired or not, nothing of its role, or its bound of
    outstanding offers reached, remembered as held back)."""
    assert core._dirty <= core.agents.keys() and core._idle <= core.agents.keys()
    assert core.away <= core.agents.keys() and not core._idle & core.away
    assert core._fresh <= core.frameworks.keys()
    assert core._touched <= core.frameworks.keys()
    assert core.decisions.keys() <= core.frameworks.keys()
    for agent_id, agent in core.agents.items():
        if agent_id in core._dirty or agent_id in core.away \
                or not core._allocatable(agent.free):
            continue
        assert agent_id in core._idle, f"{agent_id}: allocatable, neither dirty nor idle"
        if core._guarded:  # refused for a guarantee, maybe: the next cycle visits it
            continue
        for fid, fw in core.frameworks.items():
            if not fw.active or fw.suppressed or fid in core._fresh:
                continue
            offer = usable(agent.free, fw.role)
            if fw.demands and core._allocatable(offer):
                unit = next_unit(fw.demands, core.demand_held(fid, agent))
                take = None if unit is None else take_unit(offer, unit, fw.role)
                offer = NOTHING if take is None else take
            if core.quotas.limited and core._allocatable(offer):
                offer = apply(core, fw, offer, None)[0] or NOTHING
            flts = core.filters.on(agent_id).get(fid, ())
            if fid in core.fanout.held_back and core.fanout.full(fid, agent):
                continue  # made fresh once it answers some of its offers
            assert not core._allocatable(offer) or any(
                f.refuses(offer, -math.inf) for f in flts
            ), f"idle {agent_id} would be offered to {fid}"
