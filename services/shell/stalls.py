"""The stall watch every service process runs: a thread that wakes every PERIOD_S and measures
how late it woke. Late means that no thread of this process could run Python code for that
long (one held the GIL in a long C call, or the process was not scheduled), and so neither
could the reactor nor ZooKeeper's session threads: a stall past the session timeout loses
the process's sessions and, for a leader, its leadership. Each stall past REPORT_S is counted
(`offerbus_<service>_stall_seconds`) and logged when it ends, with the call the main thread
is in then (a stall by one long call often still shows it).

Not used: faulthandler's watchdog, which could dump every stack during the stall itself:
it is re-armed by joining its old thread and starting a new one, with the GIL held, and the
watch would re-arm it several times a second in every service."""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Callable

from services.bus.log import KV
from services.shell.metrics import Metrics

PERIOD_S = 0.05  # how often the watch wakes
REPORT_S = 0.25  # a wake-up this late is a stall: counted and logged
STALL_BUCKETS = (0.25, 0.5, 1.0, 2.0, 5.0, 10.0)


class StallWatch:
    def __init__(self, metrics: Metrics, log: KV, *, period_s: float = PERIOD_S,
                 report_s: float = REPORT_S,
                 clock: Callable[[], float] = time.monotonic) -> None:
        if not 0 < period_s < report_s:
            raise ValueError("the stall watch needs 0 < period < report seconds")
        self.log, self.clock = log, clock
        self.period_s, self.report_s = period_s, report_s
        self._main = threading.main_thread().ident
        self.stalls = metrics.histogram(
            "stall_seconds", f"Stalls of this process past {report_s:g} s: no thread could "
            "run Python code (one held the GIL, or the process was not scheduled); each is "
            "logged with the call the main thread is in when it ends.",
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

    def _main_call(self) -> str:
        """Where the main thread is: `file:line function` of its innermost frame."""
        frame = sys._current_frames().get(self._main) if self._main is not None else None
        if frame is None:
            return ""
        code = frame.f_code
        return f"{code.co_filename.rsplit('/', 1)[-1]}:{frame.f_lineno} {code.co_name}"

    def _run(self) -> None:
        due = self.clock()
        while True:
            due += self.period_s
            if self._stop.wait(max(0.0, due - self.clock())):
                return
            now = self.clock()
            late = now - due
            if late >= self.report_s:
                self.stalls.observe(late)
                self.log.warning("process stalled", seconds=round(late, 3),
                                 main_thread_in=self._main_call())
            if late > self.period_s:
                due = now  # no catching up on missed wake-ups
