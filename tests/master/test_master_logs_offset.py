"""The master's pure core relays `logs -f`'s offset: GetLogs.since_bytes to the agent (only
when set), LogsReply.next_offset back to the operator."""

from __future__ import annotations

from schemas import agent_pb2, operator_pb2
from services.master.commands import ToAgent, ToOperator
from tests.master.helpers import T0, cluster, one, operator, running


def test_since_bytes_goes_to_the_agent_and_next_offset_comes_back() -> None:
    core, aid, fid = cluster()
    running(core, aid, fid, "t1")
    cmds = operator(core, b"cli", get_logs=operator_pb2.OperatorCall.GetLogs(
        task_id="t1", since_bytes=0))
    req = one(cmds, ToAgent).event.logs_request
    assert req.HasField("since_bytes") and req.since_bytes == 0  # 0 is an offset, not unset
    reply = agent_pb2.AgentCall(agent_id=aid, logs_reply=agent_pb2.AgentCall.LogsReply(
        request_id=req.request_id, task_id="t1", data=b"hello", eof=True, next_offset=5))
    out = one(core.agent_call(b"a1", reply, T0), ToOperator)
    assert (out.event.logs.data, out.event.logs.next_offset) == (b"hello", 5)


def test_a_plain_get_logs_asks_for_a_tail_not_an_offset() -> None:
    core, aid, fid = cluster()
    running(core, aid, fid, "t1")
    cmds = operator(core, b"cli", get_logs=operator_pb2.OperatorCall.GetLogs(
        task_id="t1", tail_lines=3))
    assert not one(cmds, ToAgent).event.logs_request.HasField("since_bytes")
