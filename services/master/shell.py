"""The master's shell: the front ROUTER (agents, frameworks, operators), the internal ROUTER
(offer-broker, allocator), the state stream, leader election, the registry and /state,
/metrics, /health. It decodes, calls the pure MasterCore, and carries out its commands."""

from __future__ import annotations

import uuid
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from typing import Any

from opentelemetry import trace
from opentelemetry.trace import Span, Status, StatusCode

from schemas import bus_pb2, common_pb2, internal_pb2, scheduler_pb2
from services import tasks
from services.bus import codec
from services.bus.election import detector_from_url
from services.bus.epoch import EpochFence
from services.bus.log import get_logger
from services.bus.mailbox import Mailbox
from services.bus.peer import RouterServer
from services.bus.reactor import Reactor
from services.bus.statestream import StatePublisher
from services.master import dashboard
from services.master.acl import Acl
from services.master.commands import (
    PersistRegistry,
    Publish,
    Reject,
    ToAgent,
    ToBroker,
    ToFramework,
    ToOperator,
)
from services.master.core import MasterCore
from services.master.follow import Follower
from services.master.heard import LivenessReporter, report_interval
from services.master.liveness import AGENT_GONE_TIMEOUT_S, AGENT_TIMEOUT_S, MAX_GONE_AGENTS
from services.master.outbox import UpdateOutbox
from services.master.registry import (
    Fenced,
    Loaded,
    RegistryEvent,
    RegistryWriter,
    StaleEpoch,
    registry_from_url,
)
from services.master.revocation import Revocations
from services.master.view import BadQuery, StateView
from services.shell.http import Direct, Response
from services.shell.metrics import CONTENT_TYPE
from services.shell.service import ServiceConfig, ServiceKit
from services.telemetry import extract, span_traceparent, spans

log = get_logger("master")
# A proxy until services.telemetry.setup() installs the provider (see the allocator).
tracer = trace.get_tracer("offerbus.master")
TRACED_STATES = tasks.TERMINAL | {tasks.RUNNING}  # status spans: not every update
RECONCILIATION = common_pb2.TaskStatus.Reason.REASON_RECONCILIATION

Role = codec.Role
FRONT_PAYLOADS = frozenset({"agent_call", "scheduler_call", "operator_call"})
INTERNAL_ROLE_NAMES: dict[int, str] = {Role.Value("ROLE_BROKER"): "broker",
                                        Role.Value("ROLE_ALLOCATOR"): "allocator"}
INTERNAL_ROLES = frozenset(INTERNAL_ROLE_NAMES)
MAX_TIMED_LAUNCHES = 100_000  # launches awaiting RUNNING for the latency histogram
REGISTRY_LOAD_WAIT_S = 0.5  # the most a registry load at leadership holds the reactor


@dataclass
class MasterConfig(ServiceConfig):
    master_id: str
    election_url: str  # zk://hosts/chroot or file:///run_dir
    registry_url: str  # zk://hosts/chroot or file:///run_dir
    front_port: int = 0
    internal_port: int = 0
    pub_port: int = 0
    snapshot_port: int = 0
    agent_reregister_window_s: float = 60.0
    agent_timeout_s: float = AGENT_TIMEOUT_S
    agent_gone_timeout_s: float = AGENT_GONE_TIMEOUT_S
    max_gone_agents: int = MAX_GONE_AGENTS
    acl_file: str = ""  # principals -> roles and operator actions (acl.py); needs CURVE


