"""The offer-broker's pure core: owns the table of outstanding offers (ids, expiry, state),
turns allocations into offers and ACCEPT/DECLINE/timeouts into launches and recoveries.

No sockets, no clock, no threads: each event method takes decoded inputs and `now` (Unix
seconds, the shell's wall clock, because `expires_at_us` goes to frameworks) and returns
commands (small frozen dataclasses, each with `to_proto()` giving the InternalMessage to send).

Where resources go. Every allocation the broker takes becomes one offer; every offer ends
in exactly one of: a LaunchRequest (its tasks' resources come back later as a Recovery
LAUNCHED or LAUNCH_REJECTED, the rest at once as UNUSED), a Recovery (DECLINED, EXPIRED,
RESCINDED, LAUNCH_REJECTED), or -- only when the allocator will forget them by itself --
nothing: offers of a removed agent, and everything on `rescind_all`. Every Recovery carries
an explicit `refuse_seconds` (0 = no filter): the default of 5 s is applied here, once.

Failover, who does what:
- The OLD broker, if it still runs (graceful shutdown, or it learns it was deposed), calls
  `rescind_all(RESCIND_REASON_BROKER_FAILOVER)`: frameworks get Rescind for every offer it
  made; it sends no Recovery, and abandons its pending LaunchRequests.
- If the old broker died, nobody can name its offers but the master, which relayed them:
  on a new broker epoch the master rescinds every offer whose id carries the old broker's
  prefix (ids are "<prefix>-o<n>", the prefix being the broker's epoch), and it drops any
  message (Accept relays' answers, LaunchRequests) fenced by the old epoch.
- The NEW broker starts with an empty table and a new prefix, so an ACCEPT naming an old
  offer is refused as unknown. The allocator, on seeing a broker with a new epoch, treats
  everything it had allocated as recovered; launches the old broker had asked for show up
  (or not) as tasks on the master's state stream. Hence no Recovery on `rescind_all`: it
  would be counted twice.
"""

from __future__ import annotations

import enum
import heapq
import math
from collections import OrderedDict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from schemas import common_pb2, internal_pb2, scheduler_pb2
from services.resources import UNRESERVED, Resources

DEFAULT_OFFER_TIMEOUT_S = 30.0
DEFAULT_REFUSE_SECONDS = 5.0
MAX_REFUSE_SECONDS = 365 * 24 * 3600.0  # an absurd filter is capped, as Mesos does
HISTORY_SIZE = 65536  # ended offers remembered, to say "expired" rather than "unknown"

RescindReason = common_pb2.RescindReason
RejectReason = common_pb2.RejectReason
Recover = internal_pb2.InternalMessage.RecoverResources
RecoverReason = Recover.Reason


class IllegalTransition(Exception):
    """A bug: the core asked to move an offer along an edge the lifecycle does not have."""


class OfferState(enum.Enum):
    OFFERED = "offered"  # outstanding at its framework
    LAUNCHING = "launching"  # used by a valid ACCEPT; its LaunchRequest awaits the master
    # Terminal: the offer has left the table.
    LAUNCHED = "launched"  # the master launched it
    LAUNCH_FAILED = "launch failed"  # the master refused the launch
    ACCEPTED = "accepted"  # used by a valid ACCEPT with no operations
    DECLINED = "declined"
    EXPIRED = "expired"
    RESCINDED = "rescinded"
    REJECTED = "used by a rejected accept"
    ABANDONED = "abandoned"  # launching when the table was dropped (rescind_all)


_TRANSITIONS: dict[OfferState, frozenset[OfferState]] = {
    OfferState.OFFERED: frozenset({
        OfferState.LAUNCHING, OfferState.ACCEPTED, OfferState.DECLINED, OfferState.EXPIRED,
        OfferState.RESCINDED, OfferState.REJECTED,
    }),
    OfferState.LAUNCHING: frozenset({
        OfferState.LAUNCHED, OfferState.LAUNCH_FAILED, OfferState.ABANDONED,
    }),
}
LIVE_STATES = frozenset(_TRANSITIONS)


# ---------------------------------------------------------------------------------------
# Records and commands.


