"""A socket's wake-up reads for at most DRAIN_SECONDS: a backlog of costly messages must not
hold back the reactor's timers and idle flushes (the master's state deltas and batched
updates went out once per wake-up, and a thousand launches held them for a second)."""

from __future__ import annotations

import zmq

from services.bus import codec
from services.bus.peer import DRAIN_SECONDS, DealerClient, RouterServer, Sender
from services.bus.reactor import Reactor
from tests.waiting import wait_for


def test_a_backlog_is_read_over_several_wake_ups_when_handlers_take_time() -> None:
    ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
    now = [0.0]
    reactor = Reactor(clock=lambda: now[0])
    got: list[str] = []

    def costly(peer: bytes, env: codec.Envelope) -> None:
        got.append(env.error.message)
        now[0] += DRAIN_SECONDS * 0.26  # each message takes over a quarter of the budget

    # inproc: a message sent is in the router's queue when send returns (all 20 are there
    # before the first read, so only the budget can end a wake-up early).
    router = RouterServer(reactor, ctx, "inproc://drain-budget", Sender("r", codec.Role.Value(
        "ROLE_MASTER")), costly)
    dealer = DealerClient(reactor, ctx, Sender("d", codec.Role.Value("ROLE_AGENT")),
                          lambda e: None)
    dealer.connect(router.endpoint)
    try:
        for i in range(20):
            env = codec.Envelope()
            env.error.message = str(i)
            assert dealer.send(env)
        wait_for(lambda: router.sock.poll(0) & zmq.POLLIN, 10, message="the first message")
        per_wake_up = []
        for _ in range(100):
            before = len(got)
            router._on_readable()
            per_wake_up.append(len(got) - before)
            if len(got) == 20:
                break
        assert got == [str(i) for i in range(20)]  # all of them, in order
        assert per_wake_up[:5] == [4, 4, 4, 4, 4], per_wake_up  # the budget ended each
    finally:
        dealer.close()
        router.close()
        ctx.destroy(linger=0)
