"""The scheduler driver's shell (Mesos's SchedulerDriver): finds the leading master through
the election detector, keeps one DEALER to its front ROUTER, feeds the pure core and runs
the scheduler's callbacks, all on one thread; calls from any thread arrive by mailbox."""

from __future__ import annotations

import threading
import traceback
from collections.abc import Callable, Iterable, Sequence
from typing import Any, TypeVar

import zmq
from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.sdk.trace import TracerProvider as SdkTracerProvider
from opentelemetry.trace import Link, StatusCode

from frameworks.sdk.core import Callback, Note, Output, SchedulerCore, Send, State
from frameworks.sdk.scheduler import Scheduler
from schemas import common_pb2, envelope_pb2, scheduler_pb2
from services.bus import codec
from services.bus.curve import CurveClient, client_from_env
from services.bus.election import Detector, detector_from_url, parse_url
from services.bus.epoch import EpochFence
from services.bus.liveness import Backoff
from services.bus.log import get_logger
from services.bus.mailbox import Mailbox
from services.bus.peer import DealerClient, HeartbeatConfig, Sender
from services.bus.reactor import Reactor
from services.bus.stats import Stats
from services.telemetry import extract, span_traceparent
from services.telemetry import setup as telemetry_setup
from services.telemetry import spans as sp

log = get_logger("sdk.driver")

MASTER_ROLE = "master"  # the election role whose leader we talk to
FRONT = "front"         # the leader's endpoint for agents and frameworks
_LOUD_NOTES = frozenset({"callback_failed", "master_error", "subscribe_retry", "disconnected"})

Request = Callable[[], list[Output]]
_M = TypeVar("_M", common_pb2.Operation, common_pb2.Filters, common_pb2.TaskStatus,
            common_pb2.Demand)


class _Stop:
    def __init__(self, failover: bool) -> None:
        self.failover = failover


