"""The scheduler driver over real ZeroMQ: a test harness plays the leading master with a
real RouterServer and a real standalone (flock) election, so the driver finds it through
file://; then the master fails over to a second one and the driver re-subscribes."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
import zmq

from frameworks.sdk import MasterInfo, Scheduler, SchedulerDriver, State
from schemas import bus_pb2, common_pb2, envelope_pb2, scheduler_pb2
from services.bus import codec
from services.bus.election import StandaloneContender
from services.bus.peer import HeartbeatConfig, RouterServer, Sender
from services.bus.reactor import Reactor
from tests.waiting import wait_for

Event = scheduler_pb2.SchedulerEvent
WAIT = 10.0
BEAT = HeartbeatConfig(interval=0.2, max_missed=5)


class MasterHarness:
    """The leading master as the driver sees it: elected through a real flock contender,
    answering on a real ROUTER. Runs on the test thread's reactor."""

    def __init__(self, reactor: Reactor, ctx: zmq.Context[zmq.Socket[bytes]], run_dir: Path,
                 member_id: str) -> None:
        self.reactor = reactor
        self.sender = Sender(member_id, envelope_pb2.ROLE_MASTER)
        self.received: list[tuple[bytes, codec.Envelope]] = []
        self.router = RouterServer(reactor, ctx, "tcp://127.0.0.1:*", self.sender,
                                   self._on_message, heartbeat=BEAT, name=member_id)
        self.contender = StandaloneContender(run_dir, "master", member_id,
                                             {"front": self.router.endpoint})
        self.contender.start()
        # The reactor is not running yet: nothing leaves the ROUTER before the epoch is set.
        epoch = wait_for(lambda: self.contender.leading_epoch, WAIT,
                         message=f"{member_id} not elected")
        assert epoch is not None
        self.epoch: int = epoch
        self.sender.epoch = self.epoch
        self.closed = False

    def _on_message(self, peer: bytes, env: codec.Envelope) -> None:
        self.received.append((peer, env))

    def calls(self, kind: str) -> list[tuple[bytes, codec.Envelope]]:
        return [(p, e) for p, e in self.received if e.WhichOneof("payload") == "scheduler_call"
                and e.scheduler_call.WhichOneof("call") == kind]

    def next_call(self, kind: str, after: int = 0) -> tuple[bytes, codec.Envelope]:
        """Run the reactor until the (after+1)-th call of `kind` arrives."""
        arrived = self.reactor.run(until=lambda: len(self.calls(kind)) > after, timeout=WAIT)
        assert arrived, f"no {kind} call; got {[e.WhichOneof('payload') for _, e in self.received]}"
        return self.calls(kind)[after]

    def reply(self, peer: bytes, event: Event) -> None:
        env = codec.Envelope()
        env.scheduler_event.CopyFrom(event)
        assert self.router.send(peer, env)

    def subscribed(self, peer: bytes, framework_id: str) -> None:
        self.reply(peer, Event(subscribed=Event.Subscribed(
            framework_id=framework_id, master_id=self.sender.sender_id, master_epoch=self.epoch,
            heartbeat_interval_ms=int(BEAT.interval * 1000))))

    def pump_until(self, predicate: object, message: str) -> None:
        """Keep serving (heartbeats) while the driver thread gets somewhere."""
        assert callable(predicate)
        assert self.reactor.run(until=predicate, timeout=WAIT), message

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            self.router.close()
            self.contender.close()


