"""The master's pure core, one behaviour per test: admission, launches re-validated against
the master's view, status updates, authorisation, reconciliation. Failures and failovers are
in test_master_failover.py; the broker relay, operator calls and the cluster's identity in
test_master_relay.py."""

from __future__ import annotations

import pytest

from schemas import agent_pb2, bus_pb2, common_pb2, operator_pb2
from services.master.commands import (
    PersistRegistry,
    Publish,
    Reject,
    ToAgent,
    ToFramework,
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
    launch,
    launch_msg,
    one,
    only,
    operator,
    published,
    register,
    registry,
    rejects,
    running,
    sched,
    silence,
    statuses,
    subscribed,
    task_info,
    update,
)

R = common_pb2.TaskStatus.Reason
RJ = common_pb2.RejectReason


# -- admission -----------------------------------------------------------------------------


def test_registration_replies_publishes_and_persists() -> None:
    core = MasterCore("m1", 7, heartbeat_interval_ms=500, now=T0)
    cmds = core.agent_call(b"a1", agent_pb2.AgentCall(register=agent_pb2.AgentCall.Register(
        agent_info=common_pb2.AgentInfo(hostname="h1", resources=Resources.parse(
            "cpus:2;mem:1024").to_proto()))), T0)
    reply = one(cmds, ToAgent)
    assert reply.peer == b"a1"
    reg = reply.event.registered
    assert (reg.agent_id, reg.master_id, reg.master_epoch, reg.heartbeat_interval_ms) == (
        "m1-S1", "m1", 7, 500)
    rec = published(cmds)["agents/m1-S1"].agent
    assert rec.status == rec.AGENT_STATUS_REGISTERED and rec.agent_info.hostname == "h1"
    # Only what changed is in the change: a registration costs one entry, not the fleet.
    assert registry(cmds) == {"agents": {"m1-S1": {"status": "registered", "hostname": "h1",
                                                   "since_us": int(T0 * 1e6)}}}
    assert isinstance(cmds[0], PersistRegistry) and isinstance(cmds[-1], Publish)
    core.validate()


def test_register_keeps_a_checkpointed_id_unless_it_is_gone() -> None:
    core = MasterCore("m1", 1, now=T0)
    assert register(core, b"a1", agent_id="old-S9") == "old-S9"
    silence(core, T0 + 5)
    operator(core, b"op", mark_agent_gone=operator_pb2.OperatorCall.MarkAgentGone(
        agent_id="old-S9"))
    assert register(core, b"a2", agent_id="old-S9") == "m1-S1"


def test_invalid_agent_resources_are_rejected_not_raised() -> None:
    core = MasterCore("m1", 1, now=T0)
    info = common_pb2.AgentInfo(hostname="h", resources=[common_pb2.Resource(
        name="cpus", scalar=-1)])
    cmds = core.agent_call(b"a1", agent_pb2.AgentCall(
        register=agent_pb2.AgentCall.Register(agent_info=info)), T0)
    assert one(cmds, Reject).code == bus_pb2.INVALID
    assert not core.agents


def test_calls_from_a_stale_connection_are_rejected() -> None:
    core, aid, fid = cluster()
    running(core, aid, fid, "t1")
    cmds = update(core, b"intruder", aid, fid, "t1", TS.TASK_FINISHED)
    assert one(cmds, Reject).code == bus_pb2.NOT_REGISTERED
    cmds = update(core, b"a1", "nobody", fid, "t1", TS.TASK_FINISHED)
    assert one(cmds, Reject).code == bus_pb2.NOT_REGISTERED
    assert core.tasks[(fid, "t1")].state == TS.TASK_RUNNING


# -- launches ------------------------------------------------------------------------------


