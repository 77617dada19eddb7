"""ACCEPT validation for the offer-broker: the checks an ACCEPT's operations must pass
against the pooled offers (tasks well formed, inside the offers, no port or set item in two
tasks, reservations only of what is offered, for the offers' role), the decline filter's
default and cap, and the resource comparisons the offer table needs (positive, overlapping
ports or set items).
Pure functions; a failed check raises `Invalid`, which names the check."""

from __future__ import annotations

from collections.abc import Sequence

from schemas import common_pb2
from services import container_policy
from services.decline import refuse_seconds_of
from services.resources import UNRESERVED, Resources

RejectReason = common_pb2.RejectReason


def positive(r: Resources) -> bool:
    return (any(v > 0 for v in r.scalars.values()) or any(r.ranges.values())
            or any(r.sets.values()))


def overlap(a: Resources, b: Resources) -> bool:
    """Whether a and b share a port (range value) or set item, whatever their roles."""
    if not (a.ranges or a.sets) or not (b.ranges or b.sets):
        return False  # scalars alone (most tasks): nothing to share
    a, b = a.with_role(UNRESERVED), b.with_role(UNRESERVED)
    return any(lo <= bhi and blo <= hi
               for k, rs in b.ranges.items() for blo, bhi in rs
               for lo, hi in a.ranges.get(k, ())) or any(
        items & a.sets.get(k, frozenset()) for k, items in b.sets.items())


def refuse_seconds(filters: common_pb2.Filters | None) -> float:
    """The filter a decline/accept installs (services/decline.py: unset or nonsense = the
    default, 0 = none, capped)."""
    has = filters is not None and filters.HasField("refuse_seconds")
    return refuse_seconds_of(filters.refuse_seconds if has else None)  # type: ignore[union-attr]


class Invalid(Exception):
    """A failed ACCEPT check: the RejectReason the framework gets, and what failed."""

    def __init__(self, reason: int, message: str) -> None:
        super().__init__(message)
        self.reason = reason
        self.message = message


def check_task(task: common_pb2.TaskInfo, agent_id: str, seen: set[str]) -> Resources:
    """One task of a Launch: returns its resources, or raises Invalid naming the check."""
    tid = task.task_id
    if not tid:
        raise Invalid(RejectReason.REJECT_REASON_TASK_INVALID, "a task has an empty task_id")
    if tid in seen:
        raise Invalid(RejectReason.REJECT_REASON_TASK_INVALID,
                       f"duplicate task id {tid!r} in one accept")
    seen.add(tid)
    if task.agent_id and task.agent_id != agent_id:
        raise Invalid(RejectReason.REJECT_REASON_TASK_INVALID,
                       f"task {tid!r} names agent {task.agent_id!r}, offers are on {agent_id!r}")
    try:
        res = (Resources.from_proto(task.resources))
    except ValueError as exc:
        raise Invalid(RejectReason.REJECT_REASON_TASK_INVALID,
                       f"task {tid!r} has invalid resources: {exc}") from exc
    if not positive(res):
        raise Invalid(RejectReason.REJECT_REASON_TASK_INVALID, f"task {tid!r} has no resources")
    refusal = container_policy.request_refusal(task.container)
    if refusal is not None:
        raise Invalid(RejectReason.REJECT_REASON_TASK_INVALID, f"task {tid!r}: {refusal}")
    ports = [rg for (n, _), rgs in res.ranges.items() if n == "ports" for rg in rgs]
    for pm in task.container.docker.port_mappings:
        if not any(lo <= pm.host_port <= hi for lo, hi in ports):
            raise Invalid(RejectReason.REJECT_REASON_TASK_INVALID,
                           f"task {tid!r} maps host port {pm.host_port} outside its ports")
    return res


def disjoint(named: Sequence[tuple[str, Resources]]) -> Resources:
    """The tasks' sum, or Invalid if two of them share a port or set item."""
    try:
        return Resources.total_disjoint(named)
    except ValueError as exc:
        raise Invalid(RejectReason.REJECT_REASON_TASK_INVALID, f"tasks {exc}") from exc


def check_operations(pool: Resources, operations: Sequence[common_pb2.Operation],
                     agent_id: str, role: str) -> tuple[Resources, Resources]:
    """Apply an ACCEPT's operations in order to the pooled offers. Returns (resources the
    tasks use, the unused remainder), or raises Invalid naming the failed check."""
    seen: set[str] = set()
    used = Resources()
    named: list[tuple[str, Resources]] = []  # every task of the ACCEPT so far
    for i, op in enumerate(operations):
        kind = op.WhichOneof("operation")
        if kind == "launch":
            batch = [(t.task_id, check_task(t, agent_id, seen)) for t in op.launch.tasks]
            named += batch
            tasks = disjoint(batch)
            if not pool.contains(tasks):
                disjoint(named)  # a port an earlier launch took: name both tasks
                raise Invalid(RejectReason.REJECT_REASON_RESOURCES_EXCEEDED,
                               f"operation {i} (launch): tasks need {tasks}, offers hold {pool}")
            pool, used = pool - tasks, used + tasks
        elif kind in ("reserve", "unreserve"):
            items = op.reserve.resources if kind == "reserve" else op.unreserve.resources
            try:
                res = (Resources.from_proto(items))
            except ValueError as exc:
                raise Invalid(RejectReason.REJECT_REASON_TASK_INVALID,
                               f"operation {i} ({kind}): invalid resources: {exc}") from exc
            roles = {k[1] for k in (*res.scalars, *res.ranges, *res.sets)}
            if not positive(res) or UNRESERVED in roles:
                raise Invalid(RejectReason.REJECT_REASON_TASK_INVALID,
                               f"operation {i} ({kind}): needs reserved, non-empty resources")
            if roles != {role}:
                raise Invalid(RejectReason.REJECT_REASON_UNAUTHORIZED,
                               f"operation {i} ({kind}): roles {sorted(roles)}, "
                               f"framework's offers are for role {role!r}")
            take, give = (res.with_role(UNRESERVED), res) if kind == "reserve" else (
                res, res.with_role(UNRESERVED))
            if not pool.contains(take):
                raise Invalid(RejectReason.REJECT_REASON_RESOURCES_EXCEEDED,
                               f"operation {i} ({kind}): {take} not in the offers ({pool})")
            pool = pool - take + give
        else:
            raise Invalid(RejectReason.REJECT_REASON_TASK_INVALID,
                           f"operation {i} has no kind")
    return used, pool


def task_ids(operations: Sequence[common_pb2.Operation]) -> tuple[str, ...]:
    ids = [t.task_id for op in operations if op.WhichOneof("operation") == "launch"
           for t in op.launch.tasks]
    return tuple(dict.fromkeys(ids))


def failed_check(reason: int) -> str:
    """The name of a failed check, as spans carry it: REJECT_REASON_TASK_INVALID -> task_invalid."""
    return RejectReason.Name(reason).removeprefix("REJECT_REASON_").lower()  # type: ignore[arg-type]

