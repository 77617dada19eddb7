"""The agent emulator against the real services (issue 8): a local cluster with a standby of
every central service (real ZooKeeper, masters, allocators, offer-brokers; no real agents)
and one emulator process hosting 200 virtual agents on one connection. All register; a
framework (the SDK) launches tasks onto them, which reach RUNNING, and FINISHED when their
run time says; after SIGKILL of the leading master, every virtual agent re-registers with
the standby and every running task is known again. The framework emulator's frameworks
launch their set share of tasks, which finish."""

from __future__ import annotations

import json
import re
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from frameworks.sdk.driver import SchedulerDriver
from infra.zookeeper import ZooKeeperServer
from schemas import common_pb2
from services.cli import cluster as local_cluster
from services.emulator.agents import RUN_LABEL
from services.resources import Resources
from tests.e2e import Cluster, Recorder, S, framework, launch, local_cluster_in
from tests.waiting import wait_for

AGENTS = 200
FINITE = 10  # tasks that finish after 1 s
ENDLESS = 20  # tasks that run until killed
FAILOVER = 30.0


@pytest.fixture(scope="module")
def cluster(zk: ZooKeeperServer, zk_admin: Any,
            tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    run_dir = tmp_path_factory.mktemp("emulator")
    with local_cluster_in(zk, zk_admin, run_dir, "emulator", agents=0, standbys=1,
                          offer_timeout=60.0) as c:
        local_cluster.spawn(run_dir, "emulator", [
            "-m", "services.emulator", "agents", "--cluster", c.url, "--count", str(AGENTS),
            "--cpus", "2", "--mem", "1024", "--window", "50"])
        yield c


def registered(state: dict[str, Any]) -> int:
    return sum(a.get("status") == "AGENT_STATUS_REGISTERED" for a in state["agents"])


def emulator_state(run_dir: Path, name: str = "emulator",
                   started: str = "agent emulator started") -> dict[str, Any]:
    log = (run_dir / "logs" / f"{name}.log").read_text()
    http = next(m.group(1) for line in log.splitlines() if started in line
                for m in [re.search(r"http=(http://\S+)", line)] if m)
    with urllib.request.urlopen(http + "/state", timeout=5) as r:
        return json.loads(r.read())  # type: ignore[no-any-return]


def task(task_id: str, offer: common_pb2.Offer, run_s: float | None) -> common_pb2.TaskInfo:
    t = common_pb2.TaskInfo(task_id=task_id, name=task_id, agent_id=offer.agent_id)
    t.resources.extend(Resources.of(cpus=0.1, mem=32).to_proto())
    t.command.value = "true"
    if run_s is not None:
        t.labels[RUN_LABEL] = str(run_s)
    return t


class Launcher(Recorder):
    """Launches one task per offer (finite ones first) until all are launched; declines
    the rest for a long while."""

    def __init__(self) -> None:
        super().__init__()
        self.todo = [(f"fin-{i}", 1.0) for i in range(FINITE)] + \
            [(f"run-{i}", None) for i in range(ENDLESS)]
        self.agents: dict[str, str] = {}  # task id -> agent id

    def offers(self, driver: SchedulerDriver, offers: list[common_pb2.Offer]) -> None:
        super().offers(driver, offers)
        for o in offers:
            if not self.todo:
                driver.decline([o.offer_id], refuse_seconds=3600)
                continue
            tid, run_s = self.todo.pop(0)
            self.agents[tid] = o.agent_id
            driver.accept([o.offer_id], [launch(task(tid, o, run_s))])


def test_virtual_agents_run_tasks_and_survive_a_master_failover(cluster: Cluster) -> None:
    wait_for(lambda: registered(cluster.state()) == AGENTS, 60,
             message=lambda: f"{registered(cluster.state())}/{AGENTS} virtual agents "
                             "registered")
    hosts = {a["agent_info"]["hostname"] for a in cluster.state()["agents"]}
    assert hosts == {f"emu-{i:05d}" for i in range(AGENTS)}

    sched = Launcher()
    driver = SchedulerDriver(sched, framework("emulated"), cluster.url)
    driver.start()
    try:
        fin = [f"fin-{i}" for i in range(FINITE)]
        run = [f"run-{i}" for i in range(ENDLESS)]
        wait_for(lambda: all(sched.state_of(t) == S.TASK_FINISHED for t in fin)
                 and all(sched.state_of(t) == S.TASK_RUNNING for t in run), 60,
                 message=lambda: f"states: {[(t, sched.state_of(t)) for t in fin + run]}")
        with sched.lock:
            for t in fin:  # each went STARTING, RUNNING, FINISHED, in order
                assert [u.state for u in sched.updates[t]] == [
                    S.TASK_STARTING, S.TASK_RUNNING, S.TASK_FINISHED], sched.updates[t]
            for t in fin + run:
                assert all(u.agent_id == sched.agents[t] for u in sched.updates[t])
        assert emulator_state(cluster.run_dir)["running"] == ENDLESS

        # SIGKILL the leading master: the standby leads, every virtual agent re-registers
        # with its tasks, every running task is known again.
        _, old, _ = cluster.kill_leader("master")
        wait_for(lambda: cluster.leader("master").epoch > old.epoch, FAILOVER,
                 message="no standby master took over")

        def recovered() -> bool:
            state = cluster.state()
            running = {t["task_info"]["task_id"]: t for t in state["tasks"]
                       if t["status"].get("state") == "TASK_RUNNING"}
            return registered(state) == AGENTS and set(running) == set(run) and all(
                running[t]["agent_id"] == sched.agents[t] for t in run)
        # (the new leader answers 503 until it has loaded the registry)
        wait_for(recovered, FAILOVER, ignore=(OSError,), message=lambda: f"after failover: "
                 f"{registered(cluster.state())}/{AGENTS} registered, tasks "
                 f"{sorted(t['task_info']['task_id'] for t in cluster.state()['tasks'])}")
        counts = emulator_state(cluster.run_dir)["counts"]
        assert counts["reregistrations_sent"] >= AGENTS
        # Killed through the new master: the virtual agent reports TASK_KILLED.
        driver.kill("run-0")
        wait_for(lambda: sched.state_of("run-0") == S.TASK_KILLED, 30,
                 message=lambda: f"run-0: {sched.last('run-0')}")
    finally:
        driver.stop(failover=False)
        driver.join(10)


def test_emulated_frameworks_launch_their_tasks_onto_virtual_agents(cluster: Cluster) -> None:
    local_cluster.spawn(cluster.run_dir, "frameworks", [
        "-m", "services.emulator", "frameworks", "--cluster", cluster.url, "--count", "2",
        "--accept-rate", "0.5", "--tasks-per-offer", "2", "--max-tasks", "10",
        "--task-run-s", "0.5", "--task-cpus", "0.5", "--task-mem", "64"])

    def totals() -> dict[str, int]:
        try:
            return emulator_state(cluster.run_dir, "frameworks",  # type: ignore[no-any-return]
                                  "framework emulator started")["totals"]
        except (OSError, StopIteration):
            return {}
    wait_for(lambda: totals().get("ended_TASK_FINISHED") == 20, 60,
             message=lambda: f"frameworks: {totals()}")
    assert totals()["launched"] == 20 and totals()["ended"] == 20
    state = cluster.state()
    finished = [t for t in state["tasks"] if t["task_info"]["task_id"].startswith("emu-fw-")]
    assert {t["agent_id"] for t in finished} <= {a["agent_info"]["agent_id"]
                                                 for a in state["agents"]}
