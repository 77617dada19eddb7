"""The master's pure core when something fails: agents lost and back, the master itself
failing over, frameworks failing over or torn down."""

from __future__ import annotations

from schemas import agent_pb2, bus_pb2, common_pb2, operator_pb2, scheduler_pb2, state_pb2
from services.master.commands import (
    Command,
    Publish,
    Reject,
    ToFramework,
    ToOperator,
)
from services.master.core import MasterCore
from services.master.records import REGISTERED, UNREACHABLE
from services.notice import Notice
from services.resources import Resources
from tests.master.helpers import (
    T0,
    TS,
    Call,
    Internal,
    agent_events,
    agent_info,
    broker_msgs,
    cluster,
    launch,
    one,
    only,
    operator,
    published,
    registry,
    rejects,
    reported,
    reregister,
    running,
    sched,
    silence,
    statuses,
    subscribe,
    subscribed,
    update,
)

R = common_pb2.TaskStatus.Reason
RJ = common_pb2.RejectReason


# -- agent failures ------------------------------------------------------------------------


def test_a_silent_agent_makes_tasks_unreachable_or_lost_by_capability() -> None:
    core, aid, fid = cluster(pa=True)
    plain = subscribed(core, b"f2")
    running(core, aid, fid, "t1")
    launch(core, plain, aid, "t2", rid="r2")
    cmds = silence(core, T0 + 5)
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
    silence(core, T0 + 5)
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
    silence(core, T0 + 5)
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


def followed(core: MasterCore) -> list[bus_pb2.StateEntry]:
    """The agent and task entries of `core`'s stream, as a standby following it holds them."""
    return [e for e in core.snapshot_entries() if e.key.startswith(("agents/", "tasks/"))]


def test_a_followed_task_comes_back_as_the_previous_leader_recorded_it() -> None:
    """A standby that followed the leader's stream holds its task records: an agent
    re-registering with a task in the same state gets the record back whole (launch time,
    trace, offers, the latest status with its uuid), so the new leader's stream entry is
    the old one's. Before, the task was launched "now", untraced, its status the agent's
    bare state. What the agent reports differently is its word."""
    old, aid, fid = cluster()
    running(old, aid, fid, "t1", "t2", "t3")
    launch(old, fid, aid, "t4", rid="r4")  # the agent never gets it
    held = followed(old)  # a1; t1, t2, t3, t4
    held[3].value.task.status.executor_id = "t3.earlier-run"  # an earlier run of a task id
    new = MasterCore("m2", 8, recovered_registry=old.registry_document(),
                     followed=held, now=T0 + 100)
    assert new.held.keys() == {aid}
    # The new leader's stream starts with them as they were: subscribers keep theirs.
    first = {e.key: e for e in new.snapshot_entries()}
    assert [first[e.key] for e in held[1:]] == held[1:]
    # Its agent too, RECOVERING: not offered, its tasks still counted (the allocator's).
    recovering = first[f"agents/{aid}"].value.agent
    assert recovering.status == state_pb2.AgentRecord.Status.AGENT_STATUS_RECOVERING
    assert recovering.agent_info == held[0].value.agent.agent_info
    new.validate()
    cmds = reregister(new, b"a1-new", aid, [reported(fid, "t1", TS.TASK_RUNNING),
                                            reported(fid, "t2", TS.TASK_FINISHED),
                                            reported(fid, "t3", TS.TASK_RUNNING)],
                      frameworks=[old.frameworks[fid].info], now=T0 + 101)
    # Published: what changed (the agent's word), not the record taken back whole.
    changed = {e.key: e for p in only(cmds, Publish) for e in p.entries}
    assert f"tasks/{fid}/t1" not in changed
    assert changed[f"tasks/{fid}/t2"].value.task.status.state == TS.TASK_FINISHED
    assert changed[f"tasks/{fid}/t3"].value.task.launched_at_us == int((T0 + 101) * 1e6)
    assert changed[f"tasks/{fid}/t4"].deleted
    assert changed[f"agents/{aid}"].value.agent.status == REGISTERED
    stream = first | changed  # what a subscriber holds now: as if all were published
    assert {e.key: e for e in new.snapshot_entries()} == {
        k: e for k, e in stream.items() if not e.deleted}
    t1 = new.tasks[(fid, "t1")]
    assert t1.record() == old.tasks[(fid, "t1")].record()
    assert (t1.launched_at, t1.traceparent, t1.offer_ids) == (T0, "00-tp", ("o1",))
    assert t1.status.uuid == b"t1-run"  # the agent's resend of it is a retry, not news
    t2, t3 = new.tasks[(fid, "t2")], new.tasks[(fid, "t3")]
    assert t2.state == TS.TASK_FINISHED and t2.launched_at == T0 + 101  # the agent's word
    assert t3.traceparent == "" and t3.launched_at == T0 + 101  # not the same run
    assert new.tasks_held_back == 1 and not new.held
    new.validate()


