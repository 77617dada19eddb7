"""DockerRuntime: the runtime port on the local Docker engine (docker SDK, low-level API for one
round trip per step). Images must already be on the engine: nothing is ever pulled. Every
container runs unprivileged, with no-new-privileges, some capabilities dropped and a pids
limit; a privileged request or a host path outside the agent's allowed list is refused
(services/container_policy.py, issue 11)."""

from __future__ import annotations

import contextlib
import os
import signal as signals
import threading
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import docker
import requests
from docker.errors import APIError, DockerException, ImageNotFound, NotFound
from docker.transport.unixconn import UnixHTTPAdapter, UnixHTTPConnectionPool

from services import container_policy as policy
from services.bus.log import get_logger
from services.executor.runtime import (
    EXEC_OUTPUT_BYTES,
    REASON_CONTAINER_LAUNCH_FAILED,
    REASON_IMAGE_NOT_FOUND,
    REASON_TASK_UNAUTHORIZED,
    BoundedBuffer,
    ContainerSpec,
    ExecResult,
    ExitInfo,
    Handle,
    LaunchError,
    Logs,
    RuntimeFailure,
    Stream,
    clip_stream,
    from_offset,
)

log = get_logger("executor.docker")

# The engine's API version, learnt once by the agent's fork server (learn_api_version) and
# inherited by every executor it forks: a client made without a version asks the engine first.
_api_version: str | None = None
CLIENT_POOL_SIZE = 512  # connections a client keeps: a host's tasks each hold one in wait()
KILL_WAIT_S = 10.0  # after SIGKILL, how long to wait for the engine to report the exit
# One container exit at a time from this process (a host serves all of a framework's tasks on
# its agent): Docker 20.10's libnetwork deadlocks when container exits overlap (moby/moby#46661,
# fixed in 20.10.27 and 23.0), and the whole engine stops answering; a stop of a 100-task
# service did that on Debian 12's engine. A kill holds the turn from its signal until the
# engine has handled the exit, or EXIT_TURN_S at most (a task slow to obey SIGTERM waits out
# its grace without it, and takes the turn again for its SIGKILL).
EXIT_TURN_S = 0.5
_exit_turn = threading.Lock()
EXEC_KILL_WAIT_S = 2.0  # after killing a timed-out exec, how long its reader may take


NO_IMAGE = ("the task names no image (a plain process), and this agent runs Docker "
            "containers: give it an image (`offerbus run --image ...`), or run it on an agent "
            "started with --runtime process")


