"""The agent's pure core: registration with the master and the cluster's identity (checkpointed;
a master of another cluster is refused), the table of executors and their tasks (each launched
at most once), kills, executor deaths (containers stopped before the task is reported), orphan
containers after a restart, reconciliation, recovery, and every timer (`next_deadline`). It
drives the status update manager (status_updates.py). No sockets, disk, clock or Docker:
events and `now` in, commands out (commands.py); the shell (shell.py) carries them out."""

from __future__ import annotations

import enum
import uuid as uuidlib
from collections.abc import Callable, Iterable, Sequence

from schemas import agent_pb2, bus_pb2, common_pb2, executor_pb2
from services import report_digest, tasks
from services.agent import status_updates as su
from services.agent.commands import (
    Command,
    FetchLogs,
    LaunchExecutor,
    LeaveMaster,
    RemoveContainers,
    SaveAgentId,
    SaveClusterId,
    SaveResources,
    SaveState,
    ScanContainers,
    StopContainers,
    ToExecutor,
    ToMaster,
)
from services.agent.containers import ContainerHousekeeping, Scan
from services.agent.executors import (
    EXECUTOR_REGISTRATION_TIMEOUT_S,
    EXECUTOR_REREGISTRATION_TIMEOUT_S,
    Executor,
)
from services.agent.reservations import AgentResources
from services.bus.codec import DEFAULT_FRAME_LIMIT
from services.bus.liveness import Backoff
from services.executor.runtime import (
    LABEL_AGENT,
    LABEL_CLUSTER,
)
from services.notice import Notice
from services.resources import Resources

TaskState = common_pb2.TaskState
TaskStatus = common_pb2.TaskStatus
AgentState = agent_pb2.AgentCall.Reregister
# A log reply travels agent -> master -> CLI in one frame: never ask for more than half the
# frame limit (the rest is room for the envelope and the master's relay).
DEFAULT_LOG_BYTES = 1 << 20
MAX_LOG_BYTES = DEFAULT_FRAME_LIMIT // 2

class Registration(enum.Enum):
    DISCONNECTED = "disconnected"  # no master known
    REGISTERING = "registering"  # Register/Reregister sent, no answer yet
    REGISTERED = "registered"
    REFUSED = "refused"  # the master belongs to another cluster: left until a new leader


