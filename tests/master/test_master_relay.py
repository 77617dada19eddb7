"""The master's pure core as a relay and for operators: the cluster's identity, offers and
calls between frameworks and the offer-broker (frames too large, no broker), operator calls."""

from __future__ import annotations

from typing import Any

from schemas import agent_pb2, bus_pb2, common_pb2, operator_pb2, scheduler_pb2
from services.master.commands import (
    Reject,
    ToAgent,
    ToBroker,
    ToFramework,
    ToOperator,
)
from services.master.core import MasterCore
from services.resources import Resources
from tests.master.helpers import (
    T0,
    TS,
    Call,
    Internal,
    agent_events,
    broker_msgs,
    cluster,
    one,
    only,
    operator,
    published,
    register,
    registry,
    running,
    sched,
    statuses,
    subscribed,
)

R = common_pb2.TaskStatus.Reason
RJ = common_pb2.RejectReason


def test_a_new_cluster_writes_its_id_once_and_a_recovered_one_keeps_it() -> None:
    core = MasterCore("m1", 1, cluster_id="c-new", id_prefix="u1-1", now=T0)
    cmds = core.tick(T0)  # the first step persists the new cluster's id, before any agent
    assert registry(cmds) == {"cluster_id": "c-new", "agents": {}, "frameworks": {},
                              "roles": {}, "jobs": {}}
    aid = register(core, b"a1")
    fid = subscribed(core, b"f1")
    assert (aid, fid) == ("u1-1-S1", "u1-1-F1")  # the leadership's prefix, not "m1"
    # A failover (or a restart) proposes another id: the registry's wins, and ids from the
    # new leadership's prefix never repeat the old ones.
    new = MasterCore("m2", 2, recovered_registry=core.registry_document(),
                     cluster_id="c-other", id_prefix="u2-2", now=T0 + 1)
    assert new.cluster_id == "c-new"
    assert not registry(new.tick(T0 + 1) or [])  # nothing to write: the id was kept
    cmds = new.agent_call(b"a2", agent_pb2.AgentCall(register=agent_pb2.AgentCall.Register(
        agent_info=common_pb2.AgentInfo(hostname="h2", resources=Resources.parse(
            "cpus:1").to_proto()))), T0 + 2)
    reg = one(cmds, ToAgent).event.registered
    assert (reg.agent_id, reg.cluster_id) == ("u2-2-S1", "c-new")
    cmds = new.scheduler_call(b"f2", Call(subscribe=Call.Subscribe(
        framework_info=common_pb2.FrameworkInfo(name="x"))), "m", T0 + 2)
    ev = one(cmds, ToFramework).event.subscribed
    assert (ev.framework_id, ev.cluster_id) == ("u2-2-F1", "c-new")
    new.validate()


def test_operator_teardown_removes_a_framework_and_tells_its_scheduler() -> None:
    core, aid, fid = cluster()
    running(core, aid, fid, "t1", "t2")
    cmds = operator(core, b"op", teardown_framework=operator_pb2.OperatorCall
                    .TeardownFramework(framework_id=fid))
    errors = [c for c in only(cmds, ToFramework) if c.event.WhichOneof("event") == "error"]
    assert len(errors) == 1 and errors[0].peer == b"f1"
    assert "removed by the operator" in errors[0].event.error.message
    assert agent_events(cmds, "shutdown_framework")
    assert one(cmds, ToOperator).event.done.message.endswith("2 tasks killed")
    assert fid not in core.frameworks and published(cmds)[f"frameworks/{fid}"] is None
    # The removed id cannot come back, and a second stop says it is already gone.
    back = sched(core, b"f1", fid, subscribe=Call.Subscribe(
        framework_info=common_pb2.FrameworkInfo(framework_id=fid, name="x")))
    assert "was removed" in one(back, ToFramework).event.error.message
    assert fid not in core.frameworks
    again = operator(core, b"op", teardown_framework=operator_pb2.OperatorCall
                     .TeardownFramework(framework_id=fid))
    assert "already removed" in one(again, ToOperator).event.done.message
    unknown = operator(core, b"op", teardown_framework=operator_pb2.OperatorCall
                       .TeardownFramework(framework_id="nope"))
    assert one(unknown, Reject).code == bus_pb2.NOT_FOUND
    core.validate()


# -- broker relay --------------------------------------------------------------------------


def test_offers_to_a_disconnected_framework_are_declined_at_once() -> None:
    core, _aid, fid = cluster()
    core.peer_gone(b"f1", T0)
    cmds = core.internal_message(b"broker", Internal(framework_event=Internal.FrameworkEvent(
        framework_id=fid, event=scheduler_pb2.SchedulerEvent(offers=scheduler_pb2
        .SchedulerEvent.Offers(offers=[common_pb2.Offer(offer_id="o1")])))), T0)
    assert not only(cmds, ToFramework)
    (fc,) = broker_msgs(cmds, "framework_call")
    assert list(fc.call.decline.offer_ids) == ["o1"]
    assert one(cmds, ToBroker).peer == b"broker"


