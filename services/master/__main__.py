"""`python -m services.master`: run a master (leader or hot standby)."""

from __future__ import annotations

import argparse
import socket
import sys

from services import telemetry
from services.master.shell import MasterConfig, MasterShell
from services.shell.process import add_cluster_args, serve, setup


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="offerbus-master", description=__doc__)
    add_cluster_args(ap)
    ap.add_argument("--id", default=f"master-{socket.gethostname()}", help="this master's id")
    ap.add_argument("--port", type=int, default=0, help="front port (agents, frameworks)")
    ap.add_argument("--internal-port", type=int, default=0, help="offer-broker, allocator")
    ap.add_argument("--pub-port", type=int, default=0, help="state stream PUB")
    ap.add_argument("--snapshot-port", type=int, default=0, help="state stream snapshots")
    ap.add_argument("--http-port", type=int, default=0, help="/state /metrics /health")
    ap.add_argument("--heartbeat", type=float, default=1.0, help="seconds between beats")
    ap.add_argument("--max-missed", type=int, default=5, help="beats missed before a peer is gone")
    ap.add_argument("--reregister-window", type=float, default=60.0,
                    help="seconds agents have to re-register after a failover")
    args = ap.parse_args(argv)
    setup("master", args.log_level)
    telemetry.setup("offerbus-master", id=args.id)
    try:
        shell = MasterShell(MasterConfig(
            master_id=args.id, election_url=args.cluster, registry_url=args.cluster,
            host=args.host, front_port=args.port, internal_port=args.internal_port,
            pub_port=args.pub_port, snapshot_port=args.snapshot_port, http_port=args.http_port,
            heartbeat_interval=args.heartbeat, max_missed=args.max_missed,
            agent_reregister_window_s=args.reregister_window))
        return serve(shell)
    finally:
        telemetry.shutdown()  # flush the last spans


if __name__ == "__main__":
    sys.exit(main())