def test_accepted_launch_records_staging_and_runs_tasks_on_the_agent() -> None:
    core, aid, fid = cluster()
    cmds = launch(core, fid, aid, "t1", "t2")
    run = one(cmds, ToAgent)
    assert run.peer == b"a1" and run.traceparent == "00-tp"
    launches = run.event.run_tasks.launches
    assert [(lt.framework_id, lt.task.task_id, lt.traceparent, list(lt.offer_ids))
            for lt in launches] == [(fid, "t1", "00-tp", ["o1"]), (fid, "t2", "00-tp", ["o1"])]
    assert [f.framework_id for f in run.event.run_tasks.frameworks] == [fid]
    result = broker_msgs(cmds, "launch_result")[0]
    assert result.accepted and list(result.task_ids) == ["t1", "t2"]
    pub = published(cmds)
    assert pub[f"tasks/{fid}/t1"].task.status.state == TS.TASK_STAGING
    assert pub[f"tasks/{fid}/t1"].task.traceparent == "00-tp"
    assert Resources.from_proto(pub[f"agents/{aid}"].agent.used_resources) == \
        Resources.parse("cpus:2;mem:256")
    assert Resources.from_proto(pub[f"frameworks/{fid}"].framework.used_resources) == \
        Resources.parse("cpus:2;mem:256")
    assert registry(cmds) is None  # task changes never touch the registry
    core.validate()


def test_launch_that_no_longer_fits_is_refused_and_tasks_dropped() -> None:
    core, aid, fid = cluster()
    launch(core, fid, aid, "big", res="cpus:3;mem:128", rid="r1")
    cmds = launch(core, fid, aid, "t2", res="cpus:2;mem:128", rid="r2")
    assert not agent_events(cmds, "run_tasks")
    result = broker_msgs(cmds, "launch_result")[0]
    assert not result.accepted and result.reason == RJ.REJECT_REASON_AGENT_INSUFFICIENT
    assert "free" in result.message and list(result.task_ids) == ["t2"]
    (st,) = statuses(cmds, fid)
    assert st.task_id == "t2" and st.state == TS.TASK_LOST  # DROPPED, as a non-PA sees it
    assert (fid, "t2") not in core.tasks
    core.validate()


def test_refused_launch_tells_partition_aware_frameworks_dropped() -> None:
    core, aid, fid = cluster(pa=True)
    silence(core, T0 + 5)
    cmds = launch(core, fid, aid, "t1", now=T0 + 5)
    assert broker_msgs(cmds, "launch_result")[0].reason == RJ.REJECT_REASON_AGENT_UNAVAILABLE
    assert [s.state for s in statuses(cmds, fid)] == [TS.TASK_DROPPED]


def test_launch_of_a_duplicate_live_task_id_is_invalid_and_the_live_task_untouched() -> None:
    core, aid, fid = cluster()
    running(core, aid, fid, "t1")
    cmds = launch(core, fid, aid, "t1", rid="r2")
    assert broker_msgs(cmds, "launch_result")[0].reason == RJ.REJECT_REASON_TASK_INVALID
    assert not statuses(cmds)  # no TASK_ERROR about the live t1
    assert core.tasks[(fid, "t1")].state == TS.TASK_RUNNING


def test_launch_for_a_disconnected_framework_is_refused() -> None:
    core, aid, fid = cluster()
    core.peer_gone(b"f1", T0 + 1)
    cmds = launch(core, fid, aid, "t1")
    assert broker_msgs(cmds, "launch_result")[0].reason == RJ.REJECT_REASON_FRAMEWORK_INACTIVE
    assert not only(cmds, ToFramework)


def test_one_framework_may_use_the_same_host_port_on_two_agents() -> None:
    """Port 31000 on agent 1 and port 31000 on agent 2 are two ports. The framework's `used`
    summed them as one range, and ending the second task raised ValueError in the master
    (seen: `offerbus stop` left a service's container running)."""
    core = MasterCore("m1", 1, now=T0)
    a1 = register(core, b"a1", res="cpus:4;mem:4096;ports:[31000-31999]")
    a2 = register(core, b"a2", res="cpus:4;mem:4096;ports:[31000-31999]")
    fid = subscribed(core, b"f1")
    port = "cpus:1;mem:128;ports:[31000-31000]"
    launch(core, fid, a1, "t1", res=port, rid="r1")
    launch(core, fid, a2, "t2", res=port, rid="r2")
    assert {t for (_, t) in core.tasks} == {"t1", "t2"}
    update(core, b"a1", a1, fid, "t1", TS.TASK_FINISHED, uuid=b"1")
    update(core, b"a2", a2, fid, "t2", TS.TASK_FINISHED, uuid=b"2")
    assert core.frameworks[fid].used == Resources()
    core.validate()


