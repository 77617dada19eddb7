"""Agent loss in the master's pure core (issue 10): an agent silent for the agent timeout is
unreachable, but only on evidence read after the deadline and never because the master itself
stalled; one that returns is reconciled, not killed; one unreachable for the gone timeout is
gone for good; and gone agents are pruned to a bound."""

from __future__ import annotations

from schemas import agent_pb2, bus_pb2, common_pb2, operator_pb2
from services.master.commands import Command, ToFramework
from services.master.core import MasterCore
from services.master.records import GONE, REGISTERED, UNREACHABLE
from tests.master.helpers import (
    T0,
    TS,
    Call,
    agent_events,
    cluster,
    launch,
    only,
    operator,
    published,
    register,
    registry,
    rejects,
    reported,
    reregister,
    running,
    statuses,
    subscribed,
    update,
)

R = common_pb2.TaskStatus.Reason
STEP = 0.5  # how often the shell's liveness reports come, in these tests


def reports(core: MasterCore, start: float, end: float, alive: tuple[bytes, ...] = (),
            ) -> list[Command]:
    """Liveness reports every STEP from `start` to `end` (inclusive): the `alive` peers were
    heard just before each one, every other agent was silent."""
    out: list[Command] = []
    t = start
    while t <= end + 1e-9:
        out += core.agents_heard({p: t - 0.1 for p in alive}, t)
        core.validate()
        t += STEP
    return out  # (helpers.silence does the same from where the last report left off)


def failures(cmds: list[Command]) -> set[str]:
    return {c.framework_id for c in only(cmds, ToFramework)
            if c.event.WhichOneof("event") == "failure"}


def status_of(core: MasterCore, aid: str) -> int:
    return core.agents[aid].status


# -- unreachable -----------------------------------------------------------------------------


def test_a_silent_agent_is_unreachable_after_the_timeout_and_not_before() -> None:
    core = MasterCore("m1", 7, agent_timeout_s=5.0, now=T0)
    aid = register(core, b"a1")
    pa = subscribed(core, b"f1", pa=True)
    plain = subscribed(core, b"f2")
    running(core, aid, pa, "t1")
    launch(core, plain, aid, "t2", rid="r2")
    assert not statuses(reports(core, T0 + 0.5, T0 + 4.5))
    assert status_of(core, aid) == REGISTERED
    cmds = reports(core, T0 + 5.0, T0 + 5.0)
    assert status_of(core, aid) == UNREACHABLE
    (pa_st,) = statuses(cmds, pa)
    (plain_st,) = statuses(cmds, plain)
    assert pa_st.state == TS.TASK_UNREACHABLE and plain_st.state == TS.TASK_LOST
    assert pa_st.reason == plain_st.reason == R.REASON_AGENT_UNREACHABLE
    assert pa_st.unreachable_since_us == int((T0 + 5) * 1e6)
    assert failures(cmds) == {pa, plain}
    assert registry(cmds)["agents"][aid]["status"] == "unreachable"  # type: ignore[index]
    assert published(cmds)[f"agents/{aid}"].agent.status == UNREACHABLE
    # Stored as UNREACHABLE either way; resources stay counted until it is back or gone.
    assert core.tasks[(plain, "t2")].state == TS.TASK_UNREACHABLE and core.agents[aid].used


def test_heartbeats_and_calls_keep_an_agent_registered() -> None:
    core = MasterCore("m1", 7, agent_timeout_s=5.0, now=T0)
    a1, a2 = register(core, b"a1"), register(core, b"a2")
    fid = subscribed(core, b"f1", pa=True)
    running(core, a2, fid)
    reports(core, T0 + 0.5, T0 + 30, alive=(b"a1",))
    assert status_of(core, a1) == REGISTERED and status_of(core, a2) == UNREACHABLE
    # Any call counts as a sign of life, too.
    a3 = register(core, b"a3", now=T0 + 30)
    for k in range(1, 20):
        update(core, b"a3", a3, fid, "nope", TS.TASK_RUNNING, now=T0 + 30 + k)
        core.agents_heard({}, T0 + 30 + k)
    assert status_of(core, a3) == REGISTERED


