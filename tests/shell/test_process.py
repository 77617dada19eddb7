"""Process plumbing: SIGTERM (or SIGINT) ends a service's loop at once, even while it waits
in poll with nothing due for a long time, so a leader withdraws from the election (and a
standby takes over) as soon as it is told to stop."""

from __future__ import annotations

import os
import signal
import threading
import time

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

    def terminate() -> None:
        while not reactor._running:
            time.sleep(0.001)  # polling the loop's start from a helper thread
        time.sleep(0.05)  # let it block in poll
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
