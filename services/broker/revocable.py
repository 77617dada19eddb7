"""Which tasks of an ACCEPT are revocable (issue 9 item 2): the allocator marks an allocation
revocable when it takes its framework beyond its guaranteed share, and its offer says so
(Offer.revocable); the broker sets each launched task's TaskInfo.revocable, whatever the
framework wrote there. A task is guaranteed when the ACCEPT's guaranteed offers, pooled,
still hold it after the tasks before it (reservation labels aside); otherwise revocable."""

from __future__ import annotations

from collections.abc import Sequence

from schemas import common_pb2
from services.broker.commands import LaunchRequest, Offer
from services.resources import UNRESERVED, Resources


def mark_tasks(operations: Sequence[common_pb2.Operation],
               offers: Sequence[Offer]) -> tuple[common_pb2.Operation, ...]:
    """The operations, their tasks' `revocable` set as the offers say (copies only when a
    flag changes). The operations were validated: their tasks' resources parse."""
    tasks = [t for op in operations if op.WhichOneof("operation") == "launch"
             for t in op.launch.tasks]
    if not any(o.revocable for o in offers) and not any(t.revocable for t in tasks):
        return tuple(operations)
    pool = Resources.total(o.resources for o in offers if not o.revocable).with_role(UNRESERVED)
    out = []
    for op in operations:
        if op.WhichOneof("operation") != "launch":
            out.append(op)
            continue
        copy = common_pb2.Operation()
        copy.CopyFrom(op)
        for t in copy.launch.tasks:
            need = Resources.from_proto(t.resources).with_role(UNRESERVED)
            t.revocable = not pool.contains(need)
            if not t.revocable:
                pool -= need
        out.append(copy)
    return tuple(out)


def launch_request(request_id: str, framework_id: str, agent_id: str, offer_ids: tuple[str, ...],
                   operations: Sequence[common_pb2.Operation],
                   offers: Sequence[Offer]) -> LaunchRequest:
    """The LaunchRequest of a valid ACCEPT: its tasks marked, its offers' trace contexts."""
    return LaunchRequest(request_id, framework_id, agent_id, offer_ids,
                         mark_tasks(operations, offers), tuple(o.traceparent for o in offers))
