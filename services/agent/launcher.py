"""The executor fork server. ExecutorLauncher (in the agent) keeps one helper process,
`python -m services.agent.launcher`, that imported the executor (zmq, protobuf, docker) once.
For each framework it double-forks an executor host (services.executor.host: one process that
serves all that framework's executors on this agent, each task with its own executor object,
agent link and threads) and hands it the launches; with `hosts=False` it double-forks a lone
executor process per launch instead, in milliseconds rather than a new interpreter's ~0.2 s.

Protocol on the helper's pipes, one JSON object per line: it first prints {"ready": true, "pid"};
each request {"id", "executor_id", "argv", "sandbox"} is answered {"id", "pid"} (the pid of the
process serving the executor: its host) or {"id", "error"}. Hosts and executors are
double-forked into their own session and re-parented to init, so they outlive the agent and the
helper (as Mesos's checkpointed executors do); the helper exits when its stdin closes (the agent
died or closed it), and a host exits once it serves no executor and can be sent no more."""

from __future__ import annotations

import argparse
import contextlib
import gc
import importlib
import itertools
import json
import os
import select
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, NoReturn

from services.bus.log import get_logger
from services.forking import child_exit, double_fork, redirect_and_close

log = get_logger("agent.launcher")

REPLY_TIMEOUT_S = 30.0  # the first reply waits for the helper's imports (~0.3 s on 2 cores)
HOSTS_ENV = "OFFERBUS_EXECUTOR_HOSTS"  # "0": a process per executor (for comparisons)
HOSTS_DIR = "executor-hosts"  # under the agent's work dir: each host's log, stdout, stderr
HOST_REPLY_TIMEOUT_S = 20.0  # an executor host answers a launch in ms; past this it failed
PRELOAD = ("services.executor.shell", "services.executor.docker_runtime",
           "services.executor.process_runtime", "services.telemetry.provider")
# Tracing: the helper and its executors inherit the agent's environment (OTEL_*,
# OFFERBUS_TRACES_DIR); each executor calls services.telemetry.setup() itself, after the fork
# (the helper never creates a tracer provider: its exporter threads would not survive a fork).
# Not inherited: the agent's own service name and single trace file (executors would write
# into the agent's file); a file becomes its folder, where each executor writes its own.
_NOT_INHERITED = ("OTEL_SERVICE_NAME", "OFFERBUS_TRACES_FILE")
_PROJECT_ROOT = str(Path(__file__).resolve().parents[2])


class LauncherDied(RuntimeError):
    """The fork server is gone or does not answer."""


def sandbox_of(executor_id: str, argv: Sequence[str], work_dir: Path) -> Path:
    """The executor's sandbox: its --work-dir argument, else <work_dir>/sandboxes/<id>."""
    args = list(argv)
    for i, arg in enumerate(args):
        if arg == "--work-dir" and i + 1 < len(args):
            return Path(args[i + 1])
        if arg.startswith("--work-dir="):
            return Path(arg.split("=", 1)[1])
    return work_dir / "sandboxes" / executor_id


def executor_environment(environ: Mapping[str, str]) -> dict[str, str]:
    """The environment of the fork server, hence of every executor it forks."""
    env = {k: v for k, v in environ.items() if k not in _NOT_INHERITED}
    traces_file = environ.get("OFFERBUS_TRACES_FILE")
    if traces_file and not env.get("OFFERBUS_TRACES_DIR"):
        env["OFFERBUS_TRACES_DIR"] = str(Path(traces_file).resolve().parent)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (_PROJECT_ROOT, env.get("PYTHONPATH")) if p)
    return env


