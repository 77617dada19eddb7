"""`python -m services.allocator`: run an allocator (leader or hot standby)."""

from __future__ import annotations

import socket
import sys
from typing import Any

from services.allocator.shell import AllocatorConfig, AllocatorShell
from services.shell.config import Option
from services.shell.process import main as run_service

OPTIONS = (
    Option("id", default=f"allocator-{socket.gethostname()}", help="this allocator's id"),
    Option("interval", float, 1.0, "seconds between periodic allocation sweeps",
           minimum=0.01),
    Option("batch", float, 0.05, "seconds events are batched into one allocation cycle",
           minimum=0.0, maximum=10.0),
)


def build(v: dict[str, Any]) -> AllocatorShell:
    return AllocatorShell(AllocatorConfig(
        allocator_id=v["id"], election_url=v["cluster"], host=v["host"],
        http_port=v["http_port"], interval=v["interval"], batch=v["batch"],
        heartbeat_interval=v["heartbeat"], max_missed=v["max_missed"]))


def main(argv: list[str] | None = None) -> int:
    return run_service("allocator", OPTIONS, build, argv, __doc__)


if __name__ == "__main__":
    sys.exit(main())
