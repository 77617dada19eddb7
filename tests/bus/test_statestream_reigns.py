"""The state stream across a leader's reigns, on real sockets (issue 10, defects 4 and 5): a
paused publisher says nothing and serves no snapshot, and on resume its subscribers go on
from where they were (no resync); one that leads afresh at its own epoch makes them resync
and converge (its deltas were once dropped as duplicates); a subscriber with a fence takes
deltas only from the elected publisher."""

from __future__ import annotations

import itertools
from collections.abc import Iterator

import pytest
import zmq

from services.bus import codec
from services.bus.election import LeaderInfo
from services.bus.epoch import EpochFence
from services.bus.peer import Sender
from services.bus.reactor import Reactor
from services.bus.statestream import StatePublisher, StateSubscriber
from services.bus.stream_core import StateEntry

MASTER = codec.Role.Value("ROLE_MASTER")
ALLOCATOR = codec.Role.Value("ROLE_ALLOCATOR")


def entry(key: str, version: int) -> StateEntry:
    e = StateEntry(key=key)
    e.value.task.framework_id = f"v{version}"
    return e


@pytest.fixture
def ctx() -> Iterator[zmq.Context[zmq.Socket[bytes]]]:
    context: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
    yield context
    context.destroy(linger=0)


def pair(ctx: zmq.Context[zmq.Socket[bytes]], fence: EpochFence | None = None,
         ) -> tuple[Reactor, StatePublisher, StateSubscriber]:
    reactor = Reactor()
    pub = StatePublisher(reactor, ctx, Sender("m1", MASTER, epoch=5),
                         pub_bind="tcp://127.0.0.1:*", snapshot_bind="tcp://127.0.0.1:*",
                         epoch=0, heartbeat_interval=0.1)
    pub.restart(5, [entry("agent/1", 1)])
    sub = StateSubscriber(reactor, ctx, Sender("a1", ALLOCATOR), lambda c: None,
                          heartbeat_interval=0.1, max_missed=5, snapshot_timeout=0.5,
                          fence=fence)
    sub.connect(pub.pub_endpoint, pub.snapshot_endpoint)
    return reactor, pub, sub


def test_a_resumed_reign_goes_on_without_a_resync(ctx: zmq.Context[zmq.Socket[bytes]]) -> None:
    reactor, pub, sub = pair(ctx)
    try:
        assert reactor.run(until=lambda: sub.synced and "agent/1" in sub.store, timeout=5)
        resyncs = sub.stats.get("state_resyncs")
        pub.pause()
        last_sent = pub._last_sent
        reactor.run(timeout=0.3)  # a short blip: less than the subscriber's patience
        assert pub._last_sent == last_sent, "a paused publisher sent something"
        pub.resume()
        pub.publish([entry("framework/1", 1)])
        assert reactor.run(until=lambda: "framework/1" in sub.store, timeout=5)
        assert sub.stats.get("state_resyncs") == resyncs
        assert (sub.core.epoch, sub.core.seq) == (5, pub.core.seq)
    finally:
        sub.close()
        pub.close()


def test_leading_afresh_at_the_same_epoch_makes_subscribers_resync(
    ctx: zmq.Context[zmq.Socket[bytes]]
) -> None:
    reactor, pub, sub = pair(ctx)
    try:
        pub.publish([entry(f"agent/{i}", i) for i in range(2, 6)])
        assert reactor.run(until=lambda: sub.synced and len(sub.store) == 5, timeout=5)
        resyncs = sub.stats.get("state_resyncs")
        pub.restart(5, [entry("agent/9", 9)])  # a new state at the same epoch
        pub.publish([entry("framework/1", 1)])
        assert reactor.run(until=lambda: sub.store == pub.store, timeout=5), sorted(sub.store)
        assert sub.stats.get("state_resyncs") > resyncs
    finally:
        sub.close()
        pub.close()


