"""One executor as the agent core keeps it (its task, process, peer, state, and the stopping of
its containers once it is gone), and the agent's executor timeouts."""

from __future__ import annotations

from dataclasses import dataclass

from schemas import common_pb2

TaskState = common_pb2.TaskState
TaskStatus = common_pb2.TaskStatus

EXECUTOR_REGISTRATION_TIMEOUT_S = 30.0  # launched executors must subscribe within this
EXECUTOR_REREGISTRATION_TIMEOUT_S = 10.0  # after an agent restart, executors must come back
STOP_RETRY_INITIAL_S = 1.0  # stopping a dead executor's containers failed: retry after ...
STOP_RETRY_MAX_S = 8.0  # ... doubling up to this
STOP_ATTEMPTS = 5  # then the task is reported anyway (the failure is logged as an error)


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
    # The master's reason for the kill (KillTask.reason), for the TASK_KILLED update.
    kill_reason: common_pb2.TaskStatus.Reason.ValueType = TaskStatus.REASON_UNSPECIFIED
    exited: bool = False
    # Its process is gone (or never came back): its containers are being stopped; the
    # task is reported (gone_reason, gone_message) only once they are.
    stopping: bool = False
    stop_attempts: int = 0
    stop_retry_at: float | None = None
    gone_state: TaskState.ValueType = TaskState.TASK_FAILED
    gone_reason: common_pb2.TaskStatus.Reason.ValueType = TaskStatus.REASON_EXECUTOR_TERMINATED
    gone_message: str = ""
    recovered: bool = False  # from the checkpoint after a restart: it must come back
    # Handed to the executor with its Launch (whenever it subscribes): the master's
    # RunTasks.Launch.traceparent, until the shell's `run` span replaces it (launch_traced).
    traceparent: str = ""

    @property
    def task_id(self) -> str:
        return self.task.task_id
