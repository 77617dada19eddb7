"""Incremental allocation: a cycle visits only the agents whose free resources changed or
whose filter ended, and idle agents only for frameworks that became eligible; a steady
cluster is not visited at all. A hypothesis state machine drives an incremental core and a
full-scan one (`incremental=False`, every agent and framework each cycle) with the same
random events: they must make the same allocations, with validate() after every step."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from services.allocator.core import Agent, AllocatorCore, Cycle, Framework, Outcome
from services.allocator.fill import Shape, next_unit, take_unit
from services.allocator.quota import apply
from services.allocator.reasons import GUARANTEE_REASON
from services.resources import Resources
from tests.allocator.test_allocator_core import ROLES, agent_totals

AGENT = Resources.of(cpus=4, mem=8192, ports=[(31000, 31009)])
# Framework roles of the machine: flat ones (reservations are for these) and sub-roles.
FW_ROLES = [*ROLES, "a/x", "a/y"]
YEAR = 365 * 24 * 3600.0


def cluster(agents: int, frameworks: int, incremental: bool = True) -> AllocatorCore:
    core = AllocatorCore(incremental=incremental)
    for i in range(agents):
        core.agent_added(f"a{i}", f"h{i}", AGENT)
    for j in range(frameworks):
        core.framework_added(f"f{j}", "*")
    return core


def decline_all(core: AllocatorCore, cycle: Cycle, refuse: float, now: float) -> None:
    for a in cycle.allocations:
        assert core.recover(a.agent_id, a.framework_id, a.resources, refuse, now)


def saturate(core: AllocatorCore, now: float) -> Cycle:
    """Every framework declines every agent for a year; the cycle that sees it."""
    for agent in core.agents.values():
        for fid, offered in list(agent.offered.items()):
            core.recover(agent.agent_id, fid, offered, YEAR, now)
    cycle = core.allocate(now)
    while cycle.allocations:
        decline_all(core, cycle, YEAR, now)
        cycle = core.allocate(now)
        core.validate()
    return cycle


def test_a_steady_cluster_is_not_visited() -> None:
    core = cluster(6, 3)
    first = core.allocate(0.0)
    assert first.visited == 6 and len(first.allocations) == 6
    held = core.allocate(0.5)  # offers outstanding, nothing changed
    assert held.visited == 0 and not held.allocations and not held.remade
    assert {d.framework_id for d in held.decisions} == {"f0", "f1", "f2"}  # still standing
    saturate(core, 1.0)
    steady = core.allocate(2.0)
    assert steady.visited == 0 and not steady.allocations and not steady.remade
    assert all(d.outcome is Outcome.FILTERED for d in steady.decisions)
    core.validate()


def test_a_recovered_agent_alone_is_visited() -> None:
    core = cluster(5, 2)
    cycle = core.allocate(0.0)
    a = next(x for x in cycle.allocations if x.agent_id == "a3")
    core.recover(a.agent_id, a.framework_id, a.resources, 0, 0.0)
    again = core.allocate(1.0)
    assert again.visited == 1
    assert [(x.agent_id, x.framework_id) for x in again.allocations] == [("a3", a.framework_id)]
    assert [d.framework_id for d in again.remade] == [a.framework_id]


def test_a_filter_ending_revisits_its_agent_at_its_expiry() -> None:
    core = cluster(4, 1)
    saturate(core, 0.0)
    core.revive("f0")
    revived = core.allocate(1.0)
    assert [a.agent_id for a in revived.allocations] == ["a0", "a1", "a2", "a3"]
    offer = revived.allocations[2]
    assert not core.allocate(1.0).allocations  # nothing changed
    core.recover("a2", "f0", offer.resources, 5.0, 1.0)
    for agent in ("a0", "a1", "a3"):
        core.recover(agent, "f0", core.agents[agent].offered["f0"], YEAR, 1.0)
    assert core.allocate(2.0).visited == 4  # the four recovered agents, all refused
    assert core.next_deadline(2.0) == 6.0
    assert core.allocate(5.9).visited == 0
    ended = core.allocate(6.0)
    assert ended.visited == 1 and [x.agent_id for x in ended.allocations] == ["a2"]
    core.validate()


def test_a_new_framework_is_tried_on_idle_agents_only() -> None:
    core = cluster(8, 2)
    saturate(core, 0.0)
    core.framework_added("late", "*")
    cycle = core.allocate(1.0)
    assert cycle.visited == 8  # the idle agents, for the fresh framework only
    assert [x.framework_id for x in cycle.allocations] == ["late"] * 8  # none refuses
    assert {d.framework_id for d in cycle.remade} == {"late"}
    assert core.allocate(1.0).visited == 0
    core.validate()


def test_revive_drops_filters_and_offers_idle_agents_again() -> None:
    core = cluster(3, 2)
    saturate(core, 0.0)
    core.revive("f1")
    cycle = core.allocate(1.0)
    assert {x.framework_id for x in cycle.allocations} == {"f1"}
    assert len(cycle.allocations) == 3
    core.validate()


def test_next_deadline_skips_filters_revive_dropped() -> None:
    core = cluster(2, 2)
    core.refuse("f0", "a0", until=10.0)
    core.refuse("f1", "a1", until=20.0)
    assert core.next_deadline(0.0) == 10.0
    core.revive("f0")
    assert core.next_deadline(0.0) == 20.0
    core.framework_removed("f1")
    assert core.next_deadline(0.0) is None
    assert len(core.filters.heap) == 0  # dead entries dropped on the way


def test_decisions_of_frameworks_a_cycle_does_not_concern_stand() -> None:
    core = cluster(3, 3)
    first = core.allocate(0.0)
    assert [(a.agent_id, a.framework_id) for a in first.allocations] == [
        ("a0", "f0"), ("a1", "f1"), ("a2", "f2")]
    by_fw = {d.framework_id: d for d in first.decisions}
    core.recover("a0", "f0", first.allocations[0].resources, YEAR, 1.0)
    second = core.allocate(1.0)
    assert [(a.agent_id, a.framework_id) for a in second.allocations] == [("a0", "f1")]
    assert {d.framework_id for d in second.remade} == {"f0", "f1"}
    assert {d.framework_id: d for d in second.decisions}["f2"] is by_fw["f2"]


@pytest.mark.parametrize("refuse", [5.0, YEAR])
def test_decline_rounds_match_a_full_scan(refuse: float) -> None:
    """Mesos's DeclineOffers shape, small: the same allocations every round."""
    inc, full = cluster(30, 7), cluster(30, 7, incremental=False)
    now = 0.0
    ci, cf = inc.allocate(now), full.allocate(now)
    for _ in range(12):
        assert _plain(ci) == _plain(cf)
        decline_all(inc, ci, refuse, now)
        decline_all(full, cf, refuse, now)
        now += 1.0
        ci, cf = inc.allocate(now), full.allocate(now)
        inc.validate()
    assert _plain(ci) == _plain(cf)


