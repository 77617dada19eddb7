"""The allocator and the offer-broker as real PROCESSES on real sockets, with the test playing
the master: a real StatePublisher and internal RouterServer, advertised through a real
standalone election. Offers flow, a decline filter holds, an accept launches, and a
SIGKILLed broker is replaced with fresh offer ids while the old ones are refused."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import pytest
import zmq

from schemas import common_pb2, internal_pb2, scheduler_pb2, state_pb2
from services.bus import codec
from services.bus.election import StandaloneContender, StandaloneDetector
from services.bus.epoch import EpochFence
from services.bus.peer import RouterServer, Sender
from services.bus.reactor import Reactor
from services.bus.statestream import StatePublisher
from services.bus.stream_core import StateEntry
from services.resources import Resources
from tests.waiting import wait_for

REPO = Path(__file__).resolve().parents[2]
BROKER = codec.Role.Value("ROLE_BROKER")
START = 15.0  # a cold Python start on a busy machine
STEP = 5.0
FW = "fw-1"
AGENT_RES = Resources.of(cpus=2, mem=1024)
TASK_RES = Resources.of(cpus=0.5, mem=128)
T = TypeVar("T")


class Master:
    """The master's side of the internal protocol and the state stream, pumped by the test."""

    def __init__(self, run_dir: Path) -> None:
        self.reactor = Reactor()
        self.ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
        self.sender = Sender("m1", codec.Role.Value("ROLE_MASTER"))
        # Like the real master: the internal port acts only on the elected broker.
        self.fence = EpochFence(frozenset({BROKER}))
        self.internal = RouterServer(self.reactor, self.ctx, "tcp://127.0.0.1:*", self.sender,
                                     self._on_internal, fence=self.fence, name="internal")
        self.brokers = StandaloneDetector(run_dir, "broker")
        self.reactor.add_reader(self.brokers, lambda: [
            self.fence.follow(BROKER, e.leader) for e in self.brokers.events()])
        self.brokers.start()
        self.publisher = StatePublisher(self.reactor, self.ctx, self.sender,
                                        pub_bind="tcp://127.0.0.1:*",
                                        snapshot_bind="tcp://127.0.0.1:*", epoch=0)
        self.publisher.deactivate()
        self.received: list[codec.Envelope] = []
        self.broker: tuple[bytes, int] | None = None  # (peer, epoch) of the latest broker
        self.contender = StandaloneContender(run_dir, "master", "m1", {
            "front": "tcp://127.0.0.1:1", "internal": self.internal.endpoint,
            "pub": self.publisher.pub_endpoint, "snapshot": self.publisher.snapshot_endpoint,
            "http": "http://127.0.0.1:1"})
        self.contender.start()
        epoch = wait_for(lambda: self.contender.leading_epoch, STEP, message="master not elected")
        assert epoch is not None
        self.sender.epoch = epoch
        self.publisher.restart(epoch, [])

    def _on_internal(self, peer: bytes, env: codec.Envelope) -> None:
        if env.sender_role == BROKER:
            self.broker = (peer, env.epoch)
        self.received.append(env)

    def pump_until(self, cond: Callable[[], T], timeout: float, message: str) -> T:
        def step() -> T:
            self.reactor.run_once(0.02)
            return cond()
        return wait_for(step, timeout, interval=0, message=message)

    def until_offered(self, agents: set[str], start: int, timeout: float,
                      message: str) -> dict[str, common_pb2.Offer]:
        """The latest offer per agent received since `start`, once all `agents` have one."""
        def ready() -> dict[str, common_pb2.Offer] | None:
            latest = latest_by_agent(self.offers(start))
            return latest if agents <= latest.keys() else None
        out = self.pump_until(ready, timeout, message)
        assert out is not None
        return out

    def pump_for(self, seconds: float) -> None:
        """Run the loop for a while: to see that something does NOT happen."""
        self.reactor.run(timeout=seconds)

    def publish(self, *entries: StateEntry) -> None:
        self.publisher.publish(entries)

    def send_broker(self, msg: internal_pb2.InternalMessage) -> None:
        assert self.broker is not None
        env = codec.Envelope()
        env.internal.CopyFrom(msg)
        assert self.internal.send(self.broker[0], env)

    def rejections(self, start: int = 0) -> list[Any]:
        """The FrameworkEvents (envelopes: `end_tasks` with them) that carry AcceptRejected."""
        return [env.internal.framework_event for env in self.received[start:]
                if env.internal.WhichOneof("kind") == "framework_event"
                and env.internal.framework_event.event.WhichOneof("event") == "accept_rejected"]

    def events(self, kind: str, start: int = 0) -> list[Any]:
        """Payloads of the given InternalMessage kind (or FrameworkEvent event kind)."""
        out = []
        for env in self.received[start:]:
            msg = env.internal
            if msg.WhichOneof("kind") == kind:
                out.append(getattr(msg, kind))
            elif msg.WhichOneof("kind") == "framework_event":
                ev = msg.framework_event.event
                if ev.WhichOneof("event") == kind:
                    out.append(getattr(ev, kind))
        return out

    def offers(self, start: int = 0) -> list[common_pb2.Offer]:
        return [o for ev in self.events("offers", start) for o in ev.offers]

    def close(self) -> None:
        self.reactor.remove_reader(self.brokers)
        self.brokers.close()
        self.contender.close()
        self.internal.close()
        self.publisher.close()
        self.ctx.destroy(linger=0)


