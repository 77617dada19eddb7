"""Standby allocator and offer-broker on real processes (DESIGN §4, "allocator or broker
dies"): a local cluster (`offerbus up --standbys 1`: two of each central service under
ZooKeeper). SIGKILL of the leading allocator, or of the leading offer-broker, resumes offers
from its standby; no resource is offered twice at once (checked by the framework after every
offer and rescind it gets); the dead broker's offers are rescinded and an ACCEPT naming one is
rejected, never launched; tasks launched after the failover run and nothing running is
killed. Each test prints its recovery time (kill -> first new offer)."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest

from frameworks.sdk.driver import SchedulerDriver
from frameworks.sdk.scheduler import MasterInfo
from infra.zookeeper import ZooKeeperServer
from schemas import common_pb2
from services.broker.validation import overlap
from services.cli import cluster as local_cluster
from services.cli.client import ElectionView
from services.resources import UNRESERVED, Resources
from tests.e2e import Cluster, Recorder, S, framework, launch, local_cluster_in, sleep_task
from tests.waiting import wait_for

AGENTS = 2
SPEC = "cpus:2;mem:1024;disk:10240;ports:[41000-41099]"
TOTALS = {f"agent-{i}": Resources.parse(local_cluster.agent_resources(SPEC, i - 1))
          for i in range(1, AGENTS + 1)}
OFFER_TIMEOUT = 60.0  # held offers must not expire during a test
FAILOVER = 20.0  # generous: a 1 s ZooKeeper session on a busy 2-core machine


@pytest.fixture(scope="module")
def cluster(zk: ZooKeeperServer, zk_admin: Any, tmp_path_factory: pytest.TempPathFactory,
            docker_client: Any, busybox_image: str) -> Iterator[Cluster]:
    with local_cluster_in(zk, zk_admin, tmp_path_factory.mktemp("standby"), "standby",
                          agents=AGENTS, standbys=1, agent_resources=SPEC,
                          offer_timeout=OFFER_TIMEOUT) as c:
        yield c


@dataclass
class Holder(Recorder):
    """A framework that keeps the offers it is given (answering only when the test says)
    and, after every offer and rescind, checks that what it holds never exceeds an agent:
    per agent, outstanding scalars within its total and no port offered twice."""

    outstanding: dict[str, common_pb2.Offer] = field(default_factory=dict)
    violations: list[str] = field(default_factory=list)
    sdk_records: dict[str, Any] = field(default_factory=dict)  # the driver's own, by offer
    masters: list[tuple[float, int]] = field(default_factory=list)  # (subscribed at, epoch)

    def offers(self, driver: SchedulerDriver, offers: list[common_pb2.Offer]) -> None:
        with self.lock:
            for o in offers:
                self.outstanding[o.offer_id] = o
                # The driver's record of it (we are on its thread), to replay a stale accept.
                self.sdk_records[o.offer_id] = driver._core.offers.get(o.offer_id)
            self._check()
        super().offers(driver, offers)

    def rescinded(self, driver: SchedulerDriver, offer_ids: list[str], reason: int) -> None:
        with self.lock:
            for oid in offer_ids:
                self.outstanding.pop(oid, None)
        super().rescinded(driver, offer_ids, reason)

    def disconnected(self, driver: SchedulerDriver) -> None:
        with self.lock:
            self.outstanding.clear()  # void with their connection (the SDK's contract)

    def _check(self) -> None:
        held: dict[str, Resources] = {}
        for o in self.outstanding.values():
            res = Resources.from_proto(o.resources).with_role(UNRESERVED)
            acc = held.get(o.hostname, Resources())
            if overlap(acc, res):
                self.violations.append(f"{o.offer_id} on {o.hostname} overlaps {acc}: {res}")
            held[o.hostname] = acc + res
        for host, acc in held.items():
            if not TOTALS[host].contains(acc):
                self.violations.append(f"{host}: {acc} outstanding > total {TOTALS[host]} "
                                       f"({sorted(self.outstanding)})")

    def subscribed(self, driver: SchedulerDriver, framework_id: str,
                   master_info: MasterInfo) -> None:
        with self.lock:
            self.outstanding.clear()  # offers of an earlier connection are void
            self.masters.append((time.monotonic(), master_info.epoch))
        super().subscribed(driver, framework_id, master_info)

    def take(self, host: str | None = None, after: float = 0.0) -> common_pb2.Offer | None:
        """An outstanding offer (of `host`, received after `after`), no longer held."""
        with self.lock:
            seen = {o.offer_id: t for t, o in self.offers_seen}
            for oid, o in sorted(self.outstanding.items()):
                if (host is None or o.hostname == host) and seen.get(oid, 0.0) > after:
                    return self.outstanding.pop(oid)
        return None

    def holding(self) -> set[str]:
        """Hosts with an offer outstanding."""
        with self.lock:
            return {o.hostname for o in self.outstanding.values()}

    def first_offer_after(self, t: float) -> float | None:
        with self.lock:
            return next((at for at, _ in self.offers_seen if at > t), None)

    def rescinded_ids(self) -> set[str]:
        with self.lock:
            return {oid for _, oid in self.rescinds}


def start(cluster: Cluster, sched: Holder, name: str) -> SchedulerDriver:
    driver = SchedulerDriver(sched, framework(name), cluster.url)
    driver.start()
    wait_for(lambda: bool(sched.framework_id), 30, message="the framework never subscribed")
    return driver


def run_task(sched: Holder, driver: SchedulerDriver, task_id: str, after: float = 0.0) -> None:
    offer = wait_for(lambda: sched.take(after=after), 30, message=f"no offer for {task_id}")
    driver.accept([offer.offer_id], [launch(sleep_task(task_id, offer))])
    wait_for(lambda: sched.state_of(task_id) == S.TASK_RUNNING, 60,
             message=lambda: f"{task_id} never ran: {sched.last(task_id)}")


def containers(docker_client: Any, fid: str) -> dict[str, str]:
    """task id -> container id, of this framework only (the engine is shared)."""
    return {c.labels["org.offerbus.task_id"]: c.id for c in docker_client.containers.list(
        filters={"label": f"org.offerbus.framework_id={fid}"})}


def members(cluster: Cluster, role: str) -> list[str]:
    with ElectionView(cluster.url) as election:
        return [m.member_id for m in election.members(role) or []]


def respawn_standby(cluster: Cluster, name: str, role: str) -> None:
    """The killed process back, as a standby: the next test finds two of each again."""
    local_cluster.respawn(cluster.run_dir, name)
    wait_for(lambda: len(members(cluster, role)) == 2, 30,
             message=lambda: f"{name} did not rejoin the {role} election: "
                             f"{members(cluster, role)}")


def test_status_shows_who_leads_and_who_stands_by(cluster: Cluster) -> None:
    doc = json.loads(cluster.cli("status", "--json"))
    for role in ("master", "allocator", "broker"):
        leader = doc["leaders"][role]["id"]
        assert doc["standbys"][role] == [m for m in (f"{role}-1", f"{role}-2") if m != leader]
    text = cluster.cli("status")
    assert "standing by" in text, text


def test_a_killed_allocator_is_replaced_and_nothing_is_offered_twice(
    cluster: Cluster, docker_client: Any
) -> None:
    sched = Holder()
    driver = start(cluster, sched, "allocator-failover")
    name = ""
    try:
        run_task(sched, driver, "before")
        before = containers(docker_client, driver.framework_id)
        # The framework now holds everything left on both agents.
        wait_for(lambda: sched.holding() == set(TOTALS), 30,
                 message=lambda: f"holding offers of {sched.holding()} only")
        with sched.lock:
            held = set(sched.outstanding)
        name, old, killed_at = cluster.kill_leader("allocator")

        wait_for(lambda: cluster.leader("allocator").epoch > old.epoch, FAILOVER,
                 message="no standby allocator took over")
        first = wait_for(lambda: sched.first_offer_after(killed_at), FAILOVER,
                         message="no offer after the allocator failover")
        assert not sched.violations, sched.violations
        # The new allocator counts everything free, so the broker took back what the old
        # one had allocated (before any new offer: the framework saw no double offer).
        wait_for(lambda: held <= sched.rescinded_ids(), 5,
                 message=lambda: f"not rescinded: {held - sched.rescinded_ids()}")
        wait_for(lambda: sched.holding() == set(TOTALS), 30,
                 message=lambda: f"offers resumed on {sched.holding()} only")
        run_task(sched, driver, "after", after=killed_at)

        assert not sched.violations, sched.violations
        assert sched.state_of("before") == S.TASK_RUNNING
        now = containers(docker_client, driver.framework_id)
        assert now["before"] == before["before"], "a running task was restarted"
        print(f"\nallocator failover: first new offer {first - killed_at:.2f}s after SIGKILL "
              f"(leader {old.member_id}@{old.epoch} -> {cluster.leader('allocator').member_id})")
    finally:
        driver.stop(failover=False)
        driver.join(10)
        if name:
            respawn_standby(cluster, name, "allocator")


def test_a_killed_broker_is_replaced_and_its_offers_are_void(
    cluster: Cluster, docker_client: Any
) -> None:
    sched = Holder()
    driver = start(cluster, sched, "broker-failover")
    name = ""
    try:
        run_task(sched, driver, "steady")
        before = containers(docker_client, driver.framework_id)
        wait_for(lambda: sched.holding() == set(TOTALS), 30,
                 message=lambda: f"holding offers of {sched.holding()} only")
        with sched.lock:
            held = set(sched.outstanding)
            stale_id = sorted(held)[0]
            stale = sched.outstanding[stale_id]
            record = sched.sdk_records[stale_id]
        assert record is not None
        name, old, killed_at = cluster.kill_leader("broker")

        wait_for(lambda: cluster.leader("broker").epoch > old.epoch, FAILOVER,
                 message="no standby broker took over")
        first = wait_for(lambda: sched.first_offer_after(killed_at), FAILOVER,
                         message="no offer after the broker failover")
        assert not sched.violations, sched.violations
        # Every offer of the dead broker was rescinded (by the master: nobody else knew
        # them), and the new offers are the new broker's.
        wait_for(lambda: held <= sched.rescinded_ids(), 5,
                 message=lambda: f"not rescinded: {held - sched.rescinded_ids()}")
        with sched.lock:
            new_ids = [o.offer_id for t, o in sched.offers_seen if t > killed_at]
        assert new_ids and not set(new_ids) & held

        # An accept of a rescinded offer: the driver refuses it itself...
        driver.accept([stale_id], [launch(sleep_task("stale-1", stale))])
        wait_for(lambda: sched.state_of("stale-1") == S.TASK_DROPPED, 10,
                 message=lambda: f"stale-1: {sched.last('stale-1')}")
        # ...and one that crossed the rescind on the wire (the driver still thought the
        # offer outstanding) is rejected by the cluster: never launched.
        rejected = len(sched.rejected)

        def forget_the_rescind() -> list[Any]:
            driver._core.offers[stale_id] = record
            return []

        driver._submit(forget_the_rescind)
        driver.accept([stale_id], [launch(sleep_task("stale-2", stale))])
        wait_for(lambda: len(sched.rejected) > rejected, 10,
                 message="the cluster never rejected the accept of a dead broker's offer")

        run_task(sched, driver, "after", after=killed_at)
        tasks = {t["task_info"]["task_id"]: t["status"]["state"] for t in cluster.state()["tasks"]
                 if t["framework_id"] == driver.framework_id}
        assert "stale-2" not in tasks or tasks["stale-2"] not in ("TASK_RUNNING",
                                                                  "TASK_STARTING"), tasks
        assert tasks["steady"] == "TASK_RUNNING" and tasks["after"] == "TASK_RUNNING", tasks
        now = containers(docker_client, driver.framework_id)
        assert now["steady"] == before["steady"], "a running task was restarted"
        assert set(now) == {"steady", "after"}, f"launched: {sorted(now)}"
        assert not sched.violations, sched.violations
        print(f"\nbroker failover: first new offer {first - killed_at:.2f}s after SIGKILL "
              f"(leader {old.member_id}@{old.epoch} -> {cluster.leader('broker').member_id}); "
              f"{len(held)} offers rescinded; stale accept rejected: {sched.rejected[-1]!r}")
    finally:
        driver.stop(failover=False)
        driver.join(10)
        if name:
            respawn_standby(cluster, name, "broker")


def test_offers_held_through_a_master_failover_flow_again_at_once(
    cluster: Cluster, docker_client: Any
) -> None:
    """Offers the framework held when the leading master died were relayed on a connection
    that is void now (the driver forgets them on re-subscribing): the cluster must offer
    those resources again promptly, not leave them outstanding until the offer timeout."""
    sched = Holder()
    driver = start(cluster, sched, "master-failover")
    name = ""
    try:
        run_task(sched, driver, "steady")
        before = containers(docker_client, driver.framework_id)
        wait_for(lambda: sched.holding() == set(TOTALS), 30,
                 message=lambda: f"holding offers of {sched.holding()} only")
        name, old, killed_at = cluster.kill_leader("master")
        wait_for(lambda: sched.masters[-1][1] > old.epoch, FAILOVER,
                 message="the framework never subscribed with the new master")
        # Well before the offer timeout (OFFER_TIMEOUT = 60 s): every agent offered again.
        wait_for(lambda: sched.holding() == set(TOTALS), 10,
                 message=lambda: f"after the master failover, offers of {sched.holding()} "
                                 "only: the others are stuck as outstanding")
        first = sched.first_offer_after(killed_at)
        assert first is not None
        assert not sched.violations, sched.violations
        run_task(sched, driver, "after", after=killed_at)
        now = containers(docker_client, driver.framework_id)
        assert now["steady"] == before["steady"], "a running task was restarted"
        print(f"\nmaster failover: first new offer {first - killed_at:.2f}s after SIGKILL")
    finally:
        driver.stop(failover=False)
        driver.join(10)
        if name:
            respawn_standby(cluster, name, "master")
