"""The master core under a failover's re-registration storm (issue 8 d): what each agent's
return costs in commands, notices and registry writes stays bounded per call."""

from __future__ import annotations

from schemas import agent_pb2, common_pb2
from services.notice import Notice
from tests.master.helpers import T0, TS, cluster, only, running, statuses


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
