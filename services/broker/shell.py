"""The offer-broker's shell: leader election, a ROUTER for the allocator, a DEALER to the
leading master's internal endpoint, the master's state stream, one timer, and /health
/metrics. It decodes, feeds the pure BrokerCore with the wall-clock time (the only clock
it reads for the core), sends the core's coalesced commands, and sends each Notice to the
log, a counter and the span it has open. Every decision is the core's; the timer is
re-armed from `core.next_deadline()` after every wake-up (offer expiry, launch deadlines).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from opentelemetry.trace import Span

from schemas import common_pb2, internal_pb2
from services.broker.commands import (
    Command,
    LaunchRequest,
    RecoverResources,
    Rescind,
    SendOffers,
    coalesce,
)
from services.broker.core import DEFAULT_LAUNCH_TIMEOUT_S, DEFAULT_OFFER_TIMEOUT_S, BrokerCore
from services.broker.tracing import BrokerTraces
from services.bus import codec
from services.bus.election import LeaderChanged, LeaderInfo, detector_from_url
from services.bus.epoch import EpochFence
from services.bus.log import get_logger
from services.bus.peer import DealerClient, RouterServer
from services.bus.reactor import Reactor
from services.bus.statestream import StateSubscriber
from services.bus.stream_core import Changed
from services.notice import Notice
from services.shell.service import ServiceConfig, ServiceKit

log = get_logger("broker")

Role = codec.Role
MASTER = Role.Value("ROLE_MASTER")
ALLOCATOR = Role.Value("ROLE_ALLOCATOR")
Reason = internal_pb2.InternalMessage.RecoverResources.Reason
RescindReason = common_pb2.RescindReason
LINGER_S = 0.5  # how long the last rescinds may take to leave on stepping down
MAX_TIMED_OFFERS = 100_000  # offers awaiting an answer for the round-trip histogram


@dataclass
class BrokerConfig(ServiceConfig):
    broker_id: str
    election_url: str  # zk://hosts/chroot or file:///run_dir
    port: int = 0  # the ROUTER the allocator connects to
    offer_timeout: float = DEFAULT_OFFER_TIMEOUT_S  # 0 = offers never expire
    launch_timeout: float = DEFAULT_LAUNCH_TIMEOUT_S  # see services/broker/launches.py


class BrokerShell(ServiceKit):
    def __init__(self, config: BrokerConfig, reactor: Reactor | None = None) -> None:
        super().__init__("broker", config.broker_id, Role.Value("ROLE_BROKER"), config, reactor)
        self.config = config
        # Messages are acted on only from the elected allocator and master, at their epochs,
        # as this broker's own detectors know them (services/bus/epoch.py).
        self.allocator_fence = EpochFence(frozenset({ALLOCATOR}))
        self.allocators = detector_from_url(config.election_url, "allocator")
        self.router = RouterServer(
            self.reactor, self.ctx, f"tcp://{config.host}:{config.port or '*'}", self.sender,
            self._on_allocator, heartbeat=self.beat, stats=self.stats,
            fence=self.allocator_fence, curve=self.curve.server, name="allocators")
        self.endpoints["router"] = self.router.endpoint
        self.start_http()
        self.master: LeaderInfo | None = None
        self.masters = detector_from_url(config.election_url, "master")
        self.master_fence = EpochFence(frozenset({MASTER}))
        # While leading:
        self.core: BrokerCore | None = None
        self.to_master: DealerClient | None = None
        self._link_broken = False  # the master link missed its beats; the core hears on reconnect
        self.subscriber: StateSubscriber | None = None
        self.allocator_peer: bytes | None = None
        self._commands: list[Command] = []  # gathered over one reactor wake-up
        self._paused_reign = False  # (the lifecycle is already in standby in step_down)
        self._stream_changed_while_paused = False
        self._offered_at: dict[str, float] = {}  # offer id -> sent, for the round trip
        self.traces = BrokerTraces()
        # The driver's one timer fires core.tick(); its commands wait for the flush too.
        self.driver.on(object, lambda c: self._commands.append(c))
        self._register_metrics()
        self.reactor.on_idle(self._flush)
        self.reactor.add_reader(self.masters, self._on_master)
        self.masters.start()
        self.reactor.add_reader(self.allocators, self._on_allocator_leader)
        self.allocators.start()
        self.join_election(config.election_url, lead=self._lead, pause=self._pause,
                           resume=self._resume, step_down=self._step_down)
        log.info("broker started", id=config.broker_id, **self.endpoints)

    # -- leadership ----------------------------------------------------------------------
    def _lead(self, epoch: int) -> None:
        """An empty offer table with ids unique to this reign ("<epoch>-o<n>")."""
        self.core = BrokerCore(prefix=str(epoch), offer_timeout=self.config.offer_timeout or None,
                               launch_timeout=self.config.launch_timeout or None)
        self.allocator_peer = None
        self.traces.clear()
        self._offered_at.clear()
        self.to_master = DealerClient(
            self.reactor, self.ctx, self.sender, self._on_master_message,
            on_connected=self._on_master_connected, on_gone=self._on_master_gone,
            heartbeat=self.beat, stats=self.stats,
            fence=self.master_fence, curve=self.curve.client, name="master")
        self._link_broken = False
        self.subscriber = StateSubscriber(
            self.reactor, self.ctx, self.sender, self._on_state,
            heartbeat_interval=self.config.heartbeat_interval, max_missed=self.config.max_missed,
            stats=self.stats, fence=self.master_fence, curve=self.curve.client)
        self._step(self.core.master_changed(_epoch(self.master), self.driver.now()))
        self.driver.attach(self.core)
        self._point_at_master()
        log.info("leading", epoch=epoch)

    def _pause(self, reason: str) -> None:
        """Act on nothing and keep the offer table: calls from the master and the allocator
        are held, no timer fires (offers do not expire meanwhile), nothing is sent; the state
        stream is still followed (it is applied on resume)."""
        self.driver.detach()
        self._paused_reign = True
        self._stream_changed_while_paused = False

    def _resume(self, epoch: int) -> None:
        """The same reign goes on: catch up with the stream and the master's leader, re-arm
        the timer (offers due meanwhile expire now); the lifecycle then runs the held calls."""
        core = self.core
        assert core is not None
        now = self.driver.now()
        if self._stream_changed_while_paused and self.subscriber is not None \
                and self.subscriber.synced:
            self._step(core.stream_changed(list(self.subscriber.store.values()), now,
                                           reset=True))
        self._stream_changed_while_paused = self._paused_reign = False
        self._step(core.master_changed(_epoch(self.master), now))
        self.driver.attach(core)
        if self.to_master is not None and self.to_master.connected:
            self._on_master_connected()
        log.info("resumed", epoch=epoch)

    def _step_down(self, reason: str) -> None:
        """Rescind every offer (frameworks learn it through the master, if it still hears
        us), then drop the table. No Recovery: a new broker makes the allocator recover all.
        A paused reign sends nothing: its session expired, another broker may lead."""
        rescinded = False
        paused, self._paused_reign = self._paused_reign, False
        if self.core is not None and self.to_master is not None and self.to_master.connected \
                and not paused:
            self._step(self.core.rescind_all(RescindReason.RESCIND_REASON_BROKER_FAILOVER))
            rescinded = bool(self._commands)
            self._flush()
        self._commands.clear()
        self.core = None
        self.driver.detach()
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
        log.info("stepped down", reason=reason)

    # -- the core ------------------------------------------------------------------------
    def _step(self, cmds: Sequence[Command], span: Span | None = None) -> None:
        """One core step's output: commands wait for the flush, Notices are told now."""
        for c in cmds:
            if isinstance(c, Notice):
                self._notice(c, span)
            else:
                self._commands.append(c)

    def _notice(self, n: Notice, span: Span | None) -> None:
        """To the log and a counter (the driver), and the span open for the step."""
        self.driver.notice(n)
        self.traces.notice(n, span)

    # -- the master ----------------------------------------------------------------------
    def _on_master(self) -> None:
        for event in self.masters.events():
            if isinstance(event, LeaderChanged):
                self.master = event.leader
                self.master_fence.follow(MASTER, event.leader)
                log.info("master leader", leader=_who(event.leader))
                if self.core is not None and not self.paused:  # (resume tells a paused one)
                    self._step(self.core.master_changed(_epoch(self.master), self.driver.now()))
                self._point_at_master()

    def _point_at_master(self) -> None:
        m = self.master
        if self.to_master is None or self.subscriber is None:
            return
        if m is None or not {"internal", "pub", "snapshot"} <= m.endpoints.keys():
            self.to_master.disconnect()
            return
        self.to_master.connect(m.endpoints["internal"])
        self.subscriber.connect(m.endpoints["pub"], m.endpoints["snapshot"])

    def _on_master_gone(self) -> None:
        """The link to the master missed its beats: its socket, and what was queued on it,
        is gone. The core hears of it once the link is back (master_link_reset)."""
        self._link_broken = True

    def _on_master_connected(self) -> None:
        # The master learns its broker from a first non-heartbeat message (heartbeats stay
        # in the bus layer): an empty AllocatorDecisions, a no-op it may relay or ignore.
        # A paused reign says it on resume.
        if self.paused:
            return
        if self._link_broken and self.core is not None:
            self._link_broken = False
            self._step(self.core.master_link_reset(self.driver.now()))
        msg = internal_pb2.InternalMessage(
            allocator_decisions=internal_pb2.InternalMessage.AllocatorDecisions())
        self._send_master(msg)

    def _on_master_message(self, env: codec.Envelope) -> None:
        if self.paused:
            if not self.held_while_paused(lambda: self._on_master_message(env)):
                self.stats.inc("calls_refused{reason=paused}")
                log.warning("master message dropped: paused, too many held",
                            kind=codec.payload_kind(env))
            return
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
        msg, now = env.internal, self.driver.now()
        which = msg.WhichOneof("kind")
        if which == "framework_call":
            self._framework_call(core, msg.framework_call, now, env.traceparent)
        elif which == "launch_result":
            r = msg.launch_result
            self.stats.inc(f"launch_results{{accepted={str(r.accepted).lower()}}}")
            self._step(core.launch_result(r.request_id, r.accepted, r.reason, r.message, now))
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
        if which in ("accept", "decline"):
            self.stats.inc(f"{which}s")
            body = call.accept if which == "accept" else call.decline
            filters = body.filters if body.HasField("filters") else None
            span = self.traces.validate_span(fid, body.offer_ids, which, traceparent)
            for oid in body.offer_ids:
                sent = self._offered_at.pop(oid, None)
                if sent is not None:
                    self._round_trip.labels(which).observe(now - sent)
            decision = (core.accept(fid, call.accept.offer_ids, call.accept.operations,
                                    filters, now) if which == "accept" else
                        core.decline(fid, call.decline.offer_ids, filters, now,
                                     call.decline.reason))
            self._step(decision.commands, span)
            self.traces.end_validate(span, decision.verdict)
        elif which in ("revive", "suppress"):  # tolerated: relayed as the internal kinds
            roles = call.revive.roles if which == "revive" else call.suppress.roles
            msg = internal_pb2.InternalMessage()
            getattr(msg, f"{which}_offers").framework_id = fid
            getattr(msg, f"{which}_offers").roles.extend(roles)
            self._send_allocator(msg)
        else:
            self.stats.inc(f"calls_ignored{{kind={which}}}")

    # -- the allocator -------------------------------------------------------------------
    def _on_allocator_leader(self) -> None:
        for event in self.allocators.events():
            self.allocator_fence.follow(ALLOCATOR, event.leader)
            log.info("allocator leader", leader=_who(event.leader))

    def _on_allocator(self, peer: bytes, env: codec.Envelope) -> None:
        if self.held_while_paused(lambda: self._on_allocator(peer, env)):
            return
        core = self.core
        if core is None or self.paused:  # (paused: the hold is full)
            self.stats.inc("calls_refused{reason=not_leader}")
            reply = codec.error_envelope(codec.ErrorCode.Value("NOT_LEADER"),
                                         f"broker {self.config.broker_id} is not leading")
            reply.in_reply_to = env.message_id
            self.router.send(peer, reply)
            return
        if env.sender_role != ALLOCATOR or codec.payload_kind(env) != "internal":
            self.stats.inc("frames_dropped{reason=unexpected}")
            return
        now = self.driver.now()
        self._step(core.allocator_seen(env.epoch, now))
        self.allocator_peer = peer  # the latest connection of the current allocator
        msg = env.internal
        if msg.WhichOneof("kind") == "allocations":
            synced = self.subscriber is not None and self.subscriber.synced
            self._step(core.allocations(msg.allocations.allocations, now, synced))
        elif msg.WhichOneof("kind") == "allocator_decisions":
            self.stats.inc("decisions_relayed", len(msg.allocator_decisions.decisions))
            self._send_master(msg)  # the master publishes them for `offerbus why`
        elif msg.WhichOneof("kind") == "reclaim_offers":
            self.stats.inc("reclaims", len(msg.reclaim_offers.reclaims))
            self._step(core.reclaim_offers(msg.reclaim_offers.reclaims, now))
        elif msg.WhichOneof("kind") == "revoke_resources":
            # To the master, which picks the tasks and kills them; after the rescinds this
            # wake-up gathered (the allocator sends its reclaims first).
            self.stats.inc("relayed{kind=revoke_resources}")
            self._flush()
            self._send_master(msg, env.traceparent)
        else:
            self.stats.inc("frames_dropped{reason=unexpected}")

    # -- the state stream ----------------------------------------------------------------
    def _on_state(self, change: Changed) -> None:
        core = self.core
        if core is None or self.subscriber is None:
            return
        if self.paused:  # the subscriber's store keeps up; the core learns it on resume
            self._stream_changed_while_paused = True
            return
        entries = list(self.subscriber.store.values()) if change.reset else change.entries
        self._step(core.stream_changed(entries, self.driver.now(), reset=change.reset))

    # -- outbound ------------------------------------------------------------------------
    def _flush(self) -> None:
        """Once per wake-up: re-arm the timer, then send one SendOffers per framework, one
        RecoverResources, ..."""
        self.driver.rearm()
        if not self._commands or self.paused:
            return  # (a paused reign's commands wait for it to resume, or die with it)
        self.traces.commands(self._commands)  # before coalesce hides offers never shown
        cmds, self._commands = coalesce(self._commands), []
        undelivered: list[str] = []
        for cmd in cmds:
            if isinstance(cmd, Notice):  # _step told them already
                continue
            if isinstance(cmd, RecoverResources):
                self._count_recoveries(cmd)
                self._send_allocator(cmd.to_proto())
                continue
            traceparent = ""
            if isinstance(cmd, SendOffers):
                self.stats.inc("offers_made", len(cmd.offers))
                now = self.driver.now()
                for o in cmd.offers:
                    if len(self._offered_at) < MAX_TIMED_OFFERS:
                        self._offered_at[o.offer_id] = now
                cmd = dataclasses.replace(cmd, offers=tuple(  # each names its offer span
                    dataclasses.replace(o, traceparent=self.traces.offers.get(o.offer_id, ""))
                    for o in cmd.offers))
                traceparent = cmd.offers[0].traceparent
                limit = self.to_master.frame_limit if self.to_master is not None else 0
                for msg in cmd.to_protos(limit - codec.FRAME_MARGIN):
                    if not self._send_master(msg, traceparent):
                        undelivered += [o.offer_id for o in
                                        msg.framework_event.event.offers.offers]
                continue
            elif isinstance(cmd, Rescind):
                name = RescindReason.Name(cmd.reason)  # type: ignore[arg-type]
                reason = name.removeprefix("RESCIND_REASON_").lower()
                self.stats.inc(f"offers_rescinded{{reason={reason}}}", len(cmd.offer_ids))
                for oid in cmd.offer_ids:
                    self._offered_at.pop(oid, None)
            elif isinstance(cmd, LaunchRequest):  # continues its validate span
                self.stats.inc("offers_accepted", len(cmd.offer_ids))
                self.stats.inc("launch_requests")
                traceparent = self.traces.launches.pop(cmd.request_id, "")
            else:
                self.stats.inc("accepts_rejected")
            self._send_master(cmd.to_proto(), traceparent)
        if undelivered and self.core is not None:
            self.stats.inc("offers_undelivered", len(undelivered))
            self._step(self.core.offers_undelivered(undelivered, self.driver.now()))
            self._flush()  # their Recovery, to the allocator

    def _count_recoveries(self, cmd: RecoverResources) -> None:
        for r in cmd.recoveries:
            if r.reason == Reason.RECOVER_REASON_DECLINED:
                self.stats.inc("offers_declined")
            elif r.reason == Reason.RECOVER_REASON_EXPIRED:
                self.stats.inc("offers_expired")

    def _send_master(self, msg: internal_pb2.InternalMessage, traceparent: str = "") -> bool:
        if self.to_master is None:
            return False
        env = codec.Envelope(traceparent=traceparent)
        env.internal.CopyFrom(msg)
        if not self.to_master.send(env):
            log.warning("send to master failed", kind=msg.WhichOneof("kind"))
            return False
        return True

    def _send_allocator(self, msg: internal_pb2.InternalMessage) -> None:
        if self.allocator_peer is None:
            self.stats.inc("frames_unsent{reason=no_allocator}")
            return
        env = codec.Envelope()
        env.internal.CopyFrom(msg)
        self.router.send(self.allocator_peer, env)

    # -- HTTP and metrics ----------------------------------------------------------------
    def health(self) -> dict[str, Any]:
        return {"master": _who(self.master),
                "master_connected": self.to_master is not None and self.to_master.connected,
                "synced": self.subscriber is not None and self.subscriber.synced,
                "allocator_epoch": self.core.allocator_epoch if self.core is not None else 0}

    def _register_metrics(self) -> None:
        m = self.metrics
        self._round_trip = m.histogram(
            "offer_round_trip_seconds", "Offer round trip: an offer sent to its framework "
            "until the framework's accept or decline reaches the broker.", ("answer",))
        m.gauge("outstanding_offers", "Offers made and not yet answered, rescinded or expired.",
                value=lambda: float(len(self.core.outstanding_offers())) if self.core else 0.0)
        m.gauge("pending_launches", "Accepted launches the master has not answered yet.",
                value=lambda: float(len(self.core.pending_launches)) if self.core else 0.0)
        m.gauge("held_allocations", "Allocations held until the state stream is in sync.",
                value=lambda: float(self.core.held) if self.core else 0.0)

    # -- lifecycle -----------------------------------------------------------------------
    def close(self, linger_ms: int = int(LINGER_S * 1000)) -> None:
        self._step_down("shutting down")

        def close_sockets() -> None:
            for detector in (self.masters, self.allocators):
                self.reactor.remove_reader(detector)
                detector.close()
            self.router.close()

        self.on_close(close_sockets)
        super().close(linger_ms)


def _epoch(leader: LeaderInfo | None) -> int | None:
    return None if leader is None else leader.epoch


def _who(leader: LeaderInfo | None) -> str:
    return "-" if leader is None else f"{leader.member_id}@{leader.epoch}"
