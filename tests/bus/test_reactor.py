"""The reactor survives its handlers: an exception in a reader, a timer or an idle hook is
logged and counted, and the loop goes on serving everything else."""

from __future__ import annotations

import os

from services.bus.reactor import Reactor


def test_a_failing_handler_timer_or_idle_hook_does_not_stop_the_loop() -> None:
    clock = [0.0]
    reactor = Reactor(clock=lambda: clock[0])
    r, w = os.pipe()
    seen: list[str] = []

    def bad_reader() -> None:
        os.read(r, 1)
        raise RuntimeError("a bug in a handler")

    def bad_timer() -> None:
        raise KeyError("a bug in a timer")

    reactor.add_reader(r, bad_reader)
    reactor.call_later(1.0, bad_timer)
    reactor.every(1.0, lambda: seen.append(f"beat {clock[0]}"))
    reactor.on_idle(lambda: (_ for _ in ()).throw(ValueError("a bug in an idle hook")))
    os.write(w, b"x")
    clock[0] = 1.0
    reactor.run_once(0)  # every kind fails once; none stops the loop
    assert seen == ["beat 1.0"]
    assert reactor.handler_errors == 3
    clock[0] = 2.0
    reactor.run_once(0)
    assert seen == ["beat 1.0", "beat 2.0"]  # the periodic timer still runs
    os.close(r)
    os.close(w)


def test_after_a_stall_what_arrived_is_read_before_timers_judge_it() -> None:
    """A stalled loop wakes with heartbeats queued and a liveness timer overdue: the reader
    runs first, so the timer sees the heartbeats (issue 10, defect 3: the timer fired first
    and declared live peers gone)."""
    clock = [0.0]
    reactor = Reactor(clock=lambda: clock[0])
    r, w = os.pipe()
    order: list[str] = []

    def read() -> None:
        os.read(r, 64)
        order.append("heartbeat read")

    reactor.add_reader(r, read)
    reactor.call_at(1.0, lambda: order.append("liveness timer"))
    os.write(w, b"beat")  # arrived during the stall
    clock[0] = 6.0  # the loop was stalled for 6 s
    reactor.run_once(0)
    assert order == ["heartbeat read", "liveness timer"]
    os.close(r)
    os.close(w)