def agent(agent_id: str) -> StateEntry:
    e = StateEntry(key=f"agents/{agent_id}")
    rec = e.value.agent
    rec.status = state_pb2.AgentRecord.Status.AGENT_STATUS_REGISTERED
    rec.agent_info.agent_id = agent_id
    rec.agent_info.hostname = f"host-{agent_id}"
    rec.agent_info.resources.extend(AGENT_RES.to_proto())
    return e


def framework(fid: str) -> StateEntry:
    e = StateEntry(key=f"frameworks/{fid}")
    e.value.framework.framework_info.framework_id = fid
    e.value.framework.framework_info.role = "web"
    e.value.framework.connected = True
    return e


def task(fid: str, task_id: str, agent_id: str) -> StateEntry:
    e = StateEntry(key=f"tasks/{fid}/{task_id}")
    rec = e.value.task
    rec.framework_id, rec.agent_id = fid, agent_id
    rec.task_info.task_id = task_id
    rec.task_info.resources.extend(TASK_RES.to_proto())
    rec.status.task_id = task_id
    rec.status.state = common_pb2.TaskState.TASK_RUNNING
    return e


def call(fid: str, **kinds: Any) -> internal_pb2.InternalMessage:
    msg = internal_pb2.InternalMessage()
    msg.framework_call.framework_id = fid
    msg.framework_call.call.CopyFrom(scheduler_pb2.SchedulerCall(framework_id=fid, **kinds))
    return msg


def resources(offer: common_pb2.Offer) -> Resources:
    return Resources.from_proto(offer.resources) - Resources()


def latest_by_agent(offers: list[common_pb2.Offer]) -> dict[str, common_pb2.Offer]:
    return {o.agent_id: o for o in offers}


@pytest.fixture
def spawn(tmp_path: Path) -> Iterator[Callable[..., subprocess.Popen[bytes]]]:
    started: list[subprocess.Popen[bytes]] = []

    def start(service: str, member_id: str, *flags: str) -> subprocess.Popen[bytes]:
        logs = (tmp_path / f"{member_id}.log").open("wb")
        proc = subprocess.Popen(
            [sys.executable, "-m", f"services.{service}", "--cluster", f"file://{tmp_path}",
             "--id", member_id, *flags],
            cwd=REPO, stdout=logs, stderr=subprocess.STDOUT,
            env={**os.environ, "PYTHONPATH": str(REPO)})
        started.append(proc)
        return proc

    yield start
    for proc in started:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
    for proc in started:
        try:
            proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def http_get(run_dir: Path, role: str, path: str) -> bytes:
    detector = StandaloneDetector(run_dir, role)
    detector.start()
    try:
        leader = detector.wait_for_leader(STEP)
        assert leader is not None, f"no {role} leader"
        with urllib.request.urlopen(leader.endpoints["http"] + path, timeout=STEP) as resp:
            body: bytes = resp.read()
            return body
    finally:
        detector.close()


