"""The systemd units in infra/systemd/ pass `systemd-analyze verify` once installed under a
prefix (the rollout's rendering), and keep the properties docs/OPERATIONS.md relies on."""

from __future__ import annotations

import configparser
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from infra import inventory
from infra.rollout import REPO
from services.procs import SERVICE_MODULES, service_module

ANALYZE = shutil.which("systemd-analyze")
needs_analyze = pytest.mark.skipif(ANALYZE is None,
                                   reason="systemd-analyze is not installed on this machine")


def _unit(role: str) -> configparser.ConfigParser:
    parser = configparser.ConfigParser(strict=False, interpolation=None)
    parser.optionxform = str  # type: ignore[assignment,method-assign]
    parser.read_string(inventory.unit(role, "/opt/offerbus"))
    return parser


def _install(tmp_path: Path) -> tuple[Path, list[Path]]:
    """The units rendered for a prefix under tmp_path whose venv python exists."""
    prefix = tmp_path / "prefix"
    (prefix / "venv" / "bin").mkdir(parents=True)
    os.symlink(sys.executable, prefix / "venv" / "bin" / "python")
    units = tmp_path / "units"
    units.mkdir()
    paths = []
    for role in inventory.ROLES:
        path = units / f"offerbus-{role}.service"
        path.write_text(inventory.unit(role, str(prefix)))
        paths.append(path)
    return prefix, paths


def _verify(paths: list[Path]) -> subprocess.CompletedProcess[str]:
    assert ANALYZE is not None
    return subprocess.run([ANALYZE, "verify", "--man=no", *map(str, paths)],
                          capture_output=True, text=True, timeout=60, check=False)


@needs_analyze
def test_every_unit_verifies(tmp_path: Path) -> None:
    prefix, paths = _install(tmp_path)
    if not Path("/usr/bin/java").exists():
        paths = [p for p in paths if "zookeeper" not in p.name]  # its ExecStart needs java
    done = _verify(paths)
    assert done.returncode == 0 and not done.stderr.strip(), done.stderr
    assert str(prefix) in paths[1].read_text()


@needs_analyze
def test_verify_catches_a_broken_unit(tmp_path: Path) -> None:
    """The check above can fail: a misspelt directive and a missing binary are reported."""
    _, paths = _install(tmp_path)
    broken = paths[1].read_text().replace("Restart=on-failure", "Restart=on-failur")
    paths[1].write_text(broken.replace("RestartSec=3", "RestartSecs=3"))
    done = _verify([paths[1]])
    assert "RestartSecs" in done.stderr and "on-failur" in done.stderr
    uninstalled = tmp_path / "units" / "offerbus-agent.service"
    uninstalled.write_text(inventory.unit("agent", str(tmp_path / "nowhere")))
    assert "is not executable" in _verify([uninstalled]).stderr


@pytest.mark.parametrize("role", inventory.ROLES)
def test_units_restart_with_a_limit_and_run_unprivileged(role: str) -> None:
    unit = _unit(role)
    service = unit["Service"]
    assert service["Restart"] == "on-failure"
    assert float(service["RestartSec"]) >= 1
    assert int(unit["Unit"]["StartLimitBurst"]) > 0
    assert service["User"] == inventory.USER
    assert service["NoNewPrivileges"] == "yes"
    assert service["ProtectSystem"] in ("full", "strict")
    assert "network-online.target" in unit["Unit"]["After"]
    if role != "zookeeper":
        assert service["ExecStart"] == (f"/opt/offerbus/venv/bin/python -m "
                                        f"{service_module(role)} --config {inventory.CONFIG_PATH}")
        assert service["RestartPreventExitStatus"] == "2"  # a configuration error
        # Spans kept under its state directory, served at /traces (`offerbus trace`).
        text = inventory.unit(role, "/opt/offerbus")
        assert (f"Environment=OFFERBUS_TRACES_DIR=/var/lib/{service['StateDirectory']}/traces"
                in text.splitlines())


def test_the_agent_leaves_its_executors_running() -> None:
    unit = _unit("agent")
    assert unit["Service"]["KillMode"] == "process"
    assert "docker" in unit["Service"]["SupplementaryGroups"].split()
    assert "docker.service" in unit["Unit"]["After"]
    assert "docker.service" in unit["Unit"]["Wants"]
    for role in ("master", "allocator", "broker", "jobs"):
        assert _unit(role)["Service"].get("KillMode", "control-group") == "control-group"


def test_every_service_role_has_a_unit_and_the_image_runs_its_module() -> None:
    """The units and the service image's entrypoint name the module services/procs.py gives
    each role (the one place that says it), and every service role the rollout knows has one."""
    assert set(inventory.SERVICE_ROLES) == set(SERVICE_MODULES)
    entrypoint = (REPO / "infra" / "entrypoint.sh").read_text()
    for role in inventory.SERVICE_ROLES:
        assert (inventory.UNIT_DIR / f"offerbus-{role}.service").exists()
        module = service_module(role)
        plain = module == f"services.{role}"
        run = 'exec python -m "services.$role"' if plain else f"exec python -m {module} "
        assert run in entrypoint, role
        if not plain:
            assert f"\n  {role}) {run}" in entrypoint
        assert f"{role}|" in entrypoint.split("case")[1]  # taken as the first argument
