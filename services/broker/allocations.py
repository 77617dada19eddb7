"""What the broker says and sends back about an allocation it does not turn into an offer:
its name and facts in a Notice, and the Recovery that hands its resources back to the
allocator (which otherwise would count them as offered for good)."""

from __future__ import annotations

from schemas import internal_pb2
from services.broker.commands import Command, RecoverResources, Recovery
from services.notice import Notice
from services.resources import Resources

RecoverReason = internal_pb2.InternalMessage.RecoverResources.Reason


def what(a: internal_pb2.Allocation) -> str:
    return f"allocation {a.allocation_id!r} ({a.framework_id!r} on {a.agent_id!r})"


def facts(a: internal_pb2.Allocation) -> dict[str, str]:
    """An allocation's facts for a Notice: its ids, and its trace (the allocate span's),
    under which the shell records the offer that was not made."""
    return {"allocation_id": a.allocation_id, "framework_id": a.framework_id,
            "agent_id": a.agent_id, "allocation_traceparent": a.traceparent}


def dropped(a: internal_pb2.Allocation, message: str) -> Notice:
    return Notice.of("allocation_dropped", message, "warning", **facts(a))


def hand_back(a: internal_pb2.Allocation, notice: Notice,
              res: Resources | None = None) -> list[Command]:
    """The notice, and a Recovery (unfiltered) of the allocation's resources; only the
    notice when its resources cannot be read (the allocator never counted them)."""
    if res is None:
        try:
            res = Resources.from_proto(a.resources)
        except ValueError:
            return [notice]
    return [notice, RecoverResources((Recovery(
        a.framework_id, a.agent_id, res, RecoverReason.RECOVER_REASON_RESCINDED,
        allocation_id=a.allocation_id),))]
