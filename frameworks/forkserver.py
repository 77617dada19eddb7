"""The local cluster's framework fork server. `offerbus up` starts one per run dir
(`python -m frameworks.forkserver --run-dir DIR`); it imports the service framework (its SDK,
ZeroMQ, kazoo, protobuf, OpenTelemetry) once. `offerbus run` then asks it, on the unix socket
<run dir>/forkserver.sock, to fork the service's framework process. The child runs as
`python -m frameworks.service ARGS` would: in its own session and process group, re-parented
to init, logging to <run dir>/logs/<name>.log, with the CLI's environment, working directory
and arguments. A fork takes milliseconds; a new interpreter's imports take ~0.4 s of CPU on
the way to the first offer (issue 8 e).

When the server is not there (not started, stopped, crashed, a run dir whose path is too long
for a socket, another user's) or refuses, `offerbus run` starts the interpreter as before
(services/cli/cluster.py `spawn`). A request carries a deadline: the server forks nothing
after it, and the CLI waits for the answer past it before starting the interpreter itself, so
one request never starts two processes.

Protocol: per connection, one JSON request line of at most MAX_REQUEST_BYTES, answered with
one line, {"pid": N} or {"error": "..."}. A bad request is refused, counted and logged; it
never stops the server."""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import signal
import socket
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NoReturn

from services.bus.log import configure, get_logger
from services.forking import child_exit, double_fork, redirect_and_close

log = get_logger("forkserver")

PROCESS = "forkserver"  # its name among the run dir's processes (pids/, logs/)
SOCKET = "forkserver.sock"  # in the run dir
MODULE = "frameworks.service"  # the one module it runs
COMM = b"offerbus-fw"  # a forked framework's process name (its command line is the server's)
PR_SET_NAME = 15  # prctl(2)
MAX_REQUEST_BYTES = 1 << 20
READ_TIMEOUT_S = 2.0  # a client that sends no whole request in this long, in all, is dropped
ANSWER_WITHIN_S = 5.0  # the deadline a request sets: the server forks nothing after it
GRACE_S = 2.0  # the client waits this much past the deadline before giving up on an answer
SUN_PATH_MAX = 107  # bytes of a unix socket's path (sockaddr_un.sun_path, its NUL aside)
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,199}")
_ROOT = str(Path(__file__).resolve().parents[1])  # the project whose code it runs


class Unavailable(Exception):
    """No fork server answered this request: start the process another way."""


class Refused(ValueError):
    """A request the server will not carry out, and why."""


@dataclass(frozen=True)
class Request:
    name: str  # the process's name in the run dir: its log is logs/<name>.log
    args: tuple[str, ...]  # frameworks.service's arguments
    env: Mapping[str, str]
    cwd: str
    deadline: float  # time.time() after which nothing is forked


def socket_path(run_dir: Path) -> Path:
    return run_dir / SOCKET


def serves(argv: Sequence[str]) -> bool:
    """Whether a fork server can start `python ARGV` (it runs frameworks.service only)."""
    return len(argv) >= 2 and list(argv[:2]) == ["-m", MODULE]


def _strings(value: Any, what: str) -> list[str]:
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise Refused(f"{what} must be a list of strings")
    return value


def parse_request(line: bytes, now: float, python: str = sys.executable,
                  root: str = _ROOT) -> Request:
    """The request in `line`, checked; Refused says what is wrong with it. It must come
    from a client of this interpreter and project (another venv's CLI starts its own), for
    MODULE, before its deadline."""
    try:
        doc = json.loads(line)
    except (ValueError, UnicodeDecodeError) as exc:
        raise Refused(f"not a JSON request: {exc}") from None
    if not isinstance(doc, dict):
        raise Refused("the request must be a JSON object")
    if doc.get("python") != python or doc.get("root") != root:
        raise Refused(f"the request is for {doc.get('python')!r} of {doc.get('root')!r}; "
                      f"this server runs {python!r} of {root!r}")
    name = doc.get("name")
    if not isinstance(name, str) or not _NAME.fullmatch(name):
        raise Refused(f"bad process name {name!r}")
    argv = _strings(doc.get("argv"), "argv")
    if not serves(argv):
        raise Refused(f"this server runs `-m {MODULE}` only, not {argv[:2]!r}")
    env = doc.get("env")
    if not isinstance(env, dict) or not all(
            isinstance(k, str) and isinstance(v, str) and k and "=" not in k
            and "\0" not in k + v for k, v in env.items()):
        raise Refused("env must be an object of strings")
    cwd = doc.get("cwd")
    if not isinstance(cwd, str) or not os.path.isabs(cwd) or "\0" in cwd:
        raise Refused(f"cwd must be an absolute path, not {cwd!r}")
    deadline = doc.get("deadline")
    if not isinstance(deadline, (int, float)) or isinstance(deadline, bool):
        raise Refused("deadline must be a number (seconds since the epoch)")
    if now > deadline:
        raise Refused(f"the request came {now - deadline:.3f}s after its deadline")
    return Request(name, tuple(argv[2:]), dict(env), cwd, float(deadline))


