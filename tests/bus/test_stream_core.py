"""The state stream's pure core under a lossy, duplicating PUB channel, publisher
failovers (among them successors that start from the copy a standby followed, answering a
subscriber that holds that copy with only what changed) and slow snapshots: once the channel
settles the subscriber's copy equals the publisher's, and its invariants hold after every
step (hypothesis state machine)."""

from __future__ import annotations

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from schemas import state_pb2
from services.bus.stream_core import (
    Changed,
    Phase,
    Position,
    PublisherCore,
    RequestSnapshot,
    SnapshotChunk,
    StateDelta,
    StateEntry,
    StreamCopy,
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
        self.pub = PublisherCore(epoch=self.epoch, max_bytes=1024 + 60)  # tiny: 2 keys a chunk
        self.sub = SubscriberCore(prefix="")
        self.channel: list[StateDelta] = []  # PUB -> SUB, in order, may lose messages
        self.pending_request = 0  # the request the publisher has yet to answer
        self.pending_have: Position | None = None  # the copy that request says it holds
        # A standby's copy of the stream, as of the last time it caught up.
        self.standby = StreamCopy(self.epoch, 0, {})
        # A standby's subscriber: no loss, the keys of its recent deltas logged.
        self.follower = SubscriberCore(keep_recent=True)
        self.follow_snapshot(self.follower.start())
        # Snapshot chunks on their way, with the request each answers: an answer to an
        # earlier request still arrives after the subscriber asked again.
        self.inflight: list[tuple[int, SnapshotChunk]] = []
        self.version = 0
        self.mirror: dict[str, StateEntry] = {}  # what the subscriber's callbacks built
        self.handle(self.sub.start())

    def handle(self, outputs: list[Changed | RequestSnapshot]) -> None:
        for out in outputs:
            if isinstance(out, RequestSnapshot):
                self.pending_request, self.pending_have = out.request, out.have
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
        deltas = self.pub.apply(batch)
        self.channel.extend(deltas)
        for delta in deltas:
            self.follow_snapshot(self.follower.on_delta(delta))

    def follow_snapshot(self, outputs: list[Changed | RequestSnapshot]) -> None:
        """The follower's snapshot requests answered at once."""
        for out in outputs:
            if isinstance(out, RequestSnapshot):
                for chunk in self.pub.snapshot(have=out.have):
                    self.follow_snapshot(self.follower.on_snapshot_chunk(chunk, out.request))
        self.follower.validate()

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
        request, self.pending_request = self.pending_request, 0
        self.inflight.extend((request, chunk)
                             for chunk in self.pub.snapshot(have=self.pending_have))

    @precondition(lambda self: self.inflight)
    @rule()
    def deliver_chunk(self) -> None:
        request, chunk = self.inflight.pop(0)
        self.handle(self.sub.on_snapshot_chunk(chunk, request))

    @rule()
    def publisher_failover(self) -> None:
        """A new leader publishes the same state under a higher epoch, seq from zero."""
        self.epoch += 1
        old = self.pub
        self.pub = PublisherCore(epoch=self.epoch, max_bytes=old.max_bytes + 1024)
        self.pub.apply(list(old.store.values()))

    @rule()
    def standby_catches_up(self) -> None:
        """A standby following the stream holds a copy of the publisher's at its position."""
        # A beat: a follower still at an earlier publisher's epoch asks now.
        self.follow_snapshot(self.follower.on_delta(self.pub.heartbeat()))
        copy = self.follower.copy()
        assert copy is not None and copy.store == self.pub.store
        self.standby = StreamCopy(copy.epoch, copy.seq, dict(copy.store), copy.recent)

    @rule(changes=st.lists(st.tuples(st.sampled_from(KEYS), st.booleans()), max_size=4),
          caught_up=st.booleans())
    def standby_leads(self, changes: list[tuple[str, bool]], caught_up: bool) -> None:
        """The standby leads at a higher epoch with what it followed (the same entries),
        some of it changed (as a new master's re-registrations and records change); it
        starts from that copy, `caught_up` with the old publisher or as of the last time it
        was, perhaps behind what the subscriber got from the old one."""
        if caught_up:
            self.standby_catches_up()
        self.epoch += 1
        state = dict(self.standby.store)
        for key, delete in changes:
            self.version += 1
            if delete:
                state.pop(key, None)
            else:
                state[key] = entry(key, self.version)
        self.pub = self.pub.successor(self.epoch, list(state.values()), base=self.standby)
        assert self.pub.store == state

    @rule()
    def publisher_restart_at_the_same_epoch(self) -> None:
        """The same publisher leads again at its epoch with another state (a reign that was
        not resumed): its successor skips a sequence number, so no subscriber can mistake
        the new deltas for old ones or for a continuation."""
        old = self.pub
        keep = [e for k, e in sorted(old.store.items()) if not k.endswith("0")]
        self.pub = old.successor(old.epoch, keep)

    @rule()
    def silence(self) -> None:
        self.handle(self.sub.on_publisher_silent())

    @invariant()
    def valid(self) -> None:
        self.sub.validate()
        assert self.mirror == self.sub.store  # callbacks alone rebuild the same copy

    @rule()
    def quiet(self) -> None:
        """A quiet spell: the subscriber catches up (as it mostly is when a leader dies)."""
        self.settle()

    def teardown(self) -> None:
        """Settle: no more loss; deliver everything, beat, answer requests. Must converge."""
        self.settle()
        assert self.sub.phase is Phase.SYNCED
        assert (self.sub.epoch, self.sub.seq) == (self.pub.epoch, self.pub.seq)
        assert self.sub.store == self.pub.store
        self.valid()

    def settle(self) -> None:
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


TestStream = StreamMachine.TestCase
TestStream.settings = settings(max_examples=150, stateful_step_count=40, deadline=None)


def test_split_by_size_respects_the_limit_and_order() -> None:
    entries = [entry(f"k/{i}", i) for i in range(100)]
    batches, too_large = split_by_size(entries, 300)
    assert [e.key for b in batches for e in b] == [e.key for e in entries]
    assert all(sum(e.ByteSize() + 8 for e in b) <= 300 for b in batches)
    assert len(batches) > 1 and too_large == []


def big(key: str, size: int) -> StateEntry:
    e = StateEntry(key=key)
    e.value.task.framework_id = "x" * size
    return e


def test_an_entry_near_the_limit_goes_alone_and_one_above_it_is_refused() -> None:
    """Issue 10 (defect 2's tail): one entry near or over the frame limit used to raise
    ValueError out of the publisher (and the master's reactor)."""
    limit = 4000
    near = big("task/near", limit - 8 - 20)
    assert near.ByteSize() + 8 <= limit
    over = big("task/over", limit)
    small = [entry(f"k/{i}", i) for i in range(3)]
    batches, too_large = split_by_size([small[0], near, small[1], over, small[2]], limit)
    assert [[e.key for e in b] for b in batches] == [["k/0"], ["task/near"], ["k/1", "k/2"]]
    assert [e.key for e in too_large] == ["task/over"]


def test_the_publisher_refuses_an_entry_too_large_for_a_frame_and_goes_on() -> None:
    pub = PublisherCore(epoch=1, max_bytes=1024 + 4000)
    pub.apply([entry("task/1", 1)])
    deltas, refused = pub.publish([big("task/1", 10_000), entry("task/2", 2)])
    assert [e.key for e in refused] == ["task/1"]
    assert [e.key for d in deltas for e in d.entries] == ["task/2"]
    assert pub.store["task/1"] == entry("task/1", 1), "the stream keeps what it last carried"
    assert pub.snapshot()[0].entries  # snapshots stay within the limit


def synced(pub: PublisherCore) -> SubscriberCore:
    sub = SubscriberCore()
    sub.start()
    for chunk in pub.snapshot():
        sub.on_snapshot_chunk(chunk, sub.request)
    assert sub.phase is Phase.SYNCED
    return sub


def test_the_rest_of_an_answer_to_an_earlier_request_does_not_end_the_sync() -> None:
    """CI, stop 23: a snapshot whose patience ran out mid-transfer was asked again, and the
    rest of the first answer (same epoch and seq) ended the sync with its first chunks
    missing: the subscriber held a part of the state as if it were all of it, and
    ignored the second answer."""
    pub = PublisherCore(epoch=3, max_bytes=1024 + 60)
    pub.apply([entry(k, 1) for k in KEYS])
    sub = SubscriberCore()
    first_request = sub.start()[0].request
    first = pub.snapshot()
    assert len(first) > 2
    sub.on_snapshot_chunk(first[0], first_request)
    second_request = sub.resync("snapshot timed out")[0].request
    for chunk in first[1:]:  # the rest of the first answer arrives
        assert sub.on_snapshot_chunk(chunk, first_request) == []
    assert sub.phase is Phase.SYNCING
    outs = [o for chunk in pub.snapshot() for o in sub.on_snapshot_chunk(chunk, second_request)]
    assert sub.phase is Phase.SYNCED and sub.store == pub.store
    assert outs == [Changed(list(sub.store.values()), reset=True)]
    sub.validate()


def test_a_publisher_restarted_at_the_same_epoch_makes_subscribers_resync() -> None:
    """Issue 10, defect 4: a master re-leading at its epoch restarted the stream at seq 0,
    and subscribers dropped its deltas as duplicates (or applied a later one as if it
    followed theirs)."""
    old = PublisherCore(epoch=5, max_bytes=4096)
    for i in range(3):
        old.apply([entry(f"agent/{i}", i)])
    sub = synced(old)
    new = old.successor(5, [entry("agent/9", 9)])
    assert new.epoch == 5 and new.seq > old.seq, "the sequence never goes back in one epoch"
    first = new.apply([entry("framework/1", 1)])[0]
    assert isinstance(sub.on_delta(first)[0], RequestSnapshot)
    sub = synced(old)
    assert isinstance(sub.on_delta(new.heartbeat())[0], RequestSnapshot)


def test_a_stream_going_backwards_in_one_epoch_is_resynced_never_dropped() -> None:
    """Belt and braces: whatever restarted a publisher at its epoch from seq 0, a delta or
    heartbeat behind the subscriber's position within one epoch means it restarted."""
    pub = PublisherCore(epoch=5, max_bytes=4096)
    for i in range(3):
        pub.apply([entry(f"agent/{i}", i)])
    restarted = PublisherCore(epoch=5, max_bytes=4096)
    for message in (restarted.heartbeat(), restarted.apply([entry("framework/1", 1)])[0]):
        sub = synced(pub)
        assert sub.on_delta(pub.heartbeat()) == []  # the SUB stream reached the snapshot
        assert isinstance(sub.on_delta(message)[0], RequestSnapshot)


def test_deltas_older_than_the_snapshot_arriving_late_are_skipped_not_resynced() -> None:
    """The snapshot comes on another socket than the deltas: ones published before it may
    arrive after it. They are skipped (the Clone pattern), until the SUB stream catches up."""
    pub = PublisherCore(epoch=5, max_bytes=4096)
    late = [d for i in range(3) for d in pub.apply([entry(f"agent/{i}", i)])]
    sub = synced(pub)
    assert [sub.on_delta(d) for d in late] == [[], [], []]
    assert sub.phase is Phase.SYNCED
    nxt = pub.apply([entry("agent/9", 9)])[0]
    assert sub.on_delta(nxt) == [Changed(list(nxt.entries))]


def test_late_subscriber_converges_from_a_snapshot_then_deltas() -> None:
    pub = PublisherCore(epoch=3, max_bytes=4096)
    pub.apply([entry(k, 1) for k in KEYS])
    sub = SubscriberCore()
    assert sub.start() == [RequestSnapshot("start", 1)]
    early = pub.apply([entry("agent/0", 2)])  # published while the snapshot is in flight
    for d in early:
        assert sub.on_delta(d) == []  # buffered, not applied
    outs = []
    for chunk in pub.snapshot():
        outs += sub.on_snapshot_chunk(chunk, sub.request)
    assert isinstance(outs[0], Changed) and outs[0].reset
    assert sub.store == pub.store and sub.seq == pub.seq


def test_gap_and_lost_tail_trigger_a_resync() -> None:
    pub = PublisherCore(epoch=1, max_bytes=4096)
    sub = SubscriberCore()
    sub.start()
    for chunk in pub.snapshot():
        sub.on_snapshot_chunk(chunk, sub.request)
    d1, = pub.apply([entry("a/1", 1)])
    pub.apply([entry("a/2", 2)])  # lost on the wire
    d3, = pub.apply([entry("a/3", 3)])
    sub.on_delta(d1)
    assert isinstance(sub.on_delta(d3)[0], RequestSnapshot)
    # After a resync, losing the *last* delta is noticed from the idle heartbeat.
    for chunk in pub.snapshot():
        sub.on_snapshot_chunk(chunk, sub.request)
    pub.apply([entry("a/4", 4)])  # lost
    assert isinstance(sub.on_delta(pub.heartbeat())[0], RequestSnapshot)


def test_a_deposed_publisher_is_ignored() -> None:
    new = PublisherCore(epoch=5, max_bytes=4096)
    old = PublisherCore(epoch=4, max_bytes=4096)
    sub = SubscriberCore()
    sub.start()
    for chunk in new.snapshot():
        sub.on_snapshot_chunk(chunk, sub.request)
    assert sub.on_delta(old.apply([entry("a/1", 1)])[0]) == []
    assert "a/1" not in sub.store


def test_an_encoded_delta_is_the_delta_message_serialised() -> None:
    """publish_encoded writes each delta's bytes itself (entries serialised once, not copied
    into a StateDelta): they parse to the StateDelta the entries make, batched by the same
    size rule, with the sequence numbers publish gives, and the store the same."""
    entries = [entry(f"task/{i}", i) for i in range(40)] + [entry("task/3", 0, deleted=True)]
    entries.append(big("task/big", 500))
    by_message, by_bytes = (PublisherCore(epoch=3, max_bytes=1024 + 400, seq=7)
                            for _ in range(2))
    batches, _ = split_by_size(entries, by_message.max_bytes)
    encoded, too_large = by_bytes.publish_encoded(entries)
    assert len(batches) > 2, "several frames' worth"
    assert [e.key for e in too_large] == ["task/big"]
    assert [(d.epoch, d.seq, d.count) for d in encoded] == [
        (3, 8 + i, len(b)) for i, b in enumerate(batches)]
    for delta, batch in zip(encoded, batches, strict=True):
        assert StateDelta.FromString(delta.payload) == StateDelta(
            epoch=delta.epoch, seq=delta.seq, entries=batch)
    by_message.publish(entries)
    assert by_bytes.store == by_message.store and "task/3" not in by_bytes.store
    assert by_bytes.seq == by_message.seq == 7 + len(batches)


def test_a_successor_holds_what_applying_its_entries_would() -> None:
    """successor stores the new reign's state without making deltas: the same store and
    sequence as applying them (an entry too large for a frame left out)."""
    entries = [entry(f"agent/{i}", i) for i in range(30)] + [big("task/big", 500)]
    made = PublisherCore(epoch=1, max_bytes=1024 + 400).successor(2, entries)
    applied = PublisherCore(epoch=2, max_bytes=1024 + 400)
    applied.apply(entries)
    assert (made.epoch, made.seq, made.store) == (2, applied.seq, applied.store)
    assert "task/big" not in made.store and applied.seq > 1


def test_a_snapshot_is_split_as_the_store_measures() -> None:
    """Snapshots split by the sizes kept when entries were stored: the chunks are those the
    stored entries, measured again in key order, make (keys rewritten at other sizes and
    deleted ones included), for a prefix too."""
    pub = PublisherCore(epoch=1, max_bytes=1024 + 400).successor(
        2, [big(f"agent/{i}", 10 * i) for i in range(8)])
    pub.publish([big(f"task/{i}", 7 * i) for i in range(20)])
    pub.publish([big("task/3", 250), entry("task/4", 0, deleted=True), big("agent/2", 1)])
    for prefix in ("", "task/", "agent/", "none/"):
        expected = split_by_size([e for k, e in sorted(pub.store.items())
                                  if k.startswith(prefix)], pub.max_bytes)[0] or [[]]
        chunks = pub.snapshot(prefix)
        assert [list(c.entries) for c in chunks] == expected
        # On the wire, each chunk's entries are the stored entries' own bytes.
        base, tails = pub.snapshot_tails(prefix)
        assert base is None  # no successor's base: the whole store
        assert [list(SnapshotChunk.FromString(t).entries) for _, t in tails] == expected
        assert [n for n, _ in tails] == [len(b) for b in expected]
        assert [c.last for c in chunks] == [False] * (len(chunks) - 1) + [True]
    assert len(pub.snapshot()) > 2


def synced_subscriber(pub: PublisherCore) -> SubscriberCore:
    sub = SubscriberCore()
    [request] = sub.start()
    assert isinstance(request, RequestSnapshot) and request.have is None
    for chunk in pub.snapshot():
        sub.on_snapshot_chunk(chunk, request.request)
    assert sub.phase is Phase.SYNCED and sub.store == pub.store
    return sub


def test_a_subscriber_holding_the_copy_a_successor_started_from_gets_only_what_changed() -> None:
    """A new leader whose standby followed the old stream starts from that copy; a
    subscriber that holds the same copy is answered with the changes since (a changed key,
    a deleted one, a new one, and what was published after), not the whole store."""
    old = PublisherCore(epoch=1, max_bytes=1 << 20)
    old.apply([entry(f"task/{i}", 1) for i in range(100)])
    sub = synced_subscriber(old)
    standby = StreamCopy(old.epoch, old.seq, dict(old.store))
    state = dict(standby.store)  # the very entries, as a new master's held records are
    state["task/1"] = entry("task/1", 2)
    del state["task/2"]
    state["agent/new"] = entry("agent/new", 1)
    new = old.successor(2, list(state.values()), base=standby)
    new.apply([entry("task/3", 3)])
    [request] = sub.on_delta(new.heartbeat())  # a new epoch: it asks, saying what it holds
    assert isinstance(request, RequestSnapshot) and request.have == (1, old.seq)
    chunks = new.snapshot(have=request.have)
    assert [(c.base.epoch, c.base.seq) for c in chunks] == [(1, old.seq)]
    assert sorted(e.key for e in chunks[0].entries) == [
        "agent/new", "task/1", "task/2", "task/3"]
    out = [o for c in chunks for o in sub.on_snapshot_chunk(c, request.request)]
    assert [o.reset for o in out if isinstance(o, Changed)] == [False]
    assert sub.store == new.store and (sub.epoch, sub.seq) == (new.epoch, new.seq)
    sub.validate()


def test_a_subscriber_at_another_position_than_the_successors_base_gets_the_whole() -> None:
    old = PublisherCore(epoch=1, max_bytes=1 << 20)
    old.apply([entry(f"task/{i}", 1) for i in range(10)])
    standby = StreamCopy(old.epoch, old.seq, dict(old.store))
    old.apply([entry("task/0", 2)])  # the subscriber got one delta the standby did not
    sub = synced_subscriber(old)
    new = old.successor(2, list(standby.store.values()), base=standby)
    [request] = sub.on_delta(new.heartbeat())
    assert isinstance(request, RequestSnapshot) and request.have == (1, old.seq)
    chunks = new.snapshot(have=request.have)
    assert not chunks[0].HasField("base") and len(chunks[0].entries) == 10
    out = [o for c in chunks for o in sub.on_snapshot_chunk(c, request.request)]
    assert [o.reset for o in out if isinstance(o, Changed)] == [True]
    assert sub.store == new.store


def test_a_successor_keeps_its_changes_since_its_base_only_while_they_are_few() -> None:
    """The keys changed since the base are bounded (twice the store, at least
    MIN_SINCE_BASE): past that, snapshots are whole again."""
    from services.bus.stream_core import MIN_SINCE_BASE
    old = PublisherCore(epoch=1, max_bytes=1 << 20)
    old.apply([entry("task/0", 1)])
    standby = StreamCopy(old.epoch, old.seq, dict(old.store))
    new = old.successor(2, [entry("task/0", 1)], base=standby)
    assert new.base == (1, old.seq)
    for i in range(0, MIN_SINCE_BASE + 10, 1000):  # tasks come and go
        new.apply([entry(f"task/x{j}", 1) for j in range(i, i + 1000)])
        new.apply([entry(f"task/x{j}", 1, deleted=True) for j in range(i, i + 1000)])
    assert new.base is None
    assert not new.snapshot(have=(1, old.seq))[0].HasField("base")


def test_a_successor_from_a_base_serves_whole_snapshots_of_its_store_too() -> None:
    """The entries a successor took from its base as they were are stored without their
    bytes until a whole snapshot needs them; a fresh entry too large for a frame is left
    out (its key, there before, is a deletion since the base)."""
    old = PublisherCore(epoch=1, max_bytes=1024 + 400)
    old.apply([big(f"task/{i}", 100) for i in range(30)])  # about 9 a chunk
    standby = StreamCopy(old.epoch, old.seq, dict(old.store))
    state = {**standby.store, "task/7": big("task/7", 2000), "task/new": entry("task/new", 2)}
    new = old.successor(2, list(state.values()), base=standby)
    assert "task/7" not in new.store and len(new.store) == 30
    fresh = synced_subscriber(new)  # holds nothing: the whole store, split under the limit
    assert fresh.store == new.store
    assert len(new.snapshot()) > 2
    [chunk] = new.snapshot(have=(1, old.seq))
    assert sorted((e.key, e.deleted) for e in chunk.entries) == [
        ("task/7", True), ("task/new", False)]


def test_a_subscriber_a_few_deltas_behind_the_followed_copy_is_answered_incrementally() -> None:
    """The standby logged the keys of the deltas it applied: a subscriber that missed the
    last of them (it was busy when the old leader died) gets those keys too, not the whole;
    one further behind than the log reaches gets the whole."""
    old = PublisherCore(epoch=1, max_bytes=1 << 20)
    far_behind = synced_subscriber(old)  # at seq 0: before what the follower's log covers
    old.apply([entry(f"task/{i}", 1) for i in range(50)])
    behind = synced_subscriber(old)
    follower = SubscriberCore(keep_recent=True)
    [request] = follower.start()
    assert isinstance(request, RequestSnapshot)
    for chunk in old.snapshot():
        follower.on_snapshot_chunk(chunk, request.request)
    for version in (2, 3):
        for delta in old.apply([entry("task/1", version), entry("task/2", 0, deleted=True)]):
            follower.on_delta(delta)
            if version == 2:
                behind.on_delta(delta)
    follower.validate()
    standby = follower.copy()
    assert standby is not None and sorted(standby.recent) == [old.seq - 1, old.seq]
    new = old.successor(2, [e for k, e in standby.store.items() if k != "task/3"], base=standby)
    [request] = behind.on_delta(new.heartbeat())
    assert isinstance(request, RequestSnapshot) and request.have == (1, old.seq - 1)
    chunks = new.snapshot(have=request.have)
    assert sorted(e.key for e in chunks[0].entries) == ["task/1", "task/2", "task/3"]
    for chunk in chunks:
        behind.on_snapshot_chunk(chunk, request.request)
    assert behind.store == new.store
    [request] = far_behind.on_delta(new.heartbeat())
    assert isinstance(request, RequestSnapshot) and request.have == (1, 0)
    assert not new.snapshot(have=request.have)[0].HasField("base")
