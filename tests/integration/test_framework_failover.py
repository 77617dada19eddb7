"""A framework's scheduler process SIGKILLed and started again (issue 10, "framework failover"):
it re-subscribes under its framework id within its failover timeout and keeps its tasks — the
same containers, no instance launched twice — and reconciliation answers for every task."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from infra.zookeeper import ZooKeeperServer
from services.cli import cluster as local_cluster
from services.executor.runtime import LABEL_TASK
from tests.e2e import Cluster, local_cluster_in
from tests.waiting import wait_for

NAME = f"phoenix{uuid.uuid4().hex[:6]}"
INSTANCES = 3


@pytest.fixture
def cluster(zk: ZooKeeperServer, zk_admin: Any, tmp_path: Any, docker_client: Any,
            busybox_image: str) -> Iterator[Cluster]:
    with local_cluster_in(zk, zk_admin, tmp_path, "fw-failover", agents=1,
                          agent_resources="cpus:4;mem:4096;disk:10240;ports:[41200-41299]") as c:
        yield c


def task_containers(docker_client: Any) -> dict[str, str]:
    """task id -> container id, of this service's running tasks"""
    return {c["Labels"][LABEL_TASK]: c["Id"] for c in docker_client.api.containers(
        filters={"label": LABEL_TASK}) if c["Labels"][LABEL_TASK].startswith(f"{NAME}-")}


def frameworks_named(cluster: Cluster) -> list[dict[str, Any]]:
    return [f for f in cluster.state()["frameworks"] if f["framework_info"]["name"] == NAME]


def test_a_restarted_scheduler_keeps_its_framework_and_its_tasks(
    cluster: Cluster, docker_client: Any
) -> None:
    out = subprocess.run([sys.executable, "-m", "services.cli", "--run-dir",
                          str(cluster.run_dir), "run", "--name", NAME, "--image",
                          "offerbus/busybox:latest", "--instances", str(INSTANCES), "--cpus",
                          "0.05", "--mem", "16", "--", "sleep", "3600"],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stdout + out.stderr
    wait_for(lambda: len(task_containers(docker_client)) == INSTANCES, 30,
             message="the instances never ran")
    before = task_containers(docker_client)
    [fw] = frameworks_named(cluster)
    fid = fw["framework_info"]["framework_id"]

    proc = f"framework-{NAME}"
    os.kill(int((cluster.run_dir / "pids" / f"{proc}.pid").read_text()), signal.SIGKILL)
    wait_for(lambda: not any(f.get("connected") for f in frameworks_named(cluster)), 30,
             message="the master never noticed the scheduler was gone")
    local_cluster.respawn(cluster.run_dir, proc)

    # The same framework, connected again; not a second one.
    wait_for(lambda: [(f["framework_info"]["framework_id"], f.get("connected"))
                      for f in frameworks_named(cluster)] == [(fid, True)], 30,
             message=lambda: f"frameworks: {frameworks_named(cluster)}")
    # Reconciliation told the new process about every instance: it reports them RUNNING.
    status = cluster.run_dir / "frameworks" / f"{NAME}.status.json"

    def states() -> dict[str, str]:
        doc = json.loads(status.read_text())
        return {t["task_id"]: t["state"] for t in doc["tasks"].values()}
    wait_for(lambda: states() == {t: "TASK_RUNNING" for t in before}, 30,
             ignore=(OSError, ValueError, KeyError),
             message=lambda: f"the restarted scheduler's view: {states()}")
    # Nothing launched twice, nothing restarted: the very same containers, and only them.
    assert task_containers(docker_client) == before
    master_tasks = {t["task_info"]["task_id"]: t["status"]["state"]
                    for t in cluster.state()["tasks"] if t["framework_id"] == fid}
    assert master_tasks == {t: "TASK_RUNNING" for t in before}