def test_offers_flow_filters_hold_launches_land_and_a_killed_broker_is_replaced(
    tmp_path: Path, spawn: Callable[..., subprocess.Popen[bytes]],
) -> None:
    master = Master(tmp_path)
    try:
        broker = spawn("broker", "b1")
        spawn("allocator", "a1", "--interval", "0.5")
        master.publish(agent("ag-1"), agent("ag-2"), framework(FW))

        # 1. Offers for the framework covering both agents, whole.
        offers = master.until_offered({"ag-1", "ag-2"}, 0, START, "no offers of both agents")
        assert {o.framework_id for o in offers.values()} == {FW}
        assert all(resources(o) == AGENT_RES for o in offers.values())
        first_broker = master.broker
        assert first_broker is not None
        told = master.pump_until(
            lambda: [d for m in master.events("allocator_decisions") for d in m.decisions],
            STEP, "no allocator decisions relayed to the master")
        assert told[0].framework_id == FW
        assert told[0].outcome == internal_pb2.AllocatorDecision.Outcome.OUTCOME_OFFERED

        # 2. Decline ag-1 for 1 s: not offered meanwhile, then offered again.
        mark = len(master.received)
        declined_at = time.monotonic()
        master.send_broker(call(FW, decline=scheduler_pb2.SchedulerCall.Decline(
            offer_ids=[offers["ag-1"].offer_id],
            filters=common_pb2.Filters(refuse_seconds=1.0))))
        master.pump_for(0.7)
        assert "ag-1" not in latest_by_agent(master.offers(mark)), "offered under its filter"
        again = master.until_offered({"ag-1"}, mark, STEP,
                                     "ag-1 not offered again after its filter")["ag-1"]
        assert time.monotonic() - declined_at >= 0.9
        assert resources(again) == AGENT_RES and again.offer_id != offers["ag-1"].offer_id

        # 3. Accept with one task: a LaunchRequest; the rest comes back as a new offer.
        mark = len(master.received)
        launch = scheduler_pb2.SchedulerCall.Accept(
            offer_ids=[again.offer_id], filters=common_pb2.Filters(refuse_seconds=0))
        t = launch.operations.add().launch.tasks.add(task_id="t-1", name="web")
        t.resources.extend(TASK_RES.to_proto())
        master.send_broker(call(FW, accept=launch))
        request = master.pump_until(lambda: master.events("launch_request", mark), STEP,
                                    "no LaunchRequest")[0]
        assert list(request.offer_ids) == [again.offer_id] and request.agent_id == "ag-1"
        master.send_broker(internal_pb2.InternalMessage(
            launch_result=internal_pb2.InternalMessage.LaunchResult(
                request_id=request.request_id, accepted=True, task_ids=["t-1"])))
        master.publish(task(FW, "t-1", "ag-1"))
        rest = master.until_offered({"ag-1"}, mark, STEP,
                                    "the unused rest of ag-1 not offered")["ag-1"]
        assert resources(rest) == AGENT_RES - TASK_RES

        decisions = json.loads(http_get(tmp_path, "allocator", "/decisions"))
        assert decisions["leading"] and decisions["decisions"][0]["framework_id"] == FW
        metrics = http_get(tmp_path, "broker", "/metrics").decode()
        assert "offerbus_broker_offers_declined_total 1" in metrics
        assert "offerbus_broker_offers_accepted_total 1" in metrics

        # 4. SIGKILL the broker, start another: fresh offers with new ids; old ids refused.
        old_ids = {o.offer_id for o in master.offers()}
        broker.kill()
        broker.wait()
        mark = len(master.received)
        spawn("broker", "b2")
        fresh = master.until_offered({"ag-1", "ag-2"}, mark, START,
                                     "offers did not resume after the broker failover")
        assert master.broker is not None and master.broker[1] > first_broker[1]
        assert not {o.offer_id for o in fresh.values()} & old_ids
        assert resources(fresh["ag-1"]) == AGENT_RES - TASK_RES  # the task still holds its own
        assert resources(fresh["ag-2"]) == AGENT_RES
        mark = len(master.received)
        master.send_broker(call(FW, accept=scheduler_pb2.SchedulerCall.Accept(
            offer_ids=[offers["ag-2"].offer_id])))
        rejected = master.pump_until(lambda: master.events("accept_rejected", mark), STEP,
                                     "an old offer id was not refused")[0]
        assert rejected.reason == common_pb2.RejectReason.REJECT_REASON_OFFER_UNKNOWN
        # Refused by the broker itself: the master is to end its tasks (it names none here).
        assert [fe.end_tasks for fe in master.rejections(mark)] == [True]
    finally:
        master.close()


