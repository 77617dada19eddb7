"""The allocator's pure core: weighted DRF fairness, suppress/revive, decline filters,
reservations and decisions (unit tests), and a hypothesis state machine checking its
invariants and that no resource is ever offered twice at the same time."""

from __future__ import annotations

import random

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from schemas import internal_pb2
from services.allocator.core import (
    DEFAULT_REFUSE_SECONDS,
    AllocatorCore,
    AllocatorError,
    Cycle,
    Outcome,
)
from services.resources import Resources

AGENT = Resources.of(cpus=4, mem=8192, disk=1000, ports=[(31000, 31099)])


def cluster(n_agents: int, frameworks: dict[str, str], total: Resources = AGENT) -> AllocatorCore:
    core = AllocatorCore()
    for i in range(n_agents):
        core.agent_added(f"a{i:03}", f"host{i}", total, {"rack": f"r{i % 3}"})
    for fid, role in frameworks.items():
        core.framework_added(fid, role)
    core.validate()
    return core


def decision(cycle: Cycle, framework_id: str) -> internal_pb2.AllocatorDecision:
    [d] = [d for d in cycle.decisions if d.framework_id == framework_id]
    return d.to_proto()


def offered_to(cycle: Cycle, framework_id: str) -> list[str]:
    return [a.agent_id for a in cycle.allocations if a.framework_id == framework_id]


def run_greedy(core: AllocatorCore, tasks: dict[str, Resources], cycles: int,
               seed: int = 1) -> list[dict[str, float]]:
    """Frameworks with unbounded demand: each fills every offer with its tasks and returns
    the rest (no filter); a random ~30% of running tasks end each cycle."""
    rng = random.Random(seed)
    running: list[tuple[str, str, Resources]] = []
    history = []
    now = 0.0
    for _ in range(cycles):
        for a in core.allocate(now).allocations:
            left, task = a.resources, tasks[a.framework_id]
            while left.contains(task):
                core.resources_used(a.agent_id, a.framework_id, task)
                running.append((a.agent_id, a.framework_id, task))
                left -= task
            if left:
                core.recover(a.agent_id, a.framework_id, left, 0, now)
        core.validate()
        history.append({f: core.sorter.share(f).dominant_share for f in tasks})
        ending = [t for t in running if rng.random() < 0.3]
        for t in ending:
            running.remove(t)
            core.resources_released(*t)
        now += 1.0
    return history


# -- fairness ------------------------------------------------------------------------------


def test_equal_demand_converges_to_equal_dominant_shares() -> None:
    # Agents a whole number of tasks wide: offers hold no leftovers the frameworks return.
    core = cluster(60, {"f1": "a", "f2": "b"}, total=Resources.of(cpus=4, mem=4096))
    task = Resources.of(cpus=1, mem=1024)
    history = run_greedy(core, {"f1": task, "f2": task}, cycles=60)
    for shares in history[5:]:
        a, b = shares["f1"], shares["f2"]
        assert abs(a - b) <= 0.1 * max(a, b), shares
        assert a + b == pytest.approx(1.0)  # work-conserving: the cluster stays full


def test_complementary_demands_get_similar_dominant_shares() -> None:
    """cpu-heavy and mem-heavy tasks fragment agents, and offers count whole agents'
    leftovers while outstanding: shares stay close on average, not at every cycle."""
    core = cluster(60, {"cpu-heavy": "a", "mem-heavy": "b"})
    tasks = {"cpu-heavy": Resources.of(cpus=1, mem=512),
             "mem-heavy": Resources.of(cpus=0.5, mem=2048)}
    history = run_greedy(core, tasks, cycles=60)
    a = sum(s["cpu-heavy"] for s in history[10:]) / len(history[10:])
    b = sum(s["mem-heavy"] for s in history[10:]) / len(history[10:])
    assert abs(a - b) <= 0.1 * max(a, b), (a, b)
    assert min(a, b) > 0.45  # both dominant shares well above a third: DRF, not a split


def test_weights_two_to_one_give_two_to_one_shares() -> None:
    core = cluster(60, {"heavy": "gold", "light": "bronze"}, total=Resources.of(cpus=4, mem=4096))
    core.set_weight("gold", 2.0)
    task = Resources.of(cpus=1, mem=1024)
    history = run_greedy(core, {"heavy": task, "light": task}, cycles=60)
    ratios = [s["heavy"] / s["light"] for s in history[5:]]
    assert all(1.8 <= r <= 2.2 for r in ratios), ratios
    cycle = core.allocate(100.0)
    assert decision(cycle, "heavy").weight == 2.0


