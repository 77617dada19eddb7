"""The agent core's container housekeeping: a gone executor's containers are stopped (retried
with backoff) before its task is reported, and, once per agent process, the containers of this
cluster and agent that no executor of the checkpoint owns (orphans) are removed. Pure: a part of
AgentCore (core.py), kept here so the core stays readable."""

from __future__ import annotations

import enum
from collections.abc import Iterable, Sequence

from schemas import agent_pb2, common_pb2
from services import tasks
from services.agent.commands import Command, RemoveContainers, StopContainers, ToMaster
from services.agent.executors import (
    STOP_ATTEMPTS,
    STOP_RETRY_INITIAL_S,
    STOP_RETRY_MAX_S,
    Executor,
)
from services.executor.runtime import (
    LABEL_AGENT,
    LABEL_CLUSTER,
    LABEL_EXECUTOR,
    Handle,
    executor_labels,
)
from services.notice import Notice

TaskState = common_pb2.TaskState
TaskStatus = common_pb2.TaskStatus


class Scan(enum.Enum):
    """The orphan-container scan, once per agent process, after a registration confirmed
    this cluster's id."""

    WAITING = "waiting"
    RUNNING = "running"
    DONE = "done"


class ContainerHousekeeping:
    """What AgentCore provides to these handlers."""

    agent_id: str
    cluster_id: str
    executors: dict[str, Executor]
    scan: Scan

    def _is_registered(self) -> bool:
        raise NotImplementedError

    def _agent_update(self, framework_id: str, task_id: str, executor_id: str,
                      state: TaskState.ValueType, reason: TaskStatus.Reason.ValueType,
                      message: str, now: float) -> list[Command]:
        raise NotImplementedError

    def executor_exited(self, executor_id: str, now: float) -> list[Command]:
        """The executor's process is gone (the shell watches pids). Its containers may still
        run: they are stopped first, and only then is the task reported (containers_stopped)
        and its resources given back; never a task reported while its container runs on."""
        ex = self.executors.get(executor_id)
        if ex is None or ex.exited:
            return []
        return self._executor_gone(ex, TaskStatus.REASON_EXECUTOR_TERMINATED,
                                   "the executor exited before its task ended")

    def _executor_gone(self, ex: Executor, reason: TaskStatus.Reason.ValueType,
                       message: str, state: TaskState.ValueType = TaskState.TASK_FAILED,
                       ) -> list[Command]:
        ex.exited = True
        ex.peer = None
        ex.stopping = True
        ex.gone_state, ex.gone_reason, ex.gone_message = state, reason, message
        return [self._stop_command(ex)]

    def _stop_command(self, ex: Executor) -> StopContainers:
        return StopContainers(ex.executor_id,
                              executor_labels(self.agent_id, ex.executor_id))

    def containers_stopped(self, executor_id: str, removed: Sequence[str], error: str,
                           now: float) -> list[Command]:
        """The shell stopped and removed the containers of a gone executor (`removed`: their
        ids), or failed to (`error`): retried with backoff, then reported anyway."""
        ex = self.executors.get(executor_id)
        if ex is None or not ex.stopping or ex.stop_retry_at is not None:
            return []
        cmds: list[Command] = []
        if error:
            ex.stop_attempts += 1
            if ex.stop_attempts < STOP_ATTEMPTS:
                delay = min(STOP_RETRY_INITIAL_S * 2 ** (ex.stop_attempts - 1), STOP_RETRY_MAX_S)
                ex.stop_retry_at = now + delay
                return [Notice.of("container_stop_failed", "could not stop the containers of "
                                  "a gone executor; retrying", "warning",
                                  executor_id=executor_id, error=error, retry_in_s=delay)]
            cmds.append(Notice.of("container_stop_abandoned", "could not stop the containers "
                                  "of a gone executor; reporting its task anyway", "error",
                                  executor_id=executor_id, error=error,
                                  attempts=ex.stop_attempts))
        ex.stopping = False
        if error:
            stopped = f"its container could not be stopped ({error})"
        elif removed:
            ids = ", ".join(c[:12] for c in removed)
            stopped = f"its container was stopped and removed ({ids})"
        else:
            stopped = "it left no container running"
        if removed:
            cmds.append(Notice.of("executor_containers_stopped", "stopped the containers of a "
                                  "gone executor", "info", executor_id=executor_id,
                                  containers=len(removed)))
        if not tasks.is_terminal(ex.state):
            cmds += self._agent_update(ex.framework_id, ex.task_id, ex.executor_id,
                                       ex.gone_state, ex.gone_reason,
                                       f"{ex.gone_message}; {stopped}", now)
        if self._is_registered():
            call = agent_pb2.AgentCall(agent_id=self.agent_id)
            call.executor_exited.framework_id = ex.framework_id
            call.executor_exited.executor_id = ex.executor_id
            cmds.append(ToMaster(call))
        return cmds

    # -- orphan containers -----------------------------------------------------------------
    def orphans(self, found: Iterable[Handle]) -> list[Handle]:
        """The containers that carry this cluster's id and this agent's id and that no
        executor of the checkpoint owns. A container without the cluster label, or of
        another cluster or agent, is never one."""
        if not self.cluster_id or not self.agent_id:
            return []
        return [h for h in found
                if h.labels.get(LABEL_CLUSTER) == self.cluster_id
                and h.labels.get(LABEL_AGENT) == self.agent_id
                and h.labels.get(LABEL_EXECUTOR, "") not in self.executors]

    def containers_found(self, found: Sequence[Handle], error: str,
                         now: float) -> list[Command]:
        """The answer to ScanContainers: remove the orphans among them."""
        if self.scan is not Scan.RUNNING:
            return []
        self.scan = Scan.DONE
        if error:
            return [Notice.of("orphan_scan_failed", "could not list this agent's containers; "
                              "orphans stay until the next restart", "warning", error=error)]
        orphans = self.orphans(found)
        if not orphans:
            return []
        return [Notice.of("orphans_found", "removing containers of this agent that no "
                          "executor owns", "warning", count=len(orphans),
                          containers=",".join(h.name for h in orphans)),
                RemoveContainers(tuple(orphans))]

    def orphans_removed(self, removed: Sequence[str], errors: Sequence[str]) -> list[Command]:
        cmds: list[Command] = []
        if removed:
            cmds.append(Notice.of("orphans_removed", "removed orphan containers", "info",
                                  count=len(removed), containers=",".join(removed)))
        if errors:
            cmds.append(Notice.of("orphan_removal_failed", "could not remove orphan "
                                  "containers", "warning", errors="; ".join(errors)))
        return cmds
