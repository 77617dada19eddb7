"""What listing commands print: tables no wider than the terminal (COLUMNS=80, with long ids
and messages), the tasks' HEALTH column, `offerbus roles` from the allocator's /roles JSON,
and `--json` on every listing command."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from rich.console import Console

from schemas import operator_pb2
from services.bus.election import LeaderInfo
from services.cli import main as cli_main
from services.cli import views
from services.resources import Resources

LONG = "x" * 70


def master_state() -> dict[str, Any]:
    res = [{"name": "cpus", "scalar": 4.0}, {"name": "mem", "scalar": 4096.0}]
    agents = [{"agent_info": {"agent_id": f"master-1-{LONG}-S{i}", "hostname": f"agent-{i}",
                              "resources": res,
                              "attributes": [{"name": "rack", "text": "a" * 40}]},
               "used_resources": res[:1], "status": "AGENT_STATUS_REGISTERED"}
              for i in (1, 2)]
    frameworks = [{"framework_info": {"framework_id": f"fw-{LONG}", "name": "web",
                                      "role": "blue"}, "connected": True}]
    tasks = []
    for i, healthy in enumerate((True, False, None)):
        status: dict[str, Any] = {"state": "TASK_RUNNING", "message": "m" * 120}
        if healthy is not None:
            status["healthy"] = healthy
        tasks.append({"framework_id": f"fw-{LONG}", "agent_id": f"master-1-{LONG}-S1",
                      "task_info": {"task_id": f"web-{i}-1-{LONG}", "resources": res},
                      "status": status})
    tasks.append({"framework_id": f"fw-{LONG}", "agent_id": "S1",
                  "task_info": {"task_id": "web-9-1", "resources": res},
                  "status": {"state": "TASK_GONE_BY_OPERATOR"}})
    return {"cluster_id": "c-123", "agents": agents, "frameworks": frameworks,
            "tasks": tasks, "roles": []}


ROLES = {"roles": [
    {"role": "*", "weight": 1.0, "dominant_share": 0.25, "dominant_resource": "cpus",
     "shares": {"cpus": 0.25, "mem": 0.1}, "frameworks": [f"fw-{LONG}", "fw-gone"]},
    {"role": "batch", "weight": 3.0, "dominant_share": 0.5, "dominant_resource": "mem",
     "shares": {"cpus": 0.125, "mem": 0.5}, "frameworks": [],
     "guarantee": {"cpus": 2.0, "mem": 1024.0}, "limit": {"cpus": 4.0}}]}


def render(table: Any, width: int = 80) -> str:
    console = Console(width=width, record=True, file=open(os.devnull, "w"))  # noqa: SIM115
    console.print(table)
    return console.export_text()


@pytest.mark.parametrize("which", ["agents", "frameworks", "tasks", "roles"])
def test_tables_fit_80_columns(which: str) -> None:
    state = master_state()
    table = {"agents": lambda: views.agents_table(state),
             "frameworks": lambda: views.frameworks_table(state),
             "tasks": lambda: views.tasks_table(state, show_all=True),
             "roles": lambda: views.roles_table(ROLES, state)}[which]()
    out = render(table)
    assert max(len(line) for line in out.splitlines()) <= 80, out
    assert which == "roles" or out.count("x") >= len(LONG)  # folded, not cut off


def test_health_column() -> None:
    rows = views.task_rows(master_state())
    assert [r["health"] for r in rows] == ["healthy", "unhealthy", ""]
    out = render(views.tasks_table(master_state()), width=400)
    assert "HEALTH" in out.upper() and "unhealthy" in out


def test_ended_tasks_are_listed_only_with_all() -> None:
    assert "web-9-1" not in [r["id"] for r in views.task_rows(master_state())]
    assert "web-9-1" in [r["id"] for r in views.task_rows(master_state(), show_all=True)]


def test_roles_rendering() -> None:
    rows = views.role_rows(ROLES, master_state())
    assert [r["role"] for r in rows] == ["*", "batch"]
    assert rows[0]["framework_names"] == ["web", "fw-gone"]
    out = render(views.roles_table(ROLES, master_state()), width=200)
    star = next(line for line in out.splitlines() if line.strip().startswith("│ *")
                or line.strip().startswith("* ") or "0.250 (cpus)" in line)
    assert "0.250 (cpus)" in star and "cpus 0.250, mem 0.100" in star and "web" in star
    assert "0.500 (mem)" in out and "3" in out
    assert "guarantee cpus:2;mem:1024" in out and "limit cpus:4" in out
    assert rows[1]["limit"] == {"cpus": 4.0} and rows[0]["guarantee"] == {}


@pytest.fixture
def cli(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Any:
    console = Console(width=80, record=True, file=open(os.devnull, "w"))  # noqa: SIM115
    monkeypatch.setattr(cli_main, "console", console)
    leader = LeaderInfo("master", "master-1", 3, {"http": "http://m:1"})
    monkeypatch.setattr(cli_main, "master_state", lambda url, t: (leader, master_state()))
    monkeypatch.setattr(cli_main, "find_leader", lambda url, t, role="master": LeaderInfo(
        role, f"{role}-1", 2, {"http": f"http://{role}:1"}))
    monkeypatch.setattr(cli_main, "http_get", lambda url, t: ROLES)
    out: list[str] = []

    def run(*argv: str) -> Any:
        buf = open(tmp_path / "out.txt", "w+")  # noqa: SIM115
        console.file = buf
        assert cli_main.main(["--run-dir", str(tmp_path), "--cluster", "file:///x", *argv]) == 0
        buf.seek(0)
        out.append(buf.read())
        return out[-1]

    return run


@pytest.mark.parametrize("command", ["status", "agents", "frameworks", "tasks", "roles"])
def test_every_listing_command_takes_json(cli: Any, command: str) -> None:
    doc = json.loads(cli(command, "--json"))
    if command == "status":
        assert doc["cluster_id"] == "c-123" and doc["leaders"]["master"]["id"] == "master-1"
        assert doc["tasks"] == {"running": 3, "gone_by_operator": 1}
        assert doc["leaders"]["allocator"]["id"] == "allocator-1"
    elif command == "roles":
        assert doc[1]["role"] == "batch" and doc[1]["weight"] == 3.0
    elif command == "tasks":
        assert [t["health"] for t in doc] == ["healthy", "unhealthy", ""]
    else:
        assert len(doc) == {"agents": 2, "frameworks": 1}[command]
    text = cli(command)  # and the human form fits 80 columns
    assert max(len(line) for line in text.splitlines()) <= 80, text


def test_help_fits_and_the_cli_runs_as_a_module() -> None:
    out = subprocess.run([sys.executable, "-m", "services.cli", "tasks", "--help"],
                         capture_output=True, text=True, timeout=60,
                         env={**os.environ, "COLUMNS": "80"})
    assert out.returncode == 0 and "--json" in out.stdout


@pytest.fixture
def calls(cli: Any, monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    """The operator calls the CLI sends; the master's /state has a limit for `eng`."""
    state = master_state()
    state["roles"] = [{"role": "eng", "weight": 1.0, "quota_limit": [
        {"name": "cpus", "scalar": 8.0}]}]
    leader = LeaderInfo("master", "master-1", 3, {"http": "http://m:1"})
    monkeypatch.setattr(cli_main, "master_state", lambda url, t: (leader, state))
    sent: list[Any] = []

    def call(leader: Any, c: Any, timeout: float) -> Any:
        sent.append(c)
        return operator_pb2.OperatorEvent(done=operator_pb2.OperatorEvent.Done(message="ok"))

    monkeypatch.setattr(cli_main, "operator_call", call)
    return sent