def test_a_guarantee_that_stays_short_does_not_make_a_steady_cluster_visited() -> None:
    """Role a's guarantee can never be met (its framework wants tasks larger than any
    agent), so the free pool stays set aside and the others are refused everywhere. Nothing
    changes: no cycle visits an agent (each visited every agent with every framework: 1 s a
    cycle at 100 frameworks x 1,000 agents). The guarantee lifted, the idle agents are
    offered at once."""
    core = cluster(6, 2)
    core.framework_added("fa", "a")
    core.demand("fa", [Shape.of(Resources.of(cpus=8, mem=64), 1, 0)])
    core.set_quota("a", {"cpus": 100.0}, None)
    first = core.allocate(0.0)
    assert first.visited == 6 and not first.allocations  # all set aside for role a
    steady = [core.allocate(t).visited for t in (1.0, 2.0, 3.0)]
    assert steady == [0, 0, 0]
    core.set_weight("*", 2.0)  # the others' decisions are remade, no agent visited
    reweighed = core.allocate(3.5)
    assert reweighed.visited == 0 and {d.framework_id for d in reweighed.remade} == {"f0", "f1"}
    assert all(d.outcome is Outcome.FAIR_SHARE and d.reason.startswith(GUARANTEE_REASON)
               for d in reweighed.remade), reweighed.remade  # not "nothing fits"
    core.validate()
    core.set_quota("a", None, None)
    lifted = core.allocate(4.0)
    assert lifted.visited == 6
    assert sorted(a.agent_id for a in lifted.allocations) == [f"a{i}" for i in range(6)]
    core.validate()