class RecordingScheduler(Scheduler):
    """Accepts every offer it gets with one task; records every callback."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.events: list[tuple[str, object]] = []

    def record(self, name: str, value: object = None) -> None:
        with self.lock:
            self.events.append((name, value))

    def seen(self, name: str) -> list[object]:
        with self.lock:
            return [v for n, v in self.events if n == name]

    def subscribed(self, driver: SchedulerDriver, framework_id: str,
                   master_info: MasterInfo) -> None:
        self.record("subscribed", (framework_id, master_info.epoch))

    def offers(self, driver: SchedulerDriver, offers: list[common_pb2.Offer]) -> None:
        self.record("offers", [o.offer_id for o in offers])
        task = common_pb2.TaskInfo(task_id="t1", agent_id=offers[0].agent_id,
                                   resources=list(offers[0].resources))
        driver.accept([o.offer_id for o in offers],
                      [common_pb2.Operation(launch=common_pb2.Operation.Launch(tasks=[task]))])

    def rescinded(self, driver: SchedulerDriver, offer_ids: list[str], reason: int) -> None:
        self.record("rescinded", offer_ids)

    def update(self, driver: SchedulerDriver, status: common_pb2.TaskStatus) -> None:
        self.record("update", (status.task_id, status.state, status.uuid))

    def accept_rejected(self, driver: SchedulerDriver, offer_ids: list[str],
                        task_ids: list[str], reason: int, message: str) -> None:
        self.record("accept_rejected", (offer_ids, reason))

    def error(self, driver: SchedulerDriver, message: str) -> None:
        self.record("error", message)

    def disconnected(self, driver: SchedulerDriver) -> None:
        self.record("disconnected")


@pytest.fixture
def ctx() -> Iterator[zmq.Context[zmq.Socket[bytes]]]:
    context: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
    yield context
    context.term()


@pytest.fixture
def reactor() -> Reactor:
    return Reactor()


def offer(offer_id: str, agent_id: str = "a1") -> common_pb2.Offer:
    return common_pb2.Offer(
        offer_id=offer_id, framework_id="fw-1", agent_id=agent_id, hostname="host1",
        resources=[common_pb2.Resource(name="cpus", scalar=1.0)],
        traceparent="00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01")


def test_subscribe_offers_accept_ack_and_master_failover(
    tmp_path: Path, reactor: Reactor, ctx: zmq.Context[zmq.Socket[bytes]],
) -> None:
    m1 = MasterHarness(reactor, ctx, tmp_path, "m1")
    sched = RecordingScheduler()
    driver = SchedulerDriver(sched, common_pb2.FrameworkInfo(name="web", role="web"),
                             f"file://{tmp_path}", heartbeat=BEAT)
    driver.start()
    m2: MasterHarness | None = None
    try:
        # Subscribe, found through the election.
        peer, env = m1.next_call("subscribe")
        sub = env.scheduler_call
        assert env.sender_role == envelope_pb2.ROLE_FRAMEWORK and env.sender_id == "web"
        assert sub.framework_id == "" and sub.subscribe.framework_info.name == "web"
        m1.subscribed(peer, "fw-1")
        m1.pump_until(lambda: sched.seen("subscribed"), "no subscribed callback")
        assert sched.seen("subscribed") == [("fw-1", m1.epoch)]

        # Offers reach the scheduler; its accept reaches the master, trace continued.
        m1.reply(peer, Event(offers=Event.Offers(offers=[offer("o1"), offer("o2")])))
        _, env = m1.next_call("accept")
        accept = env.scheduler_call
        assert sched.seen("offers") == [["o1", "o2"]]
        assert list(accept.accept.offer_ids) == ["o1", "o2"]
        assert [t.task_id for t in accept.accept.operations[0].launch.tasks] == ["t1"]
        assert accept.framework_id == "fw-1" and env.sender_id == "fw-1"
        # The decide span's traceparent: the offer's trace, a new (child) span.
        assert env.traceparent.split("-")[1] == offer("o1").traceparent.split("-")[1]

        # An update with a uuid is acknowledged, after the scheduler has seen it.
        status = common_pb2.TaskStatus(task_id="t1", state=common_pb2.TASK_RUNNING,
                                       agent_id="a1", uuid=b"0123456789abcdef")
        m1.reply(peer, Event(update=Event.Update(statuses=[status])))
        _, env = m1.next_call("acknowledge")
        [ack] = env.scheduler_call.acknowledge.acks
        assert (ack.task_id, ack.agent_id, ack.uuid) == ("t1", "a1", b"0123456789abcdef")
        assert sched.seen("update") == [("t1", common_pb2.TASK_RUNNING, b"0123456789abcdef")]

        # A call from another thread (this one) goes out too.
        driver.kill("t1", "a1", grace=1.5)
        _, env = m1.next_call("kill")
        assert env.scheduler_call.kill.task_id == "t1"
        assert env.scheduler_call.kill.kill_grace_period_s == 1.5

        # Master failover: the first master goes away, a second one is elected.
        m1.close()
        wait_for(lambda: sched.seen("disconnected"), WAIT, message="no disconnected callback")
        m2 = MasterHarness(reactor, ctx, tmp_path, "m2")
        assert m2.epoch > m1.epoch
        peer2, env = m2.next_call("subscribe")
        sub = env.scheduler_call
        assert sub.framework_id == "fw-1" and sub.subscribe.framework_info.framework_id == "fw-1"
        assert sub.subscribe.force and env.sender_id == "fw-1"
        m2.subscribed(peer2, "fw-1")
        m2.pump_until(lambda: len(sched.seen("subscribed")) == 2, "no re-subscription")
        assert sched.seen("subscribed")[-1] == ("fw-1", m2.epoch)
        assert driver.state is State.SUBSCRIBED and driver.framework_id == "fw-1"

        # The offers of the first master are dead: accepting one is refused locally.
        driver.accept(["o1"], [])
        m2.pump_until(lambda: sched.seen("accept_rejected"), "no local refusal")
        assert not m2.calls("accept")

        # Stop without failover tears the framework down.
        driver.stop()
        _, env = m2.next_call("teardown")
        assert env.scheduler_call.framework_id == "fw-1"
        assert driver.join(WAIT)
    finally:
        driver.stop(failover=True)
        driver.join(WAIT)
        m1.close()
        if m2 is not None:
            m2.close()


def test_unauthorized_error_resubscribes_and_a_fatal_error_stops_the_driver(
    tmp_path: Path, reactor: Reactor, ctx: zmq.Context[zmq.Socket[bytes]],
) -> None:
    master = MasterHarness(reactor, ctx, tmp_path, "m1")
    sched = RecordingScheduler()
    info = common_pb2.FrameworkInfo(framework_id="fw-7", name="batch", role="batch")
    driver = SchedulerDriver(sched, info, f"file://{tmp_path}", heartbeat=BEAT)
    driver.start()
    try:
        peer, env = master.next_call("subscribe")
        assert env.scheduler_call.framework_id == "fw-7"  # a restarted scheduler
        assert not env.scheduler_call.subscribe.force
        master.subscribed(peer, "fw-7")
        master.pump_until(lambda: sched.seen("subscribed"), "not subscribed")

        # The master no longer knows this connection (e.g. it failed over in place).
        error = codec.error_envelope(bus_pb2.NOT_REGISTERED, "framework not subscribed")
        assert master.router.send(peer, error)
        peer, env = master.next_call("subscribe", after=1)
        assert env.scheduler_call.framework_id == "fw-7" and env.scheduler_call.subscribe.force
        master.subscribed(peer, "fw-7")
        master.pump_until(lambda: len(sched.seen("subscribed")) == 2, "not re-subscribed")
        assert sched.seen("disconnected") == [None]

        # A fatal error: the scheduler is told, and the driver stops by itself.
        master.reply(peer, Event(error=Event.Error(message="framework removed")))
        master.pump_until(lambda: driver.join(0), "driver still running")
        assert sched.seen("error") == ["framework removed"]
        assert driver.state is State.ABORTED
    finally:
        driver.stop(failover=True)
        driver.join(WAIT)
        master.close()


def test_request_reaches_the_master_again_after_resubscribing_and_revoke_the_scheduler(
    tmp_path: Path, reactor: Reactor, ctx: zmq.Context[zmq.Socket[bytes]],
) -> None:
    from frameworks.sdk import demand
    from services.resources import Resources

    class Revoked(RecordingScheduler):
        def revoked(self, driver: SchedulerDriver, agent_id: str, task_ids: list[str],
                    grace_s: float, message: str) -> None:
            self.record("revoked", (agent_id, task_ids, grace_s, message))

    master = MasterHarness(reactor, ctx, tmp_path, "m1")
    sched = Revoked()
    driver = SchedulerDriver(sched, common_pb2.FrameworkInfo(name="web", role="web"),
                             f"file://{tmp_path}", heartbeat=BEAT)
    driver.request([demand(Resources.of(cpus=0.5, mem=64), 3, ports=1)])  # before running
    driver.start()
    try:
        peer, _ = master.next_call("subscribe")
        master.subscribed(peer, "fw-1")
        _, env = master.next_call("request")
        [d] = env.scheduler_call.request.demands
        assert (d.count, d.ports, env.scheduler_call.framework_id) == (3, 1, "fw-1")

        driver.request([demand(Resources.of(cpus=0.5, mem=64), 5, ports=1)])
        _, env = master.next_call("request", after=1)
        assert env.scheduler_call.request.demands[0].count == 5

        master.reply(peer, Event(revoke=Event.Revoke(agent_id="a1", task_ids=["t1"],
                                                     grace_s=2.0, message="for fw-2")))
        master.pump_until(lambda: sched.seen("revoked"), "no revoked callback")
        assert sched.seen("revoked") == [("a1", ["t1"], 2.0, "for fw-2")]

        # The master forgot the connection: the driver re-subscribes and restates 5.
        assert master.router.send(peer, codec.error_envelope(bus_pb2.NOT_REGISTERED, "who?"))
        peer, _ = master.next_call("subscribe", after=1)
        master.subscribed(peer, "fw-1")
        _, env = master.next_call("request", after=2)
        assert env.scheduler_call.request.demands[0].count == 5
    finally:
        driver.stop(failover=True)
        driver.join(WAIT)
        master.close()
