"""Fencing on real ZeroMQ sockets (issue 10, defect 5): a ROUTER or DEALER with a fence acts
on an elected role's message only at its leader's epoch and from its leader's member. A
message the detector cannot vouch for yet (no leader known, or a newer epoch) is held
briefly and delivered as soon as the detector names that leader; anything else, and what is
still unvouched for when the hold ends, is refused with a clear error and counted."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest
import zmq

from services.bus import codec
from services.bus.election import LeaderInfo
from services.bus.epoch import EpochFence
from services.bus.peer import DealerClient, HeartbeatConfig, RouterServer, Sender
from services.bus.reactor import Reactor

BROKER = codec.Role.Value("ROLE_BROKER")
MASTER = codec.Role.Value("ROLE_MASTER")
HOLD_S = 0.6


@pytest.fixture
def ctx() -> Iterator[zmq.Context[zmq.Socket[bytes]]]:
    context: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
    yield context
    context.destroy(linger=0)


def frame(role: int, epoch: int, sender: str, text: str) -> bytes:
    env = codec.Envelope(version=codec.PROTOCOL_VERSION, message_id=os.urandom(4).hex(),
                         sender_id=sender, sender_role=role, epoch=epoch)  # type: ignore[arg-type]
    env.snapshot_request.prefix = text
    return env.SerializeToString()


def replies(sock: zmq.Socket[bytes], timeout_ms: int) -> list[codec.Envelope]:
    out = []
    while sock.poll(timeout_ms):
        env = codec.Envelope.FromString(sock.recv())
        if env.WhichOneof("payload") != "heartbeat":
            out.append(env)
            timeout_ms = 50
    return out


def test_a_router_acts_only_on_the_elected_leader(ctx: zmq.Context[zmq.Socket[bytes]]) -> None:
    reactor = Reactor()
    fence = EpochFence(frozenset({BROKER}))
    got: list[str] = []
    server = RouterServer(reactor, ctx, "tcp://127.0.0.1:*", Sender("master-1", MASTER, 3),
                          lambda p, e: got.append(e.snapshot_request.prefix), fence=fence,
                          heartbeat=HeartbeatConfig(0.1, 5), fence_hold_s=HOLD_S)
    socks = {name: ctx.socket(zmq.DEALER) for name in ("real", "forger", "old", "impostor")}
    for s in socks.values():
        s.setsockopt(zmq.LINGER, 0)
        s.connect(server.endpoint)
    try:
        # Before the detector names a broker, the real one's first words wait ...
        socks["real"].send(frame(BROKER, 7, "b1", "early"))
        socks["forger"].send(frame(BROKER, 10**12, "b1", "forged"))
        assert not reactor.run(until=lambda: got, timeout=0.2)
        assert server.stats.get("frames_held{reason=unknown_leader}") == 2
        # ... and are acted on once it does; the forged epoch is not vouched for.
        fence.follow(BROKER, LeaderInfo("broker", "b1", 7, {}))
        assert reactor.run(until=lambda: got == ["early"], timeout=2)
        socks["real"].send(frame(BROKER, 7, "b1", "next"))
        socks["old"].send(frame(BROKER, 6, "b0", "stale"))
        socks["impostor"].send(frame(BROKER, 7, "mallory", "impostor"))
        assert reactor.run(until=lambda: got == ["early", "next"], timeout=2)
        # The forged one is refused when its hold ends, and never raised the bar.
        assert reactor.run(until=lambda: server.stats.get(
            "frames_dropped{reason=newer_epoch}") == 1, timeout=HOLD_S + 2)
        socks["real"].send(frame(BROKER, 7, "b1", "after"))
        assert reactor.run(until=lambda: got[-1:] == ["after"], timeout=2)
        assert got == ["early", "next", "after"]
        assert server.stats.get("frames_dropped{reason=stale_epoch}") == 1
        assert server.stats.get("frames_dropped{reason=wrong_member}") == 1
        for name, code in (("forger", "NOT_LEADER"), ("old", "STALE_EPOCH"),
                           ("impostor", "NOT_LEADER")):
            errors = [r.error for r in replies(socks[name], 2000)]
            assert [codec.ErrorCode.Name(e.code) for e in errors] == [code], name
            assert "fenced" in errors[0].message and "broker" in errors[0].message
    finally:
        for s in socks.values():
            s.close(linger=0)
        server.close()


def test_the_hold_is_bounded(ctx: zmq.Context[zmq.Socket[bytes]]) -> None:
    reactor = Reactor()
    fence = EpochFence(frozenset({BROKER}))
    server = RouterServer(reactor, ctx, "tcp://127.0.0.1:*", Sender("master-1", MASTER, 3),
                          lambda p, e: None, fence=fence, fence_hold_s=30, fence_hold_max=5)
    sock = ctx.socket(zmq.DEALER)
    sock.connect(server.endpoint)
    try:
        for i in range(8):
            sock.send(frame(BROKER, 10**9 + i, "x", "flood"))
        assert reactor.run(until=lambda: server.stats.get(
            "frames_dropped{reason=unknown_leader}") == 3, timeout=2)
        assert server.stats.get("frames_held{reason=unknown_leader}") == 5
    finally:
        sock.close(linger=0)
        server.close()


def test_a_dealer_holds_a_newer_leaders_words_until_its_detector_knows_it(
    ctx: zmq.Context[zmq.Socket[bytes]]
) -> None:
    """An agent's link to a master that re-led at a new epoch, before its detector says so."""
    reactor = Reactor()
    fence = EpochFence(frozenset({MASTER}))
    fence.follow(MASTER, LeaderInfo("master", "m1", 4, {}))
    master = ctx.socket(zmq.ROUTER)
    master.setsockopt(zmq.LINGER, 0)
    port = master.bind_to_random_port("tcp://127.0.0.1")
    got: list[str] = []
    client = DealerClient(reactor, ctx, Sender("agent-1", codec.Role.Value("ROLE_AGENT")),
                          lambda e: got.append(e.snapshot_request.prefix), fence=fence,
                          heartbeat=HeartbeatConfig(0.1, 50), fence_hold_s=HOLD_S)
    client.connect(f"tcp://127.0.0.1:{port}")
    try:
        assert master.poll(2000)
        peer = master.recv_multipart()[0]
        master.send_multipart([peer, frame(MASTER, 4, "m1", "from 4")])
        master.send_multipart([peer, frame(MASTER, 5, "m1", "from 5")])
        assert reactor.run(until=lambda: got == ["from 4"], timeout=2)
        assert not reactor.run(until=lambda: len(got) > 1, timeout=0.2)
        fence.follow(MASTER, LeaderInfo("master", "m1", 5, {}))
        assert reactor.run(until=lambda: got == ["from 4", "from 5"], timeout=2)
        master.send_multipart([peer, frame(MASTER, 4, "m1", "late from 4")])
        assert reactor.run(until=lambda: client.stats.get(
            "frames_dropped{reason=stale_epoch}") == 1, timeout=2)
        assert got == ["from 4", "from 5"]
    finally:
        client.close()
        master.close(linger=0)
