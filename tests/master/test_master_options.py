"""The master's agent-loss options: flags and OFFERBUS_MASTER_* variables reach the shell's
config, and a timeout shorter than two heartbeats is refused at start."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from services.master import __main__ as master_main
from services.master.liveness import AGENT_GONE_TIMEOUT_S, AGENT_TIMEOUT_S, MAX_GONE_AGENTS
from services.shell import config


def values(argv: list[str], environ: dict[str, str] | None = None) -> dict[str, Any]:
    return config.load("master", [*config.COMMON, *master_main.OPTIONS], argv,
                       environ=environ or {})


def test_defaults_and_where_they_come_from(tmp_path: Path) -> None:
    v = values(["--cluster", f"file://{tmp_path}"])
    assert (master_main.agent_timeout(v), v["agent_gone_timeout"], v["max_gone_agents"]) == (
        AGENT_TIMEOUT_S, AGENT_GONE_TIMEOUT_S, MAX_GONE_AGENTS) == (5.0, 600.0, 1000)
    v = values(["--cluster", f"file://{tmp_path}", "--agent-gone-timeout", "30"],
               {"OFFERBUS_MASTER_AGENT_TIMEOUT": "2.5", "OFFERBUS_MAX_GONE_AGENTS": "7"})
    assert (v["agent_timeout"], v["agent_gone_timeout"], v["max_gone_agents"]) == (2.5, 30.0, 7)


def test_the_options_reach_the_master_core(tmp_path: Path) -> None:
    shell = master_main.build(values(["--cluster", f"file://{tmp_path}", "--agent-timeout",
                                      "3", "--agent-gone-timeout", "40",
                                      "--max-gone-agents", "9"]))
    try:
        assert shell.reactor.run(until=lambda: shell.core is not None, timeout=10)
        core = shell.core
        assert core is not None
        assert (core.agent_timeout_s, core.agent_gone_timeout_s, core.max_gone_agents) == (
            3.0, 40.0, 9)
    finally:
        shell.close()


def test_the_default_agent_timeout_follows_the_heartbeat(tmp_path: Path) -> None:
    # `offerbus up --heartbeat 5` (and bench.scale at 50,000 agents) started masters that
    # exited at once: the fixed 5 s default was "less than two heartbeats".
    v = values(["--cluster", f"file://{tmp_path}", "--heartbeat", "5"])
    assert master_main.agent_timeout(v) == 25.0  # max_missed (5) beats
    shell = master_main.build(v)
    try:
        assert shell.reactor.run(until=lambda: shell.core is not None, timeout=10)
        assert shell.core is not None and shell.core.agent_timeout_s == 25.0
    finally:
        shell.close()


def test_an_agent_timeout_under_two_heartbeats_is_refused(tmp_path: Path) -> None:
    """(services/shell/process.main turns build()'s ValueError into one line and exit 2.)"""
    with pytest.raises(ValueError, match=r"--agent-timeout 1\.5 s is less than two heartbeats"):
        master_main.build(values(["--cluster", f"file://{tmp_path}", "--heartbeat", "1",
                                  "--agent-timeout", "1.5"]))
