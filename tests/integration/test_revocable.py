"""Revocable tasks on a live cluster (ZooKeeper, master, allocator, offer-broker and one agent as
separate processes; the process runtime, so no Docker engine is needed), through the SDK:
framework B, alone, fills the agent with tasks of its declared demand; those beyond its
guaranteed share (half the agent, were one more framework to come) are launched revocable and
/state says so. Then A arrives with demand: B's revocable tasks, and only those, are revoked
(killed with REASON_TASK_REVOKED), and A runs its tasks."""

from __future__ import annotations

import itertools
import threading
from collections.abc import Iterator
from typing import Any

import pytest

from frameworks.sdk.demand import demand
from frameworks.sdk.driver import SchedulerDriver
from infra.zookeeper import ZooKeeperServer
from schemas import common_pb2
from services.resources import Resources
from tests.e2e import Cluster, Recorder, framework, launch, local_cluster_in
from tests.integration.test_reservations import process_task
from tests.waiting import wait_for

TASK = Resources.parse("cpus:0.25;mem:64")


@pytest.fixture
def cluster(zk: ZooKeeperServer, zk_admin: Any, tmp_path: Any) -> Iterator[Cluster]:
    with local_cluster_in(zk, zk_admin, tmp_path, "revocable", agents=1, runtime="process",
                          agent_resources="cpus:1;mem:256;disk:1024;ports:[45330-45339]") as c:
        yield c


def greedy(name: str, want: int) -> Recorder:
    """Launches a sleeping task of TASK on every offer that holds one, up to `want` running
    or starting; declines the rest."""
    ids = itertools.count(1)
    lock = threading.Lock()
    live: set[str] = set()

    def on_offers(driver: SchedulerDriver, offers: list[common_pb2.Offer]) -> None:
        for o in offers:
            with lock:
                with rec.lock:
                    live.difference_update(t for t, h in rec.updates.items()
                                           if h and h[-1].state in ENDED)
                room = Resources.from_proto(o.resources)
                tasks = []
                while len(live) < want and room.contains(TASK):
                    tid = f"{name}-{next(ids)}"
                    live.add(tid)
                    room -= TASK
                    tasks.append(process_task(tid, o, TASK))
            if tasks:
                driver.accept([o.offer_id], [launch(t) for t in tasks])
            else:
                driver.decline([o.offer_id], refuse_seconds=0.5)

    rec = Recorder(on_offers=on_offers)
    return rec


ENDED = {common_pb2.TASK_FINISHED, common_pb2.TASK_FAILED, common_pb2.TASK_KILLED,
         common_pb2.TASK_LOST, common_pb2.TASK_ERROR, common_pb2.TASK_DROPPED}


def tasks(cluster: Cluster, prefix: str) -> dict[str, dict[str, Any]]:
    return {t["task_info"]["task_id"]: t for t in cluster.state()["tasks"]
            if t["task_info"]["task_id"].startswith(prefix)}


def running(cluster: Cluster, prefix: str) -> set[str]:
    return {tid for tid, t in tasks(cluster, prefix).items()
            if t["status"]["state"] == "TASK_RUNNING"}


def test_only_revocable_tasks_are_revoked(cluster: Cluster) -> None:
    b, a = greedy("b", 4), greedy("a", 2)
    drivers = [SchedulerDriver(b, framework("b", "role-b"), cluster.url)]
    # Its demand known before its first offer: subscribed suppressed, with the demand sent
    # first (the driver sends it on Subscribed), then revived. Started unsuppressed, the
    # allocator could offer the agent before the demand came, and nothing was revocable.
    drivers[0].suppress()
    drivers[0].request([demand(TASK, 4)])
    drivers[0].start()
    wait_for(lambda: b.framework_id, 30, message="b never subscribed")
    drivers[0].revive()

    def report() -> str:
        return "".join(f"{tid} {t['status']['state']} revocable={t['task_info'].get('revocable')}"
                       f" {t['status'].get('reason', '')}\n"
                       for tid, t in sorted(tasks(cluster, "").items()))

    try:
        wait_for(lambda: len(running(cluster, "b-")) == 4, 60, message=report)
        marked = {tid for tid, t in tasks(cluster, "b-").items()
                  if t["task_info"].get("revocable")}
        assert len(marked) == 2, report()  # beyond half the agent

        drivers.append(SchedulerDriver(a, framework("a", "role-a"), cluster.url))
        drivers[1].start()
        drivers[1].request([demand(TASK, 2)])
        wait_for(lambda: len(running(cluster, "a-")) == 2, 60, message=report)
        revoked = {tid for tid, t in tasks(cluster, "b-").items()
                   if t["status"].get("reason") == "REASON_TASK_REVOKED"}
        assert revoked and revoked <= marked, report()
        assert running(cluster, "b-") == set(tasks(cluster, "b-")) - marked, report()
    finally:
        for d in drivers:
            d.stop(failover=False)
        for d in drivers:
            d.join(10)
