"""The state stream's pure core under a lossy, duplicating PUB channel, publisher
failovers and slow snapshots: once the channel settles the subscriber's copy equals the
publisher's, and its invariants hold after every step (hypothesis state machine)."""

from __future__ import annotations

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from schemas import state_pb2
from services.bus.stream_core import (
    Changed,
    Phase,
    PublisherCore,
    RequestSnapshot,
    SnapshotChunk,
    StateDelta,
    StateEntry,
    SubscriberCore,
    split_by_size,
)

KEYS = [f"{kind}/{i}" for kind in ("agent", "task") for i in range(6)]


def entry(key: str, version: int, deleted: bool = False) -> StateEntry:
    e = StateEntry(key=key, deleted=deleted)
    if not deleted:
        e.value.CopyFrom(state_pb2.StateValue(task=state_pb2.TaskRecord(framework_id=f"v{version}")))
    return e


class StreamMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.epoch = 1
        self.pub = PublisherCore(epoch=self.epoch, max_bytes=1024 + 200)  # tiny: forces chunks
        self.sub = SubscriberCore(prefix="")
        self.channel: list[StateDelta] = []  # PUB -> SUB, in order, may lose messages
        self.pending_request = False
        self.inflight: list[SnapshotChunk] = []  # snapshot chunks on their way
        self.version = 0
        self.mirror: dict[str, StateEntry] = {}  # what the subscriber's callbacks built
        self.handle(self.sub.start())

    def handle(self, outputs: list[Changed | RequestSnapshot]) -> None:
        for out in outputs:
            if isinstance(out, RequestSnapshot):
                self.pending_request = True
                self.inflight.clear()  # a fresh request supersedes an answer in transit
            else:
                if out.reset:
                    self.mirror = {}
                for e in out.entries:
                    if e.deleted:
                        self.mirror.pop(e.key, None)
                    else:
                        self.mirror[e.key] = e

    @rule(changes=st.lists(st.tuples(st.sampled_from(KEYS), st.booleans()), min_size=1,
                           max_size=8))
    def publish(self, changes: list[tuple[str, bool]]) -> None:
        batch = []
        for key, delete in changes:
            self.version += 1
            batch.append(entry(key, self.version, deleted=delete))
        self.channel.extend(self.pub.apply(batch))

    @precondition(lambda self: self.channel)
    @rule()
    def deliver(self) -> None:
        self.handle(self.sub.on_delta(self.channel.pop(0)))

    @precondition(lambda self: self.channel)
    @rule()
    def lose(self) -> None:
        self.channel.pop(0)

    @precondition(lambda self: self.channel)
    @rule()
    def duplicate(self) -> None:
        self.channel.insert(0, self.channel[0])

    @rule()
    def heartbeat(self) -> None:
        self.channel.append(self.pub.heartbeat())

    @precondition(lambda self: self.pending_request)
    @rule()
    def answer_snapshot(self) -> None:
        self.pending_request = False
        self.inflight = self.pub.snapshot()

    @precondition(lambda self: self.inflight)
    @rule()
    def deliver_chunk(self) -> None:
        self.handle(self.sub.on_snapshot_chunk(self.inflight.pop(0)))

    @rule()
    def publisher_failover(self) -> None:
        """A new leader publishes the same state under a higher epoch, seq from zero."""
        self.epoch += 1
        old = self.pub
        self.pub = PublisherCore(epoch=self.epoch, max_bytes=old.max_bytes + 1024)
        self.pub.apply(list(old.store.values()))

    @rule()
    def silence(self) -> None:
        self.handle(self.sub.on_publisher_silent())

    @invariant()
    def valid(self) -> None:
        self.sub.validate()
        assert self.mirror == self.sub.store  # callbacks alone rebuild the same copy

    def teardown(self) -> None:
        """Settle: no more loss; deliver everything, beat, answer requests. Must converge."""
        for _ in range(20):
            while self.channel:
                self.deliver()
            while self.inflight:
                self.deliver_chunk()
            if self.pending_request:
                self.answer_snapshot()
                continue
            self.heartbeat()
            self.deliver()
            if self.sub.phase is Phase.SYNCED and not self.pending_request:
                break
        assert self.sub.phase is Phase.SYNCED
        assert (self.sub.epoch, self.sub.seq) == (self.pub.epoch, self.pub.seq)
        assert self.sub.store == self.pub.store
        self.valid()


TestStream = StreamMachine.TestCase
TestStream.settings = settings(max_examples=150, stateful_step_count=40, deadline=None)


def test_split_by_size_respects_the_limit_and_order() -> None:
    entries = [entry(f"k/{i}", i) for i in range(100)]
    batches = split_by_size(entries, 300)
    assert [e.key for b in batches for e in b] == [e.key for e in entries]
    assert all(sum(e.ByteSize() + 8 for e in b) <= 300 for b in batches)
    assert len(batches) > 1


def test_late_subscriber_converges_from_a_snapshot_then_deltas() -> None:
    pub = PublisherCore(epoch=3, max_bytes=4096)
    pub.apply([entry(k, 1) for k in KEYS])
    sub = SubscriberCore()
    assert sub.start() == [RequestSnapshot("start")]
    early = pub.apply([entry("agent/0", 2)])  # published while the snapshot is in flight
    for d in early:
        assert sub.on_delta(d) == []  # buffered, not applied
    outs = []
    for chunk in pub.snapshot():
        outs += sub.on_snapshot_chunk(chunk)
    assert isinstance(outs[0], Changed) and outs[0].reset
    assert sub.store == pub.store and sub.seq == pub.seq


def test_gap_and_lost_tail_trigger_a_resync() -> None:
    pub = PublisherCore(epoch=1, max_bytes=4096)
    sub = SubscriberCore()
    sub.start()
    for chunk in pub.snapshot():
        sub.on_snapshot_chunk(chunk)
    d1, = pub.apply([entry("a/1", 1)])
    pub.apply([entry("a/2", 2)])  # lost on the wire
    d3, = pub.apply([entry("a/3", 3)])
    sub.on_delta(d1)
    assert isinstance(sub.on_delta(d3)[0], RequestSnapshot)
    # After a resync, losing the *last* delta is noticed from the idle heartbeat.
    for chunk in pub.snapshot():
        sub.on_snapshot_chunk(chunk)
    pub.apply([entry("a/4", 4)])  # lost
    assert isinstance(sub.on_delta(pub.heartbeat())[0], RequestSnapshot)


def test_a_deposed_publisher_is_ignored() -> None:
    new = PublisherCore(epoch=5, max_bytes=4096)
    old = PublisherCore(epoch=4, max_bytes=4096)
    sub = SubscriberCore()
    sub.start()
    for chunk in new.snapshot():
        sub.on_snapshot_chunk(chunk)
    assert sub.on_delta(old.apply([entry("a/1", 1)])[0]) == []
    assert "a/1" not in sub.store
