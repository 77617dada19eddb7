"""The state stream's pure core (ZeroMQ Guide "Clone"): a publisher's sequenced key/value
store, and a subscriber that snapshots, applies newer (epoch, seq) deltas, and resyncs on
any gap or new epoch, saying which copy it holds: a new leader that started from that copy
(its standby followed the old stream) answers with only what changed since (incremental
snapshots). No sockets, no clock: the shells in statestream.py drive these."""

from __future__ import annotations

import enum
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import TypeVar

from schemas import bus_pb2
from services.bus.codec import varint

StateEntry = bus_pb2.StateEntry
StateDelta = bus_pb2.StateDelta
SnapshotChunk = bus_pb2.SnapshotChunk
Position = tuple[int, int]  # (epoch, seq) on a stream
# A successor's changes since its base, kept for incremental snapshots while they number at
# most twice the store (and this many): beyond, a whole snapshot is about as large.
MIN_SINCE_BASE = 10_000
# A follower's log of the keys each recent delta changed (SubscriberCore.recent): this many
# keys at most, so that a subscriber a few deltas behind the copy a successor started from
# is still answered incrementally.
RECENT_KEYS = 20_000

# Headroom under the frame limit for the envelope around a delta or chunk.
ENVELOPE_OVERHEAD = 1024


ENTRY_FRAMING = 8  # an entry's tag and length prefix inside a delta or chunk (at most)
# StateDelta.entries and SnapshotChunk.entries on the wire: their tags (field number,
# length-delimited), written before each serialised entry with the entry's length.
_ENTRIES_TAG = bytes([StateDelta.DESCRIPTOR.fields_by_name["entries"].number << 3 | 2])
_CHUNK_ENTRIES_TAG = bytes([SnapshotChunk.DESCRIPTOR.fields_by_name["entries"].number << 3 | 2])
T = TypeVar("T")


def entry_size(entry: StateEntry) -> int:
    """An entry's encoded size inside a delta or chunk (with its tag and length prefix)."""
    return entry.ByteSize() + ENTRY_FRAMING


@dataclass(frozen=True)
class StreamCopy:
    """A subscriber's synced copy of a stream: its store as of position (epoch, seq), and
    the keys each of the deltas before it changed (seq -> keys, consecutive up to `seq`; may
    be empty). A standby that followed its leader hands it to its own publisher when it
    leads."""

    epoch: int
    seq: int
    store: dict[str, StateEntry]
    recent: dict[int, frozenset[str]] = field(default_factory=dict)


@dataclass(frozen=True)
class EncodedDelta:
    """A delta as its wire bytes (a serialised StateDelta), and how many entries it holds."""

    epoch: int
    seq: int
    payload: bytes
    count: int


def _framed_size(pair: tuple[StateEntry, bytes]) -> int:
    """An (entry, its wire bytes) pair's size inside a delta or chunk."""
    return len(pair[1]) + ENTRY_FRAMING


def split_by_size(entries: Iterable[T], max_bytes: int,
                  size_of: Callable[[T], int] = entry_size,  # type: ignore[assignment]
                  ) -> tuple[list[list[T]], list[T]]:
    """(batches, too_large): entries grouped in order into batches whose encoded size stays
    under `max_bytes`; an entry that fits only alone goes alone, and one that can never fit
    is left out, in `too_large`, for the caller to refuse (it never raises). `size_of`: an
    entry's encoded size (the default measures a StateEntry)."""
    batches: list[list[T]] = [[]]
    too_large: list[T] = []
    size = 0
    for entry in entries:
        n = size_of(entry)
        if n > max_bytes:
            too_large.append(entry)
            continue
        if batches[-1] and size + n > max_bytes:
            batches.append([])
            size = 0
        batches[-1].append(entry)
        size += n
    return (batches if batches[-1] else batches[:-1]), too_large