class MasterShell(ServiceKit):
    def __init__(self, config: MasterConfig, reactor: Reactor | None = None) -> None:
        super().__init__("master", config.master_id, Role.Value("ROLE_MASTER"), config, reactor)
        self.config = config
        self.acl = Acl.load(config.acl_file) if config.acl_file else None
        if self.acl is not None and not self.curve.on:
            raise ValueError("acl_file needs CURVE (curve_secret_key_file, curve_allowed_dir): "
                             "principals are the names of the keys the master admits")
        tcp = f"tcp://{config.host}"
        self.front = RouterServer(
            self.reactor, self.ctx, f"{tcp}:{config.front_port or '*'}", self.sender,
            self._on_front, on_peer_gone=self._on_peer_gone, heartbeat=self.beat,
            stats=self.stats, curve=self.curve.server, name="front")
        # The internal port acts only on the elected broker and allocator, at their epochs,
        # as this master's own detectors of those roles know them (services/bus/epoch.py).
        self.internal_fence = EpochFence(INTERNAL_ROLES)
        self.internal = RouterServer(
            self.reactor, self.ctx, f"{tcp}:{config.internal_port or '*'}", self.sender,
            self._on_internal, on_peer_gone=self._on_peer_gone, heartbeat=self.beat,
            stats=self.stats, fence=self.internal_fence, curve=self.curve.server,
            name="internal")
        # Who leads the allocator's and the broker's roles, shown in /state ("leaders").
        self._service_leaders: dict[str, dict[str, Any] | None] = {
            name: None for name in INTERNAL_ROLE_NAMES.values()}
        self.detectors = {role: detector_from_url(config.election_url, name)
                          for role, name in INTERNAL_ROLE_NAMES.items()}
        for role, detector in self.detectors.items():
            self.reactor.add_reader(detector, partial(self._on_detector, role))
            detector.start()
        # While a standby: the leading master's task records, for this master's core once
        # elected (follow.py).
        try:  # with CURVE, following needs this master's client keys too
            follow_curve, follow_off = self.curve.client, ""
        except ValueError as exc:
            follow_curve, follow_off = None, str(exc)
        self.follower = Follower(
            self.reactor, self.ctx, self.sender, config.election_url, config.master_id,
            lambda: self.core is not None, heartbeat_interval=config.heartbeat_interval,
            max_missed=config.max_missed, stats=self.stats, curve=follow_curve,
            off=follow_off)
        self.publisher = StatePublisher(
            self.reactor, self.ctx, self.sender, pub_bind=f"{tcp}:{config.pub_port or '*'}",
            snapshot_bind=f"{tcp}:{config.snapshot_port or '*'}", epoch=0,
            heartbeat_interval=config.heartbeat_interval, stats=self.stats,
            curve=self.curve.server)
        self.publisher.deactivate()
        self.endpoints.update({
            "front": self.front.endpoint, "internal": self.internal.endpoint,
            "pub": self.publisher.pub_endpoint, "snapshot": self.publisher.snapshot_endpoint})
        # /state and /metrics run on the HTTP threads, from a view the reactor only feeds.
        self.view = StateView(config.master_id, lambda: self.publisher.store.values())
        self.start_http({"/state": Direct(self._http_state, self.view.wait_handover),
                         "/metrics": Direct(self._http_metrics),
                         "/state/events": dashboard.state_events(self.view), **dashboard.ROUTES})
        # Registry I/O runs on the writer's thread; its results come back through a mailbox.
        self._registry_events: Mailbox[RegistryEvent] = Mailbox()
        self.reactor.add_reader(self._registry_events, self._on_registry_events)
        self.registry = RegistryWriter(registry_from_url(config.registry_url),
                                       self._registry_events.put)
        self.core: MasterCore | None = None
        self.liveness = LivenessReporter(self.reactor, self.front, self.driver,
                                         lambda: self.core,
                                         report_interval(config.heartbeat_interval),
                                         self.metrics)
        self._broker: tuple[bytes, int] | None = None  # the broker's peer and epoch
        self._pending_publish: list[bus_pb2.StateEntry] = []
        self._staged: dict[tuple[str, str], float] = {}  # launch sent -> RUNNING, for latency
        self._status_spans = spans.StatusSpans()  # status spans, each update once
        self._updates_out = UpdateOutbox()  # updates to frameworks, sent once per turn
        self._revocations_before = Revocations()  # the counts of earlier reigns' cores
        self._held_back_before = 0  # tasks_held_back of earlier reigns' cores
        self._whole_before = 0  # reports_taken_whole of earlier reigns' cores
        self._register_metrics()
        self._register_handlers()
        self.reactor.on_idle(self._flush)
        self.join_election(config.election_url, lead=self._lead, pause=self._pause,
                           resume=self._resume, step_down=self._step_down)
        log.info("master started", id=config.master_id, **self.endpoints)

    # -- leadership ----------------------------------------------------------------------
    def _lead(self, epoch: int) -> None:
        self._broker = None
        self._pending_publish.clear()  # nothing of an earlier reign is published in this one
        self._updates_out.clear()
        # The load runs on the writer's thread. It takes milliseconds, so the reign begins
        # here (no moment when this leader has no state to serve); a slow one (ZooKeeper
        # struggling) holds the reactor at most REGISTRY_LOAD_WAIT_S, then the reign begins
        # when it is loaded (_on_registry_events) and calls are refused as "not leading".
        self.registry.load(epoch)
        loaded = self.registry.wait_loaded(epoch, REGISTRY_LOAD_WAIT_S)
        if loaded is not None:
            self._begin_reign(epoch, loaded.document)
        else:
            log.warning("registry not loaded yet; leading once it is", epoch=epoch,
                        waited_s=REGISTRY_LOAD_WAIT_S)

    def _begin_reign(self, epoch: int, recovered: dict[str, Any] | None) -> None:
        # Randomness lives here, not in the core: a fresh cluster id (kept only when the
        # registry has none) and an id prefix unique to this leadership.
        self._end_core()
        followed, base = self.follower.take()
        self.core = MasterCore(
            self.config.master_id, epoch,
            agent_reregister_window_s=self.config.agent_reregister_window_s,
            heartbeat_interval_ms=int(self.config.heartbeat_interval * 1000),
            recovered_registry=recovered, followed=followed,
            cluster_id=uuid.uuid4().hex,
            id_prefix=f"{uuid.uuid4().hex[:8]}-{epoch}",
            agent_timeout_s=self.config.agent_timeout_s,
            agent_gone_timeout_s=self.config.agent_gone_timeout_s,
            max_gone_agents=self.config.max_gone_agents, acl=self.acl,
            now=self.driver.now())
        entries = self.core.snapshot_entries()
        self.publisher.restart(epoch, entries, base)
        self.view.lead(entries, epoch=epoch, paused=False, cluster_id=self.core.cluster_id,
                       leaders=dict(self._service_leaders))
        self.driver.attach(self.core)
        log.info("leading", epoch=epoch, cluster_id=self.core.cluster_id,
                 followed=len(followed),
                 recovered_agents=len((recovered or {}).get("agents", {})),
                 recovered_frameworks=len((recovered or {}).get("frameworks", {})))

    def _end_core(self) -> None:
        """The reign's core goes: what it counted stays in the counters."""
        if self.core is not None:
            self._held_back_before += self.core.tasks_held_back
            self._whole_before += self.core.reports_taken_whole
            done, before = self.core.revocations, self._revocations_before
            before.requested += done.requested
            before.ignored += done.ignored
            before.tasks_revoked += done.tasks_revoked
        self.core = None

    def _revocation_counts(self) -> Revocations:
        """On an HTTP thread: the counts of every reign so far (ints, read as they are)."""
        core, before = self.core, self._revocations_before
        now = core.revocations if core is not None else Revocations()
        return Revocations(requested=before.requested + now.requested,
                           ignored=before.ignored + now.ignored,
                           tasks_revoked=before.tasks_revoked + now.tasks_revoked)

    def _pause(self, reason: str) -> None:
        """Act on nothing (calls are held, no timer fires, the stream neither beats nor
        serves snapshots) and keep everything: the same reign may resume."""
        self.driver.detach()
        self.publisher.pause()
        self.view.set_meta(paused=True)

    def _resume(self, epoch: int) -> None:
        """The same reign goes on: the same core, the stream from its sequence number; the
        lifecycle then runs the calls held meanwhile, in order."""
        if self.core is None:  # paused before the registry was loaded: the load begins it
            return
        self.driver.attach(self.core)
        self.publisher.resume()
        self.view.set_meta(paused=False)
        log.info("resumed", epoch=epoch, held_publish=len(self._pending_publish))

    def _step_down(self, reason: str) -> None:
        self.driver.detach()
        self._end_core()
        self._pending_publish.clear()
        self._updates_out.clear()  # a deposed leader sends nothing
        self._staged.clear()
        self.publisher.deactivate()
        self.view.step_down()
        self.follower.follow()

    def _on_detector(self, role: int) -> None:
        """Who leads the broker's or the allocator's role: the one the internal port admits."""
        for event in self.detectors[role].events():
            self.internal_fence.follow(role, event.leader)
            name = INTERNAL_ROLE_NAMES[role]
            self._service_leaders[name] = {  # http: where `offerbus trace` asks its spans
                "id": event.leader.member_id, "epoch": event.leader.epoch,
                "http": event.leader.endpoints.get("http", "")} if event.leader else None
            self.view.set_meta(leaders=dict(self._service_leaders))
            log.info("internal leader", role=INTERNAL_ROLE_NAMES[role],
                     leader=f"{event.leader.member_id}@{event.leader.epoch}"
                     if event.leader else "-")

    # -- inbound -------------------------------------------------------------------------
    def _on_front(self, peer: bytes, env: codec.Envelope) -> None:
        kind = codec.payload_kind(env)
        if kind == "error":  # answering it could only ping-pong between the two peers
            self.stats.inc("peer_errors")
            log.warning("peer error", sender=env.sender_id, code=env.error.code,
                        message=env.error.message, in_reply_to=env.in_reply_to)
            return
        if kind not in FRONT_PAYLOADS:
            self._reject(self.front, peer, bus_pb2.UNEXPECTED,
                         f"the master's front takes agent, scheduler and operator calls, "
                         f"not {kind}", env.message_id)
            return
        if self._held(self.front, peer, env, lambda: self._on_front(peer, env)):
            return
        core = self._core_or_reject(self.front, peer, env)
        if core is None:
            return
        tp = env.traceparent  # the handlers read it as driver.context, for this step only
        if kind == "agent_call":
            self.driver.step(lambda now: core.agent_call(
                peer, env.agent_call, now, principal=self.front.principal(peer)), tp)
        elif kind == "scheduler_call":
            self.driver.step(lambda now: core.scheduler_call(
                peer, env.scheduler_call, env.message_id, now,
                principal=self.front.principal(peer)), tp)
        else:
            self.driver.step(lambda now: core.operator_call(
                peer, env.operator_call, env.message_id, now,
                principal=self.front.principal(peer)), tp)

    def _on_internal(self, peer: bytes, env: codec.Envelope) -> None:
        if env.sender_role not in INTERNAL_ROLES or codec.payload_kind(env) != "internal":
            self._reject(self.internal, peer, bus_pb2.UNEXPECTED,
                         "the internal endpoint is for the offer-broker and allocator",
                         env.message_id)
            return
        if self._held(self.internal, peer, env, lambda: self._on_internal(peer, env)):
            return
        core = self._core_or_reject(self.internal, peer, env)
        if core is None:
            return
        tp = env.traceparent
        if env.sender_role == Role.Value("ROLE_BROKER") and self._broker != (peer, env.epoch):
            # A new broker (or the same one on a new connection): offers relayed from an
            # older broker epoch are rescinded to their frameworks.
            self._broker = (peer, env.epoch)
            self.driver.step(lambda now: core.broker_connected(
                peer, offer_prefix=str(env.epoch), now=now), tp)
        span: Span | None = None
        if env.internal.WhichOneof("kind") == "launch_request":
            # The launch continues the broker's validate span; the core records the launch
            # span's traceparent on the tasks and hands it to the agent with each task.
            span = self._launch_span(env.internal.launch_request, tp)
            tp = span_traceparent(span)
        cmds = self.driver.step(
            lambda now: core.internal_message(peer, env.internal, now, tp), tp)
        if span is not None:
            self._end_launch(span, cmds)

    def _launch_span(self, req: internal_pb2.InternalMessage.LaunchRequest,
                     traceparent: str) -> Span:
        return tracer.start_span(spans.LAUNCH, context=extract(traceparent), attributes={
            spans.FRAMEWORK_ID: req.framework_id, spans.AGENT_ID: req.agent_id,
            spans.OFFER_IDS: list(req.offer_ids),
            spans.TASK_IDS: [t.task_id for op in req.operations
                             if op.WhichOneof("operation") == "launch"
                             for t in op.launch.tasks]})

    def _end_launch(self, span: Span, cmds: list[object]) -> None:
        result = next((c.message.launch_result for c in cmds if isinstance(c, ToBroker)
                       and c.message.WhichOneof("kind") == "launch_result"), None)
        if result is not None and not result.accepted:
            span.set_attributes({
                spans.VALID: False,
                spans.FAILED_CHECK: common_pb2.RejectReason.Name(result.reason)
                .removeprefix("REJECT_REASON_").lower(),
                spans.REASON: result.message})
            span.set_status(Status(StatusCode.ERROR, result.message))
        else:
            span.set_attribute(spans.VALID, result is not None)
        span.end()

    def _trace_updates(self, framework_id: str, update: scheduler_pb2.SchedulerEvent.Update,
                       ) -> None:
        """`status` spans for the RUNNING and terminal updates forwarded, linked to the
        trace that launched each task (TaskRecord.traceparent): spans.status_spans."""
        core = self.core
        traced = [st for st in update.statuses
                  if st.state in TRACED_STATES and st.reason != RECONCILIATION]
        if traced:
            self._status_spans.trace(tracer, framework_id, traced, lambda tid: (
                t.traceparent if core is not None and (t := core.tasks.get(
                    (framework_id, tid))) is not None else None))

    def _held(self, server: RouterServer, peer: bytes, env: codec.Envelope,
              again: Callable[[], None]) -> bool:
        """While the reign is paused: the call waits for it to resume (True), or is refused
        NOT_LEADER when too many wait already."""
        if not self.paused:
            return False
        if not self.held_while_paused(again):
            self.stats.inc("calls_refused{reason=paused}")
            self._reject(server, peer, bus_pb2.NOT_LEADER,
                         f"master {self.config.master_id} is paused (its ZooKeeper session "
                         "is in doubt); retry", env.message_id)
        return True

    def _core_or_reject(self, server: RouterServer, peer: bytes,
                        env: codec.Envelope) -> MasterCore | None:
        if self.core is None:
            self.stats.inc("calls_refused{reason=not_leader}")
            self._reject(server, peer, bus_pb2.NOT_LEADER,
                         f"master {self.config.master_id} is not leading", env.message_id)
        return self.core

    def _on_peer_gone(self, peer: bytes) -> None:
        if self.paused:
            if not self.held_while_paused(lambda: self._on_peer_gone(peer)):
                log.error("peer gone while paused, and too many calls held: not told to "
                          "the core", peer=peer)
            return
        core = self.core
        if core is not None:
            self.driver.step(lambda now: core.peer_gone(peer, now))

    # -- outbound: the core's commands, by type ------------------------------------------
    def _register_handlers(self) -> None:
        on = self.driver.on
        on(ToAgent, self._to_agent)
        on(ToFramework, self._to_framework)
        on(ToBroker, self._to_broker)
        on(ToOperator, self._to_operator)
        on(Reject, lambda c: self._reject(self.internal if c.channel == "internal"
                                          else self.front, c.peer, c.code, c.message,
                                          c.in_reply_to))
        on(Publish, lambda c: self._pending_publish.extend(c.entries))
        on(PersistRegistry, lambda c: self._persist(c.change))

    def _to_agent(self, cmd: ToAgent) -> None:
        if cmd.event.WhichOneof("event") == "run_tasks":
            launches = cmd.event.run_tasks.launches
            log.info("launching", agent=cmd.agent_id, count=len(launches),
                     framework=launches[0].framework_id if launches else "")
            now = self.driver.now()
            for launch in launches:
                if len(self._staged) < MAX_TIMED_LAUNCHES:
                    self._staged[(launch.framework_id, launch.task.task_id)] = now
        env = codec.Envelope(traceparent=cmd.traceparent or self.driver.context)
        env.agent_event.CopyFrom(cmd.event)
        self._send(self.front, cmd.peer, env)

    def _to_framework(self, cmd: ToFramework) -> None:
        kind = cmd.event.WhichOneof("event")
        tp = cmd.traceparent or self.driver.context
        if kind == "offers" and not tp and cmd.event.offers.offers:
            tp = cmd.event.offers.offers[0].traceparent  # each offer keeps its own
        elif kind == "update":
            self._trace_updates(cmd.framework_id, cmd.event.update)
            self._time_launches(cmd.framework_id, cmd.event.update)
            self._send_framework(self._updates_out.add(cmd.peer, cmd.framework_id,
                                                       cmd.event.update, tp))
            return
        self._send_framework(self._updates_out.take(cmd.peer))  # what it was told first
        self._send_framework([(cmd.peer, cmd.framework_id, cmd.event, tp)])

    def _send_framework(self, events: list[tuple[bytes, str, scheduler_pb2.SchedulerEvent, str]],
                        ) -> None:
        for peer, _, event, tp in events:
            env = codec.Envelope(traceparent=tp)
            env.scheduler_event.CopyFrom(event)
            self._send(self.front, peer, env)

    def _to_broker(self, cmd: ToBroker) -> None:
        if not cmd.peer:
            self.stats.inc("frames_unsent{reason=no_broker}")
            return
        env = codec.Envelope(traceparent=cmd.traceparent or self.driver.context)
        env.internal.CopyFrom(cmd.message)
        self._send(self.internal, cmd.peer, env)

    def _to_operator(self, cmd: ToOperator) -> None:
        env = codec.Envelope(in_reply_to=cmd.in_reply_to)
        env.operator_event.CopyFrom(cmd.event)
        self._send(self.front, cmd.peer, env)

    def _time_launches(self, framework_id: str,
                       update: scheduler_pb2.SchedulerEvent.Update) -> None:
        """Launch latency: RunTasks sent to the agent until the task's first RUNNING (or its
        end, when it never ran)."""
        now = self.driver.now()
        for st in update.statuses:
            if st.state == tasks.RUNNING or tasks.is_terminal(st.state):
                sent = self._staged.pop((framework_id, st.task_id), None)
                if sent is not None:
                    self._launch_seconds.labels(
                        "running" if st.state == tasks.RUNNING else "ended").observe(now - sent)

    def _send(self, server: RouterServer, peer: bytes, env: codec.Envelope) -> None:
        if not server.send(peer, env):
            log.warning("send failed", socket=server.name, peer=peer,
                        kind=codec.payload_kind(env))

    def _reject(self, server: RouterServer, peer: bytes, code: int, message: str,
                in_reply_to: str) -> None:
        self.stats.inc(f"calls_rejected{{code={bus_pb2.ErrorCode.Name(code)}}}")  # type: ignore[arg-type]
        env = codec.error_envelope(code, message)
        env.in_reply_to = in_reply_to
        server.send(peer, env)

    def _persist(self, change: dict[str, Any]) -> None:
        try:
            self.registry.store(change, self.sender.epoch)  # returns at once
        except StaleEpoch as exc:
            self._registry_fenced(str(exc))

    def _on_registry_events(self) -> None:
        for event in self._registry_events.drain():
            leading = self.leader.epoch if self.leader is not None else None
            if isinstance(event, Loaded):
                if event.epoch == leading and self.core is None:
                    self._begin_reign(event.epoch, event.document)
                elif event.epoch != leading:
                    log.info("registry loaded for an ended leadership; ignored",
                             epoch=event.epoch, leading=leading)
            elif isinstance(event, Fenced) and event.epoch == leading:
                self._registry_fenced(f"registry written at epoch {event.stored_epoch}; "
                                      f"ours is {event.epoch}")

    def _registry_fenced(self, why: str) -> None:
        log.error("registry fenced: a newer master leads; stepping down", error=why)
        if self.leader is not None:
            self.leader.abdicate("registry fenced")  # and stand again, for a new epoch
        else:
            self._step_down("registry fenced")

    def _flush(self) -> None:
        if len(self._updates_out) and self.core is not None and not self.paused:
            self._send_framework(self._updates_out.drain())
        if self._pending_publish and self.core is not None and not self.paused:
            # One entry per key, its latest (a framework's record changes with each of its
            # agents re-registering after a failover: published once per turn, not per agent).
            entries = list({e.key: e for e in self._pending_publish}.values())
            self._pending_publish = []
            self.publisher.publish(entries)
            self.view.publish(entries)

    # -- HTTP and metrics ----------------------------------------------------------------
    def health(self) -> dict[str, Any]:
        return {"cluster_id": self.core.cluster_id if self.core is not None else None}

    def _http_state(self, query: dict[str, list[str]]) -> Response:
        """On an HTTP thread (Direct): the view's document, never the core's."""
        try:
            status, body, etag = self.view.document(query)
        except BadQuery as exc:
            return Response(400, "text/plain", f"{exc}\n".encode())
        return Response(status, "application/json", body, etag)

    def _http_metrics(self, query: dict[str, list[str]]) -> Response:
        """On an HTTP thread (Direct): the core-derived values come from the view; every
        other collector reads counters (prometheus_client's are thread-safe) or ints."""
        return Response(200, CONTENT_TYPE, self.metrics.exposition())

    def _register_metrics(self) -> None:
        m = self.metrics
        self._launch_seconds = m.histogram(
            "launch_seconds", "Launch latency: tasks sent to their agent until RUNNING (or "
            "their end, when they never ran).", ("outcome",))
        view = self.view
        m.labelled_gauge("agents", "Agents known to the leading master, by status.", "status",
                         lambda: {k: float(v) for k, v in view.counts()[1].items()})
        m.labelled_gauge("tasks", "Tasks known to the leading master, by state.", "state",
                         lambda: {k: float(v) for k, v in view.counts()[0].items()})
        m.gauge("frameworks", "Frameworks known to the leading master.",
                value=lambda: float(view.counts()[2]))
        reg = self.registry
        m.counter_function("registry_writes", "Registry documents written.",
                           lambda: float(reg.writes))
        m.counter_function("registry_failures", "Registry writes and loads that failed (each "
                           "retried).", lambda: float(reg.failures))
        m.counter_function("registry_refused", "Registry documents refused: larger than the "
                           "znode limit.", lambda: float(reg.refused))
        m.gauge("registry_pending", "Registry operations waiting or in flight.",
                value=lambda: float(reg.pending))
        counts = self._revocation_counts
        m.labelled_counter("revocations", "Revocations the allocator asked for (RevokeResources), "
                           "by outcome: requested (tasks chosen, the framework told) or ignored "
                           "(one pending, unknown framework or agent, not enough tasks there).",
                           "outcome", lambda: {"requested": float(counts().requested),
                                               "ignored": float(counts().ignored)})
        m.counter_function("tasks_revoked", "Tasks killed when a revocation's grace period "
                           "passed (TASK_KILLED, REASON_TASK_REVOKED).",
                           lambda: float(counts().tasks_revoked))
        m.gauge("followed_entries", "State entries a standby holds from the leading master's "
                "stream, for its core once elected (0 while leading).",
                value=lambda: float(self.follower.held))
        m.counter_function("tasks_held_back", "Tasks re-registered after a master failover "
                           "whose record came back as the previous leader had it (followed).",
                           lambda: float(self._held_back_before + (
                               core.tasks_held_back if (core := self.core) is not None else 0)))
        m.counter_function("reports_taken_whole", "Agent re-registrations after a master "
                           "failover whose report had the digest of the records followed: "
                           "taken back whole, the report not read task by task.",
                           lambda: float(self._whole_before + (
                               core.reports_taken_whole if (core := self.core) is not None
                               else 0)))

    # -- lifecycle -----------------------------------------------------------------------
    def close(self, linger_ms: int = 0) -> None:
        def close_detectors() -> None:
            for detector in self.detectors.values():
                self.reactor.remove_reader(detector)
                detector.close()
            self.follower.close()

        self.on_close(close_detectors)
        self.on_close(self._close_registry)
        self.on_close(self.publisher.close)
        self.on_close(self.internal.close)
        self.on_close(self.front.close)
        super().close(linger_ms)

    def _close_registry(self) -> None:
        self.registry.close()
        self.reactor.remove_reader(self._registry_events)
        self._registry_events.close()
