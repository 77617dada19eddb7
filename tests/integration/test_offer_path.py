"""The offer path end to end on a real cluster: ZooKeeper, master, allocator, offer-broker
and three agents as separate processes, tasks as Docker containers, frameworks through the
SDK. What an operator and a framework author rely on, checked as they would see it."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest

from frameworks.sdk.driver import SchedulerDriver
from frameworks.service import ServiceScheduler, ServiceSpec
from infra.zookeeper import ZooKeeperServer
from schemas import bus_pb2, common_pb2
from services.resources import Resources
from tests.e2e import Cluster, Recorder, S, framework, launch, local_cluster_in, sleep_task
from tests.waiting import wait_for

AGENT_RESOURCES = "cpus:2;mem:2048;disk:10240;ports:[31000-31999]"
OFFER_TIMEOUT = 4.0


@pytest.fixture(scope="module")
def cluster(zk: ZooKeeperServer, zk_admin: Any, tmp_path_factory: pytest.TempPathFactory,
            docker_client: Any, busybox_image: str) -> Iterator[Cluster]:
    with local_cluster_in(zk, zk_admin, tmp_path_factory.mktemp("cluster"), "e2e", agents=3,
                          agent_resources=AGENT_RESOURCES, offer_timeout=OFFER_TIMEOUT) as c:
        yield c


def start(cluster: Cluster, scheduler: Any, name: str) -> SchedulerDriver:
    driver = SchedulerDriver(scheduler, framework(name), cluster.url)
    driver.start()
    return driver


def stop(driver: SchedulerDriver) -> None:
    driver.stop(failover=False)  # teardown: the master kills the framework's tasks
    driver.join(10)


def running(sched: ServiceScheduler) -> int:
    with sched.lock:
        return sum(1 for i in sched.instances.values() if i.state == "TASK_RUNNING")


def test_twenty_containers_run_are_listed_killed_and_replaced(
    cluster: Cluster, docker_client: Any
) -> None:
    spec = ServiceSpec(name="web", image="offerbus/busybox:latest", instances=20, cpus=0.1,
                       mem=32, command=["sleep", "3600"], kill_grace_s=0.5)
    sched = ServiceScheduler(spec)
    driver = start(cluster, sched, "web")
    try:
        wait_for(lambda: running(sched) == 20, 120,
                 message=lambda: f"{running(sched)}/20 RUNNING: {sched.pending_reason}")
        fid = driver.framework_id
        containers = docker_client.containers.list(
            filters={"label": f"org.offerbus.framework_id={fid}"})
        by_task = {c.labels["org.offerbus.task_id"]: c for c in containers}
        with sched.lock:
            task_ids = {i.task_id for i in sched.instances.values()}
        assert set(by_task) == task_ids
        hosts = cluster.agent_ids()
        used_agents = {c.labels["org.offerbus.agent_id"] for c in containers}
        assert len(used_agents) >= 2 and used_agents <= set(hosts)

        # The CLI lists each task on the agent whose container runs it.
        table = cluster.cli("tasks")
        for task_id, c in by_task.items():
            agent = c.labels["org.offerbus.agent_id"]
            line = next(ln for ln in table.splitlines() if task_id in ln)
            assert agent in line and hosts[agent] in line and "RUNNING" in line

        # Killing one ends it with TASK_KILLED; its resources are offered again, and the
        # service puts a new instance on them.
        victim = sorted(task_ids)[0]
        driver.kill(victim)
        wait_for(lambda: any(i.task_id == victim and i.state == "TASK_KILLED"
                             for i in sched.instances.values()) or
                 victim not in {i.task_id for i in sched.instances.values()}, 30,
                 message="the killed task never reported TASK_KILLED")
        wait_for(lambda: running(sched) == 20, 60, message="the killed instance was not replaced")

        # A container that dies under its executor: TASK_FAILED, and the service replaces it.
        with sched.lock:
            task_ids = {i.task_id for i in sched.instances.values() if i.state == "TASK_RUNNING"}
        doomed = sorted(task_ids)[-1]
        docker_client.containers.list(
            filters={"label": f"org.offerbus.task_id={doomed}"})[0].kill()
        wait_for(lambda: doomed not in {i.task_id for i in sched.instances.values()}
                 and running(sched) == 20, 60, message="the failed instance was not replaced")
        assert sched.restarts >= 2
    finally:
        stop(driver)
    wait_for(lambda: not docker_client.containers.list(
        sparse=True, filters={"label": f"org.offerbus.framework_id={driver.framework_id}"}), 30,
        message="teardown left containers running")


def one_shot(cluster: Cluster, name: str, make_task: Any) -> tuple[Recorder, SchedulerDriver]:
    """A framework that launches exactly one task on the first offer it gets."""
    launched: list[str] = []

    def on_offers(driver: SchedulerDriver, offers: list[common_pb2.Offer]) -> None:
        if launched:
            driver.decline([o.offer_id for o in offers], 60.0, reason="done")
            return
        task = make_task(offers[0])
        launched.append(task.task_id)
        driver.accept([offers[0].offer_id], [launch(task)])
        if offers[1:]:
            driver.decline([o.offer_id for o in offers[1:]], 60.0)

    rec = Recorder(on_offers=on_offers)
    return rec, start(cluster, rec, name)


def test_tasks_beyond_their_offer_end_as_task_error_not_in_silence(cluster: Cluster) -> None:
    """A launch the offer-broker refuses (its tasks need more than the offer holds) reaches
    the framework as AcceptRejected and, for each task, a TASK_ERROR from the master (it
    got no update at all before: a scheduler waiting on its tasks waited forever)."""
    rec, driver = one_shot(cluster, "too-big", lambda o: sleep_task("too-big-1", o, cpus=64))
    try:
        wait_for(lambda: rec.state_of("too-big-1") is not None and rec.rejected, 60,
                 message=lambda: f"updates: {dict(rec.updates)}; rejected: {rec.rejected}")
        last = rec.last("too-big-1")
        assert last is not None and last.state == S.TASK_ERROR, last
        assert last.reason == common_pb2.TaskStatus.REASON_TASK_INVALID, last
        assert "refused by the offer-broker" in last.message and "cpus" in last.message, last
        assert [u.state for u in rec.updates["too-big-1"]] == [S.TASK_ERROR]
    finally:
        stop(driver)


def test_a_failing_command_reports_its_exit_code(cluster: Cluster) -> None:
    rec, driver = one_shot(cluster, "fails", lambda o: sleep_task(
        "exit-1", o, command=["sh", "-c", "echo boom >&2; exit 1"]))
    try:
        wait_for(lambda: rec.state_of("exit-1") == S.TASK_FAILED, 60,
                 message=lambda: f"states: {[u.state for u in rec.updates['exit-1']]}")
        last = rec.last("exit-1")
        assert last is not None and last.exit_code == 1 and "1" in last.message
        # Its output outlives its container: read from the sandbox, through the CLI.
        assert "boom" in cluster.cli("logs", "exit-1", "--stderr", "--tail", "5")
    finally:
        stop(driver)


def test_a_missing_image_fails_with_a_clear_reason(cluster: Cluster) -> None:
    rec, driver = one_shot(cluster, "noimage", lambda o: sleep_task(
        "no-image", o, image="offerbus/does-not-exist:1.0"))
    try:
        wait_for(lambda: rec.state_of("no-image") == S.TASK_FAILED, 60)
        last = rec.last("no-image")
        assert last is not None
        assert last.reason == common_pb2.TaskStatus.REASON_IMAGE_NOT_FOUND
        assert "offerbus/does-not-exist:1.0" in last.message
    finally:
        stop(driver)


def test_a_task_larger_than_any_agent_stays_pending_and_says_why(cluster: Cluster) -> None:
    spec = ServiceSpec(name="huge", image="offerbus/busybox:latest", instances=1, cpus=0.1,
                       mem=100_000, command=["sleep", "3600"])
    sched = ServiceScheduler(spec)
    driver = start(cluster, sched, "huge")
    try:
        # It declared its demand: the allocator offers nothing that cannot fit, and says so.
        said: list[str] = []

        def explained() -> bool:
            said.append(cluster.cli("why", "huge"))
            return "no offer fits" in said[-1] and "mem:100000" in said[-1]

        wait_for(explained, 30, message=lambda: f"why said: {said[-1] if said else ''}")
        assert not sched.instances
    finally:
        stop(driver)


def test_decline_filter_hides_an_agent_then_lets_it_back(cluster: Cluster) -> None:
    declined: dict[str, float] = {}

    def on_offers(driver: SchedulerDriver, offers: list[common_pb2.Offer]) -> None:
        for o in offers:
            if not declined:
                declined[o.agent_id] = time.monotonic()
                driver.decline([o.offer_id], 5.0, reason="testing refuse_seconds")
            else:
                driver.decline([o.offer_id], 0.5)

    rec = Recorder(on_offers=on_offers)
    driver = start(cluster, rec, "picky")
    try:
        wait_for(lambda: bool(declined), 30, message="no offer arrived")
        agent, at = next(iter(declined.items()))

        def offers_of_agent() -> list[float]:
            with rec.lock:
                return [t for t, o in rec.offers_seen if o.agent_id == agent and t > at]

        wait_for(lambda: offers_of_agent(), 15, message="the agent was never offered again")
        gap = offers_of_agent()[0] - at
        assert 5.0 <= gap <= 9.0, f"agent re-offered after {gap:.2f}s (filter 5 s)"
    finally:
        stop(driver)


def test_an_unanswered_offer_is_rescinded_and_offered_again(cluster: Cluster) -> None:
    rec = Recorder()  # never answers
    driver = start(cluster, rec, "sleepy")
    try:
        wait_for(lambda: bool(rec.offers_seen), 30, message="no offer arrived")
        first_at, first = rec.offers_seen[0]
        wait_for(lambda: any(oid == first.offer_id for _, oid in rec.rescinds),
                 OFFER_TIMEOUT + 5, message="the offer was never rescinded")
        rescinded_at = next(t for t, oid in rec.rescinds if oid == first.offer_id)
        assert OFFER_TIMEOUT - 0.5 <= rescinded_at - first_at <= OFFER_TIMEOUT + 2.0
        wait_for(lambda: any(o.agent_id == first.agent_id and o.offer_id != first.offer_id
                             for t, o in rec.offers_seen if t >= rescinded_at), 15,
                 message="the rescinded resources were not offered again")
    finally:
        stop(driver)


def test_a_framework_cannot_kill_another_frameworks_task(cluster: Cluster) -> None:
    owner, owner_driver = one_shot(cluster, "owner", lambda o: sleep_task("mine", o))
    other = Recorder(on_offers=lambda d, offers: d.decline([o.offer_id for o in offers], 60))
    other_driver = start(cluster, other, "intruder")
    try:
        wait_for(lambda: owner.state_of("mine") == S.TASK_RUNNING, 60)
        wait_for(lambda: bool(other.framework_id), 30)
        other_driver.kill("mine")
        wait_for(lambda: bool(other.refusals), 15,
                 message="the refused kill was not reported to the caller")
        code, message = other.refusals[0]
        assert code == bus_pb2.UNAUTHORIZED and "mine" in message
        assert not other.errors  # not fatal: the intruder stays subscribed
        # and the task is untouched
        state = cluster.state()
        task = next(t for t in state["tasks"] if t["task_info"]["task_id"] == "mine")
        assert task["status"]["state"] == "TASK_RUNNING"
        assert owner.state_of("mine") == S.TASK_RUNNING
    finally:
        stop(other_driver)
        stop(owner_driver)


def test_two_frameworks_with_equal_demand_get_equal_dominant_shares(cluster: Cluster) -> None:
    """Each framework takes one 0.5-cpu task from each offer and declines the rest, so the
    allocator decides who gets the freed resources: DRF must split the cluster evenly, up to
    one task each. (Of unknown demand, a framework is charged for what it is offered, as in
    Mesos: an agent's cpu-less leftovers offered to one in the cycle that hands out the last
    cpus count toward its share, and the last task may go to the other; a simulation of
    this test on the allocator core ends 6/6 or 7/5, never further apart, in 1,000 random
    interleavings. Frameworks that declare their demand get exact DRF: test_fair_share.)"""
    counters: dict[str, int] = {}

    def greedy(name: str) -> Recorder:
        def on_offers(driver: SchedulerDriver, offers: list[common_pb2.Offer]) -> None:
            for o in offers:
                if Resources.from_proto(o.resources).contains(Resources.of(cpus=0.5, mem=256)):
                    counters[name] = counters.get(name, 0) + 1
                    task = sleep_task(f"{name}-{counters[name]}", o, cpus=0.5, mem=256)
                    driver.accept([o.offer_id], [launch(task)],
                                  common_pb2.Filters(refuse_seconds=0))
                else:
                    driver.decline([o.offer_id], 0.0)
        return Recorder(on_offers=on_offers)

    a, b = greedy("drf-a"), greedy("drf-b")
    da, db = start(cluster, a, "drf-a"), start(cluster, b, "drf-b")
    total_cpus = 6.0  # 3 agents x 2 cpus

    def shares() -> tuple[float, float]:
        state = cluster.state()
        used = {a.framework_id: 0.0, b.framework_id: 0.0}
        for t in state["tasks"]:
            if t["framework_id"] in used and t["status"]["state"] in (
                    "TASK_STAGING", "TASK_STARTING", "TASK_RUNNING"):
                used[t["framework_id"]] += 0.5
        return used[a.framework_id] / total_cpus, used[b.framework_id] / total_cpus

    try:
        wait_for(lambda: sum(shares()) >= 0.99, 120,
                 message=lambda: f"cluster not full: shares {shares()}")
        sa, sb = shares()
        one_task = 0.5 / total_cpus
        assert abs(sa - 0.5) <= one_task + 1e-9 and abs(sb - 0.5) <= one_task + 1e-9, \
            f"dominant shares {sa:.2f} vs {sb:.2f}: more than one task from an even split"
    finally:
        stop(da)
        stop(db)


def test_every_service_serves_metrics_that_promtool_accepts(cluster: Cluster) -> None:
    """What an operator's Prometheus scrapes, from the master, allocator, offer-broker and
    every agent: text `promtool check metrics` accepts (HELP, TYPE, names, labels), with the
    counts that matter and the offer path's latency histograms."""
    import shutil
    import subprocess
    import urllib.request

    from prometheus_client.parser import text_string_to_metric_families

    from services.bus.election import detector_from_url

    promtool = shutil.which("promtool")
    assert promtool, "promtool is missing: `make system` installs Debian's prometheus"
    # One task through the whole offer path, so the latency histograms have samples.
    rec, driver = one_shot(cluster, "metered", lambda o: sleep_task("metered-1", o))
    try:
        wait_for(lambda: rec.state_of("metered-1") == S.TASK_RUNNING, 60,
                 message="the metered task never ran")
    finally:
        stop(driver)

    def fetch(url: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
        with urllib.request.urlopen(url + "/metrics", timeout=5) as r:
            text = r.read().decode()
        check = subprocess.run([promtool, "check", "metrics"], input=text, text=True,
                               capture_output=True, timeout=30)
        assert check.returncode == 0, f"{url}: promtool: {check.stdout}{check.stderr}"
        return {(s.name, tuple(sorted(s.labels.items()))): s.value
                for fam in text_string_to_metric_families(text) for s in fam.samples}

    def scrape(role: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
        detector = detector_from_url(cluster.url, role)
        detector.start()
        try:
            leader = detector.wait_for_leader(5.0)
        finally:
            detector.close()
        assert leader is not None, f"no {role} leader"
        return fetch(leader.endpoints["http"])

    master = scrape("master")
    assert master[("offerbus_master_elected", ())] == 1
    assert master[("offerbus_master_leaderships_total", ())] == 1
    assert master[("offerbus_master_agents", (("status", "AGENT_STATUS_REGISTERED"),))] == 3
    assert master[("offerbus_master_frames_received_total", ())] > 0
    assert master[("offerbus_master_launch_seconds_count", (("outcome", "running"),))] > 0
    allocator = scrape("allocator")
    assert allocator[("offerbus_allocator_cycle_seconds_count", ())] > 0
    broker = scrape("broker")
    assert sum(v for (name, _), v in broker.items()
               if name == "offerbus_broker_offer_round_trip_seconds_count") > 0
    for agent in cluster.state()["agents"]:
        endpoint = agent["agent_info"]["endpoint"]
        metrics = fetch(endpoint if "://" in endpoint else f"http://{endpoint}")
        assert metrics, f"agent {agent['agent_info']['hostname']} served no metrics"