class ExecutorLauncher:
    """Launches executors through the fork server. launch() writes one line and reads one line
    back (a fork takes a few ms), so the agent's reactor thread may call it."""

    def __init__(self, work_dir: str | os.PathLike[str], *, python: str = sys.executable,
                 reply_timeout: float = REPLY_TIMEOUT_S, hosts: bool | None = None) -> None:
        self.work_dir = Path(work_dir)
        # False: a process per executor (the old way); None: as HOSTS_ENV says (default on).
        self.hosts = hosts if hosts is not None else os.environ.get(HOSTS_ENV, "1") != "0"
        self.work_dir.mkdir(parents=True, exist_ok=True)
        self.python = python
        self.reply_timeout = reply_timeout
        self.restarts = 0
        self._ids = itertools.count(1)
        self._lock = threading.Lock()
        self._buf = b""
        self._direct: list[subprocess.Popen[bytes]] = []  # fallback children, reaped lazily
        self._proc: subprocess.Popen[bytes] | None = None
        self._start()  # returns at once; the first launch waits for "ready"

    def _start(self) -> None:
        env = executor_environment(os.environ)
        with open(self.work_dir / "launcher.log", "ab") as err:
            argv = [self.python, "-m", "services.agent.launcher"]
            if self.hosts:
                argv += ["--hosts-dir", str(self.work_dir / HOSTS_DIR)]
            self._proc = subprocess.Popen(
                argv, stdin=subprocess.PIPE,
                stdout=subprocess.PIPE, stderr=err, env=env, cwd=_PROJECT_ROOT,
                start_new_session=True, close_fds=True)
        self._buf = b""
        self._ready = False

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None else None

    def launch(self, executor_id: str, argv: Sequence[str]) -> int:
        """Start an executor (`python -m services.executor` + argv, in-process after a fork);
        returns its pid. Its stdout/stderr go to executor.stdout/executor.stderr in its sandbox.
        If the fork server died it is restarted once; failing that, the executor is started as
        a plain new interpreter (slow, but it runs)."""
        sandbox = sandbox_of(executor_id, argv, self.work_dir)
        request = {"executor_id": executor_id, "argv": list(argv), "sandbox": str(sandbox)}
        with self._lock:
            self._reap_direct()
            for attempt in (1, 2):
                try:
                    return self._request(request)
                except LauncherDied as exc:
                    log.warning("fork server failed", attempt=attempt, error=str(exc),
                                pid=self.pid)
                    if attempt == 1:
                        self._stop_server()
                        self.restarts += 1
                        self._start()
                        log.info("fork server restarted", pid=self.pid, restarts=self.restarts)
            log.error("fork server unusable; starting the executor directly",
                      executor=executor_id)
            return self._spawn_directly(list(argv), sandbox)

    def _request(self, request: dict[str, Any]) -> int:
        proc = self._proc
        if proc is None or proc.poll() is not None or proc.stdin is None:
            raise LauncherDied("fork server not running")
        deadline = time.monotonic() + self.reply_timeout
        if not self._ready:
            hello = self._read_reply(deadline)
            if not hello.get("ready"):
                raise LauncherDied(f"unexpected greeting {hello!r}")
            self._ready = True
        rid = next(self._ids)
        try:
            proc.stdin.write(json.dumps({"id": rid, **request}).encode() + b"\n")
            proc.stdin.flush()
        except (BrokenPipeError, OSError) as exc:
            raise LauncherDied(f"cannot write to the fork server: {exc}") from exc
        while True:
            reply = self._read_reply(deadline)
            if reply.get("id") != rid:
                continue  # a reply to a request that timed out earlier
            if "error" in reply:
                raise OSError(f"fork server could not launch: {reply['error']}")
            return int(reply["pid"])

    def _read_reply(self, deadline: float) -> dict[str, Any]:
        assert self._proc is not None and self._proc.stdout is not None
        fd = self._proc.stdout.fileno()
        while b"\n" not in self._buf:
            left = deadline - time.monotonic()
            if left <= 0:
                raise LauncherDied("no answer from the fork server")
            readable, _, _ = select.select([fd], [], [], left)
            if not readable:
                continue
            chunk = os.read(fd, 65536)
            if not chunk:
                raise LauncherDied("fork server closed its pipe (died)")
            self._buf += chunk
        line, self._buf = self._buf.split(b"\n", 1)
        try:
            reply = json.loads(line)
        except ValueError as exc:
            raise LauncherDied(f"garbled reply {line[:80]!r}") from exc
        if not isinstance(reply, dict):
            raise LauncherDied(f"garbled reply {line[:80]!r}")
        return reply

    def _spawn_directly(self, argv: list[str], sandbox: Path) -> int:
        sandbox.mkdir(parents=True, exist_ok=True)
        with open(sandbox / "executor.stdout", "ab") as out, \
                open(sandbox / "executor.stderr", "ab") as err:
            proc = subprocess.Popen([self.python, "-m", "services.executor", *argv],
                                    stdin=subprocess.DEVNULL, stdout=out, stderr=err,
                                    env=executor_environment(os.environ), cwd=sandbox,
                                    start_new_session=True, close_fds=True)
        self._direct.append(proc)
        return proc.pid

    def _reap_direct(self) -> None:
        self._direct = [p for p in self._direct if p.poll() is None]

    def _stop_server(self) -> None:
        proc, self._proc = self._proc, None
        if proc is None:
            return
        with contextlib.suppress(OSError):
            if proc.stdin is not None:
                proc.stdin.close()
        try:
            proc.wait(timeout=2.0)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        if proc.stdout is not None:
            proc.stdout.close()

    def close(self) -> None:
        """Stop the fork server; the executors it started keep running."""
        with self._lock:
            self._stop_server()
            self._reap_direct()


