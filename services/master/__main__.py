"""`python -m services.master`: run a master (leader or hot standby)."""

from __future__ import annotations

import socket
import sys
from typing import Any

from services.master.shell import MasterConfig, MasterShell
from services.shell.config import Option
from services.shell.process import main as run_service

OPTIONS = (
    Option("id", default=f"master-{socket.gethostname()}", help="this master's id"),
    Option("port", int, 0, "front port (agents, frameworks, operators)", minimum=0,
           maximum=65535),
    Option("internal_port", int, 0, "internal port (offer-broker, allocator)", minimum=0,
           maximum=65535),
    Option("pub_port", int, 0, "state stream PUB port", minimum=0, maximum=65535),
    Option("snapshot_port", int, 0, "state stream snapshot port", minimum=0, maximum=65535),
    Option("reregister_window", float, 60.0,
           "seconds agents have to re-register after a failover", minimum=0),
)


def build(v: dict[str, Any]) -> MasterShell:
    return MasterShell(MasterConfig(
        master_id=v["id"], election_url=v["cluster"], registry_url=v["cluster"],
        host=v["host"], front_port=v["port"], internal_port=v["internal_port"],
        pub_port=v["pub_port"], snapshot_port=v["snapshot_port"], http_port=v["http_port"],
        heartbeat_interval=v["heartbeat"], max_missed=v["max_missed"],
        agent_reregister_window_s=v["reregister_window"]))


def main(argv: list[str] | None = None) -> int:
    return run_service("master", OPTIONS, build, argv, __doc__)


if __name__ == "__main__":
    sys.exit(main())
