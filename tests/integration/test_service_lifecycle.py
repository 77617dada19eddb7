"""A service's lifecycle as an operator drives it, on real clusters (ZooKeeper or file
election, master, allocator, offer-broker and an agent as separate processes, Docker
containers), through `python -m services.cli`: `run` twice with one name is refused, `stop`
removes the service and its containers, a 50-instance `run` returns 0 with progress shown,
and clusters side by side (each with its own ZooKeeper, or sharing one): `down` of one
leaves the other's processes and containers."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from infra.zookeeper import ZooKeeperServer
from services.cli import cluster as local_cluster
from services.executor.runtime import LABEL_CLUSTER, LABEL_FRAMEWORK, LABEL_TASK
from services.procs import pid_alive
from tests.e2e import Cluster, local_cluster_in
from tests.waiting import wait_for

IMAGE = "offerbus/busybox:latest"
# Host ports apart from `offerbus up`'s (31000-33999): a `make run` cluster may publish those.
AGENT_RESOURCES = "cpus:4;mem:4096;disk:10240;ports:[41000-41999]"
SMALL = ("--cpus", "0.05", "--mem", "16")
# Service names unique to this run: other tests on this Docker engine may run a "web".
TAG = uuid.uuid4().hex[:6]
WEB, MANY, ALPHA, BETA, LABELLED, LEFT = (f"{n}{TAG}" for n in
                                          ("web", "many", "alpha", "beta", "labelled", "left"))


def cli(cluster: Cluster, *args: str, timeout: float = 240) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "services.cli", "--run-dir",
                           str(cluster.run_dir), *args], capture_output=True, text=True,
                          timeout=timeout, env={**os.environ, "COLUMNS": "200"})


def ok(cluster: Cluster, *args: str, timeout: float = 240) -> str:
    out = cli(cluster, *args, timeout=timeout)
    assert out.returncode == 0, f"offerbus {' '.join(args)}: {out.stdout}{out.stderr}"
    return out.stdout


def containers(docker_client: Any, service: str) -> list[dict[str, Any]]:
    """The containers of a service's tasks (task ids are <service>-<index>-<attempt>), from
    the low-level list (no inspect that fails for a container removed meanwhile)."""
    return [c for c in docker_client.api.containers(all=True, filters={"label": LABEL_TASK})
            if (c.get("Labels") or {}).get(LABEL_TASK, "").startswith(f"{service}-")]


def running_count(docker_client: Any, service: str) -> int:
    return sum(1 for c in containers(docker_client, service) if c.get("State") == "running")


def pids(run_dir: Path) -> dict[str, int]:
    return {p.stem: int(p.read_text()) for p in (run_dir / "pids").glob("*.pid")}


@pytest.fixture(scope="module")
def cluster_a(zk: ZooKeeperServer, zk_admin: Any, tmp_path_factory: pytest.TempPathFactory,
              docker_client: Any, busybox_image: str) -> Iterator[Cluster]:
    with local_cluster_in(zk, zk_admin, tmp_path_factory.mktemp("cluster-a"), "life",
                          agents=1, agent_resources=AGENT_RESOURCES, offer_timeout=10.0) as c:
        yield c


@pytest.fixture(scope="module")
def cluster_b(tmp_path_factory: pytest.TempPathFactory, docker_client: Any,
              busybox_image: str) -> Iterator[Cluster]:
    """A cluster as `offerbus up` makes one: its own ZooKeeper in its run dir."""
    run_dir = tmp_path_factory.mktemp("cluster-b")
    url = local_cluster.up(local_cluster.UpOptions(run_dir=run_dir, agents=1,
                                                   agent_resources=AGENT_RESOURCES,
                                                   offer_timeout=10.0, timeout=60))
    try:
        yield Cluster(url, run_dir)
    finally:
        local_cluster.down(run_dir)


def test_run_twice_is_refused_and_stop_removes_the_service(cluster_a: Cluster,
                                                           docker_client: Any) -> None:
    run = ("run", "--name", WEB, "--image", IMAGE, "--instances", "2", *SMALL, "--",
           "sleep", "3600")
    ok(cluster_a, *run)
    assert running_count(docker_client, WEB) == 2
    # its framework process was forked by the cluster's fork server (`up` waited for it)
    forked = (cluster_a.run_dir / "logs" / "forkserver.log").read_text()
    pid = local_cluster.running(cluster_a.run_dir)[f"framework-{WEB}"]
    assert f"forked name=framework-{WEB} pid={pid} " in forked

    again = cli(cluster_a, *run)
    assert again.returncode == 2, again.stdout + again.stderr
    assert f"offerbus scale {WEB} N" in again.stdout and f"offerbus stop {WEB}" in again.stdout
    assert [f["framework_info"]["name"] for f in cluster_a.state()["frameworks"]] == [WEB]

    out = ok(cluster_a, "stop", WEB, "--timeout", "60")
    assert f"{WEB} stopped" in out
    assert not [f for f in cluster_a.state()["frameworks"]
                if f["framework_info"]["name"] == WEB]
    assert containers(docker_client, WEB) == []
    assert f"framework-{WEB}" not in local_cluster.running(cluster_a.run_dir)
    assert not (cluster_a.run_dir / "frameworks" / f"{WEB}.json").exists()
    # The name is free again; and a stop right after `run --no-wait` leaves nothing
    # running. The framework may register only after stop's first look at the master:
    # stop tore down only what it saw, and that framework's task outlived it (CI failed
    # here about one time in three; repeated to find the race).
    for _ in range(4):
        ok(cluster_a, "run", "--name", WEB, "--image", IMAGE, *SMALL, "--no-wait", "--",
           "sleep", "3600")
        ok(cluster_a, "stop", WEB)
        assert containers(docker_client, WEB) == []
        assert not [f for f in cluster_a.state()["frameworks"]
                    if f["framework_info"]["name"] == WEB]


def test_a_stop_after_the_master_removed_the_framework_still_counts_its_containers(
        cluster_a: Cluster, docker_client: Any) -> None:
    """A first `stop` timed out with containers left (the engine wedged); the master had
    already removed the framework. A second `stop` must not say "its containers gone" while
    the service's containers run: it knows the framework from the service's status file."""
    fid = f"gone-{TAG}"
    frameworks = cluster_a.run_dir / "frameworks"
    frameworks.mkdir(exist_ok=True)
    (frameworks / f"{LEFT}.json").write_text(json.dumps({"name": LEFT}))
    (frameworks / f"{LEFT}.status.json").write_text(json.dumps({"framework_id": fid}))
    left = docker_client.containers.run(
        IMAGE, ["sleep", "3600"], detach=True, name=f"offerbus-{LEFT}",
        labels={LABEL_CLUSTER: cluster_a.state()["cluster_id"], LABEL_FRAMEWORK: fid,
                LABEL_TASK: f"{LEFT}-0-1"})
    try:
        out = cli(cluster_a, "stop", LEFT, "--timeout", "1")
        assert out.returncode == 1, out.stdout + out.stderr
        assert "1 container(s) left" in out.stdout + out.stderr
        assert "containers gone" not in out.stdout
    finally:
        left.remove(force=True)


def test_fifty_instances_return_0_with_progress_shown(cluster_a: Cluster,
                                                       docker_client: Any) -> None:
    out = ok(cluster_a, "run", "--name", MANY, "--image", IMAGE, "--instances", "50",
             *SMALL, "--", "sleep", "3600", timeout=400)
    lines = [ln for ln in out.splitlines() if ln.startswith(f"{MANY}: ")]
    assert len(lines) >= 2, out  # counts shown as they changed
    assert any("pending" in ln or "staging" in ln or "starting" in ln for ln in lines), out
    assert f"{MANY}: 50 instances RUNNING" in out
    assert running_count(docker_client, MANY) == 50
    ok(cluster_a, "stop", MANY, "--timeout", "120")
    assert containers(docker_client, MANY) == []


def test_a_second_cluster_with_its_own_zookeeper_starts_beside_another(
        cluster_b: Cluster, tmp_path: Path) -> None:
    """`offerbus up --run-dir C` while B (its own ZooKeeper too) is up: C gets its own
    ZooKeeper on another port, its own cluster id, and its `down` leaves B serving (runs
    before the test that takes B down)."""
    url = local_cluster.up(local_cluster.UpOptions(run_dir=tmp_path, agents=1,
                                                   agent_resources=AGENT_RESOURCES, timeout=60))
    try:
        c = Cluster(url, tmp_path)
        assert url.split("/")[2] != cluster_b.url.split("/")[2], "one ZooKeeper for both"
        assert c.state()["cluster_id"] != cluster_b.state()["cluster_id"]
    finally:
        local_cluster.down(tmp_path)
    assert [a["status"] for a in cluster_b.state()["agents"]] == ["AGENT_STATUS_REGISTERED"]


def test_down_of_one_cluster_leaves_the_other_running(cluster_a: Cluster, cluster_b: Cluster,
                                                      docker_client: Any) -> None:
    ok(cluster_a, "run", "--name", ALPHA, "--image", IMAGE, *SMALL, "--", "sleep", "3600")
    ok(cluster_b, "run", "--name", BETA, "--image", IMAGE, *SMALL, "--", "sleep", "3600")
    [alpha] = containers(docker_client, ALPHA)
    assert len(containers(docker_client, BETA)) == 1
    a_pids = pids(cluster_a.run_dir)
    # A container of B's left behind by its executor, and one of a cluster nobody here owns
    # (the other engineers' and the demo cluster's share this engine): only B's may go.
    b_id = cluster_b.state()["cluster_id"]
    strays = {owner: docker_client.api.create_container(
        IMAGE, ["sleep", "3600"], labels={LABEL_TASK: f"stray{TAG}-{owner}",
                                          LABEL_CLUSTER: cid})["Id"]
        for owner, cid in (("b", b_id), ("other", f"other-{TAG}"))}
    assert {"master", "allocator", "broker", "agent-1", f"framework-{ALPHA}"} <= set(a_pids)

    out = ok(cluster_b, "down")  # its agent may stop the container first, or `down` does
    assert "cluster down" in out, out
    left = {c["Id"] for c in docker_client.api.containers(all=True, filters={"label": LABEL_TASK})}
    docker_client.api.remove_container(strays["other"], force=True)
    assert strays["other"] in left
    assert strays["b"] not in left, "down left its own cluster's container"
    assert containers(docker_client, BETA) == []
    [still] = containers(docker_client, ALPHA)
    assert still["Id"] == alpha["Id"] and still["State"] == "running"
    assert all(pid_alive(pid) for pid in a_pids.values()), a_pids
    assert [t["status"]["state"] for t in cluster_a.state()["tasks"]
            if t["task_info"]["task_id"].startswith(f"{ALPHA}-")] == ["TASK_RUNNING"]
    ok(cluster_a, "stop", ALPHA)


def test_up_records_the_cluster_id_and_containers_carry_it(cluster_a: Cluster,
                                                           docker_client: Any) -> None:
    cid = cluster_a.state()["cluster_id"]
    assert cid and (cluster_a.run_dir / "cluster.id").read_text().strip() == cid
    ok(cluster_a, "run", "--name", LABELLED, "--image", IMAGE, *SMALL, "--", "sleep", "3600")
    try:
        [c] = containers(docker_client, LABELLED)
        assert c["Labels"][LABEL_CLUSTER] == cid
    finally:
        ok(cluster_a, "stop", LABELLED)
    wait_for(lambda: not containers(docker_client, LABELLED), 30,
             message="the labelled service's container was not removed")


def test_ports_env_role_and_health_reach_the_container_and_the_listings(
        cluster_a: Cluster, docker_client: Any) -> None:
    name = f"ported{TAG}"
    ok(cluster_a, "run", "--name", name, "--image", IMAGE, *SMALL, "--role", "blue",
       "--port", "8080", "--env", "MODE=blue", "--health-cmd", "[ -f /tmp/ok ]",
       "--health-interval", "0.5", "--health-failures", "3", "--",
       "sh", "-c", "echo ok > /tmp/ok; sleep 3600")
    try:
        [c] = containers(docker_client, name)
        inspect = docker_client.api.inspect_container(c["Id"])
        env = dict(e.split("=", 1) for e in inspect["Config"]["Env"])
        [binding] = inspect["HostConfig"]["PortBindings"]["8080/tcp"]
        host_port = int(binding["HostPort"])
        assert 41000 <= host_port <= 41999
        assert env["PORT0"] == env["PORT_8080"] == str(host_port) and env["MODE"] == "blue"
        [task] = [t for t in cluster_a.state()["tasks"]
                  if t["task_info"]["task_id"].startswith(f"{name}-")]
        ports = [r for r in task["task_info"]["resources"] if r["name"] == "ports"]
        assert int(ports[0]["ranges"]["ranges"][0]["begin"]) == host_port

        def health() -> str:
            rows = json.loads(ok(cluster_a, "tasks", "--json"))
            return next(r["health"] for r in rows if r["id"].startswith(f"{name}-"))

        wait_for(lambda: health() == "healthy", 30, message=lambda: f"health: {health()!r}")
        roles = json.loads(ok(cluster_a, "roles", "--json"))
        [blue] = [r for r in roles if r["role"] == "blue"]
        assert task["framework_id"] in blue["frameworks"] and blue["dominant_share"] > 0
    finally:
        ok(cluster_a, "stop", name)


def test_an_instance_failing_its_health_check_is_replaced(cluster_a: Cluster) -> None:
    name = f"sick{TAG}"
    ok(cluster_a, "run", "--name", name, "--image", IMAGE, *SMALL, "--health-cmd", "exit 1",
       "--health-interval", "0.5", "--health-failures", "2", "--no-wait", "--",
       "sleep", "3600")
    try:
        def attempts() -> dict[str, Any]:
            return {t["task_info"]["task_id"]: t["status"] for t in cluster_a.state()["tasks"]
                    if t["task_info"]["task_id"].startswith(f"{name}-0-")}

        wait_for(lambda: f"{name}-0-2" in attempts(), 60,
                 message=lambda: f"no replacement: {attempts()}")
        first = attempts()[f"{name}-0-1"]
        assert first["state"] == "TASK_KILLED", first
        assert first.get("reason") == "REASON_HEALTH_CHECK_FAILED", first
    finally:
        ok(cluster_a, "stop", name)