@dataclass(frozen=True)
class Offer:
    offer_id: str
    framework_id: str
    agent_id: str
    hostname: str
    resources: Resources
    role: str
    created_at: float
    expires_at: float  # math.inf = never
    allocation_id: str = ""
    traceparent: str = ""
    attributes: tuple[common_pb2.Attribute, ...] = ()

    def to_proto(self) -> common_pb2.Offer:
        return common_pb2.Offer(
            offer_id=self.offer_id, framework_id=self.framework_id, agent_id=self.agent_id,
            hostname=self.hostname, resources=self.resources.to_proto(),
            attributes=self.attributes,
            expires_at_us=0 if math.isinf(self.expires_at) else int(self.expires_at * 1e6),
            allocation_id=self.allocation_id, traceparent=self.traceparent,
        )


@dataclass(frozen=True)
class PendingLaunch:
    """A validated ACCEPT whose LaunchRequest awaits the master's LaunchResult."""

    request_id: str
    framework_id: str
    agent_id: str
    offer_ids: tuple[str, ...]
    resources: Resources  # what the tasks use: held until the master answers
    task_ids: tuple[str, ...]
    created_at: float


def _framework_event(framework_id: str,
                     event: scheduler_pb2.SchedulerEvent) -> internal_pb2.InternalMessage:
    return internal_pb2.InternalMessage(
        framework_event=internal_pb2.InternalMessage.FrameworkEvent(
            framework_id=framework_id, event=event))


@dataclass(frozen=True)
class SendOffers:
    """To the framework through the master: new offers (one command per framework)."""

    framework_id: str
    offers: tuple[Offer, ...]

    def to_proto(self) -> internal_pb2.InternalMessage:
        ev = scheduler_pb2.SchedulerEvent(offers=scheduler_pb2.SchedulerEvent.Offers(
            offers=[o.to_proto() for o in self.offers]))
        return _framework_event(self.framework_id, ev)


@dataclass(frozen=True)
class Rescind:
    """To the framework through the master: these offers are gone."""

    framework_id: str
    offer_ids: tuple[str, ...]
    reason: int  # RescindReason
    message: str = ""

    def to_proto(self) -> internal_pb2.InternalMessage:
        ev = scheduler_pb2.SchedulerEvent(rescind=scheduler_pb2.SchedulerEvent.Rescind(
            offer_ids=self.offer_ids, reason=self.reason, message=self.message))  # type: ignore[arg-type]
        return _framework_event(self.framework_id, ev)


@dataclass(frozen=True)
class AcceptRejected:
    """To the framework through the master: its ACCEPT launched nothing, and why."""

    framework_id: str
    offer_ids: tuple[str, ...]
    task_ids: tuple[str, ...]
    reason: int  # RejectReason
    message: str

    def to_proto(self) -> internal_pb2.InternalMessage:
        ev = scheduler_pb2.SchedulerEvent(
            accept_rejected=scheduler_pb2.SchedulerEvent.AcceptRejected(
                offer_ids=self.offer_ids, task_ids=self.task_ids,
                reason=self.reason, message=self.message))  # type: ignore[arg-type]
        return _framework_event(self.framework_id, ev)


@dataclass(frozen=True)
class LaunchRequest:
    """To the master: a validated ACCEPT. `traceparents` are the offers', for span links."""

    request_id: str
    framework_id: str
    agent_id: str
    offer_ids: tuple[str, ...]
    operations: tuple[common_pb2.Operation, ...]
    traceparents: tuple[str, ...] = ()

    def to_proto(self) -> internal_pb2.InternalMessage:
        return internal_pb2.InternalMessage(
            launch_request=internal_pb2.InternalMessage.LaunchRequest(
                request_id=self.request_id, framework_id=self.framework_id,
                agent_id=self.agent_id, offer_ids=self.offer_ids, operations=self.operations))


@dataclass(frozen=True)
class Recovery:
    framework_id: str
    agent_id: str
    resources: Resources
    reason: int  # RecoverResources.Reason
    refuse_seconds: float = 0.0  # resolved: 0 = no filter
    offer_id: str = ""
    allocation_id: str = ""
    task_ids: tuple[str, ...] = ()

    def to_proto(self) -> Recover.Recovery:
        return Recover.Recovery(
            framework_id=self.framework_id, agent_id=self.agent_id,
            resources=self.resources.to_proto(), reason=self.reason,  # type: ignore[arg-type]
            filters=common_pb2.Filters(refuse_seconds=self.refuse_seconds),
            offer_id=self.offer_id, allocation_id=self.allocation_id, task_ids=self.task_ids)


@dataclass(frozen=True)
class RecoverResources:
    """To the allocator: resources no longer offered (one command per step)."""

    recoveries: tuple[Recovery, ...]

    def to_proto(self) -> internal_pb2.InternalMessage:
        return internal_pb2.InternalMessage(
            recover_resources=Recover(recoveries=[r.to_proto() for r in self.recoveries]))