# -- the fork server (runs in the helper process) ----------------------------------------------


def _run_executor(argv: list[str], sandbox: Path) -> NoReturn:
    """In the grandchild: one lone executor (`python -m services.executor argv`)."""
    def run() -> int:
        sandbox.mkdir(parents=True, exist_ok=True)
        redirect_and_close(-1, sandbox / "executor.stdout", sandbox / "executor.stderr")
        os.chdir(sandbox)
        from services.executor.shell import main

        return main(argv)

    child_exit(run)


def _run_host(control: int, framework_id: str, agent_id: str, hosts_dir: Path) -> NoReturn:
    """In the grandchild: an executor host for `framework_id`, fed on `control`."""
    def run() -> int:
        hosts_dir.mkdir(parents=True, exist_ok=True)
        base = hosts_dir / _safe(framework_id)
        redirect_and_close(control, base.with_suffix(".stdout"), base.with_suffix(".stderr"))
        os.chdir(hosts_dir)
        from services.executor import host

        return host.serve(control, framework_id, agent_id, base.with_suffix(".log"))

    child_exit(run)


def _safe(name: str) -> str:
    return "".join(c if c.isalnum() or c in "-_." else "_" for c in name) or "framework"


def _spawn(argv: list[str], sandbox: Path) -> int:
    """A lone executor process (the old way; kept for `--no-host` and tests)."""
    return double_fork(lambda: _run_executor(argv, sandbox))


def _arg(argv: Sequence[str], name: str) -> str:
    args = list(argv)
    for i, arg in enumerate(args):
        if arg == name and i + 1 < len(args):
            return args[i + 1]
        if arg.startswith(name + "="):
            return arg.split("=", 1)[1]
    return ""


class HostGone(Exception):
    """The executor host closed its control socket (it exited, or is exiting)."""


class _Host:
    """The fork server's side of one executor host."""

    def __init__(self, pid: int, sock: socket.socket) -> None:
        self.pid, self.sock, self.buf = pid, sock, b""

    def gone(self) -> bool:
        """Closed by the host (readable with nothing to read), without blocking."""
        try:
            readable, _, _ = select.select([self.sock], [], [], 0)
            return bool(readable) and self.sock.recv(1, socket.MSG_PEEK) == b""
        except OSError:
            return True

    def request(self, req: dict[str, Any], timeout: float) -> dict[str, Any]:
        try:
            self.sock.sendall(json.dumps(req).encode() + b"\n")
        except OSError as exc:
            raise HostGone(f"cannot write to the host: {exc}") from exc
        deadline = time.monotonic() + timeout
        while True:
            while b"\n" not in self.buf:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise TimeoutError(f"the executor host {self.pid} did not answer")
                readable, _, _ = select.select([self.sock], [], [], left)
                if not readable:
                    continue
                try:
                    chunk = self.sock.recv(65536)
                except OSError as exc:
                    raise HostGone(f"host connection failed: {exc}") from exc
                if not chunk:
                    raise HostGone("the executor host closed its control socket")
                self.buf += chunk
            line, self.buf = self.buf.split(b"\n", 1)
            reply: dict[str, Any] = json.loads(line)
            if reply.get("id") == req.get("id"):
                return reply

    def close(self) -> None:
        self.sock.close()


