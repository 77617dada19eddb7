"""The executor shell: the agent link (a DealerClient that re-subscribes whenever the link comes
back), the reactor, and the threads that make blocking runtime calls; it feeds ExecutorCore and
carries out its commands. Entry point: main(argv), also called by the agent's fork server."""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import signal
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from pathlib import Path
from types import FrameType

import zmq
from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.trace import Link, SpanContext, StatusCode

from schemas import common_pb2, executor_pb2
from services import tasks, telemetry
from services.bus import codec
from services.bus.link import LinkDealer
from services.bus.log import KV, get_logger
from services.bus.mailbox import Mailbox
from services.bus.peer import HeartbeatConfig, Sender
from services.bus.reactor import Reactor, Timer
from services.executor import core as ec
from services.executor.checks import run_check
from services.executor.runtime import (
    REASON_CONTAINER_LAUNCH_FAILED,
    Handle,
    LaunchError,
    Runtime,
    RuntimeFailure,
    make_runtime,
    spec_from_task,
)
from services.telemetry import spans as sp

log = get_logger("executor")

ROLE_EXECUTOR = codec.Role.Value("ROLE_EXECUTOR")
SUBSCRIBE_RETRY_S = 1.0
WAIT_SLICE_S = 30.0  # the waiter thread's runtime.wait() timeout per call
SAVED_LOG_BYTES = 1 << 20  # container output copied to the sandbox before removal
SIGTERM_EXIT_SLACK_S = 10.0
KILL_ATTEMPTS = 5  # after SIGTERM: exit by grace + this even without an ack
EXIT_CODE = "offerbus.exit_code"  # span attribute: the task's exit code (status spans)

Event = Callable[[float], list[ec.Command]]  # a core call, made in the reactor thread


