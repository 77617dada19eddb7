"""The master core under a failover's re-registration storm (issue 8 d): what each agent's
return costs in commands, notices and registry writes stays bounded per call."""

from __future__ import annotations

from schemas import agent_pb2, common_pb2
from services.master.core import MasterCore
from services.notice import Notice
from services.resources import Resources
from tests.master.helpers import (
    T0,
    TS,
    cluster,
    only,
    reported,
    reregister,
    running,
    statuses,
    subscribed,
)


def test_stale_updates_of_one_call_make_one_notice() -> None:
    """An agent back after a failover resends every unacknowledged head (STARTING of tasks
    the master knows RUNNING): one notice for the call, with the count, not one log line
    per update; every update is still forwarded for its acknowledgement."""
    core, aid, fid = cluster()
    tids = [f"t{i}" for i in range(3)]  # the agent has 4 cpus, each task 1
    running(core, aid, fid, *tids)
    call = agent_pb2.AgentCall(agent_id=aid, status_updates=agent_pb2.AgentCall.StatusUpdates(
        updates=[agent_pb2.StatusUpdate(framework_id=fid, status=common_pb2.TaskStatus(
            task_id=t, state=TS.TASK_STARTING, uuid=f"{t}-start".encode(), agent_id=aid))
            for t in tids]))
    cmds = core.agent_call(b"a1", call, T0 + 1)
    stale = [n for n in only(cmds, Notice) if n.kind == "update_stale"]
    assert len(stale) == 1, stale
    assert dict(stale[0].facts)["count"] == 3
    assert "t0" in stale[0].message
    assert [s.task_id for s in statuses(cmds, fid)] == tids
    assert all(core.tasks[(fid, t)].state == TS.TASK_RUNNING for t in tids)
    core.validate()


def test_each_reported_task_keeps_its_own_resources() -> None:
    """A re-registering agent's tasks mostly share one shape (parsed once per run of equal
    ones, issue 8): each record still holds what its own report says, a different shape
    or a malformed one between equal ones included, and the agent and each framework hold
    their sum."""
    old, aid, f1 = cluster()
    f2 = subscribed(old, b"f2")
    core = MasterCore("m2", 8, recovered_registry=old.registry_document(), now=T0 + 10)
    shapes = {"a": "cpus:0.5;mem:100", "b": "cpus:0.25;mem:100", "c": "cpus:0.5;mem:100",
              "d": "cpus:0.5;mem:200", "e": "cpus:0.5;mem:100", "g": "cpus:0.5;mem:100"}
    report = [reported(f1 if t in "abcd" else f2, t, TS.TASK_RUNNING, res)
              for t, res in shapes.items()]
    report.insert(4, reported(f1, "bad", TS.TASK_RUNNING))
    report[4].task_info.resources[0].scalar = -1.0  # malformed: held as nothing
    cmds = reregister(core, b"a1", aid, report, now=T0 + 11)
    # The one warning is the bad task's (the info beside it: every agent is back).
    assert [n.kind for n in only(cmds, Notice) if n.level == "warning"] == [
        "invalid_task_resources"]
    for t, res in shapes.items():
        fid = f1 if t in "abcd" else f2
        assert core.tasks[(fid, t)].resources.same(Resources.parse(res)), t
    assert core.tasks[(f1, "bad")].resources.same(Resources())
    assert core.agents[aid].used.same(Resources.parse("cpus:2.75;mem:700"))
    assert core.frameworks[f1].used.same(Resources.parse("cpus:1.75;mem:500"))
    assert core.frameworks[f2].used.same(Resources.parse("cpus:1;mem:200"))
    core.validate()