def test_roles_quota_sets_what_is_given_and_keeps_the_rest(cli: Any, calls: list[Any]
                                                           ) -> None:
    res = Resources
    cli("roles", "quota", "eng", "--guarantee", "cpus:2;mem:1024")
    q = calls[-1].set_quota
    assert q.role == "eng"
    assert res.from_proto(q.guarantee) == res.of(cpus=2, mem=1024)
    assert res.from_proto(q.limit) == res.of(cpus=8)  # kept as the master has it
    cli("roles", "quota", "eng", "--limit", "")
    assert not calls[-1].set_quota.limit and not calls[-1].set_quota.guarantee
    cli("roles", "quota", "eng/web", "--clear", "--limit", "cpus:4")
    q = calls[-1].set_quota
    assert q.role == "eng/web" and res.from_proto(q.limit) == res.of(cpus=4)
    cli("roles", "quota", "eng", "--limit", "cpus:0")  # a zero limit is sent as such
    assert [(r.name, r.scalar) for r in calls[-1].set_quota.limit] == [("cpus", 0.0)]
    cli("roles", "weight", "eng/web", "2")
    assert calls[-1].set_weight.role == "eng/web" and calls[-1].set_weight.weight == 2


@pytest.mark.parametrize("argv", [("roles", "quota", "eng"),
                                  ("roles", "quota", "eng//x", "--limit", "cpus:1"),
                                  ("roles", "quota", "eng", "--limit", "cpus:x"),
                                  ("roles", "weight", "eng/..", "2")])
def test_roles_quota_and_weight_refuse_bad_input(cli: Any, calls: list[Any],
                                                 tmp_path: Path, argv: tuple[str, ...]
                                                 ) -> None:
    code = cli_main.main(["--run-dir", str(tmp_path), "--cluster", "file:///x", *argv])
    assert code != 0 and not calls
