"""`python -m services.master`: run a master (leader or hot standby)."""

from __future__ import annotations

import socket
import sys
from typing import Any

from services.master.liveness import AGENT_GONE_TIMEOUT_S, AGENT_TIMEOUT_S, MAX_GONE_AGENTS
from services.master.shell import MasterConfig, MasterShell
from services.shell.config import Option, common_fields
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
    Option("agent_timeout", float, 0.0,
           "seconds an agent may be silent (no heartbeat, no call) before it is declared "
           "unreachable and its tasks TASK_UNREACHABLE (0: max_missed heartbeats, "
           f"{AGENT_TIMEOUT_S:g} s at the defaults)", minimum=0, maximum=86400),
    Option("agent_gone_timeout", float, AGENT_GONE_TIMEOUT_S,
           "seconds an agent may stay unreachable before it is declared gone (its tasks "
           "TASK_GONE, its id refused)", minimum=0.05, maximum=365 * 86400),
    Option("max_gone_agents", int, MAX_GONE_AGENTS,
           "gone agents remembered in the registry (the oldest are forgotten first)",
           minimum=0, maximum=1_000_000),
    Option("acl_file", default="",
           help="a TOML file mapping principals (the names of the CURVE keys in "
                "curve_allowed_dir) to the roles and operator actions they may use "
                "(services/master/acl.py); needs CURVE (\"\": no ACL)"),
)


def agent_timeout(v: dict[str, Any]) -> float:
    """The agent timeout set, else as many heartbeats as a peer may miss (Paranoid Pirate)."""
    return float(v["agent_timeout"] or v["heartbeat"] * v["max_missed"])


def build(v: dict[str, Any]) -> MasterShell:
    timeout = agent_timeout(v)
    if timeout < 2 * v["heartbeat"]:
        raise ValueError(f"--agent-timeout {timeout:g} s is less than two heartbeats "
                         f"(--heartbeat {v['heartbeat']:g} s): agents would be declared "
                         "unreachable between two beats")
    return MasterShell(MasterConfig(
        master_id=v["id"], election_url=v["cluster"], registry_url=v["cluster"],
        front_port=v["port"], internal_port=v["internal_port"],
        pub_port=v["pub_port"], snapshot_port=v["snapshot_port"],
        agent_reregister_window_s=v["reregister_window"], agent_timeout_s=timeout,
        agent_gone_timeout_s=v["agent_gone_timeout"], max_gone_agents=v["max_gone_agents"],
        acl_file=v["acl_file"],
        **common_fields(v)))


def main(argv: list[str] | None = None) -> int:
    return run_service("master", OPTIONS, build, argv, __doc__)


if __name__ == "__main__":
    sys.exit(main())