@pytest.mark.parametrize(("a", "b", "two_ops", "clash"), [
    ("ports:[31000-31000]", "ports:[31000-31000]", False, "port 31000"),
    ("ports:[31000-31005]", "ports:[31005-31010]", False, "port 31005"),
    ("ports:[31000-31000]", "ports:[31000-31000]", True, "port 31000"),
    ("disks:{sda}", "disks:{sda,sdb}", False, "disk 'sda'"),
])
def test_two_tasks_of_one_launch_never_share_a_port_or_set_item(a: str, b: str, two_ops: bool,
                                                                clash: str) -> None:
    """Ports are resources like any other: two tasks asking for port 31000 summed to one
    range [31000-31000], which the agent had free, and both were launched on it."""
    core = MasterCore("m1", 1, now=T0)
    aid = register(core, b"a1", res="cpus:4;mem:4096;ports:[31000-31999];disks:{sda,sdb}")
    fid = subscribed(core, b"f1")
    ta, tb = task_info("a", f"cpus:1;{a}"), task_info("b", f"cpus:1;{b}")
    msg = launch_msg(fid, aid, ta, tb)
    if two_ops:
        ops = msg.launch_request.operations
        ops.add().launch.tasks.append(ops[0].launch.tasks.pop())
    cmds = core.internal_message(b"broker", msg, T0)
    assert not agent_events(cmds, "run_tasks")
    result = broker_msgs(cmds, "launch_result")[0]
    assert not result.accepted and result.reason == RJ.REJECT_REASON_TASK_INVALID
    assert result.message == f"tasks 'a' and 'b' both use {clash}"
    assert [(s.task_id, s.state) for s in statuses(cmds, fid)] == [
        ("a", TS.TASK_ERROR), ("b", TS.TASK_ERROR)]
    assert not core.tasks
    core.validate()


def test_reserve_then_launch_on_the_reservation() -> None:
    core, aid, fid = cluster()
    res = Resources.parse("cpus:2", role="web")
    ops = [common_pb2.Operation(reserve=common_pb2.Operation.Reserve(resources=res.to_proto())),
           common_pb2.Operation(launch=common_pb2.Operation.Launch(tasks=[common_pb2.TaskInfo(
               task_id="t1", resources=Resources.parse("cpus:1", role="web").to_proto())]))]
    cmds = core.internal_message(b"broker", Internal(launch_request=Internal.LaunchRequest(
        request_id="r", framework_id=fid, agent_id=aid, offer_ids=["o"], operations=ops)), T0)
    assert broker_msgs(cmds, "launch_result")[0].accepted
    assert core.agents[aid].total == Resources.parse("cpus:2;mem:4096") + res
    core.validate()


# -- status updates ------------------------------------------------------------------------


def test_updates_through_running_to_finished_release_resources_and_are_forwarded() -> None:
    core, aid, fid = cluster()
    launch(core, fid, aid, "t1")
    cmds = update(core, b"a1", aid, fid, "t1", TS.TASK_RUNNING, uuid=b"u1")
    (st,) = statuses(cmds, fid)
    assert (st.state, st.uuid) == (TS.TASK_RUNNING, b"u1")
    cmds = update(core, b"a1", aid, fid, "t1", TS.TASK_FINISHED, uuid=b"u2")
    assert [s.state for s in statuses(cmds, fid)] == [TS.TASK_FINISHED]
    assert not core.agents[aid].used and not core.frameworks[fid].used
    assert published(cmds)[f"tasks/{fid}/t1"].task.status.state == TS.TASK_FINISHED
    # A retry of the terminal update (not acked yet) is forwarded again, not an error.
    assert [s.state for s in statuses(update(core, b"a1", aid, fid, "t1", TS.TASK_FINISHED,
                                             uuid=b"u2"))] == [TS.TASK_FINISHED]
    core.validate()


def test_updates_are_batched_one_update_per_framework() -> None:
    core, aid, fid = cluster()
    launch(core, fid, aid, "t1", "t2")
    sus = [agent_pb2.StatusUpdate(framework_id=fid, status=common_pb2.TaskStatus(
        task_id=t, state=TS.TASK_RUNNING, uuid=t.encode())) for t in ("t1", "t2")]
    cmds = core.agent_call(b"a1", agent_pb2.AgentCall(
        agent_id=aid, status_updates=agent_pb2.AgentCall.StatusUpdates(updates=sus)), T0)
    fw_cmds = only(cmds, ToFramework)
    assert len(fw_cmds) == 1 and len(fw_cmds[0].event.update.statuses) == 2
    assert len(only(cmds, Publish)) == 1


