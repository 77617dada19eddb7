"""The stall watch every service process runs: a thread that wakes every PERIOD_S and measures
how late it woke. Late means that no thread of this process could run Python code for that
long (one held the GIL in a long C call, or the process was not scheduled), and so neither
could the reactor nor ZooKeeper's session threads: a stall past the session timeout loses
the process's sessions and, for a leader, its leadership. Each stall past REPORT_S is counted
(`offerbus_<service>_stall_seconds`) and logged when it ends; one of DUMP_S or more also has
every thread's stack written to stderr (the service's log) while it lasts, by faulthandler's
watchdog, which needs no GIL: the stack of the thread that held it names the culprit."""

from __future__ import annotations

import faulthandler
import sys
import threading
import time
from collections.abc import Callable
from typing import TextIO

from services.bus.log import KV
from services.shell.metrics import Metrics

PERIOD_S = 0.05  # how often the watch wakes
REPORT_S = 0.25  # a wake-up this late is a stall: counted and logged
DUMP_S = 1.0  # a stall this long has every thread's stack dumped, while it lasts
REARM_S = 0.25  # the dump's deadline is pushed back at most this often (each re-arm is a thread)
STALL_BUCKETS = (0.25, 0.5, 1.0, 2.0, 5.0, 10.0)


class StallWatch:
    def __init__(self, metrics: Metrics, log: KV, *, period_s: float = PERIOD_S,
                 report_s: float = REPORT_S, dump_s: float = DUMP_S,
                 dump_to: TextIO | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        if not 0 < period_s < report_s <= dump_s:
            raise ValueError("the stall watch needs 0 < period < report <= dump seconds")
        self.log, self.clock = log, clock
        self.period_s, self.report_s, self.dump_s = period_s, report_s, dump_s
        self.dump_to = dump_to if dump_to is not None else sys.stderr
        self.stalls = metrics.histogram(
            "stall_seconds", f"Stalls of this process past {report_s:g} s: no thread could "
            "run Python code (one held the GIL, or the process was not scheduled); each is "
            "logged, and one past its dump threshold has every thread's stack in the log.",
            buckets=STALL_BUCKETS)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="stall-watch", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(5.0)
        faulthandler.cancel_dump_traceback_later()

    def _arm(self) -> None:
        faulthandler.dump_traceback_later(self.dump_s, file=self.dump_to)

    def _run(self) -> None:
        self._arm()
        armed = due = self.clock()
        while True:
            due += self.period_s
            if self._stop.wait(max(0.0, due - self.clock())):
                return
            now = self.clock()
            late = now - due
            if now - armed >= REARM_S or late >= self.report_s:
                self._arm()
                armed = now
            if late >= self.report_s:
                self.stalls.observe(late)
                self.log.warning("process stalled", seconds=round(late, 3),
                                 dumped=late >= self.dump_s)
            if late > self.period_s:
                due = now  # no catching up on missed wake-ups
