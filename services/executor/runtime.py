"""The runtime port (after Nomad's driver plugins and Mesos's containerizers): what the executor
needs from a container engine, the shared value types, and ContainerSpec built from a TaskInfo."""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal, Protocol, TypeAlias, runtime_checkable

from schemas import common_pb2

TaskStatus = common_pb2.TaskStatus
Reason: TypeAlias = common_pb2.TaskStatus.Reason.ValueType

REASON_IMAGE_NOT_FOUND: Reason = TaskStatus.REASON_IMAGE_NOT_FOUND
REASON_CONTAINER_LAUNCH_FAILED: Reason = TaskStatus.REASON_CONTAINER_LAUNCH_FAILED
REASON_TASK_UNAUTHORIZED: Reason = TaskStatus.REASON_TASK_UNAUTHORIZED

# Labels Offerbus puts on every container (Docker labels) or process record, so a restarted
# agent finds what it started. LABEL_CLUSTER names the cluster (its id from the registry):
# whatever removes containers (agent orphan cleanup, `offerbus down`, tests) filters on it.
LABEL_CLUSTER = "org.offerbus.cluster_id"
LABEL_AGENT = "org.offerbus.agent_id"
LABEL_FRAMEWORK = "org.offerbus.framework_id"
LABEL_TASK = "org.offerbus.task_id"
LABEL_EXECUTOR = "org.offerbus.executor_id"
NAME_PREFIX = "offerbus-"

Stream = Literal["stdout", "stderr"]


class LaunchError(Exception):
    """The container (or process) could not be started; `reason` is a TaskStatus.Reason."""

    def __init__(self, reason: Reason, message: str) -> None:
        super().__init__(message)
        self.reason = reason
        self.message = message


class RuntimeFailure(Exception):
    """A runtime call other than start failed (the engine does not answer, ...)."""


@dataclass(frozen=True)
class PortMapping:
    host_port: int
    container_port: int
    protocol: str = "tcp"


@dataclass(frozen=True)
class Volume:
    host_path: str
    container_path: str
    read_only: bool = False


@dataclass(frozen=True)
class ContainerSpec:
    """Everything a runtime needs to start one task. `entrypoint` None keeps the image's
    entrypoint (Docker); `command` None keeps the image's command. The process runtime execs
    entrypoint + command, so it needs at least one of them."""

    name: str
    image: str = ""
    entrypoint: tuple[str, ...] | None = None
    command: tuple[str, ...] | None = None
    env: Mapping[str, str] = field(default_factory=dict)
    cpus: float | None = None  # cores; None = no limit
    mem_mib: float | None = None  # MiB; None = no limit
    ports: tuple[PortMapping, ...] = ()
    network: Literal["bridge", "host", "none"] = "bridge"
    labels: Mapping[str, str] = field(default_factory=dict)
    sandbox: str = ""  # host directory: cwd and log files of a process
    volumes: tuple[Volume, ...] = ()  # host paths bound in (Docker; the agent's allowed list)
    privileged: bool = False  # asked for: always refused (services/container_policy.py)

    @property
    def nano_cpus(self) -> int | None:
        return None if not self.cpus else round(self.cpus * 1e9)

    @property
    def mem_bytes(self) -> int | None:
        return None if not self.mem_mib else int(self.mem_mib * 1024 * 1024)

    @property
    def argv(self) -> tuple[str, ...]:
        return (self.entrypoint or ()) + (self.command or ())


@dataclass(frozen=True)
class Handle:
    """A started container or process. `container_id` is the runtime's own id (Docker id,
    or `<name>.<pid>` for a process)."""

    runtime: str
    container_id: str
    name: str
    labels: Mapping[str, str] = field(default_factory=dict)
    pid: int | None = None
    sandbox: str = ""

    @property
    def id(self) -> str:
        return self.container_id


@dataclass(frozen=True)
class ExitInfo:
    """How a container ended. `exit_code` is None when it cannot be known (a process that is
    not our child, a container removed under us); killed by signal N reads as 128 + N."""

    exit_code: int | None
    oom_killed: bool = False
    message: str = ""


@dataclass(frozen=True)
class Logs:
    data: bytes
    truncated: bool  # True when older output was left out (tail_lines or max_bytes)
    next_offset: int = 0  # from-offset reads (since_bytes): the byte offset after `data`


EXEC_OUTPUT_BYTES = 4096  # what exec() keeps of a command's output (its last bytes)


