"""The state stream's pure core (ZeroMQ Guide "Clone"): a publisher's sequenced key/value
store, and a subscriber that snapshots, applies newer (epoch, seq) deltas, and resyncs on
any gap or new epoch. No sockets, no clock: the shells in statestream.py drive these."""

from __future__ import annotations

import enum
from collections.abc import Iterable
from dataclasses import dataclass, field

from schemas import bus_pb2

StateEntry = bus_pb2.StateEntry
StateDelta = bus_pb2.StateDelta
SnapshotChunk = bus_pb2.SnapshotChunk

# Headroom under the frame limit for the envelope around a delta or chunk.
ENVELOPE_OVERHEAD = 1024


def split_by_size(entries: Iterable[StateEntry], max_bytes: int) -> list[list[StateEntry]]:
    """Group entries into batches whose encoded size stays under `max_bytes`."""
    batches: list[list[StateEntry]] = [[]]
    size = 0
    for entry in entries:
        n = entry.ByteSize() + 8  # tag + length prefix
        if n > max_bytes:
            raise ValueError(f"state entry {entry.key!r} of {n} bytes exceeds {max_bytes}")
        if batches[-1] and size + n > max_bytes:
            batches.append([])
            size = 0
        batches[-1].append(entry)
        size += n
    return batches if batches[-1] else batches[:-1]


class PublisherCore:
    """The authoritative copy: every change bumps `seq` and becomes one delta."""

    def __init__(self, epoch: int, max_bytes: int) -> None:
        self.epoch = epoch
        self.seq = 0
        self.max_bytes = max_bytes - ENVELOPE_OVERHEAD
        self.store: dict[str, StateEntry] = {}

    def apply(self, entries: Iterable[StateEntry]) -> list[StateDelta]:
        """Apply changes; returns the deltas to publish (several if too large for a frame)."""
        deltas = []
        for batch in split_by_size(entries, self.max_bytes):
            for entry in batch:
                if entry.deleted:
                    self.store.pop(entry.key, None)
                else:
                    self.store[entry.key] = entry
            self.seq += 1
            deltas.append(StateDelta(epoch=self.epoch, seq=self.seq, entries=batch))
        return deltas

    def heartbeat(self) -> StateDelta:
        """An empty delta at the current seq: lets subscribers notice a lost last delta."""
        return StateDelta(epoch=self.epoch, seq=self.seq)

    def snapshot(self, prefix: str = "") -> list[SnapshotChunk]:
        entries = [e for k, e in sorted(self.store.items()) if k.startswith(prefix)]
        batches = split_by_size(entries, self.max_bytes) or [[]]
        return [
            SnapshotChunk(epoch=self.epoch, seq=self.seq, entries=batch,
                          last=i == len(batches) - 1)
            for i, batch in enumerate(batches)
        ]


class Phase(enum.Enum):
    SYNCING = "syncing"  # waiting for a snapshot; deltas are buffered
    SYNCED = "synced"


@dataclass(frozen=True)
class RequestSnapshot:
    """Command: (re)subscribe and ask the snapshot endpoint for a full copy."""

    reason: str


@dataclass(frozen=True)
class Changed:
    """Event for the service: these keys changed. `reset` means the whole store was replaced
    (after a snapshot), so consumers should rebuild from `store` rather than diff."""

    entries: list[StateEntry]
    reset: bool = False


Output = RequestSnapshot | Changed


@dataclass
class SubscriberCore:
    prefix: str = ""
    phase: Phase = Phase.SYNCING
    epoch: int = 0
    seq: int = 0
    store: dict[str, StateEntry] = field(default_factory=dict)
    resyncs: int = 0
    _buffer: list[StateDelta] = field(default_factory=list)
    _chunks: list[SnapshotChunk] = field(default_factory=list)

    def start(self) -> list[Output]:
        return self.resync("start")

    def resync(self, reason: str) -> list[Output]:
        self.phase = Phase.SYNCING
        self._buffer.clear()
        self._chunks.clear()
        self.resyncs += 1
        return [RequestSnapshot(reason)]

    def on_delta(self, delta: StateDelta) -> list[Output]:
        if self.phase is Phase.SYNCING:
            self._buffer.append(delta)
            return []
        if delta.epoch < self.epoch:
            return []  # a deposed publisher: fenced
        if delta.epoch > self.epoch:
            return self.resync(f"new epoch {delta.epoch} (had {self.epoch})")
        if delta.seq <= self.seq:
            return []  # a duplicate, or a heartbeat at our position
        if not delta.entries:  # heartbeat ahead of us: we lost the last delta(s)
            return self.resync(f"heartbeat at seq {delta.seq}, applied {self.seq}")
        if delta.seq != self.seq + 1:
            return self.resync(f"gap: got seq {delta.seq} after {self.seq}")
        return [self._apply(delta)]

    def on_snapshot_chunk(self, chunk: SnapshotChunk) -> list[Output]:
        if self.phase is not Phase.SYNCING:
            return []  # an answer to a request we no longer wait for
        if self._chunks and (chunk.epoch, chunk.seq) != (self._chunks[0].epoch,
                                                        self._chunks[0].seq):
            return self.resync("snapshot changed position mid-transfer")
        self._chunks.append(chunk)
        if not chunk.last:
            return []
        self.epoch, self.seq = chunk.epoch, chunk.seq
        self.store = {e.key: e for c in self._chunks for e in c.entries
                      if e.key.startswith(self.prefix)}
        self._chunks.clear()
        self.phase = Phase.SYNCED
        out: list[Output] = [Changed(list(self.store.values()), reset=True)]
        buffered, self._buffer = self._buffer, []
        for delta in buffered:
            if delta.epoch != self.epoch or delta.seq <= self.seq:
                if delta.epoch > self.epoch:
                    return [*out, *self.resync("new epoch while syncing")]
                continue
            step = self.on_delta(delta)
            out.extend(step)
            if self.phase is Phase.SYNCING:
                break
        return out

    def on_publisher_silent(self) -> list[Output]:
        """The shell saw no delta or heartbeat for too long: the publisher may have moved."""
        return self.resync("publisher silent")

    def _apply(self, delta: StateDelta) -> Changed:
        changed = []
        for entry in delta.entries:
            if not entry.key.startswith(self.prefix):
                continue
            if entry.deleted:
                self.store.pop(entry.key, None)
            else:
                self.store[entry.key] = entry
            changed.append(entry)
        self.seq = delta.seq
        return Changed(changed)

    def validate(self) -> None:
        """Invariants, checked after every step in tests."""
        assert all(k == e.key and not e.deleted for k, e in self.store.items())
        assert all(k.startswith(self.prefix) for k in self.store)
        if self.phase is Phase.SYNCED:
            assert not self._buffer and not self._chunks
