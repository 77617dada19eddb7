"""Quota per role (limit and guarantee) and hierarchical roles in the allocator core, with
the greedy simulated frameworks of bench/drf.py (launch what offers hold, up to what they
want; decline the rest)."""

from __future__ import annotations

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from bench.drf import Greedy, GreedyCluster
from services.allocator.core import AllocatorCore, Outcome
from services.allocator.fill import Shape
from services.allocator.quota import limit_room
from services.allocator.sorter import DRFSorter, compare, role_path
from services.resources import Resources

GB = 1024.0
TASK = Resources.of(cpus=1, mem=256)


def greedy(c: GreedyCluster, fid: str, role: str, want: int, declare: bool = True,
           task: Resources = TASK) -> None:
    """A greedy framework of `role` (GreedyCluster.add names the role after it)."""
    c.core.framework_added(fid, role)
    if declare:
        c.core.demand(fid, [Shape.of(task, want)])
    c.fws[fid] = Greedy(fid, task, want)


def cpus(c: GreedyCluster, *fids: str) -> float:
    return sum(c.count(f) * c.fws[f].task.scalar("cpus") for f in fids)


def test_a_roles_quota_limit_caps_its_offers() -> None:
    """The role's frameworks together are never offered beyond the limit: one of unknown
    demand gets the agent cut to it, one of declared demand whole tasks under it; the
    decision says QUOTA_LIMIT and names the limit; another role is not limited by it;
    lifting the limit offers the rest."""
    core = AllocatorCore()
    for i in range(2):
        core.agent_added(f"agent-{i}", "h", Resources.of(cpus=4, mem=4 * GB))
    core.set_quota("batch", limit=Resources.of(cpus=3))
    core.framework_added("u", "batch")
    core.framework_added("d", "batch")
    core.demand("d", [Shape.of(Resources.of(cpus=1, mem=256), 10)])
    cycle = core.allocate(0.0)
    core.validate()
    assert sum(a.resources.scalar("cpus") for a in cycle.allocations) == 3
    assert limit_room(core, "batch") == {"cpus": 0}
    assert {core.decisions[f].outcome for f in ("u", "d")} <= {Outcome.OFFERED,
                                                                Outcome.QUOTA_LIMIT}
    core.framework_added("other", "*")  # another role is not limited by it
    cycle = core.allocate(0.1)
    core.validate()
    assert sum(a.resources.scalar("cpus") for a in cycle.allocations
               if a.framework_id == "other") == 5
    core.set_quota("batch", limit=None)
    for a in list(core.agents.values()):  # the other role gives its offers back
        if "other" in a.offered:
            core.recover(a.agent_id, "other", a.offered["other"], 60, 0.2)
    cycle = core.allocate(0.3)
    core.validate()
    assert {a.framework_id for a in cycle.allocations} & {"u", "d"}


@pytest.mark.parametrize("declare", [True, False])
def test_a_limited_role_runs_up_to_its_limit_while_the_rest_is_idle(declare: bool) -> None:
    c = GreedyCluster({"a1": Resources.of(cpus=4, mem=4 * GB),
                       "a2": Resources.of(cpus=4, mem=4 * GB)})
    c.core.set_quota("web", limit=Resources.of(cpus=3))
    greedy(c, "w", "web", 100, declare)
    c.settle(quiet=5, validate=True)
    assert cpus(c, "w") == 3
    assert c.core.decisions["w"].outcome is Outcome.QUOTA_LIMIT
    assert "web limit cpus:3" in c.core.decisions["w"].reason
    c.core.set_quota("web")  # cleared: it grows
    c.settle(quiet=5, validate=True)
    assert cpus(c, "w") == 8


def test_a_parents_limit_bounds_its_subtree() -> None:
    c = GreedyCluster({"a1": Resources.of(cpus=8, mem=8 * GB)})
    c.core.set_quota("eng", limit=Resources.of(cpus=3))
    greedy(c, "x", "eng/x", 100)
    greedy(c, "y", "eng/y", 100)
    greedy(c, "o", "ops", 100)
    c.settle(validate=True)
    assert cpus(c, "x", "y") == 3 and cpus(c, "o") == 5
    assert abs(c.count("x") - c.count("y")) <= 1


