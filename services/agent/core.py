"""The agent's pure core: registration with the master, the table of executors and their
tasks (each launched at most once), kills, reconciliation and recovery after a restart. It
drives the status update manager (status_updates.py). No sockets, disk, clock or Docker:
events and `now` in, commands out; the shell (shell.py) carries them out."""

from __future__ import annotations

import enum
import uuid as uuidlib
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from schemas import agent_pb2, bus_pb2, common_pb2, executor_pb2
from services import tasks
from services.agent import status_updates as su
from services.bus.liveness import Backoff

TaskState = common_pb2.TaskState
TaskStatus = common_pb2.TaskStatus
AgentState = agent_pb2.AgentCall.Reregister

EXECUTOR_REGISTRATION_TIMEOUT_S = 30.0  # launched executors must subscribe within this
EXECUTOR_REREGISTRATION_TIMEOUT_S = 10.0  # after an agent restart, executors must come back


class Registration(enum.Enum):
    DISCONNECTED = "disconnected"  # no master known
    REGISTERING = "registering"  # Register/Reregister sent, no answer yet
    REGISTERED = "registered"


# -- commands -----------------------------------------------------------------------------
@dataclass(frozen=True)
class ToMaster:
    call: agent_pb2.AgentCall


@dataclass(frozen=True)
class ToExecutor:
    peer: bytes
    event: executor_pb2.ExecutorEvent
    traceparent: str = ""  # the Envelope's (the Launch event carries the run span's)


@dataclass(frozen=True)
class LaunchExecutor:
    """Start the executor process for one task (the shell uses the fork-server launcher)."""

    executor_id: str
    framework_id: str
    task_id: str
    traceparent: str = ""  # the master's RunTasks.Launch.traceparent: the run span's parent


@dataclass(frozen=True)
class SaveState:
    """Atomically checkpoint the agent's state (also its re-registration message)."""

    state: AgentState


@dataclass(frozen=True)
class SaveAgentId:
    agent_id: str


@dataclass(frozen=True)
class FetchLogs:
    """Read a task's container output and answer the master with AgentCall.LogsReply."""

    request: agent_pb2.AgentEvent.LogsRequest
    executor_id: str | None  # None: the task is unknown here


Command = (ToMaster | ToExecutor | LaunchExecutor | SaveState | SaveAgentId | FetchLogs
           | su.Checkpoint)


@dataclass
class Executor:
    executor_id: str
    framework_id: str
    task: common_pb2.TaskInfo
    framework: common_pb2.FrameworkInfo
    launched_at: float
    pid: int = 0
    peer: bytes | None = None
    container_id: str = ""
    state: TaskState.ValueType = TaskState.TASK_STAGING
    kill_grace_s: float | None = None  # a kill asked before the executor subscribed
    exited: bool = False
    # Handed to the executor with its Launch (whenever it subscribes): the master's
    # RunTasks.Launch.traceparent, until the shell's `run` span replaces it (launch_traced).
    traceparent: str = ""

    @property
    def task_id(self) -> str:
        return self.task.task_id