class SchedulerDriver:
    """Runs `scheduler` against the master found at `master_url` ("zk://..." or
    "file:///run/dir"). Every call method is thread-safe and returns at once: the call is
    handed to the driver thread, which also runs every callback."""

    def __init__(
        self, scheduler: Scheduler, framework_info: common_pb2.FrameworkInfo, master_url: str,
        *, implicit_acknowledgements: bool = True, force: bool = False,
        heartbeat: HeartbeatConfig | None = None, subscribe_backoff: Backoff | None = None,
        context: zmq.Context[zmq.Socket[bytes]] | None = None, curve: CurveClient | None = None,
        teardown_linger: float = 1.0, tick_interval: float = 0.05,
    ) -> None:
        parse_url(master_url)  # a bad URL fails here, not on the driver thread
        self.scheduler = scheduler
        self.master_url = master_url
        self.heartbeat = heartbeat or HeartbeatConfig()
        self.teardown_linger = teardown_linger
        self.tick_interval = tick_interval
        self.stats = Stats()
        self._core = SchedulerCore(
            framework_info, implicit_acknowledgements=implicit_acknowledgements, force=force,
            subscribe_backoff=subscribe_backoff)
        self._context = context
        # Without one given: the keys OFFERBUS_CURVE_SECRET_KEY_FILE and
        # OFFERBUS_CURVE_SERVER_KEY_FILE name (none: no CURVE); a bad file fails here.
        self._curve = curve if curve is not None else client_from_env()
        self._mailbox: Mailbox[Request | _Stop] = Mailbox()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()
        self._running = False
        self._stopping = False
        self._done = threading.Event()
        self._linger = 0.0  # seconds zmq may spend flushing the last calls (a teardown)
        self._leader_key: tuple[str, int] | None = None
        # Built on the driver thread by run().
        self._reactor: Reactor | None = None
        self._dealer: DealerClient | None = None
        self._detector: Detector | None = None
        self._fence = EpochFence(frozenset({envelope_pb2.ROLE_MASTER}))
        self._tracer: trace.Tracer = trace.get_tracer("offerbus.framework")

    # -- state (read from any thread) --------------------------------------------------
    @property
    def framework_id(self) -> str:
        return self._core.framework_id

    @property
    def state(self) -> State:
        return self._core.state

    # -- lifecycle ---------------------------------------------------------------------
    def start(self) -> None:
        """Run the driver on its own (daemon) thread."""
        name = self._core.framework_info.name or "framework"
        thread = threading.Thread(target=self.run, name=f"scheduler-driver-{name}", daemon=True)
        self._thread = thread
        thread.start()

    def run(self) -> None:
        """Run the driver on the calling thread until stop() or a fatal error."""
        with self._lock:
            if self._running or self._done.is_set():
                raise RuntimeError("a SchedulerDriver runs once")
            self._running = True
        self._setup_tracing()
        ctx = self._context or zmq.Context()
        reactor = self._reactor = Reactor()
        dealer: DealerClient | None = None
        detector: Detector | None = None
        try:
            sender = Sender(self._core.framework_id or self._core.framework_info.name
                            or "framework", envelope_pb2.ROLE_FRAMEWORK)
            dealer = self._dealer = DealerClient(
                reactor, ctx, sender, self._on_envelope, on_connected=self._on_connected,
                on_gone=self._on_gone, heartbeat=self.heartbeat, stats=self.stats,
                fence=self._fence, curve=self._curve, name="scheduler")
            detector = self._detector = detector_from_url(self.master_url, MASTER_ROLE)
            reactor.add_reader(detector, self._on_leader)
            reactor.add_reader(self._mailbox, self._on_requests)
            reactor.every(self.tick_interval, self._on_tick)
            log.info("driver started", framework=sender.sender_id, master_url=self.master_url)
            detector.start()
            reactor.run()
        finally:
            reactor.remove_reader(self._mailbox)
            if detector is not None:
                reactor.remove_reader(detector)
                detector.close()
            if dealer is not None:
                self._close_dealer(dealer)
            if self._context is None:
                ctx.term()  # waits up to the linger for a teardown to leave
            self._mailbox.close()
            self._flush_traces()
            self._done.set()
            log.info("driver stopped", framework=self._core.framework_id, state=self.state.value)

    def _setup_tracing(self) -> None:
        """Trace with the application's SDK tracer provider if it set one; else configure
        Offerbus's own from the OTEL_* / OFFERBUS_TRACES_* environment."""
        if not isinstance(trace.get_tracer_provider(), SdkTracerProvider):
            info = self._core.framework_info
            telemetry_setup("offerbus-framework", framework=info.name,
                            framework_id=info.framework_id)
        self._tracer = trace.get_tracer("offerbus.framework")

    @staticmethod
    def _flush_traces() -> None:
        provider = trace.get_tracer_provider()
        if isinstance(provider, SdkTracerProvider):
            try:
                provider.force_flush(5000)
            except Exception as exc:  # an exporter failing must not fail the stop
                log.warning("trace flush failed", error=repr(exc))

    def stop(self, failover: bool = False) -> None:
        """Stop the driver. Without failover the framework is torn down (its tasks killed);
        with failover its tasks keep running and a new driver re-subscribes with its id."""
        self._mailbox.put(_Stop(failover))

    def join(self, timeout: float | None = None) -> bool:
        """Wait until the driver has stopped; True if it has."""
        return self._done.wait(timeout)

    # -- calls (thread-safe) -----------------------------------------------------------
    def accept(
        self, offer_ids: Sequence[str], operations: Sequence[common_pb2.Operation],
        filters: common_pb2.Filters | None = None, *, traceparent: str = "",
    ) -> None:
        """Use offers (all of one agent). An offer that is not outstanding makes the whole
        accept fail locally: accept_rejected, and a TASK_DROPPED (TASK_LOST) per task."""
        ids, ops = list(offer_ids), [_copy(op) for op in operations]
        flt = None if filters is None else _copy(filters)
        self._submit(lambda: self._core.accept(ids, ops, flt, traceparent))

    def decline(
        self, offer_ids: Sequence[str], refuse_seconds: float | None = None, reason: str = "",
        *, traceparent: str = "",
    ) -> None:
        ids = list(offer_ids)
        self._submit(lambda: self._core.decline(ids, refuse_seconds, reason, traceparent))

    def kill(self, task_id: str, agent_id: str = "", grace: float | None = None) -> None:
        self._submit(lambda: self._core.kill(task_id, agent_id, grace))

    def acknowledge(self, status: common_pb2.TaskStatus) -> None:
        """Acknowledge an update (only needed with implicit_acknowledgements=False)."""
        status = _copy(status)
        self._submit(lambda: self._core.acknowledge([status]))

    def reconcile(self, tasks: Iterable[common_pb2.TaskStatus | tuple[str, str]] = ()) -> None:
        """Ask for the latest state of these tasks (statuses or (task_id, agent_id)); none =
        every task the master knows of this framework. Answers arrive as updates."""
        pairs = [(t.task_id, t.agent_id) if isinstance(t, common_pb2.TaskStatus) else t
                 for t in tasks]
        self._submit(lambda: self._core.reconcile(pairs))

    def reconcile_known(self) -> None:
        """Reconcile every task whose latest status seen by this driver is not terminal
        (e.g. from `subscribed`, after a failover)."""
        self._submit(self._core.reconcile_known)

    def revive(self, roles: Iterable[str] = ()) -> None:
        roles = list(roles)
        self._submit(lambda: self._core.revive(roles))

    def suppress(self, roles: Iterable[str] = ()) -> None:
        roles = list(roles)
        self._submit(lambda: self._core.suppress(roles))

    def request(self, demands: Iterable[common_pb2.Demand]) -> None:
        """Declare what the framework wants (frameworks.sdk.demand builds a Demand); it
        replaces the last, and the driver sends it again after every re-subscription."""
        copies = [_copy(d) for d in demands]
        self._submit(lambda: self._core.request(copies))

    def _submit(self, request: Request) -> None:
        if self._done.is_set():
            log.warning("call after the driver stopped: dropped")
            return
        self._mailbox.put(request)

    # -- driver thread -----------------------------------------------------------------
    def _now(self) -> float:
        assert self._reactor is not None
        return self._reactor.now()

    def _on_requests(self) -> None:
        for request in self._mailbox.drain():
            if self._stopping:
                return  # calls after stop() are dropped
            if isinstance(request, _Stop):
                self._stop(request.failover)
            else:
                self._run(request())

    def _stop(self, failover: bool) -> None:
        if not failover and self._core.state is not State.ABORTED:
            sent_before = self.stats.get("frames_sent")
            self._run(self._core.teardown())
            if self.stats.get("frames_sent") > sent_before:
                self._linger = self.teardown_linger
        self._halt()

    def _halt(self) -> None:
        self._stopping = True
        if self._reactor is not None:
            self._reactor.stop()

    def _on_tick(self) -> None:
        self._run(self._core.tick(self._now()))

    def _on_leader(self) -> None:
        assert self._detector is not None and self._dealer is not None
        for event in self._detector.events():
            leader = event.leader
            # The master link acts only on this leader, at its epoch (services/bus/epoch.py).
            self._fence.follow(envelope_pb2.ROLE_MASTER, leader)
            key = None if leader is None else leader.key()
            if key == self._leader_key:
                continue
            self._leader_key = key
            endpoint = None if leader is None else leader.endpoints.get(FRONT)
            log.info("leading master", member=leader.member_id if leader else "-",
                     epoch=leader.epoch if leader else 0, endpoint=endpoint or "-")
            self._run(self._core.master_detected(
                None if leader is None else leader.member_id,
                0 if leader is None else leader.epoch, self._now()))
            if endpoint:
                self._dealer.connect(endpoint)
            else:
                if leader is not None:
                    log.error("leader has no front endpoint", member=leader.member_id)
                self._dealer.disconnect()

    def _on_connected(self) -> None:
        self._run(self._core.connected(self._now()))

    def _on_gone(self) -> None:
        self._run(self._core.disconnected(self._now(), "master missed its heartbeats"))

    def _on_envelope(self, env: codec.Envelope) -> None:
        kind = codec.payload_kind(env)
        if kind == "scheduler_event":
            self._run(self._core.on_event(env.scheduler_event, self._now()))
        elif kind == "error":
            self._run(self._core.on_error(env.error.code, env.error.message, self._now()))
        else:
            self.stats.inc(f"frames_dropped{{reason=unexpected_{kind}}}")
            log.warning("unexpected payload from the master", kind=kind)

    def _run(self, outputs: list[Output]) -> None:
        self._core.dispatch(outputs, self._invoke, self._send, self._note)
        if self._dealer is not None and self._core.framework_id:
            self._dealer.sender.sender_id = self._core.framework_id
        if self._core.state is State.ABORTED:
            self._halt()

    def _invoke(self, callback: Callback) -> None:
        try:
            callback.invoke(self.scheduler, self)
        except Exception:
            log.error("scheduler callback raised", callback=type(callback).__name__,
                      traceback=traceback.format_exc())
            raise

    def _send(self, out: Send) -> bool:
        kind = out.call.WhichOneof("call")
        if kind not in ("accept", "decline"):
            return self._write(out.call, out.traceparent)
        # One `decide` span per accept/decline, under the offer's span (or the caller's
        # traceparent); the call carries the decision's own traceparent onwards.
        links = [Link(trace.get_current_span(ctx).get_span_context())
                 for tp in dict.fromkeys(out.offer_traceparents)
                 if tp != out.traceparent and (ctx := extract(tp)) is not None]
        with self._tracer.start_as_current_span(
                sp.DECIDE, context=extract(out.traceparent) or Context(), links=links,
                kind=trace.SpanKind.PRODUCER, attributes=self._decide_attributes(out.call),
                record_exception=False, set_status_on_exception=False) as span:
            sent = self._write(out.call, span_traceparent(span) or out.traceparent)
            if not sent:
                span.set_status(StatusCode.ERROR, "the call could not be sent to the master")
            return sent

    def _decide_attributes(self, call: scheduler_pb2.SchedulerCall) -> dict[str, Any]:
        info = self._core.framework_info
        attrs: dict[str, Any] = {sp.FRAMEWORK_ID: call.framework_id or self._core.framework_id,
                                 sp.FRAMEWORK_NAME: info.name}
        if call.HasField("accept"):
            a = call.accept
            tids = [t.task_id for op in a.operations if op.HasField("launch")
                    for t in op.launch.tasks]
            ops = [op.WhichOneof("operation") or "?" for op in a.operations]
            attrs.update({sp.DECISION: "accept", sp.OFFER_IDS: list(a.offer_ids),
                          sp.TASK_IDS: tids,
                          sp.REASON: f"accepted: {len(tids)} task(s) to launch"
                                     + (f"; operations {','.join(ops)}" if ops else "")})
            flt = a.filters
        else:
            d = call.decline
            attrs.update({sp.DECISION: "decline", sp.OFFER_IDS: list(d.offer_ids),
                          sp.TASK_IDS: [], sp.REASON: d.reason or "declined (no reason given)"})
            flt = d.filters
        if flt.HasField("refuse_seconds"):
            attrs[sp.REFUSE_SECONDS] = flt.refuse_seconds
        return attrs

    def _write(self, call: scheduler_pb2.SchedulerCall, traceparent: str) -> bool:
        assert self._dealer is not None
        env = codec.Envelope()
        env.scheduler_call.CopyFrom(call)
        env.traceparent = traceparent
        try:
            return self._dealer.send(env)
        except codec.FrameError as exc:
            log.error("call not sent", call=call.WhichOneof("call") or "", error=str(exc))
            return False

    def _note(self, note: Note) -> None:
        self.stats.inc(f"notes{{event={note.event}}}")
        emit = log.warning if note.event in _LOUD_NOTES else log.debug
        emit(note.event, detail=note.detail, framework=self._core.framework_id or "-")

    def _close_dealer(self, dealer: DealerClient) -> None:
        """Close the DEALER, letting zmq flush the last calls for up to the linger."""
        sock = dealer.sock
        if sock is not None and self._linger > 0:
            assert self._reactor is not None
            self._reactor.remove_reader(sock)
            dealer.sock = None  # hand the socket over: closed here with a linger
            sock.close(linger=int(self._linger * 1000))
        dealer.close()


def _copy(msg: _M) -> _M:
    out = type(msg)()
    out.CopyFrom(msg)
    return out