def test_a_guarantee_is_set_aside_while_its_role_has_demand() -> None:
    """DRF alone gives each of two greedy frameworks 4 of 8 cpus; a guarantee of 6 for
    one's role sets 6 aside for it: the other is offered only the 2 beyond it, whichever
    comes first, and is told why."""
    for first in ("g", "u"):
        c = GreedyCluster({"a1": Resources.of(cpus=8, mem=8 * GB)})
        c.core.set_quota("gold", guarantee=Resources.of(cpus=6))
        for fid in (first, {"g": "u", "u": "g"}[first]):
            greedy(c, fid, "gold" if fid == "g" else "*", 100)
        c.settle(validate=True)
        assert (cpus(c, "g"), cpus(c, "u")) == (6, 2), first


def test_what_a_guarantee_sets_aside_is_not_offered_to_others_and_they_hear_why() -> None:
    """The guaranteed role's framework declines the agent for now (a filter): what its
    guarantee still needs stays free; the other framework is told why it got no more."""
    core = AllocatorCore()
    core.agent_added("a1", "h", Resources.of(cpus=8, mem=8 * GB))
    core.set_quota("gold", guarantee=Resources.of(cpus=6, mem=GB))
    core.framework_added("g", "gold")
    core.demand("g", [Shape.of(TASK, 6)])
    core.refuse("g", "a1", 100.0)
    core.framework_added("u", "*")
    core.demand("u", [Shape.of(TASK, 8)])
    cycle = core.allocate(0.0)
    core.validate()
    assert [(a.framework_id, a.resources.scalar("cpus")) for a in cycle.allocations] == [
        ("u", 2.0)]
    d = core.decisions["u"]
    assert d.outcome is Outcome.OFFERED
    for a in cycle.allocations:  # u launches; next cycle it is refused, and hears why
        core.resources_used(a.agent_id, "u", a.resources)
    core.allocate(1.0)
    core.validate()
    d = core.decisions["u"]
    assert d.outcome is Outcome.FAIR_SHARE, d
    assert "quota guarantee of role(s) gold (short cpus:6;mem:1024)" in d.reason, d.reason
    core.framework_removed("g")  # no demand left for gold: nothing set aside
    cycle = core.allocate(2.0)
    assert sum(a.resources.scalar("cpus") for a in cycle.allocations) == 6


def test_a_guarantee_without_demand_sets_nothing_aside() -> None:
    c = GreedyCluster({"a1": Resources.of(cpus=8, mem=8 * GB)})
    c.core.set_quota("gold", guarantee=Resources.of(cpus=6))
    greedy(c, "g", "gold", 1)  # wants one task only
    greedy(c, "u", "*", 100)
    c.settle(validate=True)
    assert (cpus(c, "g"), cpus(c, "u")) == (1, 7)


def test_an_unknown_demand_framework_is_cut_to_what_a_guarantee_leaves() -> None:
    c = GreedyCluster({"a1": Resources.of(cpus=8, mem=8 * GB)})
    c.core.set_quota("gold", guarantee=Resources.of(cpus=5))
    greedy(c, "g", "gold", 100)
    greedy(c, "u", "*", 100, declare=False)
    c.settle(quiet=5, validate=True)
    assert cpus(c, "g") >= 5 and cpus(c, "u") <= 3


# -- hierarchical roles -------------------------------------------------------------------


@pytest.mark.parametrize("weight,split", [(1.0, (3, 3, 6)), (2.0, (4, 4, 4))])
def test_hierarchical_drf_shares_each_level(weight: float, split: tuple[int, int, int]
                                            ) -> None:
    """Roles a and b; a has sub-roles a/x and a/y with a framework each, b one framework,
    all greedy: a's subtree gets half (two thirds with weight 2 for a), split equally
    between a/x and a/y."""
    c = GreedyCluster({"agent": Resources.of(cpus=12, mem=12 * GB)})
    c.core.set_weight("a", weight)
    for fid, role in (("fx", "a/x"), ("fy", "a/y"), ("fb", "b")):
        greedy(c, fid, role, 100)
    c.settle(validate=True)
    assert (c.count("fx"), c.count("fy"), c.count("fb")) == split


def test_a_sub_roles_weight_splits_its_parents_share() -> None:
    c = GreedyCluster({"agent": Resources.of(cpus=12, mem=12 * GB)})
    c.core.set_weight("a/x", 2.0)
    for fid, role in (("fx", "a/x"), ("fy", "a/y"), ("fb", "b")):
        greedy(c, fid, role, 100)
    c.settle(validate=True)
    assert (c.count("fx"), c.count("fy"), c.count("fb")) == (4, 2, 6)