def test_graceful_broker_handover_rescinds_and_an_allocator_failover_reoffers_afresh(
    tmp_path: Path, spawn: Callable[..., subprocess.Popen[bytes]],
) -> None:
    master = Master(tmp_path)
    try:
        b1 = spawn("broker", "b1")
        master.pump_until(lambda: master.broker, START, "b1 never said hello")
        spawn("broker", "b2")  # standby
        a1 = spawn("allocator", "a1")
        master.publish(agent("ag-1"), framework(FW))
        first = master.until_offered({"ag-1"}, 0, START, "no offer")["ag-1"]

        # SIGTERM: b1 rescinds its offers on the way out; b2 takes over with fresh ones.
        mark = len(master.received)
        b1.send_signal(signal.SIGTERM)
        second = master.until_offered({"ag-1"}, mark, START, "no offer from b2")["ag-1"]
        rescinds = master.events("rescind", mark)
        assert [list(r.offer_ids) for r in rescinds] == [[first.offer_id]]
        assert rescinds[0].reason == common_pb2.RescindReason.RESCIND_REASON_BROKER_FAILOVER
        assert second.offer_id != first.offer_id and resources(second) == AGENT_RES

        # A new allocator counts everything free: b2 rescinds what the old one allocated
        # BEFORE offering its allocation, so ag-1 is never offered twice at once.
        spawn("allocator", "a2")  # standby
        mark = len(master.received)
        a1.kill()
        third = master.until_offered({"ag-1"}, mark, START, "no offer after a2 took over")
        rescinded = [(i, env) for i, env in enumerate(master.received[mark:])
                     if env.internal.framework_event.event.WhichOneof("event") == "rescind"]
        offered = [i for i, env in enumerate(master.received[mark:])
                   if env.internal.framework_event.event.WhichOneof("event") == "offers"]
        assert len(rescinded) == 1 and rescinded[0][0] < offered[0]
        event = rescinded[0][1].internal.framework_event.event
        assert list(event.rescind.offer_ids) == [second.offer_id]
        assert third["ag-1"].offer_id not in {first.offer_id, second.offer_id}
    finally:
        master.close()