def test_held_records_of_an_agent_not_back_go_with_its_window() -> None:
    old, aid, fid = cluster()
    running(old, aid, fid, "t1")
    new = MasterCore("m2", 8, recovered_registry=old.registry_document(),
                     followed=followed(old),
                     agent_reregister_window_s=60, now=T0 + 100)
    assert f"tasks/{fid}/t1" in {e.key for e in new.snapshot_entries()}
    cmds = new.tick(T0 + 161)
    assert not new.held and new.agents[aid].status == 2  # UNREACHABLE
    assert (fid, "t1") not in new.tasks
    assert f"tasks/{fid}/t1" in published(cmds)  # off the stream: not known here
    assert published(cmds)[f"tasks/{fid}/t1"] is None
    assert published(cmds)[f"agents/{aid}"].agent.status == UNREACHABLE
    new.validate()


def test_an_agent_reregistering_as_the_registry_has_it_writes_no_registry() -> None:
    """After a failover every agent re-registers at once: one whose registry entry stays as
    it was (registered, same hostname and principal) costs no registry write, or the new
    leader would rewrite the whole document once per agent during the storm (issue 8)."""
    old, aid, fid = cluster()
    running(old, aid, fid, "t1")
    doc = old.registry_document()
    new = MasterCore("m2", 8, recovered_registry=doc, now=T0 + 100)
    def back(core: MasterCore, hostname: str) -> list[Command]:
        call = agent_pb2.AgentCall(agent_id=aid, reregister=agent_pb2.AgentCall.Reregister(
            agent_info=agent_info(aid, hostname), tasks=[reported(fid, "t1", TS.TASK_RUNNING)],
            frameworks=[old.frameworks[fid].info]))
        return core.agent_call(b"a1-new", call, T0 + 101)

    assert old.agents[aid].info.hostname == "a1"
    cmds = back(new, "a1")
    assert agent_events(cmds, "reregistered")
    assert registry(cmds) is None, registry(cmds)
    # The document the new leader would write is the one it recovered, since_us included.
    assert new.registry_document()["agents"] == doc["agents"]
    assert published(cmds)[f"agents/{aid}"].agent.status == 1  # REGISTERED
    new.validate()
    # A different hostname under the same id is a change, and is written.
    other = MasterCore("m3", 9, recovered_registry=doc, now=T0 + 100)
    cmds = back(other, "h2")
    assert registry(cmds)["agents"][aid]["hostname"] == "h2"  # type: ignore[index]
    other.validate()


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
    assert new.failover_deadline(new.frameworks[fid]) == T0 + 160  # the window, not "now"
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


def test_a_subscribe_sent_again_before_its_answer_came_is_answered_again() -> None:
    # The driver resends Subscribe when no Subscribed came in time (0.1 s at first); a master
    # slower than that answered the first and refused the second ("already subscribed as
    # framework F1"), an Error the driver takes as fatal: the framework aborted (bench.scale
    # at 10k-50k agents, "no Subscribed on connection 1", then nothing for 120 s).
    core = cluster()[0]
    first = subscribe(core, b"new")
    fid = one(first, ToFramework).event.subscribed.framework_id
    again = subscribe(core, b"new")
    (answer,) = only(again, ToFramework)
    assert answer.event.WhichOneof("event") == "subscribed", answer.event
    assert answer.event.subscribed.framework_id == fid
    assert sum(f.info.name == "new" for f in core.frameworks.values()) == 1
    # Another framework's id on that connection is still refused.
    other = subscribed(core, b"other")
    assert one(subscribe(core, b"new", framework_id=other), ToFramework).event.error.message
    core.validate()


def test_teardown_shuts_down_on_agents_and_forgets_the_framework() -> None:
    core, aid, fid = cluster()
    running(core, aid, fid, "t1")
    cmds = sched(core, b"f1", fid, teardown=Call.Teardown())
    assert agent_events(cmds, "shutdown_framework")
    assert fid not in core.frameworks and not core.tasks
    core.validate()


def _reign(old: MasterCore) -> MasterCore:
    """A new leader holding `old`'s records as a standby followed them (its own copies)."""
    held = [bus_pb2.StateEntry.FromString(e.SerializeToString()) for e in followed(old)]
    return MasterCore("m2", 8, recovered_registry=old.registry_document(), followed=held,
                      now=T0 + 100)