class DockerRuntime:
    name = "docker"

    def __init__(self, client: Any | None = None, *, init: bool = True,
                 allowed_host_paths: tuple[str, ...] | None = None) -> None:
        # docker-init as PID 1 forwards SIGTERM to the task and reaps its zombies.
        self.client = client if client is not None else make_client()
        self.api = self.client.api
        self.init = init
        self.allowed_host_paths = policy.allowed_from_environment() \
            if allowed_host_paths is None else allowed_host_paths

    # -- start ---------------------------------------------------------------------------
    def start(self, spec: ContainerSpec) -> Handle:
        if not spec.image:
            raise LaunchError(REASON_CONTAINER_LAUNCH_FAILED, NO_IMAGE)
        if spec.privileged:
            raise LaunchError(REASON_TASK_UNAUTHORIZED,
                              "privileged containers are not allowed on this cluster")
        refusal = policy.host_path_refusal((v.host_path for v in spec.volumes),
                                           self.allowed_host_paths)
        if refusal is not None:
            raise LaunchError(REASON_TASK_UNAUTHORIZED, refusal)
        host_config = self.api.create_host_config(
            nano_cpus=spec.nano_cpus, mem_limit=spec.mem_bytes,
            memswap_limit=spec.mem_bytes,  # no swap: above the limit is an OOM kill
            port_bindings={f"{p.container_port}/{p.protocol}": p.host_port for p in spec.ports}
            or None,
            network_mode=spec.network, init=self.init or None,
            privileged=False, pids_limit=policy.DEFAULT_PIDS_LIMIT,
            cap_drop=list(policy.DROPPED_CAPABILITIES),
            security_opt=list(policy.SECURITY_OPTIONS),
            binds={os.path.realpath(v.host_path):  # as checked: no symlink swapped in later
                   {"bind": v.container_path, "mode": "ro" if v.read_only else "rw"}
                   for v in spec.volumes} or None)
        try:
            created = self.api.create_container(
                spec.image, command=list(spec.command) if spec.command is not None else None,
                entrypoint=list(spec.entrypoint) if spec.entrypoint is not None else None,
                environment=dict(spec.env) or None, labels=dict(spec.labels), name=spec.name,
                ports=[(p.container_port, p.protocol) for p in spec.ports] or None,
                host_config=host_config, detach=True)
        except ImageNotFound as exc:
            # create_container never pulls; a missing image fails here, fast.
            raise LaunchError(REASON_IMAGE_NOT_FOUND,
                              f"image {spec.image} is not on this agent: {_explain(exc)}") from exc
        except (DockerException, requests.RequestException) as exc:
            raise LaunchError(REASON_CONTAINER_LAUNCH_FAILED,
                              f"create failed: {_explain(exc)}") from exc
        container_id: str = created["Id"]
        try:
            self.api.start(container_id)
        except (DockerException, requests.RequestException) as exc:
            self._remove_quietly(container_id)
            raise LaunchError(REASON_CONTAINER_LAUNCH_FAILED,
                              f"start failed: {_explain(exc)}") from exc
        return Handle(self.name, container_id, spec.name, dict(spec.labels))

    # -- wait / signal / kill ------------------------------------------------------------
    def wait(self, handle: Handle, timeout: float | None) -> ExitInfo | None:
        if timeout is not None and timeout <= 0:
            return self._exit_if_stopped(handle)
        try:
            result = self.api.wait(handle.container_id, timeout=timeout)
        except (requests.exceptions.ReadTimeout, requests.exceptions.ConnectionError):
            # requests reports a read timeout on the streaming wait as either of these.
            return self._exit_if_stopped(handle) if timeout is not None else None
        except NotFound:
            return ExitInfo(None, message="container is gone")
        except DockerException as exc:
            raise RuntimeFailure(_explain(exc)) from exc
        return self._exit_if_stopped(handle) or ExitInfo(int(result.get("StatusCode", -1)))

    def _exit_if_stopped(self, handle: Handle) -> ExitInfo | None:
        try:
            state = self.api.inspect_container(handle.container_id)["State"]
        except NotFound:
            return ExitInfo(None, message="container is gone")
        except (DockerException, requests.RequestException) as exc:
            raise RuntimeFailure(_explain(exc)) from exc
        if state.get("Running") or state.get("Status") in ("created", "restarting"):
            return None
        oom = bool(state.get("OOMKilled"))
        code = int(state.get("ExitCode", -1))
        message = "killed for exceeding its memory limit" if oom else state.get("Error", "")
        return ExitInfo(code, oom, message)

    def signal(self, handle: Handle, sig: int) -> None:
        try:
            self.api.kill(handle.container_id, signal=int(sig))
        except NotFound:
            return
        except APIError as exc:
            if exc.status_code == 409:  # not running: nothing to signal
                return
            raise RuntimeFailure(_explain(exc)) from exc

    def kill(self, handle: Handle, grace_s: float) -> ExitInfo | None:
        # Our own TERM-wait-KILL: `docker stop -t` only takes whole seconds. The engine has
        # handled an exit (released its network) when its wait returns: then the next may go.
        grace = max(grace_s, 0.0)
        with _exit_turn:
            self.signal(handle, 15)
            info = self.wait(handle, min(grace, EXIT_TURN_S))
        if info is None and grace > EXIT_TURN_S:
            info = self.wait(handle, grace - EXIT_TURN_S)
        if info is None:
            log.info("grace period over; SIGKILL", container=handle.name, grace_s=grace_s)
            with _exit_turn:
                self.signal(handle, 9)
                info = self.wait(handle, KILL_WAIT_S)
        return info

    # -- logs / find / remove ------------------------------------------------------------
    def logs(self, handle: Handle, stream: Stream, tail_lines: int | None = None,
             max_bytes: int = 1 << 20, since_bytes: int | None = None) -> Logs:
        """Streamed from the engine: only the wanted tail is ever held in memory. With
        `since_bytes` the stream is read from its start and the bytes before the offset are
        dropped as they come (the engine offers no byte offset; memory stays bounded)."""
        try:
            tail: int | str = "all" if tail_lines is None or since_bytes is not None \
                else tail_lines + 1
            chunks = self.api.logs(handle.container_id, stdout=stream == "stdout",
                                   stderr=stream == "stderr", stream=True, follow=False,
                                   tail=tail)
            try:
                if since_bytes is not None:
                    return from_offset(chunks, since_bytes, max_bytes)
                return clip_stream(chunks, tail_lines, max_bytes)
            finally:
                chunks.close()
        except NotFound:
            return Logs(b"", False)
        except (DockerException, requests.RequestException) as exc:
            raise RuntimeFailure(_explain(exc)) from exc

    def find(self, labels: Mapping[str, str]) -> list[Handle]:
        try:
            found = self.api.containers(
                all=True, filters={"label": [f"{k}={v}" for k, v in labels.items()]})
        except (DockerException, requests.RequestException) as exc:
            raise RuntimeFailure(_explain(exc)) from exc
        return [Handle(self.name, c["Id"], (c.get("Names") or ["/"])[0].lstrip("/"),
                       dict(c.get("Labels") or {})) for c in found]

    def remove(self, handle: Handle) -> None:
        try:
            self.api.remove_container(handle.container_id, force=True, v=True)
        except NotFound:
            return
        except APIError as exc:
            if exc.status_code == 409 and "in progress" in _explain(exc):
                return
            raise RuntimeFailure(_explain(exc)) from exc

    # -- exec (health checks) -------------------------------------------------------------
    def exec(self, handle: Handle, argv: Sequence[str], timeout_s: float,
             max_bytes: int = EXEC_OUTPUT_BYTES) -> ExecResult:
        """`docker exec` through the API; the output is read by a helper thread so the
        timeout holds even when the command never ends (it is then killed by its host pid)."""
        try:
            exec_id: str = self.api.exec_create(handle.container_id, list(argv), stdout=True,
                                                stderr=True)["Id"]
        except (DockerException, requests.RequestException) as exc:
            raise RuntimeFailure(f"exec failed: {_explain(exc)}") from exc
        out = BoundedBuffer(max_bytes)
        done = threading.Event()
        failed: list[BaseException] = []

        def pump() -> None:
            try:
                for chunk in self.api.exec_start(exec_id, stream=True):
                    out.write(chunk)
            except Exception as exc:  # reported below, on the caller's thread
                failed.append(exc)
            finally:
                done.set()

        threading.Thread(target=pump, name="exec-output", daemon=True).start()
        if not done.wait(max(timeout_s, 0.0)):
            self._kill_exec(exec_id)
            done.wait(EXEC_KILL_WAIT_S)
            return ExecResult(None, out.bytes(), timed_out=True, truncated=out.truncated)
        if failed:
            raise RuntimeFailure(f"exec failed: {_explain(failed[0])}")
        try:
            code = self.api.exec_inspect(exec_id).get("ExitCode")
        except (DockerException, requests.RequestException) as exc:
            raise RuntimeFailure(f"exec inspect failed: {_explain(exc)}") from exc
        return ExecResult(None if code is None else int(code), out.bytes(),
                          truncated=out.truncated)

    def _kill_exec(self, exec_id: str) -> None:
        """The engine cannot stop an exec; its processes are on this host: SIGKILL the exec's
        process and everything it started (a child left holding the output would keep the
        reader thread alive)."""
        try:
            pid = int(self.api.exec_inspect(exec_id).get("Pid") or 0)
        except (DockerException, requests.RequestException, ValueError):
            return
        for victim in _process_tree(pid) if pid > 0 else []:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(victim, signals.SIGKILL)

    def _remove_quietly(self, container_id: str) -> None:
        try:
            self.api.remove_container(container_id, force=True, v=True)
        except (DockerException, requests.RequestException) as exc:
            log.warning("could not remove a container that failed to start",
                        container=container_id, error=_explain(exc))


