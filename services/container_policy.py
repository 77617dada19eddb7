"""What a task's container may ask for (issue 11), one place for the broker (an ACCEPT asking
for more is refused with TASK_ERROR before anything runs) and the executor (which refuses it
again when it starts the container: defence in depth, the agent's own list of host paths):
never privileged; host paths bound only from the agent's allowed prefixes; and the limits and
hardening every Docker container gets."""

from __future__ import annotations

import os
from collections.abc import Iterable, Sequence
from pathlib import PurePosixPath

from schemas import common_pb2

# The agent's allowed host path prefixes (its `allowed_host_paths` option) reach the executors
# it forks through this variable: os.pathsep-separated absolute paths; unset or "" = none.
ALLOWED_HOST_PATHS_ENV = "OFFERBUS_ALLOWED_HOST_PATHS"
DEFAULT_PIDS_LIMIT = 1024  # processes (and threads) one container may hold: no fork bomb
# Capabilities of Docker's default set no task needs: raw sockets (spoofing, sniffing on the
# bridge), device nodes, audit records, file capabilities. The rest stay (chown, setuid, ...:
# images that switch users need them); no-new-privileges stops setuid binaries gaining more.
DROPPED_CAPABILITIES = ("NET_RAW", "MKNOD", "AUDIT_WRITE", "SETFCAP")
SECURITY_OPTIONS = ("no-new-privileges",)


def parse_allowed(text: str) -> tuple[str, ...]:
    """The prefixes of an `allowed_host_paths` value; ValueError for a relative one."""
    out = []
    for part in (p.strip() for p in text.split(os.pathsep)):
        if not part:
            continue
        if not part.startswith("/"):
            raise ValueError(f"allowed host paths must be absolute, got {part!r}")
        out.append(os.path.normpath(part))
    return tuple(out)


def allowed_from_environment() -> tuple[str, ...]:
    return parse_allowed(os.environ.get(ALLOWED_HOST_PATHS_ENV, ""))


def request_refusal(container: common_pb2.ContainerInfo) -> str | None:
    """Why the master side refuses this container request, or None: privileged mode, or a
    volume whose paths are not absolute and plain (no `..`). Which host paths an agent
    allows is the agent's to say (host_path_refusal)."""
    if container.privileged:
        return "privileged containers are not allowed on this cluster"
    for v in container.volumes:
        for label, path in (("host_path", v.host_path), ("container_path", v.container_path)):
            if not path.startswith("/") or ".." in PurePosixPath(path).parts:
                return f"volume {label} {path!r} must be an absolute path without '..'"
    return None


def host_path_refusal(host_paths: Iterable[str], allowed: Sequence[str],
                      resolve: bool = True) -> str | None:
    """Why one of `host_paths` may not be bound, or None: each must be (after resolving
    symbolic links, when `resolve`) one of `allowed` or under one."""
    for path in host_paths:
        real = os.path.realpath(path) if resolve else os.path.normpath(path)
        if not any(real == a or real.startswith(a.rstrip("/") + "/") for a in allowed):
            where = ", ".join(allowed) if allowed else "none (allowed_host_paths is empty)"
            return (f"host path {path!r} is not in this agent's allowed host paths "
                    f"({where})")
    return None
