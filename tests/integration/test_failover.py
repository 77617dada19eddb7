"""Nothing lost when the leading master dies (DESIGN §4): a standby master takes over,
agents and the framework re-register with it, the tasks keep running in the very same
containers, the new master knows them, and no task is launched twice."""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Iterator
from typing import Any

import pytest

from frameworks.sdk.driver import SchedulerDriver
from frameworks.service import ServiceScheduler, ServiceSpec
from infra.zookeeper import ZooKeeperServer
from services.bus.election import detector_from_url
from services.cli import cluster as local_cluster
from tests.e2e import Cluster, framework, leader_of, local_cluster_in, members_of, metric
from tests.waiting import wait_for

INSTANCES = 4


@pytest.fixture
def cluster(zk: ZooKeeperServer, zk_admin: Any, tmp_path: Any, docker_client: Any,
            busybox_image: str) -> Iterator[Cluster]:
    with local_cluster_in(zk, zk_admin, tmp_path, "failover", agents=2, masters=2,
                          agent_resources="cpus:2;mem:2048;disk:10240;ports:[31000-31999]") as c:
        yield c


def leader(url: str) -> tuple[str, int]:
    detector = detector_from_url(url, "master")
    detector.start()
    try:
        info = detector.wait_for_leader(5.0)
    finally:
        detector.close()
    assert info is not None
    return info.member_id, info.epoch


class Service:
    """A service framework with INSTANCES running tasks, and their containers."""

    def __init__(self, cluster: Cluster, docker_client: Any, name: str) -> None:
        spec = ServiceSpec(name=name, image="offerbus/busybox:latest", instances=INSTANCES,
                           cpus=0.1, mem=32, command=["sleep", "3600"], kill_grace_s=0.5)
        self.docker = docker_client
        self.sched = ServiceScheduler(spec)
        self.driver = SchedulerDriver(self.sched, framework(name), cluster.url)
        self.driver.start()
        wait_for(lambda: len(self.running()) == INSTANCES, 60, message="instances never ran")

    def running(self) -> set[str]:
        with self.sched.lock:
            return {i.task_id for i in self.sched.instances.values()
                    if i.state == "TASK_RUNNING"}

    def containers(self) -> dict[str, str]:
        """task id -> container id, of this service's framework only (another cluster may
        run on the same engine: `make run` while `make test`)."""
        fid = self.driver.framework_id
        return {c.labels["org.offerbus.task_id"]: c.id for c in self.docker.containers.list(
            filters={"label": f"org.offerbus.framework_id={fid}"})}

    def stop(self) -> None:
        self.driver.stop()
        self.driver.join(10)


def task_records(cluster: Cluster) -> dict[str, dict[str, Any]]:
    """task id -> its record, as the leading master has it"""
    return {t["task_info"]["task_id"]: t for t in cluster.state()["tasks"]}


def known_tasks(cluster: Cluster) -> dict[str, str]:
    """task id -> state, as the leading master knows them"""
    return {t["task_info"]["task_id"]: t["status"]["state"] for t in cluster.state()["tasks"]}