def test_lowest_share_first_and_ties_by_framework_id() -> None:
    core = cluster(1, {"f2": "a", "f1": "a"})
    cycle = core.allocate(0.0)
    assert offered_to(cycle, "f1") == ["a000"]  # tie at share 0: lower id first
    assert decision(cycle, "f2").outcome == internal_pb2.AllocatorDecision.OUTCOME_FAIR_SHARE
    [alloc] = cycle.allocations
    assert (alloc.dominant_share, alloc.weight, alloc.resources) == (0.0, 1.0, AGENT)
    assert cycle.allocations_message().allocations.allocations[0].agent_id == "a000"


# -- suppress, revive, filters ---------------------------------------------------------------


def test_filters_dropped_by_revive_do_not_pile_up_until_they_would_have_expired() -> None:
    """A framework that declines with a year-long filter and revives, over and over, used to
    leave every filter in the expiry heap for a year (issue 10, defect 8)."""
    core = cluster(2, {"f1": "a"})
    for i in range(10_000):
        core.refuse("f1", "a000", until=3.2e7 + i)
        if i % 2:
            core.revive("f1")
    live = len(core.filters)
    assert live <= 1
    assert len(core.filters.heap) <= 2 * live + 64
    core.validate()


def test_suppressed_framework_gets_nothing_and_revive_restores_and_clears_filters() -> None:
    core = cluster(2, {"f1": "a", "f2": "a"})
    core.suppress("f1")
    cycle = core.allocate(0.0)
    assert offered_to(cycle, "f1") == []
    assert sorted(offered_to(cycle, "f2")) == ["a000", "a001"]
    assert decision(cycle, "f1").outcome == internal_pb2.AllocatorDecision.OUTCOME_SUPPRESSED
    # f1 also holds a long filter on a000 before reviving.
    core.refuse("f1", "a000", until=1000.0)
    for a in cycle.allocations:
        core.recover(a.agent_id, a.framework_id, a.resources, 0, 1.0)
    core.suppress("f2")
    core.revive("f1")
    assert "f1" not in core.filters
    cycle = core.allocate(2.0)
    assert sorted(offered_to(cycle, "f1")) == ["a000", "a001"]
    assert decision(cycle, "f1").outcome == internal_pb2.AllocatorDecision.OUTCOME_OFFERED
    core.validate()


def test_decline_filter_hides_agent_until_it_expires() -> None:
    core = cluster(1, {"f1": "a"})
    [a] = core.allocate(10.0).allocations
    core.recover("a000", "f1", a.resources, refuse_seconds=5, now=10.0)
    cycle = core.allocate(14.999)
    assert cycle.allocations == ()
    d = decision(cycle, "f1")
    assert d.outcome == internal_pb2.AllocatorDecision.OUTCOME_FILTERED
    assert d.agents_filtered == 1 and "a000" in d.reason and "15.000" in d.reason
    assert offered_to(core.allocate(15.0), "f1") == ["a000"]
    core.validate()


def test_decline_filter_default_and_zero() -> None:
    core = cluster(1, {"f1": "a"})
    [a] = core.allocate(0.0).allocations
    core.recover("a000", "f1", a.resources, refuse_seconds=None, now=0.0)
    assert core.allocate(DEFAULT_REFUSE_SECONDS - 0.01).allocations == ()
    [a] = core.allocate(DEFAULT_REFUSE_SECONDS).allocations
    core.recover("a000", "f1", a.resources, refuse_seconds=0, now=6.0)
    assert offered_to(core.allocate(6.0), "f1") == ["a000"]


def test_filter_on_one_framework_passes_the_agent_to_the_next() -> None:
    core = cluster(1, {"f1": "a", "f2": "a"})
    [a] = core.allocate(0.0).allocations
    assert a.framework_id == "f1"
    core.recover("a000", "f1", a.resources, refuse_seconds=30, now=0.0)
    cycle = core.allocate(1.0)
    assert offered_to(cycle, "f2") == ["a000"]
    assert decision(cycle, "f1").outcome == internal_pb2.AllocatorDecision.OUTCOME_FILTERED