def test_accept_decline_revive_suppress_are_relayed_to_the_broker() -> None:
    core, _aid, fid = cluster()
    core.broker_connected(b"b1")
    cmds = sched(core, b"f1", fid, accept=Call.Accept(offer_ids=["o1"]))
    assert broker_msgs(cmds, "framework_call")[0].framework_id == fid
    cmds = sched(core, b"f1", fid, suppress=Call.Suppress())
    assert broker_msgs(cmds, "suppress_offers")[0].framework_id == fid
    assert published(cmds)[f"frameworks/{fid}"].framework.suppressed_roles == ["web"]
    cmds = sched(core, b"f1", fid, revive=Call.Revive(roles=["web"]))
    assert broker_msgs(cmds, "revive_offers")[0].framework_id == fid
    assert not core.frameworks[fid].suppressed_roles


def test_broker_failover_rescinds_offers_of_the_old_broker() -> None:
    core, _aid, fid = cluster()
    core.internal_message(b"b1", Internal(framework_event=Internal.FrameworkEvent(
        framework_id=fid, event=scheduler_pb2.SchedulerEvent(offers=scheduler_pb2
        .SchedulerEvent.Offers(offers=[common_pb2.Offer(offer_id="3-o1")])))), T0)
    cmds = core.broker_connected(b"b2", offer_prefix="4")
    assert list(one(cmds, ToFramework).event.rescind.offer_ids) == ["3-o1"]


# -- operator ------------------------------------------------------------------------------


def test_get_logs_is_relayed_to_the_agent_and_back_to_the_operator() -> None:
    core, aid, fid = cluster()
    running(core, aid, fid, "t1")
    cmds = operator(core, b"cli", get_logs=operator_pb2.OperatorCall.GetLogs(
        task_id="t1", tail_lines=10))
    req = one(cmds, ToAgent).event.logs_request
    assert (req.framework_id, req.task_id, req.tail_lines) == (fid, "t1", 10)
    reply = agent_pb2.AgentCall(agent_id=aid, logs_reply=agent_pb2.AgentCall.LogsReply(
        request_id=req.request_id, task_id="t1", data=b"hello", eof=True))
    out = one(core.agent_call(b"a1", reply, T0), ToOperator)
    assert (out.peer, out.in_reply_to, out.event.logs.data) == (b"cli", "op1", b"hello")
    assert not core.log_requests
    cmds = operator(core, b"cli", get_logs=operator_pb2.OperatorCall.GetLogs(task_id="nope"))
    assert "unknown" in one(cmds, ToOperator).event.logs.error


def test_operator_kill_and_set_weight() -> None:
    core, aid, fid = cluster()
    running(core, aid, fid, "t1")
    cmds = operator(core, b"cli", kill_task=operator_pb2.OperatorCall.KillTask(
        framework_id=fid, task_id="t1"))
    assert agent_events(cmds, "kill_task")
    assert one(cmds, ToOperator)
    cmds = operator(core, b"cli", set_weight=operator_pb2.OperatorCall.SetWeight(
        role="web", weight=2.5))
    assert published(cmds)["roles/web"].role.weight == 2.5
    assert registry(cmds)["roles"] == {"web": {"weight": 2.5}}  # type: ignore[index]
    assert one(operator(core, b"cli", set_weight=operator_pb2.OperatorCall.SetWeight(
        role="web", weight=-1)), Reject).code == bus_pb2.INVALID


def test_snapshot_holds_every_record() -> None:
    core, aid, fid = cluster()
    running(core, aid, fid, "t1")
    keys = [e.key for e in core.snapshot_entries()]
    assert keys == [f"agents/{aid}", f"frameworks/{fid}", f"tasks/{fid}/t1"]


def test_a_call_too_large_to_relay_is_refused_not_lost() -> None:
    """An Accept just under the front's frame limit grows when the master wraps it for the
    broker; it used to raise FrameTooLarge in the shell and take the master down (issue 10,
    defect 2). The core refuses it with FRAME_TOO_LARGE and keeps the offer outstanding."""
    from services.bus import codec
    from services.master.core import MAX_RELAY_BYTES
    from tests.master.helpers import task_info

    core, aid, fid = cluster()
    core.internal_message(b"broker", Internal(framework_event=Internal.FrameworkEvent(
        framework_id=fid, event=scheduler_pb2.SchedulerEvent(offers=scheduler_pb2
        .SchedulerEvent.Offers(offers=[common_pb2.Offer(offer_id="o7", agent_id=aid)])))), T0)
    big = task_info("t1")
    big.labels["blob"] = "x" * (codec.DEFAULT_FRAME_LIMIT - 200)
    op = common_pb2.Operation()
    op.launch.tasks.append(big)
    call = Call(framework_id=fid, accept=Call.Accept(offer_ids=["o7"], operations=[op]))
    env = codec.Envelope()
    env.scheduler_call.CopyFrom(call)
    assert len(codec.encode(env)) <= codec.DEFAULT_FRAME_LIMIT  # the front accepts it
    cmds = core.scheduler_call(b"f1", call, "m9", T0)
    assert not broker_msgs(cmds, "framework_call")
    reject = one(cmds, Reject)
    assert reject.code == bus_pb2.FRAME_TOO_LARGE and str(MAX_RELAY_BYTES) in reject.message
    assert "o7" in core.frameworks[fid].offers  # still outstanding: it may accept smaller
    small = Call(framework_id=fid, accept=Call.Accept(offer_ids=["o7"]))
    small.accept.operations.add().launch.tasks.append(task_info("t2"))
    assert broker_msgs(core.scheduler_call(b"f1", small, "m10", T0), "framework_call")
    core.validate()


