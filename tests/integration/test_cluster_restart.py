"""A machine restart under a local cluster: every process of the run dir is gone (SIGKILL)
and so are its containers, while the run dir and ZooKeeper's data stay. `offerbus up`
brings the services back from the registry, and `offerbus run` with the service's name
(what `make run` does again) resumes the service whose framework process is gone: the new
process fails over with the framework's id and its instances run again. Before, `run`
refused the name as in use and the service stayed down, with `make run` reporting success."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

import pytest

from infra.zookeeper import ZooKeeperServer
from schemas import operator_pb2
from services.cli import cluster as local_cluster
from services.cli.client import master_state, operator_call
from services.executor.runtime import LABEL_CLUSTER
from services.procs import cmdline
from tests.e2e import Cluster, local_cluster_in
from tests.waiting import wait_for

NAME = f"again{uuid.uuid4().hex[:6]}"  # one per run; each test has its own cluster


def cli(cluster: Cluster, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "services.cli", "--run-dir",
                           str(cluster.run_dir), *args], capture_output=True, text=True,
                          timeout=180, env={**os.environ, "COLUMNS": "200"})


def running(cluster: Cluster) -> int:
    return sum(1 for t in cluster.state()["tasks"]
               if t["task_info"]["task_id"].startswith(f"{NAME}-")
               and t["status"]["state"] == "TASK_RUNNING")


def power_off(run_dir: Path, cluster_id: str, docker_client: Any) -> int:
    """What a machine restart does to the cluster: its processes (those in its pid files,
    and every one whose command line names the run dir: agents' executors) and its
    containers are gone. Returns how many processes."""
    pids = {pid for pid in local_cluster.running(run_dir).values()}
    pids |= {int(e) for e in os.listdir("/proc") if e.isdigit() and int(e) != os.getpid()
             and any(str(run_dir) in arg for arg in cmdline(int(e)))}
    killed = 0
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
            killed += 1
        except ProcessLookupError:
            pass
    for c in docker_client.containers.list(filters={"label": f"{LABEL_CLUSTER}={cluster_id}"}):
        c.kill()
    return killed


@pytest.mark.parametrize("removed", [False, True], ids=["framework-kept", "framework-removed"])
def test_run_again_after_a_machine_restart_resumes_the_service(
        zk: ZooKeeperServer, zk_admin: Any, tmp_path: Path, docker_client: Any,
        busybox_image: str, removed: bool) -> None:
    """framework-removed: the master removed the framework while it was down (its failover
    timeout passed, here an operator's teardown): the resumed process registers anew."""
    with local_cluster_in(zk, zk_admin, tmp_path / "run", "restart", agents=1,
                          agent_resources="cpus:2;mem:1024;disk:1024;ports:[42200-42299]"
                          ) as c:
        run = ["run", "--name", NAME, "--image", busybox_image, "--instances", "2",
               "--cpus", "0.05", "--mem", "16", "--timeout", "90", "--", "sleep", "3600"]
        first = cli(c, *run)
        assert first.returncode == 0, first.stdout + first.stderr
        cluster_id = c.state()["cluster_id"]
        assert power_off(c.run_dir, cluster_id, docker_client) >= 5
        wait_for(lambda: not docker_client.containers.list(
            filters={"label": f"{LABEL_CLUSTER}={cluster_id}"}), 30,
            message="the cluster's containers are still running")
        local_cluster.up(local_cluster.UpOptions(
            run_dir=c.run_dir, cluster_url=c.url, agents=1, timeout=60,
            agent_resources="cpus:2;mem:1024;disk:1024;ports:[42200-42299]"))
        (fw,) = [f for f in c.state()["frameworks"] if f["framework_info"]["name"] == NAME]
        if removed:
            call = operator_pb2.OperatorCall()
            call.teardown_framework.framework_id = fw["framework_info"]["framework_id"]
            leader, _ = master_state(c.url)
            operator_call(leader, call)
        again = cli(c, *run)
        assert again.returncode == 0, again.stdout + again.stderr
        assert "resum" in again.stdout, again.stdout
        # forked by the new fork server (`up` removed the killed one's socket, then waited)
        forked = (c.run_dir / "logs" / "forkserver.log").read_text()
        assert forked.count(f"forked name=framework-{NAME} ") == 2, forked
        wait_for(lambda: running(c) == 2 and len(docker_client.containers.list(
            filters={"label": f"{LABEL_CLUSTER}={cluster_id}"})) == 2, 60,
            message=lambda: cli(c, "tasks").stdout)
        (fw,) = [f for f in c.state()["frameworks"]
                 if f["framework_info"]["name"] == NAME]
        assert fw.get("connected") is True  # the same framework, failed over
