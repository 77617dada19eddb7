"""`python -m frameworks.jobrunner`: run a job runner (leader or hot standby): it keeps every
job submitted with `offerbus job run FILE` running inside the cluster."""

from __future__ import annotations

import socket
import sys
from typing import Any

from frameworks.jobrunner.shell import FAILOVER_TIMEOUT_S, JobRunnerConfig, JobRunnerShell
from services.shell.config import Option, common_fields
from services.shell.process import main as run_service

OPTIONS = (
    Option("id", default=f"jobs-{socket.gethostname()}", help="this job runner's id"),
    Option("failover_timeout", float, FAILOVER_TIMEOUT_S,
           "seconds a job's tasks outlive its scheduler (every job runner down)",
           minimum=0.0, maximum=365 * 24 * 3600.0),
)


def build(v: dict[str, Any]) -> JobRunnerShell:
    return JobRunnerShell(JobRunnerConfig(
        runner_id=v["id"], election_url=v["cluster"], failover_timeout=v["failover_timeout"],
        **common_fields(v)))


def main(argv: list[str] | None = None) -> int:
    return run_service("jobs", OPTIONS, build, argv, __doc__)


if __name__ == "__main__":
    sys.exit(main())
