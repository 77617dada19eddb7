"""Process plumbing shared by every service's `__main__`: the one `main()` (configuration,
logging, tracing), and SIGTERM/SIGINT to a clean stop."""

from __future__ import annotations

import contextlib
import gc
import logging
import os
import signal
import sys
from collections.abc import Callable, Sequence
from types import FrameType
from typing import Any, Protocol

import zmq

from services.bus import log
from services.bus.election import parse_url
from services.bus.reactor import Reactor
from services.shell import config
from services.shell.config import Option
from services.shell.metrics import Metrics
from services.shell.stalls import StallWatch


def stop_on_signals(reactor: Reactor) -> None:
    """SIGTERM/SIGINT stop the reactor at once: the signal also writes to a pipe the reactor
    polls (signal.set_wakeup_fd), else the loop would wait in poll (pyzmq retries an
    interrupted poll; the signal may land on another thread) until its next timer."""
    def stop(signum: int, frame: FrameType | None) -> None:
        reactor.stop()

    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_r, False)
    os.set_blocking(wake_w, False)

    def drain() -> None:
        with contextlib.suppress(BlockingIOError):
            while os.read(wake_r, 512):
                pass

    reactor.add_reader(wake_r, drain)
    signal.set_wakeup_fd(wake_w, warn_on_full_buffer=False)
    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)


def reach_cluster(url: str, wait: float) -> None:
    """ConfigError unless the cluster's ZooKeeper answers within `wait` seconds (a file://
    cluster, or wait 0, is not checked): a mistyped address stops the service at start with
    one line, not a service waiting forever for an election."""
    kind, where, _ = parse_url(url)
    if kind != "zk" or wait <= 0:
        return
    from kazoo.client import KazooClient
    from kazoo.handlers.threading import KazooTimeoutError

    hosts = where.split("/", 1)[0]
    quiet = logging.getLogger("kazoo")
    level = quiet.level
    quiet.setLevel(logging.CRITICAL)  # its retries' warnings would bury the one line
    client = KazooClient(hosts=hosts, timeout=max(wait, 1.0))
    try:
        client.start(timeout=wait)
    except KazooTimeoutError:
        raise config.ConfigError(f"cannot reach ZooKeeper at {hosts} (--cluster {url}) "
                                 f"within {wait:g} s (--zk-wait)") from None
    finally:
        client.stop()
        client.close()
        quiet.setLevel(level)


def setup(service: str, level: str | None) -> None:
    log.configure(service, level)


class Service(Protocol):
    reactor: Reactor
    metrics: Metrics

    def run(self) -> None: ...
    def close(self) -> None: ...


# Allocations between two young-generation collections (CPython's default: 700), for every
# service. A failover rebuilds every task record at once (100,000 at 10k agents): at the
# default the collector took a quarter of the new leader's CPU through the re-registrations;
# in a 10k-agent launch its full collections were 13-16% of the allocator's and the agent
# emulator's CPU (issue 8). The older generations keep their thresholds.
GC_YOUNG_THRESHOLD = 10_000


def serve(shell: Service) -> int:
    """Run a service until SIGTERM/SIGINT, then close it cleanly."""
    stop_on_signals(shell.reactor)
    try:
        shell.run()
    finally:
        shell.close()
    return 0


def main(service: str, options: Sequence[Option], build: Callable[[dict[str, Any]], Service],
         argv: Sequence[str] | None = None, description: str | None = None,
         trace_attributes: Callable[[Any], dict[str, str]] | None = None) -> int:
    """The one `main()` of every service: options from flags, `OFFERBUS_*` and a TOML file
    (checked: exit 2 with a clear line on a bad value), logging, the shell `build(values)`
    makes (a ValueError there is a bad value too), tracing (resource attributes from
    `trace_attributes(shell)`, else the id), then serve until SIGTERM/SIGINT."""
    from services import telemetry

    gc.set_threshold(GC_YOUNG_THRESHOLD, *gc.get_threshold()[1:])
    try:
        values = config.load(service, [*config.COMMON, *options], argv,
                             description=description)
    except config.ConfigError as exc:
        print(f"offerbus-{service}: {exc}", file=sys.stderr)
        return 2
    setup(service, values["log_level"])
    try:
        reach_cluster(values["cluster"], values["zk_wait"])
        shell = build(values)
    except (ValueError, config.ConfigError) as exc:
        print(f"offerbus-{service}: {exc}", file=sys.stderr)
        return 2
    except (OSError, zmq.ZMQError) as exc:  # an address not of this machine, a port taken
        listen, advertise = config.addresses(values)
        print(f"offerbus-{service}: cannot start: {exc} (listening on {listen}, "
              f"advertising {advertise})", file=sys.stderr)
        return 2
    attributes = trace_attributes(shell) if trace_attributes else {"id": str(values["id"])}
    telemetry.setup(f"offerbus-{service}", batch=True, **attributes)
    stalls = StallWatch(shell.metrics, log.get_logger(service))
    stalls.start()
    try:
        return serve(shell)
    finally:
        stalls.stop()
        telemetry.shutdown()  # flush the last spans