def test_an_accept_with_no_broker_connected_is_rejected_not_lost() -> None:
    """With no offer-broker connected (it died; a new one has not come), an Accept used to be
    dropped by the shell: no AcceptRejected, no update, the framework's tasks stayed STAGING
    in its mind (issue 10, defect 6). Now it is rejected and its tasks reported DROPPED."""
    from tests.master.helpers import task_info

    core = MasterCore("m1", 1, now=T0)
    aid = register(core, b"a1")
    fid = subscribed(core, b"f1", pa=True)  # partition-aware: it is told DROPPED, not LOST
    assert not core.broker  # no broker has connected to this master
    call = Call(framework_id=fid, accept=Call.Accept(offer_ids=["1-o3"]))
    call.accept.operations.add().launch.tasks.append(task_info("t1"))
    cmds = core.scheduler_call(b"f1", call, "m1", T0)
    assert not broker_msgs(cmds, "framework_call")
    [rejected] = [c.event.accept_rejected for c in only(cmds, ToFramework)
                  if c.event.WhichOneof("event") == "accept_rejected"]
    assert list(rejected.offer_ids) == ["1-o3"] and list(rejected.task_ids) == ["t1"]
    assert rejected.reason == RJ.REJECT_REASON_OFFER_UNKNOWN
    assert [(s.task_id, s.state) for s in statuses(cmds, fid)] == [("t1", TS.TASK_DROPPED)]
    # A decline with no broker has nothing to answer: the offers are void already.
    decline = Call(framework_id=fid, decline=Call.Decline(offer_ids=["1-o4"]))
    assert not only(core.scheduler_call(b"f1", decline, "m2", T0), ToFramework)
    assert aid in core.agents
    core.validate()


def test_an_accept_the_broker_rejects_ends_its_tasks_as_the_master_reports_them() -> None:
    """An ACCEPT the broker refuses (its offer rescinded meanwhile, say by an agent's restart)
    was relayed to the framework as AcceptRejected only, against scheduler.proto's word:
    its tasks got no update at all, and a scheduler waiting for them waited forever (CI: 8
    of 110 tasks of the agent-restart flow test). As Mesos does, every task of it now ends:
    DROPPED (LOST to one not partition-aware) for offers no longer valid, ERROR for an
    invalid task; a live task of that id is not told."""
    core, aid, fid = cluster(pa=True)
    running(core, aid, fid, "live")

    def rejected(reason: int, *tids: str, here: bool = True) -> list[Any]:
        ev = scheduler_pb2.SchedulerEvent(accept_rejected=scheduler_pb2.SchedulerEvent
                                          .AcceptRejected(offer_ids=["o9"], task_ids=tids,
                                                          reason=reason, message="why"))
        cmds = core.internal_message(b"broker", Internal(framework_event=Internal.FrameworkEvent(
            framework_id=fid, event=ev, end_tasks=here)), T0 + 1)
        assert [c.event.accept_rejected.task_ids for c in only(cmds, ToFramework)
                if c.event.WhichOneof("event") == "accept_rejected"] == [list(tids)]
        return statuses(cmds, fid)

    got = rejected(RJ.REJECT_REASON_OFFER_UNKNOWN, "t1", "live", "t2")
    assert [(s.task_id, s.state, s.reason) for s in got] == [
        ("t1", TS.TASK_DROPPED, R.REASON_INVALID_OFFERS),
        ("t2", TS.TASK_DROPPED, R.REASON_INVALID_OFFERS)]
    assert all("why" in s.message and s.source == common_pb2.TaskStatus.SOURCE_MASTER
               for s in got)
    got = rejected(RJ.REJECT_REASON_TASK_INVALID, "t3")
    assert [(s.task_id, s.state, s.reason) for s in got] == [
        ("t3", TS.TASK_ERROR, R.REASON_TASK_INVALID)]
    # Refused by the master (which told the tasks) or never answered by it (its tasks may
    # yet appear): relayed alone.
    assert rejected(RJ.REJECT_REASON_AGENT_UNAVAILABLE, "t4", here=False) == []
    assert core.tasks[(fid, "live")].state == TS.TASK_RUNNING
    core.validate()