class ForkServer:
    """The fork server's state: the executor host of each framework (a host per framework:
    frameworks never share a process), forked on a framework's first launch and again
    whenever its host has exited."""

    def __init__(self, hosts_dir: Path | None, *, reply_timeout: float = HOST_REPLY_TIMEOUT_S,
                 ) -> None:
        self.hosts_dir = hosts_dir
        self.reply_timeout = reply_timeout
        self.hosts: dict[str, _Host] = {}

    def launch(self, req: dict[str, Any]) -> int:
        argv = [str(a) for a in req["argv"]]
        sandbox = Path(req["sandbox"])
        if self.hosts_dir is None:
            return _spawn(argv, sandbox)
        self._prune()
        framework_id = _arg(argv, "--framework-id")
        for _ in range(2):  # a host exiting as we ask: once more, with a new host
            host = self.hosts.get(framework_id)
            if host is None:
                host = self._fork_host(framework_id, _arg(argv, "--agent-id"))
            try:
                reply = host.request({"id": req.get("id"), "argv": argv},
                                     self.reply_timeout)
            except HostGone:
                self._drop(framework_id)
                continue
            if "error" in reply:
                raise OSError(str(reply["error"]))
            return int(reply["pid"])
        raise OSError("no executor host could take the launch")

    def _fork_host(self, framework_id: str, agent_id: str) -> _Host:
        assert self.hosts_dir is not None
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        hosts_dir = self.hosts_dir
        fd = theirs.fileno()
        try:
            pid = double_fork(lambda: _run_host(fd, framework_id, agent_id, hosts_dir))
        finally:
            theirs.close()
        host = self.hosts[framework_id] = _Host(pid, ours)
        return host

    def _drop(self, framework_id: str) -> None:
        host = self.hosts.pop(framework_id, None)
        if host is not None:
            host.close()

    def _prune(self) -> None:
        """Forget the hosts that exited (one entry per framework with a live host)."""
        for framework_id in [f for f, h in self.hosts.items() if h.gone()]:
            self._drop(framework_id)


def _warm_trace_encoding() -> None:
    """Encode one span to OTLP JSON once, so each forked executor inherits warm protobuf
    and JSON caches (cold, its first export cost ~5 ms on the path to TASK_RUNNING). No
    exporter, processor or thread is created here."""
    from opentelemetry.sdk.trace import ReadableSpan, TracerProvider

    from services.telemetry.file_exporter import to_otlp_json

    try:
        span = TracerProvider().get_tracer("warm-up").start_span("warm-up",
                                                                 attributes={"k": "v"})
        span.add_event("e")
        span.end()
        if isinstance(span, ReadableSpan):  # not with OTEL_SDK_DISABLED (a no-op span)
            to_otlp_json([span])
    except Exception as exc:  # an optimisation only: never let it stop the fork server
        print(f"trace encoding warm-up skipped: {exc!r}", file=sys.stderr, flush=True)


def serve(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m services.agent.launcher")
    ap.add_argument("--hosts-dir", type=Path, default=None,
                    help="where executor hosts log; without it, a process per executor")
    args = ap.parse_args(argv)
    # Pre-import everything an executor needs, before any thread or zmq context exists (a
    # fork copies only the calling thread; a context's I/O threads would be lost).
    for module in PRELOAD:
        importlib.import_module(module)
    _warm_trace_encoding()
    _learn_docker_api_version()
    # What is imported now is shared, copy-on-write, with every host: kept out of the
    # collector's sight, a host's first collection neither walks nor dirties those pages.
    gc.freeze()
    server = ForkServer(args.hosts_dir)

    inp, out = sys.stdin.buffer, sys.stdout.buffer
    out.write(json.dumps({"ready": True, "pid": os.getpid()}).encode() + b"\n")
    out.flush()
    for line in inp:
        try:
            req = json.loads(line)
            rid = req.get("id")
        except ValueError as exc:
            out.write(json.dumps({"id": None, "error": f"bad request: {exc}"}).encode() + b"\n")
            out.flush()
            continue
        try:
            reply = {"id": rid, "pid": server.launch(req)}
        except Exception as exc:
            reply = {"id": rid, "error": repr(exc)}
        out.write(json.dumps(reply).encode() + b"\n")
        out.flush()
    return 0


def _learn_docker_api_version() -> None:
    """Ask the engine its API version once, here: each host's client is then made with it
    (a client made without a version asks the engine first, a round trip per client)."""
    from services.executor import docker_runtime

    docker_runtime.learn_api_version()


if __name__ == "__main__":
    sys.exit(serve())