# -- the client (the CLI's spawn) ---------------------------------------------------------
def fork(run_dir: Path, name: str, argv: Sequence[str], env: Mapping[str, str],
         cwd: Path, *, answer_within: float = ANSWER_WITHIN_S) -> int:
    """Ask the run dir's fork server to start `python ARGV` as process `name`; its pid.
    Unavailable when there is no server to ask, it refused, or no answer came."""
    path = socket_path(run_dir)
    if len(os.fsencode(path)) > SUN_PATH_MAX:
        raise Unavailable(f"the socket path is too long: {path}")
    deadline = time.time() + answer_within
    request = {"name": name, "argv": list(argv), "env": dict(env), "cwd": str(cwd),
               "deadline": deadline, "python": sys.executable, "root": _ROOT}
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(GRACE_S)
        try:
            sock.connect(str(path))
        except OSError as exc:  # none there, a stale socket, another user's
            raise Unavailable(f"no fork server at {path}: {exc}") from None
        try:
            sock.sendall(json.dumps(request).encode() + b"\n")
            answer = _read_line(sock, MAX_REQUEST_BYTES, answer_within + GRACE_S)
        except OSError as exc:  # incl. the timeout, past the deadline and its grace
            raise Unavailable(f"the fork server did not answer: {exc}") from None
    try:
        doc = json.loads(answer)
        if "pid" in doc:
            return int(doc["pid"])
        raise Unavailable(f"the fork server refused: {doc.get('error')}")
    except (ValueError, TypeError, AttributeError):
        raise Unavailable(f"a garbled answer from the fork server: {answer[:80]!r}") from None


def _read_line(sock: socket.socket, limit: int, within: float) -> bytes:
    """One line (without its newline) from `sock` within `within` seconds in all (a peer
    sending a byte at a time gets no longer); OSError when it closes first, the line passes
    `limit` bytes or the time is up."""
    deadline = time.monotonic() + within
    buf = b""
    while b"\n" not in buf:
        if len(buf) > limit:
            raise OSError(f"a line of more than {limit} bytes")
        left = deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError("timed out")
        sock.settimeout(left)
        chunk = sock.recv(65536)
        if not chunk:
            raise OSError("closed before a whole line")
        buf += chunk
    return buf.split(b"\n", 1)[0]


# -- the server --------------------------------------------------------------------------
def _run_framework(run_dir: Path, req: Request) -> NoReturn:
    """In the grandchild: become `python -m frameworks.service ARGS` as spawn starts it."""
    def run() -> int:
        os.setsid()  # its own session and group, as Popen(start_new_session=True): killpg
        _name_process(COMM)
        for signum in (signal.SIGTERM, signal.SIGCHLD, signal.SIGPIPE):
            signal.signal(signum, signal.SIG_DFL)
        logfile = run_dir / "logs" / f"{req.name}.log"
        redirect_and_close(-1, logfile, logfile)
        os.chdir(req.cwd)
        os.environ.clear()
        os.environ.update(req.env)
        sys.argv = [MODULE, *req.args]
        from frameworks.service import main

        return main(list(req.args))

    child_exit(run)


def _name_process(name: bytes) -> None:
    """Set this process's name (/proc/PID/comm: what `top` and `ps -o comm` show) where
    Linux allows it; its command line stays the fork server's."""
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(PR_SET_NAME, ctypes.c_char_p(name[:15]), 0, 0, 0)
    except (OSError, AttributeError):  # not Linux: a name is a nicety
        pass


class Server:
    """Serves the requests of one listening socket, one connection at a time."""

    def __init__(self, run_dir: Path, listener: socket.socket) -> None:
        self.run_dir, self.listener = run_dir, listener
        self.forked = 0
        self.refused = 0

    def serve_one(self) -> None:
        conn, _ = self.listener.accept()
        with conn:
            try:
                line = _read_line(conn, MAX_REQUEST_BYTES, READ_TIMEOUT_S)
                req = parse_request(line, time.time())
                started = time.perf_counter()
                pid = double_fork(lambda: _run_framework(self.run_dir, req))
                self.forked += 1
                log.info("forked", name=req.name, pid=pid, forked=self.forked,
                         ms=round(1000 * (time.perf_counter() - started), 1))
                answer: dict[str, Any] = {"pid": pid}
            except (Refused, OSError) as exc:
                self.refused += 1
                log.warning("request refused", error=str(exc), refused=self.refused)
                answer = {"error": str(exc)}
            with contextlib.suppress(OSError):  # the client may be gone: nothing to lose
                conn.sendall(json.dumps(answer).encode() + b"\n")


def listen(run_dir: Path) -> socket.socket:
    """The server's socket at socket_path(run_dir), only for this user (a stale one from a
    killed server is replaced)."""
    path = socket_path(run_dir)
    if len(os.fsencode(path)) > SUN_PATH_MAX:
        raise SystemExit(f"forkserver: the socket path is too long: {path}")
    with contextlib.suppress(FileNotFoundError):
        if path.is_socket():
            path.unlink()
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    old = os.umask(0o177)
    try:
        listener.bind(str(path))
    finally:
        os.umask(old)
    listener.listen(16)
    return listener


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m frameworks.forkserver", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--run-dir", type=Path, required=True)
    args = ap.parse_args(argv)
    configure(PROCESS)
    run_dir = args.run_dir.resolve()
    started = time.perf_counter()
    # Imported before any thread or zmq context exists (a fork copies the calling thread
    # only); what is imported now is shared, copy-on-write, with every framework it forks.
    import gc

    import frameworks.service  # noqa: F401

    gc.freeze()
    listener = listen(run_dir)

    def stop(signum: int, _frame: Any) -> None:
        raise SystemExit(0)

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    server = Server(run_dir, listener)
    log.info("ready", socket=str(socket_path(run_dir)),
             imports_s=round(time.perf_counter() - started, 3))
    try:
        while True:
            try:
                server.serve_one()
            except Exception as exc:  # a request never stops the server
                server.refused += 1
                log.error("request failed", error=repr(exc), refused=server.refused)
    finally:
        listener.close()
        with contextlib.suppress(FileNotFoundError):
            socket_path(run_dir).unlink()
        log.info("stopped", forked=server.forked, refused=server.refused)


if __name__ == "__main__":
    sys.exit(main())