class AgentCore(ContainerHousekeeping):
    def __init__(
        self, info: common_pb2.AgentInfo, *, now: float,
        recovered: AgentState | None = None, records: Iterable[su.Record] = (),
        new_id: Callable[[], str] = lambda: uuidlib.uuid4().hex[:8], cluster_id: str = "",
    ) -> None:
        self.info = common_pb2.AgentInfo()
        self.info.CopyFrom(info)
        self.agent_id = info.agent_id
        # `info.resources` (its flags) are the base of what it reports (reservations.py).
        self.resources = AgentResources(Resources.from_proto(info.resources))
        self.cluster_id = cluster_id  # checkpointed; "" until a master names the cluster
        self.scan = Scan.WAITING
        self.cluster_mismatches = 0
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
            task_id = t.task_info.task_id
            if self.updates.ended(t.framework_id, task_id):
                continue  # its terminal update was acknowledged just before the crash
            info = executors.get(t.executor_id)
            # The table is saved at launch; the task's later states are in the update log.
            latest = self.updates.latest_state(t.framework_id, task_id)
            ex = Executor(t.executor_id, t.framework_id, t.task_info,
                          self.frameworks.get(t.framework_id, common_pb2.FrameworkInfo()),
                          launched_at=now, pid=info.pid if info else 0,
                          container_id=info.container_id if info else "",
                          state=latest or t.latest_status.state or TaskState.TASK_STAGING,
                          recovered=True)
            self._add(ex)
        self._recovery_deadline = now + EXECUTOR_REREGISTRATION_TIMEOUT_S

    def recover_resources(self, checkpoint: Sequence[common_pb2.Resource]) -> list[Command]:
        """The total with reservations checkpointed in the work dir (the shell reads it at
        start, before a master is detected): reported from now on if it fits the flags."""
        return self._reported(self.resources.recover(checkpoint))

    def _reported(self, cmds: list[Command]) -> list[Command]:
        del self.info.resources[:]
        self.info.resources.extend(self.resources.total.to_proto())
        return cmds

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

    def master_link_reset(self, now: float) -> list[Command]:
        """The connection to the master broke and came back before either side's heartbeats
        noticed: what either side sent meanwhile may be lost (a launch, a kill, an
        acknowledgement). Register again: the master reconciles every task it has here (a
        launch we never saw is answered TASK_DROPPED) and resends what it holds for us."""
        if self.registration is not Registration.REGISTERED:
            return []  # a registration is under way (retried on its timer), or no master
        return self.master_detected(now)

    def master_lost(self, now: float) -> list[Command]:
        self.registration = Registration.DISCONNECTED
        self._register_at = None
        self.updates.pause()
        return []

    def _register(self, now: float) -> list[Command]:
        call = agent_pb2.AgentCall(agent_id=self.agent_id)
        if self.agent_id:
            call.reregister.CopyFrom(self.state())
            call.reregister.tasks_digest = report_digest.of_report(call.reregister.tasks)
        else:
            call.register.agent_info.CopyFrom(self.info)
        self._register_at = now + self._register_backoff.next_delay()
        return [ToMaster(call)]

    def master_error(self, code: int, now: float) -> list[Command]:
        """The master refused a call: not registered on this connection (or not leading)
        means register again."""
        refused = code in (bus_pb2.NOT_REGISTERED, bus_pb2.NOT_LEADER)
        if refused and self.registration in (Registration.REGISTERED,
                                             Registration.DISCONNECTED):
            self.registration = Registration.REGISTERING
            self.updates.pause()
            return self._register(now)
        return []

    def master_event(self, event: agent_pb2.AgentEvent, now: float) -> list[Command]:
        kind = event.WhichOneof("event")
        if kind in ("registered", "reregistered"):
            reply = getattr(event, kind)
            if self.registration is Registration.REFUSED:
                return []
            return self._registered(reply.agent_id, reply.master_epoch, reply.cluster_id, now)
        if kind == "shutdown" and self.registration is Registration.REGISTERING:
            return self._shutdown(now)  # the answer to re-registering a gone agent
        if self.registration is not Registration.REGISTERED:
            return []  # from a master we are not registered with: ignore until we are
        if kind == "run_tasks":
            return self._run_tasks(event.run_tasks, now)
        if kind == "kill_task":
            k = event.kill_task
            grace = k.kill_grace_period_s if k.HasField("kill_grace_period_s") else None
            return self.kill(k.framework_id, k.task_id, grace, now, reason=k.reason)
        if kind == "acknowledgements":
            cmds: list[Command] = []
            for ack in event.acknowledgements.acks:
                cmds += self._updates(self.updates.acknowledge(ack.framework_id, ack.task_id,
                                                               ack.uuid, now))
            return cmds
        if kind == "reconcile":
            return self._reconcile(event.reconcile, now)
        if kind == "checkpoint_resources":
            return self._reported(self.resources.checkpoint(
                event.checkpoint_resources.resources))
        if kind == "shutdown_framework":
            fid = event.shutdown_framework.framework_id
            cmds = [cmd for ex in list(self.executors.values()) if ex.framework_id == fid
                    for cmd in self.kill(fid, ex.task_id, None, now)]
            return cmds + self._updates(self.updates.forget_framework(fid))
        if kind == "shutdown":
            return self._shutdown(now)
        if kind == "logs_request":
            req = event.logs_request
            ex_id = self.by_task.get((req.framework_id, req.task_id))
            if ex_id is None and not req.framework_id:  # operators may omit the framework
                ex_id = next((e.executor_id for e in self.executors.values()
                              if e.task_id == req.task_id), None)
            wanted = req.max_bytes or DEFAULT_LOG_BYTES
            return [FetchLogs(req, ex_id, min(wanted, MAX_LOG_BYTES))]
        return []

    def _shutdown(self, now: float) -> list[Command]:
        return [cmd for ex in list(self.executors.values())
                for cmd in self.kill(ex.framework_id, ex.task_id, None, now)]

    def _registered(self, agent_id: str, epoch: int, cluster_id: str,
                    now: float) -> list[Command]:
        if cluster_id and self.cluster_id and cluster_id != self.cluster_id:
            return self._refuse_cluster(cluster_id, now)
        cmds: list[Command] = []
        if cluster_id and not self.cluster_id:
            self.cluster_id = cluster_id
            cmds.append(SaveClusterId(cluster_id))  # before anything is launched with it
        elif not cluster_id:
            cmds.append(Notice.of("master_without_cluster_id",
                                  "the master named no cluster id; containers keep the "
                                  "checkpointed one and no orphan cleanup runs until one is "
                                  "known", "warning", cluster_id=self.cluster_id))
        if agent_id and agent_id != self.agent_id:
            self.agent_id = agent_id
            self.info.agent_id = agent_id
            cmds.append(SaveAgentId(agent_id))
        self.registration = Registration.REGISTERED
        self.master_epoch = epoch
        self._register_at = None
        if self.scan is Scan.WAITING and cluster_id and self.agent_id:
            # Only now is it certain whose containers are ours: this cluster's, this agent's.
            self.scan = Scan.RUNNING
            cmds.append(ScanContainers({LABEL_CLUSTER: self.cluster_id,
                                        LABEL_AGENT: self.agent_id}))
        cmds += self._updates(self.updates.master_changed(now))
        return cmds

    def _refuse_cluster(self, cluster_id: str, now: float) -> list[Command]:
        """A master of another cluster answered: never mix clusters. Nothing is launched for
        it, nothing forwarded to it, no container removed; the shell leaves it, and only a
        newly detected leader is tried again (status updates wait, checkpointed)."""
        self.registration = Registration.REFUSED
        self._register_at = None
        self.updates.pause()
        self.cluster_mismatches += 1
        why = (f"the master belongs to cluster {cluster_id}, this agent to cluster "
               f"{self.cluster_id} (checkpointed in its work dir)")
        return [Notice.of("cluster_mismatch", f"refusing a master of another cluster: {why}",
                          "error", master_cluster_id=cluster_id, cluster_id=self.cluster_id,
                          agent_id=self.agent_id, mismatches=self.cluster_mismatches),
                LeaveMaster(why)]

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
                                       launch.traceparent, self.cluster_id))
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
             now: float, reason: TaskStatus.Reason.ValueType = TaskStatus.REASON_UNSPECIFIED,
             ) -> list[Command]:
        """`reason` (the master's KillTask.reason, e.g. REASON_TASK_REVOKED): put on the
        task's TASK_KILLED update when the executor gives none."""
        ex_id = self.by_task.get((framework_id, task_id))
        if ex_id is None:
            return self._agent_update(framework_id, task_id, "", TaskState.TASK_DROPPED,
                                      TaskStatus.REASON_RECONCILIATION,
                                      "kill of a task unknown to this agent", now)
        ex = self.executors[ex_id]
        if tasks.is_terminal(ex.state):
            return []
        if reason:
            ex.kill_reason = reason
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
        kind = call.WhichOneof("call")
        late = ex is not None and ex.exited and kind == "subscribe"  # given up on: no launch
        if ex is None or ex.framework_id != call.framework_id or late:
            event = executor_pb2.ExecutorEvent()
            event.shutdown.grace_period_s = 0.0
            return [ToExecutor(peer, event)]  # nobody knows this executor: it must stop
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
        elif kind == "update" and ex.peer != peer:
            # Not (yet) subscribed to this agent process: sent while the link was down, it may
            # overtake an earlier update lost with the old connection. Its Subscribe carries
            # every unacknowledged update, in order; taking this one first would refuse those.
            cmds.append(Notice.of("executor_update_unsubscribed", "update from an executor "
                                  "not subscribed to this agent; its Subscribe resends it",
                                  executor_id=ex.executor_id, task_id=call.update.status.task_id))
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
        if status.state == TaskState.TASK_KILLED and ex.kill_reason and not status.reason:
            status.reason = ex.kill_reason
        if tasks.can_transition(ex.state, status.state) or ex.state == status.state:
            ex.state = status.state
        return self._updates(self.updates.update(ex.framework_id, status))

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
    def _is_registered(self) -> bool:
        return self.registration is Registration.REGISTERED

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
            deadline = self._executor_deadline(ex)
            if deadline is None or now < deadline:
                continue
            if ex.stop_retry_at is not None:
                ex.stop_retry_at = None
                cmds.append(self._stop_command(ex))
            elif ex.recovered and ex.pid <= 0 and ex.state == TaskState.TASK_STAGING:
                cmds += self._executor_gone(ex, TaskStatus.REASON_AGENT_RESTARTED,
                                            "the agent restarted before this task's executor "
                                            "started", state=TaskState.TASK_DROPPED)
            elif ex.recovered:
                cmds += self._executor_gone(ex, TaskStatus.REASON_EXECUTOR_REREGISTRATION_TIMEOUT,
                                            "the executor never re-subscribed")
            else:
                cmds += self._executor_gone(ex, TaskStatus.REASON_EXECUTOR_REGISTRATION_TIMEOUT,
                                            "the executor never subscribed")
        cmds += self._updates(self.updates.tick(now))
        return cmds

    def _executor_deadline(self, ex: Executor) -> float | None:
        if ex.stop_retry_at is not None:
            return ex.stop_retry_at
        if ex.peer is not None or ex.exited or tasks.is_terminal(ex.state):
            return None
        if ex.recovered and self._recovery_deadline is not None:
            return self._recovery_deadline
        return ex.launched_at + EXECUTOR_REGISTRATION_TIMEOUT_S

    def next_deadline(self) -> float | None:
        """When tick() has something to do next (None: only events make work): a status
        update (re)send, a registration retry, an executor's (re-)registration timeout, a
        retry to stop a gone executor's containers."""
        times = [t for t in (self._executor_deadline(ex) for ex in self.executors.values())
                 if t is not None]
        if self.registration is Registration.REGISTERING and self._register_at is not None:
            times.append(self._register_at)
        updates = self.updates.next_deadline()
        if updates is not None:
            times.append(updates)
        return min(times, default=None)

    def validate(self) -> None:
        assert set(self.by_task.values()) == set(self.executors)
        for key, ex_id in self.by_task.items():
            ex = self.executors[ex_id]
            assert key == (ex.framework_id, ex.task_id)
            assert not ex.stopping or (ex.exited and ex.peer is None), "stopping: gone"
            assert ex.stop_retry_at is None or ex.stopping, "a stop retry only while stopping"
        if self.registration is Registration.REFUSED:
            assert self.updates.paused, "nothing is forwarded to another cluster's master"
        assert self.scan is Scan.WAITING or self.cluster_id, "a scan needs the cluster id"
        self.updates.validate()


__all__ = ["AgentCore", "Command", "Executor", "FetchLogs", "LaunchExecutor", "LeaveMaster",
           "Registration", "RemoveContainers", "SaveAgentId", "SaveClusterId", "SaveResources",
           "SaveState", "Scan", "ScanContainers", "StopContainers", "ToExecutor", "ToMaster"]