def test_hierarchical_keys() -> None:
    s = DRFSorter()
    s.add_total(Resources.of(cpus=10, mem=10 * GB))
    s.add("x", "a/x")
    s.add("y", "a/y")
    s.add("b", "b")
    s.set_role_weight("a", 2.0)
    s.allocated("x", Resources.of(cpus=2))
    s.allocated("b", Resources.of(cpus=3))
    assert s.key("x") == pytest.approx((0.1, 0.2))
    assert s.key("y") == pytest.approx((0.1, 0.0))
    assert s.key("b") == pytest.approx((0.3,))
    assert [c for _, c in s.sort(["b", "x", "y"])] == ["y", "x", "b"]
    assert s.role_allocation("a") == {"cpus": 2000}
    assert s.key_after("y", [("y", {"cpus": 4000}, 1)]) == pytest.approx((0.3, 0.4))
    assert compare((0.3, 0.1), (0.3 + 1e-12, 0.2), 1e-9) == -1
    assert role_path("a/b/c") == ("a", "a/b", "a/b/c")
    s.validate()
    s.remove("x")
    s.validate()


def test_roles_view_shows_parents_and_quotas() -> None:
    from services.allocator.roles import roles_view

    core = AllocatorCore()
    core.agent_added("a1", "h", Resources.of(cpus=10, mem=10 * GB))
    core.framework_added("x", "eng/x")
    core.framework_added("y", "eng/y")
    core.set_quota("eng", Resources.of(cpus=2), Resources.of(cpus=6, mem=4 * GB))
    core.resources_used("a1", "x", Resources.of(cpus=2))
    core.resources_used("a1", "y", Resources.of(cpus=1))
    view = {r["role"]: r for r in roles_view(core)}
    assert sorted(view) == ["eng", "eng/x", "eng/y"]
    assert view["eng"]["frameworks"] == [] and view["eng/x"]["frameworks"] == ["x"]
    assert view["eng"]["dominant_share"] == pytest.approx(0.3)  # its subtree's
    assert view["eng"]["guarantee"] == {"cpus": 2.0}
    assert view["eng"]["limit"] == {"cpus": 6.0, "mem": 4096.0}
    assert "limit" not in view["eng/x"]


def test_the_feed_follows_a_roles_weight_and_quota() -> None:
    from schemas import bus_pb2, state_pb2
    from services.allocator.feed import StreamFeed

    core = AllocatorCore()
    feed = StreamFeed(core)
    rec = state_pb2.RoleRecord(role="eng/web", weight=2.0)
    rec.quota_limit.extend(Resources.parse("cpus:4;gpus:0").to_proto())
    rec.quota_guarantee.extend(Resources.of(cpus=1).to_proto())
    entry = bus_pb2.StateEntry(key="roles/eng/web", value=state_pb2.StateValue(role=rec))
    assert feed.apply([entry])
    assert core.weights["eng/web"] == 2.0
    assert core.quotas.limited["eng/web"] == {"cpus": 4000, "gpus": 0}  # a zero is a limit
    assert core.quotas.guaranteed["eng/web"] == {"cpus": 1000}
    assert not feed.apply([entry])  # unchanged
    feed.reset({})  # the role is gone from the stream: weight 1, no quota
    assert core.weights["eng/web"] == 1.0 and not core.quotas


def test_a_sub_role_of_unknown_demand_next_to_declared_ones() -> None:
    """A framework of unknown demand under a/x is offered the rest of the agent's memory
    (as Mesos would); that offer counts in a's share, but a's other framework is not
    revoked for it: the offers a revocation reclaims count as given back."""
    c = GreedyCluster({"agent": Resources.of(cpus=12, mem=12 * GB)})
    greedy(c, "fx", "a/x", 100, declare=False)
    greedy(c, "fy", "a/y", 100)
    greedy(c, "fb", "b", 100)
    c.settle(quiet=5, validate=True)
    assert (c.count("fx"), c.count("fy"), c.count("fb"), c.revoked) == (3, 3, 6, 0)


@example(agents=[1], fws=[("r2/x", 1)], guarantees={"r2": 1}, limits={"r0": 0, "r2/x": 0})
@settings(max_examples=60, deadline=None)
@given(agents=st.lists(st.integers(1, 6), min_size=1, max_size=4),
       fws=st.lists(st.tuples(st.sampled_from(["r0", "r1", "r2", "r2/x", "*"]),
                              st.integers(1, 12)), min_size=1, max_size=6),
       guarantees=st.dictionaries(st.sampled_from(["r0", "r1", "r2"]), st.integers(1, 6),
                                  max_size=3),
       limits=st.dictionaries(st.sampled_from(["r0", "r1", "r2", "r2/x", "*"]),
                              st.integers(0, 8), max_size=2))