def test_the_bus_losing_an_agent_connection_does_not_override_the_agent_timeout() -> None:
    """The timeout is the master's option: the bus's own peer expiry (5 missed heartbeats)
    is not a second, shorter one."""
    core = MasterCore("m1", 7, agent_timeout_s=10.0, now=T0)
    aid = register(core, b"a1")
    core.peer_gone(b"a1", T0 + 5)
    reports(core, T0 + 5, T0 + 9.5)
    assert status_of(core, aid) == REGISTERED
    reports(core, T0 + 10, T0 + 10)
    assert status_of(core, aid) == UNREACHABLE


def test_the_deadline_is_a_timer_but_only_evidence_read_after_it_condemns() -> None:
    """tick() at an agent's deadline does not condemn it on its own: its heartbeats may sit
    unread in the socket (a busy reactor runs timers first). The next liveness report, made
    after the socket was drained, decides."""
    core = MasterCore("m1", 7, agent_timeout_s=5.0, now=T0)
    aid = register(core, b"a1")
    reports(core, T0 + 0.5, T0 + 4.5)
    assert core.next_deadline() == T0 + 5.0
    assert not core.awaiting_report
    assert not core.tick(T0 + 5.0) and status_of(core, aid) == REGISTERED
    deadline = core.next_deadline()
    assert deadline is None or deadline > T0 + 5.0  # waits for a report, does not spin
    assert core.awaiting_report  # ... which the shell makes at once
    core.agents_heard({b"a1": T0 + 4.9}, T0 + 5.1)  # it had beaten: the beat was queued
    assert status_of(core, aid) == REGISTERED and not core.awaiting_report
    assert core.next_deadline() == T0 + 9.9
    reports(core, T0 + 5.5, T0 + 9.5)
    assert status_of(core, aid) == REGISTERED
    # A report that could not drain the socket is no evidence either.
    core.agents_heard({}, T0 + 10.0, complete=False)
    assert status_of(core, aid) == REGISTERED
    core.agents_heard({}, T0 + 10.2)
    assert status_of(core, aid) == UNREACHABLE


def test_a_stalled_master_gives_agents_a_fresh_grace_instead_of_condemning_them() -> None:
    """No false positives under load: when the master itself was not listening (no liveness
    report for far longer than they come), silence over that gap is not the agents' fault."""
    core = MasterCore("m1", 7, agent_timeout_s=5.0, heartbeat_interval_ms=1000, now=T0)
    a1, a2 = register(core, b"a1"), register(core, b"a2")
    reports(core, T0 + 0.5, T0 + 2.0, alive=(b"a1", b"a2"))
    cmds = core.agents_heard({b"a2": T0 + 19.9}, T0 + 20.0)  # 18 s stall; only a2 was read
    assert status_of(core, a1) == REGISTERED and status_of(core, a2) == REGISTERED
    assert any(getattr(c, "kind", "") == "master_stalled" for c in cmds)
    # a1 really is dead: it goes unreachable one full timeout after the master woke up.
    reports(core, T0 + 20.5, T0 + 24.5, alive=(b"a2",))
    assert status_of(core, a1) == REGISTERED
    reports(core, T0 + 25.0, T0 + 25.5, alive=(b"a2",))
    assert status_of(core, a1) == UNREACHABLE and status_of(core, a2) == REGISTERED


# -- coming back -----------------------------------------------------------------------------


def test_an_agent_back_within_the_gone_timeout_is_reconciled_not_killed() -> None:
    core, aid, fid = cluster(pa=True)
    plain = subscribed(core, b"f2")
    running(core, aid, fid, "t1")
    launch(core, plain, aid, "t2", rid="r2")
    update(core, b"a1", aid, plain, "t2", TS.TASK_RUNNING, uuid=b"t2-run")
    reports(core, T0 + 0.5, T0 + 5.0)
    assert status_of(core, aid) == UNREACHABLE
    cmds = reregister(core, b"a1", aid, [reported(fid, "t1", TS.TASK_RUNNING),
                                         reported(plain, "t2", TS.TASK_RUNNING)], now=T0 + 9)
    assert agent_events(cmds, "reregistered") and status_of(core, aid) == REGISTERED
    # The partition-aware framework was told UNREACHABLE: it is told RUNNING again.
    (st,) = statuses(cmds, fid)
    assert (st.task_id, st.state, st.reason) == ("t1", TS.TASK_RUNNING,
                                                 R.REASON_AGENT_REREGISTERED)
    assert not st.uuid  # the master's word, nothing for the agent to expect an ack for
    assert core.tasks[(fid, "t1")].state == TS.TASK_RUNNING
    # Mesos's rule for the others: told TASK_LOST, so the task must not come back to life.
    kills = agent_events(cmds, "kill_task")
    assert [(k.event.kill_task.framework_id, k.event.kill_task.task_id) for k in kills] == [
        (plain, "t2")]
    core.validate()


