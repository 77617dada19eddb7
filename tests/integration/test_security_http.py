"""The HTTP token and redacted environments against a live cluster (issue 11): every service
started with OFFERBUS_HTTP_TOKEN answers /state (and /metrics, the dashboard, its events)
only with the token, refuses anything else with a clear 401 that it counts, keeps /health
open, and goes on; the CLI sends the token from its environment; /state and `offerbus tasks
--json` show a task's environment variable names, never their values; the dashboard works in
headless Chromium once opened with ?token=."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import threading
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from frameworks.sdk.driver import SchedulerDriver
from infra.zookeeper import ZooKeeperServer
from schemas import common_pb2
from tests.e2e import Cluster, Recorder, framework, local_cluster_in, sleep_task
from tests.waiting import wait_for

TOKEN = "test-token-7f3a9c2e41b8d605"
SECRET = "p4ssw0rd-never-shown"
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")


def fetch(url: str, token: str | None = None) -> tuple[int, bytes]:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    try:
        with urllib.request.urlopen(urllib.request.Request(url, headers=headers),
                                    timeout=10) as resp:
            return resp.status, resp.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


def unauthorized(metrics: bytes) -> float:
    for line in metrics.decode().splitlines():
        if line.startswith("offerbus_master_http_unauthorized_total"):
            return float(line.split()[-1])
    raise AssertionError("no http_unauthorized counter in /metrics")


def cli(cluster: Cluster, *args: str, token: str | None) -> subprocess.CompletedProcess[str]:
    env = {"COLUMNS": "250", "PATH": "/usr/bin:/bin"}
    if token:
        env["OFFERBUS_HTTP_TOKEN"] = token
    return subprocess.run([sys.executable, "-m", "services.cli", "--cluster", cluster.url,
                           "--run-dir", str(cluster.run_dir), *args],
                          capture_output=True, text=True, timeout=60, env=env)


@pytest.fixture(scope="module")
def cluster(zk: ZooKeeperServer, zk_admin: Any,
            tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("OFFERBUS_HTTP_TOKEN", TOKEN)  # the services (and `up`) inherit it
        with local_cluster_in(zk, zk_admin, tmp_path_factory.mktemp("sec"), "sec", agents=1,
                              runtime="process",
                              agent_resources="cpus:2;mem:1024;disk:1024;ports:[46200-46219]"
                              ) as c:
            yield c


@pytest.fixture(scope="module")
def secret_task(cluster: Cluster) -> Iterator[str]:
    """A running task whose environment holds SECRET."""
    placed = threading.Event()

    def on_offers(driver: SchedulerDriver, offers: list[common_pb2.Offer]) -> None:
        if placed.is_set():
            driver.decline([o.offer_id for o in offers], refuse_seconds=5.0)
            return
        placed.set()
        task = sleep_task("sec-1", offers[0], cpus=0.1, mem=32, command=["sleep", "600"])
        task.command.env["DB_PASSWORD"] = SECRET
        op = common_pb2.Operation()
        op.launch.tasks.append(task)
        driver.accept([offers[0].offer_id], [op])
        if offers[1:]:
            driver.decline([o.offer_id for o in offers[1:]], refuse_seconds=5.0)

    rec = Recorder(on_offers=on_offers)
    driver = SchedulerDriver(rec, framework("sec"), cluster.url)
    driver.start()
    try:
        wait_for(lambda: rec.state_of("sec-1") == common_pb2.TASK_RUNNING, 60,
                 message=lambda: f"the task never ran: {dict(rec.updates)}")
        yield "sec-1"
    finally:
        driver.stop(failover=False)
        driver.join(10)


def test_a_request_without_the_token_is_refused_counted_and_the_cluster_goes_on(
        cluster: Cluster) -> None:
    base = cluster.leader().endpoints["http"]
    before = unauthorized(fetch(base + "/metrics", TOKEN)[1])
    for path in ("/state", "/state/events", "/", "/metrics"):
        status, body = fetch(base + path)
        assert status == 401, (path, status)
        assert b"Authorization: Bearer" in body and b"OFFERBUS_HTTP_TOKEN" in body
    status, body = fetch(base + "/state", "wrong-token-0000000000")
    assert status == 401 and b"wrong bearer token" in body
    status, body = fetch(base + "/health")  # liveness checks need no token
    assert status == 200 and json.loads(body)["leading"] is True
    assert unauthorized(fetch(base + "/metrics", TOKEN)[1]) == before + 5
    status, body = fetch(base + "/state", TOKEN)  # ... and it goes on serving
    assert status == 200 and len(json.loads(body)["agents"]) == 1
    agent = json.loads(body)["agents"][0]
    assert agent["status"] == "AGENT_STATUS_REGISTERED"


def test_the_cli_sends_the_token_from_its_environment(cluster: Cluster) -> None:
    out = cli(cluster, "agents", "--json", token=TOKEN)
    assert out.returncode == 0, out.stderr
    assert len(json.loads(out.stdout)) == 1
    out = cli(cluster, "agents", "--json", token=None)
    said = out.stdout + out.stderr
    assert out.returncode != 0 and "HTTP 401" in said and "OFFERBUS_HTTP_TOKEN" in said


def test_state_and_the_cli_never_show_a_tasks_environment(cluster: Cluster,
                                                         secret_task: str) -> None:
    base = cluster.leader().endpoints["http"]
    status, body = fetch(base + "/state", TOKEN)
    assert status == 200 and SECRET.encode() not in body
    [task] = [t for t in json.loads(body)["tasks"] if t["task_info"]["task_id"] == secret_task]
    assert task["task_info"]["command"]["env"] == {"DB_PASSWORD": "<redacted>"}
    out = cli(cluster, "tasks", "--json", token=TOKEN)
    assert out.returncode == 0, out.stderr
    assert secret_task in out.stdout and SECRET not in out.stdout
    agent_base = json.loads(body)["agents"][0]["agent_info"]["endpoint"]
    status, raw = fetch(agent_base + "/state", TOKEN)  # the agent's own /state too
    assert status == 200 and SECRET.encode() not in raw and b"<redacted>" in raw
    assert fetch(agent_base + "/state")[0] == 401


@pytest.mark.skipif(CHROMIUM is None, reason="chromium is not installed (`make system`)")
def test_the_dashboard_works_once_opened_with_the_token(cluster: Cluster,
                                                        tmp_path: Path) -> None:
    assert CHROMIUM is not None
    base = cluster.leader().endpoints["http"]
    state = json.loads(fetch(base + "/state", TOKEN)[1])
    agent_id = state["agents"][0]["agent_info"]["agent_id"]

    def page(url: str) -> str:
        out = subprocess.run(
            [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
             f"--user-data-dir={tmp_path / 'profile'}", "--timeout=5000", "--dump-dom", url],
            capture_output=True, text=True, timeout=90, env={**os.environ, "HOME": str(tmp_path)})
        return out.stdout

    assert agent_id not in page(base + "/")  # no token: the 401 page
    shown = wait_for(lambda: agent_id in page(f"{base}/?token={TOKEN}") or None, 90,
                     interval=0.5, message="the dashboard never showed the agent")
    assert shown
