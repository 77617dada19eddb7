"""The master's pure core, one behaviour per test: admission, launches re-validated against
the master's view, status updates, authorisation, failures of agents, frameworks and the
master itself, reconciliation, operator calls."""

from __future__ import annotations

from schemas import agent_pb2, bus_pb2, common_pb2, operator_pb2, scheduler_pb2
from services.master.commands import (
    PersistRegistry,
    Publish,
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
    launch,
    one,
    only,
    operator,
    published,
    register,
    registry,
    rejects,
    reported,
    reregister,
    sched,
    statuses,
    subscribe,
    subscribed,
    update,
)

R = common_pb2.TaskStatus.Reason
RJ = common_pb2.RejectReason


def cluster(pa: bool = False, failover: float = 60.0) -> tuple[MasterCore, str, str]:
    """A master with agent a1 (peer b"a1") and framework f1 (peer b"f1")."""
    core = MasterCore("m1", 7, now=T0)
    aid = register(core, b"a1")
    fid = subscribed(core, b"f1", pa=pa, failover=failover)
    return core, aid, fid


def running(core: MasterCore, aid: str, fid: str, *tids: str) -> None:
    launch(core, fid, aid, *tids)
    for tid in tids:
        update(core, b"a1", aid, fid, tid, TS.TASK_RUNNING, uuid=f"{tid}-run".encode())


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
    assert registry(cmds) == {"agents": {"m1-S1": {"status": "registered", "hostname": "h1",
                                                   "since_us": int(T0 * 1e6)}},
                              "frameworks": {}, "roles": {}, "cluster_id": ""}
    assert isinstance(cmds[0], PersistRegistry) and isinstance(cmds[-1], Publish)
    core.validate()


def test_a_new_cluster_writes_its_id_once_and_a_recovered_one_keeps_it() -> None:
    core = MasterCore("m1", 1, cluster_id="c-new", id_prefix="u1-1", now=T0)
    cmds = core.tick(T0)  # the first step persists the new cluster's id, before any agent
    assert registry(cmds) == {"cluster_id": "c-new", "agents": {}, "frameworks": {},
                              "roles": {}}
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


def test_register_keeps_a_checkpointed_id_unless_it_is_gone() -> None:
    core = MasterCore("m1", 1, now=T0)
    assert register(core, b"a1", agent_id="old-S9") == "old-S9"
    core.peer_gone(b"a1", T0 + 1)
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
    core.peer_gone(b"a1", T0 + 1)
    cmds = launch(core, fid, aid, "t1")
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
    core.peer_gone(b"a1", T0 + 1)
    task = Call.Reconcile.Task(task_id="x", agent_id=aid)
    assert [s.state for s in statuses(sched(core, b"f1", fid, reconcile=Call.Reconcile(
        tasks=[task])))] == [TS.TASK_UNREACHABLE]
    operator(core, b"op", mark_agent_gone=operator_pb2.OperatorCall.MarkAgentGone(agent_id=aid))
    assert [s.state for s in statuses(sched(core, b"f1", fid, reconcile=Call.Reconcile(
        tasks=[task])))] == [TS.TASK_GONE]


# -- agent failures ------------------------------------------------------------------------


def test_agent_peer_gone_makes_tasks_unreachable_or_lost_by_capability() -> None:
    core, aid, fid = cluster(pa=True)
    plain = subscribed(core, b"f2")
    running(core, aid, fid, "t1")
    launch(core, plain, aid, "t2", rid="r2")
    cmds = core.peer_gone(b"a1", T0 + 5)
    (pa_st,) = statuses(cmds, fid)
    (plain_st,) = statuses(cmds, plain)
    assert pa_st.state == TS.TASK_UNREACHABLE and plain_st.state == TS.TASK_LOST
    assert pa_st.reason == plain_st.reason == R.REASON_AGENT_UNREACHABLE
    assert pa_st.unreachable_since_us == int((T0 + 5) * 1e6)
    # Stored as UNREACHABLE either way, resources still counted until the agent is back.
    assert core.tasks[(plain, "t2")].state == TS.TASK_UNREACHABLE
    assert core.agents[aid].used == Resources.parse("cpus:2;mem:256")
    assert published(cmds)[f"agents/{aid}"].agent.status == 2  # UNREACHABLE
    assert registry(cmds)["agents"][aid]["status"] == "unreachable"  # type: ignore[index]
    failures = [c for c in only(cmds, ToFramework) if c.event.WhichOneof("event") == "failure"]
    assert {c.framework_id for c in failures} == {fid, plain}
    core.validate()