def test_an_unreachable_agent_heard_again_on_its_old_connection_is_asked_to_reregister(
) -> None:
    core, aid, fid = cluster(pa=True)
    running(core, aid, fid, "t1")
    reports(core, T0 + 0.5, T0 + 5.0)
    assert status_of(core, aid) == UNREACHABLE
    # Its old heartbeats (from before it was declared) prove nothing new: no prompt.
    assert not rejects(core.agents_heard({b"a1": T0 - 1}, T0 + 5.5))
    (ask,) = rejects(core.agents_heard({b"a1": T0 + 5.9}, T0 + 6.0))
    assert ask.peer == b"a1" and ask.code == bus_pb2.NOT_REGISTERED
    assert aid in ask.message
    assert not rejects(core.agents_heard({b"a1": T0 + 6.4}, T0 + 6.5))  # once a heartbeat
    assert rejects(core.agents_heard({b"a1": T0 + 7.4}, T0 + 7.5))
    cmds = reregister(core, b"a1", aid, [reported(fid, "t1", TS.TASK_RUNNING)], now=T0 + 7.6)
    assert agent_events(cmds, "reregistered")
    assert [s.state for s in statuses(cmds, fid)] == [TS.TASK_RUNNING]
    assert not rejects(core.agents_heard({b"a1": T0 + 8.0}, T0 + 8.1))
    core.validate()


# -- gone ------------------------------------------------------------------------------------


def test_unreachable_past_the_gone_timeout_is_gone_and_may_not_come_back() -> None:
    core = MasterCore("m1", 7, agent_timeout_s=5.0, agent_gone_timeout_s=60.0, now=T0)
    aid = register(core, b"a1")
    pa = subscribed(core, b"f1", pa=True)
    plain = subscribed(core, b"f2")
    running(core, aid, pa, "t1")
    launch(core, plain, aid, "t2", rid="r2")
    reports(core, T0 + 0.5, T0 + 5.0)
    assert core.next_deadline() == T0 + 65.0
    assert not statuses(core.tick(T0 + 64.9)) and status_of(core, aid) == UNREACHABLE
    cmds = core.tick(T0 + 65.0)
    assert status_of(core, aid) == GONE
    (pa_st,) = statuses(cmds, pa)
    (plain_st,) = statuses(cmds, plain)
    assert (pa_st.state, pa_st.reason) == (TS.TASK_GONE, R.REASON_AGENT_REMOVED)
    assert plain_st.state == TS.TASK_LOST
    assert not core.agents[aid].used and not core.agents[aid].tasks
    assert registry(cmds)["agents"][aid]["status"] == "gone"  # type: ignore[index]
    cmds = reregister(core, b"a1", aid, [reported(pa, "t1", TS.TASK_RUNNING)], now=T0 + 70)
    assert agent_events(cmds, "shutdown") and rejects(cmds)
    assert status_of(core, aid) == GONE
    core.validate()


def test_the_gone_clock_survives_a_master_failover() -> None:
    old = MasterCore("m1", 7, agent_timeout_s=5.0, now=T0)
    aid = register(old, b"a1")
    reports(old, T0 + 0.5, T0 + 5.0)
    new = MasterCore("m2", 8, agent_gone_timeout_s=60.0,
                     recovered_registry=old.registry_document(), now=T0 + 30)
    assert new.agents[aid].status == UNREACHABLE
    assert new.next_deadline() == T0 + 65.0
    new.tick(T0 + 65.0)
    assert new.agents[aid].status == GONE
    new.validate()


