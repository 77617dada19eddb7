"""Forged frames on a real master's internal endpoint (issue 10, defect 5): a peer that says
it is the offer-broker, with a huge epoch or under another member's name, is refused with a
clear error and counted, and the real broker's offers and launches are still relayed (a
framework's task runs). The master used to take any epoch it was told as the new bar, so one
such frame fenced the real broker out for good."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import zmq

from frameworks.sdk.driver import SchedulerDriver
from infra.zookeeper import ZooKeeperServer
from schemas import common_pb2
from services.bus import codec
from services.bus.election import LeaderInfo, detector_from_url
from tests.e2e import (
    Cluster,
    Recorder,
    framework,
    launch,
    local_cluster_in,
    metric,
    sleep_task,
)
from tests.waiting import wait_for

S = common_pb2.TaskState
BROKER = codec.Role.Value("ROLE_BROKER")


@pytest.fixture
def cluster(zk: ZooKeeperServer, zk_admin: Any, tmp_path: Path, docker_client: Any,
            busybox_image: str) -> Iterator[Cluster]:
    with local_cluster_in(zk, zk_admin, tmp_path, "fencing", agents=1,
                          agent_resources="cpus:2;mem:1024;disk:10240;ports:[42200-42299]") as c:
        yield c


def leader(cluster: Cluster, role: str) -> LeaderInfo:
    detector = detector_from_url(cluster.url, role)
    detector.start()
    try:
        info = detector.wait_for_leader(5.0)
    finally:
        detector.close()
    assert info is not None, f"no {role} leader"
    return info


def forged(epoch: int, sender_id: str, heartbeat: bool = False) -> bytes:
    env = codec.Envelope(version=codec.PROTOCOL_VERSION, message_id=os.urandom(6).hex(),
                         sender_id=sender_id, sender_role=BROKER, epoch=epoch)  # type: ignore[arg-type]
    if heartbeat:
        env.heartbeat.interval_ms = 1000
    else:
        env.internal.allocator_decisions.SetInParent()  # what a broker says on connecting
    return env.SerializeToString()


def answers(sock: zmq.Socket[bytes], timeout_ms: int) -> list[codec.Envelope]:
    out = []
    while sock.poll(timeout_ms):
        out.append(codec.Envelope.FromString(sock.recv()))
        timeout_ms = 100
    return out


def test_forged_broker_frames_are_refused_and_the_real_broker_goes_on(
    cluster: Cluster
) -> None:
    master, broker = leader(cluster, "master"), leader(cluster, "broker")
    ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
    forgers = {name: ctx.socket(zmq.DEALER) for name in ("huge", "impostor")}
    driver: SchedulerDriver | None = None
    try:
        for sock in forgers.values():
            sock.setsockopt(zmq.LINGER, 0)
            sock.connect(master.endpoints["internal"])
        # The real broker's own name with an epoch from far in the future ...
        forgers["huge"].send(forged(10**12, broker.member_id))
        # ... and the real broker's epoch under another name.
        forgers["impostor"].send(forged(broker.epoch, "mallory"))
        for sock in forgers.values():  # in order after the forged frame: it was handled
            sock.send(forged(10**12, broker.member_id, heartbeat=True))
        got = {name: answers(sock, 8000) for name, sock in forgers.items()}
        assert all(got.values()), f"the master never answered a forger: {got}"

        # The real broker's offers still reach a framework, and its launch is relayed.
        launched: list[str] = []

        def on_offers(d: SchedulerDriver, offers: list[common_pb2.Offer]) -> None:
            if launched:
                d.decline([o.offer_id for o in offers], 5.0)
                return
            launched.append("t1")
            d.accept([offers[0].offer_id], [launch(sleep_task("t1", offers[0], cpus=0.1,
                                                              mem=16))])

        rec = Recorder(on_offers=on_offers)
        driver = SchedulerDriver(rec, framework("after-forgery"), cluster.url)
        driver.start()
        wait_for(lambda: rec.state_of("t1") == S.TASK_RUNNING, 45, message=lambda: (
            f"t1 is {rec.state_of('t1')}; offers seen {len(rec.offers_seen)}; the master "
            f"refused: {metric(master, 'offerbus_master_frames_dropped_total')}"))

        # Each forger was told why, and the master counted each by its reason.
        for name, sock in forgers.items():
            got[name] += answers(sock, 100)
        errors = {name: [e.error for e in envs if e.WhichOneof("payload") == "error"]
                  for name, envs in got.items()}
        assert all(e.code == codec.ErrorCode.Value("NOT_LEADER") and "fenced" in e.message
                   for es in errors.values() for e in es) and all(errors.values()), errors
        assert any("wrong_member" in e.message for e in errors["impostor"]), errors
        drops = 'offerbus_master_frames_dropped_total{{reason="{}"}}'
        assert metric(master, drops.format("newer_epoch")) >= 2  # the frame and its beat
        assert metric(master, drops.format("wrong_member")) == 1
        assert leader(cluster, "broker").key() == broker.key()  # nothing failed over
        state = cluster.state()
        assert [t["status"]["state"] for t in state["tasks"]] == ["TASK_RUNNING"], \
            json.dumps(state["tasks"])
    finally:
        if driver is not None:
            driver.stop()
            driver.join(10)
        for sock in forgers.values():
            sock.close(linger=0)
        ctx.term()
