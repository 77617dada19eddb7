"""The executor's pure core: one task's lifecycle (launch, start, exit, kill with grace), its
health checks (health.py: when due, what a result means; a kill after too many failures), its
status updates retried until the agent acknowledges them, the agent-recovery timeout, and when to
exit. No sockets, threads or clocks: events and the current (wall-clock) time come in, commands
go out."""

from __future__ import annotations

import uuid
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeAlias

from schemas import common_pb2
from services import tasks
from services.executor import health as hc

TaskInfo = common_pb2.TaskInfo
TaskStatus = common_pb2.TaskStatus
Reason: TypeAlias = common_pb2.TaskStatus.Reason.ValueType

DEFAULT_KILL_GRACE_S = 3.0  # DESIGN §4, as Mesos
RETRY_INITIAL_S = 0.5  # the executor<->agent link is local: retry fast ...
RETRY_MAX_S = 5.0  # ... and never wait long
# How long the executor keeps its task while no agent answers (the agent died and is being
# restarted). Mesos waits 15 min (--recovery_timeout); our agents restart in seconds and the
# master declares an agent unreachable after ~5 s, so a minute is plenty.
DEFAULT_RECOVERY_TIMEOUT_S = 60.0

EXIT_OK = 0
EXIT_AGENT_GONE = 3  # gave up on the agent: the task was killed


# -- commands --------------------------------------------------------------------------------


@dataclass(frozen=True)
class StartContainer:
    task: TaskInfo
    framework_id: str
    traceparent: str = ""  # the Launch envelope's: the parent of the shell's `start` span


@dataclass(frozen=True)
class KillContainer:
    grace_s: float


@dataclass(frozen=True)
class SendUpdate:
    status: TaskStatus


@dataclass(frozen=True)
class RunCheck:
    """Run the task's health check once (off the reactor thread) within `timeout_s`, then
    call check_result()."""

    check: common_pb2.HealthCheck
    timeout_s: float


@dataclass(frozen=True)
class Exit:
    """Remove the container (it has ended) and exit the process with `code`."""

    code: int
    reason: str


Command = StartContainer | KillContainer | SendUpdate | RunCheck | Exit


class InvariantError(AssertionError):
    """validate() found the core in a state it must never reach."""


@dataclass
class _Pending:
    status: TaskStatus
    sends: int
    next_at: float


def retry_interval(sends: int, initial: float = RETRY_INITIAL_S, cap: float = RETRY_MAX_S) -> float:
    """Wait after the `sends`-th send of one update: 0.5, 1, 2, 4, 5, 5, ..."""
    return min(initial * 2.0 ** min(max(sends - 1, 0), 32), cap)