def test_a_fresh_framework_taking_a_port_on_an_idle_agent_lifts_another_filter_there(
) -> None:
    """fb declined s3's offer (cpus 0.5, mem 64, port 31000: a 5 s filter of those). s1
    going, fa holds less and is fresh; on s3 it takes port 31000, so fb's next task there
    would use 31001, which its filter does not cover: a full scan offers s3 to fa and then
    to fb; the incremental core, which visited the idle s3 for fa alone, offered it to fa
    only (found by the machine below, as an invariant failure: "idle s3 would be offered to
    fb"). An idle agent where such a filter stands is filled with every framework."""
    unit = Resources.of(cpus=0.5, mem=64)
    role_a = Resources.of(role="a", cpus=1, mem=256)
    trace = []
    for core in (AllocatorCore(), AllocatorCore(incremental=False)):
        core.set_quota("a", None, {"cpus": 2.0})
        core.set_weight("a", 0.5)
        core.agent_added("s1", "h1", Resources.of(cpus=1, mem=16, ports=[(31000, 31000)])
                         + role_a)
        core.agent_added("s2", "h2", Resources.of(cpus=4, mem=16, ports=[(31000, 31000)])
                         + Resources.of(role="b", cpus=1, mem=256))
        core.framework_added("fb", "b")
        core.demand("fb", [Shape.of(unit, 1, 1)])
        core.framework_added("fa", "a")
        cycles = [core.allocate(0.0)]
        core.agent_added("s3", "h3", Resources.of(cpus=0.5, mem=512, ports=[(31000, 31008)])
                         + role_a)
        core.demand("fa", [Shape.of(unit, 1, 1), Shape.of(unit, 1, 0)])
        cycles.append(core.allocate(0.0))
        for a in cycles[-1].allocations:  # declined: the default 5 s filter
            core.recover(a.agent_id, a.framework_id, a.resources, None, 0.0)
        cycles.append(core.allocate(0.0))
        core.agent_removed("s1")
        cycles.append(core.allocate(0.0))
        trace.append([_plain(c) for c in cycles])
    incremental, full = trace
    assert [(a[1], a[2]) for a in full[-1]] == [("s3", "fa"), ("s3", "fb")]
    assert incremental == full


def test_a_guarantee_elsewhere_coming_and_going_reevaluates_who_reclaims() -> None:
    """Whether a framework wants (and reclaims) depends, under quotas, on other roles: a
    framework of a guaranteed role arriving sets the free pool aside, so one of another role
    stops wanting and its reclaim is dropped; that framework leaving makes it want again and
    reclaim anew. Neither event concerns the wanting framework, yet a full scan sees both
    (found by the machine below: an incremental core kept the old reclaim's deadline)."""
    agent = Resources.of(cpus=0.5, mem=16, ports=[(31000, 31000)]) + Resources.of(
        role="a", cpus=1, mem=256)
    trace = []
    for core in (AllocatorCore(), AllocatorCore(incremental=False)):
        for fid in ("f1", "f2", "f3"):
            core.framework_added(fid, "a")
        core.set_quota("a/x", {"cpus": 1.0}, None)
        core.agent_added("a1", "h1", agent)
        core.demand("f3", [Shape.of(Resources.of(cpus=0.5, mem=64), 1, 0)])
        first = core.allocate(0.0)  # f1 is offered the agent, f3 reclaims from it
        core.framework_added("fx", "a/x")
        second = core.allocate(0.0)
        deadline = core.next_deadline(0.0)
        core.framework_deactivated("fx")
        third = core.allocate(1.0)
        core.validate()
        trace.append([_plain(first), _plain(second), deadline, _plain(third)])
    incremental, full = trace
    assert full[0][-1] == ("reclaim", "f1", "a1", "f3") and full[2] is None
    assert full[3] == [("reclaim", "f1", "a1", "f3")]
    assert incremental == full


def _plain(cycle: Cycle) -> list[tuple[str, ...]]:
    return [(a.allocation_id, a.agent_id, a.framework_id, str(a.resources))
            for a in cycle.allocations] + [
        ("reclaim", r.framework_id, r.agent_id, r.for_framework_id) for r in cycle.reclaims] + [
        ("revoke", r.framework_id, r.agent_id, str(r.resources)) for r in cycle.revocations]


def _fits(core: AllocatorCore, fw: Framework, agent: Agent) -> bool:
    """Whether the agent's free resources hold what the framework would be offered (its
    next declared task, counting what it runs and is offered there)."""
    free = agent.free.for_role(fw.role)
    if not fw.demands:
        take: Resources | None = free if core._allocatable(free) else None
    else:
        unit = next_unit(fw.demands, core.demand_held(fw.framework_id, agent))
        take = take_unit(free, unit, fw.role) if unit else None
    return take is not None and apply(core, fw, take, None)[0] is not None


# -- the same random events to an incremental and a full-scan core --------------------------