@dataclass(frozen=True)
class Anomaly:
    """For the shell to log and count: input the core ignored or corrected. Not sent."""

    kind: str
    message: str


Command = SendOffers | Rescind | AcceptRejected | LaunchRequest | RecoverResources | Anomaly


def coalesce(commands: Iterable[Command]) -> list[Command]:
    """Batch the commands of several steps (a shell's drain): one SendOffers per framework,
    one Rescind per (framework, reason), one RecoverResources. An offer both sent and
    rescinded within the batch is never shown to its framework (its Recovery stays)."""
    cmds = list(commands)
    sent = {o.offer_id for c in cmds if isinstance(c, SendOffers) for o in c.offers}
    rescinded = {i for c in cmds if isinstance(c, Rescind) for i in c.offer_ids}
    unseen = sent & rescinded
    offers: dict[str, list[Offer]] = {}
    rescinds: dict[tuple[str, int], tuple[list[str], str]] = {}
    recoveries: list[Recovery] = []
    launches: list[Command] = []
    rejects: list[Command] = []
    anomalies: list[Command] = []
    for c in cmds:
        if isinstance(c, SendOffers):
            offers.setdefault(c.framework_id, []).extend(
                o for o in c.offers if o.offer_id not in unseen)
        elif isinstance(c, Rescind):
            ids, _msg = rescinds.setdefault((c.framework_id, c.reason), ([], c.message))
            ids.extend(i for i in c.offer_ids if i not in unseen)
        elif isinstance(c, RecoverResources):
            recoveries.extend(c.recoveries)
        elif isinstance(c, LaunchRequest):
            launches.append(c)
        elif isinstance(c, AcceptRejected):
            rejects.append(c)
        else:
            anomalies.append(c)
    out: list[Command] = [*launches]
    out += [Rescind(fw, tuple(ids), reason, msg)
            for (fw, reason), (ids, msg) in rescinds.items() if ids]
    out += rejects
    out += [SendOffers(fw, tuple(os)) for fw, os in offers.items() if os]
    if recoveries:
        out.append(RecoverResources(tuple(recoveries)))
    return out + anomalies


# ---------------------------------------------------------------------------------------
# Resource helpers.


def _positive(r: Resources) -> bool:
    return (any(v > 0 for v in r.scalars.values()) or any(r.ranges.values())
            or any(r.sets.values()))


def _overlap(a: Resources, b: Resources) -> bool:
    """Whether a and b share a port (range value) or set item, whatever their roles."""
    a, b = a.with_role(UNRESERVED), b.with_role(UNRESERVED)
    return any(lo <= bhi and blo <= hi
               for k, rs in b.ranges.items() for blo, bhi in rs
               for lo, hi in a.ranges.get(k, ())) or any(
        items & a.sets.get(k, frozenset()) for k, items in b.sets.items())


def refuse_seconds(filters: common_pb2.Filters | None) -> float:
    """The filter a decline/accept installs: unset = 5 s, 0 = none, nonsense = default."""
    if filters is None or not filters.HasField("refuse_seconds"):
        return DEFAULT_REFUSE_SECONDS
    value = filters.refuse_seconds
    if math.isnan(value) or value < 0:
        return DEFAULT_REFUSE_SECONDS
    return min(value, MAX_REFUSE_SECONDS)


class _Invalid(Exception):
    def __init__(self, reason: int, message: str) -> None:
        super().__init__(message)
        self.reason = reason
        self.message = message


def _check_task(task: common_pb2.TaskInfo, agent_id: str, seen: set[str]) -> Resources:
    """One task of a Launch: returns its resources, or raises _Invalid naming the check."""
    tid = task.task_id
    if not tid:
        raise _Invalid(RejectReason.REJECT_REASON_TASK_INVALID, "a task has an empty task_id")
    if tid in seen:
        raise _Invalid(RejectReason.REJECT_REASON_TASK_INVALID,
                       f"duplicate task id {tid!r} in one accept")
    seen.add(tid)
    if task.agent_id and task.agent_id != agent_id:
        raise _Invalid(RejectReason.REJECT_REASON_TASK_INVALID,
                       f"task {tid!r} names agent {task.agent_id!r}, offers are on {agent_id!r}")
    try:
        res = (Resources.from_proto(task.resources))
    except ValueError as exc:
        raise _Invalid(RejectReason.REJECT_REASON_TASK_INVALID,
                       f"task {tid!r} has invalid resources: {exc}") from exc
    if not _positive(res):
        raise _Invalid(RejectReason.REJECT_REASON_TASK_INVALID, f"task {tid!r} has no resources")
    ports = [rg for (n, _), rgs in res.ranges.items() if n == "ports" for rg in rgs]
    for pm in task.container.docker.port_mappings:
        if not any(lo <= pm.host_port <= hi for lo, hi in ports):
            raise _Invalid(RejectReason.REJECT_REASON_TASK_INVALID,
                           f"task {tid!r} maps host port {pm.host_port} outside its ports")
    return res


