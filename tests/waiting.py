"""Waiting on a condition with a deadline: the only way tests here wait for anything.

Never sleep as synchronisation; poll the condition you actually need::

    from tests.waiting import wait_for

    wait_for(lambda: client.exists("/leader"), 5.0, message="no leader elected")
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

__all__ = ["wait_for"]

T = TypeVar("T")


def wait_for(
    predicate: Callable[[], T],
    timeout: float,
    interval: float = 0.02,
    message: str | Callable[[], str] = "condition not met",
    *,
    ignore: tuple[type[BaseException], ...] = (),
) -> T:
    """Call ``predicate`` every ``interval`` seconds until it returns a truthy value, and
    return that value. Raise AssertionError with ``message`` (a string, or a callable
    producing one, for state read at the moment of failure) after ``timeout`` seconds.

    Exceptions of the types in ``ignore`` count as "not yet" (say, ConnectionLoss while
    ZooKeeper elects a leader); the last one is chained to the AssertionError. The predicate
    is always tried at least once, and once more at the deadline.
    """
    deadline = time.monotonic() + timeout
    last_error: BaseException | None = None
    while True:
        expired = time.monotonic() >= deadline
        try:
            value = predicate()
        except ignore as exc:
            last_error = exc
        else:
            if value:
                return value
            last_error = None
        if expired:
            text = message() if callable(message) else message
            raise AssertionError(
                f"{text} (waited {timeout:g}s)"
                + (f"; last error: {last_error!r}" if last_error is not None else "")
            ) from last_error
        time.sleep(max(0.0, min(interval, deadline - time.monotonic())))
