"""An agent's TCP connection to the master reset under it, for less than either side's
heartbeat timeout (a proxy moved in or out, a NAT or firewall dropping the flow; found by the
chaos suite's `resets.toml`): a launch the master sent meanwhile went nowhere, and nobody
ever said so. The agent re-registers whenever its link comes back, so the master asks it
about every task still staging there and the framework hears what became of it."""

from __future__ import annotations

import os
import signal
import threading
from collections.abc import Iterator
from typing import Any

import pytest

from frameworks.sdk.driver import SchedulerDriver
from infra.zookeeper import ZooKeeperServer
from schemas import common_pb2
from services import tasks
from tests.e2e import (
    Cluster,
    Recorder,
    framework,
    launch,
    local_cluster_in,
    reset_connections,
    sleep_task,
)
from tests.waiting import wait_for

S = common_pb2.TaskState


@pytest.fixture
def cluster(zk: ZooKeeperServer, zk_admin: Any, tmp_path: Any, docker_client: Any,
            busybox_image: str) -> Iterator[Cluster]:
    with local_cluster_in(zk, zk_admin, tmp_path, "agent-link", agents=1) as c:
        yield c


def test_a_launch_sent_while_the_agent_link_was_reset_is_answered(cluster: Cluster) -> None:
    offers: list[common_pb2.Offer] = []
    got_offer = threading.Event()

    def on_offers(driver: SchedulerDriver, new: list[common_pb2.Offer]) -> None:
        offers.extend(new)
        got_offer.set()  # held: answered below, while the link is down

    rec = Recorder(on_offers=on_offers)
    driver = SchedulerDriver(rec, framework("link"), cluster.url)
    driver.start()
    agent_pid = int((cluster.run_dir / "pids" / "agent-1.pid").read_text())
    front = int(cluster.leader().endpoints["front"].rsplit(":", 1)[1])
    stopped = False
    try:
        wait_for(got_offer.is_set, 30, message="no offer")
        # Freeze the agent (so it cannot reconnect yet) and reset its link to the master.
        os.kill(agent_pid, signal.SIGSTOP)
        stopped = True
        assert reset_connections(agent_pid, front) >= 1
        offer = offers[0]
        driver.accept([offer.offer_id], [launch(sleep_task("t-1", offer))])

        def staging() -> bool:
            return any(t["status"].get("task_id") == "t-1"
                       and t["status"].get("state") == "TASK_STAGING"
                       for t in cluster.state().get("tasks", []))

        wait_for(staging, 10, message="the master never launched t-1")
        os.kill(agent_pid, signal.SIGCONT)  # well inside both heartbeat timeouts
        stopped = False
        def answered() -> bool:
            st = rec.state_of("t-1")
            return st is not None and (tasks.is_terminal(S.ValueType(st))
                                       or st == S.TASK_RUNNING)

        wait_for(answered, 20,
                 message=lambda: f"t-1 is still {rec.updates.get('t-1')} for its framework")
        last = rec.last("t-1")
        assert last is not None
        # The launch was lost with the old connection: the agent never saw it.
        assert last.state == S.TASK_DROPPED, S.Name(last.state)
    finally:
        if stopped:
            os.kill(agent_pid, signal.SIGCONT)
        driver.stop(failover=False)
        driver.join(10)
