"""The bound on a framework's outstanding offers (max_offers_per_framework, fanout.py): a
framework holds offers on at most that many agents at once; the others go to other
frameworks or wait until it answers some, and then it is offered the rest, page by page.
The incremental state machine of test_incremental.py is run again with small bounds: the
incremental and full-scan cores must still allocate alike, and validate() (which checks
that no framework ever holds offers on more agents than the bound) holds after every step."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, settings

from services.allocator.core import AllocatorCore, Outcome
from services.allocator.fill import Shape
from services.resources import Resources
from tests.allocator.test_incremental import AGENT, IncrementalMachine, decline_all


def cluster(agents: int, frameworks: int, bound: int, incremental: bool = True
            ) -> AllocatorCore:
    core = AllocatorCore(incremental=incremental, max_offers_per_framework=bound)
    for i in range(agents):
        core.agent_added(f"a{i}", f"h{i}", AGENT)
    for j in range(frameworks):
        core.framework_added(f"f{j}", "*")
    return core


def offered(core: AllocatorCore, fid: str) -> list[str]:
    return sorted((a for a, agent in core.agents.items() if fid in agent.offered),
                  key=lambda a: core.agents[a].seq)


def test_a_framework_at_its_bound_gets_the_rest_after_it_declines() -> None:
    core = cluster(7, 1, bound=3)
    first = core.allocate(0.0)
    assert [a.agent_id for a in first.allocations] == ["a0", "a1", "a2"]
    (d,) = first.remade
    assert d.outcome is Outcome.OFFERED and "4 more agent(s)" in d.reason
    assert not core.allocate(0.5).allocations  # nothing answered: nothing more
    held = core.decisions["f0"]
    assert held.outcome is Outcome.OFFERED  # it stands until the framework answers
    decline_all(core, first, 60.0, 1.0)  # filtered a minute: the next page, not these
    second = core.allocate(1.0)
    assert [a.agent_id for a in second.allocations] == ["a3", "a4", "a5"]
    decline_all(core, second, 60.0, 2.0)
    third = core.allocate(2.0)
    assert [a.agent_id for a in third.allocations] == ["a6"]  # the whole cluster, in pages
    core.validate()


def test_one_answer_makes_room_for_one_more_agent() -> None:
    core = cluster(5, 1, bound=2)
    first = core.allocate(0.0)
    a0 = first.allocations[0]
    core.resources_used("a0", "f0", a0.resources)  # a task took the whole offer
    core.validate()
    assert [a.agent_id for a in core.allocate(1.0).allocations] == ["a2"]
    assert offered(core, "f0") == ["a1", "a2"]
    core.validate()


def test_agents_held_back_from_one_framework_go_to_the_next() -> None:
    core = cluster(5, 2, bound=2)
    cycle = core.allocate(0.0)
    got = {fid: [a.agent_id for a in cycle.allocations if a.framework_id == fid]
           for fid in ("f0", "f1")}
    assert got == {"f0": ["a0", "a2"], "f1": ["a1", "a3"]}  # DRF turns, then the bound
    assert "a4" in core._idle
    assert {d.framework_id: d.outcome for d in cycle.remade} == {
        "f0": Outcome.OFFERED, "f1": Outcome.OFFERED}
    # f1 declines one: it, not f0, is offered the agent both were held back from.
    core.recover("a1", "f1", core.agents["a1"].offered["f1"], 60.0, 1.0)
    again = core.allocate(1.0)
    assert [(a.agent_id, a.framework_id) for a in again.allocations] == [("a4", "f1")]
    core.validate()


def test_a_held_back_framework_is_not_a_newcomer_that_reclaims() -> None:
    core = cluster(3, 1, bound=1)
    core.allocate(0.0)
    core.framework_added("late", "*")
    core.revive("f0")  # fresh again, still at its bound
    cycle = core.allocate(1.0)
    assert [(a.agent_id, a.framework_id) for a in cycle.allocations] == [("a1", "late")]
    assert not cycle.reclaims  # f0 holds its bound: it takes nothing back from `late`
    d = core.decisions["f0"]
    assert d.outcome is Outcome.FAIR_SHARE and "max_offers_per_framework 1" in d.reason


def test_declared_demand_needs_only_the_first_page() -> None:
    core = cluster(50, 0, bound=4)
    core.framework_added("one", "*")
    core.demand("one", [Shape.of(Resources.of(cpus=1, mem=128), 1)])
    cycle = core.allocate(0.0)
    assert len(cycle.allocations) == 4  # one task's unit, on the first 4 agents only
    first = cycle.allocations[0]
    task = first.resources
    core.resources_used(first.agent_id, "one", task)  # it launched its task there
    for a in cycle.allocations[1:]:
        core.recover(a.agent_id, "one", a.resources, None, 0.1)
    after = core.allocate(0.2)
    assert not after.allocations
    assert core.decisions["one"].outcome is Outcome.DEMAND_MET
    core.validate()


def test_at_its_bound_a_framework_may_take_more_tasks_where_it_holds_an_offer() -> None:
    core = cluster(2, 0, bound=1)
    core.framework_added("f", "*")
    unit = Resources.of(cpus=1, mem=128)
    core.demand("f", [Shape.of(unit, 2)])
    first = core.allocate(0.0)
    assert [a.agent_id for a in first.allocations] == ["a0"]  # two tasks' worth; a1 waits
    assert "f" in core.fanout.held_back and {"a0", "a1"} <= core._idle
    core.demand("f", [Shape.of(unit, 3)])  # fresh: tried on the idle agents
    more = core.allocate(1.0)
    assert [a.agent_id for a in more.allocations] == ["a0"]  # a third task where it holds one
    assert core.agents["a0"].offered["f"].scalars[("cpus", "*")] == 3000
    core.validate()


def test_bound_zero_offers_every_agent_at_once() -> None:
    core = cluster(20, 1, bound=0)
    assert len(core.allocate(0.0).allocations) == 20
    assert not core.fanout.on  # nothing tracked without a bound
    core.validate()


def test_a_removed_agent_frees_room_under_the_bound() -> None:
    core = cluster(3, 1, bound=1)
    core.allocate(0.0)
    core.agent_removed("a0")
    assert [a.agent_id for a in core.allocate(1.0).allocations] == ["a1"]
    core.validate()


class BoundedMachine(IncrementalMachine):
    """test_incremental's machine, both cores bounded at one or two agents per framework."""

    bound = 2

    def __init__(self) -> None:
        super().__init__()
        self.inc = AllocatorCore(incremental=True, max_offers_per_framework=self.bound)
        self.full = AllocatorCore(incremental=False, max_offers_per_framework=self.bound)

    def allocate(self) -> None:
        super().allocate()
        for core in (self.inc, self.full):
            counts: dict[str, int] = {}
            for agent in core.agents.values():
                for fid in agent.offered:
                    counts[fid] = counts.get(fid, 0) + 1
            assert max(counts.values(), default=0) <= self.bound, counts


