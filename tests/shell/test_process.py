"""Process plumbing: SIGTERM (or SIGINT) ends a service's loop at once, even while it waits
in poll with nothing due for a long time, so a leader withdraws from the election (and a
standby takes over) as soon as it is told to stop."""

from __future__ import annotations

import os
import signal
import threading
import time
from pathlib import Path

from services.bus.reactor import Reactor
from services.shell.process import stop_on_signals


def test_sigterm_ends_the_loop_at_once() -> None:
    """The loop used to stay blocked in poll (pyzmq retries an interrupted poll, and the
    signal may even land on another thread) until its next timer, for up to a second."""
    reactor = Reactor()
    reactor.every(30.0, lambda: None)  # nothing due for a long time
    quiet, unused = os.pipe()  # something to wait on: poll blocks
    reactor.add_reader(quiet, lambda: None)
    handlers = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT)}
    wakeup = signal.set_wakeup_fd(-1)
    sent: list[float] = []

    def main_thread_sleeping() -> bool:
        """The loop's thread (the process's main thread) is blocked, i.e. in poll."""
        stat = Path(f"/proc/self/task/{os.getpid()}/stat").read_text()
        return stat.rsplit(")", 1)[1].split()[0] == "S"

    def terminate() -> None:
        deadline = time.monotonic() + 5.0
        while not (reactor._running and main_thread_sleeping()) \
                and time.monotonic() < deadline:
            time.sleep(0.001)  # polling until the loop blocks in poll, from a helper thread
        sent.append(time.monotonic())
        os.kill(os.getpid(), signal.SIGTERM)

    try:
        stop_on_signals(reactor)
        thread = threading.Thread(target=terminate, daemon=True)
        thread.start()
        assert reactor.run(timeout=5.0) is True  # stopped, not timed out
        took = time.monotonic() - sent[0]
        thread.join(5)
        assert took < 0.2, f"the loop ran on {took:.3f}s after SIGTERM"
    finally:
        for sig, handler in handlers.items():
            signal.signal(sig, handler)
        signal.set_wakeup_fd(wakeup)
        reactor.remove_reader(quiet)
        os.close(quiet)
        os.close(unused)
