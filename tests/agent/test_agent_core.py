"""The agent's pure core: registration, launching each task once, executors subscribing,
the status update path (checkpoint before ack, forward, end), kills, executor deaths,
reconciliation, and recovery from its own checkpoint after a restart."""

from __future__ import annotations

import uuid

from schemas import agent_pb2, bus_pb2, common_pb2, executor_pb2
from services import report_digest
from services.agent import status_updates as su
from services.agent.core import (
    AgentCore,
    Command,
    LaunchExecutor,
    Registration,
    SaveAgentId,
    SaveState,
    StopContainers,
    ToExecutor,
    ToMaster,
)
from services.executor.runtime import LABEL_AGENT, LABEL_EXECUTOR
from services.resources import Resources

S = common_pb2.TaskState
FW = "F1"


def info() -> common_pb2.AgentInfo:
    i = common_pb2.AgentInfo(hostname="vm-1")
    i.resources.extend(Resources.parse("cpus:2;mem:1024").to_proto())
    return i


def durable(core: AgentCore, cmds: list[Command], now: float) -> list[Command]:
    """Play the shell's disk: make every Checkpoint durable, return the other commands."""
    out: list[Command] = []
    queue = list(cmds)
    while queue:
        cmd = queue.pop(0)
        if isinstance(cmd, su.Checkpoint):
            queue += core.checkpointed(cmd.record, now)
        else:
            out.append(cmd)
    core.validate()
    return out


def registered(core: AgentCore, now: float = 0.0, cluster_id: str = "C1") -> list[Command]:
    cmds = core.master_detected(now)
    assert isinstance(cmds[0], ToMaster) and cmds[0].call.WhichOneof("call") in (
        "register", "reregister")
    ev = agent_pb2.AgentEvent()
    ev.registered.agent_id = core.agent_id or "S1"
    ev.registered.master_epoch = 7
    ev.registered.cluster_id = cluster_id
    return durable(core, core.master_event(ev, now), now)


def run_task(core: AgentCore, task_id: str, now: float = 0.0) -> list[Command]:
    ev = agent_pb2.AgentEvent()
    launch = ev.run_tasks.launches.add(framework_id=FW)
    launch.task.task_id = task_id
    launch.task.resources.extend(Resources.of(cpus=0.1, mem=32).to_proto())
    ev.run_tasks.frameworks.add(framework_id=FW, name="web")
    return durable(core, core.master_event(ev, now), now)


def subscribe(core: AgentCore, executor_id: str, peer: bytes = b"e1",
              **kwargs: object) -> list[Command]:
    call = executor_pb2.ExecutorCall(executor_id=executor_id, framework_id=FW)
    call.subscribe.SetInParent()
    for k, v in kwargs.items():
        getattr(call.subscribe, k).extend(v)  # type: ignore[arg-type]
    return durable(core, core.executor_call(peer, call, 1.0), 1.0)


def update(core: AgentCore, executor_id: str, task_id: str, state: int,
           now: float = 1.0) -> tuple[bytes, list[Command]]:
    call = executor_pb2.ExecutorCall(executor_id=executor_id, framework_id=FW)
    u = uuid.uuid4().bytes
    call.update.status.CopyFrom(common_pb2.TaskStatus(task_id=task_id, state=state, uuid=u,  # type: ignore[arg-type]
                                                      source=common_pb2.TaskStatus.SOURCE_EXECUTOR))
    return u, durable(core, core.executor_call(b"e1", call, now), now)


def ack_all(core: AgentCore, now: float) -> None:
    """Play the framework: acknowledge the head update of every stream."""
    for (framework_id, task_id), stream in list(core.updates.streams.items()):
        if stream.pending:
            ev = agent_pb2.AgentEvent()
            ev.acknowledgements.acks.add(framework_id=framework_id, task_id=task_id,
                                         uuid=stream.pending[0].update.status.uuid)
            durable(core, core.master_event(ev, now), now)


def test_first_registration_saves_the_assigned_id() -> None:
    core = AgentCore(info(), now=0.0)
    cmds = registered(core)
    assert SaveAgentId("S1") in cmds and core.registration is Registration.REGISTERED
    # A later connection to a new master re-registers under the same id, with its tasks.
    assert core.master_detected(5.0)[0].call.WhichOneof("call") == "reregister"  # type: ignore[union-attr]


