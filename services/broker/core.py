"""The offer-broker's pure core: owns the table of outstanding offers (ids, expiry, state),
turns allocations into offers and ACCEPT/DECLINE/timeouts into launches and recoveries, and
makes every decision the broker takes: which launches the master will not answer
(launches.py), what a new allocator or master means, what the state stream says of agents,
frameworks and tasks (stream.py), and when allocations wait for that stream.

No sockets, no clock, no threads: each event method takes decoded inputs and `now` (Unix
seconds, the shell's wall clock, because `expires_at_us` goes to frameworks) and returns
commands (commands.py) and Notices (what it decided or found odd; not sent). The shell
calls `tick(now)` at `next_deadline()`: offer expiry and launch deadlines.

Where resources go. Every allocation the broker takes becomes one offer; every offer ends
in exactly one of: a LaunchRequest (its tasks' resources come back later as a Recovery
LAUNCHED or LAUNCH_REJECTED, the rest at once as UNUSED), a Recovery (DECLINED, EXPIRED,
RESCINDED, LAUNCH_REJECTED), or -- only when the allocator will forget them by itself --
nothing: offers of a removed agent, and everything on `rescind_all`. Every Recovery carries
an explicit `refuse_seconds` (0 = no filter): the default of 5 s is applied here, once.

Failover, who does what (docs/DESIGN.md §7 has the table):
- The OLD broker, if it still runs, calls `rescind_all(RESCIND_REASON_BROKER_FAILOVER)`: no
  Recovery (the allocator, seeing a new broker epoch, recovers everything itself); if it
  died, the master rescinds every offer carrying its prefix ("<prefix>-o<n>").
- The NEW broker starts with an empty table and a new prefix (old ids are unknown).
- A NEW ALLOCATOR counts every resource free: offers rescinded without Recovery.
- A NEW MASTER: offers relayed by another master (or made while none led) are rescinded
  WITH Recovery, unfiltered; pending launches stay (launches.py). The same holds when the
  link to the leading master broke and came back (`master_link_reset`: what was queued on
  it is lost), and offers the shell could not hand to the master at all go straight back
  (`offers_undelivered`).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from schemas import common_pb2, internal_pb2
from services.broker import stream
from services.broker.allocations import dropped, facts, hand_back, what
from services.broker.commands import (
    AcceptRejected,
    Command,
    Decision,
    Offer,
    RecoverResources,
    Recovery,
    Rescind,
    SendOffers,
    Verdict,
    coalesce,
)
from services.broker.launches import LaunchTracker, PendingLaunch
from services.broker.masters import MasterEvents
from services.broker.revocable import launch_request
from services.broker.stream import AgentView
from services.broker.table import HISTORY_SIZE, OfferState, OfferTable
from services.broker.validation import (
    Invalid,
    check_operations,
    failed_check,
    overlap,
    refuse_seconds,
    task_ids,
)
from services.bus.stream_core import StateEntry
from services.notice import Notice
from services.resources import UNRESERVED, Resources

DEFAULT_OFFER_TIMEOUT_S = 30.0
DEFAULT_LAUNCH_TIMEOUT_S = 60.0
MAX_HELD = 4096  # allocations held while the state stream syncs; beyond, handed back

RescindReason = common_pb2.RescindReason
RejectReason = common_pb2.RejectReason
RecoverReason = internal_pb2.InternalMessage.RecoverResources.Reason
Reclaim = internal_pb2.InternalMessage.ReclaimOffers.Reclaim


@dataclass
class BrokerCore(MasterEvents):
    """The offer table. `prefix` makes ids unique across brokers (use the leader epoch)."""

    prefix: str
    offer_timeout: float | None = DEFAULT_OFFER_TIMEOUT_S  # None or 0: offers never expire
    launch_timeout: float | None = DEFAULT_LAUNCH_TIMEOUT_S  # see launches.py; None/0: never
    history_size: int = HISTORY_SIZE
    max_held: int = MAX_HELD
    table: OfferTable = field(default_factory=OfferTable)
    _launches: LaunchTracker = field(default_factory=LaunchTracker)
    _agents: dict[str, AgentView] = field(default_factory=dict)  # registered, from the stream
    _held: list[internal_pb2.Allocation] = field(default_factory=list)  # until synced
    _synced: bool = False  # the state stream's copy is current
    _next_offer: int = 0
    _next_request: int = 0
    allocator_epoch: int = 0  # the newest allocator leader seen (0: none yet)

    def __post_init__(self) -> None:
        self._launches.timeout = self.launch_timeout
        self.table.history_size = self.history_size

    # -- views -------------------------------------------------------------------------
    def offer(self, offer_id: str) -> Offer | None:
        return self.table.offers.get(offer_id)

    def state(self, offer_id: str) -> OfferState | None:
        return self.table.state(offer_id)

    def outstanding_offers(self) -> list[Offer]:
        return self.table.outstanding_offers()

    def outstanding(self, agent_id: str) -> Resources:
        return self.table.outstanding(agent_id)

    @property
    def pending_launches(self) -> dict[str, PendingLaunch]:
        return self._launches.pending()

    def launch_deadline(self, request_id: str) -> float | None:
        return self._launches.deadline(request_id)

    @property
    def master_epoch(self) -> int | None:
        return self._launches.master_epoch

    @property
    def synced(self) -> bool:
        return self._synced

    @property
    def held(self) -> int:
        return len(self._held)

    def next_expiry(self) -> float | None:
        """When the next outstanding offer expires (None: none will)."""
        return self.table.next_expiry()

    def next_deadline(self) -> float | None:
        """When the shell should call `tick` next: an offer expires, or a launch's deadline
        passes (None: nothing is timed)."""
        due = [d for d in (self.next_expiry(), self._launches.next_deadline()) if d is not None]
        return min(due) if due else None

    def _move(self, offer_id: str, to: OfferState) -> Offer:
        """The one place offers change state (the table's transition table; illegal raises)."""
        return self.table.move(offer_id, to)

    # -- events: the state stream ------------------------------------------------------
    def stream_changed(self, entries: Iterable[StateEntry], now: float,
                       reset: bool = False) -> list[Command]:
        """The master's state stream changed (reset: `entries` are a fresh copy of all of
        it). A change comes only from a synced stream: allocations held until then are
        offered now. Agents (re)registered or changed update what offers name; agents gone
        and frameworks gone or disconnected lose their offers; tasks seen may answer
        launches the master will not."""
        change = stream.read(entries, reset)
        out = self._due(now)
        for agent_id, view in change.agents.items():
            if view is None:
                if agent_id in self._agents:
                    out += self.agent_removed(agent_id, now, away=agent_id in change.away)
            elif self._agents.get(agent_id) != view:
                out += self.agent_updated(agent_id, view.hostname, view.total, now,
                                          view.attributes)
        for fid, deleted in change.frameworks_gone:
            out += self.framework_removed(fid, now, message=f"framework {fid} "
                                          f"{'removed' if deleted else 'disconnected'}")
        if reset:  # what the new copy lacks is gone
            for agent_id in sorted(set(self._agents) - change.agents_present):
                out += self.agent_removed(agent_id, now)
            for fid in sorted(set(self.table.by_framework) - change.frameworks_present):
                out += self.framework_removed(fid, now, message=f"framework {fid} removed")
        self._launches.tasks_seen(change.tasks)
        self._synced = True
        if self._held:
            gone = {fid for fid, _ in change.frameworks_gone}
            if reset:
                gone |= {a.framework_id for a in self._held} - change.frameworks_present
            out += self._release(gone, now)
        out += self._resolve_launches(now)
        return coalesce(out)

    def _release(self, gone: set[str], now: float) -> list[Command]:
        """Offer the held allocations, but hand back (a Recovery, no offer) those of agents
        not on the stream now or of frameworks gone. An agent missing from this copy may
        still be on the allocator's (a new master publishes agents as they re-register, so
        its first snapshot can lack them): without the Recovery the allocator would count
        them as offered for good. For an agent it dropped too, the Recovery is stale."""
        out: list[Command] = []
        held, self._held = self._held, []
        for a in held:
            if a.agent_id not in self._agents:
                out += hand_back(a, dropped(
                    a, f"{what(a)}: the agent is not on the stream; handed back"))
            elif a.framework_id in gone:
                out += hand_back(a, dropped(a, f"{what(a)}: the framework left "
                                                      "while it was held"))
            else:
                out += self._allocation(a, now)
        return out

    # -- events: the allocator ---------------------------------------------------------
    def allocator_seen(self, epoch: int, now: float) -> list[Command]:
        """A message from the allocator leader of `epoch`. A newer one counts every
        resource free: rescind what the old one allocated and drop what of it is held,
        without Recovery (the new one never counted it). Pending launches stay."""
        out = self._due(now)
        if epoch <= self.allocator_epoch:
            return out
        old, self.allocator_epoch = self.allocator_epoch, epoch
        ids = sorted(self.table.offered_ids())
        out += self._rescind(ids, RescindReason.RESCIND_REASON_RECLAIMED,
                             "a new allocator leads; offers are made afresh", recover=False)
        dropped, self._held = len(self._held), []  # the old one's, waiting for the stream
        if old:
            out.append(Notice.of("allocator_failover", f"allocator epoch {old} -> {epoch}: "
                                 f"{len(ids)} offers rescinded, {dropped} held allocations "
                                 "dropped", old_epoch=old, epoch=epoch, rescinded=len(ids),
                                 dropped=dropped))
        return coalesce(out)

    def allocations(self, allocations: Iterable[internal_pb2.Allocation],
                    now: float, synced: bool = True) -> list[Command]:
        """From the allocator: make one offer per allocation. Offers name the agent's
        hostname and attributes, so while the state stream is not synced (`synced`: the
        shell's subscriber's word) they wait for it; beyond `max_held`, they go back."""
        out = self._due(now)
        batch = list(allocations)
        self._synced = synced
        if synced:  # (anything still held goes first, in order)
            held, self._held = self._held, []
            return coalesce(out + self._offer_all(held + batch, now))
        room = max(0, self.max_held - len(self._held))
        self._held += batch[:room]
        for a in batch[room:]:
            out += hand_back(a, Notice.of(
                "allocation_dropped", f"{what(a)}: more than {self.max_held} allocations "
                "wait for the state stream", "warning", **facts(a)))
        if batch[:room]:
            out.append(Notice.of("allocations_held", f"{len(batch[:room])} allocations "
                                 "wait for the state stream to sync",
                                 held=len(self._held)))
        return coalesce(out)

    def _offer_all(self, allocations: Iterable[internal_pb2.Allocation],
                   now: float) -> list[Command]:
        out: list[Command] = []
        for a in allocations:
            out += self._allocation(a, now)
        return out

    def _allocation(self, a: internal_pb2.Allocation, now: float) -> list[Command]:
        name = what(a)
        if not a.framework_id or not a.agent_id:
            return [dropped(a, f"{name}: no framework or agent id")]
        if a.allocation_id and a.allocation_id in self.table.live_allocations:
            return [dropped(a, f"{name}: duplicate of a live offer")]
        try:
            res = (Resources.from_proto(a.resources))
        except ValueError as exc:
            return [dropped(a, f"{name}: invalid resources: {exc}")]
        if not res:
            return [dropped(a, f"{name}: no resources")]
        if not self._fits(a.agent_id, res):
            # Trust, but never offer more than the agent has: hand it straight back.
            return hand_back(a, Notice.of(
                "allocation_over_total", f"{name}: {res} overlaps what is offered or "
                "launching there, or exceeds the agent's total", "warning", **facts(a)), res)
        agent = self._agents.get(a.agent_id)
        if agent is None:  # the allocator's copy of the stream is ahead of ours (failover)
            return hand_back(a, dropped(a, f"{name}: the agent is not on the stream yet; "
                                           "handed back"), res)
        self._next_offer += 1
        timeout = self.offer_timeout
        offer = Offer(
            offer_id=f"{self.prefix}-o{self._next_offer}", framework_id=a.framework_id,
            agent_id=a.agent_id, hostname=agent.hostname, resources=res,
            role=a.role or UNRESERVED, created_at=now,
            expires_at=now + timeout if timeout else math.inf,
            allocation_id=a.allocation_id, traceparent=a.traceparent, revocable=a.revocable,
            attributes=agent.attributes, master_epoch=self._launches.master_epoch)
        self.table.create(offer)
        return [SendOffers(a.framework_id, (offer,))]

    def reclaim_offers(self, reclaims: Iterable[Reclaim], now: float) -> list[Command]:
        """From the allocator (fair sharing): rescind (RESCIND_REASON_RECLAIMED) and recover
        unfiltered the framework's OFFERED offers on each agent, and hand back what is held
        for it there. Pairs with nothing outstanding (answered meanwhile) are counted."""
        out = self._due(now)
        ignored = 0
        for r in reclaims:
            ids = sorted(self.table.by_agent.get(r.agent_id, set())
                         & self.table.by_framework.get(r.framework_id, set()))
            pair = (r.framework_id, r.agent_id)
            mine = [a for a in self._held if (a.framework_id, a.agent_id) == pair]
            if not ids and not mine:
                ignored += 1
                continue
            out += self._rescind(ids, RescindReason.RESCIND_REASON_RECLAIMED,
                                 r.reason or "reclaimed for a framework below its share",
                                 recover=True)
            self._held = [a for a in self._held if (a.framework_id, a.agent_id) != pair]
            for a in mine:
                out += hand_back(a, Notice.of("allocation_reclaimed", f"{what(a)}: reclaimed "
                                              "while held for the stream", "info", **facts(a)))
        if ignored:
            out.append(Notice.of("reclaim_ignored", f"{ignored} reclaims named no outstanding "
                                 "offer (answered meanwhile)", reclaims=ignored))
        return coalesce(out)

    # -- events: frameworks, through the master ----------------------------------------
    def accept(self, framework_id: str, offer_ids: Sequence[str],
               operations: Sequence[common_pb2.Operation],
               filters: common_pb2.Filters | None, now: float) -> Decision:
        """A framework's ACCEPT, relayed by the master. A valid one with operations
        becomes a LaunchRequest, tracked until the master (or the stream) answers it."""
        out = self._due(now)
        ids = tuple(offer_ids)
        mine: list[str] = []  # live offers of this framework named in the call: used up
        problem: Invalid | None = None
        for oid in dict.fromkeys(ids):
            if self.table.offered_to(oid, framework_id):
                mine.append(oid)
            elif problem is None:
                problem = Invalid(RejectReason.REJECT_REASON_OFFER_UNKNOWN,
                                  f"offer {oid!r} {self.table.why_not_live(oid, framework_id)}")
        try:
            if problem is not None:
                raise problem
            if not ids:
                raise Invalid(RejectReason.REJECT_REASON_OFFER_UNKNOWN, "no offer ids")
            if len(set(ids)) != len(ids):
                dup = next(i for i in ids if ids.count(i) > 1)
                raise Invalid(RejectReason.REJECT_REASON_OFFER_UNKNOWN,
                              f"offer {dup!r} named twice (each offer is used once)")
            offers = [self.table.offers[i] for i in mine]
            agents = sorted({o.agent_id for o in offers})
            if len(agents) > 1:
                raise Invalid(RejectReason.REJECT_REASON_OFFERS_MIXED_AGENTS,
                              f"offers span agents {agents}; one accept uses one agent")
            used, rest = check_operations(Resources.total(o.resources for o in offers),
                                          operations, agents[0], offers[0].role)
        except Invalid as bad:
            out.append(AcceptRejected(framework_id, ids, task_ids(operations),
                                      bad.reason, bad.message, refused_here=True))
            recs = []
            for oid in mine:
                o = self._move(oid, OfferState.REJECTED)
                recs.append(Recovery(o.framework_id, o.agent_id, o.resources,
                                     RecoverReason.RECOVER_REASON_LAUNCH_REJECTED,
                                     offer_id=oid, allocation_id=o.allocation_id))
            out.append(RecoverResources(tuple(recs)))
            return Decision(coalesce(out), Verdict(
                False, failed_check(bad.reason), bad.message, used=tuple(mine),
                task_ids=task_ids(operations)))
        first = offers[0]
        rid = ""
        if operations:
            self._next_request += 1
            rid = f"{self.prefix}-l{self._next_request}"
            for oid in mine:
                self._move(oid, OfferState.LAUNCHING)
            self._launches.add(PendingLaunch(rid, framework_id, first.agent_id, tuple(mine),
                                             used, task_ids(operations), now), now)
            out.append(launch_request(rid, framework_id, first.agent_id, tuple(mine),
                                      operations, offers))
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
        return Decision(coalesce(out), Verdict(True, request_id=rid, used=tuple(mine),
                                               task_ids=task_ids(operations)))

    def decline(self, framework_id: str, offer_ids: Sequence[str],
                filters: common_pb2.Filters | None, now: float,
                reason: str = "") -> Decision:
        """A framework's DECLINE: the allocator filters these resources for refuse_seconds.
        Ids not outstanding for this framework are ignored (each with a Notice)."""
        out = self._due(now)
        refuse = refuse_seconds(filters)
        recs = []
        ignored: list[str] = []
        for oid in dict.fromkeys(offer_ids):
            if not self.table.offered_to(oid, framework_id):
                why = f"offer {oid!r} {self.table.why_not_live(oid, framework_id)}"
                ignored.append(why)
                out.append(Notice.of("decline_ignored", f"decline by {framework_id!r}: {why}",
                                     framework_id=framework_id, offer_id=oid))
                continue
            o = self._move(oid, OfferState.DECLINED)
            recs.append(Recovery(framework_id, o.agent_id, o.resources,
                                 RecoverReason.RECOVER_REASON_DECLINED, refuse, oid,
                                 o.allocation_id))
        out.append(RecoverResources(tuple(recs)))
        used = tuple(r.offer_id for r in recs)
        verdict = Verdict(not ignored, "offer_not_outstanding" if ignored else "",
                          "; ".join(ignored) or reason, used=used, refuse_seconds=refuse)
        return Decision(coalesce(out), verdict)

    # -- events: time and the master ---------------------------------------------------
    def tick(self, now: float) -> list[Command]:
        """Timer (at `next_deadline()`): rescind the offers whose time is up (expires_at <=
        now), and settle the launches whose deadline passed."""
        return coalesce(self._due(now))

    def launch_result(self, request_id: str, accepted: bool, reason: int = 0,
                      message: str = "", now: float | None = None) -> list[Command]:
        """The master's answer to a LaunchRequest."""
        out = [] if now is None else self._due(now)
        pending = self._launches.pop(request_id)
        if pending is None:
            out.append(Notice.of("launch_result_ignored", "launch result for unknown "
                                 f"request {request_id!r}", "warning", request_id=request_id))
            return coalesce(out)
        return coalesce(out + self._settle(pending, accepted, reason, message))

    def _settle(self, pending: PendingLaunch, accepted: bool, reason: int = 0,
                message: str = "") -> list[Command]:
        out: list[Command] = []
        allocation_id = self.table.offers[pending.offer_ids[0]].allocation_id
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
        return out

    def _resolve_launches(self, now: float) -> list[Command]:
        """Answer, from the state stream and the clock, the launches the master will not."""
        out: list[Command] = []
        for pending, outcome in self._launches.resolve(now):
            facts: dict[str, str | int] = {
                "request_id": pending.request_id, "framework_id": pending.framework_id,
                "tasks": len(pending.task_ids)}
            if outcome == "launched":
                out.append(Notice.of("launch_seen_launched", "the master did not answer the "
                                     "launch; its tasks are on the state stream", "info",
                                     **facts))
                out += self._settle(pending, True)
            else:
                out.append(Notice.of("launch_unanswered", "the master never answered the "
                                     "launch and its tasks never appeared; counted refused",
                                     "warning", **facts))
                out += self._settle(
                    pending, False, RejectReason.REJECT_REASON_AGENT_UNAVAILABLE,
                    "the master never answered the launch and its tasks never appeared")
        return out

    # -- events: agents, frameworks, failover ------------------------------------------
    def agent_updated(self, agent_id: str, hostname: str, total: Resources | None,
                      now: float, attributes: Iterable[common_pb2.Attribute] = ()) -> list[Command]:
        """An agent (re)registered or changed. If its new total no longer holds what is
        outstanding on it, its offers are rescinded."""
        self._agents[agent_id] = AgentView(hostname, total, tuple(attributes))
        out = self._due(now)
        if total is not None and not self._fits(agent_id, Resources()):
            out += self._rescind(sorted(self.table.by_agent.get(agent_id, ())),
                                 RescindReason.RESCIND_REASON_RECLAIMED,
                                 f"agent {agent_id} shrank to {total}", recover=True)
        return coalesce(out)

    def agent_removed(self, agent_id: str, now: float, away: bool = False) -> list[Command]:
        """The agent is gone or unreachable: rescind its offers. No Recovery: the allocator
        drops the agent (and all allocated on it) from the state stream itself; but it
        keeps an agent `away` (RECOVERING: a new master waits for it), so what was offered
        there is recovered. Pending launches on it stay until the master answers (it will
        refuse them)."""
        out = self._due(now)
        self._agents.pop(agent_id, None)
        out += self._rescind(sorted(self.table.by_agent.get(agent_id, ())),
                             RescindReason.RESCIND_REASON_AGENT_REMOVED,
                             f"agent {agent_id} {'recovering' if away else 'removed'}",
                             recover=away)
        return coalesce(out)

    def framework_removed(self, framework_id: str, now: float,
                          reason: int = RescindReason.RESCIND_REASON_FRAMEWORK_INACTIVE,
                          message: str = "") -> list[Command]:
        """The framework is gone, inactive or suppressed: rescind and recover its offers."""
        out = self._due(now)
        out += self._rescind(sorted(self.table.by_framework.get(framework_id, ())), reason,
                             message or f"framework {framework_id} inactive", recover=True)
        return coalesce(out)

    def rescind_all(self, reason: int = RescindReason.RESCIND_REASON_BROKER_FAILOVER,
                    ) -> list[Command]:
        """Failover or shutdown: rescind every outstanding offer and abandon pending
        launches, without Recovery (see the module comment). The table is left empty."""
        out = self._rescind(sorted(self.table.offered_ids()), reason,
                            "the offer broker is failing over", recover=False)
        for pending in self._launches.pending().values():
            for oid in pending.offer_ids:
                self._move(oid, OfferState.ABANDONED)
        self._launches.clear()
        self.table.forget_expiry()
        self._held.clear()
        return coalesce(out)

    # -- helpers -----------------------------------------------------------------------
    def _fits(self, agent_id: str, extra: Resources, pending: bool = True) -> bool:
        """Whether outstanding offers (+ pending launches) + `extra` fit the agent's total,
        compared without roles (a reservation moves resources, it does not add any). Ports
        and set items must not overlap even when the total is unknown."""
        held = self.outstanding(agent_id)
        if pending:
            held += self._launches.held_on(agent_id)
        if overlap(held, extra):
            return False  # the same port (or set item) offered twice: `+` would hide it
        agent = self._agents.get(agent_id)
        if agent is None or agent.total is None:
            return True
        return agent.total.with_role(UNRESERVED).contains((held + extra).with_role(UNRESERVED))

    def _rescind(self, offer_ids: Sequence[str], reason: int, message: str,
                 recover: bool, to: OfferState = OfferState.RESCINDED,
                 tell: bool = True) -> list[Command]:
        """Move the offers to `to`; a Rescind per framework (unless `tell` is False: no
        framework saw them) and, with `recover`, their Recovery."""
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
                              for fw, ids in by_fw.items()] if tell else []
        if recs:
            out.append(RecoverResources(tuple(recs)))
        return out

    def _due(self, now: float) -> list[Command]:
        """What time alone decided by `now`: offers expired, launch deadlines passed."""
        due = self.table.expired(now)
        out = self._rescind(due, RescindReason.RESCIND_REASON_EXPIRED,
                            "offer timed out", recover=True, to=OfferState.EXPIRED) if due else []
        deadline = self._launches.next_deadline()
        if deadline is not None and deadline <= now:
            out += self._resolve_launches(now)
        return out

    # -- invariants --------------------------------------------------------------------
    def validate(self) -> None:
        """Invariants, checked after every step in tests."""
        self.table.validate()
        for agent_id in self.table.by_agent:
            assert self._fits(agent_id, Resources(), pending=False), f"{agent_id} over-offered"
        self._launches.validate(self.table)
        assert self._launches.timeout == self.launch_timeout
        assert not self._held or not self._synced, "allocations held from a synced stream"
        assert len(self._held) <= self.max_held
        assert self.allocator_epoch >= 0
