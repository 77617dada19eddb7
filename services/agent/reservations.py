"""The agent's total with its reservations: its --resources flags are the base (static
reservations included), the master's AgentEvent.CheckpointResources (after an ACCEPT that
reserved or unreserved) the word on which of those quantities are reserved for which role,
checkpointed in the work dir and recovered after a restart. A checkpoint fits the flags when
it has the same quantities per resource name, across roles; one that does not (the flags
changed since it was written) is never applied."""

from __future__ import annotations

from collections.abc import Iterable

from schemas import common_pb2
from services.agent.commands import Command, SaveResources
from services.notice import Notice
from services.resources import UNRESERVED, Resources


def fitting(flags: Resources, items: Iterable[common_pb2.Resource],
            ) -> tuple[Resources | None, str]:
    """(the checkpointed total, "") when it fits `flags`, else (None, why not)."""
    try:
        total = Resources.from_proto(items)
    except ValueError as exc:
        return None, f"invalid resources: {exc}"
    if not total.with_role(UNRESERVED).same(flags.with_role(UNRESERVED)):
        return None, (f"{total} is not the quantities of the agent's resources {flags} "
                      "(the same amount of each resource name, whatever its role)")
    return total, ""


class AgentResources:
    """`flags` (the base) and `total`, what the agent reports as its resources."""

    def __init__(self, flags: Resources) -> None:
        self.flags = self.total = flags

    def recover(self, checkpoint: Iterable[common_pb2.Resource]) -> list[Command]:
        """The checkpoint read from the work dir at start: the total if it fits."""
        total, why = fitting(self.flags, checkpoint)
        if total is None:
            return [Notice.of("resources_checkpoint_ignored", "the checkpointed resources "
                              f"(with reservations) do not fit the agent's flags: {why}; "
                              "ignored: the agent reports its flags' resources, and loses "
                              "its dynamic reservations unless the master still knows them",
                              "warning", flags=str(self.flags))]
        self.total = total
        return [Notice.of("resources_recovered", "reporting the checkpointed resources "
                          "(with reservations)", "info", resources=str(total))]

    def checkpoint(self, items: Iterable[common_pb2.Resource]) -> list[Command]:
        """The master's CheckpointResources: saved, then reported, if it fits the flags."""
        total, why = fitting(self.flags, items)
        if total is None:
            return [Notice.of("resources_checkpoint_refused", "the master's checkpoint of "
                              f"this agent's resources does not fit its flags: {why}; "
                              "ignored", "warning", flags=str(self.flags))]
        if total.same(self.total):
            return []
        self.total = total
        return [SaveResources(tuple(total.to_proto())),
                Notice.of("resources_checkpointed", "the master changed this agent's "
                          "reservations", "info", resources=str(total))]