def test_agent_back_from_unreachable_keeps_pa_tasks_and_kills_non_pa_ones() -> None:
    core, aid, fid = cluster(pa=True)
    plain = subscribed(core, b"f2")
    running(core, aid, fid, "t1")
    launch(core, plain, aid, "t2", rid="r2")
    core.peer_gone(b"a1", T0 + 5)
    cmds = reregister(core, b"a1", aid, [reported(fid, "t1", TS.TASK_RUNNING),
                                         reported(plain, "t2", TS.TASK_RUNNING)], now=T0 + 9)
    assert agent_events(cmds, "reregistered")
    assert core.tasks[(fid, "t1")].state == TS.TASK_RUNNING
    kills = agent_events(cmds, "kill_task")
    assert [(k.event.kill_task.framework_id, k.event.kill_task.task_id) for k in kills] == [
        (plain, "t2")]  # it was told TASK_LOST: it must not come back to life
    core.validate()


def test_reregister_drops_tasks_the_agent_no_longer_has_and_reconciles_staging() -> None:
    core, aid, fid = cluster(pa=True)
    running(core, aid, fid, "t1")
    launch(core, fid, aid, "t2", rid="r2")  # STAGING: RunTasks may still be in flight
    cmds = reregister(core, b"a1", aid, [])
    (st,) = statuses(cmds, fid)
    assert (st.task_id, st.state, st.reason) == ("t1", TS.TASK_DROPPED,
                                                 R.REASON_AGENT_RESTARTED)
    (rec,) = agent_events(cmds, "reconcile")
    assert [(t.task_id, t.state) for t in rec.event.reconcile.tasks] == [("t2",
                                                                           TS.TASK_STAGING)]
    core.validate()


def test_agent_unregister_ends_its_tasks_gone() -> None:
    core, aid, fid = cluster(pa=True)
    running(core, aid, fid, "t1")
    cmds = core.agent_call(b"a1", agent_pb2.AgentCall(
        agent_id=aid, unregister=agent_pb2.AgentCall.Unregister(reason="drain")), T0)
    assert [s.state for s in statuses(cmds, fid)] == [TS.TASK_GONE]
    assert registry(cmds)["agents"][aid]["status"] == "gone"  # type: ignore[index]
    core.validate()


def test_mark_agent_gone_needs_an_unreachable_agent() -> None:
    core, aid, fid = cluster(pa=True)
    running(core, aid, fid, "t1")
    cmds = operator(core, b"op", mark_agent_gone=operator_pb2.OperatorCall.MarkAgentGone(
        agent_id=aid))
    assert one(cmds, Reject).code == bus_pb2.INVALID
    core.peer_gone(b"a1", T0 + 1)
    cmds = operator(core, b"op", mark_agent_gone=operator_pb2.OperatorCall.MarkAgentGone(
        agent_id=aid))
    assert [s.state for s in statuses(cmds, fid)] == [TS.TASK_GONE_BY_OPERATOR]
    assert one(cmds, ToOperator).event.WhichOneof("event") == "done"
    assert not core.agents[aid].used
    # A gone agent can never come back under its id.
    cmds = reregister(core, b"a1", aid, [reported(fid, "t1", TS.TASK_RUNNING)])
    assert agent_events(cmds, "shutdown") and rejects(cmds)
    core.validate()


# -- master failover -----------------------------------------------------------------------


def test_reregistration_after_master_failover_rebuilds_the_same_tasks() -> None:
    old, aid, fid = cluster()
    running(old, aid, fid, "t1")
    launch(old, fid, aid, "t2", rid="r2")
    update(old, b"a1", aid, fid, "t2", TS.TASK_FINISHED)
    doc = old.registry_document()
    new = MasterCore("m2", 8, recovered_registry=doc, now=T0 + 100)
    assert new.recovering.keys() == {aid} and fid in new.frameworks
    cmds = reregister(new, b"a1-new", aid, [reported(fid, "t1", TS.TASK_RUNNING)],
                      frameworks=[old.frameworks[fid].info], now=T0 + 101)
    assert agent_events(cmds, "reregistered")
    assert not agent_events(cmds, "kill_task") and not agent_events(cmds, "shutdown_framework")
    assert new.tasks[(fid, "t1")].state == TS.TASK_RUNNING
    assert new.agents[aid].used == Resources.parse("cpus:1;mem:128")
    # The scheduler re-subscribes within its failover timeout and keeps its task.
    assert subscribed(new, b"f1-new", framework_id=fid, now=T0 + 110) == fid
    new.tick(T0 + 500)
    assert new.tasks[(fid, "t1")].state == TS.TASK_RUNNING
    new.validate()


def test_a_master_failover_never_removes_a_framework_with_failover_timeout_0() -> None:
    """failover_timeout 0 (the protocol default) means "remove me when *I* disconnect", not
    "when the master dies": after a failover the framework has the re-register window to
    come back, like the agents (issue 10, defect 7)."""
    old, aid, fid = cluster(failover=0.0)
    running(old, aid, fid, "t1")
    new = MasterCore("m2", 8, recovered_registry=old.registry_document(),
                     agent_reregister_window_s=60, now=T0 + 100)
    reregister(new, b"a1", aid, [reported(fid, "t1", TS.TASK_RUNNING)],
               frameworks=[old.frameworks[fid].info], now=T0 + 100.5)
    cmds = new.tick(T0 + 101)
    assert fid in new.frameworks and not agent_events(cmds, "shutdown_framework"), cmds
    assert new.next_deadline() == T0 + 160  # the window, not "now"
    assert subscribed(new, b"f1-new", framework_id=fid, now=T0 + 130) == fid
    assert new.tasks[(fid, "t1")].state == TS.TASK_RUNNING
    new.validate()
    # Not back within the window: removed then, as its timeout of 0 asks.
    lost = MasterCore("m3", 9, recovered_registry=old.registry_document(),
                      agent_reregister_window_s=60, now=T0 + 200)
    assert fid in lost.frameworks
    lost.tick(T0 + 259)
    assert fid in lost.frameworks
    lost.tick(T0 + 260)
    assert fid not in lost.frameworks
    lost.validate()


