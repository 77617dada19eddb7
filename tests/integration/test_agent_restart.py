"""An agent SIGKILLed while its tasks finish, and restarted from its work dir a few seconds later
(issue 10, defect 1): every task's terminal update still arrives, with the container's real exit
code, and none is reported lost or failed for an executor that "never re-subscribed"."""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest

from frameworks.sdk.driver import SchedulerDriver
from infra.zookeeper import ZooKeeperServer
from schemas import common_pb2
from services import tasks
from services.cli import cluster as local_cluster
from services.resources import Resources
from tests.e2e import Cluster, Recorder, framework, launch, local_cluster_in, sleep_task
from tests.waiting import wait_for

S = common_pb2.TaskState
TASKS = 24
ENDS_OVER_S = 4  # the tasks end one after another over this many seconds ...
DOWN_FOR_S = 5.0  # ... while their agent is down this long


@pytest.fixture
def cluster(zk: ZooKeeperServer, zk_admin: Any, tmp_path: Any, docker_client: Any,
            busybox_image: str) -> Iterator[Cluster]:
    with local_cluster_in(zk, zk_admin, tmp_path, "agent-restart", agents=1,
                          agent_resources="cpus:8;mem:4096;disk:10240;ports:[41000-41099]") as c:
        yield c


def ended(rec: Recorder, task_ids: list[str]) -> list[str]:
    """The tasks of `task_ids` whose last update is terminal."""
    return [t for t in list(task_ids)
            if (state := rec.state_of(t)) is not None and tasks.is_terminal(S.ValueType(state))]


def not_ended(rec: Recorder, task_ids: list[str]) -> dict[str, list[str]]:
    """The tasks of `task_ids` not ended, with the states they were reported in."""
    done = set(ended(rec, task_ids))
    return {t: [S.Name(u.state) for u in rec.updates.get(t, [])]
            for t in list(task_ids) if t not in done}


def expected_exit(i: int) -> int:
    return i % 4  # 0: FINISHED; 1, 2, 3: FAILED with that code


def test_tasks_that_end_while_their_agent_is_down_keep_their_exit_codes(
    cluster: Cluster, docker_client: Any
) -> None:
    # Every task waits for one wall-clock moment (so all are RUNNING first), then ends at
    # its own second of the agent's outage with its own exit code.
    end_at = int(time.time()) + 30
    launched: list[str] = []

    def on_offers(driver: SchedulerDriver, offers: list[common_pb2.Offer]) -> None:
        if launched:
            driver.decline([o.offer_id for o in offers], 60.0)
            return
        ops = []
        for i in range(TASKS):
            at = end_at + i % ENDS_OVER_S
            script = (f"while [ $(date +%s) -lt {at} ]; do sleep 0.1; done; "
                      f"exit {expected_exit(i)}")
            task = sleep_task(f"t{i}", offers[0], cpus=0.1, mem=16,
                              command=["sh", "-c", script])
            launched.append(task.task_id)
            ops.append(launch(task))
        driver.accept([offers[0].offer_id], ops)

    rec = Recorder(on_offers=on_offers)
    driver = SchedulerDriver(rec, framework("finishing"), cluster.url)
    driver.start()
    try:
        wait_for(lambda: len(launched) == TASKS
                 and all(rec.state_of(t) == S.TASK_RUNNING for t in launched), 25,
                 message=lambda: f"states: {[rec.state_of(t) for t in launched]}")
        # SIGKILL the agent just before the first tasks end; restart it DOWN_FOR_S later.
        wait_for(lambda: time.time() >= end_at - 0.5, 35, interval=0.05,
                 message="the clock stopped")
        os.kill(int((cluster.run_dir / "pids" / "agent-1.pid").read_text()), signal.SIGKILL)
        killed_at = time.monotonic()
        wait_for(lambda: time.monotonic() >= killed_at + DOWN_FOR_S, DOWN_FOR_S + 1,
                 interval=0.05, message="the clock stopped")
        local_cluster.respawn(cluster.run_dir, "agent-1")

        wait_for(lambda: len(ended(rec, launched)) == TASKS, 60,
                 message=lambda: f"not ended: {set(launched) - set(ended(rec, launched))}")
        wrong = {}
        for i, task_id in enumerate(launched):
            last = rec.last(task_id)
            assert last is not None
            want = S.TASK_FINISHED if expected_exit(i) == 0 else S.TASK_FAILED
            if (last.state != want or not last.HasField("exit_code")
                    or last.exit_code != expected_exit(i)):
                wrong[task_id] = (S.Name(last.state),
                                  common_pb2.TaskStatus.Reason.Name(last.reason),
                                  last.exit_code if last.HasField("exit_code") else None,
                                  last.message,
                                  [(S.Name(u.state), common_pb2.TaskStatus.Source.Name(u.source))
                                   for u in rec.updates[task_id]])
        assert not wrong, f"{len(wrong)} of {TASKS} tasks lost their result: {wrong}"
    finally:
        driver.stop(failover=False)
        driver.join(10)


