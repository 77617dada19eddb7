"""`python -m services.agent`: run the agent of this machine."""

from __future__ import annotations

import socket
import sys
from pathlib import Path
from typing import Any

from services.agent.shell import AgentConfig, AgentShell, detect_resources
from services.container_policy import parse_allowed
from services.shell.config import Option, common_fields
from services.shell.process import main as run_service


def _check_allowed(text: str) -> None:
    parse_allowed(text)  # ValueError for a relative path


OPTIONS = (
    Option("work_dir", required=True,
           help="checkpoints, status updates and sandboxes (keep across restarts)"),
    Option("resources", help='e.g. "cpus:4;mem:8192;disk:10240;ports:[31000-32000]" '
                             "(default: detected)"),
    Option("attributes", default="", help='e.g. "rack:a;zone:eu-1"'),
    Option("hostname", default=socket.gethostname(), help="the name frameworks see"),
    Option("runtime", default="docker", help="how tasks run", choices=("docker", "process")),
    Option("allowed_host_paths", default="", check=_check_allowed,
           help="host path prefixes tasks may bind into their containers, separated by ':' "
                "(e.g. /srv/data:/var/cache/shared); anything else is refused"),
)


def build(v: dict[str, Any]) -> AgentShell:
    return AgentShell(AgentConfig(
        cluster_url=v["cluster"], work_dir=Path(v["work_dir"]),
        resources=v["resources"] or detect_resources(), attributes=v["attributes"],
        hostname=v["hostname"], runtime=v["runtime"],
        allowed_host_paths=v["allowed_host_paths"], **common_fields(v)))


def trace_attributes(shell: AgentShell) -> dict[str, str]:
    # After the shell is built (its agent id recovered); the fork server it started is a
    # fresh interpreter, so the exporter threads started here never reach an executor.
    return {"agent_id": shell.core.agent_id, "hostname": shell.config.hostname}


def main(argv: list[str] | None = None) -> int:
    return run_service("agent", OPTIONS, build, argv, __doc__, trace_attributes)


if __name__ == "__main__":
    sys.exit(main())
