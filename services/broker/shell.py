"""The offer-broker's shell: leader election, a ROUTER for the allocator, a DEALER to the
leading master's internal endpoint, the master's state stream, offer expiry, and /health
/metrics. It decodes, calls the pure BrokerCore, and sends its coalesced commands.

Launches whose answer never comes. A LaunchRequest is answered by the master that got it.
If that master dies first (or the request was lost on the wire), nobody will answer; the
broker then reads the answer off the state stream, where the master that recorded the
tasks published them: once the request went to a master that no longer leads, or is older
than `--launch-timeout`, tasks present on the stream mean "launched" (their resources stay
held; the allocator counts them from the stream). A request whose tasks are still absent
`--launch-timeout` after it was sent, or after the master changed (agents re-register
within that window), counts as refused: the framework gets AcceptRejected and the
allocator the resources. Should the tasks appear even later, the master only launches on
resources the agent really has, and the allocator counts them when they do.
"""

from __future__ import annotations

import dataclasses
import json
import math
import time
from collections.abc import Sequence
from dataclasses import dataclass

import zmq
from opentelemetry import trace
from opentelemetry.trace import Span, Status, StatusCode

from schemas import common_pb2, internal_pb2, state_pb2
from services.broker.core import (
    DEFAULT_OFFER_TIMEOUT_S,
    AcceptRejected,
    Anomaly,
    BrokerCore,
    Command,
    LaunchRequest,
    OfferState,
    RecoverResources,
    Rescind,
    SendOffers,
    coalesce,
    refuse_seconds,
)
from services.bus import codec
from services.bus.election import LeaderChanged, LeaderInfo, detector_from_url
from services.bus.epoch import EpochFence
from services.bus.log import get_logger
from services.bus.peer import DealerClient, HeartbeatConfig, RouterServer, Sender
from services.bus.reactor import Reactor, Timer
from services.bus.statestream import StateSubscriber
from services.bus.stats import Stats
from services.bus.stream_core import Changed
from services.resources import Resources
from services.shell.http import Response, StatusServer, text_response
from services.shell.leader import LeaderLifecycle
from services.telemetry import extract, span_traceparent, spans

log = get_logger("broker")
# A proxy until services.telemetry.setup() installs the provider (see the allocator).
tracer = trace.get_tracer("offerbus.broker")

Role = codec.Role
MASTER = Role.Value("ROLE_MASTER")
ALLOCATOR = Role.Value("ROLE_ALLOCATOR")
REGISTERED = state_pb2.AgentRecord.Status.AGENT_STATUS_REGISTERED
Reason = internal_pb2.InternalMessage.RecoverResources.Reason
RescindReason = common_pb2.RescindReason
LINGER_S = 0.5  # how long the last rescinds may take to leave on stepping down


@dataclass
class BrokerConfig:
    broker_id: str
    election_url: str  # zk://hosts/chroot or file:///run_dir
    host: str = "127.0.0.1"
    port: int = 0  # the ROUTER the allocator connects to
    http_port: int = 0
    offer_timeout: float = DEFAULT_OFFER_TIMEOUT_S  # 0 = offers never expire
    launch_timeout: float = 60.0  # see the module docstring
    heartbeat_interval: float = 1.0
    max_missed: int = 5
    tick_interval: float = 0.25


@dataclass
class _Launch:
    """A LaunchRequest in flight, as the shell tracks it for the master's silence."""

    framework_id: str
    task_ids: tuple[str, ...]
    master_epoch: int
    deadline: float