def test_launches_the_master_never_answers_are_settled_by_the_brokers_timer(
    tmp_path: Path, spawn: Callable[..., subprocess.Popen[bytes]],
) -> None:
    """The master (the test) never answers two LaunchRequests. One's task shows up on the
    state stream: past the launch timeout it counts as launched. The other's never does:
    the framework gets AcceptRejected (AGENT_UNAVAILABLE) once its deadline passes, which
    only the broker's one timer, armed at the core's next deadline, can make happen."""
    master = Master(tmp_path)
    try:
        spawn("broker", "b1", "--launch-timeout", "1.5")
        spawn("allocator", "a1", "--interval", "30")  # no sweep: nothing else wakes the core
        master.publish(agent("ag-1"), agent("ag-2"), framework(FW))
        offers = master.until_offered({"ag-1", "ag-2"}, 0, START, "no offers of both agents")
        mark = len(master.received)
        sent_at = time.monotonic()
        for ag, tid in (("ag-1", "t-seen"), ("ag-2", "t-lost")):
            accept = scheduler_pb2.SchedulerCall.Accept(offer_ids=[offers[ag].offer_id])
            t = accept.operations.add().launch.tasks.add(task_id=tid, name="web")
            t.resources.extend(TASK_RES.to_proto())
            master.send_broker(call(FW, accept=accept))
        master.pump_until(lambda: len(master.events("launch_request", mark)) == 2, STEP,
                          "no LaunchRequests")
        master.publish(task(FW, "t-seen", "ag-1"))  # recorded by "a master", never answered

        rejected = master.pump_until(lambda: master.events("accept_rejected", mark), STEP,
                                     "an unanswered launch was never counted refused")
        took = time.monotonic() - sent_at
        # At the deadline, not at whatever else happens to wake the broker's core later.
        assert 1.4 <= took <= 1.5 + STEP / 2, took
        assert [list(r.task_ids) for r in rejected] == [["t-lost"]]
        assert rejected[0].reason == common_pb2.RejectReason.REJECT_REASON_AGENT_UNAVAILABLE
        # Its task may yet run (the master's word): the master is not to end it.
        assert [fe.end_tasks for fe in master.rejections(mark)] == [False]

        def settled() -> str | None:
            metrics = http_get(tmp_path, "broker", "/metrics").decode()
            return metrics if "offerbus_broker_pending_launches 0" in metrics else None
        metrics = wait_for(settled, STEP, message="launches still pending at the broker")
        assert metrics is not None
        assert ('offerbus_broker_notices_total{kind="launch_seen_launched",level="info"} 1.0'
                in metrics)
        assert ('offerbus_broker_notices_total{kind="launch_unanswered",level="warning"} 1.0'
                in metrics)
        master.pump_for(0.5)  # nothing more for t-seen: it counts as launched
        assert [list(r.task_ids) for r in master.events("accept_rejected", mark)] == [["t-lost"]]
    finally:
        master.close()


def test_offers_relayed_over_a_link_that_broke_are_made_again_when_it_is_back(
    tmp_path: Path, spawn: Callable[..., subprocess.Popen[bytes]],
) -> None:
    """The master (the test) stops answering the broker's heartbeats, as a master too busy to
    read: the broker drops its link (and what was queued on it) and makes a new one. Whether
    the offer it had relayed reached its framework nobody can tell, so once the link is back
    it is rescinded and the agent offered again at once, not after the offer timeout."""
    master = Master(tmp_path)
    try:
        spawn("broker", "b1", "--heartbeat", "0.2")  # its link gives up after 5 missed: 1 s
        spawn("allocator", "a1", "--interval", "30")  # no sweep: only the recovery re-offers
        master.publish(agent("ag-1"), framework(FW))
        first = master.until_offered({"ag-1"}, 0, START, "no offer")["ag-1"]
        mark = len(master.received)

        def link_lost() -> bool:  # the injected fault: this master reads nothing meanwhile
            metrics = http_get(tmp_path, "broker", "/metrics").decode()
            return "offerbus_broker_peers_lost_total 0.0" not in metrics \
                and "offerbus_broker_peers_lost_total" in metrics
        assert wait_for(link_lost, STEP * 2, message="the broker kept its link to the master")
        offers = master.until_offered({"ag-1"}, mark, STEP, "the agent was not offered again")
        assert offers["ag-1"].offer_id != first.offer_id
        assert [list(r.offer_ids) for r in master.events("rescind", mark)] == [[first.offer_id]]
    finally:
        master.close()
