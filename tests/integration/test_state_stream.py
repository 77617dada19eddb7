"""The state stream on real sockets (Guide "Clone"): a late subscriber converges; a delta
dropped on the wire (by a lossy forwarder) is noticed and healed by a re-snapshot, even
when it was the last one (idle heartbeats); a subscriber follows a new publisher epoch."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator

import pytest
import zmq

from services.bus import codec
from services.bus.peer import Sender
from services.bus.reactor import Reactor
from services.bus.statestream import StatePublisher, StateSubscriber
from services.bus.stream_core import Changed, StateEntry

MASTER = codec.Role.Value("ROLE_MASTER")
ALLOCATOR = codec.Role.Value("ROLE_ALLOCATOR")


def entry(key: str, version: int, deleted: bool = False) -> StateEntry:
    e = StateEntry(key=key, deleted=deleted)
    if not deleted:
        e.value.task.framework_id = f"v{version}"
    return e


@pytest.fixture
def ctx() -> Iterator[zmq.Context[zmq.Socket[bytes]]]:
    context: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
    yield context
    context.destroy(linger=0)


def publisher(reactor: Reactor, ctx: zmq.Context[zmq.Socket[bytes]], epoch: int,
              frame_limit: int = codec.DEFAULT_FRAME_LIMIT) -> StatePublisher:
    return StatePublisher(reactor, ctx, Sender("master", MASTER, epoch=epoch),
                          pub_bind="tcp://127.0.0.1:*", snapshot_bind="tcp://127.0.0.1:*",
                          epoch=epoch, heartbeat_interval=0.1, frame_limit=frame_limit)


def subscriber(reactor: Reactor, ctx: zmq.Context[zmq.Socket[bytes]],
               changes: list[Changed] | None = None) -> StateSubscriber:
    sink = changes if changes is not None else []
    return StateSubscriber(reactor, ctx, Sender("allocator", ALLOCATOR), sink.append,
                           heartbeat_interval=0.1, max_missed=5, snapshot_timeout=1.0)


def test_late_subscriber_converges_on_a_large_chunked_state(
    ctx: zmq.Context[zmq.Socket[bytes]],
) -> None:
    reactor = Reactor()
    pub = publisher(reactor, ctx, epoch=4, frame_limit=64 * 1024)  # many snapshot chunks
    pub.publish(entry(f"task/{i}", i) for i in range(5000))
    pub.publish([entry("task/7", 0, deleted=True)])
    changes: list[Changed] = []
    sub = subscriber(reactor, ctx, changes)
    sub.connect(pub.pub_endpoint, pub.snapshot_endpoint)
    assert reactor.run(until=lambda: sub.synced, timeout=10)
    assert changes[0].reset and len(sub.store) == 4999
    pub.publish([entry("task/1", 99), entry("agent/a", 1)])
    assert reactor.run(until=lambda: sub.store == pub.store, timeout=5)
    assert sub.core.seq == pub.core.seq and sub.stats.get("state_resyncs") == 1
    # Served whole, its chunks as the store encoded them, with nothing raised in serving.
    assert pub.stats.get("snapshots_served{kind=whole}") == 1 and reactor.handler_errors == 0
    sub.close()
    pub.close()


class LossyForwarder:
    """SUB from the publisher, PUB to subscribers, dropping the deltas it is told to."""

    def __init__(self, ctx: zmq.Context[zmq.Socket[bytes]], upstream: str) -> None:
        self.drop_seqs: set[int] = set()
        self.dropped: list[int] = []
        self.front = ctx.socket(zmq.SUB)
        self.front.setsockopt(zmq.SUBSCRIBE, b"")
        self.front.connect(upstream)
        self.back = ctx.socket(zmq.PUB)
        self.back.bind("tcp://127.0.0.1:*")
        self.endpoint = self.back.getsockopt_string(zmq.LAST_ENDPOINT)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            if not self.front.poll(20):
                continue
            frame = self.front.recv()
            delta = codec.Envelope.FromString(frame).state_delta
            if delta.entries and delta.seq in self.drop_seqs:
                self.dropped.append(delta.seq)
                continue
            self.back.send(frame)

    def close(self) -> None:
        self._stop.set()
        self._thread.join()
        self.front.close(linger=0)
        self.back.close(linger=0)


class SlowLink:
    """A relay in front of a snapshot endpoint, for one client: each answer is held
    `delay` seconds before it is passed on (a slow or congested link, as chaos/proxy.py
    makes between hosts); requests pass at once."""

    def __init__(self, ctx: zmq.Context[zmq.Socket[bytes]], upstream: str, delay: float) -> None:
        self.delay = delay
        self.front = ctx.socket(zmq.ROUTER)
        self.front.bind("tcp://127.0.0.1:*")
        self.endpoint = self.front.getsockopt_string(zmq.LAST_ENDPOINT)
        self.back = ctx.socket(zmq.DEALER)
        self.back.connect(upstream)
        self.chunks = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        poller = zmq.Poller()
        poller.register(self.front, zmq.POLLIN)
        poller.register(self.back, zmq.POLLIN)
        client = b""
        while not self._stop.is_set():
            ready = dict(poller.poll(20))
            if self.front in ready:
                client, *payload = self.front.recv_multipart()
                self.back.send_multipart(payload)
            if self.back in ready:
                payload = self.back.recv_multipart()
                if codec.Envelope.FromString(payload[-1]).HasField("snapshot_chunk"):
                    self.chunks += 1
                    if self._stop.wait(self.delay):  # the link's latency, not a wait on state
                        return
                self.front.send_multipart([client, *payload])

    def close(self) -> None:
        self._stop.set()
        self._thread.join()
        self.front.close(linger=0)
        self.back.close(linger=0)


def test_a_snapshot_slower_than_the_patience_but_progressing_is_not_asked_again(
    ctx: zmq.Context[zmq.Socket[bytes]],
) -> None:
    """CI, stop 23: a large snapshot taking longer than the snapshot timeout in all, each
    chunk in time, was asked again from the start, again and again with doubled patience
    (3 requests on a loaded machine); and the rest of the first answer ended the sync of
    the second with its first chunks missing. Patience counts from the last chunk."""
    reactor = Reactor()
    pub = publisher(reactor, ctx, epoch=4, frame_limit=4 * 1024)
    pub.publish(entry(f"task/{i}", i) for i in range(3000))
    link = SlowLink(ctx, pub.snapshot_endpoint, delay=0.1)
    # Patience 1 s for chunks 0.1 s apart, and 2 s of silence before the publisher counts as
    # gone: a loaded machine's stall of half a second is no reason to ask again (CI asked
    # twice once, with 0.5 s of each).
    sub = StateSubscriber(reactor, ctx, Sender("allocator", ALLOCATOR), lambda c: None,
                          heartbeat_interval=0.1, max_missed=20, snapshot_timeout=1.0)
    sub.connect(pub.pub_endpoint, link.endpoint)
    assert reactor.run(until=lambda: sub.synced, timeout=30)
    assert link.chunks * link.delay > 2 * sub.snapshot_timeout, "slower than the patience"
    assert sub.store == pub.store
    assert sub.stats.get("state_resyncs") == 1 and sub.stats.get("snapshots_late") == 0
    sub.close()
    link.close()
    pub.close()


def test_a_snapshot_asked_while_the_publisher_was_away_is_asked_again_once_it_is_back(
    ctx: zmq.Context[zmq.Socket[bytes]],
) -> None:
    """Seen in CI (tests/integration/test_allocator_broker.py, under load): a publisher too
    busy to answer made its subscriber resync ("publisher silent") in the very turn its
    snapshot link gave up and dropped its socket; the request was lost with the socket, and
    the subscriber waited its whole snapshot timeout before asking again. It asks again
    as soon as the snapshot server is reachable."""
    home, away = Reactor(), Reactor()  # the subscriber's, and the publisher's (not run)
    pub = publisher(away, ctx, epoch=3)
    pub.publish([entry("agent/a", 1)])
    sub = StateSubscriber(home, ctx, Sender("allocator", ALLOCATOR), lambda c: None,
                          heartbeat_interval=0.1, max_missed=5, snapshot_timeout=5.0)
    sub.connect(pub.pub_endpoint, pub.snapshot_endpoint)

    def both(until: Callable[[], bool], timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        while not until() and time.monotonic() < deadline:
            home.run_once(0.005)
            away.run_once(0.005)
        return until()

    assert both(lambda: sub.synced, 5)
    asked = sub.stats.get("state_resyncs")
    # The publisher stops (its process stalls): beats, deltas and snapshots all stop.
    assert home.run(until=lambda: sub.stats.get("peers_lost") > 0
                    and sub.stats.get("state_resyncs") > asked, timeout=5)
    assert not sub.synced
    back = time.monotonic()
    assert both(lambda: sub.synced, 4), "not synced within 4 s of the publisher's return"
    took = time.monotonic() - back
    assert took < 1.0, f"synced {took:.2f} s after the publisher came back (timeout 5 s)"
    assert sub.store == pub.store
    sub.close()
    pub.close()


def test_dropped_deltas_are_healed_by_a_resnapshot(ctx: zmq.Context[zmq.Socket[bytes]]) -> None:
    reactor = Reactor()
    pub = publisher(reactor, ctx, epoch=1)
    proxy = LossyForwarder(ctx, pub.pub_endpoint)
    sub = subscriber(reactor, ctx)
    sub.connect(proxy.endpoint, pub.snapshot_endpoint)
    assert reactor.run(until=lambda: sub.synced, timeout=5)
    # The SUB->proxy->SUB path needs a moment to subscribe: publish until a delta arrives.
    assert reactor.run(until=lambda: (pub.publish([entry("warm/up", pub.core.seq)]) or
                                      "warm/up" in sub.store), timeout=5)
    resyncs = sub.stats.get("state_resyncs")

    # A gap in the middle: seq n+2 of n+1..n+3 never arrives.
    n = pub.core.seq
    proxy.drop_seqs = {n + 2}
    for i in range(3):
        pub.publish([entry(f"mid/{i}", i)])
    assert reactor.run(until=lambda: sub.store == pub.store, timeout=5)
    assert proxy.dropped == [n + 2] and sub.stats.get("state_resyncs") == resyncs + 1

    # The *last* delta is lost and nothing follows: only the idle heartbeat reveals it.
    proxy.drop_seqs = {pub.core.seq + 1}
    pub.publish([entry("tail/0", 0)])
    assert reactor.run(until=lambda: sub.store == pub.store, timeout=5)
    assert proxy.dropped == [n + 2, pub.core.seq]
    assert sub.stats.get("state_resyncs") == resyncs + 2
    sub.close()
    proxy.close()
    pub.close()


def test_subscriber_follows_a_new_publisher_epoch(ctx: zmq.Context[zmq.Socket[bytes]]) -> None:
    reactor = Reactor()
    old = publisher(reactor, ctx, epoch=10)
    old.publish(entry(f"agent/{i}", i) for i in range(10))
    sub = subscriber(reactor, ctx)
    sub.connect(old.pub_endpoint, old.snapshot_endpoint)
    assert reactor.run(until=lambda: sub.synced and len(sub.store) == 10, timeout=5)
    # Failover: the new leader rebuilt a different state; subscribers are pointed at it.
    new = publisher(reactor, ctx, epoch=11)
    new.publish(entry(f"agent/{i}", 100 + i) for i in range(5))
    sub.connect(new.pub_endpoint, new.snapshot_endpoint)
    assert reactor.run(until=lambda: sub.synced and sub.store == new.store, timeout=5)
    assert sub.core.epoch == 11
    old.publish([entry("agent/zombie", 1)])  # the deposed leader keeps talking: ignored
    new.publish([entry("agent/new", 1)])
    assert reactor.run(until=lambda: "agent/new" in sub.store, timeout=5)
    assert "agent/zombie" not in sub.store
    sub.close()
    new.close()
    old.close()


def test_subscriber_resyncs_when_the_publisher_goes_silent(
    ctx: zmq.Context[zmq.Socket[bytes]],
) -> None:
    reactor = Reactor()
    pub = publisher(reactor, ctx, epoch=2)
    pub.publish([entry("a/1", 1)])
    sub = subscriber(reactor, ctx)
    sub.connect(pub.pub_endpoint, pub.snapshot_endpoint)
    assert reactor.run(until=lambda: sub.synced, timeout=5)
    pub._beat.cancel()  # the publisher stops beating (a hung leader)
    resyncs = sub.stats.get("state_resyncs")
    assert reactor.run(until=lambda: sub.stats.get("state_resyncs") > resyncs, timeout=5)
    sub.close()
    pub.close()


def test_a_subscriber_told_not_leading_asks_again_soon(
    ctx: zmq.Context[zmq.Socket[bytes]],
) -> None:
    """Subscribers learn a new leader from the election a moment before that leader itself
    does: their first snapshot request is refused ("not leading"). They waited for the whole
    snapshot timeout (2 s) before asking again, and a master failover took 2 s longer."""
    reactor = Reactor()
    pub = publisher(reactor, ctx, epoch=6)
    pub.deactivate()  # elected, but not leading yet
    sub = StateSubscriber(reactor, ctx, Sender("allocator", ALLOCATOR), lambda c: None,
                          heartbeat_interval=1.0, max_missed=5, snapshot_timeout=2.0)
    started = reactor.now()
    sub.connect(pub.pub_endpoint, pub.snapshot_endpoint)
    assert not reactor.run(until=lambda: sub.synced, timeout=0.2)
    pub.restart(7, [entry("agent/a", 1)])  # now it leads
    assert reactor.run(until=lambda: sub.synced, timeout=5)
    assert reactor.now() - started < 1.0, f"synced {reactor.now() - started:.2f}s after connect"
    assert sub.store.keys() == {"agent/a"}
    sub.close()
    pub.close()
