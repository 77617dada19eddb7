"""The master's shell: the front ROUTER (agents, frameworks, operators), the internal ROUTER
(offer-broker, allocator), the state stream, leader election, the registry and /state,
/metrics, /health. It decodes, calls the pure MasterCore, and carries out its commands."""

from __future__ import annotations

import json
import time
from collections import Counter
from dataclasses import dataclass
from typing import Any

import zmq
from google.protobuf.json_format import MessageToDict
from opentelemetry import trace
from opentelemetry.trace import Link, Span, Status, StatusCode

from schemas import bus_pb2, common_pb2, internal_pb2, scheduler_pb2, state_pb2
from services import tasks
from services.bus import codec
from services.bus.epoch import EpochFence
from services.bus.log import get_logger
from services.bus.peer import HeartbeatConfig, RouterServer, Sender
from services.bus.reactor import Reactor
from services.bus.statestream import StatePublisher
from services.bus.stats import Stats
from services.master.commands import (
    Command,
    PersistRegistry,
    Publish,
    Reject,
    ToAgent,
    ToBroker,
    ToFramework,
    ToOperator,
)
from services.master.core import MasterCore
from services.master.registry import Registry, StaleEpoch, registry_from_url
from services.shell.http import Response, StatusServer, json_response, text_response
from services.shell.leader import LeaderLifecycle
from services.telemetry import extract, span_traceparent, spans

log = get_logger("master")
# A proxy until services.telemetry.setup() installs the provider (see the allocator).
tracer = trace.get_tracer("offerbus.master")
TRACED_STATES = tasks.TERMINAL | {tasks.RUNNING}  # status spans: not every update
RECONCILIATION = common_pb2.TaskStatus.Reason.REASON_RECONCILIATION

Role = codec.Role
FRONT_PAYLOADS = frozenset({"agent_call", "scheduler_call", "operator_call"})
INTERNAL_ROLES = frozenset({Role.Value("ROLE_BROKER"), Role.Value("ROLE_ALLOCATOR")})


@dataclass
class MasterConfig:
    master_id: str
    election_url: str  # zk://hosts/chroot or file:///run_dir
    registry_url: str  # zk://hosts/chroot or file:///run_dir
    host: str = "127.0.0.1"
    front_port: int = 0
    internal_port: int = 0
    pub_port: int = 0
    snapshot_port: int = 0
    http_port: int = 0
    heartbeat_interval: float = 1.0
    max_missed: int = 5
    agent_reregister_window_s: float = 60.0
    tick_interval: float = 0.25


