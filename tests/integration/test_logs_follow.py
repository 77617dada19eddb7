"""`offerbus logs -f` on a real cluster (process and Docker runtimes): a task printing a line
every 0.2 s is followed by the CLI as a subprocess, which prints every line once, in order, and
exits 0 after the task ends."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import pytest

from infra.zookeeper import ZooKeeperServer
from tests.e2e import Cluster, S, local_cluster_in, sleep_task
from tests.integration.test_offer_path import one_shot, stop
from tests.waiting import wait_for

LINES = 15


@pytest.fixture(scope="module", params=["process", "docker"])
def cluster(request: pytest.FixtureRequest, zk: ZooKeeperServer, zk_admin: Any,
            tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    if request.param == "docker":
        request.getfixturevalue("busybox_image")  # skips when Docker is not there
    with local_cluster_in(zk, zk_admin, tmp_path_factory.mktemp("cluster"), "logsf", agents=1,
                          agent_resources="cpus:2;mem:2048;disk:1024;ports:[31000-31099]",
                          runtime=request.param) as c:
        yield c


def test_logs_follow_prints_every_line_once_and_exits_after_the_task(cluster: Cluster) -> None:
    script = f"for i in $(seq 1 {LINES}); do echo line $i; sleep 0.2; done"
    rec, driver = one_shot(cluster, "ticker", lambda o: sleep_task(
        "ticker", o, command=["sh", "-c", script]))
    try:
        wait_for(lambda: rec.state_of("ticker") == S.TASK_RUNNING, 60,
                 message=lambda: f"states: {[u.state for u in rec.updates['ticker']]}")
        follow = subprocess.Popen(
            [sys.executable, "-m", "services.cli", "--cluster", cluster.url, "--run-dir",
             str(cluster.run_dir), "logs", "-f", "ticker"],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, env={"PATH": "/usr/bin:/bin"})
        try:
            out, err = follow.communicate(timeout=60)
        finally:
            if follow.poll() is None:
                follow.kill()
                follow.wait(10)
        assert follow.returncode == 0, err.decode()
        wait_for(lambda: rec.state_of("ticker") == S.TASK_FINISHED, 10,
                 message=lambda: f"states: {[u.state for u in rec.updates['ticker']]}")
        assert out.decode().splitlines() == [f"line {i}" for i in range(1, LINES + 1)]
    finally:
        stop(driver)
