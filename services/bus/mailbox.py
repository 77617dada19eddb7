"""A thread-safe queue with a wake-up file descriptor, so events from other threads
(kazoo callbacks, Docker calls, the flock waiter) reach a single-threaded reactor."""

from __future__ import annotations

import contextlib
import os
import threading
from collections import deque
from typing import Generic, TypeVar

T = TypeVar("T")


class Mailbox(Generic[T]):
    def __init__(self) -> None:
        self._items: deque[T] = deque()
        self._lock = threading.Lock()
        self._r, self._w = os.pipe()
        os.set_blocking(self._r, False)
        os.set_blocking(self._w, False)
        self._closed = False

    def fileno(self) -> int:
        """Readable while items are waiting; register it with zmq.Poller or select."""
        return self._r

    def put(self, item: T) -> None:
        with self._lock:
            if self._closed:
                return
            self._items.append(item)
            # One byte per put; a full pipe already wakes the reader, so drop the byte.
            with contextlib.suppress(BlockingIOError):
                os.write(self._w, b"\x01")

    def drain(self) -> list[T]:
        """Every waiting item, oldest first; never blocks."""
        with self._lock:
            items = list(self._items)
            self._items.clear()
            with contextlib.suppress(BlockingIOError):
                while os.read(self._r, 4096):
                    pass
        return items

    def close(self) -> None:
        with self._lock:
            if self._closed:
                return
            self._closed = True
            os.close(self._r)
            os.close(self._w)
