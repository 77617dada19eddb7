"""Channels on real ZeroMQ sockets: one DEALER carries many endpoints (Envelope.channel). The
ROUTER delivers each with its own composite peer, answers a composite peer on its channel,
keeps liveness per connection, reports a lost connection for every channel seen on it, and
tracks at most a bounded number of channels."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import zmq

from services.bus import codec
from services.bus.liveness import CHANNEL_SEP, ChannelTable, join_peer
from services.bus.peer import DealerClient, HeartbeatConfig, RouterServer, Sender
from services.bus.reactor import Reactor

AGENT = codec.Role.Value("ROLE_AGENT")
MASTER = codec.Role.Value("ROLE_MASTER")


@pytest.fixture
def ctx() -> Iterator[zmq.Context[zmq.Socket[bytes]]]:
    context: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
    yield context
    context.destroy(linger=0)


def hello(text: str) -> codec.Envelope:
    env = codec.Envelope()
    env.snapshot_request.prefix = text
    return env


class Pair:
    """A RouterServer and a DealerClient connected to it, on one reactor."""

    def __init__(self, ctx: zmq.Context[zmq.Socket[bytes]], max_channels: int = 100,
                 beat: float = 0.1) -> None:
        self.reactor = Reactor()
        self.got: list[tuple[bytes, str]] = []
        self.gone: list[bytes] = []
        self.replies: list[codec.Envelope] = []
        self.server = RouterServer(
            self.reactor, ctx, "tcp://127.0.0.1:*", Sender("master-1", MASTER),
            lambda p, e: self.got.append((p, e.snapshot_request.prefix)),
            on_peer_gone=self.gone.append, heartbeat=HeartbeatConfig(beat, 3),
            max_channels=max_channels)
        self.client = DealerClient(self.reactor, ctx, Sender("emu", AGENT),
                                   self.replies.append, heartbeat=HeartbeatConfig(beat, 3))
        self.client.connect(self.server.endpoint)
        assert self.reactor.run(until=lambda: self.client.connected, timeout=3)

    def close(self) -> None:
        self.client.close()
        self.server.close()


def test_each_channel_is_its_own_peer_and_is_answered_on_its_channel(
    ctx: zmq.Context[zmq.Socket[bytes]]
) -> None:
    pair = Pair(ctx)
    try:
        for name in ("a1", "a2", "a1"):
            assert pair.client.send(hello(f"from {name}"), channel=name)
        pair.client.send(hello("plain"))
        assert pair.reactor.run(until=lambda: len(pair.got) == 4, timeout=3)
        peers = [p for p, _ in pair.got]
        rid = peers[3]  # the plain message: the connection's own routing id
        assert CHANNEL_SEP not in rid
        assert peers[:3] == [join_peer(rid, "a1"), join_peer(rid, "a2"), join_peer(rid, "a1")]
        assert len(pair.server.channels) == 2
        # Each composite peer is answered on its own channel, through the one connection.
        for peer in (peers[1], peers[0], rid):
            assert pair.server.send(peer, hello(f"to {peer!r}"))
        assert pair.reactor.run(until=lambda: len(pair.replies) == 3, timeout=3)
        assert [r.channel for r in pair.replies] == ["a2", "a1", ""]
        # Liveness is the connection's, whichever channel asks.
        assert pair.server.last_heard(peers[0]) == pair.server.last_heard(rid) is not None
        assert pair.server.last_heard(b"nobody") is None
        # ... and so says the lookup of many at once (the master's liveness report).
        asked = [peers[0], peers[1], rid, b"nobody"]
        assert pair.server.last_heard_of(asked) == {
            p: pair.server.last_heard(p) for p in asked if p != b"nobody"}
    finally:
        pair.close()


def test_a_lost_connection_is_reported_for_each_of_its_channels(
    ctx: zmq.Context[zmq.Socket[bytes]]
) -> None:
    pair = Pair(ctx)
    try:
        for name in ("v1", "v2", "v3"):
            pair.client.send(hello(name), channel=name)
        assert pair.reactor.run(until=lambda: len(pair.got) == 3, timeout=3)
        composite = {p for p, _ in pair.got}
        rid = pair.server.channels.routing_id(pair.got[0][0])
        pair.client.close()  # silent from now on
        assert pair.reactor.run(until=lambda: len(pair.gone) == 4, timeout=5)
        assert pair.gone[0] == rid and set(pair.gone[1:]) == composite
        assert len(pair.server.channels) == 0  # pruned
        assert pair.server.last_heard(pair.got[0][0]) is None
        # A composite peer of a gone connection is unknown: not sent, counted.
        unsent = pair.server.stats.get("frames_unsent{reason=unknown_peer}")
        assert not pair.server.send(pair.got[0][0], hello("late"))
        assert pair.server.stats.get("frames_unsent{reason=unknown_peer}") == unsent + 1
    finally:
        pair.server.close()


def test_the_channel_table_is_bounded(ctx: zmq.Context[zmq.Socket[bytes]]) -> None:
    pair = Pair(ctx, max_channels=2)
    try:
        for name in ("c1", "c2", "c3", "c1"):
            pair.client.send(hello(name), channel=name)
        assert pair.reactor.run(until=lambda: len(pair.got) == 3 and pair.replies, timeout=3)
        assert [text for _, text in pair.got] == ["c1", "c2", "c1"]
        assert pair.server.stats.get("frames_dropped{reason=channels_full}") == 1
        refusal = pair.replies[0]
        assert refusal.WhichOneof("payload") == "error" and refusal.channel == "c3"
    finally:
        pair.close()


def test_a_channel_with_the_separator_is_refused(ctx: zmq.Context[zmq.Socket[bytes]]) -> None:
    pair = Pair(ctx)
    try:
        pair.client.send(hello("bad"), channel="a\x1fb")
        pair.client.send(hello("good"), channel="ok")
        assert pair.reactor.run(until=lambda: pair.got and pair.replies, timeout=3)
        assert [text for _, text in pair.got] == ["good"]
        assert codec.ErrorCode.Name(pair.replies[0].error.code) == "INVALID"
        assert pair.server.stats.get("frames_dropped{reason=bad_channel}") == 1
    finally:
        pair.close()


def test_channel_table_maps_back_and_prunes() -> None:
    table = ChannelTable(limit=3)
    a1 = table.add(b"r1", "a")
    assert a1 == b"r1\x1fa" and table.add(b"r1", "a") == a1
    assert table.add(b"r1", "b") is not None and table.add(b"r2", "a") is not None
    assert table.add(b"r2", "b") is None  # full
    assert table.routing_id(a1) == b"r1" and table.channel(a1) == "a"
    assert table.routing_id(b"r9") == b"r9" and table.channel(b"r9") == ""
    assert table.drop(b"r1") == [b"r1\x1fa", b"r1\x1fb"]
    assert len(table) == 1 and table.routing_id(a1) == a1
    assert table.add(b"r2", "b") is not None  # room again
