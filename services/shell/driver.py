"""The core driver every shell runs its pure core through: one clock, commands dispatched by
type to the shell's handlers, Notices sent to the log, a counter and the current span alike,
and one timer re-armed from `core.next_deadline()` after every step (no fixed polls)."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from typing import Any, Protocol

from opentelemetry import trace

from services.bus.log import KV
from services.bus.reactor import Reactor, Timer
from services.notice import Notice
from services.shell.metrics import Metrics

Handler = Callable[[Any], None]


class TimedCore(Protocol):
    def tick(self, now: float) -> Iterable[object]: ...
    def next_deadline(self) -> float | None: ...


class CoreDriver:
    def __init__(self, reactor: Reactor, metrics: Metrics, log: KV,
                 clock: Callable[[], float] = time.time) -> None:
        self.reactor, self.metrics, self.log, self.clock = reactor, metrics, log, clock
        self.core: TimedCore | None = None
        self._handlers: dict[type, Handler] = {}
        self._timer: Timer | None = None
        self._deadline: float | None = None
        self.context = ""  # set by step() for its handlers (e.g. the call's traceparent)
        self._command_errors = metrics.counter(
            "command_errors", "Commands whose handler raised (logged; the step went on).")

    def now(self) -> float:
        return self.clock()

    def on(self, kind: type, handler: Handler) -> None:
        """Commands of type `kind` (or a subclass) go to `handler`."""
        self._handlers[kind] = handler

    # -- the core --------------------------------------------------------------------------
    def attach(self, core: TimedCore) -> None:
        self.core = core
        self._rearm()

    def detach(self) -> None:
        self.core = None
        self._cancel()

    def step(self, fn: Callable[[float], Iterable[object]], context: str = "") -> list[object]:
        """Call the core (`fn(now)`), carry out its commands, re-arm the timer; returns the
        commands. `context` (a traceparent) is readable by the handlers during this step
        only. A handler that detaches the core (the service stepped down) ends the step."""
        core = self.core
        self.context = context
        try:
            cmds = list(fn(self.clock()))
            self.dispatch(cmds, while_attached=core)
        finally:
            self.context = ""
            self._rearm()
        return cmds

    def dispatch(self, commands: Iterable[object], while_attached: object = None) -> None:
        """Each command to its handler. One handler's exception (a bug) is logged and
        counted, and the rest are still carried out: the core already changed its state."""
        for cmd in commands:
            if while_attached is not None and self.core is not while_attached:
                return  # the service stepped down mid-step: a deposed leader sends nothing
            if isinstance(cmd, Notice):
                self.notice(cmd)
                continue
            handler = next((self._handlers[k] for k in type(cmd).__mro__
                            if k in self._handlers), None)
            try:
                if handler is None:
                    raise TypeError(f"no handler for {type(cmd).__name__}")
                handler(cmd)
            except Exception as exc:
                self._command_errors.inc()
                self.log.error("command failed", command=type(cmd).__name__, error=repr(exc),
                               exc_info=True)

    def notice(self, notice: Notice) -> None:
        """One decision or anomaly, to the log, the notices counter and the current span."""
        facts = notice.fields()
        getattr(self.log, notice.level)(notice.kind, message=notice.message, **facts)
        self.metrics.notices.labels(notice.kind, notice.level).inc()
        span = trace.get_current_span()
        if span.is_recording():
            span.add_event(notice.kind, {"message": notice.message, **facts})

    # -- the timer ------------------------------------------------------------------------
    def rearm(self) -> None:
        """Re-read the core's next deadline (after a change made outside step())."""
        self._rearm()

    def _rearm(self) -> None:
        deadline = self.core.next_deadline() if self.core is not None else None
        if deadline == self._deadline and self._timer is not None:
            return
        self._cancel()
        self._deadline = deadline
        if deadline is not None:
            delay = max(0.0, deadline - self.clock())
            self._timer = self.reactor.call_later(delay, self._fire)

    def _fire(self) -> None:
        self._timer, self._deadline = None, None
        core = self.core
        if core is not None:
            self.step(core.tick)
        else:
            self._rearm()

    def _cancel(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
        self._timer, self._deadline = None, None