def test_updates_for_a_disconnected_framework_are_recorded_not_forwarded() -> None:
    core, aid, fid = cluster()
    launch(core, fid, aid, "t1")
    core.peer_gone(b"f1", T0 + 1)
    cmds = update(core, b"a1", aid, fid, "t1", TS.TASK_FINISHED, uuid=b"u")
    assert not only(cmds, ToFramework)  # no ack will come: the agent keeps retrying
    assert core.tasks[(fid, "t1")].state == TS.TASK_FINISHED
    subscribed(core, b"f1b", framework_id=fid)
    cmds = update(core, b"a1", aid, fid, "t1", TS.TASK_FINISHED, uuid=b"u")  # the retry
    assert [c.peer for c in only(cmds, ToFramework)] == [b"f1b"]


def test_stale_update_after_a_kill_is_forwarded_but_not_applied() -> None:
    core, aid, fid = cluster()
    launch(core, fid, aid, "t1")
    sched(core, b"f1", fid, kill=Call.Kill(task_id="t1"))
    cmds = update(core, b"a1", aid, fid, "t1", TS.TASK_RUNNING, uuid=b"old")
    assert [s.state for s in statuses(cmds)] == [TS.TASK_RUNNING]
    assert core.tasks[(fid, "t1")].state == TS.TASK_KILLING
    update(core, b"a1", aid, fid, "t1", TS.TASK_KILLED, uuid=b"k")
    assert core.tasks[(fid, "t1")].state == TS.TASK_KILLED
    core.validate()


def test_executor_exited_is_a_failure_event() -> None:
    core, aid, fid = cluster()
    cmds = core.agent_call(b"a1", agent_pb2.AgentCall(
        agent_id=aid, executor_exited=agent_pb2.AgentCall.ExecutorExited(
            framework_id=fid, executor_id="e1", exit_status=3)), T0)
    f = one(cmds, ToFramework).event.failure
    assert (f.agent_id, f.executor_id, f.exit_status) == (aid, "e1", 3)


def test_completed_tasks_are_bounded() -> None:
    core = MasterCore("m1", 1, now=T0, max_completed_tasks=2)
    aid = register(core, b"a1")
    fid = subscribed(core, b"f1")
    for i in range(4):
        launch(core, fid, aid, f"t{i}", rid=f"r{i}")
        cmds = update(core, b"a1", aid, fid, f"t{i}", TS.TASK_FINISHED)
    assert sorted(t for f, t in core.tasks) == ["t2", "t3"]
    assert published(cmds)[f"tasks/{fid}/t1"] is None
    core.validate()


# -- authorisation -------------------------------------------------------------------------


def test_a_framework_cannot_kill_or_ack_another_frameworks_task() -> None:
    core, aid, fid = cluster()
    other = subscribed(core, b"f2")
    running(core, aid, fid, "t1")
    cmds = sched(core, b"f2", other, kill=Call.Kill(task_id="t1"))
    rej = one(cmds, Reject)
    assert rej.code == bus_pb2.UNAUTHORIZED and "t1" in rej.message and other in rej.message
    assert not agent_events(cmds, "kill_task")
    ack = Call.Acknowledge.Ack(agent_id=aid, task_id="t1", uuid=b"t1-run")
    cmds = sched(core, b"f2", other, acknowledge=Call.Acknowledge(acks=[ack]))
    assert one(cmds, Reject).code == bus_pb2.UNAUTHORIZED
    assert not agent_events(cmds, "acknowledgements")
    assert core.tasks[(fid, "t1")].state == TS.TASK_RUNNING


def test_a_framework_cannot_call_on_another_connection() -> None:
    core, _aid, fid = cluster()
    subscribed(core, b"f2")
    for peer in (b"f2", b"stranger"):
        cmds = sched(core, peer, fid, kill=Call.Kill(task_id="t1"))
        rej = one(cmds, Reject)
        assert rej.code == bus_pb2.NOT_REGISTERED
        assert rej.message == f"framework '{fid}' is not subscribed on this connection"
        assert rej.in_reply_to == "m1"