def test_guarantees_are_met_when_satisfiable_and_limits_never_passed(
        agents: list[int], fws: list[tuple[str, int]], guarantees: dict[str, int],
        limits: dict[str, int]) -> None:
    """Greedy frameworks of 1-CPU tasks arrive together: every guaranteed role holds at
    least min(guarantee, what its frameworks want and their sub-roles' limits let them
    take) when the guarantees fit the cluster together, and no limited role holds more
    than its limit."""
    c = GreedyCluster({f"a{i}": Resources.of(cpus=n, mem=64 * GB)
                       for i, n in enumerate(agents)})
    for role, g in guarantees.items():
        limit = limits.get(role)
        c.core.set_quota(role, {"cpus": g}, None if limit is None else {"cpus": max(limit, g)})
    for role, n in limits.items():
        if role not in guarantees:
            c.core.set_quota(role, limit={"cpus": n})  # cpus:0 too
    for i, (role, want) in enumerate(fws):
        greedy(c, f"f{i}", role, want)
    c.settle(validate=True, rounds=400)
    held = {r: sum(c.count(f"f{i}") for i, (fr, _) in enumerate(fws)
                   if fr == r or fr.startswith(r + "/")) for r in ("r0", "r1", "r2", "*")}
    if sum(guarantees.values()) <= sum(agents):
        for role, g in guarantees.items():
            # What its frameworks can take: a sub-role's limit caps its frameworks (found
            # by hypothesis: r2 guaranteed 1, its only framework in r2/x limited to 0).
            want = sum(n for fr, n in fws if fr == role)
            for sub in {fr for fr, _ in fws if fr.startswith(role + "/")}:
                asked = sum(n for fr, n in fws if fr == sub)
                want += min(asked, limits[sub]) if sub in limits else asked
            assert held[role] >= min(g, want), (role, held, guarantees)
    for role, n in limits.items():
        cap = max(n, guarantees.get(role, 0))
        assert sum(c.count(f"f{i}") for i, (fr, _) in enumerate(fws)
                   if fr == role or fr.startswith(role + "/")) <= cap, (role, limits)


def test_a_late_role_below_its_guarantee_takes_it_back() -> None:
    """A greedy framework fills the agent; a framework of a role guaranteed 6 of its 8
    CPUs arrives: offers are reclaimed and tasks revoked until the guarantee is met (DRF
    alone would stop at 4 each), and no further (the guarantee protects it, nothing
    ping-pongs)."""
    c = GreedyCluster({"a1": Resources.of(cpus=8, mem=8 * GB)})
    c.core.set_quota("gold", guarantee=Resources.of(cpus=6))
    greedy(c, "u", "*", 100)
    c.settle(validate=True)
    assert cpus(c, "u") == 8
    greedy(c, "g", "gold", 100)
    c.settle(validate=True)
    assert (cpus(c, "g"), cpus(c, "u")) == (6, 2)
    assert c.revoked == 6


def test_a_role_at_its_cpu_limit_is_offered_no_memory_alone() -> None:
    """Found by the incremental machine: a framework of unknown demand whose role may use
    no more CPUs was cut to nothing while its headroom was all CPUs, passed over, and then
    the idle agent's memory would have been offered to it by a full scan. A role without
    an offer's worth of cpus (or mem) left under its limit is offered nothing: a rule on
    its holdings, not on the offer, so the refusal stands while the agent is filled."""
    core = AllocatorCore()
    core.agent_added("a1", "h", Resources.of(cpus=1, mem=2048))
    core.framework_added("v", "a/x")
    core.demand("v", [Shape.of(Resources.of(cpus=0.5, mem=64), 2)])
    core.set_quota("a/y", limit={"cpus": 0})
    core.framework_added("u", "a/y")  # first on ties (by id)
    cycle = core.allocate(0.0)
    core.validate()
    assert [(a.framework_id, a.resources) for a in cycle.allocations] == [
        ("v", Resources.of(cpus=1, mem=128))]
    assert core.decisions["u"].outcome is Outcome.QUOTA_LIMIT