class BoundOneMachine(BoundedMachine):
    bound = 1


SETTINGS = settings(max_examples=120, stateful_step_count=40, deadline=None,
                    suppress_health_check=[HealthCheck.too_slow])
TestBoundedMachine = BoundedMachine.TestCase
TestBoundedMachine.settings = SETTINGS
TestBoundOneMachine = BoundOneMachine.TestCase
TestBoundOneMachine.settings = SETTINGS


def test_the_allocator_option_sets_the_bound_and_refuses_a_negative_one() -> None:
    from services.allocator.__main__ import OPTIONS
    from services.allocator.fanout import DEFAULT_MAX_OFFERS_PER_FRAMEWORK
    from services.shell.config import COMMON, ConfigError, load

    base = ["--cluster", "file:///nowhere"]
    options = (*COMMON, *OPTIONS)
    assert load("allocator", options, base, environ={})[
        "max_offers_per_framework"] == DEFAULT_MAX_OFFERS_PER_FRAMEWORK
    assert load("allocator", options, [*base, "--max-offers-per-framework", "0"], environ={})[
        "max_offers_per_framework"] == 0
    assert load("allocator", options, base, environ={
        "OFFERBUS_ALLOCATOR_MAX_OFFERS_PER_FRAMEWORK": "250"})["max_offers_per_framework"] == 250
    with pytest.raises(ConfigError):
        load("allocator", options, [*base, "--max-offers-per-framework", "-1"], environ={})


def test_a_new_framework_gets_a_first_page_then_the_full_bound_once_it_answers() -> None:
    # Slow start: a framework that answered nothing yet is offered FIRST_PAGE agents, so
    # its first offers cost a cycle of that many agents, not of the whole bound.
    from services.allocator.fanout import FIRST_PAGE

    core = cluster(FIRST_PAGE * 3, 1, bound=FIRST_PAGE * 2)
    first = core.allocate(0.0)
    assert len(first.allocations) == FIRST_PAGE
    assert not core.allocate(0.5).allocations  # nothing answered yet
    one = first.allocations[0]
    core.resources_used(one.agent_id, "f0", one.resources)  # its first answer: a launch
    core.validate()
    second = core.allocate(1.0)
    assert len(second.allocations) == FIRST_PAGE + 1  # up to the full bound
    assert len(offered(core, "f0")) == FIRST_PAGE * 2
    core.validate()