def test_a_task_is_launched_once_even_if_run_twice() -> None:
    core = AgentCore(info(), now=0.0)
    registered(core)
    first = run_task(core, "t1")
    launches = [c for c in first if isinstance(c, LaunchExecutor)]
    assert len(launches) == 1 and any(isinstance(c, SaveState) for c in first)
    assert not [c for c in run_task(core, "t1") if isinstance(c, LaunchExecutor)]
    assert core.duplicate_launches == 1


def test_executor_path_from_launch_to_finished() -> None:
    core = AgentCore(info(), now=0.0)
    registered(core)
    ex_id = next(c for c in run_task(core, "t1") if isinstance(c, LaunchExecutor)).executor_id
    events = [c.event.WhichOneof("event") for c in subscribe(core, ex_id)
              if isinstance(c, ToExecutor)]
    assert events == ["subscribed", "launch"]
    u1, cmds = update(core, ex_id, "t1", S.TASK_RUNNING)
    acks = [c for c in cmds if isinstance(c, ToExecutor)]
    assert acks and acks[0].event.acknowledged.uuid == u1  # only after the checkpoint
    fwd = [c for c in durable(core, core.tick(1.0), 1.0) if isinstance(c, ToMaster)]
    assert [u.status.state for u in fwd[0].call.status_updates.updates] == [S.TASK_RUNNING]
    u2, _ = update(core, ex_id, "t1", S.TASK_FINISHED)
    # FINISHED waits until RUNNING is acknowledged by the framework (in order, one in flight).
    assert not [c for c in durable(core, core.tick(1.2), 1.2) if isinstance(c, ToMaster)]
    ack = agent_pb2.AgentEvent()
    ack.acknowledgements.acks.add(framework_id=FW, task_id="t1", uuid=u1)
    durable(core, core.master_event(ack, 1.3), 1.3)
    fwd = [c for c in durable(core, core.tick(1.3), 1.3) if isinstance(c, ToMaster)]
    assert [u.status.state for u in fwd[0].call.status_updates.updates] == [S.TASK_FINISHED]
    ack = agent_pb2.AgentEvent()
    ack.acknowledgements.acks.add(framework_id=FW, task_id="t1", uuid=u2)
    cmds = durable(core, core.master_event(ack, 1.4), 1.4)
    assert not core.executors and any(isinstance(c, SaveState) for c in cmds)


def test_the_updates_of_a_removed_framework_end_instead_of_being_retried_forever() -> None:
    """The master answers an update of a removed framework with ShutdownFramework, and no
    one will ever acknowledge it: once the task has ended, its stream is dropped and the
    executor forgotten (issue 10, defect 8: such streams were retried every 30 s forever)."""
    core = AgentCore(info(), now=0.0)
    registered(core)
    ex_id = next(c for c in run_task(core, "t1") if isinstance(c, LaunchExecutor)).executor_id
    subscribe(core, ex_id)
    update(core, ex_id, "t1", S.TASK_RUNNING)
    ack_all(core, 1.0)
    shutdown = agent_pb2.AgentEvent()
    shutdown.shutdown_framework.framework_id = FW
    [kill] = durable(core, core.master_event(shutdown, 2.0), 2.0)
    assert isinstance(kill, ToExecutor) and kill.event.WhichOneof("event") == "kill"
    update(core, ex_id, "t1", S.TASK_KILLED, now=2.5)
    [fwd] = [c for c in durable(core, core.tick(2.5), 2.5) if isinstance(c, ToMaster)]
    assert [u.status.state for u in fwd.call.status_updates.updates] == [S.TASK_KILLED]
    # Not acknowledged: the master answers the update with ShutdownFramework again.
    cmds = durable(core, core.master_event(shutdown, 2.6), 2.6)
    assert any(isinstance(c, SaveState) for c in cmds)
    assert not core.executors and not core.updates.streams
    assert core.next_deadline() is None
    assert not [c for c in durable(core, core.tick(100.0), 100.0) if isinstance(c, ToMaster)]


def test_kill_before_the_executor_subscribes_is_delivered_on_subscribe() -> None:
    core = AgentCore(info(), now=0.0)
    registered(core)
    ex_id = next(c for c in run_task(core, "t1") if isinstance(c, LaunchExecutor)).executor_id
    assert core.kill(FW, "t1", 0.5, 0.5) == []
    events = [c.event for c in subscribe(core, ex_id) if isinstance(c, ToExecutor)]
    assert events[-1].WhichOneof("event") == "kill"
    assert events[-1].kill.kill_grace_period_s == 0.5