def test_filter_does_not_hide_more_resources_than_were_declined() -> None:
    core = cluster(1, {"f1": "a"})
    [a] = core.allocate(0.0).allocations
    task = Resources.of(cpus=1, mem=1024)
    core.resources_used("a000", "f1", task)
    core.recover("a000", "f1", a.resources - task, refuse_seconds=60, now=0.0)
    assert core.allocate(1.0).allocations == ()
    core.resources_released("a000", "f1", task)  # more is free now than was declined
    [again] = core.allocate(2.0).allocations
    assert again.resources == AGENT


def test_inactive_framework_is_skipped() -> None:
    core = cluster(1, {"f1": "a"})
    core.framework_deactivated("f1")
    cycle = core.allocate(0.0)
    assert cycle.allocations == ()
    assert decision(cycle, "f1").outcome == internal_pb2.AllocatorDecision.OUTCOME_INACTIVE
    core.framework_activated("f1")
    assert offered_to(core.allocate(1.0), "f1") == ["a000"]


# -- roles, agents, tasks --------------------------------------------------------------------


def test_reserved_resources_go_only_to_their_role() -> None:
    reserved = Resources.of(role="db", cpus=2, mem=2048)
    core = cluster(0, {"analytics": "batch", "postgres": "db"})
    core.agent_added("a0", "h0", AGENT + reserved)
    cycle = core.allocate(0.0)
    by_fw = {a.framework_id: a.resources for a in cycle.allocations}
    # analytics sorts first (tie, lower id) and takes the unreserved part only.
    assert by_fw == {"analytics": AGENT, "postgres": reserved}
    for a in cycle.allocations:
        core.recover(a.agent_id, a.framework_id, a.resources, 0, 0.0)
    core.framework_removed("postgres")
    [only] = core.allocate(1.0).allocations
    assert only.resources == AGENT  # nobody else gets the reservation
    core.validate()


def test_removed_agent_returns_nothing() -> None:
    core = cluster(2, {"f1": "a"})
    cycle = core.allocate(0.0)
    core.agent_removed("a001")
    assert core.recover("a001", "f1", AGENT, None, 1.0) is False  # the stale rescind
    for a in cycle.allocations:
        core.recover(a.agent_id, a.framework_id, a.resources, 0, 1.0)
    assert offered_to(core.allocate(2.0), "f1") == ["a000"]
    assert core.sorter.total["cpus"] == 4000
    core.validate()


def test_resources_used_by_tasks_are_not_offered() -> None:
    core = cluster(1, {"f1": "a", "f2": "b"})
    task = Resources.of(cpus=3, mem=1024, ports=[(31000, 31000)])
    core.resources_used("a000", "f1", task)  # e.g. rebuilt after a failover
    [a] = core.allocate(0.0).allocations
    assert a.framework_id == "f2"  # f1 holds a share already
    assert a.resources == AGENT - task
    assert not a.resources.contains(Resources.of(ports=[(31000, 31000)]))
    core.validate()


def test_task_from_an_offer_converts_offered_to_used() -> None:
    core = cluster(1, {"f1": "a"})
    [a] = core.allocate(0.0).allocations
    task = Resources.of(cpus=1, mem=128, ports=[(31005, 31006)])
    share = core.sorter.share("f1").dominant_share
    core.resources_used("a000", "f1", task)
    assert core.sorter.share("f1").dominant_share == share  # still allocated, just used now
    core.recover("a000", "f1", a.resources - task, 0, 0.0)
    core.validate()
    [b] = core.allocate(1.0).allocations
    assert b.resources == AGENT - task
    with pytest.raises(AllocatorError, match="offered"):
        core.recover("a000", "f1", AGENT, 0, 1.0)  # more than is offered


def test_nothing_fits_below_the_minimum() -> None:
    core = cluster(0, {"f1": "a"})
    core.agent_added("tiny", "h", Resources.of(cpus=0.005, mem=16))
    cycle = core.allocate(0.0)
    assert cycle.allocations == ()
    d = decision(cycle, "f1")
    assert d.outcome == internal_pb2.AllocatorDecision.OUTCOME_NO_FIT
    assert "cpus 0.01" in d.reason


