"""Two tasks of one ACCEPT asking for the same host port, through a real cluster (ZooKeeper,
master, allocator, offer-broker, one agent) and the SDK: the framework is told the ACCEPT is
refused, naming both tasks and the port, and neither task is ever launched."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

import pytest

from frameworks.sdk.driver import SchedulerDriver
from infra.zookeeper import ZooKeeperServer
from schemas import common_pb2
from services.resources import Resources
from tests.e2e import Cluster, Recorder, framework, local_cluster_in, sleep_task
from tests.waiting import wait_for

PORT = 47613
LAUNCHED = (common_pb2.TASK_STARTING, common_pb2.TASK_RUNNING, common_pb2.TASK_FINISHED)


@pytest.fixture
def cluster(zk: ZooKeeperServer, zk_admin: Any, tmp_path: Any) -> Iterator[Cluster]:
    """No task is meant to run: the process runtime, so no Docker engine is needed."""
    with local_cluster_in(zk, zk_admin, tmp_path, "port-clash", agents=1, runtime="process",
                          agent_resources=f"cpus:2;mem:1024;ports:[{PORT - 3}-{PORT + 6}]") as c:
        yield c


def test_two_tasks_of_one_accept_on_one_host_port_are_refused(cluster: Cluster) -> None:
    once = threading.Event()

    def on_offers(driver: SchedulerDriver, offers: list[common_pb2.Offer]) -> None:
        if once.is_set():
            return
        once.set()
        op = common_pb2.Operation()
        for tid in ("a", "b"):
            t = sleep_task(tid, offers[0], command=["true"])  # nothing lingers if launched
            t.resources.extend(Resources.of(ports=[(PORT, PORT)]).to_proto())
            op.launch.tasks.append(t)
        driver.accept([offers[0].offer_id], [op])

    rec = Recorder(on_offers=on_offers)
    driver = SchedulerDriver(rec, framework("port-clash"), cluster.url)
    driver.start()

    def launched() -> list[common_pb2.TaskStatus]:
        with rec.lock:
            return [s for h in rec.updates.values() for s in h if s.state in LAUNCHED]

    try:
        wait_for(lambda: rec.rejected or launched(), 30, message="neither refused nor launched")
        assert not launched()
        assert rec.rejected == [f"tasks 'a' and 'b' both use port {PORT}"]
        assert not [t for t in cluster.state()["tasks"]
                    if t["task_info"]["task_id"] in ("a", "b")]
    finally:
        driver.stop(failover=False)
        driver.join(10)
