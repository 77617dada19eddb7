"""`python -m services.emulator agents|frameworks ...`: run the agent emulator (thousands of
virtual agents on one connection to the real master) or the framework emulator."""

from __future__ import annotations

import math
import sys
from collections.abc import Sequence
from typing import Any

from services.agent.status_updates import RETRY_INITIAL_S
from services.emulator.agents import REGISTER_WINDOW
from services.shell.config import Option, common_fields
from services.shell.process import main as run_service

AGENT_OPTIONS = (
    Option("count", int, 100, "virtual agents", minimum=1, maximum=200_000),
    Option("cpus", float, 4.0, "cpus of each virtual agent", minimum=0.01),
    Option("mem", int, 8192, "memory (MiB) of each virtual agent", minimum=1),
    Option("task_run_s", float, -1.0, "seconds a task runs before TASK_FINISHED unless its "
           "label emulator.run_s says; negative: until killed"),
    Option("window", int, REGISTER_WINDOW, "(re-)registrations outstanding at once",
           minimum=1, maximum=100_000),
    Option("prefix", default="emu", help="virtual agents are named PREFIX-00000, ..."),
    Option("update_retry_s", float, RETRY_INITIAL_S, "first resend of an unacknowledged "
           "status update, then doubling (the real agent's by default)", minimum=0.01),
)


def build_agents(v: dict[str, Any]) -> Any:
    from services.emulator.shell import AgentsConfig, AgentsShell

    run_s = v["task_run_s"]
    return AgentsShell(AgentsConfig(
        cluster_url=v["cluster"], count=v["count"], cpus=v["cpus"], mem=v["mem"],
        task_run_s=run_s if run_s >= 0 else math.inf, window=v["window"],
        prefix=v["prefix"], update_retry_s=v["update_retry_s"], **common_fields(v)))


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    kind = args.pop(0) if args else ""
    if kind == "agents":
        return run_service("emulator_agents", AGENT_OPTIONS, build_agents, args,
                           "The agent emulator: virtual agents speaking the real agent "
                           "protocol to the real master, one connection for all.",
                           lambda shell: {"id": shell.member_id, "agents": str(shell.config.count)})
    if kind == "frameworks":
        from services.emulator.frameworks import main as frameworks_main

        return frameworks_main(args)
    print("usage: python -m services.emulator agents|frameworks [options] (--help)",
          file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
