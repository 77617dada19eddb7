"""Process plumbing shared by every service's `__main__`: logging, SIGTERM/SIGINT to a clean
stop, and the `--cluster` URL that names where election and registry live."""

from __future__ import annotations

import argparse
import signal
from types import FrameType
from typing import Protocol

from services.bus import log
from services.bus.reactor import Reactor


def add_cluster_args(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--cluster", required=True,
                    help="zk://host:port[,host:port]/chroot (ZooKeeper) or file:///run/dir "
                         "(standalone, one machine): where leaders are elected and found")
    ap.add_argument("--host", default="127.0.0.1", help="address to bind and advertise")
    ap.add_argument("--log-level", default=None, help="DEBUG, INFO (default), WARNING")


def stop_on_signals(reactor: Reactor) -> None:
    def stop(signum: int, frame: FrameType | None) -> None:
        reactor.stop()

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)


def setup(service: str, level: str | None) -> None:
    log.configure(service, level)


class Service(Protocol):
    reactor: Reactor

    def run(self) -> None: ...
    def close(self) -> None: ...


def serve(shell: Service) -> int:
    """Run a service until SIGTERM/SIGINT, then close it cleanly."""
    stop_on_signals(shell.reactor)
    try:
        shell.run()
    finally:
        shell.close()
    return 0