def check_operations(pool: Resources, operations: Sequence[common_pb2.Operation],
                     agent_id: str, role: str) -> tuple[Resources, Resources]:
    """Apply an ACCEPT's operations in order to the pooled offers. Returns (resources the
    tasks use, the unused remainder), or raises _Invalid naming the failed check."""
    seen: set[str] = set()
    used = Resources()
    for i, op in enumerate(operations):
        kind = op.WhichOneof("operation")
        if kind == "launch":
            tasks = Resources.total(_check_task(t, agent_id, seen) for t in op.launch.tasks)
            if not pool.contains(tasks):
                raise _Invalid(RejectReason.REJECT_REASON_RESOURCES_EXCEEDED,
                               f"operation {i} (launch): tasks need {tasks}, offers hold {pool}")
            pool, used = pool - tasks, used + tasks
        elif kind in ("reserve", "unreserve"):
            items = op.reserve.resources if kind == "reserve" else op.unreserve.resources
            try:
                res = (Resources.from_proto(items))
            except ValueError as exc:
                raise _Invalid(RejectReason.REJECT_REASON_TASK_INVALID,
                               f"operation {i} ({kind}): invalid resources: {exc}") from exc
            roles = {k[1] for k in (*res.scalars, *res.ranges, *res.sets)}
            if not _positive(res) or UNRESERVED in roles:
                raise _Invalid(RejectReason.REJECT_REASON_TASK_INVALID,
                               f"operation {i} ({kind}): needs reserved, non-empty resources")
            if roles != {role}:
                raise _Invalid(RejectReason.REJECT_REASON_UNAUTHORIZED,
                               f"operation {i} ({kind}): roles {sorted(roles)}, "
                               f"framework's offers are for role {role!r}")
            take, give = (res.with_role(UNRESERVED), res) if kind == "reserve" else (
                res, res.with_role(UNRESERVED))
            if not pool.contains(take):
                raise _Invalid(RejectReason.REJECT_REASON_RESOURCES_EXCEEDED,
                               f"operation {i} ({kind}): {take} not in the offers ({pool})")
            pool = pool - take + give
        else:
            raise _Invalid(RejectReason.REJECT_REASON_TASK_INVALID,
                           f"operation {i} has no kind")
    return used, pool


def _task_ids(operations: Sequence[common_pb2.Operation]) -> tuple[str, ...]:
    ids = [t.task_id for op in operations if op.WhichOneof("operation") == "launch"
           for t in op.launch.tasks]
    return tuple(dict.fromkeys(ids))


# ---------------------------------------------------------------------------------------
# The core.


@dataclass
class _Agent:
    hostname: str = ""
    total: Resources | None = None  # None until the state stream told us
    attributes: tuple[common_pb2.Attribute, ...] = ()


