"""Agent loss on real processes (issue 10, DESIGN §4 "agent dies"), with a short agent timeout
given to the master through the service kit's environment (OFFERBUS_MASTER_AGENT_TIMEOUT):

- an agent cut off (SIGSTOP) for longer than the timeout and back (SIGCONT): the master and a
  partition-aware framework see it unreachable, then its tasks are reconciled and reported
  RUNNING again, in the very same containers; nothing is killed;
- an agent SIGKILLed: the framework is told TASK_UNREACHABLE within the timeout + 1 s (the
  figure is printed); restarted from its work dir, the agent brings its tasks back RUNNING;
- an agent unreachable past a short gone timeout: GONE, its tasks TASK_GONE, and when it
  comes back its re-registration is refused."""

from __future__ import annotations

import os
import signal
import time
import urllib.request
from collections.abc import Iterator
from typing import Any

import pytest

from frameworks.sdk.driver import SchedulerDriver
from infra.zookeeper import ZooKeeperServer
from schemas import common_pb2
from services import tasks
from services.bus.election import detector_from_url
from services.cli import cluster as local_cluster
from tests.e2e import Cluster, Recorder, framework, launch, local_cluster_in, sleep_task
from tests.waiting import wait_for

S = common_pb2.TaskState
R = common_pb2.TaskStatus.Reason
AGENT_TIMEOUT = 2.0  # the master's --agent-timeout in these tests (default 5 s)
HEARTBEAT = 0.5  # every process's heartbeat (default 1 s): 4 beats per timeout
TASKS = 3
RESOURCES = "cpus:4;mem:2048;disk:10240;ports:[41200-41299]"


class Timed(Recorder):
    """A Recorder that also notes when each update arrived (monotonic clock)."""

    def __init__(self) -> None:
        super().__init__()
        self.arrivals: list[tuple[float, common_pb2.TaskStatus]] = []
        self.launched: list[str] = []
        self.on_offers = self._launch_once

    def update(self, driver: SchedulerDriver, status: common_pb2.TaskStatus) -> None:
        with self.lock:
            self.arrivals.append((time.monotonic(), status))
        super().update(driver, status)

    def _launch_once(self, driver: SchedulerDriver, offers: list[common_pb2.Offer]) -> None:
        if self.launched:
            driver.decline([o.offer_id for o in offers], 3600.0)
            return
        ops = [launch(sleep_task(f"t{i}", offers[0], cpus=0.1, mem=16)) for i in range(TASKS)]
        self.launched = [op.launch.tasks[0].task_id for op in ops]
        driver.accept([offers[0].offer_id], ops)

    def first(self, state: int, since: float = 0.0) -> dict[str, float]:
        """task id -> when it was first told `state` (after `since`)."""
        out: dict[str, float] = {}
        with self.lock:
            for at, st in self.arrivals:
                if st.state == state and at >= since:
                    out.setdefault(st.task_id, at)
        return out

    def all_in(self, state: int) -> bool:
        return bool(self.launched) and all(self.state_of(t) == state for t in self.launched)


@pytest.fixture
def env(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    """The master's options, through the service kit's OFFERBUS_<SERVICE>_<NAME> variables
    (inherited by the processes `offerbus up` starts)."""
    monkeypatch.setenv("OFFERBUS_MASTER_AGENT_TIMEOUT", str(AGENT_TIMEOUT))
    return monkeypatch


def cluster_in(zk: ZooKeeperServer, zk_admin: Any, tmp_path: Any,
               name: str) -> Any:
    return local_cluster_in(zk, zk_admin, tmp_path, name, agents=1, heartbeat=HEARTBEAT,
                            agent_resources=RESOURCES)


@pytest.fixture
def cluster(env: pytest.MonkeyPatch, zk: ZooKeeperServer, zk_admin: Any, tmp_path: Any,
            docker_client: Any, busybox_image: str) -> Iterator[Cluster]:
    with cluster_in(zk, zk_admin, tmp_path, "agent-loss") as c:
        yield c


@pytest.fixture
def short_gone(env: pytest.MonkeyPatch, zk: ZooKeeperServer, zk_admin: Any, tmp_path: Any,
               docker_client: Any, busybox_image: str) -> Iterator[Cluster]:
    env.setenv("OFFERBUS_MASTER_AGENT_GONE_TIMEOUT", "3")
    with cluster_in(zk, zk_admin, tmp_path, "agent-gone") as c:
        yield c


def agent_pid(cluster: Cluster) -> int:
    return int((cluster.run_dir / "pids" / "agent-1.pid").read_text())


def agent_status(cluster: Cluster) -> str:
    (agent,) = cluster.state()["agents"]
    return str(agent["status"])


def master_tasks(cluster: Cluster) -> dict[str, str]:
    return {t["task_info"]["task_id"]: t["status"]["state"] for t in cluster.state()["tasks"]}


def containers(docker_client: Any, framework_id: str) -> dict[str, tuple[str, str]]:
    """task id -> (container id, docker status), of this framework's containers only; from
    the low-level list (no inspect per container, which fails for one removed meanwhile)."""
    return {c["Labels"]["org.offerbus.task_id"]: (c["Id"], c["State"])
            for c in docker_client.api.containers(
                all=True, filters={"label": f"org.offerbus.framework_id={framework_id}"})}


def master_metric(cluster: Cluster, name: str) -> float:
    """The sum of one counter's samples on the leading master's /metrics."""
    detector = detector_from_url(cluster.url, "master")
    detector.start()
    try:
        leader = detector.wait_for_leader(5.0)
    finally:
        detector.close()
    assert leader is not None
    with urllib.request.urlopen(leader.endpoints["http"] + "/metrics", timeout=5) as r:
        text = r.read().decode()
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
               if line.startswith(name) and not line.startswith("#"))