class MasterShell:
    def __init__(self, config: MasterConfig, reactor: Reactor | None = None) -> None:
        self.config = config
        self.reactor = reactor or Reactor()
        self.ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
        self.stats = Stats()
        self.sender = Sender(config.master_id, Role.Value("ROLE_MASTER"))
        beat = HeartbeatConfig(config.heartbeat_interval, config.max_missed)
        tcp = f"tcp://{config.host}"
        self.front = RouterServer(
            self.reactor, self.ctx, f"{tcp}:{config.front_port or '*'}", self.sender,
            self._on_front, on_peer_gone=self._on_peer_gone, heartbeat=beat, stats=self.stats,
            name="front")
        self.internal = RouterServer(
            self.reactor, self.ctx, f"{tcp}:{config.internal_port or '*'}", self.sender,
            self._on_internal, on_peer_gone=self._on_peer_gone, heartbeat=beat,
            stats=self.stats, fence=EpochFence(INTERNAL_ROLES), name="internal")
        self.publisher = StatePublisher(
            self.reactor, self.ctx, self.sender, pub_bind=f"{tcp}:{config.pub_port or '*'}",
            snapshot_bind=f"{tcp}:{config.snapshot_port or '*'}", epoch=0,
            heartbeat_interval=config.heartbeat_interval, stats=self.stats)
        self.publisher.deactivate()
        self.http = StatusServer(self.reactor, config.host, config.http_port, {
            "/health": self._http_health, "/state": self._http_state,
            "/metrics": self._http_metrics})
        self.endpoints = {
            "front": self.front.endpoint, "internal": self.internal.endpoint,
            "pub": self.publisher.pub_endpoint, "snapshot": self.publisher.snapshot_endpoint,
            "http": self.http.url,
        }
        self.registry: Registry = registry_from_url(config.registry_url)
        self.core: MasterCore | None = None
        self._broker: tuple[bytes, int] | None = None  # the broker's peer and epoch
        self.failovers = 0
        self._pending_publish: list[bus_pb2.StateEntry] = []
        self.reactor.on_idle(self._flush)
        self.reactor.every(config.tick_interval, self._tick)
        self.leader = LeaderLifecycle(self.reactor, config.election_url, "master",
                                      config.master_id, self.endpoints,
                                      lead=self._lead, step_down=self._step_down)
        log.info("master started", id=config.master_id, **self.endpoints)

    # -- leadership ----------------------------------------------------------------------
    def _lead(self, epoch: int) -> None:
        self.sender.epoch = epoch
        self._broker = None
        recovered = self.registry.load()
        self.core = MasterCore(
            self.config.master_id, epoch,
            agent_reregister_window_s=self.config.agent_reregister_window_s,
            heartbeat_interval_ms=int(self.config.heartbeat_interval * 1000),
            recovered_registry=recovered, now=time.time())
        self.failovers += 1
        self.publisher.restart(epoch, self.core.snapshot_entries())
        log.info("leading", epoch=epoch,
                 recovered_agents=len((recovered or {}).get("agents", {})),
                 recovered_frameworks=len((recovered or {}).get("frameworks", {})))

    def _step_down(self, reason: str) -> None:
        self.core = None
        self._pending_publish.clear()
        self.publisher.deactivate()

    # -- inbound -------------------------------------------------------------------------
    def _on_front(self, peer: bytes, env: codec.Envelope) -> None:
        kind = codec.payload_kind(env)
        if kind not in FRONT_PAYLOADS:
            self._reject(self.front, peer, bus_pb2.UNEXPECTED,
                         f"the master's front takes agent, scheduler and operator calls, "
                         f"not {kind}", env.message_id)
            return
        core = self._core_or_reject(self.front, peer, env)
        if core is None:
            return
        now = time.time()
        if kind == "agent_call":
            cmds = core.agent_call(peer, env.agent_call, now)
        elif kind == "scheduler_call":
            cmds = core.scheduler_call(peer, env.scheduler_call, env.message_id, now)
        else:
            cmds = core.operator_call(peer, env.operator_call, env.message_id, now)
        self._run(cmds, env.traceparent)

    def _on_internal(self, peer: bytes, env: codec.Envelope) -> None:
        if env.sender_role not in INTERNAL_ROLES or codec.payload_kind(env) != "internal":
            self._reject(self.internal, peer, bus_pb2.UNEXPECTED,
                         "the internal endpoint is for the offer-broker and allocator",
                         env.message_id)
            return
        core = self._core_or_reject(self.internal, peer, env)
        if core is None:
            return
        now = time.time()
        cmds: list[Command] = []
        if env.sender_role == Role.Value("ROLE_BROKER") and self._broker != (peer, env.epoch):
            # A new broker (or the same one on a new connection): offers relayed from an
            # older broker epoch are rescinded to their frameworks.
            self._broker = (peer, env.epoch)
            cmds += core.broker_connected(peer, offer_prefix=str(env.epoch), now=now)
        traceparent = env.traceparent
        span: Span | None = None
        if env.internal.WhichOneof("kind") == "launch_request":
            # The launch continues the broker's validate span; the core records the launch
            # span's traceparent on the tasks and hands it to the agent with each task.
            span = self._launch_span(env.internal.launch_request, traceparent)
            traceparent = span_traceparent(span)
        cmds += core.internal_message(peer, env.internal, now, traceparent)
        if span is not None:
            self._end_launch(span, cmds)
        self._run(cmds, traceparent)

    def _launch_span(self, req: internal_pb2.InternalMessage.LaunchRequest,
                     traceparent: str) -> Span:
        return tracer.start_span(spans.LAUNCH, context=extract(traceparent), attributes={
            spans.FRAMEWORK_ID: req.framework_id, spans.AGENT_ID: req.agent_id,
            spans.OFFER_IDS: list(req.offer_ids),
            spans.TASK_IDS: [t.task_id for op in req.operations
                             if op.WhichOneof("operation") == "launch"
                             for t in op.launch.tasks]})

    def _end_launch(self, span: Span, cmds: list[Command]) -> None:
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
        """A `status` span per RUNNING or terminal update forwarded, linked to the trace
        that launched the task (TaskRecord.traceparent)."""
        for st in update.statuses:
            if st.state not in TRACED_STATES or st.reason == RECONCILIATION:
                continue
            task = self.core.tasks.get((framework_id, st.task_id)) if self.core else None
            ctx = extract(task.traceparent) if task is not None else None
            links = [Link(trace.get_current_span(ctx).get_span_context())] if ctx else []
            tracer.start_span(spans.STATUS, links=links, attributes={
                spans.FRAMEWORK_ID: framework_id, spans.TASK_ID: st.task_id,
                spans.AGENT_ID: st.agent_id,
                spans.TASK_STATE: common_pb2.TaskState.Name(st.state),
                spans.REASON: common_pb2.TaskStatus.Reason.Name(st.reason)
                + (f": {st.message}" if st.message else "")}).end()

    def _core_or_reject(self, server: RouterServer, peer: bytes,
                        env: codec.Envelope) -> MasterCore | None:
        if self.core is None:
            self.stats.inc("calls_refused{reason=not_leader}")
            self._reject(server, peer, bus_pb2.NOT_LEADER,
                         f"master {self.config.master_id} is not leading", env.message_id)
        return self.core

    def _on_peer_gone(self, peer: bytes) -> None:
        if self.core is not None:
            self._run(self.core.peer_gone(peer, time.time()), "")

    def _tick(self) -> None:
        if self.core is not None:
            self._run(self.core.tick(time.time()), "")

    # -- outbound ------------------------------------------------------------------------
    def _run(self, cmds: list[Command], traceparent: str) -> None:
        for cmd in cmds:
            if isinstance(cmd, ToAgent):
                if cmd.event.WhichOneof("event") == "run_tasks":
                    launches = cmd.event.run_tasks.launches
                    log.info("launching", agent=cmd.agent_id, count=len(launches),
                             framework=launches[0].framework_id if launches else "")
                env = codec.Envelope(traceparent=cmd.traceparent or traceparent)
                env.agent_event.CopyFrom(cmd.event)
                self._send(self.front, cmd.peer, env)
            elif isinstance(cmd, ToFramework):
                kind = cmd.event.WhichOneof("event")
                tp = cmd.traceparent or traceparent
                if kind == "offers" and not tp and cmd.event.offers.offers:
                    tp = cmd.event.offers.offers[0].traceparent  # each offer keeps its own
                elif kind == "update":
                    self._trace_updates(cmd.framework_id, cmd.event.update)
                env = codec.Envelope(traceparent=tp)
                env.scheduler_event.CopyFrom(cmd.event)
                self._send(self.front, cmd.peer, env)
            elif isinstance(cmd, ToBroker):
                if not cmd.peer:
                    self.stats.inc("frames_unsent{reason=no_broker}")
                    continue
                env = codec.Envelope(traceparent=cmd.traceparent or traceparent)
                env.internal.CopyFrom(cmd.message)
                self._send(self.internal, cmd.peer, env)
            elif isinstance(cmd, ToOperator):
                env = codec.Envelope(in_reply_to=cmd.in_reply_to)
                env.operator_event.CopyFrom(cmd.event)
                self._send(self.front, cmd.peer, env)
            elif isinstance(cmd, Reject):
                server = self.internal if cmd.channel == "internal" else self.front
                self._reject(server, cmd.peer, cmd.code, cmd.message, cmd.in_reply_to)
            elif isinstance(cmd, Publish):
                self._pending_publish.extend(cmd.entries)
            elif isinstance(cmd, PersistRegistry):
                self._persist(cmd.document)

    def _send(self, server: RouterServer, peer: bytes, env: codec.Envelope) -> None:
        if not server.send(peer, env):
            log.warning("send failed", socket=server.name, peer=peer.decode(errors="replace"),
                        kind=codec.payload_kind(env))

    def _reject(self, server: RouterServer, peer: bytes, code: int, message: str,
                in_reply_to: str) -> None:
        self.stats.inc(f"calls_rejected{{code={code}}}")
        env = codec.error_envelope(code, message)
        env.in_reply_to = in_reply_to
        server.send(peer, env)

    def _persist(self, document: dict[str, Any]) -> None:
        try:
            self.registry.store(document, self.sender.epoch)
        except StaleEpoch as exc:
            log.error("registry fenced: a newer master leads; stepping down", error=str(exc))
            self._step_down("registry fenced")
            self.leader.epoch = None

    def _flush(self) -> None:
        if self._pending_publish and self.core is not None:
            entries, self._pending_publish = self._pending_publish, []
            self.publisher.publish(entries)

    # -- HTTP ----------------------------------------------------------------------------
    def _http_health(self, query: dict[str, list[str]]) -> Response:
        body = {"service": "master", "id": self.config.master_id,
                "leading": self.core is not None, "epoch": self.leader.epoch,
                "endpoints": self.endpoints}
        return Response(200 if self.core is not None else 503, "application/json",
                        json.dumps(body).encode())

    def _http_state(self, query: dict[str, list[str]]) -> Response:
        if self.core is None:
            return Response(503, "application/json",
                            json.dumps({"leading": False, "id": self.config.master_id}).encode())
        state: dict[str, Any] = {"master_id": self.config.master_id, "epoch": self.leader.epoch,
                                 "agents": [], "frameworks": [], "tasks": [], "roles": []}
        for entry in self.core.snapshot_entries():
            kind = entry.value.WhichOneof("kind")
            if kind in ("agent", "framework", "task", "role"):
                record = getattr(entry.value, kind)
                state[f"{kind}s"].append(MessageToDict(record, preserving_proto_field_name=True))
        return json_response(json.dumps(state, sort_keys=True).encode())

    def _http_metrics(self, query: dict[str, list[str]]) -> Response:
        lines = [self.stats.prometheus("offerbus_master_")]
        leading = int(self.core is not None)
        lines.append(f"offerbus_master_elected {leading}\n")
        lines.append(f"offerbus_master_epoch {self.leader.epoch or 0}\n")
        lines.append(f"offerbus_master_leaderships_total {self.failovers}\n")
        if self.core is not None:
            agents: Counter[str] = Counter()
            tasks: Counter[str] = Counter()
            frameworks = 0
            for entry in self.core.snapshot_entries():
                kind = entry.value.WhichOneof("kind")
                if kind == "agent":
                    agents[state_pb2.AgentRecord.Status.Name(entry.value.agent.status)] += 1
                elif kind == "task":
                    tasks[common_pb2.TaskState.Name(entry.value.task.status.state)] += 1
                elif kind == "framework":
                    frameworks += 1
            for status, n in sorted(agents.items()):
                lines.append(f'offerbus_master_agents{{status="{status}"}} {n}\n')
            for state, n in sorted(tasks.items()):
                lines.append(f'offerbus_master_tasks{{state="{state}"}} {n}\n')
            lines.append(f"offerbus_master_frameworks {frameworks}\n")
        return text_response("".join(lines))

    # -- lifecycle -----------------------------------------------------------------------
    def run(self) -> None:
        self.reactor.run()

    def close(self) -> None:
        self.leader.close()
        self.http.close()
        self.front.close()
        self.internal.close()
        self.publisher.close()
        self.registry.close()
        self.ctx.destroy(linger=0)