def test_kill_goes_to_the_agent_and_the_task_is_killing() -> None:
    core, aid, fid = cluster()
    running(core, aid, fid, "t1")
    cmds = sched(core, b"f1", fid, kill=Call.Kill(task_id="t1", kill_grace_period_s=9))
    kill = one(cmds, ToAgent).event.kill_task
    assert (kill.framework_id, kill.task_id, kill.kill_grace_period_s) == (fid, "t1", 9)
    assert published(cmds)[f"tasks/{fid}/t1"].task.status.state == TS.TASK_KILLING


def test_kill_of_an_unknown_task_answers_lost_or_unknown() -> None:
    core, _aid, fid = cluster()
    pa = subscribed(core, b"f2", pa=True)
    assert [s.state for s in statuses(sched(core, b"f1", fid, kill=Call.Kill(
        task_id="nope")))] == [TS.TASK_LOST]
    (st,) = statuses(sched(core, b"f2", pa, kill=Call.Kill(task_id="nope")))
    assert st.state == TS.TASK_UNKNOWN and not st.uuid


def test_acks_are_forwarded_batched_per_agent() -> None:
    core, aid, fid = cluster()
    aid2 = register(core, b"a2")
    launch(core, fid, aid, "t1", rid="r1")
    launch(core, fid, aid2, "t2", rid="r2")
    acks = [Call.Acknowledge.Ack(agent_id=a, task_id=t, uuid=b"u")
            for a, t in ((aid, "t1"), (aid2, "t2"), (aid, "gone-long-ago"))]
    cmds = sched(core, b"f1", fid, acknowledge=Call.Acknowledge(acks=acks))
    by_agent = {c.agent_id: [a.task_id for a in c.event.acknowledgements.acks]
                for c in agent_events(cmds, "acknowledgements")}
    assert by_agent == {aid: ["t1", "gone-long-ago"], aid2: ["t2"]}
    assert not rejects(cmds)


# -- reconciliation ------------------------------------------------------------------------


def test_explicit_reconcile_answers_each_task() -> None:
    core, aid, fid = cluster()
    running(core, aid, fid, "t1")
    tasks = [Call.Reconcile.Task(task_id="t1"), Call.Reconcile.Task(task_id="zz"),
             Call.Reconcile.Task(task_id="yy", agent_id="no-such-agent")]
    sts = statuses(sched(core, b"f1", fid, reconcile=Call.Reconcile(tasks=tasks)))
    assert [(s.task_id, s.state) for s in sts] == [
        ("t1", TS.TASK_RUNNING), ("zz", TS.TASK_LOST), ("yy", TS.TASK_LOST)]
    assert all(not s.uuid for s in sts)
    assert sts[0].reason == R.REASON_RECONCILIATION


def test_implicit_reconcile_answers_every_task_of_the_framework() -> None:
    core, aid, fid = cluster(pa=True)
    other = subscribed(core, b"f2")
    running(core, aid, fid, "t1", "t2")
    launch(core, other, aid, "x", rid="r9")
    update(core, b"a1", aid, fid, "t2", TS.TASK_FAILED)
    sts = statuses(sched(core, b"f1", fid, reconcile=Call.Reconcile()))
    assert sorted((s.task_id, s.state) for s in sts) == [("t1", TS.TASK_RUNNING),
                                                         ("t2", TS.TASK_FAILED)]


def test_reconcile_of_tasks_on_unreachable_and_gone_agents() -> None:
    core, aid, fid = cluster(pa=True)
    silence(core, T0 + 5)
    task = Call.Reconcile.Task(task_id="x", agent_id=aid)
    assert [s.state for s in statuses(sched(core, b"f1", fid, reconcile=Call.Reconcile(
        tasks=[task])))] == [TS.TASK_UNREACHABLE]
    operator(core, b"op", mark_agent_gone=operator_pb2.OperatorCall.MarkAgentGone(agent_id=aid))
    assert [s.state for s in statuses(sched(core, b"f1", fid, reconcile=Call.Reconcile(
        tasks=[task])))] == [TS.TASK_GONE]
