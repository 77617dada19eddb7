"""The allocator's shell: leader election, the master's state stream (through StreamFeed), a
DEALER to the leading offer-broker, batched allocation cycles, and /health /metrics
/decisions. It decodes, calls the pure AllocatorCore, and sends its allocations (and its
changed decisions, which the broker relays to the master's state stream)."""

from __future__ import annotations

import itertools
import json
import math
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from google.protobuf.json_format import MessageToDict
from opentelemetry import trace

from schemas import internal_pb2
from services.allocator.core import (
    DEFAULT_REVOCATION_GRACE_S,
    Allocation,
    AllocatorCore,
    AllocatorError,
    Cycle,
    Decision,
    Outcome,
)
from services.allocator.fanout import DEFAULT_MAX_OFFERS_PER_FRAMEWORK
from services.allocator.feed import StreamFeed, norm
from services.allocator.roles import roles_view
from services.bus import codec
from services.bus.election import LeaderChanged, LeaderInfo, detector_from_url
from services.bus.epoch import EpochFence
from services.bus.log import get_logger
from services.bus.peer import DealerClient
from services.bus.reactor import Reactor, Timer
from services.bus.statestream import StateSubscriber
from services.bus.stream_core import Changed
from services.shell.http import Response, json_response
from services.shell.service import ServiceConfig, ServiceKit
from services.telemetry import span_traceparent, spans

log = get_logger("allocator")
# A proxy until services.telemetry.setup() installs the provider: spans made after that
# (or under a provider a test installs) are real; propagation works either way.
tracer = trace.get_tracer("offerbus.allocator")
MAX_SKIPPED = 20  # decisions listed on an allocate span
# Allocations per message: a large cycle leaves in pieces, the first before the rest's
# spans are made, so the broker (and the framework) start on it at once.
ALLOCATIONS_PER_MESSAGE = 1000

Role = codec.Role
Recover = internal_pb2.InternalMessage.RecoverResources
LAUNCHED = Recover.Reason.RECOVER_REASON_LAUNCHED


@dataclass
class AllocatorConfig(ServiceConfig):
    allocator_id: str
    election_url: str  # zk://hosts/chroot or file:///run_dir
    interval: float = 1.0  # periodic sweep (filters expire, anything missed)
    batch: float = 0.05  # at most one event-driven allocation cycle per window (_schedule)
    # Revocation's grace (core.DEFAULT_REVOCATION_GRACE_S); None: no revocation.
    revocation_grace: float | None = DEFAULT_REVOCATION_GRACE_S
    max_offers_per_framework: int = DEFAULT_MAX_OFFERS_PER_FRAMEWORK  # 0: no bound (fanout.py)


