"""The scheduler driver's pure core: subscription state machine, outstanding offers, latest
task statuses, acknowledgements and calls queued while disconnected. Events, calls and the
time come in; SchedulerCalls to send and callbacks to run go out, as data. No sockets."""

from __future__ import annotations

import enum
from collections import OrderedDict, deque
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

from frameworks.sdk.scheduler import (
    AcceptRejected,
    Callback,
    Disconnected,
    Error,
    Failure,
    MasterInfo,
    Offers,
    Refused,
    Rescinded,
    Revoked,
    Subscribed,
    Update,
)
from schemas import bus_pb2, common_pb2, scheduler_pb2
from services import tasks as task_states
from services.bus.liveness import Backoff

Call = scheduler_pb2.SchedulerCall
Event = scheduler_pb2.SchedulerEvent
AckKey = tuple[str, str, bytes]  # (agent_id, task_id, uuid)

USED_OFFERS_REMEMBERED = 10_000  # offer ids kept after use, to name a second accept clearly
# Bus errors that mean "this connection is not subscribed" (e.g. the master failed over).
NOT_SUBSCRIBED_CODES = frozenset({bus_pb2.NOT_REGISTERED})
# A call the master refused (another framework's task, a bad argument): reported, not fatal.
REFUSED_CODES = frozenset({bus_pb2.UNAUTHORIZED, bus_pb2.NOT_FOUND, bus_pb2.INVALID})


class State(enum.Enum):
    DISCONNECTED = "disconnected"  # no master reachable (or it changed)
    SUBSCRIBING = "subscribing"    # Subscribe sent, retried with backoff until Subscribed
    SUBSCRIBED = "subscribed"
    ABORTED = "aborted"            # terminal: a fatal Error event, or teardown


# -- outputs: calls to send, notes to log, callbacks to run (scheduler.py) -------------------


@dataclass(frozen=True)
class Send:
    """A call to send. For accept/decline, `traceparent` names the decision's parent (the
    caller's, else the first offer's) and `offer_traceparents` every used offer's, in order
    (the driver's `decide` span links the others)."""

    call: scheduler_pb2.SchedulerCall
    traceparent: str = ""
    offer_traceparents: tuple[str, ...] = ()


@dataclass(frozen=True)
class Note:
    """Something worth a log line (a dropped event, a refused call); no action."""

    event: str
    detail: str = ""


Output = Send | Note | Callback


@dataclass(frozen=True)
class _Outstanding:
    offer: common_pb2.Offer
    connection: int  # the subscription it arrived on


def ack_key(status: common_pb2.TaskStatus) -> AckKey:
    return (status.agent_id, status.task_id, status.uuid)