def test_running_tasks_survive_the_death_of_the_leading_master(
    cluster: Cluster, docker_client: Any
) -> None:
    service = Service(cluster, docker_client, "steady")
    try:
        before = service.containers()
        assert set(before) == service.running()
        old_leader, old_epoch = leader(cluster.url)
        # The standby follows the leader's task records (follow.py), to hold them once
        # elected: each task then keeps its launch time, trace and offers.
        (standby,) = [m for m in members_of(cluster.url) if m.member_id != old_leader]
        wait_for(lambda: metric(standby, "offerbus_master_followed_entries") >= INSTANCES, 15,
                 message="the standby master does not follow the leader's tasks")
        records = task_records(cluster)
        assert all(r.get("traceparent") for r in records.values()), records
        pid_file = cluster.run_dir / "pids" / ("master.pid" if old_leader == "master-1"
                                               else f"{old_leader}.pid")
        os.kill(int(pid_file.read_text()), signal.SIGKILL)
        killed_at = time.monotonic()

        # A standby leads at a higher epoch, and every agent re-registers with it.
        wait_for(lambda: leader(cluster.url)[1] > old_epoch, 15,
                 message="no standby master took over")
        wait_for(lambda: sum(a["status"] == "AGENT_STATUS_REGISTERED"
                             for a in cluster.state()["agents"]) == 2, 30,
                 message=lambda: f"agents: {[a['status'] for a in cluster.state()['agents']]}")
        # The new master knows every task, RUNNING.
        wait_for(lambda: known_tasks(cluster) == {tid: "TASK_RUNNING" for tid in before}, 30,
                 message=lambda: f"new master's tasks: {known_tasks(cluster)}")
        recovered_in = time.monotonic() - killed_at
        # As the old leader recorded them, not launched anew at the failover, untraced.
        kept = ("launched_at_us", "traceparent", "offer_ids")
        assert {tid: [r.get(k) for k in kept] for tid, r in task_records(cluster).items()} \
            == {tid: [r.get(k) for k in kept] for tid, r in records.items()}
        assert metric(leader_of(cluster.url), "offerbus_master_tasks_held_back_total") == INSTANCES
        # The agents' reports had the digest of what the standby followed: taken whole.
        assert metric(leader_of(cluster.url), "offerbus_master_reports_taken_whole_total") >= 1
        # The allocator and broker held the copy the standby followed: they resynced with
        # only what changed since (an incremental snapshot), not the whole state.
        wait_for(lambda: metric(leader_of(cluster.url), 'offerbus_master_snapshots_served_total'
                                '{kind="incremental"}') >= 1, 15,
                 message="no subscriber resynced from the copy the new leader started from")
        # The framework re-subscribed under its id and launched nothing new.
        wait_for(lambda: cluster.state()["frameworks"][0].get("connected") is True, 30,
                 message="the framework did not re-subscribe")
        assert cluster.state()["frameworks"][0]["framework_info"]["framework_id"] == \
            service.driver.framework_id
        assert service.containers() == before, "containers were restarted or launched twice"
        assert service.running() == set(before)
        print(f"master failover: tasks known to the new master {recovered_in:.2f}s after "
              f"SIGKILL")
    finally:
        service.stop()


def test_running_tasks_survive_an_agent_crash_and_restart(
    cluster: Cluster, docker_client: Any
) -> None:
    service = Service(cluster, docker_client, "sturdy")
    try:
        before = service.containers()
        os.kill(int((cluster.run_dir / "pids" / "agent-1.pid").read_text()), signal.SIGKILL)
        # The same agent comes back on the same machine, from its work dir (its checkpoint).
        local_cluster.spawn(cluster.run_dir, "agent-1", [
            "-m", "services.agent", "--cluster", cluster.url,
            "--work-dir", str(cluster.run_dir / "agents" / "agent-1"), "--hostname", "agent-1",
            "--resources", "cpus:2;mem:2048;disk:10240;ports:[31000-31999]",
            "--attributes", "rack:a", "--runtime", "docker"])

        wait_for(lambda: known_tasks(cluster) == {tid: "TASK_RUNNING" for tid in before}, 30,
                 message=lambda: f"master's tasks: {known_tasks(cluster)}")
        wait_for(lambda: sum(a["status"] == "AGENT_STATUS_REGISTERED"
                             for a in cluster.state()["agents"]) == 2, 30,
                 message="the restarted agent did not re-register")
        assert service.containers() == before, "containers were restarted or launched twice"
        assert service.running() == set(before)
        # And the restarted agent still controls its tasks: a kill goes through it.
        agent_1 = next(aid for aid, host in cluster.agent_ids().items() if host == "agent-1")
        on_agent_1 = sorted(c.labels["org.offerbus.task_id"] for c in
                            docker_client.containers.list(
                                filters={"label": f"org.offerbus.agent_id={agent_1}"}))
        assert on_agent_1, "the service placed nothing on agent-1 (it spreads over both)"
        victim = on_agent_1[0]
        service.driver.kill(victim)
        wait_for(lambda: not docker_client.containers.list(
            sparse=True, filters={"label": f"org.offerbus.task_id={victim}"}), 30,
            message="a task of the restarted agent could not be killed")
    finally:
        service.stop()
