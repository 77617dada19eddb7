"""`python -m services.agent`: run the agent of this machine."""

from __future__ import annotations

import argparse
import socket
import sys
from pathlib import Path

from services import telemetry
from services.agent.shell import AgentConfig, AgentShell, detect_resources
from services.shell.process import add_cluster_args, serve, setup


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="offerbus-agent", description=__doc__)
    add_cluster_args(ap)
    ap.add_argument("--work-dir", type=Path, required=True,
                    help="checkpoints, status updates and sandboxes (keep across restarts)")
    ap.add_argument("--resources", default=None,
                    help='e.g. "cpus:4;mem:8192;disk:10240;ports:[31000-32000]" '
                         f"(default: detected, {detect_resources()})")
    ap.add_argument("--attributes", default="", help='e.g. "rack:a;zone:eu-1"')
    ap.add_argument("--hostname", default=socket.gethostname())
    ap.add_argument("--http-port", type=int, default=0)
    ap.add_argument("--runtime", choices=["docker", "process"], default="docker")
    ap.add_argument("--heartbeat", type=float, default=1.0)
    ap.add_argument("--max-missed", type=int, default=5)
    args = ap.parse_args(argv)
    setup("agent", args.log_level)
    try:
        shell = AgentShell(AgentConfig(
            cluster_url=args.cluster, work_dir=args.work_dir,
            resources=args.resources or detect_resources(), attributes=args.attributes,
            hostname=args.hostname, host=args.host, http_port=args.http_port,
            runtime=args.runtime, heartbeat_interval=args.heartbeat,
            max_missed=args.max_missed))
    except ValueError as exc:
        print(f"offerbus-agent: {exc}", file=sys.stderr)
        return 2
    # After the shell is built (its agent id recovered); the fork server it started is a
    # fresh interpreter, so the exporter threads started here never reach an executor.
    telemetry.setup("offerbus-agent", agent_id=shell.core.agent_id, hostname=args.hostname)
    try:
        return serve(shell)
    finally:
        telemetry.shutdown()


if __name__ == "__main__":
    sys.exit(main())
