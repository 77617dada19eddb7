"""The agent core's cluster identity, container decisions and timers (pure, no Docker): the
cluster id adopted from the first master and checkpointed before any launch, a master of
another cluster refused (no launch, no forwarding, no cleanup), orphans decided once the
cluster is confirmed (only this cluster's and agent's containers no executor owns), a gone
executor's containers stopped (with retries) before its task is reported, and next_deadline:
the shell may sleep until it (hypothesis: before it tick() does nothing, at it something)."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from schemas import agent_pb2, common_pb2
from services.agent import core as agent_core
from services.agent import executors
from services.agent.core import (
    AgentCore,
    Command,
    LaunchExecutor,
    LeaveMaster,
    Registration,
    RemoveContainers,
    SaveClusterId,
    ScanContainers,
    StopContainers,
    ToExecutor,
    ToMaster,
)
from services.executor.runtime import LABEL_AGENT, LABEL_CLUSTER, LABEL_EXECUTOR, Handle
from services.notice import Notice
from tests.agent.test_agent_core import (
    ack_all,
    durable,
    info,
    registered,
    run_task,
    subscribe,
    update,
)

S = common_pb2.TaskState


def reply(core: AgentCore, cluster_id: str, now: float = 0.0) -> list[Command]:
    """A (re-)registration answer from a master of `cluster_id`."""
    core.master_detected(now)
    ev = agent_pb2.AgentEvent()
    ev.reregistered.agent_id = core.agent_id or "S1"
    ev.reregistered.master_epoch = 9
    ev.reregistered.cluster_id = cluster_id
    return durable(core, core.master_event(ev, now), now)


def handle(cluster: str | None, agent: str, executor: str) -> Handle:
    labels = {LABEL_AGENT: agent, LABEL_EXECUTOR: executor}
    if cluster is not None:
        labels[LABEL_CLUSTER] = cluster
    return Handle("docker", f"id-{cluster}-{agent}-{executor}", f"c-{executor}", labels)


def forwarded(cmds: list[Command]) -> list[common_pb2.TaskStatus]:
    return [u.status for c in cmds if isinstance(c, ToMaster)
            for u in c.call.status_updates.updates]


def test_first_master_names_the_cluster_checkpointed_before_any_launch() -> None:
    core = AgentCore(info(), now=0.0)
    cmds = registered(core, cluster_id="C1")
    assert SaveClusterId("C1") in cmds and core.cluster_id == "C1"
    [scan] = [c for c in cmds if isinstance(c, ScanContainers)]
    assert dict(scan.labels) == {LABEL_CLUSTER: "C1", LABEL_AGENT: "S1"}
    [launch] = [c for c in run_task(core, "t1") if isinstance(c, LaunchExecutor)]
    assert launch.cluster_id == "C1", "the executor labels its container with it"
    # Re-registration (another master of the same cluster): no second scan, no new save.
    again = reply(core, "C1", 1.0)
    assert not [c for c in again if isinstance(c, ScanContainers | SaveClusterId)]


def test_a_master_of_another_cluster_is_refused() -> None:
    core = AgentCore(info(), now=0.0, cluster_id="C1")
    registered(core, cluster_id="C1")
    ex_id = next(c for c in run_task(core, "t1") if isinstance(c, LaunchExecutor)).executor_id
    subscribe(core, ex_id)
    ack_all(core, 0.5)
    cmds = reply(core, "C2", 1.0)
    notices = [c for c in cmds if isinstance(c, Notice)]
    assert [n.kind for n in notices] == ["cluster_mismatch"] and notices[0].level == "error"
    assert notices[0].fields()["master_cluster_id"] == "C2"
    assert any(isinstance(c, LeaveMaster) for c in cmds)
    assert not [c for c in cmds if isinstance(c, ScanContainers | SaveClusterId)]
    assert core.registration is Registration.REFUSED and core.cluster_id == "C1"
    assert core.cluster_mismatches == 1
    # Nothing launched for it, nothing forwarded to it (updates wait, checkpointed).
    assert not [c for c in run_task(core, "t2") if isinstance(c, LaunchExecutor)]
    _, cmds = update(core, ex_id, "t1", S.TASK_RUNNING, 2.0)
    assert forwarded(cmds + durable(core, core.tick(3.0), 3.0)) == []
    assert core.master_error(3, 3.0) == [] and core.next_deadline() is None
    # A master of our own cluster, later: registered, and the update goes out.
    cmds = reply(core, "C1", 4.0)
    assert core.registration is Registration.REGISTERED
    assert [s.state for s in forwarded(cmds)] == [S.TASK_RUNNING]


def test_no_cleanup_while_the_cluster_is_unknown() -> None:
    core = AgentCore(info(), now=0.0)
    cmds = registered(core, cluster_id="")
    assert [c.kind for c in cmds if isinstance(c, Notice)] == ["master_without_cluster_id"]
    assert not [c for c in cmds if isinstance(c, ScanContainers)]
    assert core.orphans([handle("", "S1", "ghost"), handle(None, "S1", "g")]) == []


def test_orphans_are_this_clusters_and_agents_containers_no_executor_owns() -> None:
    core = AgentCore(info(), now=0.0, cluster_id="C1")
    cmds = registered(core, cluster_id="C1")
    assert [c for c in cmds if isinstance(c, ScanContainers)]
    known = next(c for c in run_task(core, "t1") if isinstance(c, LaunchExecutor)).executor_id
    found = [handle("C1", "S1", "ghost"), handle("C1", "S1", known), handle("C2", "S1", "x"),
             handle(None, "S1", "y"), handle("C1", "S9", "z")]
    cmds = durable(core, core.containers_found(found, "", 1.0), 1.0)
    [remove] = [c for c in cmds if isinstance(c, RemoveContainers)]
    assert [h.labels[LABEL_EXECUTOR] for h in remove.handles] == ["ghost"]
    assert core.containers_found(found, "", 2.0) == [], "one scan per agent process"
    [note] = core.orphans_removed(["c-ghost"], [])
    assert note.kind == "orphans_removed"


def test_a_gone_executors_containers_are_stopped_with_retries_before_the_report() -> None:
    core = AgentCore(info(), now=0.0)
    registered(core, cluster_id="C1")
    ex_id = next(c for c in run_task(core, "t1") if isinstance(c, LaunchExecutor)).executor_id
    subscribe(core, ex_id)
    update(core, ex_id, "t1", S.TASK_RUNNING)
    durable(core, core.tick(1.0), 1.0)
    ack_all(core, 1.0)
    [stop] = durable(core, core.executor_exited(ex_id, 2.0), 2.0)
    assert isinstance(stop, StopContainers)
    assert core.executor_exited(ex_id, 2.1) == [], "once"
    now = 2.0
    for attempt in range(1, executors.STOP_ATTEMPTS):
        cmds = durable(core, core.containers_stopped(ex_id, [], "engine down", now), now)
        assert [c.kind for c in cmds if isinstance(c, Notice)] == ["container_stop_failed"]
        assert core.executors[ex_id].state == S.TASK_RUNNING, "not reported yet"
        deadline = core.next_deadline()
        assert deadline == now + min(2.0 ** (attempt - 1), executors.STOP_RETRY_MAX_S)
        assert not [c for c in core.tick(deadline - 0.01) if isinstance(c, StopContainers)]
        [again] = [c for c in durable(core, core.tick(deadline), deadline)
                   if isinstance(c, StopContainers)]
        assert again == stop
        now = deadline
    cmds = durable(core, core.containers_stopped(ex_id, [], "engine down", now), now)
    assert "container_stop_abandoned" in [c.kind for c in cmds if isinstance(c, Notice)]
    [failed] = forwarded(durable(core, core.tick(now), now))
    assert failed.state == S.TASK_FAILED and "could not be stopped" in failed.message


def test_registration_retry_and_executor_timeouts_are_deadlines() -> None:
    core = AgentCore(info(), now=0.0)
    core.master_detected(0.0)
    retry = core.next_deadline()
    assert retry is not None and 0.0 < retry <= 0.5  # a refused or lost Register: retry soon
    assert core.tick(retry - 0.01) == []
    assert isinstance(core.tick(retry)[0], ToMaster)
    registered(core, 2.0)
    ex_id = next(c for c in run_task(core, "t1", 2.0) if isinstance(c, LaunchExecutor)).executor_id
    assert core.next_deadline() == 2.0 + agent_core.EXECUTOR_REGISTRATION_TIMEOUT_S
    [stop] = durable(core, core.tick(core.next_deadline() or 0.0), 40.0)
    assert isinstance(stop, StopContainers) and stop.executor_id == ex_id
    # An executor that subscribes after it was given up on is told to stop, not launched.
    events = [c.event.WhichOneof("event") for c in subscribe(core, ex_id)
              if isinstance(c, ToExecutor)]
    assert events == ["shutdown"]


OPS = st.sampled_from(["run", "subscribe", "running", "exit", "stopped", "stop_failed",
                       "ack", "lost", "detected", "registered", "wait"])


@settings(max_examples=150, deadline=None)
@given(ops=st.lists(st.tuples(OPS, st.floats(0.0, 3.0)), max_size=30))
def test_tick_has_work_exactly_from_next_deadline(ops: list[tuple[str, float]]) -> None:
    """Whatever happened, tick() before next_deadline() gives nothing, and at it something:
    the shell can re-arm one timer from next_deadline instead of polling."""
    core = AgentCore(info(), now=0.0)
    now, n = 0.0, 0
    for op, dt in ops:
        now += dt
        execs = [e for e in core.executors.values() if not e.exited]
        stopping = [e for e in core.executors.values() if e.stopping and e.stop_retry_at is None]
        if op == "run" and core.registration is Registration.REGISTERED:
            n += 1
            run_task(core, f"t{n}", now)
        elif op == "subscribe" and execs:
            subscribe(core, execs[0].executor_id, peer=execs[0].executor_id.encode())
        elif op == "running" and execs and execs[0].peer is not None:
            update(core, execs[0].executor_id, execs[0].task_id, S.TASK_RUNNING, now)
        elif op == "exit" and execs:
            durable(core, core.executor_exited(execs[-1].executor_id, now), now)
        elif op in ("stopped", "stop_failed") and stopping:
            error = "boom" if op == "stop_failed" else ""
            durable(core, core.containers_stopped(stopping[0].executor_id, [], error, now), now)
        elif op == "ack":
            ack_all(core, now)
        elif op == "lost":
            core.master_lost(now)
        elif op == "detected":
            core.master_detected(now)
        elif op == "registered":
            registered(core, now, cluster_id="C1")
        core.validate()
        deadline = core.next_deadline()
        if deadline is None or deadline <= now:
            durable(core, core.tick(now), now)  # due now: the shell's timer fires at once
            continue
        assert durable(core, core.tick(deadline - 1e-6), deadline - 1e-6) == [], (
            f"work before the deadline {deadline}")
        now = deadline
        assert durable(core, core.tick(now), now), f"nothing to do at the deadline {deadline}"
