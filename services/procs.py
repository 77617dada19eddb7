"""Is a process alive? Written once for every service, tool and test (Linux /proc): a zombie
is dead (it still answers kill(pid, 0) until its parent reaps it), and a recycled pid is
told apart by the process's start time. Also which Python module runs each service role
(`python -m MODULE`), for `offerbus up`, the fleet rollout and the tests."""

from __future__ import annotations

import os
from pathlib import Path

DEAD_STATES = frozenset("ZX")  # zombie, dead
# The module behind each service role: what `offerbus up`, the systemd units
# (infra/systemd/), the service image's entrypoint and the tests run as `python -m MODULE`.
SERVICE_MODULES = {"master": "services.master", "allocator": "services.allocator",
                   "broker": "services.broker", "agent": "services.agent",
                   "jobs": "frameworks.jobrunner"}


def service_module(role: str) -> str:
    """The module `python -m` runs for a service role (KeyError for an unknown role)."""
    return SERVICE_MODULES[role]


def _stat_fields(pid: int) -> list[str] | None:
    """Fields 3.. of /proc/PID/stat (state first), or None when there is no such process.
    The command name (field 2) may hold spaces and parentheses: split after the last ')'."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except (OSError, ValueError):
        return None
    return stat.rsplit(")", 1)[-1].split()


def start_time(pid: int) -> int | None:
    """When `pid` started (clock ticks since boot); None if it is gone or a zombie."""
    fields = _stat_fields(pid)
    if not fields or fields[0] in DEAD_STATES:
        return None
    return int(fields[19])  # field 22 overall


def pid_alive(pid: int, started: int | None = None) -> bool:
    """True while `pid` runs and is not a zombie; with `started` (from start_time()), also
    false when the pid now belongs to another process."""
    if pid <= 0:
        return False
    fields = _stat_fields(pid)
    if fields is None:
        try:  # no /proc entry we may read: ask the kernel
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            return True
        return True
    if not fields or fields[0] in DEAD_STATES:
        return False
    return started is None or int(fields[19]) == started


def cmdline(pid: int) -> list[str]:
    """The process's argv, or [] when it is gone."""
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return []
    return [part.decode("utf-8", "replace") for part in raw.split(b"\0") if part]
