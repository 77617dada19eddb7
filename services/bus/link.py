"""LinkDealer: a DealerClient that tells its owner when the connection under it broke and
came back, so the owner can say again what a lost message may have carried."""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import Any

import zmq
from zmq.utils.monitor import recv_monitor_message

from services.bus.peer import DealerClient


class LinkDealer(DealerClient):
    """A DealerClient that also reports its transport going down and coming back (a ZeroMQ
    socket monitor), which ZeroMQ does within ~100 ms, long before heartbeats would notice. A
    message sent while the link was down, or in flight when it broke, may be lost either way:
    a client that must know (the executor's Subscribe, the agent's re-registration) acts on
    `on_link(True)` after an `on_link(False)`."""

    def __init__(self, *args: Any, on_link: Callable[[bool], None], **kwargs: Any) -> None:
        self._on_link = on_link
        self._monitor: zmq.Socket[bytes] | None = None
        super().__init__(*args, **kwargs)

    def _open(self) -> None:
        super()._open()
        assert self.sock is not None
        self._monitor = self.sock.get_monitor_socket(zmq.EVENT_CONNECTED | zmq.EVENT_DISCONNECTED)
        self.reactor.add_reader(self._monitor, self._on_monitor)

    def _close_socket(self) -> None:
        if self._monitor is not None:
            self.reactor.remove_reader(self._monitor)
            if self.sock is not None:
                with contextlib.suppress(zmq.ZMQError):
                    self.sock.disable_monitor()
            self._monitor.close(linger=0)
            self._monitor = None
        super()._close_socket()

    def _on_monitor(self) -> None:
        monitor = self._monitor
        while monitor is not None and monitor is self._monitor:
            try:
                event = recv_monitor_message(monitor, flags=zmq.NOBLOCK)
            except zmq.Again:
                return
            self._on_link(event["event"] == zmq.EVENT_CONNECTED)
