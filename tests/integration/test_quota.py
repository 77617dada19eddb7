"""Quota on a live cluster (ZooKeeper, master, allocator, offer-broker and an agent as
separate processes, Docker containers), driven through the CLI: a limit on a parent role
(`offerbus roles quota q --limit cpus:0.3`) holds a greedy service of its sub-role `q/web`
to 0.3 CPUs while the rest of the agent stays idle, `offerbus why` names the limit, and
clearing it lets the service grow to all it wants."""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from infra.zookeeper import ZooKeeperServer
from services.resources import Resources
from tests.e2e import Cluster
from tests.integration.test_fair_share import cli, one_agent_cluster, run, running, settle, stop
from tests.waiting import wait_for

TAG = uuid.uuid4().hex[:6]


@pytest.fixture(scope="module")
def quota_cluster(zk: ZooKeeperServer, zk_admin: Any, tmp_path_factory: pytest.TempPathFactory,
                  docker_client: Any, busybox_image: str) -> Iterator[Cluster]:
    yield from one_agent_cluster(zk, zk_admin, tmp_path_factory, "quota",
                                 "cpus:0.9;mem:4096;disk:10240;ports:[42200-42299]")


def test_a_limit_caps_a_sub_roles_service_until_cleared(quota_cluster: Cluster) -> None:
    parent, name = f"q{TAG}", f"qweb{TAG}"
    cli(quota_cluster, "roles", "quota", parent, "--limit", "cpus:0.3")
    run(quota_cluster, name, f"{parent}/web", Resources.of(cpus=0.1, mem=32), 8)
    settle(quota_cluster, (name,), (3,))
    wait_for(lambda: "quota limit" in cli(quota_cluster, "why", name), 30,
             message=lambda: cli(quota_cluster, "why", name))
    assert running(quota_cluster, name) == (3,)  # 0.6 CPUs idle, yet no more
    roles = cli(quota_cluster, "roles")
    assert "limit cpus:0.3" in roles and f"{parent}/web" in roles, roles
    cli(quota_cluster, "roles", "quota", parent, "--clear")
    settle(quota_cluster, (name,), (8,))
    stop(quota_cluster, name)


def test_a_run_held_by_a_limit_says_so_in_its_progress(quota_cluster: Cluster) -> None:
    """Stop 23's note: a run waiting on the allocator (here a quota limit; fair-share
    revocations alike) showed only "2 running, 2 pending" until it stalled. Its progress
    line now gives the allocator's latest decision once it stops making progress."""
    parent, name = f"h{TAG}", f"held{TAG}"
    cli(quota_cluster, "roles", "quota", parent, "--limit", "cpus:0.2")
    try:
        out = subprocess.run(
            [sys.executable, "-m", "services.cli", "--run-dir", str(quota_cluster.run_dir),
             "run", "--name", name, "--role", f"{parent}/web", "--instances", "4", "--cpus",
             "0.1", "--mem", "32", "--image", "offerbus/busybox:latest", "--stall", "4", "--",
             "sleep", "3600"], capture_output=True, text=True, timeout=120,
            env={**os.environ, "COLUMNS": "300"})
        assert out.returncode == 1, out.stdout + out.stderr
        assert "no progress for 4s" in out.stdout, out.stdout
        said = [line for line in out.stdout.splitlines() if "2 running, 2 pending" in line]
        assert any("; allocator: its role" in line and "quota limit" in line
                   for line in said), out.stdout
    finally:
        stop(quota_cluster, name)
        cli(quota_cluster, "roles", "quota", parent, "--clear")