def running_framework(cluster: Cluster, name: str) -> tuple[Timed, SchedulerDriver]:
    rec = Timed()
    driver = SchedulerDriver(rec, framework(name), cluster.url)  # partition-aware
    driver.start()
    wait_for(lambda: rec.all_in(S.TASK_RUNNING), 60,
             message=lambda: f"tasks: {[rec.state_of(t) for t in rec.launched]}")
    return rec, driver


def ended(rec: Recorder) -> dict[str, str]:
    with rec.lock:
        return {tid: S.Name(st.state) for tid, history in rec.updates.items()
                for st in history if tasks.is_terminal(st.state)}


def test_an_agent_cut_off_past_the_timeout_and_back_keeps_its_tasks(
    cluster: Cluster, docker_client: Any,
) -> None:
    rec, driver = running_framework(cluster, "cut-off")
    try:
        before = containers(docker_client, rec.framework_id)
        assert set(before) == set(rec.launched)
        assert all(status == "running" for _, status in before.values())
        pid = agent_pid(cluster)
        os.kill(pid, signal.SIGSTOP)
        stopped_at = time.monotonic()
        try:
            wait_for(lambda: agent_status(cluster) == "AGENT_STATUS_UNREACHABLE",
                     AGENT_TIMEOUT + 5, message="the master never declared the agent")
            wait_for(lambda: rec.all_in(S.TASK_UNREACHABLE), 5,
                     message=lambda: f"tasks: {[rec.state_of(t) for t in rec.launched]}")
            assert set(master_tasks(cluster).values()) == {"TASK_UNREACHABLE"}
            # Cut off for longer than the timeout (it counts from the agent's last beat).
            wait_for(lambda: time.monotonic() >= stopped_at + AGENT_TIMEOUT + 1.0,
                     AGENT_TIMEOUT + 2, interval=0.05, message="the clock stopped")
            assert agent_status(cluster) == "AGENT_STATUS_UNREACHABLE"
        finally:
            os.kill(pid, signal.SIGCONT)
        cut_for = time.monotonic() - stopped_at

        wait_for(lambda: agent_status(cluster) == "AGENT_STATUS_REGISTERED", 30,
                 message="the agent never came back")
        wait_for(lambda: rec.all_in(S.TASK_RUNNING), 15,
                 message=lambda: f"tasks: {[rec.state_of(t) for t in rec.launched]}")
        back_at = max(rec.first(S.TASK_RUNNING, since=stopped_at).values())
        for task_id in rec.launched:
            last = rec.last(task_id)
            assert last is not None and last.reason == R.REASON_AGENT_REREGISTERED, last
        assert master_tasks(cluster) == {t: "TASK_RUNNING" for t in rec.launched}
        assert containers(docker_client, rec.framework_id) == before, \
            "containers were killed, restarted or launched twice"
        assert not ended(rec), f"tasks ended: {ended(rec)}"
        assert local_cluster.alive(pid), "the agent process did not survive"
        print(f"agent cut off for {cut_for:.2f}s (timeout {AGENT_TIMEOUT:g}s): its {TASKS} "
              f"tasks reported RUNNING again {back_at - stopped_at - cut_for:.2f}s after "
              f"SIGCONT, same containers")
    finally:
        driver.stop(failover=False)
        driver.join(10)


