"""Job files on a real cluster (ZooKeeper, master, allocator, offer-broker and a job runner,
each with a hot standby, and two agents as separate processes, Docker containers), through
`python -m services.cli`: `job plan` of a 2-instance job places one instance on each agent
and changes nothing; `job run` submits it to the cluster, whose job runner gets both RUNNING
(no framework process on the submitting side); `job run` of the file with 3 instances scales
the running job; another environment is a rolling update (every container replaced); SIGKILL of the
leading job runner leaves the containers running and the standby takes the job over (same
framework, and it scales); `job stop` removes the job and its containers."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from infra.zookeeper import ZooKeeperServer
from services.cli import cluster as local
from services.cli.client import find_leader
from tests.e2e import Cluster, local_cluster_in
from tests.integration.test_service_lifecycle import IMAGE, containers, running_count
from tests.waiting import wait_for

# Host ports apart from other tests' agents; this job publishes none.
AGENT_RESOURCES = "cpus:2;mem:1024;disk:1024;ports:[47100-47199]"
NAME = f"job{uuid.uuid4().hex[:6]}"


def job_file(path: Path, instances: int, image: str = IMAGE, greeting: str = "hello") -> Path:
    path.write_text(f'''name = "{NAME}"
image = "{image}"
command = ["sleep", "3600"]
instances = {instances}
kill_grace = 0.5

[resources]
cpus = 0.05
mem = 16

[env]
GREETING = "{greeting}"
''')
    return path


def cli(cluster: Cluster, *args: str, timeout: float = 240,
        env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "services.cli", "--run-dir",
                           str(cluster.run_dir), *args], capture_output=True, text=True,
                          timeout=timeout, env={**os.environ, "COLUMNS": "200", **(env or {})})


def ok(cluster: Cluster, *args: str, env: dict[str, str] | None = None) -> str:
    out = cli(cluster, *args, env=env)
    assert out.returncode == 0, f"offerbus {' '.join(args)}: {out.stdout}{out.stderr}"
    return out.stdout


@pytest.fixture(scope="module")
def cluster(zk: ZooKeeperServer, zk_admin: Any, tmp_path_factory: pytest.TempPathFactory,
            docker_client: Any, busybox_image: str) -> Iterator[Cluster]:
    with local_cluster_in(zk, zk_admin, tmp_path_factory.mktemp("jobs"), "jobs", agents=2,
                          agent_resources=AGENT_RESOURCES, offer_timeout=10.0,
                          standbys=1) as c:
        wait_for(lambda: len([a for a in c.state()["agents"]
                              if a["status"] == "AGENT_STATUS_REGISTERED"]) == 2,
                 timeout=60, message="two agents registered")
        yield c


def test_plan_run_update_and_stop_a_job(cluster: Cluster, docker_client: Any,
                                        tmp_path: Path) -> None:
    path = job_file(tmp_path / "job.toml", 2)
    plan = json.loads(ok(cluster, "job", "plan", str(path), "--json"))
    assert (plan["name"], plan["want"], plan["live"], plan["unplaced"]) == (NAME, 2, 0, [])
    assert sorted(len(a["new"]) for a in plan["agents"]) == [1, 1], plan  # spread
    assert not [f for f in cluster.state()["frameworks"]
                if f["framework_info"]["name"] == NAME]  # a dry run

    out = ok(cluster, "job", "run", str(path))
    assert f"{NAME}: 2 instances RUNNING" in out, out
    assert running_count(docker_client, NAME) == 2
    # Its framework runs in the cluster (the job runner), not on the submitting side.
    assert not [n for n in local.running(cluster.run_dir) if n.startswith("framework-")]
    (fw,) = [f for f in cluster.state()["frameworks"] if f["framework_info"]["name"] == NAME]
    assert fw["framework_info"]["labels"] == {"offerbus.job": NAME}
    (job,) = [j for j in cluster.state()["jobs"] if j["name"] == NAME]
    assert job["version"] == "1" and job["spec"]["env"] == {"GREETING": "<redacted>"}, job

    out = ok(cluster, "job", "run", str(job_file(path, 3)))
    assert f"{NAME}: 2 -> 3 instances" in out and f"{NAME}: 3 instances RUNNING" in out, out
    wait_for(lambda: running_count(docker_client, NAME) == 3, timeout=60,
             message="3 containers running")
    plan = json.loads(ok(cluster, "job", "plan", str(path), "--json"))
    assert (plan["live"], plan["unplaced"], plan["remove"]) == (3, [], [])
    assert sum(len(a["new"]) for a in plan["agents"]) == 0
    assert sorted(i for a in plan["agents"] for i in a["running"]) == [0, 1, 2]
    # The same plan from a master's HTTP address alone (no run dir, no ZooKeeper).
    http = json.loads(ok(cluster, "status", "--json"))["leaders"]["master"]["http"]
    direct = json.loads(ok(cluster, "--run-dir", str(tmp_path / "none"), "job", "plan",
                           str(path), "--json",
                           env={"OFFERBUS_MASTER": http.removeprefix("http://")}))
    assert direct["agents"] == plan["agents"] and direct["allocator"] == []

    # A rolling update: another environment replaces every instance, one at a time.
    old = {c["Id"] for c in containers(docker_client, NAME) if c["State"] == "running"}
    out = ok(cluster, "job", "run", str(job_file(path, 3, greeting="bonjour")))
    assert "rolling update (env changed)" in out, out
    assert f"{NAME}: 3 instances RUNNING the new spec" in out, out
    wait_for(lambda: running_count(docker_client, NAME) == 3, timeout=60,
             message="3 containers running after the rolling update")
    new = {c["Id"] for c in containers(docker_client, NAME) if c["State"] == "running"}
    assert not old & new, "an instance of the old spec still runs"
    envs = [docker_client.api.inspect_container(c)["Config"]["Env"] for c in new]
    assert all("GREETING=bonjour" in env for env in envs), envs
    (job,) = [j for j in cluster.state()["jobs"] if j["name"] == NAME]
    assert job["version"] == "3", job

    # The leading job runner dies: the containers keep running, the standby takes the job
    # over (the same framework) and scales it.
    before = {c["Id"] for c in containers(docker_client, NAME) if c["State"] == "running"}
    runner = find_leader(cluster.url, 5.0, role="jobs")
    name = local.member_process(cluster.run_dir, runner.member_id)
    assert name is not None
    os.kill(local.running(cluster.run_dir)[name], signal.SIGKILL)
    wait_for(lambda: find_leader(cluster.url, 5.0, role="jobs").member_id != runner.member_id,
             timeout=30, message="the standby job runner leads")
    listed = json.loads(ok(cluster, "job", "list", "--json"))["jobs"]
    assert [(j["name"], j["instances"]) for j in listed] == [(NAME, 3)], listed
    table = ok(cluster, "job", "list")
    assert NAME in table and "1 job(s)" in table, table
    out = ok(cluster, "job", "run", str(job_file(path, 4, greeting="bonjour")))
    assert f"{NAME}: 3 -> 4 instances" in out and f"{NAME}: 4 instances RUNNING" in out, out
    after = {c["Id"] for c in containers(docker_client, NAME) if c["State"] == "running"}
    assert before < after and len(after) == 4, (before, after)  # none was replaced
    (fw2,) = [f for f in cluster.state()["frameworks"] if f["framework_info"]["name"] == NAME]
    assert fw2["framework_info"]["framework_id"] == fw["framework_info"]["framework_id"]

    out = ok(cluster, "job", "stop", NAME)
    assert f"{NAME} stopped" in out
    assert not [f for f in cluster.state()["frameworks"]
                if f["framework_info"]["name"] == NAME]
    assert containers(docker_client, NAME) == []
    assert NAME not in [j["name"] for j in cluster.state()["jobs"]]
    again = cli(cluster, "job", "stop", NAME)
    assert again.returncode == 1 and f"no job {NAME!r}" in again.stdout + again.stderr


def test_the_example_job_file_runs_healthy(cluster: Cluster, docker_client: Any) -> None:
    """frameworks/jobs/web.toml (what the README and the demo suggest) runs both instances
    and they report healthy (its HTTP check once answered 404: a crash loop)."""
    example = Path(__file__).resolve().parents[2] / "frameworks" / "jobs" / "web.toml"
    ok(cluster, "job", "run", str(example))

    def healthy() -> bool:
        tasks = [t for t in cluster.state()["tasks"]
                 if t["task_info"]["task_id"].startswith("web-")
                 and t["status"]["state"] == "TASK_RUNNING"]
        return len(tasks) == 2 and all(t["status"].get("healthy") is True for t in tasks)
    try:
        wait_for(healthy, 60, message="the example job's instances never reported healthy")
        # The job runner learns of them from the state stream, after the master: a moment on.
        listed = lambda: json.loads(ok(cluster, "job", "list", "--json"))["jobs"][0]  # noqa: E731
        wait_for(lambda: listed()["running"] == 2, 20,
                 message=lambda: f"`job list` says {listed()}")
    finally:
        ok(cluster, "job", "stop", "web")