@dataclass(frozen=True)
class ExecResult:
    """How a command run inside a container ended: its exit code (None when it timed out or
    could not run) and the last bytes of its stdout and stderr, interleaved."""

    exit_code: int | None
    output: bytes = b""
    timed_out: bool = False
    truncated: bool = False


@runtime_checkable
class Runtime(Protocol):
    """A container engine. Every call blocks: shells run them on worker threads."""

    name: str

    def start(self, spec: ContainerSpec) -> Handle:
        """Create and start; raises LaunchError. Never pulls an image from a registry."""
        ...

    def wait(self, handle: Handle, timeout: float | None) -> ExitInfo | None:
        """Block until the container exits (ExitInfo) or `timeout` passes (None)."""
        ...

    def signal(self, handle: Handle, sig: int) -> None:
        ...

    def kill(self, handle: Handle, grace_s: float) -> ExitInfo | None:
        """SIGTERM, then SIGKILL if still running after `grace_s`; returns how it ended."""
        ...

    def logs(self, handle: Handle, stream: Stream, tail_lines: int | None = None,
             max_bytes: int = 1 << 20, since_bytes: int | None = None) -> Logs:
        """The tail of a stream; with `since_bytes`, at most `max_bytes` from that byte
        offset on instead (follow mode; `tail_lines` ignored)."""
        ...

    def find(self, labels: Mapping[str, str]) -> list[Handle]:
        """Containers (running or exited, not removed) carrying all of `labels`."""
        ...

    def remove(self, handle: Handle) -> None:
        """Kill if still running and forget it; a handle already gone is fine."""
        ...

    def exec(self, handle: Handle, argv: Sequence[str], timeout_s: float,
             max_bytes: int = EXEC_OUTPUT_BYTES) -> ExecResult:
        """Run `argv` inside the running container (a process: in its sandbox, with its
        environment); at most `timeout_s` seconds, after which it is killed. Keeps the last
        `max_bytes` of the output. Raises RuntimeFailure when the engine cannot run it."""
        ...


class BoundedBuffer:
    """The last `limit` bytes written to it (command output is bounded)."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.data = bytearray()
        self.truncated = False

    def write(self, chunk: bytes) -> None:
        self.data += chunk
        if len(self.data) > self.limit:
            del self.data[:len(self.data) - self.limit]
            self.truncated = True

    def bytes(self) -> bytes:
        return bytes(self.data)


def clip(data: bytes, tail_lines: int | None, max_bytes: int) -> Logs:
    """The last `tail_lines` lines and at most the last `max_bytes` bytes of `data`."""
    truncated = False
    if tail_lines is not None:
        lines = data.splitlines(keepends=True)
        if len(lines) > tail_lines:
            data, truncated = b"".join(lines[-tail_lines:] if tail_lines else []), True
    if len(data) > max_bytes:
        data, truncated = data[len(data) - max_bytes:], True
    return Logs(data, truncated)


def clip_stream(chunks: Iterable[bytes], tail_lines: int | None, max_bytes: int) -> Logs:
    """`clip` of a stream read chunk by chunk, holding only its last `max_bytes` + 1 bytes
    (a log of any size; the answer never holds more, lines included)."""
    buf = BoundedBuffer(max(max_bytes, 0) + 1)  # one byte more tells "truncated" apart
    for chunk in chunks:
        buf.write(chunk)
    out = clip(buf.bytes(), tail_lines, max_bytes)
    return Logs(out.data, out.truncated or buf.truncated)


def tail_file(path: str | os.PathLike[str], tail_lines: int | None, max_bytes: int) -> Logs:
    """`clip` of a file, reading only its end (a missing file: no logs)."""
    try:
        with open(path, "rb") as f:
            size = f.seek(0, os.SEEK_END)
            start = max(0, size - max_bytes - 1)  # one byte more tells "truncated" apart
            f.seek(start)
            data = f.read(size - start)
    except OSError:
        return Logs(b"", False)
    out = clip(data, tail_lines, max_bytes)
    return Logs(out.data, out.truncated or start > 0)


def from_offset(chunks: Iterable[bytes], since_bytes: int, max_bytes: int) -> Logs:
    """At most `max_bytes` of a stream from byte `since_bytes` on; the chunks before it are
    dropped as they come, so nothing more is held. `truncated`: more follows."""
    pos, out, limit = 0, bytearray(), max(max_bytes, 0)
    for chunk in chunks:
        end = pos + len(chunk)
        if end > since_bytes:
            out += chunk[max(0, since_bytes - pos):]
            if len(out) > limit:
                del out[limit:]
                return Logs(bytes(out), True, since_bytes + limit)
        pos = end
    # a stream shorter than the offset: nothing new yet, and the offset stays (never repeat)
    return Logs(bytes(out), False, since_bytes + len(out))


def read_file_from(path: str | os.PathLike[str], since_bytes: int, max_bytes: int) -> Logs:
    """`from_offset` of a file: one seek and at most `max_bytes` + 1 bytes read."""
    try:
        with open(path, "rb") as f:
            f.seek(since_bytes)  # past the end: reads nothing, the offset stays
            data = f.read(max(max_bytes, 0) + 1)
    except OSError:
        return Logs(b"", False, since_bytes)
    more = len(data) > max_bytes
    data = data[:max(max_bytes, 0)]
    return Logs(data, more, since_bytes + len(data))


def container_name(executor_id: str) -> str:
    return f"{NAME_PREFIX}{executor_id}"


def offerbus_labels(agent_id: str, framework_id: str, task_id: str, executor_id: str,
                    cluster_id: str = "") -> dict[str, str]:
    """The labels of a task's container. LABEL_CLUSTER only when the cluster id is known:
    a container without it is never removed by an agent's orphan cleanup."""
    labels = {LABEL_AGENT: agent_id, LABEL_FRAMEWORK: framework_id, LABEL_TASK: task_id,
              LABEL_EXECUTOR: executor_id}
    if cluster_id:
        labels[LABEL_CLUSTER] = cluster_id
    return labels