class _OnePoolAdapter(UnixHTTPAdapter):
    """docker-py's Unix-socket adapter keeps a connection pool per URL *path*: every
    container's create/start/wait/inspect opened a new connection, and past 25 paths a pool
    was built and torn down per request. One pool serves every path here (keep-alive)."""

    def get_connection(self, url: str, proxies: Any = None) -> UnixHTTPConnectionPool:
        with self.pools.lock:
            pool = self.pools.get("all")
            if pool is None:
                pool = UnixHTTPConnectionPool(url, self.socket_path, self.timeout,
                                              maxsize=self.max_pool_size)
                self.pools["all"] = pool
        return pool


def make_client(timeout: float = 60.0) -> docker.DockerClient:
    """A client with the engine's API version when known (no version round trip), one
    connection pool for a Unix socket engine, and no proxy lookup per request."""
    client = docker.from_env(timeout=timeout, version=_api_version,
                             max_pool_size=CLIENT_POOL_SIZE)
    api = client.api
    api.trust_env = False  # no proxy or netrc lookup in os.environ per request (a socket)
    if isinstance(getattr(api, "_custom_adapter", None), UnixHTTPAdapter):
        old = api._custom_adapter
        adapter = _OnePoolAdapter(f"http+unix://{old.socket_path}", timeout,
                                  max_pool_size=CLIENT_POOL_SIZE)
        api.mount("http+docker://", adapter)
        api._custom_adapter = adapter
        old.close()
    return client


def learn_api_version(timeout: float = 5.0) -> str | None:
    """Ask the engine its API version (one round trip) and keep it for the clients this process
    and its forks make. No engine (a process-runtime agent): None, and clients ask as before."""
    global _api_version
    try:
        api = docker.from_env(timeout=timeout).api
        try:
            _api_version = str(api.api_version)
        finally:
            api.close()  # no connection may be shared with the forks
    except (DockerException, requests.RequestException, OSError) as exc:
        log.info("no Docker engine to ask its API version", error=str(exc))
        _api_version = None
    return _api_version


def _process_tree(root: int) -> list[int]:
    """`root` and its descendants (from /proc), parents first."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        fields = stat.rsplit(")", 1)[-1].split()
        if len(fields) > 1:
            children.setdefault(int(fields[1]), []).append(int(entry))
    tree, queue = [], [root]
    while queue:
        pid = queue.pop(0)
        tree.append(pid)
        queue.extend(children.get(pid, []))
    return tree


def _explain(exc: BaseException) -> str:
    explanation = getattr(exc, "explanation", None)
    return str(explanation or exc)
