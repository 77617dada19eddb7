"""A message too large for a frame is refused by the sending socket itself: counted, logged,
and `send` answers False; it never raises into the caller (a master relaying a frame-limit
call used to die of FrameTooLarge here)."""

from __future__ import annotations

import zmq

from services.bus import codec
from services.bus.peer import DealerClient, RouterServer, Sender
from services.bus.reactor import Reactor
from services.bus.stats import Stats


def huge() -> codec.Envelope:
    env = codec.Envelope()
    env.error.message = "x" * (codec.DEFAULT_FRAME_LIMIT + 10)
    return env


def test_router_and_dealer_refuse_an_oversized_send_without_raising() -> None:
    ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
    reactor = Reactor()
    stats = Stats()
    sender = Sender("t", codec.Role.Value("ROLE_MASTER"))
    router = RouterServer(reactor, ctx, "tcp://127.0.0.1:*", sender, lambda p, e: None,
                          stats=stats)
    dealer = DealerClient(reactor, ctx, sender, lambda e: None, stats=stats)
    dealer.connect(router.endpoint)
    try:
        assert router.send(b"somebody", huge()) is False
        assert dealer.send(huge()) is False
        assert stats.get("frames_unsent{reason=too_large}") == 2
        ok = codec.Envelope()
        ok.heartbeat.interval_ms = 1
        assert dealer.send(ok) is True  # the socket goes on
    finally:
        dealer.close()
        router.close()
        ctx.destroy(linger=0)