def executor_labels(agent_id: str, executor_id: str) -> dict[str, str]:
    """The labels that find the containers of one executor of this agent. Its id is unique
    (a random suffix), so no cluster label is asked for: containers started before the agent
    knew its cluster id carry none, and must be found too."""
    return {LABEL_AGENT: agent_id, LABEL_EXECUTOR: executor_id}


_NETWORKS: dict[int, Literal["bridge", "host", "none"]] = {
    common_pb2.ContainerInfo.NETWORK_MODE_HOST: "host",
    common_pb2.ContainerInfo.NETWORK_MODE_NONE: "none",
}


def spec_from_task(task: common_pb2.TaskInfo, *, framework_id: str, executor_id: str,
                   agent_id: str = "", sandbox: str = "", cluster_id: str = "") -> ContainerSpec:
    """The ContainerSpec of a TaskInfo. CommandInfo: shell -> `/bin/sh -c value`; otherwise
    `value` replaces the entrypoint and `arguments` are the command (empty = image default)."""
    cmd = task.command
    entrypoint: tuple[str, ...] | None
    command: tuple[str, ...] | None
    if cmd.shell:
        entrypoint, command = ("/bin/sh", "-c"), (cmd.value,)
    else:
        entrypoint = (cmd.value,) if cmd.value else None
        command = tuple(cmd.arguments) or None
    cpus = sum(r.scalar for r in task.resources if r.name == "cpus") or None
    mem = sum(r.scalar for r in task.resources if r.name == "mem") or None
    docker = task.container.docker
    ports = tuple(PortMapping(p.host_port, p.container_port, p.protocol or "tcp")
                  for p in docker.port_mappings)
    labels = dict(docker.labels)
    labels.update(offerbus_labels(agent_id or task.agent_id, framework_id, task.task_id,
                                  executor_id, cluster_id))
    return ContainerSpec(
        name=container_name(executor_id), image=docker.image, entrypoint=entrypoint,
        command=command, env=dict(cmd.env), cpus=cpus, mem_mib=mem, ports=ports,
        network=_NETWORKS.get(docker.network, "bridge"), labels=labels, sandbox=sandbox,
        volumes=tuple(Volume(v.host_path, v.container_path, v.read_only)
                      for v in task.container.volumes),
        privileged=task.container.privileged)


def make_runtime(kind: str, root: str | Path) -> Runtime:
    """The runtime named `kind`. `root`: where the process runtime keeps (and find() looks
    for) its process records: the agent's sandboxes folder, or one executor's sandbox."""
    if kind == "docker":
        from services.executor.docker_runtime import DockerRuntime

        return DockerRuntime()
    if kind == "process":
        from services.executor.process_runtime import ProcessRuntime

        return ProcessRuntime(Path(root))
    raise ValueError(f"unknown runtime {kind!r}: docker or process")
