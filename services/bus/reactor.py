"""The single-threaded event loop every service shell runs: ZeroMQ sockets, plain file
descriptors (mailboxes) and timers, with time read from one clock that cores never see."""

from __future__ import annotations

import heapq
import itertools
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import zmq

from services.bus.log import get_logger

log = get_logger("bus.reactor")

Handler = Callable[[], None]


@dataclass(order=True)
class Timer:
    when: float
    seq: int
    fn: Handler = field(compare=False)
    interval: float | None = field(default=None, compare=False)
    cancelled: bool = field(default=False, compare=False)

    def cancel(self) -> None:
        self.cancelled = True


class Reactor:
    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self.clock = clock
        self._poller = zmq.Poller()
        self._handlers: dict[Any, Handler] = {}
        self._timers: list[Timer] = []
        self._idle: list[Handler] = []
        self._seq = itertools.count()
        self._running = False
        self.handler_errors = 0  # exceptions raised by handlers, timers and idle hooks

    def now(self) -> float:
        return self.clock()

    # -- readers -----------------------------------------------------------------------
    def add_reader(self, source: zmq.Socket[bytes] | int | Any, handler: Handler) -> None:
        """Call `handler` whenever `source` (a zmq socket, an fd, or an object with fileno())
        is readable. The handler should drain everything waiting."""
        key = source if isinstance(source, zmq.Socket | int) else source.fileno()
        self._handlers[key] = handler
        self._poller.register(key, zmq.POLLIN)

    def remove_reader(self, source: zmq.Socket[bytes] | int | Any) -> None:
        key = source if isinstance(source, zmq.Socket | int) else source.fileno()
        if self._handlers.pop(key, None) is not None:
            self._poller.unregister(key)

    # -- timers ------------------------------------------------------------------------
    def call_at(self, when: float, fn: Handler) -> Timer:
        timer = Timer(when, next(self._seq), fn)
        heapq.heappush(self._timers, timer)
        return timer

    def call_later(self, delay: float, fn: Handler) -> Timer:
        return self.call_at(self.clock() + delay, fn)

    def every(self, interval: float, fn: Handler, *, first: float | None = None) -> Timer:
        """Run `fn` every `interval` seconds (first after `first`, default one interval)."""
        timer = Timer(self.clock() + (interval if first is None else first), next(self._seq), fn,
                      interval)
        heapq.heappush(self._timers, timer)
        return timer

    def on_idle(self, fn: Handler) -> None:
        """Run `fn` after every wake-up, once every ready socket was drained: the place to
        flush work batched across messages (state deltas, outgoing batches)."""
        self._idle.append(fn)

    # -- loop --------------------------------------------------------------------------
    def run_once(self, max_wait: float = 1.0) -> None:
        """Wait for I/O or the next timer (at most `max_wait` s), then dispatch: readers
        first, then due timers, so after a stall a timer judges (say, a peer's liveness) only
        once what arrived meanwhile (its heartbeats) was read."""
        wait = max_wait
        if self._timers:
            wait = max(0.0, min(wait, self._timers[0].when - self.clock()))
        if not self._handlers:  # zmq_poll of nothing returns at once, whatever the timeout
            time.sleep(wait)
            events = []
        else:
            # Rounded up: a wait under a millisecond rounded down is a poll(0) that returns
            # at once, again and again until the timer is due (a spin); the timer fires at
            # most a millisecond late instead.
            events = self._poller.poll(math.ceil(wait * 1000) if wait > 0 else 0)
        for key, _ in events:
            handler = self._handlers.get(key)
            if handler is not None:
                self._call(handler, "reader")
        self._run_due_timers()
        for fn in self._idle:
            self._call(fn, "idle")

    def _call(self, fn: Handler, kind: str) -> None:
        """A handler's exception is a bug, but never a reason to stop serving the rest:
        log it with its traceback, count it, go on."""
        try:
            fn()
        except Exception as exc:
            self.handler_errors += 1
            log.error("handler failed", kind=kind, handler=getattr(fn, "__qualname__", repr(fn)),
                      error=repr(exc), exc_info=True)

    def _run_due_timers(self) -> None:
        now = self.clock()
        while self._timers and self._timers[0].when <= now:
            timer = heapq.heappop(self._timers)
            if timer.cancelled:
                continue
            if timer.interval is not None:
                # Reschedule from the due time, skipping missed beats after a stall.
                timer.when = max(timer.when + timer.interval, now)
                timer.seq = next(self._seq)
                heapq.heappush(self._timers, timer)
            self._call(timer.fn, "timer")

    def run(self, until: Callable[[], bool] | None = None, timeout: float | None = None) -> bool:
        """Run until stop(), `until()` is true, or `timeout` passes; returns `until()`'s value
        (True when no condition was given and the loop was stopped)."""
        self._running = True
        deadline = None if timeout is None else self.clock() + timeout
        while self._running:
            if until is not None and until():
                return True
            if deadline is not None:
                left = deadline - self.clock()
                if left <= 0:
                    return False
                self.run_once(min(left, 1.0))
            else:
                self.run_once()
        return until() if until is not None else True

    def stop(self) -> None:
        self._running = False