@dataclass
class BrokerCore:
    """The offer table. `prefix` makes ids unique across brokers (use the leader epoch)."""

    prefix: str
    offer_timeout: float | None = DEFAULT_OFFER_TIMEOUT_S  # None or 0: offers never expire
    history_size: int = HISTORY_SIZE
    _offers: dict[str, Offer] = field(default_factory=dict)  # live: OFFERED or LAUNCHING
    _state: dict[str, OfferState] = field(default_factory=dict)
    _history: OrderedDict[str, OfferState] = field(default_factory=OrderedDict)
    _by_agent: dict[str, set[str]] = field(default_factory=dict)  # OFFERED only
    _by_framework: dict[str, set[str]] = field(default_factory=dict)  # OFFERED only
    _outstanding: dict[str, Resources] = field(default_factory=dict)  # per agent, OFFERED
    _pending: dict[str, PendingLaunch] = field(default_factory=dict)
    _live_allocations: set[str] = field(default_factory=set)
    _agents: dict[str, _Agent] = field(default_factory=dict)
    _expiry: list[tuple[float, str]] = field(default_factory=list)  # heap, lazy deletion
    _next_offer: int = 0
    _next_request: int = 0

    # -- views -------------------------------------------------------------------------
    def offer(self, offer_id: str) -> Offer | None:
        return self._offers.get(offer_id)

    def state(self, offer_id: str) -> OfferState | None:
        return self._state.get(offer_id) or self._history.get(offer_id)

    def outstanding_offers(self) -> list[Offer]:
        return [self._offers[i] for i, s in self._state.items() if s is OfferState.OFFERED]

    def outstanding(self, agent_id: str) -> Resources:
        return self._outstanding.get(agent_id, Resources())

    @property
    def pending_launches(self) -> dict[str, PendingLaunch]:
        return dict(self._pending)

    def next_expiry(self) -> float | None:
        """When the shell should call `tick` next (None: nothing will expire)."""
        while self._expiry and self._state.get(self._expiry[0][1]) is not OfferState.OFFERED:
            heapq.heappop(self._expiry)
        return self._expiry[0][0] if self._expiry else None

    # -- the one place offers change state ---------------------------------------------
    def _create(self, offer: Offer) -> None:
        if offer.offer_id in self._state or offer.offer_id in self._history:
            raise IllegalTransition(f"offer {offer.offer_id} created twice")
        self._offers[offer.offer_id] = offer
        self._state[offer.offer_id] = OfferState.OFFERED
        self._by_agent.setdefault(offer.agent_id, set()).add(offer.offer_id)
        self._by_framework.setdefault(offer.framework_id, set()).add(offer.offer_id)
        self._outstanding[offer.agent_id] = self.outstanding(offer.agent_id) + offer.resources
        if offer.allocation_id:
            self._live_allocations.add(offer.allocation_id)
        if not math.isinf(offer.expires_at):
            heapq.heappush(self._expiry, (offer.expires_at, offer.offer_id))

    def _move(self, offer_id: str, to: OfferState) -> Offer:
        cur = self._state.get(offer_id) or self._history.get(offer_id)
        if cur is None or to not in _TRANSITIONS.get(cur, frozenset()):
            raise IllegalTransition(f"offer {offer_id}: {cur} -> {to}")
        offer = self._offers[offer_id]
        if cur is OfferState.OFFERED:
            for index, key in ((self._by_agent, offer.agent_id),
                               (self._by_framework, offer.framework_id)):
                index[key].discard(offer_id)
                if not index[key]:
                    del index[key]
            left = self._outstanding[offer.agent_id] - offer.resources
            if left:
                self._outstanding[offer.agent_id] = left
            else:
                del self._outstanding[offer.agent_id]
            self._live_allocations.discard(offer.allocation_id)
        if to in LIVE_STATES:
            self._state[offer_id] = to
        else:
            del self._offers[offer_id], self._state[offer_id]
            self._history[offer_id] = to
            while len(self._history) > self.history_size:
                self._history.popitem(last=False)
        return offer

    # -- events ------------------------------------------------------------------------
    def agent_updated(self, agent_id: str, hostname: str, total: Resources | None,
                      now: float, attributes: Iterable[common_pb2.Attribute] = ()) -> list[Command]:
        """From the state stream: an agent (re)registered or changed. If its new total no
        longer holds what is outstanding on it, its offers are rescinded."""
        self._agents[agent_id] = _Agent(hostname, total, tuple(attributes))
        out = self._expire(now)
        if total is not None and not self._fits(agent_id, Resources()):
            out += self._rescind(sorted(self._by_agent.get(agent_id, ())),
                                 RescindReason.RESCIND_REASON_RECLAIMED,
                                 f"agent {agent_id} shrank to {total}", recover=True)
        return coalesce(out)

    def allocations(self, allocations: Iterable[internal_pb2.Allocation],
                    now: float) -> list[Command]:
        """From the allocator: make one offer per allocation."""
        out = self._expire(now)
        for a in allocations:
            out += self._allocation(a, now)
        return coalesce(out)

    def _allocation(self, a: internal_pb2.Allocation, now: float) -> list[Command]:
        what = f"allocation {a.allocation_id!r} ({a.framework_id!r} on {a.agent_id!r})"
        if not a.framework_id or not a.agent_id:
            return [Anomaly("allocation_dropped", f"{what}: no framework or agent id")]
        if a.allocation_id and a.allocation_id in self._live_allocations:
            return [Anomaly("allocation_dropped", f"{what}: duplicate of a live offer")]
        try:
            res = (Resources.from_proto(a.resources))
        except ValueError as exc:
            return [Anomaly("allocation_dropped", f"{what}: invalid resources: {exc}")]
        if not res:
            return [Anomaly("allocation_dropped", f"{what}: no resources")]
        if not self._fits(a.agent_id, res):
            # Trust, but never offer more than the agent has: hand it straight back.
            return [Anomaly("allocation_over_total", f"{what}: {res} overlaps what is offered "
                            "or launching there, or exceeds the agent's total"),
                    RecoverResources((Recovery(a.framework_id, a.agent_id, res,
                                               RecoverReason.RECOVER_REASON_RESCINDED,
                                               allocation_id=a.allocation_id),))]
        self._next_offer += 1
        agent = self._agents.get(a.agent_id, _Agent())
        timeout = self.offer_timeout
        offer = Offer(
            offer_id=f"{self.prefix}-o{self._next_offer}", framework_id=a.framework_id,
            agent_id=a.agent_id, hostname=agent.hostname, resources=res,
            role=a.role or UNRESERVED, created_at=now,
            expires_at=now + timeout if timeout else math.inf,
            allocation_id=a.allocation_id, traceparent=a.traceparent,
            attributes=agent.attributes)
        self._create(offer)
        return [SendOffers(a.framework_id, (offer,))]

    def accept(self, framework_id: str, offer_ids: Sequence[str],
               operations: Sequence[common_pb2.Operation],
               filters: common_pb2.Filters | None, now: float) -> list[Command]:
        """A framework's ACCEPT, relayed by the master."""
        out = self._expire(now)
        ids = tuple(offer_ids)
        mine: list[str] = []  # live offers of this framework named in the call: used up
        problem: _Invalid | None = None
        for oid in dict.fromkeys(ids):
            st = self._state.get(oid)
            if st is OfferState.OFFERED and self._offers[oid].framework_id == framework_id:
                mine.append(oid)
            elif problem is None:
                problem = _Invalid(RejectReason.REJECT_REASON_OFFER_UNKNOWN,
                                   f"offer {oid!r} {self._why_not_live(oid, framework_id)}")
        try:
            if problem is not None:
                raise problem
            if not ids:
                raise _Invalid(RejectReason.REJECT_REASON_OFFER_UNKNOWN, "no offer ids")
            if len(set(ids)) != len(ids):
                dup = next(i for i in ids if ids.count(i) > 1)
                raise _Invalid(RejectReason.REJECT_REASON_OFFER_UNKNOWN,
                               f"offer {dup!r} named twice (each offer is used once)")
            offers = [self._offers[i] for i in mine]
            agents = sorted({o.agent_id for o in offers})
            if len(agents) > 1:
                raise _Invalid(RejectReason.REJECT_REASON_OFFERS_MIXED_AGENTS,
                               f"offers span agents {agents}; one accept uses one agent")
            used, rest = check_operations(Resources.total(o.resources for o in offers), operations,
                                          agents[0], offers[0].role)
        except _Invalid as bad:
            out.append(AcceptRejected(framework_id, ids, _task_ids(operations),
                                      bad.reason, bad.message))
            recs = []
            for oid in mine:
                o = self._move(oid, OfferState.REJECTED)
                recs.append(Recovery(o.framework_id, o.agent_id, o.resources,
                                     RecoverReason.RECOVER_REASON_LAUNCH_REJECTED,
                                     offer_id=oid, allocation_id=o.allocation_id))
            out.append(RecoverResources(tuple(recs)))
            return coalesce(out)
        first = offers[0]
        if operations:
            self._next_request += 1
            rid = f"{self.prefix}-l{self._next_request}"
            for oid in mine:
                self._move(oid, OfferState.LAUNCHING)
            self._pending[rid] = PendingLaunch(rid, framework_id, first.agent_id, tuple(mine),
                                               used, _task_ids(operations), now)
            out.append(LaunchRequest(rid, framework_id, first.agent_id, tuple(mine),
                                     tuple(operations), tuple(o.traceparent for o in offers)))
            if rest:  # one Recovery for the pooled remainder, linked to the first offer
                out.append(RecoverResources((Recovery(
                    framework_id, first.agent_id, rest, RecoverReason.RECOVER_REASON_UNUSED,
                    refuse_seconds(filters), first.offer_id, first.allocation_id),)))
        else:  # nothing to do: each offer goes back whole, as a decline under these filters
            out.append(RecoverResources(tuple(
                Recovery(framework_id, o.agent_id, o.resources,
                         RecoverReason.RECOVER_REASON_UNUSED, refuse_seconds(filters),
                         o.offer_id, o.allocation_id)
                for o in (self._move(oid, OfferState.ACCEPTED) for oid in mine))))
        return coalesce(out)

    def decline(self, framework_id: str, offer_ids: Sequence[str],
                filters: common_pb2.Filters | None, now: float,
                reason: str = "") -> list[Command]:
        """A framework's DECLINE: the allocator filters these resources for refuse_seconds.
        Ids not outstanding for this framework are ignored (reported as an Anomaly)."""
        out = self._expire(now)
        refuse = refuse_seconds(filters)
        recs = []
        for oid in dict.fromkeys(offer_ids):
            if (self._state.get(oid) is not OfferState.OFFERED
                    or self._offers[oid].framework_id != framework_id):
                out.append(Anomaly("decline_ignored", f"decline by {framework_id!r}: offer "
                                   f"{oid!r} {self._why_not_live(oid, framework_id)}"))
                continue
            o = self._move(oid, OfferState.DECLINED)
            recs.append(Recovery(framework_id, o.agent_id, o.resources,
                                 RecoverReason.RECOVER_REASON_DECLINED, refuse, oid,
                                 o.allocation_id))
        out.append(RecoverResources(tuple(recs)))
        return coalesce(out)

    def tick(self, now: float) -> list[Command]:
        """Timer: rescind the offers whose time is up (expires_at <= now)."""
        return coalesce(self._expire(now))

    def launch_result(self, request_id: str, accepted: bool, reason: int = 0,
                      message: str = "", now: float | None = None) -> list[Command]:
        """The master's answer to a LaunchRequest."""
        out = [] if now is None else self._expire(now)
        pending = self._pending.pop(request_id, None)
        if pending is None:
            out.append(Anomaly("launch_result_ignored",
                               f"launch result for unknown request {request_id!r}"))
            return coalesce(out)
        allocation_id = self._offers[pending.offer_ids[0]].allocation_id
        to = OfferState.LAUNCHED if accepted else OfferState.LAUNCH_FAILED
        for oid in pending.offer_ids:
            self._move(oid, to)
        if not accepted:
            out.append(AcceptRejected(
                pending.framework_id, pending.offer_ids, pending.task_ids,
                reason or RejectReason.REJECT_REASON_AGENT_UNAVAILABLE,
                message or "the master refused the launch"))
        if pending.resources:
            why = (RecoverReason.RECOVER_REASON_LAUNCHED if accepted
                   else RecoverReason.RECOVER_REASON_LAUNCH_REJECTED)
            out.append(RecoverResources((Recovery(
                pending.framework_id, pending.agent_id, pending.resources, why,
                offer_id=pending.offer_ids[0],
                allocation_id=allocation_id,
                task_ids=pending.task_ids),)))
        return coalesce(out)

    def agent_removed(self, agent_id: str, now: float) -> list[Command]:
        """The agent is gone or unreachable: rescind its offers. No Recovery: the allocator
        drops the agent (and all allocated on it) from the state stream itself. Pending
        launches on it stay until the master answers (it will refuse them)."""
        out = self._expire(now)
        self._agents.pop(agent_id, None)
        out += self._rescind(sorted(self._by_agent.get(agent_id, ())),
                             RescindReason.RESCIND_REASON_AGENT_REMOVED,
                             f"agent {agent_id} removed", recover=False)
        return coalesce(out)

    def framework_removed(self, framework_id: str, now: float,
                          reason: int = RescindReason.RESCIND_REASON_FRAMEWORK_INACTIVE,
                          ) -> list[Command]:
        """The framework is gone, inactive or suppressed: rescind and recover its offers."""
        out = self._expire(now)
        out += self._rescind(sorted(self._by_framework.get(framework_id, ())), reason,
                             f"framework {framework_id} inactive", recover=True)
        return coalesce(out)

    def rescind_all(self, reason: int = RescindReason.RESCIND_REASON_BROKER_FAILOVER,
                    ) -> list[Command]:
        """Failover or shutdown: rescind every outstanding offer and abandon pending
        launches, without Recovery (see the module comment). The table is left empty."""
        out = self._rescind(sorted(self._by_framework_all()), reason,
                            "the offer broker is failing over", recover=False)
        for pending in self._pending.values():
            for oid in pending.offer_ids:
                self._move(oid, OfferState.ABANDONED)
        self._pending.clear()
        self._expiry.clear()
        return coalesce(out)

    # -- helpers -----------------------------------------------------------------------
    def _by_framework_all(self) -> list[str]:
        return [i for ids in self._by_framework.values() for i in ids]

    def _fits(self, agent_id: str, extra: Resources, pending: bool = True) -> bool:
        """Whether outstanding offers (+ pending launches) + `extra` fit the agent's total,
        compared without roles (a reservation moves resources, it does not add any). Ports
        and set items must not overlap even when the total is unknown."""
        held = self.outstanding(agent_id)
        if pending:
            held += Resources.total(p.resources for p in self._pending.values()
                                    if p.agent_id == agent_id)
        if _overlap(held, extra):
            return False  # the same port (or set item) offered twice: `+` would hide it
        agent = self._agents.get(agent_id)
        if agent is None or agent.total is None:
            return True
        return agent.total.with_role(UNRESERVED).contains((held + extra).with_role(UNRESERVED))

    def _why_not_live(self, offer_id: str, framework_id: str) -> str:
        st = self.state(offer_id)
        if st is None:
            return "is unknown (never made by this broker, or long gone)"
        if st in LIVE_STATES and self._offers[offer_id].framework_id != framework_id:
            return "is not an offer of this framework"
        if st is OfferState.LAUNCHING:
            return "was already used by another accept"
        return f"is no longer outstanding ({st.value})"

    def _rescind(self, offer_ids: Sequence[str], reason: int, message: str,
                 recover: bool, to: OfferState = OfferState.RESCINDED) -> list[Command]:
        by_fw: dict[str, list[str]] = {}
        recs = []
        for oid in offer_ids:
            o = self._move(oid, to)
            by_fw.setdefault(o.framework_id, []).append(oid)
            if recover:
                why = (RecoverReason.RECOVER_REASON_EXPIRED if to is OfferState.EXPIRED
                       else RecoverReason.RECOVER_REASON_RESCINDED)
                recs.append(Recovery(o.framework_id, o.agent_id, o.resources, why,
                                     offer_id=oid, allocation_id=o.allocation_id))
        out: list[Command] = [Rescind(fw, tuple(ids), reason, message)
                              for fw, ids in by_fw.items()]
        if recs:
            out.append(RecoverResources(tuple(recs)))
        return out

    def _expire(self, now: float) -> list[Command]:
        due = []
        while self._expiry and self._expiry[0][0] <= now:
            _, oid = heapq.heappop(self._expiry)
            if self._state.get(oid) is OfferState.OFFERED:
                due.append(oid)
        if not due:
            return []
        return self._rescind(due, RescindReason.RESCIND_REASON_EXPIRED,
                             "offer timed out", recover=True, to=OfferState.EXPIRED)

    # -- invariants --------------------------------------------------------------------
    def validate(self) -> None:
        """Invariants, checked after every step in tests."""
        assert self._offers.keys() == self._state.keys()
        assert not self._offers.keys() & self._history.keys(), "an offer in two states"
        assert all(s in LIVE_STATES for s in self._state.values())
        assert all(s not in LIVE_STATES for s in self._history.values())
        offered = {i for i, s in self._state.items() if s is OfferState.OFFERED}
        assert offered == {i for ids in self._by_agent.values() for i in ids}
        assert offered == set(self._by_framework_all())
        for agent_id, ids in self._by_agent.items():
            assert all(self._offers[i].agent_id == agent_id for i in ids)
            total = Resources.total(self._offers[i].resources for i in ids)
            have = self._outstanding[agent_id]
            assert total.contains(have) and have.contains(total), (agent_id, total, have)
            assert self._fits(agent_id, Resources(), pending=False), f"{agent_id} over-offered"
            seen = Resources()
            for i in sorted(ids):
                assert not _overlap(seen, self._offers[i].resources), f"{i}: port offered twice"
                seen += self._offers[i].resources
        assert self._outstanding.keys() == self._by_agent.keys()
        for fw, ids in self._by_framework.items():
            assert all(self._offers[i].framework_id == fw for i in ids)
        assert self._live_allocations == {
            self._offers[i].allocation_id for i in offered if self._offers[i].allocation_id}
        launching = [i for p in self._pending.values() for i in p.offer_ids]
        assert len(launching) == len(set(launching)), "an offer in two launches"
        assert set(launching) == {i for i, s in self._state.items()
                                  if s is OfferState.LAUNCHING}
        for p in self._pending.values():
            assert all(self._offers[i].agent_id == p.agent_id
                       and self._offers[i].framework_id == p.framework_id for i in p.offer_ids)
