"""Status updates on their way to frameworks, batched per reactor turn: the updates the
master forwards to one framework during a turn go out as one Update event (at most
MAX_STATUSES statuses each), in the order they were made, so a framework whose tasks run on
many agents is sent (and acknowledges) one message per turn instead of one per agent.
Another event to a framework first sends that framework's pending updates: whatever a
framework is told arrives in the order the core said it."""

from __future__ import annotations

from dataclasses import dataclass, field

from schemas import scheduler_pb2

MAX_STATUSES = 1000  # statuses in one batched Update (~150 kB), far below the frame limit


@dataclass
class Pending:
    """One framework connection's updates of this turn: the first one's traceparent."""

    framework_id: str
    traceparent: str
    updates: list[scheduler_pb2.SchedulerEvent.Update] = field(default_factory=list)


class UpdateOutbox:
    """Per framework connection (peer): its updates not yet sent, in order. Bounded: a
    connection's updates are taken out as an event each time MAX_STATUSES gather."""

    def __init__(self, max_statuses: int = MAX_STATUSES) -> None:
        self.max_statuses = max_statuses
        self._pending: dict[bytes, Pending] = {}
        self._count: dict[bytes, int] = {}

    def __len__(self) -> int:
        return len(self._pending)

    def add(self, peer: bytes, framework_id: str, update: scheduler_pb2.SchedulerEvent.Update,
            traceparent: str) -> list[tuple[bytes, str, scheduler_pb2.SchedulerEvent, str]]:
        """Keep `update` for `peer`; returns the events to send now (a full batch, or the
        batch of another framework that had this connection before)."""
        out = []
        p = self._pending.get(peer)
        if p is not None and p.framework_id != framework_id:
            out += self.take(peer)
            p = None
        if p is None:
            p = self._pending[peer] = Pending(framework_id, traceparent)
            self._count[peer] = 0
        p.updates.append(update)
        self._count[peer] += len(update.statuses)
        if self._count[peer] >= self.max_statuses:
            out += self.take(peer)
        return out

    def take(self, peer: bytes) -> list[tuple[bytes, str, scheduler_pb2.SchedulerEvent, str]]:
        """`peer`'s pending updates as events ([] if none), forgotten here."""
        p = self._pending.pop(peer, None)
        self._count.pop(peer, None)
        if p is None:
            return []
        events = []
        event = scheduler_pb2.SchedulerEvent()
        for update in p.updates:
            if event.update.statuses and \
                    len(event.update.statuses) + len(update.statuses) > self.max_statuses:
                events.append(event)
                event = scheduler_pb2.SchedulerEvent()
            event.update.statuses.extend(update.statuses)
        events.append(event)
        return [(peer, p.framework_id, e, p.traceparent) for e in events]

    def drain(self) -> list[tuple[bytes, str, scheduler_pb2.SchedulerEvent, str]]:
        """Every pending update, as events, in the order the connections were first given
        one this turn."""
        return [e for peer in list(self._pending) for e in self.take(peer)]

    def clear(self) -> None:
        self._pending.clear()
        self._count.clear()
