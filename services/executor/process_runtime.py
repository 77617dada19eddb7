"""ProcessRuntime: the runtime port for plain processes in the sandbox (own process group, env,
cwd = sandbox, stdout/stderr files there, an address-space rlimit for `mem`); a JSON record in
the sandbox (pid, start time, labels) lets find() recover them after an agent restart."""

from __future__ import annotations

import contextlib
import json
import os
import resource
import signal as signals
import subprocess
import tempfile
import threading
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

from services.bus.log import get_logger
from services.executor.runtime import (
    EXEC_OUTPUT_BYTES,
    REASON_CONTAINER_LAUNCH_FAILED,
    ContainerSpec,
    ExecResult,
    ExitInfo,
    Handle,
    LaunchError,
    Logs,
    RuntimeFailure,
    Stream,
    read_file_from,
    tail_file,
)
from services.procs import pid_alive, start_time

log = get_logger("executor.process")

RECORD = "offerbus-process.json"
POLL_S = 0.02  # how often a process that is not our child is checked for its end
KILL_WAIT_S = 5.0


class ProcessRuntime:
    name = "process"

    def __init__(self, root: str | os.PathLike[str]) -> None:
        """`root`: the folder whose sandboxes find() searches (the agent's work dir)."""
        self.root = Path(root)
        self._children: dict[str, subprocess.Popen[bytes]] = {}
        self._lock = threading.Lock()

    # -- start ---------------------------------------------------------------------------
    def start(self, spec: ContainerSpec) -> Handle:
        if not spec.argv:
            raise LaunchError(REASON_CONTAINER_LAUNCH_FAILED,
                              "a process task needs a command (there is no image default)")
        if not spec.sandbox:
            raise LaunchError(REASON_CONTAINER_LAUNCH_FAILED, "a process task needs a sandbox")
        sandbox = Path(spec.sandbox)
        env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(sandbox),
               "OFFERBUS_SANDBOX": str(sandbox), **spec.env}
        try:
            sandbox.mkdir(parents=True, exist_ok=True)
            with open(sandbox / "stdout", "ab") as out, open(sandbox / "stderr", "ab") as err:
                proc = subprocess.Popen(list(spec.argv), cwd=sandbox, env=env,
                                        stdin=subprocess.DEVNULL, stdout=out, stderr=err,
                                        start_new_session=True, close_fds=True)
        except OSError as exc:
            raise LaunchError(REASON_CONTAINER_LAUNCH_FAILED,
                              f"cannot exec {spec.argv[0]!r}: {exc}") from exc
        if spec.mem_bytes:
            # Set right after the fork (no preexec_fn: unsafe with threads); crude but real.
            with contextlib.suppress(OSError, ValueError):
                resource.prlimit(proc.pid, resource.RLIMIT_AS, (spec.mem_bytes, spec.mem_bytes))
        handle = Handle(self.name, f"{spec.name}.{proc.pid}", spec.name, dict(spec.labels),
                        proc.pid, str(sandbox))
        with self._lock:
            self._children[handle.container_id] = proc
        record = {"container_id": handle.container_id, "name": spec.name, "pid": proc.pid,
                  "start_ticks": start_time(proc.pid), "labels": dict(spec.labels)}
        tmp = sandbox / (RECORD + ".tmp")
        tmp.write_text(json.dumps(record))
        tmp.replace(sandbox / RECORD)
        return handle

    # -- wait / signal / kill ------------------------------------------------------------
    def _child(self, handle: Handle) -> subprocess.Popen[bytes] | None:
        with self._lock:
            return self._children.get(handle.container_id)

    def _alive(self, handle: Handle) -> bool:
        """For a process that is not our child: running, and still the same process."""
        return handle.pid is not None and pid_alive(handle.pid, self._recorded_ticks(handle))

    def _recorded_ticks(self, handle: Handle) -> int | None:
        try:
            record = json.loads((Path(handle.sandbox) / RECORD).read_text())
        except (OSError, ValueError):
            return None
        ticks = record.get("start_ticks")
        return ticks if isinstance(ticks, int) else None

    def wait(self, handle: Handle, timeout: float | None) -> ExitInfo | None:
        proc = self._child(handle)
        if proc is not None:
            try:
                code = proc.wait(timeout)
            except subprocess.TimeoutExpired:
                return None
            if code < 0:
                return ExitInfo(128 - code, message=f"killed by {signals.Signals(-code).name}")
            return ExitInfo(code)
        deadline = None if timeout is None else time.monotonic() + timeout
        while self._alive(handle):
            if deadline is not None and time.monotonic() >= deadline:
                return None
            time.sleep(POLL_S)  # not our child: no wait() to block on, so poll /proc
        return ExitInfo(None, message="process ended; its exit status is unknown (not our child)")

    def signal(self, handle: Handle, sig: int) -> None:
        """Signal the whole process group (the task and whatever it started)."""
        if handle.pid is None:
            return
        if self._child(handle) is None and not self._alive(handle):
            return  # not ours and gone: its pid may belong to someone else by now
        # Our child: signal its group even once it was reaped (stray children may remain).
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(handle.pid, sig)

    def kill(self, handle: Handle, grace_s: float) -> ExitInfo | None:
        self.signal(handle, signals.SIGTERM)
        info = self.wait(handle, max(grace_s, 0.0))
        # SIGKILL the group even when the leader left on TERM: no stray children survive.
        self.signal(handle, signals.SIGKILL)
        if info is None:
            log.info("grace period over; SIGKILL", process=handle.name, grace_s=grace_s)
            info = self.wait(handle, KILL_WAIT_S)
        return info

    # -- logs / find / remove ------------------------------------------------------------
    def logs(self, handle: Handle, stream: Stream, tail_lines: int | None = None,
             max_bytes: int = 1 << 20, since_bytes: int | None = None) -> Logs:
        path = Path(handle.sandbox) / stream
        if since_bytes is not None:
            return read_file_from(path, since_bytes, max_bytes)
        return tail_file(path, tail_lines, max_bytes)

    def find(self, labels: Mapping[str, str]) -> list[Handle]:
        found = []
        for path in self.root.rglob(RECORD):
            try:
                record = json.loads(path.read_text())
            except (OSError, ValueError):
                continue
            have = record.get("labels", {})
            if all(have.get(k) == v for k, v in labels.items()):
                found.append(Handle(self.name, record["container_id"], record["name"], have,
                                    int(record["pid"]), str(path.parent)))
        return found

    def exec(self, handle: Handle, argv: Sequence[str], timeout_s: float,
             max_bytes: int = EXEC_OUTPUT_BYTES) -> ExecResult:
        """Run `argv` in the task's sandbox, in its own process group (killed on timeout)."""
        if not argv:
            raise RuntimeFailure("exec needs a command")
        sandbox = Path(handle.sandbox) if handle.sandbox else None
        env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"),
               "HOME": str(sandbox or "/"), "OFFERBUS_SANDBOX": str(sandbox or "")}
        with tempfile.TemporaryFile() as out:
            try:
                proc = subprocess.Popen(list(argv), cwd=sandbox, env=env,
                                        stdin=subprocess.DEVNULL, stdout=out,
                                        stderr=subprocess.STDOUT, start_new_session=True,
                                        close_fds=True)
            except OSError as exc:
                return ExecResult(None, f"cannot exec {argv[0]!r}: {exc}".encode())
            timed_out = False
            try:
                code: int | None = proc.wait(max(timeout_s, 0.0))
            except subprocess.TimeoutExpired:
                timed_out, code = True, None
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(proc.pid, signals.SIGKILL)
                proc.wait()
            size = out.seek(0, os.SEEK_END)
            out.seek(max(0, size - max_bytes))
            data = out.read()
        if code is not None and code < 0:
            code = 128 - code
        return ExecResult(code, data, timed_out=timed_out, truncated=size > max_bytes)

    def remove(self, handle: Handle) -> None:
        """Kill the group if still running and drop the record (the sandbox's log files stay:
        the sandbox is the agent's to collect)."""
        proc = self._child(handle)
        if (proc is not None and proc.poll() is None) or (proc is None and self._alive(handle)):
            self.kill(handle, 0.0)
        if proc is not None:
            with self._lock:
                self._children.pop(handle.container_id, None)
        record = Path(handle.sandbox) / RECORD
        with contextlib.suppress(OSError):
            if json.loads(record.read_text()).get("container_id") == handle.container_id:
                record.unlink()