def _killed_after(core: AgentCore, ex_id: str, kill: agent_pb2.AgentEvent.KillTask,
                  ) -> common_pb2.TaskStatus:
    """Kill t1 with `kill`, play the executor's TASK_KILLED: the update the master gets."""
    subscribe(core, ex_id)
    update(core, ex_id, "t1", S.TASK_RUNNING)
    ack_all(core, 1.0)
    [to_ex] = [c for c in durable(core, core.master_event(
        agent_pb2.AgentEvent(kill_task=kill), 2.0), 2.0) if isinstance(c, ToExecutor)]
    assert to_ex.event.WhichOneof("event") == "kill"
    update(core, ex_id, "t1", S.TASK_KILLED, now=2.5)
    [fwd] = [c for c in durable(core, core.tick(2.5), 2.5) if isinstance(c, ToMaster)]
    [killed] = [u.status for u in fwd.call.status_updates.updates]
    assert killed.state == S.TASK_KILLED
    return killed


def test_a_kill_with_a_reason_puts_it_on_the_killed_update() -> None:
    """A revocation's kill (KillTask.reason = REASON_TASK_REVOKED): the framework learns
    why from the TASK_KILLED update; a kill without a reason stays as it was."""
    revoked = common_pb2.TaskStatus.REASON_TASK_REVOKED
    core = AgentCore(info(), now=0.0)
    registered(core)
    ex_id = next(c for c in run_task(core, "t1") if isinstance(c, LaunchExecutor)).executor_id
    killed = _killed_after(core, ex_id, agent_pb2.AgentEvent.KillTask(
        framework_id=FW, task_id="t1", reason=revoked))
    assert killed.reason == revoked
    plain = AgentCore(info(), now=0.0)
    registered(plain)
    ex_id = next(c for c in run_task(plain, "t1") if isinstance(c, LaunchExecutor)).executor_id
    killed = _killed_after(plain, ex_id, agent_pb2.AgentEvent.KillTask(
        framework_id=FW, task_id="t1"))
    assert killed.reason == common_pb2.TaskStatus.REASON_UNSPECIFIED


def test_an_executor_that_dies_fails_its_task() -> None:
    core = AgentCore(info(), now=0.0)
    registered(core)
    ex_id = next(c for c in run_task(core, "t1") if isinstance(c, LaunchExecutor)).executor_id
    subscribe(core, ex_id)
    update(core, ex_id, "t1", S.TASK_RUNNING)
    [stop] = durable(core, core.executor_exited(ex_id, 2.0), 2.0)
    # Its container first: the task is not reported while the container may still run.
    assert isinstance(stop, StopContainers) and stop.executor_id == ex_id
    # Found by agent and executor id (the executor's id is unique): a container started before
    # the agent learned its cluster id carries no cluster label, and must be found too.
    assert dict(stop.labels) == {LABEL_AGENT: "S1", LABEL_EXECUTOR: ex_id}
    assert core.executors[ex_id].state == S.TASK_RUNNING
    forwarded = [u.status.state for c in durable(core, core.tick(2.5), 2.5)
                 if isinstance(c, ToMaster) for u in c.call.status_updates.updates]
    assert S.TASK_FAILED not in forwarded
    ack_all(core, 2.6)
    cmds = durable(core, core.containers_stopped(ex_id, ["c0ffee"], "", 3.0), 3.0)
    assert any(isinstance(c, ToMaster) and c.call.WhichOneof("call") == "executor_exited"
               for c in cmds)
    assert core.executors[ex_id].state == S.TASK_FAILED
    [fwd] = [c for c in durable(core, core.tick(3.0), 3.0) if isinstance(c, ToMaster)]
    [failed] = [u.status for u in fwd.call.status_updates.updates]
    assert failed.state == S.TASK_FAILED
    assert failed.reason == common_pb2.TaskStatus.REASON_EXECUTOR_TERMINATED
    assert "container was stopped" in failed.message


def test_unknown_executor_is_told_to_shut_down() -> None:
    core = AgentCore(info(), now=0.0)
    registered(core)
    cmds = subscribe(core, "nobody")
    assert [c.event.WhichOneof("event") for c in cmds if isinstance(c, ToExecutor)] == [
        "shutdown"]


