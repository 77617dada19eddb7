"""Building a framework's demand (SchedulerCall.Request): `count` tasks of one shape, the
shape being one task's scalars, unreserved, and the host ports one task needs."""

from __future__ import annotations

from collections.abc import Iterable

from schemas import common_pb2
from services.resources import UNRESERVED, Resources


def demand(resources: Resources | Iterable[common_pb2.Resource], count: int,
           ports: int | None = None) -> common_pb2.Demand:
    """One Demand: `count` tasks, each of `resources`' scalars (cpus, mem, disk, gpus; their
    roles dropped) and `ports` host ports (None: as many ports as `resources` holds, e.g. a
    TaskInfo's resources)."""
    res = resources if isinstance(resources, Resources) else Resources.from_proto(resources)
    if count < 0:
        raise ValueError(f"a demand counts tasks: {count} < 0")
    if ports is None:
        ports = sum(hi - lo + 1 for (name, _), ranges in res.ranges.items() if name == "ports"
                    for lo, hi in ranges)
    if ports < 0:
        raise ValueError(f"a task needs no fewer than 0 ports (got {ports})")
    return common_pb2.Demand(resources=res.quantities().with_role(UNRESERVED).to_proto(),
                             count=count, ports=ports)