def test_a_fenced_subscriber_takes_only_the_elected_publishers_stream(
    ctx: zmq.Context[zmq.Socket[bytes]]
) -> None:
    fence = EpochFence(frozenset({MASTER}))
    fence.follow(MASTER, LeaderInfo("master", "m1", 4, {}))  # the detector lags: epoch 4
    reactor, pub, sub = pair(ctx, fence)
    try:
        assert not reactor.run(until=lambda: sub.synced, timeout=0.5)
        assert sub.stats.get("frames_dropped{reason=newer_epoch}") > 0
        fence.follow(MASTER, LeaderInfo("master", "m1", 5, {}))
        assert reactor.run(until=lambda: sub.synced and "agent/1" in sub.store, timeout=5)
    finally:
        sub.close()
        pub.close()


def test_a_publisher_too_busy_to_answer_is_asked_ever_less_often(
    ctx: zmq.Context[zmq.Socket[bytes]]
) -> None:
    """A master busy for seconds (a snapshot of 100,000 entries, a registration storm) got a
    new snapshot request every snapshot timeout from each subscriber, each one more
    snapshot to build: the subscriber backs off, doubling its patience after each timeout."""
    reactor = Reactor()
    silent = ctx.socket(zmq.ROUTER)  # a snapshot endpoint that never answers
    silent.bind("tcp://127.0.0.1:*")
    pub = ctx.socket(zmq.PUB)
    pub.bind("tcp://127.0.0.1:*")
    requests: list[float] = []

    def on_request() -> None:
        while True:
            try:
                frames = silent.recv_multipart(flags=zmq.NOBLOCK)
            except zmq.Again:
                return
            env = codec.decode(frames[-1])
            if env.WhichOneof("payload") == "snapshot_request":
                requests.append(reactor.now())

    reactor.add_reader(silent, on_request)
    sub = StateSubscriber(reactor, ctx, Sender("a1", ALLOCATOR), lambda c: None,
                          heartbeat_interval=0.1, max_missed=100, snapshot_timeout=0.4)
    try:
        sub.connect(pub.getsockopt_string(zmq.LAST_ENDPOINT),
                    silent.getsockopt_string(zmq.LAST_ENDPOINT))
        start = reactor.now()
        reactor.run(until=lambda: reactor.now() - start > 3.1, timeout=10)
        gaps = [round(b - a, 1) for a, b in itertools.pairwise(requests)]
        # Fixed patience: a request every 0.4 s (8 in 3.1 s); doubling: 0, 0.4, 1.2, 2.8.
        assert len(requests) <= 4, gaps
        assert all(b > a * 1.5 for a, b in itertools.pairwise(gaps)), gaps
    finally:
        sub.close()
        reactor.remove_reader(silent)
        silent.close(linger=0)
        pub.close(linger=0)


def test_a_published_delta_is_a_stamped_envelope(ctx: zmq.Context[zmq.Socket[bytes]]) -> None:
    """The publisher writes a delta's frame from its bytes (the stamped envelope, then the
    delta): it decodes as any envelope does, stamped, with the delta's entries."""
    reactor, pub, sub = pair(ctx)
    raw = ctx.socket(zmq.SUB)
    try:
        raw.setsockopt(zmq.SUBSCRIBE, b"")
        raw.connect(pub.pub_endpoint)
        assert reactor.run(until=lambda: sub.synced, timeout=5)
        got: list[codec.Envelope] = []

        def deltas() -> bool:
            pub.publish([entry("agent/2", 2), entry("agent/3", 3)])
            while raw.poll(0):
                env = codec.decode(raw.recv())
                if env.state_delta.entries:
                    got.append(env)
            return bool(got)
        assert reactor.run(until=deltas, timeout=5)
        env = got[0]
        assert (env.sender_id, env.epoch, env.sender_role) == ("m1", 5, MASTER)
        assert env.message_id and env.WhichOneof("payload") == "state_delta"
        assert env.state_delta.epoch == 5 and env.state_delta.seq > 0
        assert list(env.state_delta.entries) == [entry("agent/2", 2), entry("agent/3", 3)]
    finally:
        raw.close(linger=0)
        pub.close()
        sub.close()