class PublisherCore:
    """The authoritative copy: every change bumps `seq` and becomes one delta. `seq` never
    goes back within one epoch (see `successor`)."""

    def __init__(self, epoch: int, max_bytes: int, seq: int = 0) -> None:
        self.epoch = epoch
        self.seq = seq
        self.max_bytes = max_bytes - ENVELOPE_OVERHEAD
        self.store: dict[str, StateEntry] = {}
        # The copy this reign's stream started from (a successor's `base`), and the keys
        # changed since (None: no base; snapshots are whole): a subscriber holding that copy
        # is answered only those (an incremental snapshot), not the whole store.
        self.base: Position | None = None
        self._since_base: set[str] | None = None
        self._before_base: dict[int, frozenset[str]] = {}  # the base's `recent`
        # Each stored entry serialised (as published): a snapshot is these bytes joined, not
        # its entries copied into chunk messages and serialised again (at 110,000 entries a
        # snapshot cost ~0.2 s of a new master's reign; joined: ~0.02 s). An entry a
        # successor took from its base as it was has none until a snapshot needs them.
        self._encoded: dict[str, bytes] = {}

    def successor(self, epoch: int, entries: Iterable[StateEntry],
                  base: StreamCopy | None = None) -> PublisherCore:
        """The publisher of a new reign at `epoch`, holding `entries`. A new epoch starts
        at seq 0 (subscribers resync on the epoch change); a reign at this same epoch (a
        leader that led afresh instead of resuming) continues past our seq with a gap, so
        every subscriber sees the gap and resyncs instead of taking its deltas for ones it
        already has (or for the next ones). `base`: the copy of the previous leader's stream
        this reign's standby followed; a subscriber that holds it (the same position) is
        sent, when it resyncs, only the keys that differ from it (`snapshot_tails`)."""
        seq = self.seq + 1 if epoch == self.epoch else 0
        core = PublisherCore(epoch, self.max_bytes + ENVELOPE_OVERHEAD, seq=seq)
        if base is not None:
            core._start_from(base, entries)
            return core
        # As `apply` would (one seq per frame's worth; entries too large left out), without
        # making the deltas nobody sends: subscribers take this state as a snapshot.
        batches, _ = split_by_size(((e, e.SerializeToString()) for e in entries),
                                   core.max_bytes, _framed_size)
        for batch in batches:
            core._store(batch)
            core.seq += 1
        return core

    def _start_from(self, base: StreamCopy, entries: Iterable[StateEntry]) -> None:
        """Hold `entries`, starting from `base`: an entry of the copy itself (a standby's
        held records are the very entries it followed) is stored as it is, its bytes made
        when a whole snapshot first needs them (it came in a frame: it fits one); the others
        are serialised now (one too large for a frame left out, as `apply` would) and, with
        the keys gone since, are what differs from `base`. The state takes one seq."""
        old, store = base.store, self.store
        fresh = []
        for entry in entries:
            key = entry.key  # read once: a message's field is not a plain attribute
            if old.get(key) is entry:
                store[key] = entry
            else:
                fresh.append(entry)
        batches, _ = split_by_size(((e, e.SerializeToString()) for e in fresh),
                                   self.max_bytes, _framed_size)
        for batch in batches:
            self._store(batch)
        since = {e.key for batch in batches for e, _ in batch
                 if (was := old.get(e.key)) is None or was != e}
        since.update(old.keys() - store.keys())
        self.seq += 1
        self.base, self._since_base = (base.epoch, base.seq), since
        self._before_base = base.recent
        self._bound_since_base()

    def _wire(self, key: str) -> bytes:
        """A key's entry as it goes in a chunk: the stored entry's bytes (made now if it was
        stored without them), or a deletion when it is not stored."""
        data = self._encoded.get(key)
        if data is None:
            entry = self.store.get(key)
            if entry is None:
                return StateEntry(key=key, deleted=True).SerializeToString()
            data = self._encoded[key] = entry.SerializeToString()
        return data

    def _bound_since_base(self) -> None:
        if self._since_base is not None and \
                len(self._since_base) > max(MIN_SINCE_BASE, 2 * len(self.store)):
            self.base, self._since_base, self._before_base = None, None, {}

    def apply(self, entries: Iterable[StateEntry]) -> list[StateDelta]:
        """Apply changes; returns the deltas to publish (several if too large for a frame).
        An entry too large for any frame is left out (see `publish`)."""
        return self.publish(entries)[0]

    def publish(self, entries: Iterable[StateEntry],
                ) -> tuple[list[StateDelta], list[StateEntry]]:
        """Apply changes: (the deltas to publish, the entries refused as too large for a
        frame). A refused entry changes nothing: subscribers keep what the stream last
        carried for its key, and so does this store (they stay equal)."""
        encoded, too_large = self.publish_encoded(entries)
        return [StateDelta.FromString(d.payload) for d in encoded], too_large

    def publish_encoded(self, entries: Iterable[StateEntry],
                        ) -> tuple[list[EncodedDelta], list[StateEntry]]:
        """`publish`, each delta as its wire bytes: every entry is serialised once (its
        size is the length of that), never copied into a StateDelta message (a failover's
        re-registrations publish 100,000 task records; two copies of each were a third of
        the publication's cost)."""
        deltas = []
        batches, too_large = split_by_size(
            ((e, e.SerializeToString()) for e in entries), self.max_bytes, _framed_size)
        for batch in batches:
            self._store(batch)
            self.seq += 1
            parts = [StateDelta(epoch=self.epoch, seq=self.seq).SerializeToString()]
            for _, data in batch:
                parts += (_ENTRIES_TAG, varint(len(data)), data)
            deltas.append(EncodedDelta(self.epoch, self.seq, b"".join(parts), len(batch)))
        return deltas, [e for e, _ in too_large]

    def _store(self, encoded: Iterable[tuple[StateEntry, bytes]]) -> None:
        """Keep each entry, with its wire bytes (for snapshots: stored entries never
        change)."""
        since = self._since_base
        for entry, data in encoded:
            if since is not None:
                since.add(entry.key)
            if entry.deleted:
                self.store.pop(entry.key, None)
                self._encoded.pop(entry.key, None)
            else:
                self.store[entry.key] = entry
                self._encoded[entry.key] = data
        self._bound_since_base()

    def heartbeat(self) -> StateDelta:
        """An empty delta at the current seq: lets subscribers notice a lost last delta."""
        return StateDelta(epoch=self.epoch, seq=self.seq)

    def snapshot(self, prefix: str = "", have: Position | None = None) -> list[SnapshotChunk]:
        """The chunks answering a snapshot request, as they go on the wire."""
        base, tails = self.snapshot_tails(prefix, have)
        return [SnapshotChunk.FromString(self.chunk_head(i == len(tails) - 1, base) + tail)
                for i, (_, tail) in enumerate(tails)]

    def chunk_head(self, last: bool, base: Position | None) -> bytes:
        """A chunk's fields but its entries (which `snapshot_tails` gives), serialised."""
        head = SnapshotChunk(epoch=self.epoch, seq=self.seq, last=last)
        if base is not None:
            head.base.epoch, head.base.seq = base
        return head.SerializeToString()

    def snapshot_tails(self, prefix: str = "", have: Position | None = None,
                       ) -> tuple[Position | None, list[tuple[int, bytes]]]:
        """The answer to a snapshot request on the wire: (the base it is changes since, or
        None for the whole store; for each chunk, its number of entries and its entries as
        SnapshotChunk.entries' bytes, the stored entries' own), for the chunk's other fields
        to go before them (`chunk_head`). In key order, split under the frame limit by the
        entries' stored sizes. A subscriber that `have`s this reign's base (or a position
        its `recent` log covers) gets the keys changed since (deleted ones as deletions),
        the others the whole store."""
        changed = self._changed_since(have)
        incremental = changed is not None
        keys = sorted(k for k in (changed if changed is not None else self.store)
                      if k.startswith(prefix))
        wire = {k: self._wire(k) for k in keys}
        tails = []
        for batch in split_by_size(keys, self.max_bytes,
                                   lambda k: len(wire[k]) + ENTRY_FRAMING)[0] or [[]]:
            parts: list[bytes] = []
            for key in batch:
                data = wire[key]
                parts += (_CHUNK_ENTRIES_TAG, varint(len(data)), data)
            tails.append((len(batch), b"".join(parts)))
        return (have if incremental else None), tails

    def _changed_since(self, have: Position | None) -> set[str] | None:
        """The keys that differ between the copy at `have` and this store, when known: `have`
        is this reign's base, or a position a few deltas before it (the base's `recent`
        covers every delta since); else None."""
        since, base = self._since_base, self.base
        if have is None or base is None or since is None or have[0] != base[0] or \
                have[1] > base[1]:
            return None
        before = self._before_base
        gap = range(have[1] + 1, base[1] + 1)
        if not all(seq in before for seq in gap):
            return None
        return since.union(*(before[seq] for seq in gap))


