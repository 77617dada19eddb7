"""DRF with declared demand in the allocator core: the DRF paper's example (Ghodsi et al.,
NSDI 2011: one agent of 9 CPUs and 18 GB; A runs <1 CPU, 4 GB> tasks, B <3 CPUs, 1 GB>;
DRF gives A 3 tasks and B 2) whichever framework starts first, weighted DRF, reclaiming a
sitting framework's offers for a newcomer, and revocation. The frameworks are simulated
greedy schedulers: they launch as many tasks of their shape as their offers hold, up to
what they want; the "master" kills the youngest tasks a revocation names (bench/drf.py)."""

from __future__ import annotations

import pytest

from bench.drf import GreedyCluster
from bench.drf import progressive_filling as drf_filling
from services.allocator.core import AllocatorCore
from services.allocator.fill import Shape
from services.resources import Resources
from tests.fairness import A_TASK, B_TASK, GB, PAPER_AGENT, progressive_filling


def paper(grace: float | None = 5.0) -> Cluster:
    return Cluster({"agent-1": PAPER_AGENT}, grace)


class Cluster(GreedyCluster):
    def settle(self, rounds: int = 40, validate: bool = True) -> None:
        super().settle(rounds, validate)


def test_both_at_once_drf_gives_a_three_and_b_two() -> None:
    c = paper()
    c.add("a", A_TASK, 10)
    c.add("b", B_TASK, 10)
    c.settle()
    assert (c.count("a"), c.count("b")) == (3, 2)
    assert c.revoked == 0


@pytest.mark.parametrize("first,second", [("a", "b"), ("b", "a")])
def test_whichever_starts_first_drf_ends_with_a_three_and_b_two(first: str,
                                                                  second: str) -> None:
    c = paper()
    shapes = {"a": A_TASK, "b": B_TASK}
    c.add(first, shapes[first], 10)
    c.settle()
    alone = c.count(first)
    assert alone == (4 if first == "a" else 3)  # alone, it takes what fits
    c.add(second, shapes[second], 10)
    c.settle()
    assert (c.count("a"), c.count("b")) == (3, 2)
    assert c.revoked == 1  # one task of the first, beyond its share, was revoked


def test_without_revocation_the_late_framework_gets_only_what_is_free() -> None:
    c = paper(grace=None)
    c.add("b", B_TASK, 10)
    c.settle()
    c.add("a", A_TASK, 10)
    c.settle()
    assert (c.count("a"), c.count("b")) == (0, 3)
    decision = c.core.decisions["a"]
    assert decision.outcome.name == "NO_FIT"


@pytest.mark.parametrize("first", ["a", "b", None])
def test_weighted_drf_two_to_one(first: str | None) -> None:
    agent = Resources.of(cpus=18, mem=36 * GB)
    weights = {"a": 2.0, "b": 1.0}
    shapes = {"a": A_TASK, "b": B_TASK}
    expect = progressive_filling(agent, {f: (shapes[f], weights[f]) for f in shapes})
    unweighted = progressive_filling(agent, {f: (shapes[f], 1.0) for f in shapes})
    assert expect != unweighted  # the weights matter in this example
    c = Cluster({"agent-1": agent})
    order = ["a", "b"] if first in (None, "a") else ["b", "a"]
    for f in order:
        c.add(f, shapes[f], 100, weights[f])
        if first is not None:
            c.settle()
    c.settle()
    assert {f: c.count(f) for f in shapes} == expect


def test_a_sitting_framework_loses_offers_to_a_newcomer_at_once() -> None:
    """Omega's complaint: a framework holding offers for every agent and answering none
    delays nobody. The newcomer's first cycle reclaims what it needs."""
    agents = {f"agent-{i}": Resources.of(cpus=4, mem=8 * GB) for i in range(3)}
    core = AllocatorCore()
    for aid, total in agents.items():
        core.agent_added(aid, aid, total)
    core.framework_added("sitter", "*")
    cycle = core.allocate(0.0)
    assert len(cycle.allocations) == 3  # whole agents, as Mesos: it sits on them
    core.framework_added("service", "*")
    core.demand("service", [Shape.of(Resources.of(cpus=0.5, mem=256), 1)])
    cycle = core.allocate(1.0)
    core.validate()
    assert [(r.framework_id, r.agent_id) for r in cycle.reclaims] == [("sitter", "agent-0")]
    assert "reclaiming offers of sitter" in core.decisions["service"].reason
    # the broker rescinds it; the next cycle offers the newcomer its task at once
    core.recover("agent-0", "sitter", core.agents["agent-0"].offered["sitter"], 0, 1.1)
    cycle = core.allocate(1.2)
    core.validate()
    mine = [a for a in cycle.allocations if a.framework_id == "service"]
    assert len(mine) == 1 and mine[0].resources.same(Resources.of(cpus=0.5, mem=256))
    rest = [a for a in cycle.allocations if a.framework_id == "sitter"]
    assert rest and rest[0].agent_id == "agent-0"  # the rest goes back to the sitter