def test_agents_not_back_within_the_window_become_unreachable() -> None:
    old, aid, _fid = cluster()
    new = MasterCore("m2", 8, recovered_registry=old.registry_document(),
                     agent_reregister_window_s=60, now=T0)
    assert not new.tick(T0 + 59)
    cmds = new.tick(T0 + 60)
    assert published(cmds)[f"agents/{aid}"].agent.status == 2
    assert registry(cmds)["agents"][aid]["status"] == "unreachable"  # type: ignore[index]
    assert not only(cmds, ToFramework)  # the new master knows none of its tasks
    new.validate()


def test_reconcile_during_the_reregister_window_stays_silent() -> None:
    old, _aid, fid = cluster()
    new = MasterCore("m2", 8, recovered_registry=old.registry_document(), now=T0)
    subscribed(new, b"f1", framework_id=fid)
    cmds = sched(new, b"f1", fid, reconcile=Call.Reconcile(tasks=[Call.Reconcile.Task(
        task_id="t1")]))
    assert not statuses(cmds)


# -- framework failover --------------------------------------------------------------------


def test_framework_failover_within_timeout_keeps_tasks() -> None:
    core, aid, fid = cluster(failover=30)
    running(core, aid, fid, "t1")
    core.internal_message(b"broker", Internal(framework_event=Internal.FrameworkEvent(
        framework_id=fid, event=scheduler_pb2.SchedulerEvent(offers=scheduler_pb2
        .SchedulerEvent.Offers(offers=[common_pb2.Offer(offer_id="o7", agent_id=aid)])))), T0)
    cmds = core.peer_gone(b"f1", T0 + 1)
    (decline,) = broker_msgs(cmds, "framework_call")
    assert list(decline.call.decline.offer_ids) == ["o7"]
    assert decline.call.decline.filters.refuse_seconds == 0
    assert not published(cmds)[f"frameworks/{fid}"].framework.connected
    assert not core.tick(T0 + 30)  # 29 s after the disconnect
    assert subscribed(core, b"f1b", framework_id=fid, now=T0 + 30) == fid
    assert not core.tick(T0 + 1000)
    assert core.tasks[(fid, "t1")].state == TS.TASK_RUNNING


def test_framework_failover_timeout_removes_it_and_shuts_its_tasks_down() -> None:
    core, aid, fid = cluster(failover=30)
    running(core, aid, fid, "t1")
    core.peer_gone(b"f1", T0 + 1)
    cmds = core.tick(T0 + 31)
    (sd,) = agent_events(cmds, "shutdown_framework")
    assert sd.event.shutdown_framework.framework_id == fid
    pub = published(cmds)
    assert pub[f"frameworks/{fid}"] is None and pub[f"tasks/{fid}/t1"] is None
    assert fid not in registry(cmds)["frameworks"]  # type: ignore[index]
    assert not core.agents[aid].used
    # Its stragglers are shut down, its id cannot subscribe again.
    cmds = update(core, b"a1", aid, fid, "t1", TS.TASK_RUNNING)
    assert agent_events(cmds, "shutdown_framework")
    assert one(subscribe(core, b"f1c", framework_id=fid), ToFramework).event.error.message
    core.validate()


def test_subscribe_takeover_needs_force_and_disconnects_the_old_scheduler() -> None:
    core, _aid, fid = cluster()
    cmds = subscribe(core, b"f1b", framework_id=fid)
    assert "force" in one(cmds, ToFramework).event.error.message
    cmds = subscribe(core, b"f1b", framework_id=fid, force=True)
    by_peer = {c.peer: c.event.WhichOneof("event") for c in only(cmds, ToFramework)}
    assert by_peer == {b"f1": "error", b"f1b": "subscribed"}
    assert one(sched(core, b"f1", fid, reconcile=Call.Reconcile()), Reject)
    assert one(subscribe(core, b"f1c", framework_id=fid, principal="mallory", force=True),
               ToFramework).event.error.message


def test_teardown_shuts_down_on_agents_and_forgets_the_framework() -> None:
    core, aid, fid = cluster()
    running(core, aid, fid, "t1")
    cmds = sched(core, b"f1", fid, teardown=Call.Teardown())
    assert agent_events(cmds, "shutdown_framework")
    assert fid not in core.frameworks and not core.tasks
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