class Phase(enum.Enum):
    SYNCING = "syncing"  # waiting for a snapshot; deltas are buffered
    SYNCED = "synced"


@dataclass(frozen=True)
class RequestSnapshot:
    """Command: (re)subscribe and ask the snapshot endpoint for a full copy. `request`
    numbers it: only chunks answering this request are taken (`on_snapshot_chunk`)."""

    reason: str
    request: int = 0
    have: Position | None = None  # the position of the copy held (None: none yet)


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
    request: int = 0  # the snapshot request being answered (numbered by resync)
    # The SUB stream has reached the snapshot's position: nothing older can still come.
    _caught_up: bool = False
    # `store` is the copy at (epoch, seq): a snapshot was taken (deltas are buffered, the
    # store untouched, while syncing again), so a request can say what it holds.
    _holds: bool = False
    # Keep the keys each applied delta changed (`recent`, up to RECENT_KEYS keys): a
    # follower's, for the successor it may become (StreamCopy.recent).
    keep_recent: bool = False
    recent: dict[int, frozenset[str]] = field(default_factory=dict)
    _recent_keys: int = 0
    _buffer: list[StateDelta] = field(default_factory=list)
    _chunks: list[SnapshotChunk] = field(default_factory=list)

    def start(self) -> list[Output]:
        return self.resync("start")

    def have(self) -> Position | None:
        """The position of the copy held, for a snapshot request (None: none)."""
        return (self.epoch, self.seq) if self._holds else None

    def resync(self, reason: str) -> list[Output]:
        self.phase = Phase.SYNCING
        self._buffer.clear()
        self._chunks.clear()
        self.resyncs += 1
        self.request += 1
        return [RequestSnapshot(reason, self.request, self.have())]

    def copy(self) -> StreamCopy | None:
        """The copy held (its store itself, not copied; while syncing again too: the store
        is untouched then), or None before a first snapshot."""
        have = self.have()
        if have is None:
            return None
        return StreamCopy(have[0], have[1], self.store, dict(self.recent))

    def on_delta(self, delta: StateDelta) -> list[Output]:
        if self.phase is Phase.SYNCING:
            self._buffer.append(delta)
            return []
        if delta.epoch < self.epoch:
            return []  # a deposed publisher: fenced
        if delta.epoch > self.epoch:
            return self.resync(f"new epoch {delta.epoch} (had {self.epoch})")
        behind = delta.seq < self.seq or (delta.entries and delta.seq == self.seq)
        if behind and self._caught_up:
            # One SUB connection delivers in publish order and never twice: once it has
            # reached our position, anything behind it within one epoch means the
            # publisher started over. Never drop that silently.
            return self.resync(f"publisher went back to seq {delta.seq} in epoch "
                               f"{delta.epoch} (applied {self.seq})")
        if behind or delta.seq == self.seq:
            # Sent before the snapshot we hold (the SUB socket lags the snapshot one), or a
            # heartbeat at our position.
            if delta.seq == self.seq:
                self._caught_up = True
            return []
        self._caught_up = True
        if not delta.entries:  # heartbeat ahead of us: we lost the last delta(s)
            return self.resync(f"heartbeat at seq {delta.seq}, applied {self.seq}")
        if delta.seq != self.seq + 1:
            return self.resync(f"gap: got seq {delta.seq} after {self.seq}")
        return [self._apply(delta)]

    def expects(self, request: int) -> bool:
        """Whether a chunk answering snapshot request `request` is taken: only the latest
        request's, while syncing. The rest of an answer to an earlier request still arrives
        after a resync (same epoch and seq when nothing was published meanwhile), and its
        `last` chunk must not end the sync with the earlier chunks missing."""
        return self.phase is Phase.SYNCING and request == self.request

    def on_snapshot_chunk(self, chunk: SnapshotChunk, request: int) -> list[Output]:
        """A chunk of the answer to snapshot request `request` (RequestSnapshot.request)."""
        if not self.expects(request):
            return []  # an answer to a request we no longer wait for
        first = self._chunks[0] if self._chunks else chunk
        if (chunk.epoch, chunk.seq, _base(chunk)) != (first.epoch, first.seq, _base(first)):
            return self.resync("snapshot changed position mid-transfer")
        base = _base(chunk)
        if base is not None and base != self.have():
            self._holds = False  # ask for the whole
            return self.resync(f"an incremental snapshot since {base}, not what we hold")
        self._chunks.append(chunk)
        if not chunk.last:
            return []
        self.epoch, self.seq = chunk.epoch, chunk.seq
        out: list[Output]
        if base is None:
            self.store = {e.key: e for c in self._chunks for e in c.entries
                          if e.key.startswith(self.prefix)}
            out = [Changed(list(self.store.values()), reset=True)]
        else:  # the changes since the copy we hold
            out = [self._apply_entries(e for c in self._chunks for e in c.entries)]
        self._chunks.clear()
        self.phase = Phase.SYNCED
        self._holds = True
        self._caught_up = False
        self.recent, self._recent_keys = {}, 0  # the copy jumped: no deltas lead here
        buffered, self._buffer = self._buffer, []
        for delta in buffered:
            if delta.epoch != self.epoch or delta.seq <= self.seq:
                if delta.epoch > self.epoch:
                    return [*out, *self.resync("new epoch while syncing")]
                if delta.epoch == self.epoch and delta.seq == self.seq:
                    self._caught_up = True
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
        changed = self._apply_entries(delta.entries)
        self.seq = delta.seq
        if self.keep_recent:
            keys = frozenset(e.key for e in delta.entries)
            self.recent[delta.seq] = keys
            self._recent_keys += len(keys)
            while self._recent_keys > RECENT_KEYS:
                self._recent_keys -= len(self.recent.pop(next(iter(self.recent))))
        return changed

    def _apply_entries(self, entries: Iterable[StateEntry]) -> Changed:
        changed = []
        for entry in entries:
            if not entry.key.startswith(self.prefix):
                continue
            if entry.deleted:
                self.store.pop(entry.key, None)
            else:
                self.store[entry.key] = entry
            changed.append(entry)
        return Changed(changed)

    def validate(self) -> None:
        """Invariants, checked after every step in tests."""
        assert all(k == e.key and not e.deleted for k, e in self.store.items())
        assert all(k.startswith(self.prefix) for k in self.store)
        if self.phase is Phase.SYNCED:
            assert not self._buffer and not self._chunks
        seqs = list(self.recent)  # consecutive, up to the copy's position
        assert seqs == list(range(self.seq - len(seqs) + 1, self.seq + 1))
        assert self._recent_keys == sum(map(len, self.recent.values())) <= RECENT_KEYS


def _base(chunk: SnapshotChunk) -> Position | None:
    """The position an incremental chunk's changes are since; None for a whole snapshot."""
    return (chunk.base.epoch, chunk.base.seq) if chunk.HasField("base") else None
