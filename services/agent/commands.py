"""The commands the agent's pure core (core.py) gives its shell: messages to the master and to
executors, executor launches, checkpoints, and the container work the shell carries out on a
worker thread (scan for orphans, stop an executor's containers, remove orphans)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from schemas import agent_pb2, common_pb2, executor_pb2
from services.agent import status_updates as su
from services.executor.runtime import Handle
from services.notice import Notice

AgentState = agent_pb2.AgentCall.Reregister


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
    cluster_id: str = ""  # the executor labels its container with it


@dataclass(frozen=True)
class SaveState:
    """Atomically checkpoint the agent's state (also its re-registration message)."""

    state: AgentState


@dataclass(frozen=True)
class SaveResources:
    """Atomically checkpoint the agent's total with its reservations (the master's
    CheckpointResources), reported as its resources from then on, across restarts."""

    resources: tuple[common_pb2.Resource, ...]


@dataclass(frozen=True)
class SaveAgentId:
    agent_id: str


@dataclass(frozen=True)
class SaveClusterId:
    """Checkpoint the cluster id (before anything is launched with it)."""

    cluster_id: str


@dataclass(frozen=True)
class LeaveMaster:
    """Disconnect from the current master (it belongs to another cluster); connect again only
    when a (new) leading master is detected."""

    why: str


@dataclass(frozen=True)
class FetchLogs:
    """Read a task's container output and answer the master with AgentCall.LogsReply."""

    request: agent_pb2.AgentEvent.LogsRequest
    executor_id: str | None  # None: the task is unknown here
    max_bytes: int  # what the reply may carry: the request's, capped (core.MAX_LOG_BYTES)


@dataclass(frozen=True)
class StopContainers:
    """Find the containers carrying all of `labels` (one executor's), kill and remove them,
    then call AgentCore.containers_stopped(executor_id, ...)."""

    executor_id: str
    labels: Mapping[str, str]


@dataclass(frozen=True)
class ScanContainers:
    """List the containers carrying all of `labels` (this cluster's, this agent's), then call
    AgentCore.containers_found(...)."""

    labels: Mapping[str, str]


@dataclass(frozen=True)
class RemoveContainers:
    """Kill and remove these containers (orphans), then call AgentCore.orphans_removed()."""

    handles: tuple[Handle, ...]


Command = (ToMaster | ToExecutor | LaunchExecutor | SaveState | SaveResources | SaveAgentId
           | SaveClusterId | LeaveMaster | FetchLogs | StopContainers | ScanContainers
           | RemoveContainers | Notice | su.Checkpoint)