class IncrementalMachine(RuleBasedStateMachine):
    """Both cores see the same events; the offers and tasks are the incremental core's
    (the same as the full scan's while their allocations agree, which is checked)."""

    def __init__(self) -> None:
        super().__init__()
        self.inc = AllocatorCore(incremental=True)
        self.full = AllocatorCore(incremental=False)
        self.now = 0.0
        self.n = 0
        self.offers: list[tuple[str, str, Resources]] = []
        self.tasks: list[tuple[str, str, Resources]] = []

    def both(self, method: str, *args: object) -> None:
        results = []
        for core in (self.inc, self.full):
            try:
                results.append(("ok", getattr(core, method)(*args)))
            except ValueError as exc:  # AllocatorError: both must refuse alike
                results.append(("error", type(exc).__name__))
        assert results[0] == results[1], (method, args, results)

    def pick(self, keys: list[str], i: int) -> str:
        return sorted(keys)[i % len(keys)]

    @rule(total=agent_totals())
    def add_agent(self, total: Resources) -> None:
        self.n += 1
        self.both("agent_added", f"a{self.n}", f"h{self.n}", total)

    @precondition(lambda self: self.inc.agents)
    @rule(i=st.integers(0, 99))
    def remove_agent(self, i: int) -> None:
        agent = self.pick(list(self.inc.agents), i)
        self.both("agent_removed", agent)
        self.offers = [o for o in self.offers if o[0] != agent]
        self.tasks = [t for t in self.tasks if t[0] != agent]

    @precondition(lambda self: self.inc.agents)
    @rule(i=st.integers(0, 99), grow=st.booleans())
    def update_agent(self, i: int, grow: bool) -> None:
        agent = self.inc.agents[self.pick(list(self.inc.agents), i)]
        extra = Resources.of(cpus=1)
        if grow:
            self.both("agent_updated", agent.agent_id, agent.total + extra)
        elif agent.total.contains(extra):
            self.both("agent_updated", agent.agent_id, agent.total - extra)

    @rule(role=st.sampled_from(FW_ROLES), active=st.booleans(), then=st.booleans())
    def add_framework(self, role: str, active: bool, then: bool) -> None:
        self.n += 1
        self.both("framework_added", f"f{self.n}", role, active)
        self.then(then)

    @precondition(lambda self: self.inc.frameworks)
    @rule(i=st.integers(0, 99))
    def remove_framework(self, i: int) -> None:
        fid = self.pick(list(self.inc.frameworks), i)
        self.both("framework_removed", fid)
        self.offers = [o for o in self.offers if o[1] != fid]
        self.tasks = [t for t in self.tasks if t[1] != fid]

    @precondition(lambda self: self.inc.frameworks)
    @rule(i=st.integers(0, 99), how=st.sampled_from(
        ["framework_activated", "framework_deactivated", "suppress", "revive"]),
        then=st.booleans())
    def framework_event(self, i: int, how: str, then: bool) -> None:
        self.both(how, self.pick(list(self.inc.frameworks), i))
        self.then(then)

    @precondition(lambda self: self.inc.frameworks)
    @rule(i=st.integers(0, 99), shapes=st.lists(st.tuples(
        st.sampled_from([0.5, 1.0, 3.0]), st.sampled_from([64.0, 512.0, 4096.0]),
        st.integers(1, 6), st.sampled_from([0, 0, 1])), max_size=2), then=st.booleans())
    def declare_demand(self, i: int, shapes: list[tuple[float, float, int, int]],
                       then: bool) -> None:
        demand = [Shape.of(Resources.of(cpus=c, mem=m), n, ports) for c, m, n, ports in shapes]
        self.both("demand", self.pick(list(self.inc.frameworks), i), demand)
        self.then(then)

    @rule(role=st.sampled_from(FW_ROLES), weight=st.sampled_from([0.5, 1.0, 3.0]))
    def set_weight(self, role: str, weight: float) -> None:
        self.both("set_weight", role, weight)

    @rule(role=st.sampled_from(FW_ROLES), guarantee=st.sampled_from([None, 0.0, 1.0, 4.0]),
          limit=st.sampled_from([None, 0.0, 0.5, 2.0, 8.0]), then=st.booleans())
    def set_quota(self, role: str, guarantee: float | None, limit: float | None,
                  then: bool) -> None:
        self.both("set_quota", role, None if guarantee is None else {"cpus": guarantee},
                  None if limit is None else {"cpus": limit})  # cpus:0 is a limit
        self.then(then)

    @precondition(lambda self: self.inc.agents and self.inc.frameworks)
    @rule(i=st.integers(0, 99), j=st.integers(0, 99), dt=st.sampled_from([0.5, 4.0, 1e9]))
    def refuse(self, i: int, j: int, dt: float) -> None:
        self.both("refuse", self.pick(list(self.inc.frameworks), j),
                  self.pick(list(self.inc.agents), i), self.now + dt)

    @rule(dt=st.sampled_from([0.0, 0.0, 1.0, 6.0]))
    def advance_and_allocate(self, dt: float) -> None:
        self.now += dt
        self.allocate()

    def allocate(self) -> None:
        ci, cf = self.inc.allocate(self.now), self.full.allocate(self.now)
        assert _plain(ci) == _plain(cf)
        assert all(any(d is s for s in ci.decisions) for d in ci.remade)
        assert {d.framework_id for d in ci.decisions} == set(self.inc.frameworks)
        by_full = {d.framework_id: d for d in cf.decisions}
        exact = (Outcome.OFFERED, Outcome.INACTIVE, Outcome.SUPPRESSED)
        for d in ci.remade:
            # Offered, inactive, suppressed: as a full scan says. Not offered: why may be
            # told apart differently (a full scan considers every framework on every
            # agent), but truthfully: filtered = it has filters; nothing fits = nothing.
            full = by_full[d.framework_id].outcome
            assert (d.outcome is full) if full in exact or d.outcome in exact else True, (
                d, full)
            if d.outcome is Outcome.FILTERED:
                assert d.framework_id in self.inc.filters and d.agents_filtered > 0
            if d.outcome is Outcome.NO_FIT:
                fw = self.inc.frameworks[d.framework_id]
                assert not any(_fits(self.inc, fw, a) for a in self.inc.agents.values()), d
        for d in ci.decisions:  # standing: what a full scan says of offers and eligibility
            full = by_full[d.framework_id].outcome
            if d.outcome in (Outcome.INACTIVE, Outcome.SUPPRESSED) or full in (
                    Outcome.INACTIVE, Outcome.SUPPRESSED, Outcome.OFFERED):
                assert d.outcome is full, (d, full)
        self.offers += [(a.agent_id, a.framework_id, a.resources) for a in ci.allocations]

    @precondition(lambda self: self.offers)
    @rule(i=st.integers(0, 99), refuse=st.sampled_from([None, 0.0, 0.5, 5.0, 1e9]),
          then=st.booleans())
    def recover(self, i: int, refuse: float | None, then: bool) -> None:
        agent, fid, res = self.offers.pop(i % len(self.offers))
        self.both("recover", agent, fid, res, refuse, self.now)
        self.then(then)

    @precondition(lambda self: self.offers)
    @rule(i=st.integers(0, 99))
    def launch(self, i: int) -> None:
        agent, fid, res = self.offers.pop(i % len(self.offers))
        task = Resources({k: v // 2 for k, v in res.scalars.items() if v // 2})
        if not task:
            return
        self.both("resources_used", agent, fid, task)
        self.tasks.append((agent, fid, task))
        self.offers.append((agent, fid, res - task))

    @precondition(lambda self: self.tasks)
    @rule(i=st.integers(0, 99), then=st.booleans())
    def finish(self, i: int, then: bool) -> None:
        self.both("resources_released", *self.tasks.pop(i % len(self.tasks)))
        self.then(then)

    @rule()
    def broker_failover(self) -> None:
        self.both("recover_all_offers")
        self.offers = []

    @rule(dt=st.sampled_from([0.1, 1.0, 3.0, 6.0]), then=st.booleans())
    def advance(self, dt: float, then: bool) -> None:
        self.now += dt
        self.then(then)

    def then(self, allocate: bool) -> None:
        """An allocation right after an event (else events pile up until the next)."""
        if allocate:
            self.allocate()

    @invariant()
    def valid_and_alike(self) -> None:
        self.inc.validate()
        self.full.validate()
        assert self.inc.next_deadline(self.now) == self.full.next_deadline(self.now)
        for agent_id, agent in self.inc.agents.items():
            other = self.full.agents[agent_id]
            assert agent.free.same(other.free) and agent.offered.keys() == other.offered.keys()


TestIncrementalMachine = IncrementalMachine.TestCase
TestIncrementalMachine.settings = settings(
    max_examples=200, stateful_step_count=50, deadline=None,
    suppress_health_check=[HealthCheck.too_slow])


def test_a_filtered_reason_reads_back_as_written() -> None:
    """`offerbus why` reads the first filtered agent and its expiry back from the sentence
    the allocator wrote (services/allocator/reasons.py holds both sides)."""
    from services.allocator.reasons import filtered_reason, parse_filtered

    assert parse_filtered(filtered_reason(3, "c1-S7", 1795000000.25)) == ("c1-S7", 1795000000.25)
    assert parse_filtered("no agent has free resources") is None