FLOW = 110  # short tasks launched one after another, as offers come, up to 8 an offer
TASK_SHAPE = Resources.of(cpus=0.1, mem=16)
KILL_AFTER = 30  # SIGKILL the agent once this many have ended


@pytest.mark.timeout(180)  # (its waits, 60 + 5 + 75 s, say what is missing before this)
def test_a_flow_of_short_tasks_through_an_agent_restart_loses_no_result(
    cluster: Cluster, docker_client: Any
) -> None:
    launched: list[str] = []
    lock = threading.Lock()

    def on_offers(driver: SchedulerDriver, offers: list[common_pb2.Offer]) -> None:
        for offer in offers:
            held = Resources.from_proto(offer.resources)
            fit = next((n for n in range(8, 0, -1)
                        if held.contains(Resources.total([TASK_SHAPE] * n))), 0)
            with lock:
                room = FLOW - len(launched)
                batch = [f"f{len(launched) + k}" for k in range(min(room, fit))]
                launched.extend(batch)
            if not batch:  # all launched (or too small an offer: no filter)
                driver.decline([offer.offer_id], 60.0 if room == 0 else 0.0)
                continue
            ops = []
            for task_id in batch:
                i = int(task_id[1:])
                script = f"sleep {0.2 * (i % 6):.1f}; exit {expected_exit(i)}"
                ops.append(launch(sleep_task(task_id, offer, cpus=0.1, mem=16,
                                             command=["sh", "-c", script])))
            driver.accept([offer.offer_id], ops)

    rec = Recorder(on_offers=on_offers)
    driver = SchedulerDriver(rec, framework("flow"), cluster.url)
    driver.start()
    try:
        wait_for(lambda: len(ended(rec, launched)) >= KILL_AFTER, 60,
                 message=lambda: f"{len(ended(rec, launched))} tasks ended")
        os.kill(int((cluster.run_dir / "pids" / "agent-1.pid").read_text()), signal.SIGKILL)
        killed_at = time.monotonic()
        wait_for(lambda: time.monotonic() >= killed_at + DOWN_FOR_S, DOWN_FOR_S + 1,
                 interval=0.05, message="the clock stopped")
        local_cluster.respawn(cluster.run_dir, "agent-1")

        wait_for(lambda: len(launched) == FLOW and len(ended(rec, launched)) == FLOW, 75,
                 message=lambda: f"{len(launched)} launched, {len(ended(rec, launched))} ended;"
                 f" not ended: {not_ended(rec, launched)}")
        wrong = {}
        for task_id in launched:
            history = rec.updates[task_id]
            last, i = history[-1], int(task_id[1:])
            ran = any(u.state == S.TASK_RUNNING for u in history)
            if ran:
                want = S.TASK_FINISHED if expected_exit(i) == 0 else S.TASK_FAILED
                ok = (last.state == want and last.HasField("exit_code")
                      and last.exit_code == expected_exit(i))
            else:  # sent to the dead agent: dropped, never run (and never run twice)
                ok = last.state == S.TASK_DROPPED
            if not ok:
                wrong[task_id] = (S.Name(last.state),
                                  common_pb2.TaskStatus.Reason.Name(last.reason),
                                  last.exit_code if last.HasField("exit_code") else None,
                                  last.message,
                                  [(S.Name(u.state), common_pb2.TaskStatus.Source.Name(u.source))
                                   for u in history])
        assert not wrong, f"{len(wrong)} of {FLOW} tasks lost their result: {wrong}"
    finally:
        driver.stop(failover=False)
        driver.join(10)