def test_a_sigkilled_agent_is_reported_unreachable_within_the_timeout_plus_a_second(
    cluster: Cluster, docker_client: Any,
) -> None:
    rec, driver = running_framework(cluster, "killed")
    try:
        before = containers(docker_client, rec.framework_id)
        os.kill(agent_pid(cluster), signal.SIGKILL)
        killed_at = time.monotonic()
        wait_for(lambda: rec.all_in(S.TASK_UNREACHABLE), AGENT_TIMEOUT + 5, interval=0.01,
                 message=lambda: f"tasks: {[rec.state_of(t) for t in rec.launched]}")
        told = rec.first(S.TASK_UNREACHABLE, since=killed_at)
        told_in = max(told.values()) - killed_at
        print(f"agent SIGKILL -> framework told TASK_UNREACHABLE in {told_in:.2f}s "
              f"(agent timeout {AGENT_TIMEOUT:g}s, heartbeat {HEARTBEAT:g}s; target <= "
              f"{AGENT_TIMEOUT + 1:g}s)")
        assert told_in <= AGENT_TIMEOUT + 1.0
        assert told_in >= AGENT_TIMEOUT - HEARTBEAT * 1.5 - 0.1, "declared before its timeout"

        # Restarted from its work dir within the gone timeout: the same tasks, RUNNING again.
        local_cluster.respawn(cluster.run_dir, "agent-1")
        wait_for(lambda: rec.all_in(S.TASK_RUNNING), 30,
                 message=lambda: f"tasks: {[rec.state_of(t) for t in rec.launched]}")
        assert containers(docker_client, rec.framework_id) == before
        assert not ended(rec), f"tasks ended: {ended(rec)}"
    finally:
        driver.stop(failover=False)
        driver.join(10)


def test_an_agent_unreachable_past_the_gone_timeout_is_gone_for_good(
    short_gone: Cluster, docker_client: Any,
) -> None:
    cluster = short_gone
    rec, driver = running_framework(cluster, "gone")
    pid = agent_pid(cluster)
    try:
        os.kill(pid, signal.SIGSTOP)
        stopped_at = time.monotonic()
        try:
            wait_for(lambda: rec.all_in(S.TASK_GONE), AGENT_TIMEOUT + 3 + 10,
                     message=lambda: f"tasks: {[rec.state_of(t) for t in rec.launched]}")
            assert rec.first(S.TASK_UNREACHABLE, since=stopped_at).keys() == \
                set(rec.launched)  # unreachable first, then gone
            gone_in = max(rec.first(S.TASK_GONE, since=stopped_at).values()) - stopped_at
            assert agent_status(cluster) == "AGENT_STATUS_GONE"
            last = rec.last(rec.launched[0])
            assert last is not None and last.reason == R.REASON_AGENT_REMOVED
            refused_before = master_metric(
                cluster, 'offerbus_master_calls_rejected_total{code="NOT_FOUND"}')
        finally:
            os.kill(pid, signal.SIGCONT)
        # It comes back and tries to re-register: refused, and it stays gone.
        wait_for(lambda: master_metric(
            cluster, 'offerbus_master_calls_rejected_total{code="NOT_FOUND"}')
            > refused_before, 30, message="the gone agent's re-registration was not refused")
        assert agent_status(cluster) == "AGENT_STATUS_GONE"
        assert all(rec.state_of(t) == S.TASK_GONE for t in rec.launched)
        print(f"agent stopped -> its tasks TASK_GONE in {gone_in:.2f}s (agent timeout "
              f"{AGENT_TIMEOUT:g}s + gone timeout 3s); its re-registration refused")
    finally:
        driver.stop(failover=False)
        driver.join(10)


def test_a_gone_agent_that_comes_back_shuts_its_tasks_down(
    short_gone: Cluster, docker_client: Any,
) -> None:
    cluster = short_gone
    rec, driver = running_framework(cluster, "gone-back")
    pid = agent_pid(cluster)
    try:
        os.kill(pid, signal.SIGSTOP)
        try:
            wait_for(lambda: agent_status(cluster) == "AGENT_STATUS_GONE", 20,
                     message="the agent was never declared gone")
        finally:
            os.kill(pid, signal.SIGCONT)
        wait_for(lambda: not [c for c, status in containers(
            docker_client, rec.framework_id).values() if status == "running"], 15,
            message="the gone agent's containers still run: nobody will ever stop them")
    finally:
        driver.stop(failover=False)
        driver.join(10)