def test_illegal_transitions_raise_and_change_nothing() -> None:
    core = cluster(1, {"f1": "a"})
    with pytest.raises(AllocatorError, match="twice"):
        core.agent_added("a000", "h", AGENT)
    with pytest.raises(AllocatorError, match="twice"):
        core.framework_added("f1", "a")
    with pytest.raises(AllocatorError, match="unknown framework"):
        core.suppress("nope")
    with pytest.raises(AllocatorError, match="unknown agent"):
        core.resources_used("nope", "f1", AGENT)
    with pytest.raises(AllocatorError, match="free"):
        core.resources_used("a000", "f1", AGENT + AGENT)
    with pytest.raises(AllocatorError, match="tasks hold"):
        core.resources_released("a000", "f1", Resources.of(cpus=1))
    with pytest.raises(AllocatorError, match="weight"):
        core.set_weight("a", 0)
    [a] = core.allocate(0.0).allocations
    with pytest.raises(AllocatorError, match="allocated"):
        core.agent_updated("a000", Resources.of(cpus=1))
    assert core.recover("a000", "f1", a.resources, 0, 0.0)
    core.validate()


def test_broker_failover_recovers_every_offer() -> None:
    core = cluster(3, {"f1": "a", "f2": "b"})
    assert len(core.allocate(0.0).allocations) == 3
    core.recover_all_offers()
    assert all(agent.free == AGENT for agent in core.agents.values())
    assert len(core.allocate(0.0).allocations) == 3  # no filters
    core.validate()


def test_decision_to_proto() -> None:
    core = cluster(1, {"f1": "a"})
    cycle = core.allocate(12.5)
    d = decision(cycle, "f1")
    assert d.decided_at_us == 12_500_000 and d.cycle == 1
    assert d.shares["cpus"] == 1.0 and d.dominant_resource == "cpus"
    assert list(d.allocation_ids) == [cycle.allocations[0].allocation_id]
    assert cycle.decisions_message().allocator_decisions.decisions[0].framework_id == "f1"


# -- state machine ---------------------------------------------------------------------------

ROLES = ["a", "b"]


@st.composite
def agent_totals(draw: st.DrawFn) -> Resources:
    total = Resources.of(cpus=draw(st.sampled_from([0.5, 1, 2, 4])),
                         mem=draw(st.sampled_from([16, 64, 512, 2048])),
                         ports=[(31000, 31000 + draw(st.integers(0, 9)))])
    if draw(st.booleans()):
        total += Resources.of(role=draw(st.sampled_from(ROLES)), cpus=1, mem=256)
    return total


def _sum(rs: list[Resources]) -> Resources:
    out = Resources()
    for r in rs:
        out += r
    return out


def _same(a: Resources, b: Resources) -> bool:
    return a.contains(b) and b.contains(a)


