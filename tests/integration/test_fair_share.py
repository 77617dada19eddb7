"""Fair sharing on a live cluster (ZooKeeper, master, allocator, offer-broker and an agent as
separate processes, Docker containers), driven as an operator does, through the CLI:

- the DRF paper's example (one agent of 9 CPUs and 18 GB; greedy services A of <1 CPU, 4 GB>
  and B of <3 CPUs, 1 GB>, each wanting 10 instances) ends with A 3 and B 2, whichever
  service starts first: the one that came first gives a task back (REASON_TASK_REVOKED).
  CPUs are scaled by 1/10 (0.9 CPUs, tasks of 0.1 and 0.3): Docker refuses a container more
  CPUs than the machine has, and shares are ratios, so the allocation is the same;
- with role weights 2:1 (`offerbus roles weight`), the weighted DRF allocation, as an
  independent progressive filling computes it;
- a framework that sits on offers for every agent and answers none does not delay another
  framework's first task (before: the offer timeout, here set to 60 s)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from frameworks.sdk.driver import SchedulerDriver
from infra.zookeeper import ZooKeeperServer
from services.resources import Resources
from tests.e2e import Cluster, Recorder, framework, local_cluster_in
from tests.fairness import A_TASK, B_TASK, GB, progressive_filling
from tests.waiting import wait_for

TAG = uuid.uuid4().hex[:6]
OFFER_TIMEOUT = 60.0  # what a sitting framework would make others wait, without reclaims
CPU_SCALE = 0.1  # Docker refuses a container more CPUs than the machine has


def scaled(task: Resources) -> Resources:
    return Resources.of(cpus=task.scalar("cpus") * CPU_SCALE, mem=task.scalar("mem"))


def cli(cluster: Cluster, *args: str, timeout: float = 120) -> str:
    out = subprocess.run([sys.executable, "-m", "services.cli", "--run-dir",
                          str(cluster.run_dir), *args], capture_output=True, text=True,
                         timeout=timeout, env={**os.environ, "COLUMNS": "200"})
    assert out.returncode == 0, f"offerbus {' '.join(args)}: {out.stdout}{out.stderr}"
    return out.stdout


def run(cluster: Cluster, name: str, role: str, task: Resources, instances: int) -> None:
    cli(cluster, "run", "--name", name, "--role", role, "--instances", str(instances),
        "--cpus", f"{task.scalar('cpus'):g}", "--mem", f"{task.scalar('mem'):g}",
        "--image", "offerbus/busybox:latest", "--no-wait", "--", "sleep", "3600")


def running(cluster: Cluster, *names: str) -> tuple[int, ...]:
    tasks = cluster.state()["tasks"]
    return tuple(sum(1 for t in tasks if t["task_info"]["task_id"].startswith(f"{n}-")
                     and t["status"]["state"] == "TASK_RUNNING") for n in names)


def revoked(cluster: Cluster, name: str) -> int:
    return sum(1 for t in cluster.state()["tasks"]
               if t["task_info"]["task_id"].startswith(f"{name}-")
               and t["status"].get("reason") == "REASON_TASK_REVOKED")


def settle(cluster: Cluster, names: tuple[str, ...], expect: tuple[int, ...],
           timeout: float = 90) -> None:
    def why() -> str:
        now = dict(zip(names, running(cluster, *names), strict=True))
        return (f"running {now}, expected {dict(zip(names, expect, strict=True))}\n"
                + "".join(cli(cluster, "why", n) for n in names))

    wait_for(lambda: running(cluster, *names) == expect, timeout, message=why)


def stop(cluster: Cluster, *names: str) -> None:
    for name in names:
        cli(cluster, "stop", name)
    wait_for(lambda: running(cluster, *names) == (0,) * len(names), 60,
             message="services did not stop")


def one_agent_cluster(zk: ZooKeeperServer, zk_admin: Any, tmp: pytest.TempPathFactory,
                      name: str, resources: str) -> Iterator[Cluster]:
    with local_cluster_in(zk, zk_admin, tmp.mktemp(name), name, agents=1,
                          agent_resources=resources, offer_timeout=OFFER_TIMEOUT) as c:
        yield c


@pytest.fixture(scope="module")
def paper_cluster(zk: ZooKeeperServer, zk_admin: Any, tmp_path_factory: pytest.TempPathFactory,
                  docker_client: Any, busybox_image: str) -> Iterator[Cluster]:
    yield from one_agent_cluster(zk, zk_admin, tmp_path_factory, "drf",
                                 "cpus:0.9;mem:18432;disk:10240;ports:[42000-42099]")


@pytest.mark.parametrize("first", ["a", "b"])
def test_drf_paper_example_whichever_starts_first(paper_cluster: Cluster, first: str) -> None:
    a, b = f"drfa{first}{TAG}", f"drfb{first}{TAG}"
    spec = {"a": (a, scaled(A_TASK)), "b": (b, scaled(B_TASK))}
    second = "b" if first == "a" else "a"
    name, task = spec[first]
    run(paper_cluster, name, f"role-{first}", task, 10)
    alone = (4, 0) if first == "a" else (0, 3)  # alone, it takes what fits
    settle(paper_cluster, (a, b), alone)
    name, task = spec[second]
    run(paper_cluster, name, f"role-{second}", task, 10)
    settle(paper_cluster, (a, b), (3, 2))
    assert revoked(paper_cluster, spec[first][0]) == 1  # the first gave one task back
    stop(paper_cluster, a, b)


@pytest.fixture(scope="module")
def big_cluster(zk: ZooKeeperServer, zk_admin: Any, tmp_path_factory: pytest.TempPathFactory,
                docker_client: Any, busybox_image: str) -> Iterator[Cluster]:
    yield from one_agent_cluster(zk, zk_admin, tmp_path_factory, "wdrf",
                                 "cpus:1.8;mem:36864;disk:10240;ports:[42100-42199]")


def test_weighted_drf_two_to_one(big_cluster: Cluster) -> None:
    a, b = f"wdrfa{TAG}", f"wdrfb{TAG}"
    cli(big_cluster, "roles", "weight", f"wa{TAG}", "2")
    agent, ta, tb = Resources.of(cpus=1.8, mem=36 * GB), scaled(A_TASK), scaled(B_TASK)
    expect = progressive_filling(agent, {a: (ta, 2.0), b: (tb, 1.0)})
    assert expect != progressive_filling(agent, {a: (ta, 1.0), b: (tb, 1.0)})
    run(big_cluster, b, f"wb{TAG}", tb, 20)
    run(big_cluster, a, f"wa{TAG}", ta, 20)
    settle(big_cluster, (a, b), (expect[a], expect[b]))
    assert f"wa{TAG}" in cli(big_cluster, "roles")
    stop(big_cluster, a, b)


def test_a_framework_sitting_on_offers_delays_no_one(big_cluster: Cluster) -> None:
    """It gets offers for the whole agent and answers none; a 1-instance service started
    after it runs within seconds, not after the offer timeout."""
    sitter = Recorder()
    driver = SchedulerDriver(sitter, framework(f"sitter{TAG}"), big_cluster.url)
    driver.start()
    try:
        wait_for(lambda: sitter.offers_seen, 30, message="the sitter got no offer")
        name = f"late{TAG}"
        started = time.monotonic()
        run(big_cluster, name, "*", Resources.of(cpus=0.1, mem=32), 1)
        wait_for(lambda: running(big_cluster, name) == (1,), OFFER_TIMEOUT / 4,
                 message=lambda: cli(big_cluster, "why", name))
        waited = time.monotonic() - started
        assert sitter.rescinds, "the sitter's offer was not rescinded"
        print(f"a service behind a sitting framework ran after {waited:.1f} s")
        stop(big_cluster, name)
    finally:
        driver.stop(failover=False)
