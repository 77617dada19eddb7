"""Every ZooKeeper server down for 10 s (issue 10, "ZooKeeper loss"): running tasks keep
running in the very same containers, no leader acts on stale authority meanwhile (each central
service stops leading), and when ZooKeeper returns the cluster resumes by itself: a master leads
again, the agent re-registers with its tasks, the framework re-subscribes under its id, and a
new task runs."""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from frameworks.sdk.driver import SchedulerDriver
from infra.zookeeper import ZooKeeperServer, free_ports
from schemas import common_pb2
from services.bus.election import detector_from_url
from tests.e2e import Cluster, Recorder, framework, launch, local_cluster_in, sleep_task
from tests.waiting import wait_for

S = common_pb2.TaskState
OUTAGE_S = 10.0
ROLES = ("master", "allocator", "broker")


@pytest.fixture
def own_zk(tmp_path: Path) -> Iterator[ZooKeeperServer]:
    """A ZooKeeper of this test alone: it is stopped and started again mid-test."""
    server = ZooKeeperServer(tmp_path / "zk", client_port=free_ports(1)[0])
    server.start(timeout=30.0)
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def cluster(own_zk: ZooKeeperServer, tmp_path: Path, docker_client: Any,
            busybox_image: str) -> Iterator[Cluster]:
    from kazoo.client import KazooClient

    admin = KazooClient(hosts=own_zk.hosts, timeout=5.0)
    admin.start(timeout=15.0)
    try:
        with local_cluster_in(own_zk, admin, tmp_path / "run", "zk-loss", agents=1,
                              agent_resources="cpus:2;mem:2048;disk:10240;"
                                              "ports:[41100-41199]") as c:
            yield c
    finally:
        admin.stop()
        admin.close()


def leaders(url: str) -> dict[str, tuple[str, int, str]]:
    """role -> (member id, epoch, status URL) of each central service's leader."""
    out = {}
    for role in ROLES:
        detector = detector_from_url(url, role)
        detector.start()
        try:
            info = detector.wait_for_leader(5.0)
        finally:
            detector.close()
        assert info is not None, f"no {role} leads"
        out[role] = (info.member_id, info.epoch, info.endpoints.get("http", ""))
    return out


def leading(http: str) -> bool | None:
    """What a service's /health says of its leadership (None: it does not answer)."""
    try:
        with urllib.request.urlopen(http + "/health", timeout=2) as r:
            return bool(json.loads(r.read())["leading"])
    except urllib.error.HTTPError as e:  # 503 while not leading: the body says so
        return bool(json.loads(e.read())["leading"])
    except OSError:
        return None


def test_all_zookeeper_servers_down_for_ten_seconds(
    own_zk: ZooKeeperServer, cluster: Cluster, docker_client: Any
) -> None:
    launched: list[str] = []

    def on_offers(driver: SchedulerDriver, offers: list[common_pb2.Offer]) -> None:
        want = 3 if not launched else (4 if outage_over else len(launched))
        if len(launched) >= want:
            driver.decline([o.offer_id for o in offers], 1.0)
            return
        ids = [f"z{len(launched) + k}" for k in range(want - len(launched))]
        launched.extend(ids)
        driver.accept([offers[0].offer_id], [launch(sleep_task(t, offers[0])) for t in ids])

    outage_over = False
    rec = Recorder(on_offers=on_offers)
    driver = SchedulerDriver(rec, framework(f"zk-loss-{uuid.uuid4().hex[:4]}"), cluster.url)
    driver.start()
    try:
        wait_for(lambda: len(launched) == 3
                 and all(rec.state_of(t) == S.TASK_RUNNING for t in launched), 60,
                 message=lambda: f"states: {[rec.state_of(t) for t in launched]}")
        fid = driver.framework_id
        containers = {c.id for c in docker_client.containers.list(
            sparse=True, filters={"label": f"org.offerbus.framework_id={fid}"})}
        assert len(containers) == 3
        before = leaders(cluster.url)

        own_zk.stop()
        down_at = time.monotonic()
        # No leader acts on stale authority: every central service stops leading.
        for role, (_, _, http) in before.items():
            wait_for(lambda http=http: leading(http) is False, 5.0,
                     message=f"the {role} went on leading without ZooKeeper")
        wait_for(lambda: time.monotonic() >= down_at + OUTAGE_S, OUTAGE_S + 1, interval=0.1,
                 message="the clock stopped")
        # Meanwhile the tasks ran on, untouched.
        assert {c.id for c in docker_client.containers.list(
            sparse=True, filters={"label": f"org.offerbus.framework_id={fid}"})} == containers
        assert not any(rec.state_of(t) != S.TASK_RUNNING for t in launched)

        own_zk.start(timeout=30.0)
        up_at = time.monotonic()
        # Each role leads again: at a new epoch if its session expired, or at the same one if
        # ZooKeeper kept the session through its restart (the server restores sessions and
        # gives each its full timeout to come back).
        def all_lead_again() -> bool:
            now = leaders(cluster.url)
            return all(epoch >= before[role][1] and leading(http) is True
                       for role, (_, epoch, http) in now.items())
        wait_for(all_lead_again, 30, ignore=(AssertionError, OSError),
                 message=lambda: f"leaders after ZooKeeper came back: {leaders(cluster.url)}")
        wait_for(lambda: {t["task_info"]["task_id"]: t["status"]["state"]
                          for t in cluster.state()["tasks"]}
                 == {t: "TASK_RUNNING" for t in launched}, 60, ignore=(AssertionError,),
                 message="the master never learned the running tasks again")
        wait_for(lambda: any(f["framework_info"]["framework_id"] == fid and f.get("connected")
                             for f in cluster.state()["frameworks"]), 60,
                 message="the framework did not re-subscribe under its id")
        resumed_in = time.monotonic() - up_at
        # A new task runs after the outage; nothing was launched twice or restarted.
        outage_over = True
        driver.revive()
        wait_for(lambda: len(launched) == 4 and rec.state_of(launched[3]) == S.TASK_RUNNING,
                 60, message=lambda: f"new task: {[rec.state_of(t) for t in launched]}")
        now_running = {c.id for c in docker_client.containers.list(
            sparse=True, filters={"label": f"org.offerbus.framework_id={fid}"})}
        assert containers < now_running and len(now_running) == 4
        assert all(rec.state_of(t) == S.TASK_RUNNING for t in launched)
        print(f"ZooKeeper back -> tasks known and framework re-subscribed in {resumed_in:.2f}s")
    finally:
        driver.stop(failover=False)
        driver.join(10)