class SchedulerCore:
    """One framework's view of its connection to the master.

    Calls while not SUBSCRIBED: accept is refused locally (no offer is outstanding then:
    offers die with their connection) with an AcceptRejected callback and a TASK_DROPPED
    (TASK_LOST unless partition-aware) update per task; decline of a non-outstanding offer
    is dropped; kill, acknowledge, reconcile and revive are queued and sent once
    subscribed; suppress/revive also set the roles sent as `suppressed_roles` in every
    Subscribe; the demand last requested is sent again after every Subscribed (a new
    master, a failover). An accept is sent at most once, never retried.
    """

    def __init__(
        self, framework_info: common_pb2.FrameworkInfo, *, implicit_acknowledgements: bool = True,
        force: bool = False, subscribe_backoff: Backoff | None = None,
    ) -> None:
        self.framework_info = common_pb2.FrameworkInfo()
        self.framework_info.CopyFrom(framework_info)
        self.framework_id = framework_info.framework_id  # set: a restarted scheduler
        self.implicit_acknowledgements = implicit_acknowledgements
        self.force = force  # first Subscribe only; re-subscriptions always force (our own id)
        self.backoff = subscribe_backoff or Backoff(initial=0.1, cap=16.0)
        self.state = State.DISCONNECTED
        self.connection = 0  # bumped by every Subscribe sent
        self.master: MasterInfo | None = None
        self.highest_epoch = 0
        self.offers: dict[str, _Outstanding] = {}
        self.tasks: dict[str, common_pb2.TaskStatus] = {}  # latest non-terminal status
        self.pending_acks: dict[AckKey, common_pb2.TaskStatus] = {}
        self.suppressed_roles: set[str] = set()
        self._ever_subscribed = False
        self._deadline: float | None = None  # resend Subscribe at this time
        self._used: OrderedDict[str, None] = OrderedDict()
        self._kills: dict[str, Call.Kill] = {}
        self._acks: dict[AckKey, Call.Acknowledge.Ack] = {}
        self._reconcile_all = False
        self._reconcile: dict[str, Call.Reconcile.Task] = {}
        self._revive: set[str] | None = None
        self.demands: tuple[common_pb2.Demand, ...] | None = None  # None: never requested

    # -- transport ---------------------------------------------------------------------
    def master_detected(self, master_id: str | None, epoch: int, now: float) -> list[Output]:
        """The leader detector's view changed: the current connection, if any, is void."""
        self.highest_epoch = max(self.highest_epoch, epoch)
        return self._lose(f"leader is now {master_id or 'unknown'} (epoch {epoch})")

    def connected(self, now: float) -> list[Output]:
        """A (new) connection reaches the master: subscribe on it."""
        if self.state is State.ABORTED:
            return []
        out = self._lose("new connection")
        self.backoff.reset()
        return out + self._subscribe(now)

    def disconnected(self, now: float, reason: str = "master unreachable") -> list[Output]:
        return self._lose(reason)

    def tick(self, now: float) -> list[Output]:
        """Resend Subscribe when no Subscribed came in time (backoff between attempts)."""
        if self.state is State.SUBSCRIBING and self._deadline is not None and now >= self._deadline:
            return [Note("subscribe_retry", f"no Subscribed on connection {self.connection}"),
                    *self._subscribe(now)]
        return []

    def _lose(self, reason: str) -> list[Output]:
        out: list[Output] = []
        if self.state is State.SUBSCRIBED:
            out += [Note("disconnected", reason), Disconnected()]
        if self.state is not State.ABORTED:
            self.state = State.DISCONNECTED
        self.offers.clear()
        self.master = None
        self._deadline = None
        return out

    def _subscribe(self, now: float) -> list[Output]:
        self.state = State.SUBSCRIBING
        self.connection += 1
        self.offers.clear()
        self._deadline = now + self.backoff.next_delay()
        info = common_pb2.FrameworkInfo()
        info.CopyFrom(self.framework_info)
        info.framework_id = self.framework_id
        call = Call(framework_id=self.framework_id)
        call.subscribe.framework_info.CopyFrom(info)
        call.subscribe.force = self.force or self._ever_subscribed
        call.subscribe.suppressed_roles.extend(sorted(self.suppressed_roles))
        return [Send(call)]

    # -- events from the master --------------------------------------------------------
    def on_event(self, event: scheduler_pb2.SchedulerEvent, now: float) -> list[Output]:
        if self.state is State.ABORTED:
            return [Note("event_after_abort", event.WhichOneof("event") or "")]
        kind = event.WhichOneof("event")
        if kind == "subscribed":
            return self._on_subscribed(event.subscribed)
        if kind == "offers":
            return self._on_offers(event.offers.offers)
        if kind == "rescind":
            known = [oid for oid in event.rescind.offer_ids if self.offers.pop(oid, None)]
            return [Rescinded(tuple(known), event.rescind.reason)] if known else []
        if kind == "update":
            return [self._on_status(s) for s in event.update.statuses]
        if kind == "failure":
            f = event.failure
            return [Failure(f.agent_id, f.executor_id,
                            f.exit_status if f.HasField("exit_status") else None)]
        if kind == "error":
            return self._abort(event.error.message)
        if kind == "accept_rejected":
            r = event.accept_rejected
            return [AcceptRejected(tuple(r.offer_ids), tuple(r.task_ids), r.reason, r.message)]
        if kind == "revoke":
            v = event.revoke
            return [Revoked(v.agent_id, tuple(v.task_ids), v.grace_s, v.message)]
        return [Note("unknown_event", kind or "empty")]

    def _on_subscribed(self, s: scheduler_pb2.SchedulerEvent.Subscribed) -> list[Output]:
        if self.state is not State.SUBSCRIBING:
            return [Note("subscribed_ignored", f"in state {self.state.value}")]
        if (s.master_epoch and s.master_epoch < self.highest_epoch) or not s.framework_id:
            return [Note("subscribed_ignored",
                         f"epoch {s.master_epoch} < {self.highest_epoch} or no framework id")]
        if self.framework_id and s.framework_id != self.framework_id:
            return self._abort(f"master assigned framework id {s.framework_id!r}; "
                               f"this scheduler is {self.framework_id!r}")
        self.framework_id = s.framework_id
        self.highest_epoch = max(self.highest_epoch, s.master_epoch)
        self.master = MasterInfo(s.master_id, self.highest_epoch, s.heartbeat_interval_ms)
        self.state = State.SUBSCRIBED
        self._deadline = None
        self._ever_subscribed = True
        self.backoff.reset()
        return [Subscribed(self.framework_id, self.master), *self._flush()]

    def _on_offers(self, offers: Iterable[common_pb2.Offer]) -> list[Output]:
        if self.state is not State.SUBSCRIBED:
            return [Note("offers_dropped", f"not subscribed ({self.state.value})")]
        new = []
        for offer in offers:
            oid = offer.offer_id
            if oid and oid not in self.offers and oid not in self._used:
                self.offers[offer.offer_id] = _Outstanding(offer, self.connection)
                new.append(offer)
        return [Offers(tuple(new))] if new else []

    def _on_status(self, status: common_pb2.TaskStatus) -> Update:
        if task_states.ends_updates(status.state):
            self.tasks.pop(status.task_id, None)
        else:
            self.tasks[status.task_id] = status
        if status.uuid:
            self.pending_acks[ack_key(status)] = status
        return Update(status, auto_ack=self.implicit_acknowledgements and bool(status.uuid))

    def on_error(self, code: int, message: str, now: float) -> list[Output]:
        """A bus-level Error envelope from the master."""
        if self.state not in (State.SUBSCRIBED, State.SUBSCRIBING):
            return [Note("master_error_ignored", f"{code}: {message}")]
        if code in NOT_SUBSCRIBED_CODES:
            # The master forgot this connection (e.g. it failed over in place): re-subscribe.
            # Offers about to be forgotten are declined first (no filter) so that a master
            # that still knows us does not keep them out of the pool until they expire.
            if self.state is State.SUBSCRIBING:
                return [Note("master_error_while_subscribing", f"{code}: {message}")]
            forget = self.decline(list(self.offers), 0.0, "re-subscribing") if self.offers else []
            return [*forget, *self._lose(f"not subscribed on this connection? ({message})"),
                    *self._subscribe(now)]
        if code in REFUSED_CODES:
            return [Refused(code, message)]
        if code == bus_pb2.NOT_LEADER:  # wait for the detector; retry later meanwhile
            out = self._lose(f"not the leader ({message})")
            self.state = State.SUBSCRIBING
            self._deadline = now + self.backoff.next_delay()
            return out
        return [Note("master_error", f"{code}: {message}")]

    def _abort(self, message: str) -> list[Output]:
        self._lose("aborted")
        self.state = State.ABORTED
        self._clear_queue()
        return [Error(message)]

    # -- calls from the scheduler ------------------------------------------------------
    def _call(self) -> scheduler_pb2.SchedulerCall:
        return Call(framework_id=self.framework_id)

    def accept(
        self, offer_ids: Sequence[str], operations: Sequence[common_pb2.Operation],
        filters: common_pb2.Filters | None = None, traceparent: str = "",
    ) -> list[Output]:
        ids = list(offer_ids)
        task_ids = [t.task_id for op in operations if op.HasField("launch")
                    for t in op.launch.tasks]
        refusal = self._check_accept(ids)
        if refusal is not None:
            return self._refuse(ids, task_ids, *refusal)
        offers = [self.offers.pop(oid).offer for oid in ids]
        for oid in ids:
            self._mark_used(oid)
        call = self._call()
        call.accept.offer_ids.extend(ids)
        call.accept.operations.extend(operations)
        if filters is not None:
            call.accept.filters.CopyFrom(filters)
        return [Send(call, traceparent or offers[0].traceparent,
                     tuple(o.traceparent for o in offers))]

    def _check_accept(self, ids: list[str]) -> tuple[int, str] | None:
        if self.state is not State.SUBSCRIBED:
            return (common_pb2.REJECT_REASON_FRAMEWORK_INACTIVE,
                    f"not subscribed ({self.state.value}): no offer is outstanding")
        if not ids or len(set(ids)) != len(ids):
            return (common_pb2.REJECT_REASON_OFFER_UNKNOWN,
                    "an accept needs at least one offer, each named once")
        unknown = [oid for oid in ids if oid not in self.offers]
        if unknown:
            used = [oid for oid in unknown if oid in self._used]
            return (common_pb2.REJECT_REASON_OFFER_UNKNOWN,
                    f"offers not outstanding (rescinded, expired, from an earlier connection, "
                    f"or never offered): {unknown}" + (f"; already used: {used}" if used else ""))
        if len({self.offers[oid].offer.agent_id for oid in ids}) > 1:
            return (common_pb2.REJECT_REASON_OFFERS_MIXED_AGENTS,
                    "one accept may only combine offers of one agent")
        return None

    def _refuse(self, offer_ids: Sequence[str], task_ids: Sequence[str], reason: int,
                message: str) -> list[Output]:
        """An accept that launched nothing, told as the master would tell it."""
        aware = (common_pb2.FrameworkInfo.CAPABILITY_PARTITION_AWARE
                 in self.framework_info.capabilities)
        out: list[Output] = [AcceptRejected(tuple(offer_ids), tuple(task_ids), reason, message)]
        for tid in task_ids:
            status = common_pb2.TaskStatus(
                task_id=tid, state=common_pb2.TASK_DROPPED if aware else common_pb2.TASK_LOST,
                reason=common_pb2.TaskStatus.REASON_INVALID_OFFERS,
                message=f"refused by the scheduler driver: {message}")
            out.append(Update(status, auto_ack=False))
        return out

    def unsent(self, send: Send) -> list[Output]:
        """The shell could not write this call: an accept is then refused (never resent)."""
        if send.call.HasField("accept"):
            a = send.call.accept
            tids = [t.task_id for op in a.operations if op.HasField("launch")
                    for t in op.launch.tasks]
            return self._refuse(list(a.offer_ids), tids,
                                common_pb2.REJECT_REASON_FRAMEWORK_INACTIVE,
                                "the connection to the master could not take the call")
        return [Note("call_unsent", send.call.WhichOneof("call") or "")]

    def _mark_used(self, offer_id: str) -> None:
        self._used[offer_id] = None
        while len(self._used) > USED_OFFERS_REMEMBERED:
            self._used.popitem(last=False)

    def decline(self, offer_ids: Sequence[str], refuse_seconds: float | None = None,
                reason: str = "", traceparent: str = "") -> list[Output]:
        known = [oid for oid in dict.fromkeys(offer_ids) if oid in self.offers]
        out: list[Output] = []
        if len(known) != len(offer_ids):
            out.append(Note("decline_unknown_offers",
                            str([oid for oid in offer_ids if oid not in known])))
        if not known:
            return out
        offers = [self.offers.pop(oid).offer for oid in known]
        for oid in known:
            self._mark_used(oid)
        call = self._call()
        call.decline.offer_ids.extend(known)
        call.decline.reason = reason
        if refuse_seconds is not None:
            call.decline.filters.refuse_seconds = refuse_seconds
        return [*out, Send(call, traceparent or offers[0].traceparent,
                           tuple(o.traceparent for o in offers))]

    def kill(self, task_id: str, agent_id: str = "", grace: float | None = None) -> list[Output]:
        kill = Call.Kill(task_id=task_id, agent_id=agent_id)
        if grace is not None:
            kill.kill_grace_period_s = grace
        if self.state is State.SUBSCRIBED:
            call = self._call()
            call.kill.CopyFrom(kill)
            return [Send(call)]
        return self._queue(lambda: self._kills.__setitem__(task_id, kill), "kill")

    def acknowledge(self, statuses: Iterable[common_pb2.TaskStatus]) -> list[Output]:
        keys: dict[AckKey, None] = {}  # in order, each once (a launch acks thousands)
        pending = self.pending_acks
        for s in statuses:
            uuid = s.uuid
            if uuid:
                key = (s.agent_id, s.task_id, uuid)
                pending.pop(key, None)
                keys[key] = None
        if not keys:
            return [Note("acknowledge_nothing", "no status with a uuid")]
        if self.state is State.SUBSCRIBED:
            call = self._call()
            add = call.acknowledge.acks.add
            for aid, tid, uuid in keys:
                add(agent_id=aid, task_id=tid, uuid=uuid)
            return [Send(call)]
        acks = {k: Call.Acknowledge.Ack(agent_id=k[0], task_id=k[1], uuid=k[2]) for k in keys}
        return self._queue(lambda: self._acks.update(acks), "acknowledge")

    def reconcile(self, tasks: Iterable[tuple[str, str]] = ()) -> list[Output]:
        """(task_id, agent_id) pairs; none = implicit (every task the master knows)."""
        entries = {tid: Call.Reconcile.Task(task_id=tid, agent_id=aid) for tid, aid in tasks}
        if self.state is State.SUBSCRIBED:
            call = self._call()
            call.reconcile.tasks.extend(entries.values())
            return [Send(call)]

        def enqueue() -> None:
            if entries:
                self._reconcile.update(entries)
            else:
                self._reconcile_all = True

        return self._queue(enqueue, "reconcile")

    def reconcile_known(self) -> list[Output]:
        """Explicit reconciliation of every task whose latest status is not terminal."""
        if not self.tasks:
            return [Note("reconcile_nothing", "no non-terminal task known")]
        return self.reconcile([(tid, s.agent_id) for tid, s in sorted(self.tasks.items())])

    def _roles(self, roles: Iterable[str]) -> set[str]:
        return set(roles) or {self.framework_info.role or "*"}  # the master's default role

    def suppress(self, roles: Iterable[str] = ()) -> list[Output]:
        roles = list(roles)
        self.suppressed_roles |= self._roles(roles)
        if self.state is State.SUBSCRIBED:
            call = self._call()
            call.suppress.roles.extend(roles)
            return [Send(call)]
        if self._revive is not None:
            self._revive -= self._roles(roles)
        return [Note("suppress_deferred", "sent as suppressed_roles with the next Subscribe")]

    def revive(self, roles: Iterable[str] = ()) -> list[Output]:
        roles = list(roles)
        self.suppressed_roles -= self._roles(roles)
        if self.state is State.SUBSCRIBED:
            call = self._call()
            call.revive.roles.extend(roles)
            return [Send(call)]

        def enqueue() -> None:
            self._revive = (self._revive or set()) | self._roles(roles)

        return self._queue(enqueue, "revive")

    def request(self, demands: Iterable[common_pb2.Demand]) -> list[Output]:
        """Declare the framework's demand (replacing the last; none = unknown). Kept, and
        sent again after every Subscribed: a new master or a failover starts from it."""
        if self.state is State.ABORTED:
            return [Note("call_after_abort", "request")]
        self.demands = tuple(_copy_demand(d) for d in demands)
        if self.state is State.SUBSCRIBED:
            return [Send(self._request_call())]
        return [Note("request_deferred", "sent once subscribed")]

    def _request_call(self) -> scheduler_pb2.SchedulerCall:
        call = self._call()
        call.request.SetInParent()
        call.request.demands.extend(self.demands or ())
        return call

    def teardown(self) -> list[Output]:
        """Remove the framework and all its tasks. Terminal for this core either way; when
        not subscribed nothing can be sent (the master removes the framework after its
        failover timeout)."""
        out: list[Output] = []
        if self.state is State.SUBSCRIBED:
            call = self._call()
            call.teardown.SetInParent()
            out.append(Send(call))
        else:
            out.append(Note("teardown_not_sent", f"not subscribed ({self.state.value})"))
        self._lose("teardown")
        self.state = State.ABORTED
        self._clear_queue()
        return out

    # -- queue of calls made while not subscribed --------------------------------------
    def _queue(self, enqueue: Callable[[], None], what: str) -> list[Output]:
        if self.state is State.ABORTED:
            return [Note("call_after_abort", what)]
        enqueue()
        return [Note("call_queued", f"{what} until subscribed")]

    def _flush(self) -> list[Output]:
        calls: list[scheduler_pb2.SchedulerCall] = []
        if self.demands is not None:  # first: the revive below is for this demand
            calls.append(self._request_call())
        for kill in self._kills.values():
            calls.append(self._call())
            calls[-1].kill.CopyFrom(kill)
        if self._acks:
            calls.append(self._call())
            calls[-1].acknowledge.acks.extend(self._acks.values())
        if self._reconcile_all:
            calls.append(self._call())
            calls[-1].reconcile.SetInParent()
        if self._reconcile:
            calls.append(self._call())
            calls[-1].reconcile.tasks.extend(self._reconcile.values())
        if self._revive:
            calls.append(self._call())
            calls[-1].revive.roles.extend(sorted(self._revive))
        self._clear_queue()
        return [Send(c) for c in calls]

    def _clear_queue(self) -> None:
        self._kills.clear()
        self._acks.clear()
        self._reconcile.clear()
        self._reconcile_all = False
        self._revive = None

    def queued(self) -> int:
        return (len(self._kills) + len(self._acks) + len(self._reconcile)
                + int(self._reconcile_all) + int(bool(self._revive)))

    # -- running outputs (the shell passes its I/O in) ---------------------------------
    def dispatch(
        self, outputs: Iterable[Output], invoke: Callable[[Callback], None],
        send: Callable[[Send], bool], note: Callable[[Note], None],
    ) -> None:
        """Run outputs in order: send calls, invoke callbacks, log notes. An update is
        acknowledged (implicit acks) only after its callback returned without raising."""
        todo: deque[Output] = deque(outputs)
        acks: list[common_pb2.TaskStatus] = []
        while todo:
            out = todo.popleft()
            if isinstance(out, Send):
                if not send(out):
                    todo.extendleft(reversed(self.unsent(out)))
            elif isinstance(out, Note):
                note(out)
            else:
                try:
                    invoke(out)
                except Exception as exc:
                    note(Note("callback_failed", f"{type(out).__name__}: {exc!r}"))
                    continue
                if isinstance(out, Update) and out.auto_ack:
                    acks.append(out.status)
        if acks:
            self.dispatch(self.acknowledge(acks), invoke, send, note)

    # -- invariants --------------------------------------------------------------------
    def validate(self) -> None:
        """Invariants, checked after every step in tests."""
        if self.state is State.SUBSCRIBED:
            assert self.framework_id and self.master is not None and self._deadline is None
            assert self.queued() == 0, "calls left queued while subscribed"
        else:
            assert not self.offers, f"offers outstanding while {self.state.value}"
        if self.state is State.SUBSCRIBING:
            assert self._deadline is not None, "subscribing without a retry deadline"
        if self.state is State.ABORTED:
            assert self.queued() == 0 and self._deadline is None
        for oid, rec in self.offers.items():
            assert rec.offer.offer_id == oid
            assert rec.connection == self.connection, f"offer {oid} from an earlier connection"
            assert oid not in self._used, f"offer {oid} outstanding after being used"
        for tid, status in self.tasks.items():
            assert status.task_id == tid and not task_states.ends_updates(status.state)
        assert all(key == ack_key(s) and s.uuid for key, s in self.pending_acks.items())
        assert len(self._used) <= USED_OFFERS_REMEMBERED


def _copy_demand(d: common_pb2.Demand) -> common_pb2.Demand:
    out = common_pb2.Demand()
    out.CopyFrom(d)
    return out