def test_reconcile_reports_unknown_tasks_dropped() -> None:
    core = AgentCore(info(), now=0.0)
    registered(core)
    ev = agent_pb2.AgentEvent()
    ev.reconcile.tasks.add(framework_id=FW, task_id="ghost", state=S.TASK_RUNNING)
    durable(core, core.master_event(ev, 1.0), 1.0)
    fwd = [c for c in durable(core, core.tick(1.0), 1.0) if isinstance(c, ToMaster)]
    assert fwd[0].call.status_updates.updates[0].status.state == S.TASK_DROPPED


def test_master_refusal_triggers_re_registration() -> None:
    core = AgentCore(info(), now=0.0)
    registered(core)
    cmds = core.master_error(bus_pb2.NOT_REGISTERED, 3.0)
    assert core.registration is Registration.REGISTERING
    assert cmds and isinstance(cmds[0], ToMaster)


def test_restart_recovers_executors_without_relaunching() -> None:
    core = AgentCore(info(), now=0.0)
    registered(core)
    ex_id = next(c for c in run_task(core, "t1") if isinstance(c, LaunchExecutor)).executor_id
    core.executor_launched(ex_id, pid=4242)
    subscribe(core, ex_id)
    update(core, ex_id, "t1", S.TASK_RUNNING)
    state, records = core.state(), core.updates.records()

    again = AgentCore(state.agent_info, now=10.0, recovered=state, records=records)
    assert again.executors[ex_id].pid == 4242 and again.executors[ex_id].state == S.TASK_RUNNING
    rereg = again.master_detected(10.0)[0]
    assert isinstance(rereg, ToMaster)
    assert [t.task_info.task_id for t in rereg.call.reregister.tasks] == ["t1"]
    task = common_pb2.TaskInfo(task_id="t1")
    events = [c.event.WhichOneof("event")
              for c in subscribe(again, ex_id, unacknowledged_tasks=[task])
              if isinstance(c, ToExecutor)]
    assert events == ["subscribed"]  # not launched again


def test_restart_takes_task_states_from_the_update_log_not_the_last_saved_state() -> None:
    """The executor table is checkpointed at launch; the task's later states are in the
    status update log only. A restarted agent must know them: a task already RUNNING is not
    sent a Launch when its executor re-subscribes (issue 10, defect 1: "bursts of launches")."""
    core = AgentCore(info(), now=0.0)
    registered(core)
    ex_id = next(c for c in run_task(core, "t1") if isinstance(c, LaunchExecutor)).executor_id
    [saved] = [c.state for c in core.executor_launched(ex_id, pid=4242)
               if isinstance(c, SaveState)]
    subscribe(core, ex_id)
    update(core, ex_id, "t1", S.TASK_STARTING)
    ack_all(core, 1.0)
    update(core, ex_id, "t1", S.TASK_RUNNING)
    assert saved.tasks[0].latest_status.state == S.TASK_STAGING  # what the disk holds

    again = AgentCore(saved.agent_info, now=10.0, recovered=saved,
                      records=core.updates.records())
    again.validate()
    assert again.executors[ex_id].state == S.TASK_RUNNING
    rereg = again.master_detected(10.0)[0]
    assert isinstance(rereg, ToMaster)
    assert rereg.call.reregister.tasks[0].latest_status.state == S.TASK_RUNNING
    # Its digest is of what it reports now (a new master compares it with what it followed).
    assert rereg.call.reregister.tasks_digest == report_digest.item(
        FW, "t1", S.TASK_RUNNING, ex_id) != saved.tasks_digest
    events = [c.event.WhichOneof("event") for c in subscribe(again, ex_id)
              if isinstance(c, ToExecutor)]
    assert events == ["subscribed"]  # the executor acked its task long ago: no Launch


def test_a_task_whose_end_was_acknowledged_before_a_crash_is_not_failed_after_it() -> None:
    """The master acknowledged the terminal update, the agent logged the ack, and died before
    saving its executor table: the restarted agent forgets the task (its executor exited, as
    it should) instead of reporting it FAILED for an executor that never came back."""
    core = AgentCore(info(), now=0.0)
    registered(core)
    ex_id = next(c for c in run_task(core, "t1") if isinstance(c, LaunchExecutor)).executor_id
    [saved] = [c.state for c in core.executor_launched(ex_id, pid=4242)
               if isinstance(c, SaveState)]
    subscribe(core, ex_id)
    done, _ = update(core, ex_id, "t1", S.TASK_FINISHED)
    log = [*core.updates.records(), su.Acked(FW, "t1", done)]

    again = AgentCore(saved.agent_info, now=10.0, recovered=saved, records=log)
    again.validate()
    assert ex_id not in again.executors
    registered(again, 10.0)
    assert not again.executor_exited(ex_id, 11.0)  # the pid watch sees it gone: nothing
    forwarded = [u for t in (12.0, 30.0) for c in durable(again, again.tick(t), t)
                 if isinstance(c, ToMaster) for u in c.call.status_updates.updates]
    assert forwarded == []


