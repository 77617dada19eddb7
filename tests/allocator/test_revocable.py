"""Revocable allocations (issue 9 item 2): a framework of declared demand is offered what
takes it beyond its guaranteed share -- its weighted share were one more framework of weight
1 to arrive, 1 / (1 + the weights of the frameworks offered to) -- as a separate, revocable
allocation; a framework of unknown demand (never revoked) is never offered revocable."""

from __future__ import annotations

from services.allocator.core import AllocatorCore
from services.allocator.fill import Shape
from services.resources import Resources

R = Resources.parse
AGENT = R("cpus:4;mem:4096")
TASK = Shape.of(R("cpus:1;mem:256"), 4)


def offers(core: AllocatorCore, now: float) -> list[tuple[str, Resources, bool]]:
    out = [(a.framework_id, a.resources, a.revocable) for a in core.allocate(now).allocations]
    core.validate()
    return out


def test_alone_half_the_cluster_is_guaranteed_the_rest_revocable() -> None:
    core = AllocatorCore()
    core.agent_added("a1", "h1", AGENT)
    core.framework_added("d", "*")
    core.demand("d", [TASK])
    assert offers(core, 0.0) == [("d", R("cpus:2;mem:512"), False),
                                 ("d", R("cpus:2;mem:512"), True)]
    assert "2 offer(s)" not in core.decisions["d"].reason
    assert "1 offer(s) revocable" in core.decisions["d"].reason
    assert core.decisions["d"].reason.startswith("offered 1 agent(s)")


def test_a_framework_of_unknown_demand_is_never_offered_revocable() -> None:
    core = AllocatorCore()
    core.agent_added("a1", "h1", AGENT)
    core.framework_added("u", "*")
    assert offers(core, 0.0) == [("u", AGENT, False)]


def test_the_guarantee_follows_the_weights_of_those_offered_to() -> None:
    """Weights 3 (web) and 1 (batch): web's guarantee is 3/5 of the cluster, batch's 1/5."""
    core = AllocatorCore()
    core.set_weight("web", 3.0)
    for i in range(5):
        core.agent_added(f"a{i}", "h", R("cpus:1;mem:1024"))
    core.framework_added("web-fw", "web")
    core.demand("web-fw", [Shape.of(R("cpus:1;mem:256"), 5)])
    core.framework_added("batch-fw", "batch")
    core.demand("batch-fw", [Shape.of(R("cpus:1;mem:256"), 5)])
    got = offers(core, 0.0)
    for fid, cpus in (("web-fw", 3), ("batch-fw", 1)):  # of 5 agents of 1 cpu
        tasks = sum(a.scalar("cpus") for f, a, _ in got if f == fid)
        guaranteed = sum(a.scalar("cpus") for f, a, rev in got if f == fid and not rev)
        assert guaranteed == min(tasks, cpus), got
    assert sum(a.scalar("cpus") for _, a, rev in got if rev) == 1  # 5 tasks, 4 guaranteed

def test_what_a_framework_runs_counts_towards_its_guarantee() -> None:
    core = AllocatorCore()
    core.agent_added("a1", "h1", AGENT)
    core.agent_added("a2", "h2", AGENT)
    core.framework_added("d", "*")
    core.demand("d", [Shape.of(R("cpus:1;mem:256"), 6)])
    core.resources_used("a1", "d", R("cpus:4;mem:1024"))  # half the cluster already
    assert offers(core, 0.0) == [("d", R("cpus:2;mem:512"), True)]