class BrokerShell:
    def __init__(self, config: BrokerConfig, reactor: Reactor | None = None) -> None:
        self.config = config
        self.reactor = reactor or Reactor()
        self.ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
        self.stats = Stats()
        self.sender = Sender(config.broker_id, Role.Value("ROLE_BROKER"))
        self.beat = HeartbeatConfig(config.heartbeat_interval, config.max_missed)
        self.allocator_fence = EpochFence(frozenset({ALLOCATOR}))
        self.router = RouterServer(
            self.reactor, self.ctx, f"tcp://{config.host}:{config.port or '*'}", self.sender,
            self._on_allocator, heartbeat=self.beat, stats=self.stats,
            fence=self.allocator_fence, name="allocators")
        self.http = StatusServer(self.reactor, config.host, config.http_port, {
            "/health": self._http_health, "/metrics": self._http_metrics})
        self.endpoints = {"router": self.router.endpoint, "http": self.http.url}
        self.master: LeaderInfo | None = None
        self.masters = detector_from_url(config.election_url, "master")
        self.master_fence = EpochFence(frozenset({MASTER}))
        # While leading:
        self.core: BrokerCore | None = None
        self.to_master: DealerClient | None = None
        self.subscriber: StateSubscriber | None = None
        self.allocator_peer: bytes | None = None
        self.allocator_epoch = 0
        self.agents: dict[str, tuple[str, Resources | None, bytes]] = {}  # as told the core
        self.launches: dict[str, _Launch] = {}
        self._commands: list[Command] = []  # gathered over one reactor wake-up
        self._held: list[internal_pb2.Allocation] = []  # until the state stream is synced
        # Tracing: each outstanding offer's span (for its rescind and a validate without a
        # parent), and each LaunchRequest's validate span (the master's launch continues it).
        self._offer_tps: dict[str, str] = {}
        self._launch_tps: dict[str, str] = {}
        self._tick: Timer | None = None
        self.leaderships = 0
        self.reactor.on_idle(self._flush)
        self.reactor.add_reader(self.masters, self._on_master)
        self.masters.start()
        self.leader = LeaderLifecycle(self.reactor, config.election_url, "broker",
                                      config.broker_id, self.endpoints,
                                      lead=self._lead, step_down=self._step_down)
        log.info("broker started", id=config.broker_id, **self.endpoints)

    # -- leadership ----------------------------------------------------------------------
    def _lead(self, epoch: int) -> None:
        """An empty offer table with ids unique to this reign ("<epoch>-o<n>")."""
        self.sender.epoch = epoch
        self.leaderships += 1
        self.core = BrokerCore(prefix=str(epoch), offer_timeout=self.config.offer_timeout or None)
        self.allocator_peer, self.allocator_epoch = None, 0
        self.agents.clear()
        self.launches.clear()
        self._held.clear()
        self._offer_tps.clear()
        self._launch_tps.clear()
        self.to_master = DealerClient(
            self.reactor, self.ctx, self.sender, self._on_master_message,
            on_connected=self._on_master_connected, heartbeat=self.beat, stats=self.stats,
            fence=self.master_fence, name="master")
        self.subscriber = StateSubscriber(
            self.reactor, self.ctx, self.sender, self._on_state,
            heartbeat_interval=self.config.heartbeat_interval, max_missed=self.config.max_missed,
            stats=self.stats)
        self._tick = self.reactor.every(self.config.tick_interval, self._on_tick)
        self._point_at_master()
        log.info("leading", epoch=epoch)

    def _step_down(self, reason: str) -> None:
        """Rescind every offer (frameworks learn it through the master, if it still hears
        us), then drop the table. No Recovery: a new broker makes the allocator recover all."""
        rescinded = False
        if self.core is not None and self.to_master is not None and self.to_master.connected:
            self._commands += self.core.rescind_all(RescindReason.RESCIND_REASON_BROKER_FAILOVER)
            rescinded = bool(self._commands)
            self._flush()
        self._commands.clear()
        if self._tick is not None:
            self._tick.cancel()
            self._tick = None
        if self.to_master is not None:
            # Give the rescinds time to leave (a close drops what is queued); on shutdown,
            # close() lingers on the context for the same reason.
            if rescinded:
                self.reactor.call_later(LINGER_S, self.to_master.close)
            else:
                self.to_master.close()
        if self.subscriber is not None:
            self.subscriber.close()
        self.to_master = self.subscriber = None
        self.core = None
        log.info("stepped down", reason=reason)

    # -- the master ----------------------------------------------------------------------
    def _on_master(self) -> None:
        for event in self.masters.events():
            if isinstance(event, LeaderChanged):
                old, self.master = self.master, event.leader
                log.info("master leader", leader=_who(event.leader))
                if old is not None and (event.leader is None or event.leader.key() != old.key()):
                    self._orphan_launches()
                self._point_at_master()

    def _point_at_master(self) -> None:
        m = self.master
        if self.to_master is None or self.subscriber is None:
            return
        if m is None or not {"internal", "pub", "snapshot"} <= m.endpoints.keys():
            self.to_master.disconnect()
            return
        self.master_fence.observe(MASTER, m.epoch)
        self.to_master.connect(m.endpoints["internal"])
        self.subscriber.connect(m.endpoints["pub"], m.endpoints["snapshot"])

    def _on_master_connected(self) -> None:
        # The master learns its broker from a first non-heartbeat message (heartbeats stay
        # in the bus layer): an empty AllocatorDecisions, a no-op it may relay or ignore.
        msg = internal_pb2.InternalMessage(
            allocator_decisions=internal_pb2.InternalMessage.AllocatorDecisions())
        self._send_master(msg)

    def _orphan_launches(self) -> None:
        """The master that got these requests is gone: wait for the stream, or time out."""
        deadline = self.reactor.now() + self.config.launch_timeout
        for launch in self.launches.values():
            launch.deadline = max(launch.deadline, deadline)
        if self.launches:
            log.info("master changed with launches unanswered", launches=len(self.launches))

    def _on_master_message(self, env: codec.Envelope) -> None:
        core = self.core
        kind = codec.payload_kind(env)
        if kind == "error":
            self.stats.inc("master_errors")
            log.warning("master error", code=env.error.code, message=env.error.message,
                        in_reply_to=env.in_reply_to)
            return
        if core is None or kind != "internal" or env.sender_role != MASTER:
            self.stats.inc("frames_dropped{reason=unexpected}")
            return
        msg, now = env.internal, time.time()
        which = msg.WhichOneof("kind")
        if which == "framework_call":
            self._framework_call(core, msg.framework_call, now, env.traceparent)
        elif which == "launch_result":
            r = msg.launch_result
            self.launches.pop(r.request_id, None)
            self.stats.inc(f"launch_results{{accepted={str(r.accepted).lower()}}}")
            self._commands += core.launch_result(r.request_id, r.accepted, r.reason, r.message,
                                                 now)
        elif which in ("revive_offers", "suppress_offers"):
            self.stats.inc(f"relayed{{kind={which}}}")
            self._send_allocator(msg)
        else:
            self.stats.inc("frames_dropped{reason=unexpected}")

    def _framework_call(self, core: BrokerCore,
                        fc: internal_pb2.InternalMessage.FrameworkCall, now: float,
                        traceparent: str = "") -> None:
        call, fid = fc.call, fc.framework_id
        which = call.WhichOneof("call")
        if which == "accept":
            a = call.accept
            self.stats.inc("accepts")
            span = self._validate_span(fid, a.offer_ids, "accept", traceparent)
            task_ids = [t.task_id for op in a.operations
                        if op.WhichOneof("operation") == "launch" for t in op.launch.tasks]
            span.set_attribute(spans.TASK_IDS, task_ids)
            cmds = core.accept(fid, a.offer_ids, a.operations,
                               a.filters if a.HasField("filters") else None, now)
            self._commands += cmds
            self._end_validate(span, cmds, a.offer_ids)
        elif which == "decline":
            d = call.decline
            self.stats.inc("declines")
            filters = d.filters if d.HasField("filters") else None
            span = self._validate_span(fid, d.offer_ids, "decline", traceparent)
            span.set_attribute(spans.REFUSE_SECONDS, refuse_seconds(filters))
            if d.reason:
                span.set_attribute(spans.REASON, d.reason)
            cmds = core.decline(fid, d.offer_ids, filters, now, d.reason)
            self._commands += cmds
            self._end_validate(span, cmds, d.offer_ids)
        elif which in ("revive", "suppress"):  # tolerated: relayed as the internal kinds
            roles = call.revive.roles if which == "revive" else call.suppress.roles
            msg = internal_pb2.InternalMessage()
            getattr(msg, f"{which}_offers").framework_id = fid
            getattr(msg, f"{which}_offers").roles.extend(roles)
            self._send_allocator(msg)
        else:
            self.stats.inc(f"calls_ignored{{kind={which}}}")

    def _validate_span(self, framework_id: str, offer_ids: Sequence[str], decision: str,
                       traceparent: str) -> Span:
        """A framework's ACCEPT/DECLINE, under its decide span (the envelope's traceparent)
        or, when it sent none, under the first named offer's span."""
        parent = extract(traceparent) or next(
            (ctx for ctx in (extract(self._offer_tps.get(i, "")) for i in offer_ids) if ctx),
            None)
        return tracer.start_span(spans.VALIDATE, context=parent, attributes={
            spans.FRAMEWORK_ID: framework_id, spans.OFFER_IDS: list(offer_ids),
            spans.DECISION: decision})

    def _end_validate(self, span: Span, cmds: Sequence[Command],
                      offer_ids: Sequence[str]) -> None:
        rejected = next((c for c in cmds if isinstance(c, AcceptRejected)), None)
        ignored = [c.message for c in cmds
                   if isinstance(c, Anomaly) and c.kind == "decline_ignored"]
        if rejected is not None:
            span.set_attributes({
                spans.VALID: False,
                spans.FAILED_CHECK: common_pb2.RejectReason.Name(rejected.reason)  # type: ignore[arg-type]
                .removeprefix("REJECT_REASON_").lower(),
                spans.REASON: rejected.message})
            span.set_status(Status(StatusCode.ERROR, rejected.message))
        elif ignored:
            span.set_attributes({spans.VALID: False, spans.FAILED_CHECK: "offer_not_outstanding",
                                 spans.REASON: "; ".join(ignored)})
        else:
            span.set_attribute(spans.VALID, True)
        tp = span_traceparent(span)
        for c in cmds:
            if isinstance(c, LaunchRequest):
                self._launch_tps[c.request_id] = tp
        span.end()
        for oid in offer_ids:  # used up (or never ours): their spans are no longer needed
            if oid in self._offer_tps and self.core is not None and \
                    self.core.state(oid) is not OfferState.OFFERED:
                del self._offer_tps[oid]

    # -- the allocator -------------------------------------------------------------------
    def _on_allocator(self, peer: bytes, env: codec.Envelope) -> None:
        core = self.core
        if core is None:
            self.stats.inc("calls_refused{reason=not_leader}")
            reply = codec.error_envelope(codec.ErrorCode.Value("NOT_LEADER"),
                                         f"broker {self.config.broker_id} is not leading")
            reply.in_reply_to = env.message_id
            self.router.send(peer, reply)
            return
        if env.sender_role != ALLOCATOR or codec.payload_kind(env) != "internal":
            self.stats.inc("frames_dropped{reason=unexpected}")
            return
        if env.epoch > self.allocator_epoch:
            self._new_allocator(core, env.epoch)
        self.allocator_peer = peer  # the latest connection of the current allocator
        msg = env.internal
        if msg.WhichOneof("kind") == "allocations":
            if self.subscriber is None or not self.subscriber.synced:
                # Offers name the agent's hostname and attributes: wait for the stream.
                self._held.extend(msg.allocations.allocations)
            else:
                self._offer(core, msg.allocations.allocations, time.time())
        elif msg.WhichOneof("kind") == "allocator_decisions":
            self.stats.inc("decisions_relayed", len(msg.allocator_decisions.decisions))
            self._send_master(msg)  # the master publishes them for `offerbus why`
        else:
            self.stats.inc("frames_dropped{reason=unexpected}")

    def _offer(self, core: BrokerCore, allocations: Sequence[internal_pb2.Allocation],
               now: float) -> None:
        """One offer per allocation, each under an `offer` span, child of the allocation's
        span: the core keeps the offer span's traceparent as Offer.traceparent, which is what
        the framework receives."""
        if not allocations:
            self._commands += core.allocations((), now)
            return
        for a in allocations:
            span = tracer.start_span(spans.OFFER, context=extract(a.traceparent), attributes={
                spans.ALLOCATION_ID: a.allocation_id, spans.FRAMEWORK_ID: a.framework_id,
                spans.AGENT_ID: a.agent_id})
            traced = internal_pb2.Allocation()
            traced.CopyFrom(a)
            traced.traceparent = span_traceparent(span)
            cmds = core.allocations((traced,), now)
            self._commands += cmds
            made = [o for c in cmds if isinstance(c, SendOffers) for o in c.offers
                    if o.traceparent == traced.traceparent]
            if made:
                o = made[0]
                self._offer_tps[o.offer_id] = o.traceparent
                span.set_attributes({
                    spans.OFFER_ID: o.offer_id, spans.HOSTNAME: o.hostname,
                    spans.RESOURCES: str(o.resources),
                    spans.EXPIRES_AT_US: 0 if math.isinf(o.expires_at)
                    else int(o.expires_at * 1e6)})
            else:
                why = "; ".join(c.message for c in cmds if isinstance(c, Anomaly)) or \
                    "no offer made"
                span.set_attribute(spans.REASON, why)
                span.set_status(Status(StatusCode.ERROR, why))
            span.end()

    def _new_allocator(self, core: BrokerCore, epoch: int) -> None:
        """A new allocator leader counts every resource free: rescind what the old one
        allocated, without Recovery (the new one never counted it). Pending launches stay."""
        if self.allocator_epoch:
            self.stats.inc("allocator_failovers")
        self.allocator_epoch = epoch
        now = time.time()
        for fid in sorted({o.framework_id for o in core.outstanding_offers()}):
            for c in core.framework_removed(fid, now, RescindReason.RESCIND_REASON_RECLAIMED):
                if isinstance(c, Rescind):
                    self._commands.append(dataclasses.replace(
                        c, message="a new allocator leads; offers are made afresh"))
                elif not isinstance(c, RecoverResources):
                    self._commands.append(c)
        log.info("allocator epoch", epoch=epoch)

    # -- the state stream ----------------------------------------------------------------
    def _on_state(self, change: Changed) -> None:
        core = self.core
        if core is None or self.subscriber is None:
            return
        now = time.time()
        entries = list(self.subscriber.store.values()) if change.reset else change.entries
        seen_agents: set[str] = set()
        for e in entries:
            kind, _, name = e.key.partition("/")
            if kind == "agents":
                seen_agents.add(name)
                self._agent(core, name, None if e.deleted else e.value, now)
            elif kind == "frameworks":
                if e.deleted:
                    self._commands += core.framework_removed(name, now)
                elif not e.value.framework.connected:
                    self._commands += core.framework_removed(
                        name, now, RescindReason.RESCIND_REASON_FRAMEWORK_INACTIVE)
        if change.reset:  # what the new copy lacks is gone
            for agent_id in set(self.agents) - seen_agents:
                self._agent(core, agent_id, None, now)
            store = self.subscriber.store
            for fid in {o.framework_id for o in core.outstanding_offers()}:
                if f"frameworks/{fid}" not in store:
                    self._commands += core.framework_removed(fid, now)
        if self._held:
            held, self._held = self._held, []
            self._offer(core, held, now)
        if self.launches:
            self._resolve_launches(core, now, timed_out=False)

    def _agent(self, core: BrokerCore, agent_id: str, value: state_pb2.StateValue | None,
               now: float) -> None:
        rec = value.agent if value is not None and value.WhichOneof("kind") == "agent" else None
        if rec is None or rec.status != REGISTERED:
            if self.agents.pop(agent_id, None) is not None:
                self._commands += core.agent_removed(agent_id, now)
            return
        info = rec.agent_info
        try:
            total: Resources | None = Resources.from_proto(info.resources) - Resources()
        except ValueError:
            total = None
        attrs = b"".join(a.SerializeToString(deterministic=True) for a in info.attributes)
        view = (info.hostname, total, attrs)
        if self.agents.get(agent_id) != view:
            self.agents[agent_id] = view
            self._commands += core.agent_updated(agent_id, info.hostname, total, now,
                                                 info.attributes)

    def _resolve_launches(self, core: BrokerCore, now: float, timed_out: bool) -> None:
        """Answer, from the state stream, the launches the master will not answer."""
        store = self.subscriber.store if self.subscriber is not None else {}
        master_epoch = self.master.epoch if self.master is not None else 0
        mono = self.reactor.now()
        for rid, launch in list(self.launches.items()):
            silent = launch.master_epoch != master_epoch or mono >= launch.deadline
            if not silent:
                continue
            if all(f"tasks/{launch.framework_id}/{t}" in store for t in launch.task_ids):
                self.stats.inc("launches_resolved{as=launched}")
                del self.launches[rid]
                self._commands += core.launch_result(rid, True, now=now)
            elif mono >= launch.deadline and timed_out:
                self.stats.inc("launches_resolved{as=refused}")
                del self.launches[rid]
                log.warning("launch unanswered; counting it refused", request=rid)
                self._commands += core.launch_result(
                    rid, False, common_pb2.RejectReason.REJECT_REASON_AGENT_UNAVAILABLE,
                    "the master never answered the launch and its tasks never appeared",
                    now=now)

    def _on_tick(self) -> None:
        core = self.core
        if core is None:
            return
        now = time.time()
        due = core.next_expiry()
        if due is not None and due <= now:
            self._commands += core.tick(now)
        if self.launches:
            self._resolve_launches(core, now, timed_out=True)

    # -- outbound ------------------------------------------------------------------------
    def _flush(self) -> None:
        """Once per wake-up: one SendOffers per framework, one RecoverResources, ..."""
        if not self._commands:
            return
        self._trace_rescinds(self._commands)  # before coalesce hides offers never shown
        cmds, self._commands = coalesce(self._commands), []
        for cmd in cmds:
            if isinstance(cmd, Anomaly):
                self.stats.inc(f"anomalies{{kind={cmd.kind}}}")
                log.warning("anomaly", kind=cmd.kind, message=cmd.message)
                continue
            if isinstance(cmd, RecoverResources):
                self._count_recoveries(cmd)
                self._send_allocator(cmd.to_proto())
                continue
            if isinstance(cmd, SendOffers):
                self.stats.inc("offers_made", len(cmd.offers))
            elif isinstance(cmd, Rescind):
                name = RescindReason.Name(cmd.reason)  # type: ignore[arg-type]
                reason = name.removeprefix("RESCIND_REASON_").lower()
                self.stats.inc(f"offers_rescinded{{reason={reason}}}", len(cmd.offer_ids))
            elif isinstance(cmd, AcceptRejected):
                self.stats.inc("accepts_rejected")
            elif isinstance(cmd, LaunchRequest):
                self.stats.inc("offers_accepted", len(cmd.offer_ids))
                self.stats.inc("launch_requests")
                self._track_launch(cmd)
            traceparent = ""
            if isinstance(cmd, LaunchRequest):  # its validate span's (else its offer's)
                traceparent = self._launch_tps.pop(cmd.request_id, "") or next(
                    iter(cmd.traceparents), "")
            elif isinstance(cmd, SendOffers):  # each Offer carries its own as well
                traceparent = cmd.offers[0].traceparent
            self._send_master(cmd.to_proto(), traceparent)

    def _trace_rescinds(self, cmds: Sequence[Command]) -> None:
        """A `rescind` span under each rescinded (or expired) offer's span."""
        for cmd in cmds:
            if not isinstance(cmd, Rescind):
                continue
            why = RescindReason.Name(cmd.reason)  # type: ignore[arg-type]
            why = why.removeprefix("RESCIND_REASON_").lower()
            for oid in cmd.offer_ids:
                tp = self._offer_tps.pop(oid, "")
                tracer.start_span(spans.RESCIND, context=extract(tp), attributes={
                    spans.OFFER_ID: oid, spans.FRAMEWORK_ID: cmd.framework_id,
                    spans.REASON: f"{why}: {cmd.message}" if cmd.message else why}).end()

    def _track_launch(self, cmd: LaunchRequest) -> None:
        task_ids = tuple(t.task_id for op in cmd.operations
                         if op.WhichOneof("operation") == "launch" for t in op.launch.tasks)
        self.launches[cmd.request_id] = _Launch(
            cmd.framework_id, task_ids, self.master.epoch if self.master else 0,
            self.reactor.now() + self.config.launch_timeout)

    def _count_recoveries(self, cmd: RecoverResources) -> None:
        for r in cmd.recoveries:
            if r.reason == Reason.RECOVER_REASON_DECLINED:
                self.stats.inc("offers_declined")
            elif r.reason == Reason.RECOVER_REASON_EXPIRED:
                self.stats.inc("offers_expired")

    def _send_master(self, msg: internal_pb2.InternalMessage, traceparent: str = "") -> None:
        if self.to_master is None:
            return
        env = codec.Envelope(traceparent=traceparent)
        env.internal.CopyFrom(msg)
        if not self.to_master.send(env):
            log.warning("send to master failed", kind=msg.WhichOneof("kind"))

    def _send_allocator(self, msg: internal_pb2.InternalMessage) -> None:
        if self.allocator_peer is None:
            self.stats.inc("frames_unsent{reason=no_allocator}")
            return
        env = codec.Envelope()
        env.internal.CopyFrom(msg)
        self.router.send(self.allocator_peer, env)

    # -- HTTP ----------------------------------------------------------------------------
    def _http_health(self, query: dict[str, list[str]]) -> Response:
        body = {"service": "broker", "id": self.config.broker_id,
                "leading": self.core is not None, "epoch": self.leader.epoch,
                "master": _who(self.master),
                "master_connected": self.to_master is not None and self.to_master.connected,
                "synced": self.subscriber is not None and self.subscriber.synced,
                "allocator_epoch": self.allocator_epoch, "endpoints": self.endpoints}
        return Response(200 if self.core is not None else 503, "application/json",
                        json.dumps(body).encode())

    def _http_metrics(self, query: dict[str, list[str]]) -> Response:
        p = "offerbus_broker_"
        lines = [self.stats.prometheus(p),
                 f"{p}elected {int(self.core is not None)}\n",
                 f"{p}epoch {self.leader.epoch or 0}\n",
                 f"{p}leaderships_total {self.leaderships}\n"]
        if self.core is not None:
            lines.append(f"{p}outstanding_offers {len(self.core.outstanding_offers())}\n")
            lines.append(f"{p}pending_launches {len(self.core.pending_launches)}\n")
        return text_response("".join(lines))

    # -- lifecycle -----------------------------------------------------------------------
    def run(self) -> None:
        self.reactor.run()

    def close(self) -> None:
        self._step_down("shutting down")
        self.leader.close()
        self.reactor.remove_reader(self.masters)
        self.masters.close()
        self.http.close()
        self.router.close()
        self.ctx.destroy(linger=int(LINGER_S * 1000))


def _who(leader: LeaderInfo | None) -> str:
    return "-" if leader is None else f"{leader.member_id}@{leader.epoch}"