class AllocatorShell(ServiceKit):
    def __init__(self, config: AllocatorConfig, reactor: Reactor | None = None) -> None:
        super().__init__("allocator", config.allocator_id, Role.Value("ROLE_ALLOCATOR"), config,
                         reactor)
        self.config = config
        self.start_http({"/decisions": self._http_decisions, "/roles": self._http_roles})
        # Leaders of the roles we talk to, known whether or not we lead.
        self.master: LeaderInfo | None = None
        self.broker: LeaderInfo | None = None
        self.masters = detector_from_url(config.election_url, "master")
        self.brokers = detector_from_url(config.election_url, "broker")
        # While leading:
        self.core: AllocatorCore | None = None
        self.feed: StreamFeed | None = None
        self.subscriber: StateSubscriber | None = None
        self.dealer: DealerClient | None = None
        # Acted on only from the elected broker and master, at their epochs, as our own
        # detectors know them (services/bus/epoch.py).
        self.fence = EpochFence(frozenset({Role.Value("ROLE_BROKER")}))
        self.master_fence = EpochFence(frozenset({Role.Value("ROLE_MASTER")}))
        self.broker_epoch = 0  # the broker epoch our core's offers belong to
        self._batch: Timer | None = None
        self._sweep: Timer | None = None
        self._refilter: Timer | None = None  # a cycle when the next decline filter ends
        self.decisions: dict[str, Decision] = {}  # latest per framework
        self._told: dict[str, tuple[str, str]] = {}  # (outcome, reason) the master last got
        self.last_cycle: tuple[int, float] = (0, 0.0)  # (cycle, wall time)
        self._cycled_at = -math.inf  # the reactor's clock at the last cycle's end (_schedule)
        self._register_metrics()
        for detector, handler in ((self.masters, self._on_master),
                                  (self.brokers, self._on_broker)):
            self.reactor.add_reader(detector, handler)
            detector.start()
        self.join_election(config.election_url, lead=self._lead, pause=self._pause,
                           resume=self._resume, step_down=self._step_down)
        log.info("allocator started", id=config.allocator_id, **self.endpoints)

    # -- leadership ----------------------------------------------------------------------
    def _lead(self, epoch: int) -> None:
        """Start afresh: an empty core, rebuilt from the state stream (DESIGN §4)."""
        self.core = AllocatorCore(id_prefix=f"a{epoch}-",
                                  revocation_grace_s=self.config.revocation_grace,
                                  max_offers_per_framework=self.config.max_offers_per_framework)
        self.feed = StreamFeed(self.core)
        self.decisions = {}
        self.subscriber = StateSubscriber(
            self.reactor, self.ctx, self.sender, self._on_state,
            heartbeat_interval=self.config.heartbeat_interval, max_missed=self.config.max_missed,
            stats=self.stats, fence=self.master_fence, curve=self.curve.client)
        self.dealer = DealerClient(
            self.reactor, self.ctx, self.sender, self._on_broker_message,
            on_connected=self._on_broker_connected, heartbeat=self.beat, stats=self.stats,
            fence=self.fence, curve=self.curve.client, name="broker")
        self._sweep = self.reactor.every(self.config.interval, self._allocate)
        self._point_at_master()
        self._point_at_broker()
        log.info("leading", epoch=epoch)

    def _pause(self, reason: str) -> None:
        """Allocate nothing and send nothing; keep the core, which goes on following the
        state stream and the broker's recoveries (learning is not acting)."""
        self._cancel_timers()

    def _resume(self, epoch: int) -> None:
        """The same reign goes on: the sweep again, and a cycle at once (after a hello, the
        broker may have missed some)."""
        self._sweep = self.reactor.every(self.config.interval, self._allocate)
        if self.dealer is not None and self.dealer.connected:
            self._on_broker_connected()
        else:
            self._schedule()
        log.info("resumed", epoch=epoch)

    def _cancel_timers(self) -> None:
        for timer in (self._batch, self._sweep, self._refilter):
            if timer is not None:
                timer.cancel()
        self._batch = self._sweep = self._refilter = None

    def _step_down(self, reason: str) -> None:
        """Stop acting at once: drop the core (the next leader rebuilds its own)."""
        self._cancel_timers()
        if self.subscriber is not None:
            self.subscriber.close()
        if self.dealer is not None:
            self.dealer.close()
        self.subscriber = self.dealer = None
        self.core = self.feed = None
        log.info("stepped down", reason=reason)

    # -- leaders of other roles ----------------------------------------------------------
    def _on_master(self) -> None:
        for event in self.masters.events():
            if isinstance(event, LeaderChanged):
                self.master = event.leader
                self.master_fence.follow(Role.Value("ROLE_MASTER"), event.leader)
                self._told.clear()  # a new master knows no decisions yet
                log.info("master leader", leader=_who(event.leader))
                self._point_at_master()

    def _on_broker(self) -> None:
        for event in self.brokers.events():
            if isinstance(event, LeaderChanged):
                self.broker = event.leader
                self.fence.follow(Role.Value("ROLE_BROKER"), event.leader)
                log.info("broker leader", leader=_who(event.leader))
                self._point_at_broker()

    def _point_at_master(self) -> None:
        m = self.master
        if self.subscriber is None or m is None:
            return
        if "pub" not in m.endpoints or "snapshot" not in m.endpoints:
            log.warning("master advertises no state stream", endpoints=m.endpoints)
            return
        self.subscriber.connect(m.endpoints["pub"], m.endpoints["snapshot"])

    def _point_at_broker(self) -> None:
        b = self.broker
        if self.dealer is None or self.core is None:
            return
        if b is None or "router" not in b.endpoints:
            self.dealer.disconnect()
            return
        if b.epoch != self.broker_epoch:
            # A new broker has an empty offer table: every offer we counted is gone (the
            # master rescinds the old broker's offers by their id prefix).
            if self.broker_epoch:
                self.stats.inc("broker_failovers")
                log.info("new broker epoch: recovering all offers", old=self.broker_epoch,
                         new=b.epoch)
            self.core.recover_all_offers()
            self.broker_epoch = b.epoch
        self.dealer.connect(b.endpoints["router"])

    # -- inbound -------------------------------------------------------------------------
    def _on_state(self, change: Changed) -> None:
        if self.feed is None:
            return
        if change.reset:
            assert self.subscriber is not None
            self.feed.reset(self.subscriber.store)
            self.stats.inc("state_resets")
            relevant = True
        else:
            relevant = self.feed.apply(change.entries)
        self._log_anomalies()
        if relevant:
            self._schedule()

    def _on_broker_connected(self) -> None:
        # A hello (empty Allocations): lets the broker learn our peer and epoch before we
        # have anything to allocate; then a cycle, as the broker may have missed some. A
        # paused reign says it on resume.
        if self.paused:
            return
        self._send(internal_pb2.InternalMessage(allocations=internal_pb2.InternalMessage
                                                .Allocations()))
        self._told.clear()
        self._schedule()

    def _on_broker_message(self, env: codec.Envelope) -> None:
        core = self.core
        kind = codec.payload_kind(env)
        if kind == "error":
            self.stats.inc("broker_errors")
            log.warning("broker error", code=env.error.code, message=env.error.message)
            return
        if core is None or kind != "internal" or env.sender_role != Role.Value("ROLE_BROKER"):
            self.stats.inc("frames_dropped{reason=unexpected}")
            return
        msg = env.internal
        which = msg.WhichOneof("kind")
        now = time.time()
        try:
            if which == "recover_resources":
                self._recover(core, msg.recover_resources, now)
            elif which == "revive_offers":
                core.revive(msg.revive_offers.framework_id, msg.revive_offers.roles)
                self.stats.inc("revives")
            elif which == "suppress_offers":
                core.suppress(msg.suppress_offers.framework_id, msg.suppress_offers.roles)
                self.stats.inc("suppresses")
            else:
                self.stats.inc("frames_dropped{reason=unexpected}")
                return
        except AllocatorError as exc:
            self.stats.inc(f"refused{{kind={which}}}")
            log.warning("broker message refused", kind=which, error=str(exc))
        self._schedule()

    def _recover(self, core: AllocatorCore, msg: Recover, now: float) -> None:
        for r in msg.recoveries:
            reason = Recover.Reason.Name(r.reason).removeprefix("RECOVER_REASON_").lower()
            self.stats.inc(f"recoveries{{reason={reason}}}")
            if r.reason == LAUNCHED:
                # Still held: the state stream's task records turn these offered resources
                # into used ones (resources_used converts what was offered).
                continue
            try:
                res = norm(r.resources)
                if not core.recover(r.agent_id, r.framework_id, res,
                                    r.filters.refuse_seconds, now):
                    self.stats.inc("recoveries_stale")  # agent or framework gone already
            except (AllocatorError, ValueError) as exc:
                # e.g. an offer made for a previous allocator leader: we never counted it.
                self.stats.inc("recoveries_refused")
                log.warning("recovery refused", offer=r.offer_id, error=str(exc))
        if self.feed is not None and self.feed.retry():
            self._log_anomalies()

    # -- allocation ----------------------------------------------------------------------
    def _schedule(self) -> None:
        """One allocation cycle for the events that come meanwhile, at most one per `batch`
        seconds: at the reactor's next turn (after what it has read) when the last cycle
        ended `batch` seconds ago or more, else when that window ends. The first event after a
        quiet spell (a framework subscribing, a task ending) is not kept waiting for the
        window; under a storm of events, cycles are `batch` apart, end to start, as before."""
        if self._batch is None and self.core is not None and not self.paused:
            delay = max(0.0, self._cycled_at + self.config.batch - self.reactor.clock())
            self._batch = self.reactor.call_later(delay, self._allocate)

    def _allocate(self) -> None:
        if self._batch is not None:
            self._batch.cancel()
            self._batch = None
        core, dealer = self.core, self.dealer
        if core is None or dealer is None or self.subscriber is None or self.paused:
            return
        if not (dealer.connected and self.subscriber.synced):
            return  # allocations nobody would receive would only be lost
        started = time.perf_counter()
        started_ns = time.time_ns()
        now = started_ns / 1e9
        cycle = core.allocate(now)
        self._cycle_seconds.observe(time.perf_counter() - started)
        self._account(cycle, now)
        for msg in self._allocation_messages(cycle, started_ns):
            self._send(msg)  # each as soon as made: the broker starts on the first
        self._reclaim(cycle)
        self._tell_decisions(cycle)
        self._wake_for_filters(core, now)
        self._cycled_at = self.reactor.clock()  # the window runs from the cycle's end

    def _allocation_messages(self, cycle: Cycle, started_ns: int
                             ) -> Iterator[internal_pb2.InternalMessage]:
        """The cycle's Allocations, in messages that fit a frame and hold at most
        ALLOCATIONS_PER_MESSAGE, made one after another (so a large cycle -- 10,000 agents
        offered to a new framework -- reaches the broker, and offers the framework, from
        its first message on, not after the whole cycle's spans are made), each allocation
        the root of a new trace: one `allocate`
        span per allocation (spanning the cycle), its traceparent in Allocation.traceparent;
        the span lists frameworks the cycle decided on that did not get this agent."""
        if not cycle.allocations:
            return
        ended_ns = time.time_ns()
        agents: dict[str, set[str]] = {}  # framework -> agents allocated to it this cycle
        for a in cycle.allocations:
            agents.setdefault(a.framework_id, set()).add(a.agent_id)
        said = [(d.framework_id, d.outcome is Outcome.OFFERED,
                 f"{d.framework_id}: {d.outcome.name}: {d.reason}") for d in cycle.remade]
        given_back = reclaimed(cycle)
        limit = getattr(self.dealer, "frame_limit", codec.DEFAULT_FRAME_LIMIT) - codec.FRAME_MARGIN
        msg, size, count = internal_pb2.InternalMessage(), 0, 0
        for a in cycle.allocations:
            skipped = list(itertools.islice(
                (text for fid, offered, text in said if fid != a.framework_id and (
                    not offered or a.agent_id not in agents.get(fid, ()))), MAX_SKIPPED))
            span = tracer.start_span(spans.ALLOCATE, start_time=started_ns, attributes={
                spans.ALLOCATION_ID: a.allocation_id, spans.FRAMEWORK_ID: a.framework_id,
                spans.AGENT_ID: a.agent_id, spans.ROLE: a.role,
                spans.RESOURCES: str(a.resources), spans.DOMINANT_SHARE: a.dominant_share,
                spans.DOMINANT_RESOURCE: a.dominant_resource, spans.WEIGHT: a.weight,
                spans.CYCLE: a.cycle, spans.SKIPPED: skipped, **less(a, given_back)})
            span.end(end_time=ended_ns)
            proto = a.to_proto()
            proto.traceparent = span_traceparent(span)
            n = proto.ByteSize() + 8  # its tag and length
            if size and (size + n > limit or count >= ALLOCATIONS_PER_MESSAGE):
                yield msg
                msg, size, count = internal_pb2.InternalMessage(), 0, 0
            msg.allocations.allocations.append(proto)
            size += n
            count += 1
        yield msg

    def _reclaim(self, cycle: Cycle) -> None:
        """Fair share: offers to rescind (to the broker) and revocations (through the
        broker to the master), as the core planned them."""
        if cycle.reclaims:
            self._send(cycle.reclaims_message())
            self.stats.inc("reclaims", len(cycle.reclaims))
            for r in cycle.reclaims:
                log.info("reclaiming offers", framework=r.framework_id, agent=r.agent_id,
                         for_framework=r.for_framework_id)
        for rv in cycle.revocations:
            self._send(rv.to_message())
            self.stats.inc("revocations")
            log.info("revoking", framework=rv.framework_id, agent=rv.agent_id,
                     resources=str(rv.resources), grace_s=rv.grace_s,
                     for_framework=rv.for_framework_id)

    def _tell_decisions(self, cycle: Cycle) -> None:
        """Decisions that changed go to the master (through the broker), which publishes
        them on the state stream for `offerbus why`; /decisions serves all of them. Those
        the cycle re-made, or every standing one when the master knows none (a new master
        or broker link cleared what it was told)."""
        made = cycle.remade if self._told else self.decisions.values()
        changed = [d for d in made
                   if self._told.get(d.framework_id) != (d.outcome.value, d.reason)]
        if not changed:
            return
        msg = internal_pb2.InternalMessage()
        msg.allocator_decisions.decisions.extend(d.to_proto() for d in changed)
        self._send(msg)
        self._told.update((d.framework_id, (d.outcome.value, d.reason)) for d in changed)
        for gone in self._told.keys() - self.decisions.keys():
            del self._told[gone]

    def _wake_for_filters(self, core: AllocatorCore, now: float) -> None:
        """Filtered resources are offered again as their filter ends, not a sweep later."""
        ends = core.next_deadline(now)
        if self._refilter is not None:
            self._refilter.cancel()
            self._refilter = None
        if ends is not None and ends - now < self.config.interval and not self.paused:
            self._refilter = self.reactor.call_later(ends - now + 0.001, self._allocate)

    def _account(self, cycle: Cycle, now: float) -> None:
        self.stats.inc("allocations", len(cycle.allocations))
        self.last_cycle = (cycle.cycle, now)
        for d in cycle.remade:
            self.stats.inc(f"decisions{{outcome={d.outcome.name.lower()}}}")
        if self.core is not None:
            self.decisions = self.core.decisions  # the standing one per framework

    # -- outbound ------------------------------------------------------------------------
    def _send(self, msg: internal_pb2.InternalMessage) -> None:
        if self.dealer is None or self.paused:
            return
        env = codec.Envelope()
        env.internal.CopyFrom(msg)
        if not self.dealer.send(env):
            log.warning("send to broker failed", kind=msg.WhichOneof("kind"))

    def _log_anomalies(self) -> None:
        if self.feed is None or not self.feed.notices:
            return
        notices, self.feed.notices = self.feed.notices, []
        self.driver.dispatch(notices)

    # -- HTTP and metrics ----------------------------------------------------------------
    def health(self) -> dict[str, Any]:
        return {"master": _who(self.master), "broker": _who(self.broker),
                "synced": self.subscriber is not None and self.subscriber.synced,
                "broker_connected": self.dealer is not None and self.dealer.connected}

    def _epoch(self) -> int | None:
        return self.leader.epoch if self.leader is not None else None

    def _http_decisions(self, query: dict[str, list[str]]) -> Response:
        """The standing decision per framework (`?framework=ID` for one)."""
        wanted = set(query.get("framework", ()))
        msg = internal_pb2.InternalMessage.AllocatorDecisions(decisions=[
            d.to_proto() for fid, d in sorted(self.decisions.items())
            if not wanted or fid in wanted])
        body = {"leading": self.core is not None, "epoch": self._epoch(),
                "cycle": self.last_cycle[0], "decided_at": self.last_cycle[1],
                "decisions": MessageToDict(msg, preserving_proto_field_name=True)
                .get("decisions", [])}
        return json_response(json.dumps(body, sort_keys=True).encode())

    def _http_roles(self, query: dict[str, list[str]]) -> Response:
        """Each role's weight, frameworks and shares (`offerbus roles`)."""
        body = {"leading": self.core is not None, "epoch": self._epoch(),
                "roles": roles_view(self.core) if self.core is not None else []}
        return Response(200 if self.core is not None else 503, "application/json",
                        json.dumps(body, sort_keys=True).encode())

    def _register_metrics(self) -> None:
        m = self.metrics
        self._cycle_seconds = m.histogram(
            "cycle_seconds", "Time one allocation cycle takes (the core's allocate()).")
        m.labelled_gauge("frameworks_by_outcome", "Frameworks by the outcome of the latest "
                         "allocation cycle.", "outcome", lambda: {
                             o: float(n) for o, n in Counter(
                                 d.outcome.name.lower() for d in self.decisions.values()
                             ).items()} if self.core is not None else {})
        m.gauge("agents", "Agents the leading allocator allocates.",
                value=lambda: float(len(self.core.agents)) if self.core else 0.0)
        m.gauge("frameworks", "Frameworks the leading allocator knows.",
                value=lambda: float(len(self.core.frameworks)) if self.core else 0.0)
        m.gauge("offered_allocations", "Allocations offered and not yet answered.",
                value=lambda: float(sum(len(a.offered) for a in self.core.agents.values()))
                if self.core else 0.0)
        m.gauge("tasks_waiting", "Tasks on the state stream not yet counted as used.",
                value=lambda: float(len(self.feed.waiting)) if self.feed else 0.0)

    # -- lifecycle -----------------------------------------------------------------------
    def close(self, linger_ms: int = 0) -> None:
        self._step_down("shutting down")

        def close_detectors() -> None:
            for detector in (self.masters, self.brokers):
                self.reactor.remove_reader(detector)
                detector.close()

        self.on_close(close_detectors)
        super().close(linger_ms)