class AllocatorMachine(RuleBasedStateMachine):
    """Drives the core with random events; a model of offers, tasks and filters kept here
    independently checks what it allocates."""

    def __init__(self) -> None:
        super().__init__()
        self.core = AllocatorCore()
        self.now = 0.0
        self.n = 0
        self.totals: dict[str, Resources] = {}
        self.frameworks: dict[str, dict[str, object]] = {}  # role, active, suppressed
        self.offers: list[tuple[str, str, Resources]] = []  # (agent, framework, resources)
        self.tasks: list[tuple[str, str, Resources]] = []
        self.filters: list[tuple[str, str, Resources, float]] = []
        self.away: set[str] = set()  # agents a new master waits for (agent_away)

    def _pick(self, keys: list[str], i: int) -> str:
        return sorted(keys)[i % len(keys)]

    def _forget(self, agent: str | None = None, framework: str | None = None) -> None:
        def keep(t: tuple[str, str, Resources] | tuple[str, str, Resources, float]) -> bool:
            return t[0] != agent and t[1] != framework
        self.offers = [o for o in self.offers if keep(o)]
        self.tasks = [t for t in self.tasks if keep(t)]
        self.filters = [f for f in self.filters if f[0] != framework and f[1] != agent]

    # -- agents ------------------------------------------------------------------------
    @rule(total=agent_totals())
    def add_agent(self, total: Resources) -> None:
        self.n += 1
        agent = f"a{self.n}"
        self.core.agent_added(agent, f"host-{agent}", total)
        self.totals[agent] = total

    @precondition(lambda self: self.totals)
    @rule(i=st.integers(0, 99))
    def remove_agent(self, i: int) -> None:
        agent = self._pick(list(self.totals), i)
        self.core.agent_removed(agent)
        del self.totals[agent]
        self.away.discard(agent)
        self._forget(agent=agent)

    @precondition(lambda self: self.totals)
    @rule(i=st.integers(0, 99))
    def agent_away_or_back(self, i: int) -> None:
        """A new master's stream has the agent as recovering, then registered again."""
        agent = self._pick(list(self.totals), i)
        if agent in self.away:
            self.core.agent_back(agent)
            self.away.discard(agent)
        else:
            self.core.agent_away(agent)
            self.away.add(agent)

    @precondition(lambda self: self.totals)
    @rule(i=st.integers(0, 99), cpus=st.sampled_from([-1, 1]))
    def update_agent(self, i: int, cpus: int) -> None:
        agent = self._pick(list(self.totals), i)
        extra = Resources.of(cpus=1)
        total = self.totals[agent] + extra
        if cpus < 0:
            if not self.totals[agent].contains(extra):
                return
            total = self.totals[agent] - extra
        held = _sum([r for a, _, r in (*self.offers, *self.tasks) if a == agent])
        if total.contains(held):
            self.core.agent_updated(agent, total)
            self.totals[agent] = total
        else:
            with pytest.raises(AllocatorError):
                self.core.agent_updated(agent, total)

    # -- frameworks --------------------------------------------------------------------
    @rule(role=st.sampled_from(ROLES), active=st.booleans())
    def add_framework(self, role: str, active: bool) -> None:
        self.n += 1
        fid = f"f{self.n}"
        self.core.framework_added(fid, role, active)
        self.frameworks[fid] = {"role": role, "active": active, "suppressed": False}

    @precondition(lambda self: self.frameworks)
    @rule(i=st.integers(0, 99))
    def remove_framework(self, i: int) -> None:
        fid = self._pick(list(self.frameworks), i)
        self.core.framework_removed(fid)
        del self.frameworks[fid]
        self._forget(framework=fid)

    @precondition(lambda self: self.frameworks)
    @rule(i=st.integers(0, 99))
    def toggle_active(self, i: int) -> None:
        fid = self._pick(list(self.frameworks), i)
        fw = self.frameworks[fid]
        if fw["active"]:
            self.core.framework_deactivated(fid)
        else:
            self.core.framework_activated(fid)
        fw["active"] = not fw["active"]

    @precondition(lambda self: self.frameworks)
    @rule(i=st.integers(0, 99), revive=st.booleans())
    def suppress_or_revive(self, i: int, revive: bool) -> None:
        fid = self._pick(list(self.frameworks), i)
        if revive:
            self.core.revive(fid)
            self.filters = [f for f in self.filters if f[0] != fid]
        else:
            self.core.suppress(fid)
        self.frameworks[fid]["suppressed"] = not revive

    @rule(role=st.sampled_from(ROLES), weight=st.sampled_from([0.5, 1.0, 3.0]))
    def set_weight(self, role: str, weight: float) -> None:
        self.core.set_weight(role, weight)

    # -- offers and tasks --------------------------------------------------------------
    @rule()
    def allocate(self) -> None:
        cycle = self.core.allocate(self.now)
        for a in cycle.allocations:
            fw = self.frameworks[a.framework_id]
            assert fw["active"] and not fw["suppressed"], (a, fw)
            assert a.agent_id not in self.away, ("offered on an away agent", a)
            assert a.role == fw["role"]
            assert a.resources.for_role(a.role) == a.resources  # nothing of other roles
            for fid, agent_id, res, until in self.filters:
                if (fid, agent_id) == (a.framework_id, a.agent_id) and self.now < until:
                    assert not res.contains(a.resources), ("offered under a filter", a)
            held = _sum([r for ag, _, r in (*self.offers, *self.tasks) if ag == a.agent_id])
            # Safety: what is offered is free: never offered twice at the same time.
            assert (self.totals[a.agent_id] - held).contains(a.resources), a
            self.offers.append((a.agent_id, a.framework_id, a.resources))
        by_fw = {d.framework_id: d for d in cycle.decisions}
        assert set(by_fw) == set(self.frameworks)
        for fid, d in by_fw.items():
            fw = self.frameworks[fid]
            if not fw["active"]:
                assert d.outcome is Outcome.INACTIVE
            elif fw["suppressed"]:
                assert d.outcome is Outcome.SUPPRESSED
            else:
                assert (d.outcome is Outcome.OFFERED) == bool(d.allocation_ids)
        # Work-conserving: what is left free is refused by every framework that may use it.
        for agent_id, agent in self.core.agents.items():
            if agent_id in self.away:
                continue
            for fid, fw in self.frameworks.items():
                if not fw["active"] or fw["suppressed"]:
                    continue
                offer = agent.free.for_role(str(fw["role"]))
                if offer.scalar("cpus") >= 0.01 or offer.scalar("mem") >= 32:
                    assert any(f[:2] == (fid, agent_id) and self.now < f[3]
                               and f[2].contains(offer) for f in self.filters), (fid, agent_id)

    @precondition(lambda self: self.offers)
    @rule(i=st.integers(0, 99), refuse=st.sampled_from([None, 0.0, 0.5, 5.0]))
    def recover(self, i: int, refuse: float | None) -> None:
        agent, fid, res = self.offers.pop(i % len(self.offers))
        assert self.core.recover(agent, fid, res, refuse, self.now)
        seconds = DEFAULT_REFUSE_SECONDS if refuse is None else refuse
        if seconds > 0:
            self.filters.append((fid, agent, res, self.now + seconds))

    @precondition(lambda self: self.offers)
    @rule(i=st.integers(0, 99))
    def recover_too_much(self, i: int) -> None:
        agent, fid, res = self.offers[i % len(self.offers)]
        with pytest.raises(AllocatorError):
            self.core.recover(agent, fid, res + Resources.of(cpus=100), 0, self.now)

    @precondition(lambda self: self.offers)
    @rule(i=st.integers(0, 99))
    def launch_task_on_part_of_offer(self, i: int) -> None:
        k = i % len(self.offers)
        agent, fid, res = self.offers[k]
        task = Resources({key: v // 2 for key, v in res.scalars.items() if v // 2})
        if res.ranges:
            key, ranges = next(iter(res.ranges.items()))
            task += Resources(ranges={key: ((ranges[0][0], ranges[0][0]),)})
        if not task:
            return
        self.core.resources_used(agent, fid, task)
        left = res - task
        if left:
            self.offers[k] = (agent, fid, left)
        else:
            del self.offers[k]
        self.tasks.append((agent, fid, task))

    @precondition(lambda self: self.tasks)
    @rule(i=st.integers(0, 99))
    def finish_task(self, i: int) -> None:
        agent, fid, res = self.tasks.pop(i % len(self.tasks))
        assert self.core.resources_released(agent, fid, res)

    @rule()
    def broker_failover(self) -> None:
        self.core.recover_all_offers()
        self.offers = []

    @rule(dt=st.sampled_from([0.1, 1.0, 3.0, 6.0]))
    def advance_time(self, dt: float) -> None:
        self.now += dt

    # -- invariants --------------------------------------------------------------------
    @invariant()
    def core_is_valid(self) -> None:
        self.core.validate()

    @invariant()
    def never_offered_twice(self) -> None:
        assert set(self.core.agents) == set(self.totals)
        for agent_id, agent in self.core.agents.items():
            held = [(f, r) for a, f, r in self.offers if a == agent_id]
            used = [(f, r) for a, f, r in self.tasks if a == agent_id]
            assert self.totals[agent_id].contains(_sum([r for _, r in (*held, *used)]))
            for fid in {*agent.offered, *agent.used, *(f for f, _ in (*held, *used))}:
                assert _same(agent.offered.get(fid, Resources()),
                             _sum([r for f, r in held if f == fid])), (agent_id, fid)
                assert _same(agent.used.get(fid, Resources()),
                             _sum([r for f, r in used if f == fid])), (agent_id, fid)


TestAllocatorMachine = AllocatorMachine.TestCase
TestAllocatorMachine.settings = settings(
    max_examples=150, stateful_step_count=40, deadline=None,
    suppress_health_check=[HealthCheck.too_slow])


def test_roles_view_shows_weights_frameworks_and_shares() -> None:
    from services.allocator.roles import roles_view

    core = cluster(2, {"f1": "web", "f2": "batch"})
    core.set_weight("batch", 2.0)
    core.set_weight("idle", 3.0)  # a role with a weight and no framework is listed too
    core.resources_used("a000", "f1", Resources.of(cpus=2, mem=1024))
    view = {r["role"]: r for r in roles_view(core)}
    assert sorted(view) == ["batch", "idle", "web"]
    assert view["web"]["frameworks"] == ["f1"] and view["web"]["weight"] == 1.0
    assert view["web"]["dominant_resource"] == "cpus"
    assert view["web"]["dominant_share"] == pytest.approx(2 / 8)  # 2 of 2 agents' 8 cpus
    assert view["web"]["shares"] == pytest.approx({"cpus": 0.25, "mem": 1024 / 16384})
    assert view["batch"]["weight"] == 2.0 and view["batch"]["dominant_share"] == 0.0
    assert view["idle"]["frameworks"] == []
