"""The master shell's side of agent liveness: after each reactor wake-up (its sockets read),
tell the core when each agent connection (or channel: a virtual agent of the emulator) was
last heard from, heartbeats included (the bus consumes those), and whether the front socket
was drained first (only then is the report evidence of silence: liveness.py)."""

from __future__ import annotations

import math
from collections.abc import Callable

import zmq

from services.bus.peer import RouterServer
from services.bus.reactor import Reactor
from services.master.core import MasterCore
from services.shell.driver import CoreDriver
from services.shell.metrics import Metrics


def report_interval(heartbeat_interval: float) -> float:
    """How often the shell reports: every half heartbeat, at most every 0.5 s. A report walks
    every agent (at 10,000 agents, four a second were a tenth of a busy master's time); an
    agent's silence is judged at once all the same, as the core asks for a report as soon as
    one is due (`awaiting_report`)."""
    return min(0.5, heartbeat_interval / 2)


class LivenessReporter:
    """Reports at most every `interval` s (reactor clock); the core's `agents_heard` gets
    wall-clock times, like every other call."""

    def __init__(self, reactor: Reactor, front: RouterServer, driver: CoreDriver,
                 core: Callable[[], MasterCore | None], interval: float,
                 metrics: Metrics | None = None) -> None:
        self.reactor, self.front, self.driver, self.core = reactor, front, driver, core
        self.interval = interval
        self._last: dict[bytes, float] = {}  # what was reported, to send only changes
        self._for: MasterCore | None = None  # ... to this core
        self._reported_at = -math.inf
        self.reports = 0
        self.incomplete = 0  # reports made while the front socket still had frames waiting
        reactor.on_idle(self.report)
        if metrics is not None:
            metrics.counter_function(
                "liveness_reports", "Agent liveness reports given to the core.",
                lambda: float(self.reports))
            metrics.counter_function(
                "liveness_reports_incomplete", "Liveness reports made while frames still "
                "waited on the front socket (no evidence of an agent's silence).",
                lambda: float(self.incomplete))

    def report(self) -> None:
        core = self.core()
        if core is not self._for:
            self._last, self._for = {}, core
        if core is None:
            return
        mono = self.reactor.now()
        if mono - self._reported_at < self.interval and not core.awaiting_report:
            return
        self._reported_at = mono
        complete = not int(self.front.sock.getsockopt(zmq.EVENTS)) & zmq.POLLIN
        offset = self.driver.now() - mono  # reactor clock -> wall clock
        # An agent's connection, or its channel on one (the emulator's agents).
        last = self.front.last_heard_of(core.watched_peers())
        before = self._last
        heard = {peer: at + offset for peer, at in last.items() if before.get(peer) != at}
        self._last = last
        self.reports += 1
        self.incomplete += not complete
        self.driver.step(lambda now: core.agents_heard(heard, now, complete))
