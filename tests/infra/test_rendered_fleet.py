"""The rollout's rendered configuration files start a working cluster: an inventory with the
services on distinct loopback addresses (127.0.0.2-4, each bound and advertised), rendered by
infra/inventory.py, each service (the job runner too) started as the units start it
(`python -m MODULE --config FILE`, services/procs.py), against the tests' ZooKeeper. The
leaders advertise their own host's address and the agent registers under its inventory
name. (The SSH half of the rollout is tested in test_inventory.py without contacting any
host: no sshd here.)"""

from __future__ import annotations

import socket
import subprocess
import sys
import uuid
from collections.abc import Iterator
from functools import partial
from pathlib import Path
from typing import Any

import pytest

from infra import inventory
from infra.rollout import REPO
from services.cli.client import http_get
from services.procs import service_module
from tests.e2e import leader_of, stop_processes
from tests.waiting import wait_for

pytestmark = pytest.mark.integration


def _free_port() -> int:
    """A free port in the tests' range (41000-49999)."""
    for port in range(41000 + uuid.uuid4().int % 8000, 49999):
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.2", port))
            except OSError:
                continue
            return port
    raise AssertionError("no free port")


@pytest.fixture
def fleet(zk: Any, zk_admin: Any, tmp_path: Path) -> Iterator[tuple[inventory.Inventory, Path]]:
    chroot = f"/rendered-{uuid.uuid4().hex[:8]}"
    zk_admin.create(chroot)
    text = f"""
curve = false  # the keyed rendering points at /etc/offerbus/keys (test_inventory.py)
[cluster]
chroot = "{chroot}"
zk_client_port = {zk.hosts.rpartition(":")[2]}
[services]
log_level = "DEBUG"
[services.master]
http_port = {_free_port()}
[services.agent]
runtime = "process"
resources = "cpus:2;mem:512"
[[host]]
name = "zk-1"
address = "127.0.0.1"
roles = ["zookeeper"]
[[host]]
name = "master-1"
address = "127.0.0.2"
roles = ["master"]
[[host]]
name = "sched-1"
address = "127.0.0.3"
roles = ["allocator", "broker", "jobs"]
[[host]]
name = "worker-1"
address = "127.0.0.4"
roles = ["agent"]
[host.agent]
attributes = "rack:r1"
"""
    inv = inventory.parse(text, "fleet.toml")
    assert inventory.check_configs(inv) == []
    procs: list[subprocess.Popen[bytes]] = []
    try:
        for host in inv.hosts[1:]:
            path = tmp_path / f"{host.name}.toml"
            path.write_text(inventory.service_config(inv, host))
            for role in host.roles:
                extra = ["--work-dir", str(tmp_path / "agent")] if role == "agent" else []
                with open(tmp_path / f"{host.name}-{role}.log", "wb") as log:
                    procs.append(subprocess.Popen(
                        [sys.executable, "-m", service_module(role), "--config", str(path),
                         *extra], cwd=REPO, stdout=log, stderr=subprocess.STDOUT))
        yield inv, tmp_path
    finally:
        stop_processes(procs)


def test_rendered_configs_start_a_cluster_on_distinct_addresses(
        fleet: tuple[inventory.Inventory, Path]) -> None:
    inv, logs = fleet
    url = inv.cluster_url()

    def logs_tail() -> str:
        return "\n".join(f"== {p.name}\n{p.read_text()[-1500:]}" for p in logs.glob("*.log"))

    for role, address in (("master", "127.0.0.2"), ("allocator", "127.0.0.3"),
                          ("broker", "127.0.0.3"), ("jobs", "127.0.0.3")):
        leader = wait_for(partial(leader_of, url, role, timeout=1.0), 60,
                          message=f"no {role} leader (logs under {logs})",
                          ignore=(AssertionError,))
        assert leader.member_id == ("master-1" if role == "master" else f"{role}-sched-1")
        assert all(f"//{address}:" in e for e in leader.endpoints.values()), leader.endpoints
    master = leader_of(url, "master")
    assert master.endpoints["http"].endswith(f":{inv.services['master']['http_port']}")

    def registered() -> list[dict[str, Any]]:
        state = http_get(master.endpoints["http"] + "/state", 2.0)
        return [a for a in state.get("agents", [])
                if a.get("status") == "AGENT_STATUS_REGISTERED"]
    agents = wait_for(registered, 60, message=lambda: f"no agent registered\n{logs_tail()}")
    info = [a["agent_info"] for a in agents]
    assert [(i.get("hostname"), i.get("address")) for i in info] == [("worker-1", "127.0.0.4")]
    assert info[0]["attributes"] == [{"name": "rack", "text": "r1"}]  # the host's own option
