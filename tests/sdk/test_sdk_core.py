"""The scheduler driver's pure core: subscription, offers and rescinds, implicit
acknowledgements, failover re-subscription, calls made while not subscribed, bus errors,
and a hypothesis state machine over random event sequences checking its invariants."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from frameworks.sdk.core import Note, Output, SchedulerCore, Send, State
from frameworks.sdk.scheduler import (
    AcceptRejected,
    Callback,
    Disconnected,
    Error,
    Offers,
    Refused,
    Rescinded,
    Subscribed,
    Update,
)
from schemas import bus_pb2, common_pb2, scheduler_pb2
from services.bus.liveness import Backoff

Event = scheduler_pb2.SchedulerEvent
FID = "fw-1"


def info(framework_id: str = "",
         capabilities: Sequence[common_pb2.FrameworkInfo.Capability.ValueType] = (),
         ) -> common_pb2.FrameworkInfo:
    return common_pb2.FrameworkInfo(framework_id=framework_id, name="web", role="web",
                                    capabilities=list(capabilities))


def new_core(**kw: object) -> SchedulerCore:
    fi = kw.pop("framework_info", None) or info()
    assert isinstance(fi, common_pb2.FrameworkInfo)
    return SchedulerCore(fi, subscribe_backoff=Backoff(initial=1.0, cap=8.0), **kw)  # type: ignore[arg-type]


def subscribed(fid: str = FID, epoch: int = 1) -> Event:
    return Event(subscribed=Event.Subscribed(framework_id=fid, master_id=f"m{epoch}",
                                             master_epoch=epoch, heartbeat_interval_ms=1000))


def offers(*ids: str, agent: str = "a1") -> Event:
    return Event(offers=Event.Offers(offers=[
        common_pb2.Offer(offer_id=i, framework_id=FID, agent_id=agent,
                         traceparent=f"00-{i}-01") for i in ids]))


def rescind(*ids: str) -> Event:
    return Event(rescind=Event.Rescind(offer_ids=list(ids),
                                       reason=common_pb2.RESCIND_REASON_EXPIRED))


def status(task: str, state: int = common_pb2.TASK_RUNNING,
           uuid: bytes = b"") -> common_pb2.TaskStatus:
    return common_pb2.TaskStatus(task_id=task, state=state, agent_id="a1",  # type: ignore[arg-type]
                                 uuid=uuid)


def update(*statuses: common_pb2.TaskStatus) -> Event:
    return Event(update=Event.Update(statuses=list(statuses)))


def launch(*task_ids: str) -> list[common_pb2.Operation]:
    return [common_pb2.Operation(launch=common_pb2.Operation.Launch(
        tasks=[common_pb2.TaskInfo(task_id=t, agent_id="a1") for t in task_ids]))]


@dataclass
class Recorder:
    """Plays the driver: runs outputs through core.dispatch and records what happened."""

    core: SchedulerCore
    log: list[Callback | Send] = field(default_factory=list)
    notes: list[Note] = field(default_factory=list)
    raise_on_update: bool = False
    sendable: bool = True

    def run(self, outputs: list[Output]) -> list[Callback | Send]:
        start = len(self.log)
        self.core.dispatch(outputs, self._invoke, self._send, self.notes.append)
        self.core.validate()
        return self.log[start:]

    def _invoke(self, cb: Callback) -> None:
        self.log.append(cb)
        if self.raise_on_update and isinstance(cb, Update):
            raise RuntimeError("scheduler bug")

    def _send(self, out: Send) -> bool:
        if self.sendable:
            self.log.append(out)
        return self.sendable


def sends(entries: Sequence[object], kind: str) -> list[scheduler_pb2.SchedulerCall]:
    return [e.call for e in entries if isinstance(e, Send) and e.call.WhichOneof("call") == kind]


def subscribe(rec: Recorder, fid: str = FID, epoch: int = 1, now: float = 0.0) -> None:
    rec.run(rec.core.connected(now))
    got = rec.run(rec.core.on_event(subscribed(fid, epoch), now))
    assert rec.core.state is State.SUBSCRIBED and isinstance(got[0], Subscribed)


# -- unit tests ------------------------------------------------------------------------------


def test_subscribe_flow() -> None:
    rec = Recorder(new_core())
    assert rec.core.state is State.DISCONNECTED
    [sub] = sends(rec.run(rec.core.connected(0.0)), "subscribe")
    assert rec.core.state is State.SUBSCRIBING
    assert sub.framework_id == "" and sub.subscribe.framework_info.name == "web"
    assert not sub.subscribe.force
    got = rec.run(rec.core.on_event(subscribed(), 0.1))
    assert got == [Subscribed(FID, rec.core.master)]
    assert rec.core.master is not None and rec.core.master.epoch == 1
    assert rec.core.framework_id == FID and rec.core.state is State.SUBSCRIBED
    # A duplicate answer (to a retried Subscribe) changes nothing.
    assert rec.run(rec.core.on_event(subscribed(), 0.2)) == []


def test_subscribe_is_retried_with_backoff_until_answered() -> None:
    rec = Recorder(new_core())
    rec.run(rec.core.connected(0.0))
    assert rec.run(rec.core.tick(0.4)) == []  # first timeout is in [0.5, 1.0]
    assert len(sends(rec.run(rec.core.tick(1.0)), "subscribe")) == 1
    assert rec.run(rec.core.tick(1.5)) == []  # second timeout is in [1.0, 2.0] after 1.0
    assert len(sends(rec.run(rec.core.tick(3.0)), "subscribe")) == 1
    rec.run(rec.core.on_event(subscribed(), 3.1))
    assert rec.run(rec.core.tick(100.0)) == []


def test_offers_then_rescind_and_local_refusals() -> None:
    rec = Recorder(new_core())
    subscribe(rec)
    got = rec.run(rec.core.on_event(offers("o1", "o2"), 1.0))
    assert [o.offer_id for o in got[0].offers] == ["o1", "o2"]  # type: ignore[union-attr]
    assert rec.run(rec.core.on_event(offers("o1"), 1.0)) == []  # a duplicate is not news
    assert rec.run(rec.core.on_event(rescind("o1", "zz"), 1.1)) == [
        Rescinded(("o1",), common_pb2.RESCIND_REASON_EXPIRED)]
    assert rec.run(rec.core.on_event(rescind("zz"), 1.1)) == []
    # Accepting the rescinded offer is refused locally: nothing is sent.
    got = rec.run(rec.core.accept(["o1"], launch("t1")))
    assert not sends(got, "accept")
    rejected, dropped = got
    assert isinstance(rejected, AcceptRejected)
    assert rejected.reason == common_pb2.REJECT_REASON_OFFER_UNKNOWN and "o1" in rejected.message
    assert rejected.task_ids == ("t1",)
    assert isinstance(dropped, Update) and dropped.status.state == common_pb2.TASK_LOST
    assert not dropped.auto_ack
    # The live offer is accepted once, with its trace continued; never a second time.
    got = rec.run(rec.core.accept(["o2"], launch("t2")))
    assert [(s.call.accept.offer_ids[:], s.traceparent) for s in got
            if isinstance(s, Send)] == [(["o2"], "00-o2-01")]
    again = rec.run(rec.core.accept(["o2"], launch("t2")))
    assert not sends(again, "accept") and "already used" in again[0].message  # type: ignore[union-attr]
    assert not rec.core.offers


def test_accept_refuses_mixed_agents_and_keeps_the_offers() -> None:
    rec = Recorder(new_core(framework_info=info(
        capabilities=[common_pb2.FrameworkInfo.CAPABILITY_PARTITION_AWARE])))
    subscribe(rec)
    rec.run(rec.core.on_event(offers("o1"), 1.0))
    rec.run(rec.core.on_event(offers("o2", agent="a2"), 1.0))
    got = rec.run(rec.core.accept(["o1", "o2"], launch("t1")))
    assert got[0].reason == common_pb2.REJECT_REASON_OFFERS_MIXED_AGENTS  # type: ignore[union-attr]
    assert got[1].status.state == common_pb2.TASK_DROPPED  # type: ignore[union-attr]
    assert set(rec.core.offers) == {"o1", "o2"}
    [decline] = sends(rec.run(rec.core.decline(["o1", "o2", "nope"], 30.0, "busy")), "decline")
    assert list(decline.decline.offer_ids) == ["o1", "o2"]
    assert decline.decline.filters.refuse_seconds == 30.0 and decline.decline.reason == "busy"


def test_implicit_acknowledgement_follows_the_update_callback() -> None:
    rec = Recorder(new_core())
    subscribe(rec)
    got = rec.run(rec.core.on_event(update(status("t1", uuid=b"u1"), status("t2")), 1.0))
    assert [type(e) for e in got] == [Update, Update, Send]
    [ack] = sends(got, "acknowledge")
    assert [(a.task_id, a.uuid) for a in ack.acknowledge.acks] == [("t1", b"u1")]
    assert not rec.core.pending_acks
    assert set(rec.core.tasks) == {"t1", "t2"}
    rec.run(rec.core.on_event(update(status("t1", common_pb2.TASK_FINISHED)), 1.1))
    assert set(rec.core.tasks) == {"t2"}


def test_reconcile_known_names_the_non_terminal_tasks() -> None:
    rec = Recorder(new_core())
    subscribe(rec)
    rec.run(rec.core.on_event(update(status("t1"), status("t2"),
                                     status("t3", common_pb2.TASK_FAILED)), 1.0))
    [call] = sends(rec.run(rec.core.reconcile_known()), "reconcile")
    assert [(t.task_id, t.agent_id) for t in call.reconcile.tasks] == [("t1", "a1"), ("t2", "a1")]


def test_a_master_that_omits_its_epoch_is_still_taken() -> None:
    rec = Recorder(new_core())
    rec.run(rec.core.master_detected("m3", 3, 0.0))
    rec.run(rec.core.connected(0.0))
    rec.run(rec.core.on_event(subscribed(FID, epoch=0), 0.1))
    assert rec.core.state is State.SUBSCRIBED and rec.core.master is not None
    assert rec.core.master.epoch == 3


def test_no_acknowledgement_when_the_update_callback_raises() -> None:
    rec = Recorder(new_core(), raise_on_update=True)
    subscribe(rec)
    got = rec.run(rec.core.on_event(update(status("t1", uuid=b"u1")), 1.0))
    assert not sends(got, "acknowledge")
    assert [n.event for n in rec.notes] == ["callback_failed"]
    assert list(rec.core.pending_acks) == [("a1", "t1", b"u1")]  # the agent will resend it


def test_explicit_acknowledgements() -> None:
    rec = Recorder(new_core(implicit_acknowledgements=False))
    subscribe(rec)
    got = rec.run(rec.core.on_event(update(status("t1", uuid=b"u1")), 1.0))
    assert not sends(got, "acknowledge") and rec.core.pending_acks
    [ack] = sends(rec.run(rec.core.acknowledge([status("t1", uuid=b"u1")])), "acknowledge")
    assert ack.acknowledge.acks[0].uuid == b"u1" and not rec.core.pending_acks


def test_reconnect_resubscribes_with_the_same_framework_id() -> None:
    rec = Recorder(new_core())
    subscribe(rec)
    rec.run(rec.core.on_event(offers("o1"), 1.0))
    got = rec.run(rec.core.master_detected("m2", 2, 2.0))  # master failover
    assert got == [Disconnected()] and rec.core.state is State.DISCONNECTED
    assert not rec.core.offers
    [sub] = sends(rec.run(rec.core.connected(2.1)), "subscribe")
    assert sub.framework_id == FID and sub.subscribe.framework_info.framework_id == FID
    assert sub.subscribe.force  # our own earlier connection may still look alive
    assert rec.run(rec.core.on_event(offers("o2"), 2.2)) == []  # not subscribed yet
    # A late answer from the deposed master is ignored; the new one's is taken.
    rec.run(rec.core.on_event(subscribed(FID, epoch=1), 2.2))
    assert rec.core.state is State.SUBSCRIBING
    assert isinstance(rec.run(rec.core.on_event(subscribed(FID, epoch=2), 2.3))[0], Subscribed)
    # The old offer stays dead.
    assert isinstance(rec.run(rec.core.accept(["o1"], launch("t1")))[0], AcceptRejected)


def test_a_different_framework_id_on_resubscription_is_fatal() -> None:
    rec = Recorder(new_core(framework_info=info(FID), force=True))
    [sub] = sends(rec.run(rec.core.connected(0.0)), "subscribe")
    assert sub.framework_id == FID and sub.subscribe.force  # a restarted scheduler
    got = rec.run(rec.core.on_event(subscribed("fw-other"), 0.1))
    assert isinstance(got[0], Error) and rec.core.state is State.ABORTED


def test_calls_before_subscription() -> None:
    rec = Recorder(new_core())
    for outputs in (rec.core.kill("t1", "a1", 2.0), rec.core.kill("t1", "a1", 1.0),
                    rec.core.acknowledge([status("t2", uuid=b"u2")]), rec.core.reconcile(),
                    rec.core.reconcile([("t3", "a1")]), rec.core.suppress(),
                    rec.core.decline(["o1"])):
        assert not sends(rec.run(outputs), "")
        assert not [e for e in rec.log if isinstance(e, Send)]
    rejected = rec.run(rec.core.accept(["o1"], launch("t9")))[0]
    assert isinstance(rejected, AcceptRejected)
    assert rejected.reason == common_pb2.REJECT_REASON_FRAMEWORK_INACTIVE
    [sub] = sends(rec.run(rec.core.connected(0.0)), "subscribe")
    assert list(sub.subscribe.suppressed_roles) == ["web"]
    got = rec.run(rec.core.on_event(subscribed(), 0.1))
    assert isinstance(got[0], Subscribed)
    calls = [e.call for e in got[1:] if isinstance(e, Send)]
    assert [c.WhichOneof("call") for c in calls] == ["kill", "acknowledge", "reconcile",
                                                     "reconcile"]
    assert calls[0].kill.kill_grace_period_s == 1.0  # the latest kill of a task wins
    assert all(c.framework_id == FID for c in calls)
    assert not calls[2].reconcile.tasks and calls[3].reconcile.tasks[0].task_id == "t3"
    # Once subscribed, calls go out at once.
    assert len(sends(rec.run(rec.core.revive()), "revive")) == 1
    assert rec.core.suppressed_roles == set()
    assert sends(rec.run(rec.core.kill("t1")), "kill")


def test_revive_while_disconnected_is_sent_after_subscribing() -> None:
    rec = Recorder(new_core())
    subscribe(rec)
    rec.run(rec.core.suppress())
    rec.run(rec.core.disconnected(1.0))
    rec.run(rec.core.revive())
    [sub] = sends(rec.run(rec.core.connected(1.1)), "subscribe")
    assert not sub.subscribe.suppressed_roles
    got = rec.run(rec.core.on_event(subscribed(), 1.2))
    assert [list(c.revive.roles) for c in sends(got, "revive")] == [["web"]]


def test_not_registered_error_resubscribes() -> None:
    rec = Recorder(new_core())
    subscribe(rec)
    rec.run(rec.core.on_event(offers("o1"), 1.0))
    got = rec.run(rec.core.on_error(bus_pb2.NOT_REGISTERED, "not subscribed", 2.0))
    # The forgotten offer is handed back (no filter) before subscribing again.
    assert [type(e) for e in got] == [Send, Disconnected, Send]
    [decline] = sends(got, "decline")
    assert list(decline.decline.offer_ids) == ["o1"] and decline.decline.filters.refuse_seconds == 0
    [sub] = sends(got, "subscribe")
    assert sub.framework_id == FID and sub.subscribe.force and not rec.core.offers
    # More errors for calls in flight do not multiply subscriptions; the timer retries.
    assert rec.run(rec.core.on_error(bus_pb2.NOT_REGISTERED, "not subscribed", 2.1)) == []
    rec.run(rec.core.on_event(subscribed(), 2.2))
    got = rec.run(rec.core.on_error(bus_pb2.NOT_REGISTERED, "not subscribed", 3.0))
    assert sends(got, "subscribe")


def test_a_refused_call_is_reported_and_the_framework_stays_subscribed() -> None:
    rec = Recorder(new_core())
    subscribe(rec)
    got = rec.run(rec.core.on_error(bus_pb2.UNAUTHORIZED, "task t9 is not yours", 1.0))
    assert got == [Refused(bus_pb2.UNAUTHORIZED, "task t9 is not yours")]
    assert rec.core.state is State.SUBSCRIBED


def test_other_errors_are_only_logged_and_not_leader_waits() -> None:
    rec = Recorder(new_core())
    subscribe(rec)
    assert rec.run(rec.core.on_error(bus_pb2.INTERNAL, "oops", 1.0)) == []
    assert rec.notes[-1].event == "master_error" and rec.core.state is State.SUBSCRIBED
    got = rec.run(rec.core.on_error(bus_pb2.NOT_LEADER, "standby", 2.0))
    assert got == [Disconnected()] and rec.core.state is State.SUBSCRIBING
    assert sends(rec.run(rec.core.tick(10.0)), "subscribe")


def test_error_event_aborts_and_teardown_is_terminal() -> None:
    rec = Recorder(new_core())
    subscribe(rec)
    got = rec.run(rec.core.on_event(Event(error=Event.Error(message="removed")), 1.0))
    assert got == [Error("removed")] and rec.core.state is State.ABORTED
    assert rec.run(rec.core.connected(2.0)) == [] and rec.run(rec.core.kill("t1")) == []

    rec = Recorder(new_core())
    subscribe(rec)
    [teardown] = sends(rec.run(rec.core.teardown()), "teardown")
    assert teardown.framework_id == FID and rec.core.state is State.ABORTED


def test_the_task_view_ends_tasks_by_services_tasks() -> None:
    """The terminal states come from services/tasks.py (plus TASK_UNKNOWN, an answer after
    which no update comes); the driver keeps no list of its own."""
    from services import tasks

    rec = Recorder(new_core())
    subscribe(rec)
    ended = sorted(tasks.TERMINAL | {tasks.UNKNOWN})
    for i in range(len(ended)):
        rec.run(rec.core.on_event(update(status(f"t{i}")), 1.0))
    assert len(rec.core.tasks) == len(ended)
    for i, state in enumerate(ended):
        rec.run(rec.core.on_event(update(status(f"t{i}", state)), 2.0))
    assert rec.core.tasks == {}


def test_an_error_after_abort_never_resubscribes() -> None:
    """An operator's removal (SchedulerEvent.Error) is final: no Subscribe on a new leader,
    a new connection, or a timer."""
    rec = Recorder(new_core())
    subscribe(rec)
    rec.run(rec.core.on_event(Event(error=Event.Error(
        message="framework fw-1 removed by the operator")), 1.0))
    out = [*rec.run(rec.core.master_detected("m2", 2, 2.0)), *rec.run(rec.core.connected(2.1)),
           *rec.run(rec.core.tick(100.0))]
    assert sends(out, "subscribe") == [] and rec.core.state is State.ABORTED


def test_an_accept_that_cannot_be_sent_is_refused_not_retried() -> None:
    rec = Recorder(new_core())
    subscribe(rec)
    rec.run(rec.core.on_event(offers("o1"), 1.0))
    rec.sendable = False
    got = rec.run(rec.core.accept(["o1"], launch("t1")))
    assert isinstance(got[0], AcceptRejected) and got[0].task_ids == ("t1",)
    rec.sendable = True
    assert isinstance(rec.run(rec.core.accept(["o1"], launch("t1")))[0], AcceptRejected)


# -- random event sequences --------------------------------------------------------------------

ERROR_CODES = [bus_pb2.NOT_REGISTERED, bus_pb2.UNAUTHORIZED, bus_pb2.NOT_LEADER, bus_pb2.INVALID]
TASKS = ["t0", "t1", "t2"]
STATES = [common_pb2.TASK_RUNNING, common_pb2.TASK_FINISHED, common_pb2.TASK_FAILED]


class DriverCoreMachine(RuleBasedStateMachine):
    """Random sequences of connection changes, master events and scheduler calls. The
    scheduler's view (built only from callbacks) must match the core's, and no accept ever
    names an offer that is not outstanding, nor one used before."""

    def __init__(self) -> None:
        super().__init__()
        self.rec = Recorder(new_core())
        self.now = 0.0
        self.epoch = 1
        self.next_offer = 0
        self.seen_ids: list[str] = ["never-offered"]
        self.visible: dict[str, str] = {}  # offer id -> agent, as the scheduler was told
        self.used: set[str] = set()
        self.demand: list[int] | None = None  # the counts last requested (None: never)

    def pick(self, data: st.DataObject, min_size: int = 0) -> list[str]:
        """Offer ids: mostly outstanding ones (else accepts would hardly ever be valid),
        sometimes any id ever seen (used, rescinded, never offered, repeated)."""
        any_id = st.sampled_from(self.seen_ids)
        live = st.sampled_from(sorted(self.visible)) if self.visible else any_id
        return data.draw(st.one_of(
            st.lists(live, min_size=max(min_size, 1), max_size=2, unique=True),
            st.lists(st.one_of(live, any_id), min_size=min_size, max_size=3)))

    def step(self, outputs: list[Output]) -> list[Callback | Send]:
        before = dict(self.visible)
        got = self.rec.run(outputs)
        if any(isinstance(e, Subscribed) for e in got):  # the demand restated, if any
            requests = [[d.count for d in c.request.demands] for c in sends(got, "request")]
            assert requests == ([] if self.demand is None else [self.demand]), requests
        for entry in got:
            if isinstance(entry, Offers):
                for o in entry.offers:
                    assert o.offer_id not in self.visible and o.offer_id not in self.used
                    self.visible[o.offer_id] = o.agent_id
            elif isinstance(entry, Rescinded):
                for oid in entry.offer_ids:
                    assert oid in self.visible
                    del self.visible[oid]
            elif isinstance(entry, Disconnected | Error):
                self.visible.clear()
            elif isinstance(entry, Send) and entry.call.WhichOneof("call") in ("accept",
                                                                                 "decline"):
                ids = list(getattr(entry.call, entry.call.WhichOneof("call") or "").offer_ids)
                assert ids and all(oid in before and oid not in self.used for oid in ids), ids
                assert entry.call.framework_id == FID
                self.used.update(ids)
                for oid in ids:
                    self.visible.pop(oid, None)
        return got

    @rule()
    def connect(self) -> None:
        self.step(self.rec.core.connected(self.now))

    @rule()
    def lose_master(self) -> None:
        self.step(self.rec.core.disconnected(self.now))

    @rule()
    def leader_changes(self) -> None:
        self.epoch += 1
        self.step(self.rec.core.master_detected(f"m{self.epoch}", self.epoch, self.now))

    @rule(stale=st.booleans())
    def subscribed(self, stale: bool) -> None:
        self.step(self.rec.core.on_event(subscribed(FID, self.epoch - stale), self.now))

    @rule(n=st.integers(1, 3))
    def connect_subscribe_and_get_offers(self, n: int) -> None:
        self.connect()
        self.subscribed(stale=False)
        self.offers(n, "a1")

    @rule(n=st.integers(1, 3), agent=st.sampled_from(["a1", "a2"]))
    def offers(self, n: int, agent: str) -> None:
        ids = [f"o{self.next_offer + i}" for i in range(n)]
        self.next_offer += n
        self.seen_ids += ids
        self.step(self.rec.core.on_event(offers(*ids, agent=agent), self.now))

    @rule(data=st.data())
    def rescind(self, data: st.DataObject) -> None:
        ids = self.pick(data)
        self.step(self.rec.core.on_event(rescind(*ids), self.now))

    @rule(task=st.sampled_from(TASKS), state=st.sampled_from(STATES), acked=st.booleans())
    def update(self, task: str, state: int, acked: bool) -> None:
        uuid = f"{task}-{self.now}".encode() if acked else b""
        got = self.step(self.rec.core.on_event(update(status(task, state, uuid)), self.now))
        if acked and self.rec.core.state is State.SUBSCRIBED:
            assert [type(e) for e in got] == [Update, Send]

    @rule(code=st.sampled_from(ERROR_CODES))
    def bus_error(self, code: int) -> None:
        self.step(self.rec.core.on_error(code, "error", self.now))

    @rule(data=st.data())
    def accept(self, data: st.DataObject) -> None:
        ids = self.pick(data, min_size=1)
        before = dict(self.visible)
        got = self.step(self.rec.core.accept(ids, launch("tx")))
        valid = (len(set(ids)) == len(ids) and all(i in before for i in ids)
                 and len({before[i] for i in ids}) == 1)
        assert bool(sends(got, "accept")) == valid
        if not valid:
            assert isinstance(got[0], AcceptRejected) and got[0].task_ids == ("tx",)

    @precondition(lambda self: self.visible)
    @rule(data=st.data())
    def accept_outstanding(self, data: st.DataObject) -> None:
        self.accept(data)

    @rule(data=st.data())
    def decline(self, data: st.DataObject) -> None:
        ids = self.pick(data)
        self.step(self.rec.core.decline(ids, 1.0))

    @rule(counts=st.lists(st.integers(0, 5), max_size=2))
    def request(self, counts: list[int]) -> None:
        aborted = self.rec.core.state is State.ABORTED
        got = self.step(self.rec.core.request(
            [common_pb2.Demand(count=n) for n in counts]))
        assert len(sends(got, "request")) == (self.rec.core.state is State.SUBSCRIBED)
        if not aborted:  # (an aborted core drops the call)
            self.demand = counts

    @rule(task=st.sampled_from(TASKS))
    def kill_and_reconcile(self, task: str) -> None:
        self.step(self.rec.core.kill(task))
        self.step(self.rec.core.reconcile([(task, "a1")]))

    @rule(dt=st.floats(0.0, 20.0))
    def time_passes(self, dt: float) -> None:
        self.now += dt
        self.step(self.rec.core.tick(self.now))

    @invariant()
    def scheduler_view_matches_core(self) -> None:
        self.rec.core.validate()
        assert set(self.visible) == set(self.rec.core.offers)
        assert not self.used & set(self.rec.core.offers)


TestDriverCoreMachine = DriverCoreMachine.TestCase
TestDriverCoreMachine.settings = settings(
    max_examples=150, stateful_step_count=40, deadline=None,
    suppress_health_check=[HealthCheck.too_slow])
