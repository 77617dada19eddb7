"""Reservations on a live cluster (ZooKeeper, master, allocator, offer-broker and one agent as
separate processes; the process runtime, so no Docker engine is needed), through the SDK:

- a static reservation (`--resources 'cpus(stat):0.5;...'`) is offered to its role alone;
- a framework of role web RESERVEs cpus in an ACCEPT and launches a task on them: the rest of
  its reservation is offered to it again (before, the allocator did not follow the
  reservation: it kept the whole agent counted as offered to web, and nobody was offered
  anything more), and never to another role;
- after an UNRESERVE the cpus go to everyone."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

import pytest

from frameworks.sdk.driver import SchedulerDriver
from infra.zookeeper import ZooKeeperServer
from schemas import common_pb2
from services.allocator.reserved import only
from services.resources import UNRESERVED, Resources
from tests.e2e import Cluster, Recorder, framework, launch, local_cluster_in
from tests.waiting import wait_for

AGENT = "cpus(stat):0.5;cpus:1;mem:1024;disk:1024;ports:[45310-45319]"
REFUSE = 0.3  # every framework declines what it does not use, briefly: offers go round


@pytest.fixture
def cluster(zk: ZooKeeperServer, zk_admin: Any, tmp_path: Any) -> Iterator[Cluster]:
    with local_cluster_in(zk, zk_admin, tmp_path, "reservations", agents=1, runtime="process",
                          agent_resources=AGENT) as c:
        yield c


def offered(rec: Recorder) -> list[Resources]:
    with rec.lock:
        return [Resources.from_proto(o.resources) for _, o in rec.offers_seen]


def decliner(driver: SchedulerDriver, offers: list[common_pb2.Offer]) -> None:
    driver.decline([o.offer_id for o in offers], refuse_seconds=REFUSE)


def op(kind: str, res: Resources) -> common_pb2.Operation:
    out = common_pb2.Operation()
    getattr(out, kind).resources.extend(res.to_proto())
    return out


def process_task(task_id: str, offer: common_pb2.Offer, res: Resources) -> common_pb2.TaskInfo:
    task = common_pb2.TaskInfo(task_id=task_id, name=task_id, agent_id=offer.agent_id,
                               kill_grace_period_s=0.5)
    task.resources.extend(res.to_proto())
    task.command.shell = False
    task.command.value = "sleep"
    task.command.arguments.append("3600")
    return task


def test_reservations_go_only_to_their_role(cluster: Cluster) -> None:
    phase = {"now": "watch"}
    lock = threading.Lock()
    reservation = Resources.parse("cpus(web):0.5")
    task = Resources.parse("cpus(web):0.1;mem:32")

    def web_offers(driver: SchedulerDriver, offers: list[common_pb2.Offer]) -> None:
        for o in offers:
            res = Resources.from_proto(o.resources)
            with lock:
                now = phase["now"]
                if now == "reserve" and res.contains(reservation.with_role(UNRESERVED)):
                    phase["now"] = "reserved"
                    driver.accept([o.offer_id], [op("reserve", reservation),
                                                 launch(process_task("w1", o, task))])
                    continue
                mine = only(res, "web")
                if now == "unreserve" and mine:
                    phase["now"] = "unreserved"
                    driver.accept([o.offer_id], [op("unreserve", mine)])
                    continue
            driver.decline([o.offer_id], refuse_seconds=REFUSE)

    web, batch, stat = (Recorder(on_offers=web_offers), Recorder(on_offers=decliner),
                        Recorder(on_offers=decliner))
    drivers = [SchedulerDriver(web, framework("web", "web"), cluster.url),
               SchedulerDriver(batch, framework("batch", "batch"), cluster.url),
               SchedulerDriver(stat, framework("stat", "stat"), cluster.url)]
    for d in drivers:
        d.start()

    def report() -> str:
        return (f"web {[str(r) for r in offered(web)[-5:]]}\n"
                f"batch {[str(r) for r in offered(batch)[-5:]]}\n"
                f"stat {[str(r) for r in offered(stat)[-5:]]}\n"
                f"{cluster.cli('why', 'web')}{cluster.cli('why', 'batch')}")

    try:
        # Static: cpus(stat) goes to role stat, never to batch or web.
        wait_for(lambda: any(only(r, "stat") for r in offered(stat)), 60,
                 message=report)
        wait_for(lambda: offered(batch) and offered(web), 30, message=report)
        assert not any(only(r, "stat") for r in (*offered(batch), *offered(web)))

        # Dynamic: web reserves cpus(web):0.5 and runs a task on 0.1 of it.
        with lock:
            phase["now"] = "reserve"
        wait_for(lambda: web.state_of("w1") == common_pb2.TASK_RUNNING, 30, message=report)
        rest = reservation - only(task, "web")  # what the task leaves of the reservation
        wait_for(lambda: any(only(r, "web").contains(rest) for r in offered(web)), 30,
                 message=report)
        seen = len(offered(batch))
        wait_for(lambda: len(offered(batch)) > seen + 1, 30, message=report)
        assert not any(only(r, "web") for r in (*offered(batch), *offered(stat)))
        assert max(r.scalar("cpus") for r in offered(batch)[seen:]) <= 0.5  # 1 - 0.5 reserved
        [agent] = cluster.state()["agents"]
        assert {(r["name"], r.get("scalar")) for r in agent["agent_info"]["resources"]
                if r.get("role") == "web"} == {("cpus", 0.5)}

        # UNRESERVE what web does not use: batch is offered it again.
        with lock:
            phase["now"] = "unreserve"
        wait_for(lambda: any(r.scalar("cpus") >= 0.9 for r in offered(batch)[seen:]), 30,
                 message=report)
        assert not any(only(r, "web") for r in offered(batch))
    finally:
        for d in drivers:
            d.stop(failover=False)
        for d in drivers:
            d.join(10)

