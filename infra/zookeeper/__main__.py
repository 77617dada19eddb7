"""``python -m infra.zookeeper``: start, inspect and stop local ZooKeeper servers
(``make zk-up`` / ``make zk-down``; ``offerbus up`` uses it too)::

    python -m infra.zookeeper start  --dir .run/zk [--ensemble 3] [--port 2181]
    python -m infra.zookeeper status --dir .run/zk
    python -m infra.zookeeper stop   --dir .run/zk

``start`` leaves the server(s) running in the background and writes the connection string
to ``DIR/hosts``.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from infra.zookeeper.server import (
    SERVING_MODES,
    ZooKeeperEnsemble,
    ZooKeeperError,
    ZooKeeperServer,
)


def _cli_servers(directory: Path) -> list[ZooKeeperServer]:
    """The servers the CLI started in ``directory`` (one, or zk1..zkN of an ensemble)."""
    if (directory / "zoo.cfg").exists():
        return [ZooKeeperServer.from_dir(directory)]
    members = sorted(
        (p for p in directory.glob("zk*") if (p / "zoo.cfg").exists()),
        key=lambda p: int(p.name[2:]) if p.name[2:].isdigit() else 0,
    )
    return [ZooKeeperServer.from_dir(p) for p in members]


def _cli_start(directory: Path, ensemble: int, port: int, timeout: float) -> int:
    running = [s for s in _cli_servers(directory) if s.alive()]
    if running:
        hosts = ",".join(s.hosts for s in running)
        ok = all(s.serving() for s in running)
        print(
            f"zookeeper: already running in {directory} at {hosts}"
            f"{'' if ok else ' (not serving yet)'}"
        )
        return 0
    directory.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    servers: list[ZooKeeperServer]
    try:
        if ensemble > 1:
            # Start clean: a leftover single-server layout would confuse `stop`.
            (directory / "zoo.cfg").unlink(missing_ok=True)
            group = ZooKeeperEnsemble(
                directory, ensemble, client_ports=[port + i for i in range(ensemble)]
            )
            servers = group.servers
            group.start(timeout)
            hosts = group.hosts
        else:
            single = ZooKeeperServer(directory, port)
            servers = [single]
            single.start(timeout)
            hosts = single.hosts
    except ZooKeeperError as exc:
        print(f"zookeeper: failed to start in {directory}: {exc}", file=sys.stderr)
        return 1
    for server in servers:
        server.detach()
    (directory / "hosts").write_text(hosts + "\n")
    modes = ", ".join(f"{s.client_port}={s.mode()}" for s in servers)
    print(
        f"zookeeper: up at {hosts} ({modes}) in {time.monotonic() - started:.1f}s; "
        f"logs in {directory}"
    )
    return 0


def _cli_stop(directory: Path) -> int:
    servers = [s for s in _cli_servers(directory) if s.alive()]
    if not servers:
        print(f"zookeeper: nothing running in {directory}")
        return 0
    for server in servers:
        server.stop()
    still = [s for s in servers if s.alive()]
    if still:
        print(f"zookeeper: could not stop {still}", file=sys.stderr)
        return 1
    print(f"zookeeper: stopped {', '.join(s.hosts for s in servers)}")
    return 0


def _cli_status(directory: Path) -> int:
    servers = _cli_servers(directory)
    if not servers:
        print(f"zookeeper: no server configured in {directory}")
        return 3
    code = 0
    for server in servers:
        if not server.alive():
            state, code = "not running", 3
        else:
            state = server.mode() or "running, not serving"
            if state not in SERVING_MODES:
                code = max(code, 1)
        print(f"zookeeper: {server.hosts} pid={server.pid} {state}")
    return code


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m infra.zookeeper",
        description="Run real ZooKeeper (Debian's package) in a directory, in the background.",
    )
    parser.add_argument("action", choices=["start", "stop", "status"])
    parser.add_argument("--dir", type=Path, required=True, help="state directory, e.g. .run/zk")
    parser.add_argument("--ensemble", type=int, default=1, help="number of servers (default 1)")
    parser.add_argument(
        "--port", type=int, default=2181, help="client port (ensemble: first of N; default 2181)"
    )
    parser.add_argument("--timeout", type=float, default=60.0, help="seconds to wait on start")
    args = parser.parse_args(argv)
    directory: Path = args.dir.absolute()
    if args.action == "start":
        return _cli_start(directory, args.ensemble, args.port, args.timeout)
    if args.action == "stop":
        return _cli_stop(directory)
    return _cli_status(directory)


if __name__ == "__main__":
    sys.exit(main())
