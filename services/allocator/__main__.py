"""`python -m services.allocator`: run an allocator (leader or hot standby)."""

from __future__ import annotations

import socket
import sys
from typing import Any

from services.allocator.core import DEFAULT_REVOCATION_GRACE_S
from services.allocator.fanout import DEFAULT_MAX_OFFERS_PER_FRAMEWORK
from services.allocator.shell import AllocatorConfig, AllocatorShell
from services.shell.config import Option, common_fields
from services.shell.process import main as run_service

OPTIONS = (
    Option("id", default=f"allocator-{socket.gethostname()}", help="this allocator's id"),
    Option("interval", float, 1.0, "seconds between periodic allocation sweeps",
           minimum=0.01),
    Option("batch", float, 0.05, "at most one event-driven allocation cycle per this many "
           "seconds (the first event after a quiet spell is not kept waiting)",
           minimum=0.0, maximum=10.0),
    Option("revocation_grace", float, DEFAULT_REVOCATION_GRACE_S,
           "seconds a framework above its fair share has to give tasks back before the "
           "master kills them; negative turns revocation off", minimum=-1.0, maximum=3600.0),
    Option("max_offers_per_framework", int, DEFAULT_MAX_OFFERS_PER_FRAMEWORK,
           "agents one framework holds offers on at a time (more once it answers some); "
           "0 = no bound", minimum=0),
)


def build(v: dict[str, Any]) -> AllocatorShell:
    return AllocatorShell(AllocatorConfig(
        allocator_id=v["id"], election_url=v["cluster"], interval=v["interval"],
        batch=v["batch"],
        revocation_grace=None if v["revocation_grace"] < 0 else v["revocation_grace"],
        max_offers_per_framework=v["max_offers_per_framework"],
        **common_fields(v)))


def main(argv: list[str] | None = None) -> int:
    return run_service("allocator", OPTIONS, build, argv, __doc__)


if __name__ == "__main__":
    sys.exit(main())
