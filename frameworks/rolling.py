"""Rolling updates of a service (pure): which running instances launched from an older spec
to replace now, so that at most `max_unavailable` of the wanted instances are down at any
time (missing, not RUNNING, being killed, unhealthy, or, for a service with a health check,
not yet reported healthy). A replaced instance is killed; the
service framework relaunches it from the new spec as it does any instance that ended."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Protocol

RUNNING = "TASK_RUNNING"


class InstanceView(Protocol):
    index: int
    state: str
    healthy: bool | None
    kill_sent: bool
    digest: str


def down(instances: Mapping[int, InstanceView], want: int, checked: bool = False) -> int:
    """How many of the wanted instances (indexes < want) are not serving; `checked`: the
    service has a health check, and an instance serves once reported healthy."""
    return sum(1 for i in range(want)
               if (inst := instances.get(i)) is None or inst.state != RUNNING
               or inst.kill_sent or inst.healthy is False
               or (checked and inst.healthy is not True))


def outdated(instances: Mapping[int, InstanceView], want: int, digest: str) -> list[int]:
    """The wanted instances running from another spec than `digest`, lowest index first. An
    instance whose spec is unknown ("": adopted from the master without its task) is left
    alone."""
    return sorted(i for i, inst in instances.items()
                  if i < want and inst.state == RUNNING and not inst.kill_sent
                  and inst.digest and inst.digest != digest)


def to_replace(instances: Mapping[int, InstanceView], want: int, digest: str,
               max_unavailable: int, checked: bool = False) -> list[int]:
    """The instances to kill now for the rolling update to `digest`."""
    budget = max(0, max_unavailable - down(instances, want, checked))
    return outdated(instances, want, digest)[:budget]