class ExecutorCore:
    def __init__(
        self, executor_id: str, framework_id: str, now: float, *, agent_id: str = "",
        recovery_timeout_s: float = DEFAULT_RECOVERY_TIMEOUT_S,
        default_grace_s: float = DEFAULT_KILL_GRACE_S,
        new_uuid: Callable[[], bytes] = lambda: uuid.uuid4().bytes,
    ) -> None:
        self.executor_id = executor_id
        self.framework_id = framework_id
        self.agent_id = agent_id
        self.recovery_timeout_s = recovery_timeout_s
        self.default_grace_s = default_grace_s
        self._new_uuid = new_uuid
        self.task: TaskInfo | None = None
        self.state: tasks.State | None = None  # last state reported for our task
        self.container_id = ""
        self.start_in_flight = False
        self.container_running = False
        self.container_ended = False
        self.kill_requested = False
        self.kill_cause: tuple[Reason, str] | None = None  # why we kill it ourselves
        self.kill_sent = False
        self.health: hc.Health | None = None  # from TASK_RUNNING, when the task has a check
        self.grace_s = default_grace_s
        self.shutdown_requested = False
        self.abandoned = False  # the agent did not come back in time
        self.exited = False
        self.any_acked = False  # the agent acknowledged an update of our task
        self.connected = False  # subscribed to a live agent
        self.disconnected_since: float | None = now
        self.unacked: OrderedDict[bytes, _Pending] = OrderedDict()
        self.refused: set[str] = set()  # other tasks sent to us (answered TASK_ERROR)

    # -- agent link ------------------------------------------------------------------------
    def subscribe_payload(self) -> tuple[list[TaskStatus], list[TaskInfo]]:
        """What Subscribe carries: unacknowledged updates, and our task while the agent has
        acknowledged nothing of it (a restarted agent may not have checkpointed it)."""
        statuses = [p.status for p in self.unacked.values()]
        pending_tasks = [self.task] if self.task is not None and not self.any_acked else []
        return statuses, pending_tasks

    def subscribed(self, agent_id: str, now: float) -> list[Command]:
        """The agent answered our Subscribe, which carried every unacked update: retry them
        from a fresh schedule."""
        if agent_id and not self.agent_id:
            self.agent_id = agent_id
        self.connected = True
        self.disconnected_since = None
        for pending in self.unacked.values():
            pending.sends = max(pending.sends, 1)
            pending.next_at = now + RETRY_INITIAL_S
        return []

    def disconnected(self, now: float) -> list[Command]:
        if self.connected or self.disconnected_since is None:
            self.disconnected_since = now
        self.connected = False
        return []

    # -- task ------------------------------------------------------------------------------
    def launch(self, task: TaskInfo, framework_id: str, now: float,
               traceparent: str = "") -> list[Command]:
        if self.exited or self.abandoned or self.shutdown_requested:
            return []
        if self.task is not None:
            if task.task_id == self.task.task_id or task.task_id in self.refused:
                return []  # a resent Launch
            # One task per executor: refuse the other one without touching ours.
            self.refused.add(task.task_id)
            return [self._update(now, tasks.ERROR, task_id=task.task_id,
                                 reason=TaskStatus.REASON_TASK_INVALID,
                                 message="this executor already runs a task")]
        self.task = task
        self.state = tasks.STAGING  # where the master left it
        if framework_id:
            self.framework_id = framework_id
        if not self.agent_id:
            self.agent_id = task.agent_id
        if task.HasField("kill_grace_period_s"):
            self.grace_s = max(task.kill_grace_period_s, 0.0)
        self.start_in_flight = True
        return [self._report(now, tasks.STARTING),
                StartContainer(task, self.framework_id, traceparent)]

    def container_started(self, container_id: str, now: float) -> list[Command]:
        if not self.start_in_flight:
            return []
        self.start_in_flight = False
        self.container_running = True
        self.container_id = container_id
        if self.kill_requested:  # killed while starting: KILLING is already out
            self.kill_sent = True
            return [KillContainer(self.grace_s)]
        assert self.task is not None
        if hc.has_check(self.task.health_check):
            self.health = hc.Health(self.task.health_check, now)
        return [self._report(now, tasks.RUNNING)]

    def launch_failed(self, reason: Reason, message: str, now: float) -> list[Command]:
        if not self.start_in_flight:
            return []
        self.start_in_flight = False
        self.container_ended = True
        if self.kill_requested:
            out = [self._report(now, tasks.KILLED,
                                reason=TaskStatus.REASON_TASK_KILLED_DURING_LAUNCH,
                                message=f"killed while launching ({message})")]
        else:
            out = [self._report(now, tasks.FAILED, reason=reason, message=message)]
        return out + self._exit_if_done()

    def container_exited(self, exit_code: int | None, oom_killed: bool, message: str,
                         now: float) -> list[Command]:
        if not self.container_running:
            return []
        self.container_running = False
        self.container_ended = True
        if self.health is not None:
            self.health.stop()
        if self.kill_requested:
            reason, message = self.kill_cause or (TaskStatus.REASON_UNSPECIFIED, "")
            status = self._report(now, tasks.KILLED, exit_code=exit_code, reason=reason,
                                  message=message or self._killed_message(exit_code))
        elif oom_killed:
            status = self._report(now, tasks.FAILED, exit_code=exit_code,
                                  reason=TaskStatus.REASON_CONTAINER_LIMITATION_MEMORY,
                                  message=message or "killed for exceeding its memory limit")
        elif exit_code == 0:
            status = self._report(now, tasks.FINISHED, exit_code=0, message="exited with 0")
        elif exit_code is None:
            status = self._report(now, tasks.FAILED, reason=TaskStatus.REASON_EXECUTOR_TERMINATED,
                                  message=f"ended with an unknown status: {message}")
        else:
            status = self._report(now, tasks.FAILED, exit_code=exit_code,
                                  reason=TaskStatus.REASON_COMMAND_EXECUTOR_FAILED,
                                  message=f"exited with {exit_code}")
        return [status, *self._exit_if_done()]

    def _killed_message(self, exit_code: int | None) -> str:
        if self.abandoned:
            return "killed: the agent did not come back within the recovery timeout"
        return "killed" if exit_code is None else f"killed (exited with {exit_code})"

    def kill(self, grace_s: float | None, now: float, *,
             reason: Reason = TaskStatus.REASON_UNSPECIFIED, message: str = "") -> list[Command]:
        """Kill the task (the agent asked, or we decided: `reason` and `message` then go on
        its KILLING and KILLED updates)."""
        if self.task is None or self.exited or self.kill_requested or self._terminal():
            return []
        self.kill_requested = True
        if reason != TaskStatus.REASON_UNSPECIFIED or message:
            self.kill_cause = (reason, message)
        if self.health is not None:
            self.health.stop()
        if grace_s is not None:
            self.grace_s = max(grace_s, 0.0)
        out: list[Command] = [self._report(now, tasks.KILLING, reason=reason, message=message)]
        if self.container_running:
            self.kill_sent = True
            out.append(KillContainer(self.grace_s))
        return out  # while starting: killed as soon as it is up (container_started)

    def shutdown(self, grace_s: float | None, now: float) -> list[Command]:
        """Kill the task (if any) and exit once its terminal update is acknowledged."""
        self.shutdown_requested = True
        return self.kill(grace_s, now) + self._exit_if_done()

    def acknowledged(self, update_uuid: bytes, now: float) -> list[Command]:
        pending = self.unacked.pop(update_uuid, None)
        if pending is None:
            return []
        if self.task is not None and pending.status.task_id == self.task.task_id:
            self.any_acked = True
        return self._exit_if_done()

    # -- health checks -----------------------------------------------------------------------
    def check_result(self, ok: bool, output: str, now: float) -> list[Command]:
        """The result of the RunCheck last sent: report health when it changed (the first
        result included); kill the task after `consecutive_failures` failures in a row."""
        health = self.health
        if health is None:
            return []
        verdict = health.result(ok, output, now)
        if verdict is None or not self.container_running or self.kill_requested:
            return []
        out: list[Command] = []
        if verdict.changed:
            state = "healthy" if verdict.healthy else "unhealthy"
            out.append(self._report(
                now, tasks.RUNNING, reason=TaskStatus.REASON_TASK_HEALTH_CHECK_STATUS_UPDATED,
                message=f"{state}: {hc.describe(health.check)}"
                        + ("" if verdict.healthy else f" failed: {health.last_output}")))
        if verdict.kill:
            message = (f"{hc.describe(health.check)} failed {verdict.failures} times in a row;"
                       f" last output: {health.last_output or '(none)'}")
            out += self.kill(None, now, reason=TaskStatus.REASON_HEALTH_CHECK_FAILED,
                             message=message)
        return out

    # -- time --------------------------------------------------------------------------------
    def tick(self, now: float) -> list[Command]:
        if self.exited:
            return []
        out: list[Command] = []
        if (not self.abandoned and self.disconnected_since is not None
                and now - self.disconnected_since >= self.recovery_timeout_s):
            self.abandoned = True
            out += self.kill(None, now)
            out += self._exit_if_done()
            if self.exited:
                return out
        if self.connected:
            for pending in self.unacked.values():
                if pending.next_at <= now:
                    pending.sends += 1
                    pending.next_at = now + retry_interval(pending.sends)
                    out.append(SendUpdate(pending.status))
        health = self.health
        if (health is not None and health.due(now) and self.container_running
                and not self.kill_requested):
            health.start()
            out.append(RunCheck(health.check, health.timeout_s))
        return out

    def next_deadline(self) -> float | None:
        """When tick() has something to do next (None: only events will make work)."""
        if self.exited:
            return None
        times = [p.next_at for p in self.unacked.values()] if self.connected else []
        if not self.abandoned and self.disconnected_since is not None:
            times.append(self.disconnected_since + self.recovery_timeout_s)
        if self.health is not None and self.container_running and not self.kill_requested:
            check_at = self.health.next_deadline()
            if check_at is not None:
                times.append(check_at)
        return min(times, default=None)

    # -- helpers -----------------------------------------------------------------------------
    def _terminal(self) -> bool:
        return self.state is not None and tasks.is_terminal(self.state)

    def _exit_if_done(self) -> list[Command]:
        if self.exited or self.start_in_flight or self.container_running:
            return []
        if self.abandoned:
            # Nobody will acknowledge: the agent keeps nothing of us anyway.
            self.exited = True
            return [Exit(EXIT_AGENT_GONE, "the agent did not come back; task killed")]
        if self.task is None:
            if self.shutdown_requested:
                self.exited = True
                return [Exit(EXIT_OK, "shut down before any task")]
            return []
        if self._terminal() and not self.unacked:
            self.exited = True
            return [Exit(EXIT_OK, "the task ended and its last update was acknowledged")]
        return []

    def _report(self, now: float, state: tasks.State, *,
                reason: Reason = TaskStatus.REASON_UNSPECIFIED, message: str = "",
                exit_code: int | None = None) -> SendUpdate:
        """A status of our task; the move is checked against the task state machine."""
        self.state = tasks.transition(self.state, state)
        assert self.task is not None
        update = self._update(now, state, task_id=self.task.task_id, reason=reason,
                              message=message, exit_code=exit_code)
        if self.health is not None and self.health.healthy is not None:
            update.status.healthy = self.health.healthy  # known health rides on every update
        return update

    def _update(self, now: float, state: tasks.State, *, task_id: str,
                reason: Reason = TaskStatus.REASON_UNSPECIFIED, message: str = "",
                exit_code: int | None = None) -> SendUpdate:
        status = TaskStatus(
            task_id=task_id, state=state, reason=reason, source=TaskStatus.SOURCE_EXECUTOR,
            message=message, uuid=self._new_uuid(), agent_id=self.agent_id,
            executor_id=self.executor_id, timestamp_us=int(now * 1_000_000),
            container_id=self.container_id)
        if exit_code is not None:
            status.exit_code = exit_code
        self.unacked[status.uuid] = _Pending(status, 1, now + retry_interval(1))
        return SendUpdate(status)

    def validate(self) -> None:
        """Raise InvariantError when the state breaks a rule (tests call it after each step)."""
        def need(cond: bool, what: str) -> None:
            if not cond:
                raise InvariantError(what)

        need(self.state is None or self.state in tasks.STORABLE, "state is a task state")
        need((self.task is None) == (self.state is None), "a task iff a reported state")
        need(not (self.start_in_flight and self.container_running), "starting xor running")
        need(not (self.container_running and self.container_ended), "running xor ended")
        need(not self._terminal() or not (self.start_in_flight or self.container_running),
             "terminal only once the container has ended")
        need(not self.kill_sent or self.kill_requested, "KillContainer only on request")
        need(not self.kill_requested or self.task is not None, "a kill needs a task")
        need(all(len(u) == 16 and p.sends >= 1 for u, p in self.unacked.items()),
             "every pending update has a 16-byte uuid and was sent")
        need(self.connected == (self.disconnected_since is None), "connected iff no outage")
        if self.health is not None:
            self.health.validate()
            need(self.task is not None and self.state is not None, "health needs a task")
            need(not (self.kill_requested or self.container_ended) or self.health.stopped,
                 "no health checks once the task is killed or ended")
        need(self.kill_cause is None or self.kill_requested, "a kill cause only with a kill")
        if self.exited:
            need(not (self.start_in_flight or self.container_running),
                 "exit only once the container has ended")
            need(self.abandoned or self.task is None or (self._terminal() and not self.unacked),
                 "exit only after the terminal update was acknowledged")