def test_a_report_with_its_held_records_digest_takes_them_whole_as_reading_it_would() -> None:
    """An agent re-registering after a failover with the same tasks, in the same states,
    as the new leader followed gives their digest: its records are taken back whole without
    its report read task by task (issue 8 d), and the new leader is left exactly as reading
    the report would leave it."""
    old, aid, fid = cluster()
    running(old, aid, fid, "t1", "t2", "t3")
    report = [reported(fid, t, TS.TASK_RUNNING) for t in ("t1", "t2", "t3")]
    results = []
    for digest in (False, True):
        new = _reign(old)
        cmds = reregister(new, b"a1-new", aid, report, frameworks=[old.frameworks[fid].info],
                          now=T0 + 101, digest=digest)
        new.validate()
        assert new.tasks_held_back == 3 and not new.held
        assert new.reports_taken_whole == digest
        assert not [k for k in published(cmds) if k.startswith("tasks/")]
        [done] = [c for c in cmds if isinstance(c, Notice) and c.kind == "agents_recovered"]
        assert dict(done.facts)["reports_taken_whole"] == digest  # the one difference
        rest = [c for c in cmds if c is not done]
        results.append((rest, new.snapshot_entries(),
                        {k: t.record() for k, t in new.tasks.items()},
                        new.agents[aid].used, new.frameworks[fid].used))
    assert results[0] == results[1]


def test_a_report_whose_digest_differs_is_read_task_by_task() -> None:
    """A task that ended while no master led, one the agent never got, or another run of a
    task id: the report's digest is not the held records', and the agent's word is taken
    for each, as without a digest."""
    old, aid, fid = cluster()
    running(old, aid, fid, "t1", "t2")
    cases = {
        "ended": [reported(fid, "t1", TS.TASK_RUNNING), reported(fid, "t2", TS.TASK_FINISHED)],
        "missing": [reported(fid, "t1", TS.TASK_RUNNING)],
        "more": [reported(fid, t, TS.TASK_RUNNING) for t in ("t1", "t2", "t3")],
        "other run": [reported(fid, "t1", TS.TASK_RUNNING), reported(fid, "t2", TS.TASK_RUNNING)],
    }
    cases["other run"][1].executor_id = "t2.another-run"
    for name, report in cases.items():
        outcomes = []
        for digest in (False, True):
            new = _reign(old)
            cmds = reregister(new, b"a1-new", aid, report,
                              frameworks=[old.frameworks[fid].info], now=T0 + 101, digest=digest)
            new.validate()
            assert new.reports_taken_whole == 0, name
            outcomes.append((cmds, new.snapshot_entries()))
        assert outcomes[0] == outcomes[1], name


def test_a_digest_that_matches_is_refused_whole_for_a_removed_framework() -> None:
    """The digest says the tasks are the same; a framework removed since still has its tasks
    shut down, not taken back."""
    old, aid, fid = cluster()
    running(old, aid, fid, "t1")
    new = _reign(old)
    new.removed_frameworks[fid] = None
    cmds = reregister(new, b"a1-new", aid, [reported(fid, "t1", TS.TASK_RUNNING)],
                      now=T0 + 101, digest=True)
    assert new.reports_taken_whole == 0
    assert agent_events(cmds, "shutdown_framework")
    assert (fid, "t1") not in new.tasks


def test_the_last_agent_back_after_a_failover_is_logged_with_what_was_taken_back() -> None:
    """An operator watching a failover sees when every agent is back, how long it took, and
    how many records came back whole (a line per agent would be 10,000 lines)."""
    old, aid, fid = cluster()
    running(old, aid, fid, "t1", "t2")
    new = _reign(old)
    report = [reported(fid, t, TS.TASK_RUNNING) for t in ("t1", "t2")]
    cmds = reregister(new, b"a1-new", aid, report, frameworks=[old.frameworks[fid].info],
                      now=T0 + 103, digest=True)
    [done] = [c for c in cmds if isinstance(c, Notice) and c.kind == "agents_recovered"]
    assert done.level == "info"
    assert dict(done.facts) == {"agents": 1, "tasks_held_back": 2, "reports_taken_whole": 1,
                                "seconds": 3.0}
    again = reregister(new, b"a1-new", aid, [], now=T0 + 104)  # recovering no more: no line
    assert not [c for c in again if isinstance(c, Notice) and c.kind == "agents_recovered"]
