"""`python -m services.allocator`: run an allocator (leader or hot standby)."""

from __future__ import annotations

import argparse
import socket
import sys

from services import telemetry
from services.allocator.shell import AllocatorConfig, AllocatorShell
from services.shell.process import add_cluster_args, serve, setup


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="offerbus-allocator", description=__doc__)
    add_cluster_args(ap)
    ap.add_argument("--id", default=f"allocator-{socket.gethostname()}",
                    help="this allocator's id")
    ap.add_argument("--http-port", type=int, default=0, help="/health /metrics /decisions")
    ap.add_argument("--interval", type=float, default=1.0,
                    help="seconds between periodic allocation sweeps")
    ap.add_argument("--batch", type=float, default=0.05,
                    help="seconds events are batched into one allocation cycle")
    ap.add_argument("--heartbeat", type=float, default=1.0, help="seconds between beats")
    ap.add_argument("--max-missed", type=int, default=5, help="beats missed before a peer is gone")
    args = ap.parse_args(argv)
    setup("allocator", args.log_level)
    telemetry.setup("offerbus-allocator", id=args.id)
    try:
        shell = AllocatorShell(AllocatorConfig(
            allocator_id=args.id, election_url=args.cluster, host=args.host,
            http_port=args.http_port, interval=args.interval, batch=args.batch,
            heartbeat_interval=args.heartbeat, max_missed=args.max_missed))
        return serve(shell)
    finally:
        telemetry.shutdown()  # flush the last spans


if __name__ == "__main__":
    sys.exit(main())