def test_a_launch_whose_executor_never_started_before_a_crash_is_dropped_not_failed() -> None:
    """The agent took a RunTasks, saved it, and died before its executor was forked (or
    before the pid was saved): after the restart the task is given the re-registration
    window, then reported TASK_DROPPED (it never ran), not FAILED 30 s later."""
    core = AgentCore(info(), now=0.0)
    registered(core)
    [saved] = [c.state for c in run_task(core, "t1") if isinstance(c, SaveState)]
    ex_id = saved.executors[0].executor_id
    again = AgentCore(saved.agent_info, now=10.0, recovered=saved)
    registered(again, 10.0)
    assert again.next_deadline() == 20.0
    [stop] = durable(again, again.tick(20.0), 20.0)
    assert isinstance(stop, StopContainers)  # a container it may have started goes first
    durable(again, again.containers_stopped(ex_id, [], "", 20.5), 20.5)
    [fwd] = [c for c in durable(again, again.tick(20.5), 20.5) if isinstance(c, ToMaster)
             and c.call.WhichOneof("call") == "status_updates"]
    [dropped] = [u.status for u in fwd.call.status_updates.updates]
    assert dropped.state == S.TASK_DROPPED
    assert dropped.reason == common_pb2.TaskStatus.REASON_AGENT_RESTARTED


def test_a_task_launched_after_a_restart_gets_the_full_registration_timeout() -> None:
    """The re-registration window is for the executors of the checkpoint only: a task
    launched later on the restarted agent was failed the moment its pid was known ("the
    executor never re-subscribed"), and its executor told to shut down when it came."""
    core = AgentCore(info(), now=0.0)
    registered(core)
    again = AgentCore(core.state().agent_info, now=10.0, recovered=core.state())
    registered(again, 10.0)
    ex_id = next(c for c in run_task(again, "t2", now=60.0)
                 if isinstance(c, LaunchExecutor)).executor_id
    durable(again, again.executor_launched(ex_id, pid=4343), 60.0)
    assert not [c for c in durable(again, again.tick(61.0), 61.0)
                if isinstance(c, StopContainers)]
    events = [c.event.WhichOneof("event") for c in subscribe(again, ex_id)
              if isinstance(c, ToExecutor)]
    assert events == ["subscribed", "launch"]


def test_a_gone_agent_obeys_the_shutdown_that_answers_its_reregistration() -> None:
    """The master refuses a gone agent's re-registration with Shutdown: the agent is not
    registered, yet it must kill its tasks (it kept them running and retried forever)."""
    core = AgentCore(info(), now=0.0)
    registered(core)
    ex_id = next(c for c in run_task(core, "t1") if isinstance(c, LaunchExecutor)).executor_id
    subscribe(core, ex_id)
    core.master_detected(5.0)  # re-registering with a new master
    shutdown = agent_pb2.AgentEvent()
    shutdown.shutdown.reason = "agent S1 was declared gone"
    [kill] = durable(core, core.master_event(shutdown, 5.1), 5.1)
    assert isinstance(kill, ToExecutor) and kill.event.WhichOneof("event") == "kill"


def test_executor_that_never_comes_back_after_restart_fails_its_task() -> None:
    core = AgentCore(info(), now=0.0)
    registered(core)
    ex_id = next(c for c in run_task(core, "t1") if isinstance(c, LaunchExecutor)).executor_id
    core.executor_launched(ex_id, pid=4242)
    again = AgentCore(core.state().agent_info, now=10.0, recovered=core.state())
    registered(again, 10.0)
    durable(again, again.tick(15.0), 15.0)
    assert again.executors[ex_id].state == S.TASK_STAGING
    [stop] = durable(again, again.tick(21.0), 21.0)
    assert isinstance(stop, StopContainers) and again.executors[ex_id].state == S.TASK_STAGING
    durable(again, again.containers_stopped(ex_id, [], "", 21.5), 21.5)
    assert again.executors[ex_id].state == S.TASK_FAILED