class ExecutorShell:
    """One task's executor. Alone in its process (run(): `python -m services.executor`), or
    one of many in an executor host (services.executor.host), which shares its reactor, zmq
    context and runtime, posts the shell's events through `post` and is told by `on_exit`
    when the shell is done (its container removed, its last update acknowledged)."""

    def __init__(self, args: argparse.Namespace, runtime: Runtime,
                 ctx: zmq.Context[zmq.Socket[bytes]], reactor: Reactor | None = None, *,
                 post: Callable[[ExecutorShell, Event], None] | None = None,
                 on_exit: Callable[[ExecutorShell], None] | None = None,
                 logger: KV | None = None) -> None:
        self.args = args
        self.runtime = runtime
        self.reactor = reactor or Reactor()
        self.work_dir = Path(args.work_dir)
        self.log = logger or log
        self.core = ec.ExecutorCore(
            args.executor_id, args.framework_id, time.time(), agent_id=args.agent_id,
            recovery_timeout_s=args.recovery_timeout, default_grace_s=args.kill_grace)
        self.exit_code: int | None = None
        self.handle: Handle | None = None
        self.on_exit = on_exit
        self.mailbox: Mailbox[Event] | None = None
        if post is None:
            self.mailbox = Mailbox()
            self.reactor.add_reader(self.mailbox, self._drain_mailbox)
            self._post: Callable[[Event], None] = self.mailbox.put
        else:
            self._post = partial(post, self)
        self.worker = ThreadPoolExecutor(1, thread_name_prefix="runtime")
        # Health checks on their own thread: a slow check never delays a start or a kill.
        self.checker = ThreadPoolExecutor(1, thread_name_prefix="check")
        self._timer: Timer | None = None
        self._force_exit: Timer | None = None
        self._link_lost = False
        self._finishing = False
        self._sig_r = self._sig_w = -1
        self.dealer = LinkDealer(
            self.reactor, ctx, Sender(args.executor_id, ROLE_EXECUTOR), self._on_message,
            on_connected=self._on_connected, on_gone=self._on_gone, on_link=self._on_link,
            heartbeat=HeartbeatConfig(args.heartbeat), name="agent")
        self._subscribe_retry = self.reactor.every(SUBSCRIBE_RETRY_S, self._resubscribe)
        self._tracer = trace.get_tracer("offerbus.executor")
        self._start_span: SpanContext | None = None  # set by the worker before it reports
        self._traced_status: set[bytes] = set()  # terminal updates already traced (by uuid)

    # -- running ---------------------------------------------------------------------------
    def start(self) -> None:
        """Connect to the agent (the reactor, run by the caller, does the rest)."""
        self.log.info("executor starting", executor=self.args.executor_id,
                      agent=self.args.agent, runtime=self.runtime.name, pid=os.getpid())
        self.dealer.connect(self.args.agent)
        self._reschedule()

    def run(self) -> int:
        """Alone in this process: serve until the task is done, then return the exit code."""
        self._sig_r, self._sig_w = os.pipe()
        os.set_blocking(self._sig_w, False)
        self.reactor.add_reader(self._sig_r, self._on_signal_pipe)
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, self._on_signal)
        self.start()
        self.reactor.run(until=lambda: self.exit_code is not None)
        self.close()
        self.log.info("executor exiting", code=self.exit_code)
        return self.exit_code if self.exit_code is not None else 1

    def close(self) -> None:
        """Leave the agent link and the reactor; the threads end with their work."""
        self.dealer.close()
        self._subscribe_retry.cancel()
        for timer in (self._timer, self._force_exit):
            if timer is not None:
                timer.cancel()
        self._timer = self._force_exit = None
        if self.mailbox is not None:
            self.reactor.remove_reader(self.mailbox)
            self.mailbox.close()
        self.worker.shutdown(wait=False, cancel_futures=True)
        self.checker.shutdown(wait=False, cancel_futures=True)

    def event(self, fn: Event) -> None:
        """Apply a core event (on the reactor thread); the host delivers posted ones here."""
        if self.exit_code is None:
            self._event(fn)

    def _apply(self, commands: list[ec.Command]) -> None:
        for cmd in commands:
            if isinstance(cmd, ec.SendUpdate):
                self._send_update(cmd.status)
            elif isinstance(cmd, ec.StartContainer):
                self.worker.submit(self._start, cmd.task, cmd.framework_id, cmd.traceparent)
            elif isinstance(cmd, ec.KillContainer):
                self.worker.submit(self._kill, cmd.grace_s)
            elif isinstance(cmd, ec.RunCheck):
                self.checker.submit(self._check, cmd.check, cmd.timeout_s)
            elif isinstance(cmd, ec.Exit):
                self._finish(cmd)
        self._reschedule()

    def _event(self, fn: Event) -> None:
        self._apply(fn(time.time()))

    def terminate(self) -> None:
        """SIGTERM (to this process, or to the host serving this shell): kill the task;
        without an agent to acknowledge, do not wait for one for long."""
        self.log.info("terminated by signal; killing the task")
        self._event(lambda now: self.core.shutdown(None, now))
        if self._force_exit is None and self.exit_code is None:
            self._force_exit = self.reactor.call_later(
                self.core.grace_s + SIGTERM_EXIT_SLACK_S, self._exit_unacknowledged)

    def _reschedule(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        deadline = self.core.next_deadline()
        if deadline is not None and self.exit_code is None:
            self._timer = self.reactor.call_later(max(0.0, deadline - time.time()), self._tick)

    def _tick(self) -> None:
        self._timer = None
        self._event(self.core.tick)

    # -- agent link ------------------------------------------------------------------------
    def _call(self) -> executor_pb2.ExecutorCall:
        return executor_pb2.ExecutorCall(executor_id=self.core.executor_id,
                                         framework_id=self.core.framework_id)

    def _send(self, call: executor_pb2.ExecutorCall) -> None:
        env = codec.Envelope()
        env.executor_call.CopyFrom(call)
        self.dealer.send(env)

    def _send_update(self, status: common_pb2.TaskStatus) -> None:
        if tasks.is_terminal(status.state) and status.uuid not in self._traced_status:
            self._traced_status.add(status.uuid)  # retries of this update are not traced
            self._trace_status(status)
        call = self._call()
        call.update.status.CopyFrom(status)
        self._send(call)
        self.log.info("status update", task=status.task_id,
                 state=common_pb2.TaskState.Name(status.state), uuid=status.uuid.hex()[:8])

    def _send_subscribe(self) -> None:
        call = self._call()
        statuses, pending_tasks = self.core.subscribe_payload()
        call.subscribe.unacknowledged_updates.extend(statuses)
        call.subscribe.unacknowledged_tasks.extend(pending_tasks)
        self._send(call)
        self.log.info("subscribing", unacked_updates=len(statuses),
                      unacked_tasks=len(pending_tasks))

    def _on_connected(self) -> None:
        if not self.core.connected:
            self._send_subscribe()

    def _resubscribe(self) -> None:
        if not self.core.connected and self.dealer.connected:
            self._send_subscribe()

    def _on_link(self, up: bool) -> None:
        if up:
            if self._link_lost and self.dealer.connected:
                # The agent came back (restarted) before heartbeats noticed it was gone.
                self._send_subscribe()
            self._link_lost = False
        else:
            self.log.info("agent link down")
            self._link_lost = True
            self._event(self.core.disconnected)

    def _on_gone(self) -> None:
        self.log.warning("agent missed its heartbeats")
        self._event(self.core.disconnected)

    def _on_message(self, env: codec.Envelope) -> None:
        if codec.payload_kind(env) != "executor_event":
            self.log.warning("unexpected message", kind=codec.payload_kind(env))
            return
        ev = env.executor_event
        kind = ev.WhichOneof("event")
        if kind == "subscribed":
            self.log.info("subscribed", agent_id=ev.subscribed.agent_id)
            self._event(lambda now: self.core.subscribed(ev.subscribed.agent_id, now))
        elif kind == "launch":
            self.log.info("launch", task=ev.launch.task.task_id)
            tp = env.traceparent
            self._event(lambda now: self.core.launch(ev.launch.task, ev.launch.framework_id,
                                                     now, tp))
        elif kind == "kill":
            grace = ev.kill.kill_grace_period_s if ev.kill.HasField("kill_grace_period_s") else None
            self.log.info("kill", task=ev.kill.task_id, grace_s=grace)
            self._event(lambda now: self.core.kill(grace, now))
        elif kind == "acknowledged":
            self._event(lambda now: self.core.acknowledged(ev.acknowledged.uuid, now))
        elif kind == "shutdown":
            # 0 (the proto default) means "the task's own grace period".
            grace = ev.shutdown.grace_period_s or None
            self.log.info("shutdown", grace_s=grace)
            self._event(lambda now: self.core.shutdown(grace, now))
        else:
            self.log.warning("unknown executor event", kind=kind)

    # -- runtime calls (worker and waiter threads) -------------------------------------------
    def _drain_mailbox(self) -> None:
        if self.mailbox is not None:
            for fn in self.mailbox.drain():
                self.event(fn)

    def _start(self, task: common_pb2.TaskInfo, framework_id: str, traceparent: str = "") -> None:
        spec = spec_from_task(task, framework_id=framework_id, executor_id=self.core.executor_id,
                              agent_id=self.core.agent_id, sandbox=str(self.work_dir),
                              cluster_id=self.args.cluster_id)
        started = time.monotonic()
        # The `start` span (under the agent's `run` span, named by the Launch envelope)
        # covers creating and starting the container.
        span = self._tracer.start_span(
            sp.START, context=telemetry.extract(traceparent) or Context(), attributes={
                sp.TASK_ID: task.task_id, sp.EXECUTOR_ID: self.core.executor_id,
                sp.FRAMEWORK_ID: framework_id, sp.AGENT_ID: self.core.agent_id,
                sp.IMAGE: spec.image, "offerbus.runtime": self.runtime.name})
        try:
            handle = self.runtime.start(spec)
        except LaunchError as exc:
            self.log.warning("launch failed", reason=exc.reason, error=exc.message)
            reason, message = exc.reason, exc.message
            self._post(lambda now: self.core.launch_failed(reason, message, now))
            span.set_status(StatusCode.ERROR, message)
            span.set_attribute(sp.REASON, _reason_name(reason))
            self._end_start_span(span)
            return
        except Exception as exc:  # any engine failure fails the task, never the executor
            self.log.error("launch failed", error=repr(exc))
            text = f"launch failed: {exc}"
            self._post(lambda now: self.core.launch_failed(
                REASON_CONTAINER_LAUNCH_FAILED, text, now))
            span.set_status(StatusCode.ERROR, text)
            span.set_attribute(sp.REASON, _reason_name(REASON_CONTAINER_LAUNCH_FAILED))
            self._end_start_span(span)
            return
        self.log.info("container started", container=handle.container_id[:12],
                 took_ms=round((time.monotonic() - started) * 1000, 1))
        self.handle = handle
        # Report first; the span's export (synchronous in executors) must not delay RUNNING.
        self._post(lambda now: self.core.container_started(handle.container_id, now))
        span.set_attribute(sp.CONTAINER_ID, handle.container_id)
        span.add_event("TASK_RUNNING", {sp.CONTAINER_ID: handle.container_id})
        self._end_start_span(span)
        threading.Thread(target=self._wait, args=(handle,), name="waiter", daemon=True).start()

    def _end_start_span(self, span: trace.Span) -> None:
        self._start_span = span.get_span_context()
        span.end()

    def _wait(self, handle: Handle) -> None:
        backoff = threading.Event()
        while True:
            try:
                info = self.runtime.wait(handle, WAIT_SLICE_S)
            except RuntimeFailure as exc:
                self.log.warning("wait failed; retrying", error=str(exc))
                backoff.wait(1.0)
                continue
            if info is not None:
                break
        self.log.info("container exited", code=info.exit_code, oom=info.oom_killed)
        self._post(lambda now: self.core.container_exited(
            info.exit_code, info.oom_killed, info.message, now))

    def _kill(self, grace_s: float) -> None:
        if self.handle is None:
            return
        pause = threading.Event()
        for attempt in range(1, KILL_ATTEMPTS + 1):
            try:
                self.runtime.kill(self.handle, grace_s)  # the waiter thread reports the exit
                return
            except RuntimeFailure as exc:  # e.g. the engine restarting: try again shortly
                self.log.error("kill failed", attempt=attempt, error=str(exc))
                pause.wait(1.0)

    def _check(self, check: common_pb2.HealthCheck, timeout_s: float) -> None:
        """On the check thread: run the health check, hand its result to the core."""
        result = run_check(check, timeout_s, self.runtime, self.handle)
        self.log.info("health check", ok=result.ok, output=result.output[:200])
        self._post(lambda now: self.core.check_result(result.ok, result.output, now))

    def _trace_status(self, status: common_pb2.TaskStatus) -> None:
        """A `status` span for the task's terminal update, linked to its `start` span."""
        links = [Link(self._start_span)] if self._start_span is not None else []
        attrs: dict[str, str | int] = {
            sp.TASK_ID: status.task_id, sp.EXECUTOR_ID: self.core.executor_id,
            sp.FRAMEWORK_ID: self.core.framework_id, sp.AGENT_ID: status.agent_id,
            sp.TASK_STATE: common_pb2.TaskState.Name(status.state),
            sp.REASON: _reason_name(status.reason)}
        if status.container_id:
            attrs[sp.CONTAINER_ID] = status.container_id
        if status.HasField("exit_code"):
            attrs[EXIT_CODE] = status.exit_code
        span = self._tracer.start_span(sp.STATUS, context=Context(), links=links,
                                       attributes=attrs)
        if status.message:
            span.set_attribute("offerbus.message", status.message)
        if status.state != tasks.FINISHED:
            span.set_status(StatusCode.ERROR,
                            status.message or common_pb2.TaskState.Name(status.state))
        span.end()

    # -- exit ------------------------------------------------------------------------------
    def _finish(self, cmd: ec.Exit) -> None:
        """Save the container's output, remove it (on the worker thread: engine calls never
        block the reactor, which a host shares among many shells), then exit."""
        if self._finishing:
            return
        self._finishing = True
        self.log.info("exit", code=cmd.code, reason=cmd.reason)
        self.worker.submit(self._clean_up, cmd.code)

    def _clean_up(self, code: int) -> None:
        handle = self.handle
        if handle is not None and handle.runtime == "docker":
            for stream in ("stdout", "stderr"):
                try:  # keep the output in the sandbox: removing the container drops it
                    out = self.runtime.logs(handle, stream, max_bytes=SAVED_LOG_BYTES)
                    (self.work_dir / stream).write_bytes(out.data)
                except (RuntimeFailure, OSError) as exc:
                    self.log.warning("could not save container output", stream=stream,
                                     error=str(exc))
        if handle is not None:
            try:
                self.runtime.remove(handle)
            except RuntimeFailure as exc:
                self.log.error("could not remove the container", error=str(exc))
        self._post(lambda now: self._exited(code))

    def _exited(self, code: int) -> list[ec.Command]:
        self.exit_code = code
        if self.on_exit is not None:
            self.on_exit(self)
        return []

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        with contextlib.suppress(OSError):  # only async-signal-safe work here
            os.write(self._sig_w, bytes([signum]))

    def _on_signal_pipe(self) -> None:
        os.read(self._sig_r, 64)
        self.terminate()

    def _exit_unacknowledged(self) -> None:
        if self.exit_code is None and not (self.core.container_running
                                           or self.core.start_in_flight):
            self._finish(ec.Exit(1, "terminated; last update not acknowledged"))


def _reason_name(reason: int) -> str:
    try:
        return common_pb2.TaskStatus.Reason.Name(reason)  # type: ignore[arg-type]
    except ValueError:
        return str(reason)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="python -m services.executor", description=__doc__)
    ap.add_argument("--agent", required=True,
                    help="the agent's executor endpoint (ipc://... or tcp://127.0.0.1:PORT)")
    ap.add_argument("--executor-id", required=True)
    ap.add_argument("--framework-id", required=True)
    ap.add_argument("--task-id", default="", help="the task this executor is for (logs)")
    ap.add_argument("--agent-id", default="", help="labels containers (else from Subscribed)")
    ap.add_argument("--cluster-id", default="",
                    help="the cluster's id: labels containers (org.offerbus.cluster_id)")
    ap.add_argument("--work-dir", required=True, help="the sandbox: logs, process output")
    ap.add_argument("--runtime", choices=("docker", "process"), default="docker")
    ap.add_argument("--recovery-timeout", type=float, default=ec.DEFAULT_RECOVERY_TIMEOUT_S,
                    help="kill the task and exit when no agent answers for this long (s)")
    ap.add_argument("--kill-grace", type=float, default=ec.DEFAULT_KILL_GRACE_S,
                    help="SIGTERM->SIGKILL grace when the task sets none (s)")
    ap.add_argument("--heartbeat", type=float, default=1.0, help="agent link beat interval (s)")
    ap.add_argument("--log-level", default=os.environ.get("OFFERBUS_LOG_LEVEL", "INFO"))
    return ap.parse_args(argv)


def _configure_logging(work_dir: Path, executor_id: str, level: str) -> None:
    handler = logging.FileHandler(work_dir / "executor.log")
    handler.setFormatter(logging.Formatter(
        f"%(asctime)s %(levelname)s executor[{executor_id}] %(name)s: %(message)s"))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    work_dir = Path(args.work_dir)
    work_dir.mkdir(parents=True, exist_ok=True)
    _configure_logging(work_dir, args.executor_id, args.log_level)
    # Here, in the forked executor (never in the fork server): the exporter's thread.
    telemetry.setup("offerbus-executor", batch=False, executor_id=args.executor_id,
                    task_id=args.task_id, framework_id=args.framework_id,
                    agent_id=args.agent_id)
    ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
    try:
        shell = ExecutorShell(args, make_runtime(args.runtime, work_dir), ctx)
        return shell.run()
    finally:
        ctx.destroy(linger=0)
        try:
            telemetry.shutdown()  # flush the spans before the process leaves (os._exit)
        except Exception as exc:
            log.warning("trace flush failed", error=repr(exc))