def reclaimed(cycle: Cycle) -> dict[str, list[str]]:
    """framework -> what this cycle takes back from it for frameworks below their share."""
    out: dict[str, list[str]] = {}
    for r in cycle.reclaims:
        out.setdefault(r.framework_id, []).append(
            f"{r.agent_id}: offers reclaimed for {r.for_framework_id}")
    for v in cycle.revocations:
        out.setdefault(v.framework_id, []).append(
            f"{v.agent_id}: {v.resources} revoked for {v.for_framework_id}")
    return out


def less(a: Allocation, given_back: dict[str, list[str]]
         ) -> dict[str, str | bool | list[str]]:
    """The allocate span's attributes saying why it got less than the agent had free (and
    whether what it got is revocable)."""
    out: dict[str, str | bool | list[str]] = {}
    if a.revocable:
        out[spans.REVOCABLE] = True
    if a.fair_share_cut:
        out[spans.FAIR_SHARE_CUT] = str(a.fair_share_cut)
    if a.reserved_elsewhere:
        out[spans.RESERVED_ELSEWHERE] = str(a.reserved_elsewhere)
    if a.framework_id in given_back:
        out[spans.FAIR_SHARE_RECLAIMED] = given_back[a.framework_id]
    return out


def _who(leader: LeaderInfo | None) -> str:
    return "-" if leader is None else f"{leader.member_id}@{leader.epoch}"