def test_an_agent_back_on_its_old_connection_after_it_is_gone_is_asked_and_refused() -> None:
    core = MasterCore("m1", 7, agent_timeout_s=5.0, agent_gone_timeout_s=20.0, now=T0)
    aid = register(core, b"a1")
    reports(core, T0 + 0.5, T0 + 5.0)
    core.tick(T0 + 25.0)
    assert status_of(core, aid) == GONE
    (ask,) = rejects(core.agents_heard({b"a1": T0 + 25.9}, T0 + 26.0))
    assert ask.code == bus_pb2.NOT_REGISTERED
    cmds = reregister(core, b"a1", aid, [], now=T0 + 26.1)
    assert agent_events(cmds, "shutdown")
    assert not rejects(core.agents_heard({b"a1": T0 + 29.9}, T0 + 30.0))  # told: not asked
    core.validate()


# -- pruning ---------------------------------------------------------------------------------


def _gone_ids(core: MasterCore) -> list[str]:
    return sorted(a for a, rec in core.agents.items() if rec.status == GONE)


def test_gone_agents_are_pruned_oldest_first_to_the_bound() -> None:
    core = MasterCore("m1", 7, max_gone_agents=2, now=T0)
    ids = [register(core, f"a{i}".encode()) for i in range(4)]
    pruned: dict[str, object] = {}
    for i, aid in enumerate(ids):
        cmds = core.agent_call(f"a{i}".encode(), _unregister(aid), T0 + 10 + i)
        pruned.update(published(cmds))
        assert registry(cmds) is not None
        agents = core.registry_document()["agents"]
        assert sum(1 for e in agents.values() if e["status"] == "gone") <= 2  # type: ignore
        core.validate()
    assert _gone_ids(core) == sorted(ids[2:])
    assert pruned[f"agents/{ids[0]}"] is None and pruned[f"agents/{ids[1]}"] is None
    assert set(core.registry_document()["agents"]) == set(ids[2:])  # type: ignore[call-overload]
    # A pruned agent is unknown, as in Mesos after the registry forgot it (TASK_UNKNOWN).
    fid = subscribed(core, b"f1", pa=True, now=T0 + 20)
    cmds = core.scheduler_call(b"f1", _reconcile(fid, ids[0]), "m", T0 + 20)
    assert [s.state for s in statuses(cmds)] == [TS.TASK_UNKNOWN]


def test_a_recovered_registry_over_the_bound_is_pruned() -> None:
    doc = {"cluster_id": "c", "frameworks": {}, "roles": {},
           "agents": {f"S{i}": {"status": "gone", "hostname": f"h{i}",
                                "since_us": int((T0 + i) * 1e6)} for i in range(5)}}
    doc["agents"]["S9"] = {"status": "unreachable", "hostname": "h9",  # type: ignore[index]
                           "since_us": int(T0 * 1e6)}
    core = MasterCore("m2", 8, max_gone_agents=3, recovered_registry=doc, now=T0 + 10)
    assert _gone_ids(core) == ["S2", "S3", "S4"]
    assert core.agents["S9"].status == UNREACHABLE  # never pruned while it may come back
    cmds = core.tick(T0 + 10)
    assert registry(cmds) == {"agents": {"S0": None, "S1": None}}  # only what changed
    assert set(core.registry_document()["agents"]) == {"S2", "S3", "S4", "S9"}  # type: ignore
    core.validate()


def test_mark_agent_gone_by_an_operator_counts_towards_the_bound() -> None:
    core = MasterCore("m1", 7, agent_timeout_s=5.0, max_gone_agents=1, now=T0)
    a1, a2 = register(core, b"a1"), register(core, b"a2")
    reports(core, T0 + 0.5, T0 + 5.0)
    for aid in (a1, a2):
        operator(core, b"op", now=T0 + 6, mark_agent_gone=operator_pb2.OperatorCall
                 .MarkAgentGone(agent_id=aid))
    assert _gone_ids(core) == [a2] and a1 not in core.agents
    core.validate()


def _unregister(aid: str) -> agent_pb2.AgentCall:
    return agent_pb2.AgentCall(agent_id=aid, unregister=agent_pb2.AgentCall.Unregister(
        reason="drain"))


def _reconcile(fid: str, aid: str) -> Call:
    return Call(framework_id=fid, reconcile=Call.Reconcile(tasks=[Call.Reconcile.Task(
        task_id="x", agent_id=aid)]))
