"""`python -m services.broker`: run an offer-broker (leader or hot standby)."""

from __future__ import annotations

import argparse
import socket
import sys

from services import telemetry
from services.broker.core import DEFAULT_OFFER_TIMEOUT_S
from services.broker.shell import BrokerConfig, BrokerShell
from services.shell.process import add_cluster_args, serve, setup


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="offerbus-broker", description=__doc__)
    add_cluster_args(ap)
    ap.add_argument("--id", default=f"broker-{socket.gethostname()}", help="this broker's id")
    ap.add_argument("--port", type=int, default=0, help="ROUTER port the allocator connects to")
    ap.add_argument("--http-port", type=int, default=0, help="/health /metrics")
    ap.add_argument("--offer-timeout", type=float, default=DEFAULT_OFFER_TIMEOUT_S,
                    help="seconds before an unanswered offer is rescinded (0 = never)")
    ap.add_argument("--launch-timeout", type=float, default=60.0,
                    help="seconds a launch may go unanswered (and its tasks unseen on the "
                         "state stream) before it counts as refused")
    ap.add_argument("--heartbeat", type=float, default=1.0, help="seconds between beats")
    ap.add_argument("--max-missed", type=int, default=5, help="beats missed before a peer is gone")
    args = ap.parse_args(argv)
    setup("broker", args.log_level)
    telemetry.setup("offerbus-broker", id=args.id)
    try:
        shell = BrokerShell(BrokerConfig(
            broker_id=args.id, election_url=args.cluster, host=args.host, port=args.port,
            http_port=args.http_port, offer_timeout=args.offer_timeout,
            launch_timeout=args.launch_timeout, heartbeat_interval=args.heartbeat,
            max_missed=args.max_missed))
        return serve(shell)
    finally:
        telemetry.shutdown()  # flush the last spans (rescinds on the way out)


if __name__ == "__main__":
    sys.exit(main())
