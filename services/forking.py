"""Forking a pre-imported Python child from a fork server (the agent's executor launcher,
the local cluster's framework fork server): the double fork that re-parents it to init, its
descriptors redirected and the server's closed, and an exit that never returns into the
server."""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import NoReturn


def open_fds() -> list[int]:
    """This process's open descriptors (a few, not the 65k a blind closerange would try:
    that alone cost tens of ms of CPU per child)."""
    try:
        return sorted(int(name) for name in os.listdir("/proc/self/fd"))
    except OSError:
        return list(range(3, 1024))


def redirect_and_close(keep: int, stdout: Path, stderr: Path) -> None:
    """In a forked child: fds 0-2 to /dev/null and the given files (appended to; the same
    path twice shares one descriptor); every other inherited descriptor closed (the server's
    sockets and pipes) except `keep`."""
    flags = os.O_WRONLY | os.O_CREAT | os.O_APPEND
    null = os.open(os.devnull, os.O_RDONLY)
    out = os.open(stdout, flags, 0o644)
    err = out if stderr == stdout else os.open(stderr, flags, 0o644)
    os.dup2(null, 0)
    os.dup2(out, 1)
    os.dup2(err, 2)
    for fd in {null, out, err}:
        if fd > 2:
            os.close(fd)
    for fd in open_fds():
        if fd > 2 and fd != keep:
            with contextlib.suppress(OSError):
                os.close(fd)


def child_exit(run: Callable[[], int]) -> NoReturn:
    """Run a forked child's main and leave with os._exit (never return into the server)."""
    code = 1
    try:
        import signal

        signal.signal(signal.SIGINT, signal.SIG_DFL)
        code = run()
    except SystemExit as exc:  # argparse errors
        code = exc.code if isinstance(exc.code, int) else 1
    except BaseException:
        import traceback

        traceback.print_exc()
    finally:
        with contextlib.suppress(Exception):
            sys.stdout.flush()
            sys.stderr.flush()
        os._exit(code)


def double_fork(child: Callable[[], NoReturn]) -> int:
    """Double fork: the middle child starts a new session, forks `child` and exits at once,
    so the grandchild is re-parented to init (it survives the server). Returns its pid."""
    r, w = os.pipe()
    middle = os.fork()
    if middle == 0:
        try:
            os.close(r)
            os.setsid()
            pid = os.fork()
            if pid == 0:
                os.close(w)
                child()
            os.write(w, str(pid).encode())
        finally:
            os._exit(0)
    os.close(w)
    data = b""
    while chunk := os.read(r, 64):
        data += chunk
    os.close(r)
    os.waitpid(middle, 0)
    if not data:
        raise OSError("the intermediate child died before forking")
    return int(data)