def test_a_log_request_is_capped_below_the_frame_limit() -> None:
    """One GetLogs with a huge max_bytes (or none) never asks for a reply larger than a
    frame can carry: the agent would fail to send it (issue 10, defect 3)."""
    from services.agent.commands import FetchLogs
    from services.agent.core import MAX_LOG_BYTES
    from services.bus.codec import DEFAULT_FRAME_LIMIT

    core = AgentCore(info(), now=0.0)
    registered(core)
    run_task(core, "t1")
    asked = {}
    for wanted in (0, 100, 0xFFFFFFFF):  # 0: the default; the largest a uint32 holds
        ev = agent_pb2.AgentEvent()
        ev.logs_request.request_id, ev.logs_request.task_id = f"r{wanted}", "t1"
        ev.logs_request.framework_id, ev.logs_request.max_bytes = FW, wanted
        [fetch] = [c for c in core.master_event(ev, 1.0) if isinstance(c, FetchLogs)]
        asked[wanted] = fetch.max_bytes
    assert asked[100] == 100
    assert 0 < asked[0] <= MAX_LOG_BYTES and asked[0xFFFFFFFF] == MAX_LOG_BYTES
    assert MAX_LOG_BYTES <= DEFAULT_FRAME_LIMIT // 2  # room for the envelope and the relay


def test_an_update_queued_before_the_executor_resubscribes_does_not_lose_an_earlier_one() -> None:
    """Seen under load in the agent-restart flow test: a task's history read STARTING,
    UNREACHABLE, FINISHED, with no RUNNING. The executor's RUNNING went out on the dying
    agent's connection and was lost; its FINISHED, sent while the link was down, waited in
    the socket's queue and reached the restarted agent *before* the executor's Subscribe
    (which carries RUNNING and FINISHED, in order). The agent took FINISHED, then refused
    RUNNING as a move back from a terminal state: RUNNING never reached the framework.
    An update is taken only from an executor subscribed to this agent process: the
    Subscribe that follows carries every unacknowledged update in order."""
    core = AgentCore(info(), now=0.0)
    registered(core)
    ex_id = next(c for c in run_task(core, "t1") if isinstance(c, LaunchExecutor)).executor_id
    core.executor_launched(ex_id, pid=4242)
    subscribe(core, ex_id)
    update(core, ex_id, "t1", S.TASK_STARTING)
    ack_all(core, 1.0)
    state, records = core.state(), core.updates.records()

    again = AgentCore(state.agent_info, now=10.0, recovered=state, records=records)
    registered(again, 10.0)
    src = common_pb2.TaskStatus.SOURCE_EXECUTOR
    running = common_pb2.TaskStatus(task_id="t1", state=S.TASK_RUNNING, uuid=b"R" * 16,
                                    source=src)
    finished = common_pb2.TaskStatus(task_id="t1", state=S.TASK_FINISHED, uuid=b"F" * 16,
                                     source=src, exit_code=0)
    late = executor_pb2.ExecutorCall(executor_id=ex_id, framework_id=FW)
    late.update.status.CopyFrom(finished)  # queued while the link was down
    durable(again, again.executor_call(b"e1", late, 10.1), 10.1)
    subscribe(again, ex_id, unacknowledged_updates=[running, finished])
    forwarded: list[int] = []
    for now in (11.0, 12.0, 13.0):
        for cmd in durable(again, again.tick(now), now):
            if isinstance(cmd, ToMaster) and cmd.call.WhichOneof("call") == "status_updates":
                forwarded += [u.status.state for u in cmd.call.status_updates.updates]
        ack_all(again, now)
    assert forwarded == [S.TASK_RUNNING, S.TASK_FINISHED]


def test_a_reset_master_link_registers_again_only_when_registered() -> None:
    """The link under the master connection broke and came back (bus/link.py): a launch, a
    kill or an ack may have been lost, so a registered agent re-registers (the master then
    reconciles its tasks); one not registered yet leaves it to its registration."""
    core = AgentCore(info(), now=0.0)
    assert core.master_link_reset(0.5) == []  # no master yet
    registered(core)
    [again] = core.master_link_reset(1.0)
    assert isinstance(again, ToMaster) and again.call.WhichOneof("call") == "reregister"
    assert core.registration is Registration.REGISTERING
    assert core.master_link_reset(1.1) == []  # that registration is under way