class AgentCore:
    def __init__(
        self, info: common_pb2.AgentInfo, *, now: float,
        recovered: AgentState | None = None, records: Iterable[su.Record] = (),
        new_id: Callable[[], str] = lambda: uuidlib.uuid4().hex[:8],
    ) -> None:
        self.info = common_pb2.AgentInfo()
        self.info.CopyFrom(info)
        self.agent_id = info.agent_id
        self.registration = Registration.DISCONNECTED
        self.master_epoch = 0
        self.executors: dict[str, Executor] = {}
        self.by_task: dict[tuple[str, str], str] = {}  # (framework_id, task_id) -> executor
        self.frameworks: dict[str, common_pb2.FrameworkInfo] = {}
        self.updates = su.StatusUpdateManager()
        self.updates.recover(records, now)
        self._new_id = new_id
        self._register_backoff = Backoff(initial=0.2, cap=5.0)
        self._register_at: float | None = None
        self._recovery_deadline: float | None = None
        self.duplicate_launches = 0
        if recovered is not None:
            self._recover(recovered, now)

    # -- recovery --------------------------------------------------------------------------
    def _recover(self, state: AgentState, now: float) -> None:
        for fw in state.frameworks:
            self.frameworks[fw.framework_id] = fw
        executors = {e.executor_id: e for e in state.executors}
        for t in state.tasks:
            info = executors.get(t.executor_id)
            ex = Executor(t.executor_id, t.framework_id, t.task_info,
                          self.frameworks.get(t.framework_id, common_pb2.FrameworkInfo()),
                          launched_at=now, pid=info.pid if info else 0,
                          container_id=info.container_id if info else "",
                          state=t.latest_status.state or TaskState.TASK_STAGING)
            self._add(ex)
        self._recovery_deadline = now + EXECUTOR_REREGISTRATION_TIMEOUT_S

    def _add(self, ex: Executor) -> None:
        self.executors[ex.executor_id] = ex
        self.by_task[(ex.framework_id, ex.task_id)] = ex.executor_id

    def state(self) -> AgentState:
        """The checkpointed state, which is also the re-registration message."""
        st = AgentState()
        st.agent_info.CopyFrom(self.info)
        st.agent_info.agent_id = self.agent_id
        for ex in self.executors.values():
            t = st.tasks.add(framework_id=ex.framework_id, executor_id=ex.executor_id)
            t.task_info.CopyFrom(ex.task)
            t.latest_status.task_id = ex.task_id
            t.latest_status.state = ex.state
            t.latest_status.agent_id = self.agent_id
            t.latest_status.executor_id = ex.executor_id
            st.executors.add(executor_id=ex.executor_id, framework_id=ex.framework_id,
                             agent_id=self.agent_id, task_ids=[ex.task_id],
                             container_id=ex.container_id, pid=ex.pid)
        used = {ex.framework_id for ex in self.executors.values()}
        st.frameworks.extend(fw for fid, fw in self.frameworks.items() if fid in used)
        return st

    # -- the master ------------------------------------------------------------------------
    def master_detected(self, now: float) -> list[Command]:
        """The shell connected to a (new) leading master: (re-)register at once."""
        self.registration = Registration.REGISTERING
        self.updates.pause()
        self._register_backoff.reset()
        return self._register(now)

    def master_lost(self, now: float) -> list[Command]:
        self.registration = Registration.DISCONNECTED
        self._register_at = None
        self.updates.pause()
        return []

    def _register(self, now: float) -> list[Command]:
        call = agent_pb2.AgentCall(agent_id=self.agent_id)
        if self.agent_id:
            call.reregister.CopyFrom(self.state())
        else:
            call.register.agent_info.CopyFrom(self.info)
        self._register_at = now + self._register_backoff.next_delay() + 1.0
        return [ToMaster(call)]

    def master_error(self, code: int, now: float) -> list[Command]:
        """The master refused a call: not registered on this connection (or not leading)
        means register again."""
        refused = code in (bus_pb2.NOT_REGISTERED, bus_pb2.NOT_LEADER)
        if refused and self.registration is not Registration.REGISTERING:
            self.registration = Registration.REGISTERING
            self.updates.pause()
            return self._register(now)
        return []

    def master_event(self, event: agent_pb2.AgentEvent, now: float) -> list[Command]:
        kind = event.WhichOneof("event")
        if kind in ("registered", "reregistered"):
            reply = getattr(event, kind)
            return self._registered(reply.agent_id, reply.master_epoch, now)
        if self.registration is not Registration.REGISTERED:
            return []  # from a master we are not registered with: ignore until we are
        if kind == "run_tasks":
            return self._run_tasks(event.run_tasks, now)
        if kind == "kill_task":
            k = event.kill_task
            grace = k.kill_grace_period_s if k.HasField("kill_grace_period_s") else None
            return self.kill(k.framework_id, k.task_id, grace, now)
        if kind == "acknowledgements":
            cmds: list[Command] = []
            for ack in event.acknowledgements.acks:
                cmds += self._updates(self.updates.acknowledge(ack.framework_id, ack.task_id,
                                                               ack.uuid))
            return cmds
        if kind == "reconcile":
            return self._reconcile(event.reconcile, now)
        if kind == "shutdown_framework":
            fid = event.shutdown_framework.framework_id
            cmds = []
            for ex in [e for e in self.executors.values() if e.framework_id == fid]:
                cmds += self.kill(fid, ex.task_id, None, now)
            return cmds
        if kind == "shutdown":
            cmds = []
            for ex in list(self.executors.values()):
                cmds += self.kill(ex.framework_id, ex.task_id, None, now)
            return cmds
        if kind == "logs_request":
            req = event.logs_request
            ex_id = self.by_task.get((req.framework_id, req.task_id))
            if ex_id is None and not req.framework_id:  # operators may omit the framework
                ex_id = next((e.executor_id for e in self.executors.values()
                              if e.task_id == req.task_id), None)
            return [FetchLogs(req, ex_id)]
        return []

    def _registered(self, agent_id: str, epoch: int, now: float) -> list[Command]:
        cmds: list[Command] = []
        if agent_id and agent_id != self.agent_id:
            self.agent_id = agent_id
            self.info.agent_id = agent_id
            cmds.append(SaveAgentId(agent_id))
        self.registration = Registration.REGISTERED
        self.master_epoch = epoch
        self._register_at = None
        cmds += self._updates(self.updates.master_changed(now))
        return cmds

    def _run_tasks(self, run: agent_pb2.AgentEvent.RunTasks, now: float) -> list[Command]:
        for fw in run.frameworks:
            self.frameworks[fw.framework_id] = fw
        cmds: list[Command] = []
        for launch in run.launches:
            key = (launch.framework_id, launch.task.task_id)
            if key in self.by_task:
                self.duplicate_launches += 1  # a task is never launched twice
                continue
            ex = Executor(f"{launch.task.task_id}.{self._new_id()}", launch.framework_id,
                          launch.task, self.frameworks.get(launch.framework_id,
                                                           common_pb2.FrameworkInfo()),
                          launched_at=now, traceparent=launch.traceparent)
            self._add(ex)
            cmds.append(LaunchExecutor(ex.executor_id, ex.framework_id, ex.task_id,
                                       launch.traceparent))
        if cmds:
            cmds.append(SaveState(self.state()))
        return cmds

    def _reconcile(self, rec: agent_pb2.AgentEvent.Reconcile, now: float) -> list[Command]:
        cmds: list[Command] = []
        for t in rec.tasks:
            if (t.framework_id, t.task_id) not in self.by_task:
                cmds += self._agent_update(t.framework_id, t.task_id, "",
                                           TaskState.TASK_DROPPED,
                                           TaskStatus.REASON_RECONCILIATION,
                                           "task unknown to this agent", now)
        return cmds

    # -- kills -----------------------------------------------------------------------------
    def kill(self, framework_id: str, task_id: str, grace: float | None,
             now: float) -> list[Command]:
        ex_id = self.by_task.get((framework_id, task_id))
        if ex_id is None:
            return self._agent_update(framework_id, task_id, "", TaskState.TASK_DROPPED,
                                      TaskStatus.REASON_RECONCILIATION,
                                      "kill of a task unknown to this agent", now)
        ex = self.executors[ex_id]
        if tasks.is_terminal(ex.state):
            return []
        if grace is None:
            grace = ex.task.kill_grace_period_s if ex.task.HasField("kill_grace_period_s") \
                else 3.0
        if ex.peer is None:
            ex.kill_grace_s = grace  # delivered when the executor subscribes
            return []
        event = executor_pb2.ExecutorEvent()
        event.kill.task_id = task_id
        event.kill.kill_grace_period_s = grace
        return [ToExecutor(ex.peer, event)]

    # -- executors -------------------------------------------------------------------------
    def executor_launched(self, executor_id: str, pid: int) -> list[Command]:
        ex = self.executors.get(executor_id)
        if ex is None:
            return []
        ex.pid = pid
        return [SaveState(self.state())]

    def launch_traced(self, executor_id: str, traceparent: str) -> list[Command]:
        """The shell traces this launch: the executor's Launch carries `traceparent`."""
        ex = self.executors.get(executor_id)
        if ex is not None and traceparent:
            ex.traceparent = traceparent
        return []

    def executor_call(self, peer: bytes, call: executor_pb2.ExecutorCall,
                      now: float) -> list[Command]:
        ex = self.executors.get(call.executor_id)
        if ex is None or ex.framework_id != call.framework_id:
            event = executor_pb2.ExecutorEvent()
            event.shutdown.grace_period_s = 0.0
            return [ToExecutor(peer, event)]  # nobody knows this executor: it must stop
        kind = call.WhichOneof("call")
        cmds: list[Command] = []
        if kind == "subscribe":
            ex.peer = peer
            sub = call.subscribe
            ev = executor_pb2.ExecutorEvent()
            ev.subscribed.agent_id = self.agent_id
            info = ev.subscribed.executor_info
            info.executor_id, info.framework_id = ex.executor_id, ex.framework_id
            info.agent_id = self.agent_id
            info.task_ids.append(ex.task_id)
            ev.subscribed.framework_info.CopyFrom(ex.framework)
            cmds.append(ToExecutor(peer, ev))
            if not sub.unacknowledged_tasks and ex.state == TaskState.TASK_STAGING:
                launch = executor_pb2.ExecutorEvent()
                launch.launch.framework_id = ex.framework_id
                launch.launch.task.CopyFrom(ex.task)
                cmds.append(ToExecutor(peer, launch, ex.traceparent))
            for status in sub.unacknowledged_updates:
                cmds += self._executor_update(ex, status)
            if ex.kill_grace_s is not None:
                grace, ex.kill_grace_s = ex.kill_grace_s, None
                cmds += self.kill(ex.framework_id, ex.task_id, grace, now)
        elif kind == "update":
            cmds += self._executor_update(ex, call.update.status)
        return cmds

    def _executor_update(self, ex: Executor, status: TaskStatus) -> list[Command]:
        if status.task_id != ex.task_id:
            return []
        if status.container_id:
            ex.container_id = status.container_id
        status.agent_id = self.agent_id
        status.executor_id = ex.executor_id
        if tasks.can_transition(ex.state, status.state) or ex.state == status.state:
            ex.state = status.state
        return self._updates(self.updates.update(ex.framework_id, status))

    def executor_exited(self, executor_id: str, now: float) -> list[Command]:
        """The executor's process is gone (the shell watches pids)."""
        ex = self.executors.get(executor_id)
        if ex is None or ex.exited:
            return []
        ex.exited = True
        ex.peer = None
        cmds: list[Command] = []
        if not tasks.is_terminal(ex.state):
            cmds += self._agent_update(ex.framework_id, ex.task_id, ex.executor_id,
                                       TaskState.TASK_FAILED,
                                       TaskStatus.REASON_EXECUTOR_TERMINATED,
                                       "the executor exited before its task ended", now)
        call = agent_pb2.AgentCall(agent_id=self.agent_id)
        call.executor_exited.framework_id = ex.framework_id
        call.executor_exited.executor_id = ex.executor_id
        if self.registration is Registration.REGISTERED:
            cmds.append(ToMaster(call))
        return cmds

    def executor_launch_failed(self, executor_id: str, message: str,
                               now: float) -> list[Command]:
        ex = self.executors.get(executor_id)
        if ex is None:
            return []
        ex.exited = True
        return self._agent_update(ex.framework_id, ex.task_id, ex.executor_id,
                                  TaskState.TASK_FAILED,
                                  TaskStatus.REASON_EXECUTOR_TERMINATED,
                                  f"could not start the executor: {message}", now)

    # -- status updates --------------------------------------------------------------------
    def _agent_update(self, framework_id: str, task_id: str, executor_id: str,
                      state: TaskState.ValueType, reason: TaskStatus.Reason.ValueType,
                      message: str, now: float) -> list[Command]:
        status = TaskStatus(task_id=task_id, state=state, reason=reason,
                            source=TaskStatus.SOURCE_AGENT, message=message,
                            uuid=uuidlib.uuid4().bytes, agent_id=self.agent_id,
                            executor_id=executor_id, timestamp_us=int(now * 1e6))
        ex = self.executors.get(executor_id) if executor_id else None
        if ex is not None and tasks.can_transition(ex.state, state):
            ex.state = state
        return self._updates(self.updates.update(framework_id, status))

    def checkpointed(self, record: su.Record, now: float) -> list[Command]:
        """The shell made `record` durable."""
        return self._updates(self.updates.checkpointed(record, now))

    def _updates(self, outs: list[su.Output]) -> list[Command]:
        cmds: list[Command] = []
        for out in outs:
            if isinstance(out, su.Checkpoint):
                cmds.append(out)
            elif isinstance(out, su.AckExecutor):
                ex = self.executors.get(self.by_task.get((out.framework_id, out.task_id), ""))
                if ex is not None and ex.peer is not None:
                    ev = executor_pb2.ExecutorEvent()
                    ev.acknowledged.task_id, ev.acknowledged.uuid = out.task_id, out.uuid
                    cmds.append(ToExecutor(ex.peer, ev))
            elif isinstance(out, su.Forward):
                call = agent_pb2.AgentCall(agent_id=self.agent_id)
                call.status_updates.updates.extend(out.updates)
                cmds.append(ToMaster(call))
            elif isinstance(out, su.StreamEnded):
                ex_id = self.by_task.pop((out.framework_id, out.task_id), None)
                if ex_id is not None:
                    self.executors.pop(ex_id, None)
                    cmds.append(SaveState(self.state()))
        return cmds

    # -- time ------------------------------------------------------------------------------
    def tick(self, now: float) -> list[Command]:
        cmds: list[Command] = []
        if (self.registration is Registration.REGISTERING and self._register_at is not None
                and now >= self._register_at):
            cmds += self._register(now)
        for ex in list(self.executors.values()):
            if ex.peer is None and not ex.exited and not tasks.is_terminal(ex.state):
                recovering = self._recovery_deadline is not None and ex.pid > 0
                deadline = (self._recovery_deadline if recovering and self._recovery_deadline
                            else ex.launched_at + EXECUTOR_REGISTRATION_TIMEOUT_S)
                if now >= deadline:
                    reason = (TaskStatus.REASON_EXECUTOR_REREGISTRATION_TIMEOUT if recovering
                              else TaskStatus.REASON_EXECUTOR_REGISTRATION_TIMEOUT)
                    ex.exited = True
                    cmds += self._agent_update(ex.framework_id, ex.task_id, ex.executor_id,
                                               TaskState.TASK_FAILED, reason,
                                               "the executor never (re)subscribed", now)
        cmds += self._updates(self.updates.tick(now))
        return cmds

    def next_deadline(self) -> float | None:
        return self.updates.next_deadline()

    def validate(self) -> None:
        assert set(self.by_task.values()) == set(self.executors)
        for key, ex_id in self.by_task.items():
            ex = self.executors[ex_id]
            assert key == (ex.framework_id, ex.task_id)
        self.updates.validate()


__all__ = ["AgentCore", "Command", "Executor", "FetchLogs", "LaunchExecutor", "Registration",
           "SaveAgentId", "SaveState", "ToExecutor", "ToMaster"]
