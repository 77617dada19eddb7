"""`python -m services.agent`: run the agent of this machine."""

from __future__ import annotations

import socket
import sys
from pathlib import Path
from typing import Any

from services.agent.shell import AgentConfig, AgentShell, detect_resources
from services.shell.config import Option
from services.shell.process import main as run_service

OPTIONS = (
    Option("work_dir", required=True,
           help="checkpoints, status updates and sandboxes (keep across restarts)"),
    Option("resources", help='e.g. "cpus:4;mem:8192;disk:10240;ports:[31000-32000]" '
                             "(default: detected)"),
    Option("attributes", default="", help='e.g. "rack:a;zone:eu-1"'),
    Option("hostname", default=socket.gethostname(), help="the name frameworks see"),
    Option("runtime", default="docker", help="how tasks run", choices=("docker", "process")),
)


def build(v: dict[str, Any]) -> AgentShell:
    return AgentShell(AgentConfig(
        cluster_url=v["cluster"], work_dir=Path(v["work_dir"]),
        resources=v["resources"] or detect_resources(), attributes=v["attributes"],
        hostname=v["hostname"], host=v["host"], http_port=v["http_port"],
        runtime=v["runtime"], heartbeat_interval=v["heartbeat"], max_missed=v["max_missed"]))


def trace_attributes(shell: AgentShell) -> dict[str, str]:
    # After the shell is built (its agent id recovered); the fork server it started is a
    # fresh interpreter, so the exporter threads started here never reach an executor.
    return {"agent_id": shell.core.agent_id, "hostname": shell.config.hostname}


def main(argv: list[str] | None = None) -> int:
    return run_service("agent", OPTIONS, build, argv, __doc__, trace_attributes)


if __name__ == "__main__":
    sys.exit(main())
