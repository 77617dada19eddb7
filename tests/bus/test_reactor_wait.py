"""The reactor sleeps until its next timer, never spins: a timer less than a millisecond
away made `poll(int(wait * 1000))` a poll(0), returned at once, over and over until the
timer was due (the agent emulator, whose tasks report on timers, woke 20,000 times a
second)."""

from __future__ import annotations

from typing import Any

import zmq

from services.bus.reactor import Reactor


def test_a_timer_under_a_millisecond_away_is_waited_for_not_spun_on() -> None:
    ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
    sock = ctx.socket(zmq.PULL)  # a service's reactor always reads some socket
    sock.bind("inproc://reactor-wait")
    reactor = Reactor()
    reactor.add_reader(sock, lambda: None)
    polls = _count_polls(reactor)
    fired: list[float] = []
    for i in range(20):
        at = reactor.clock() + 0.0004
        reactor.call_at(at, lambda at=at: fired.append(reactor.clock() - at))
        reactor.run(until=lambda i=i: len(fired) > i, timeout=5)
    sock.close()
    ctx.destroy(linger=0)
    assert len(fired) == 20 and min(fired) >= 0  # never early
    assert len(polls) <= 3 * 20, f"{len(polls)} polls for 20 timers: spinning"


def test_a_reactor_reading_nothing_sleeps_until_its_timer() -> None:
    reactor = Reactor()  # zmq_poll of no item returns at once, whatever its timeout
    polls = _count_polls(reactor)
    fired: list[float] = []
    at = reactor.clock() + 0.005
    reactor.call_at(at, lambda: fired.append(reactor.clock() - at))
    reactor.run(until=lambda: bool(fired), timeout=5)
    assert fired and fired[0] >= 0
    assert len(polls) <= 3, f"{len(polls)} polls for one timer: spinning"


def _count_polls(reactor: Reactor) -> list[Any]:
    """The timeouts of the reactor's polls from now on."""
    polls: list[Any] = []
    poll = reactor._poller.poll

    def counted(timeout: Any = None) -> Any:
        polls.append(timeout)
        return poll(timeout)

    reactor._poller.poll = counted  # type: ignore[method-assign]
    return polls