def test_a_newcomer_of_unknown_demand_also_gets_a_sitters_offer() -> None:
    core = AllocatorCore()
    for i in range(2):
        core.agent_added(f"agent-{i}", "h", Resources.of(cpus=4, mem=8 * GB))
    core.framework_added("sitter", "*")
    core.allocate(0.0)
    core.framework_added("new", "*")
    cycle = core.allocate(1.0)
    assert [(r.framework_id, r.agent_id) for r in cycle.reclaims] == [("sitter", "agent-0")]
    core.recover("agent-0", "sitter", core.agents["agent-0"].offered["sitter"], 0, 1.1)
    cycle = core.allocate(1.2)
    core.validate()
    assert [(a.framework_id, a.agent_id) for a in cycle.allocations] == [("new", "agent-0")]
    # stable: with one agent each, nobody reclaims from the other
    core.framework_activated("sitter")
    assert not core.allocate(2.0).reclaims


def test_demand_met_and_unknown_demand_shares_the_rest() -> None:
    """A framework of declared demand is offered no more than it declared; one of unknown
    demand takes what it may before passing the declared one's share, then the rest."""
    core = AllocatorCore()
    core.agent_added("agent-1", "h", Resources.of(cpus=8, mem=8 * GB))
    core.framework_added("d", "*")
    core.demand("d", [Shape.of(Resources.of(cpus=1, mem=1 * GB), 2)])
    core.framework_added("u", "*")
    cycle = core.allocate(0.0)
    core.validate()
    offered = {a.framework_id: a.resources for a in cycle.allocations}
    assert offered["d"].same(Resources.of(cpus=2, mem=2 * GB))
    assert offered["u"].same(Resources.of(cpus=6, mem=6 * GB))
    assert core.decisions["d"].outcome.name == "OFFERED"
    assert "2 task(s) of its declared demand" in core.decisions["d"].reason
    core.demand("d", [Shape.of(Resources.of(cpus=1, mem=1 * GB), 1)])
    core.allocate(1.0)
    assert core.decisions["d"].outcome.name == "DEMAND_MET"


def test_ports_are_taken_per_task() -> None:
    core = AllocatorCore()
    core.agent_added("agent-1", "h", Resources.of(cpus=4, mem=4 * GB,
                                                  ports=[(31000, 31001), (31005, 31005)]))
    core.framework_added("d", "*")
    core.demand("d", [Shape.of(Resources.of(cpus=1, mem=256), 5, ports=1)])
    cycle = core.allocate(0.0)
    core.validate()
    got = Resources.total(a.resources for a in cycle.allocations)  # guaranteed + revocable
    assert got.same(Resources.of(cpus=3, mem=768, ports=[(31000, 31001), (31005, 31005)]))


def test_shape_validation() -> None:
    with pytest.raises(ValueError):
        Shape.of(Resources(), 1)
    with pytest.raises(ValueError):
        Shape.of(A_TASK, 0)


def test_revocations_end_with_many_shapes_arriving_one_by_one() -> None:
    """Six greedy frameworks of different shapes on 20 agents, each arriving once the
    others settled: revocations move resources from higher shares to lower ones only, so
    they end (before whole tasks were counted, they ping-ponged without end), near DRF."""
    agents = {f"agent-{i:02d}": Resources.of(cpus=8, mem=32 * GB) for i in range(20)}
    shapes = [(1, 4), (3, 1), (2, 2), (0.5, 6), (4, 2), (1, 1)]
    fws = {f"F{i}": Resources.of(cpus=c, mem=m * GB) for i, (c, m) in enumerate(shapes)}
    c = GreedyCluster(agents)
    for fid, task in fws.items():
        c.add(fid, task, 10_000)
        c.settle(rounds=1000, validate=True, quiet=30)
    drf = drf_filling(agents, {f: (t, 1.0) for f, t in fws.items()})
    for fid in fws:
        assert abs(c.count(fid) - drf[fid]) <= max(3, drf[fid] // 5), (fid, c.count(fid), drf)


def test_declared_demand_is_offered_on_every_agent_it_fits() -> None:
    """A framework sees every agent its next tasks fit (up to its demand on each) and
    places them itself (spread, hostname:unique); what counts against its demand on an
    agent is what it runs and is offered there."""
    core = AllocatorCore()
    for i in range(3):
        core.agent_added(f"agent-{i}", f"h{i}", Resources.of(cpus=4, mem=4 * GB))
    core.framework_added("svc", "*")
    core.demand("svc", [Shape.of(Resources.of(cpus=1, mem=256), 2)])
    cycle = core.allocate(0.0)
    core.validate()
    assert sorted(a.agent_id for a in cycle.allocations) == ["agent-0", "agent-1", "agent-2"]
    assert all(a.resources.same(Resources.of(cpus=2, mem=512)) for a in cycle.allocations)
    core.resources_used("agent-0", "svc", Resources.of(cpus=1, mem=256))
    core.resources_used("agent-1", "svc", Resources.of(cpus=1, mem=256))
    for a in cycle.allocations:  # the rest declined without a filter
        left = core.agents[a.agent_id].offered.get("svc")
        if left is not None:
            core.recover(a.agent_id, "svc", left, 0, 0.1)
    assert not core.allocate(0.2).allocations  # its two tasks run: demand met
    assert core.decisions["svc"].outcome.name == "DEMAND_MET"
    core.validate()
