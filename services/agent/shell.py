"""The agent's shell: finds the leading master, registers, runs the AgentCore's commands —
launching executors through the fork-server, the executor ROUTER (a stable local endpoint,
so executors find a restarted agent), group-committed status-update checkpoints, executor
pid watch, container work (list, stop, remove, logs) on a worker thread, one timer re-armed
from the core's next deadline — and serves /health /state /metrics."""

from __future__ import annotations

import json
import os
import socket
from collections import OrderedDict
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

from google.protobuf.json_format import MessageToDict
from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.trace import Span, StatusCode

from schemas import common_pb2
from services import container_policy, tasks
from services.agent import status_updates as su
from services.agent.checkpoint import AgentCheckpoint, StatusUpdateLog
from services.agent.commands import (
    Command,
    FetchLogs,
    LaunchExecutor,
    LeaveMaster,
    RemoveContainers,
    SaveAgentId,
    SaveClusterId,
    SaveResources,
    SaveState,
    ScanContainers,
    StopContainers,
    ToExecutor,
    ToMaster,
)
from services.agent.core import AgentCore, Registration
from services.agent.launcher import ExecutorLauncher
from services.bus import codec
from services.bus.election import LeaderChanged, detector_from_url
from services.bus.epoch import EpochFence
from services.bus.link import LinkDealer
from services.bus.log import get_logger
from services.bus.mailbox import Mailbox
from services.bus.peer import HeartbeatConfig, RouterServer
from services.bus.reactor import Reactor
from services.executor.runtime import (
    LABEL_EXECUTOR,
    Logs,
    Stream,
    make_runtime,
    read_file_from,
    tail_file,
)
from services.procs import pid_alive
from services.resources import Resources
from services.shell.http import Deferred, Response, json_response, redacted
from services.shell.service import ServiceConfig, ServiceKit
from services.telemetry import extract, span_traceparent
from services.telemetry import spans as sp

log = get_logger("agent")

MASTER = codec.Role.Value("ROLE_MASTER")
DEFAULT_RESOURCES = "cpus:{cpus};mem:{mem};disk:10240;ports:[31000-32000]"
PID_WATCH_INTERVAL = 0.5
REFUSALS_REMEMBERED = 1024  # refused updates' uuids kept to count each once
CoreEvent = Callable[[float], list[Command]]  # a core call, made on the reactor thread


def detect_resources() -> str:
    """The machine's cpus and memory (less 1 GiB for the system), as resource flags."""
    mem_mib = 4096
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemTotal:"):
                    mem_mib = max(256, int(line.split()[1]) // 1024 - 1024)
    except OSError:
        pass
    return DEFAULT_RESOURCES.format(cpus=os.cpu_count() or 1, mem=mem_mib)


def parse_attributes(text: str) -> list[common_pb2.Attribute]:
    """`rack:a;zone:eu-1;gen:3` -> attributes (a number becomes a scalar)."""
    attrs = []
    for part in filter(None, (p.strip() for p in text.split(";"))):
        name, sep, value = part.partition(":")
        if not sep or not name or not value:
            raise ValueError(f"bad attribute {part!r}: expected name:value")
        try:
            attrs.append(common_pb2.Attribute(name=name, scalar=float(value)))
        except ValueError:
            attrs.append(common_pb2.Attribute(name=name, text=value))
    return attrs


@dataclass
class AgentConfig(ServiceConfig):
    cluster_url: str
    work_dir: Path
    resources: str = field(default_factory=detect_resources)
    attributes: str = ""
    hostname: str = field(default_factory=socket.gethostname)
    runtime: str = "docker"  # or "process"
    # Host path prefixes tasks' volumes may bind (os.pathsep-separated; "": none)
    allowed_host_paths: str = ""


SKIP_CHECKPOINT_ENV = "OFFERBUS_TEST_SKIP_TERMINAL_CHECKPOINT"  # test-only, see __init__


class AgentShell(ServiceKit):
    trace_neighbours = ("offerbus-executor-*.jsonl",)  # its executors write beside its file

    def __init__(self, config: AgentConfig, reactor: Reactor | None = None) -> None:
        # The executors it forks inherit this process's environment: they enforce the list.
        os.environ[container_policy.ALLOWED_HOST_PATHS_ENV] = os.pathsep.join(
            container_policy.parse_allowed(config.allowed_host_paths))
        checkpoint = AgentCheckpoint(config.work_dir)  # (makes the work dir)
        agent_id = checkpoint.load_agent_id() or ""
        super().__init__("agent", agent_id or f"agent-{config.hostname}",
                         codec.Role.Value("ROLE_AGENT"), config, reactor)
        self.config = config
        self._refusals_seen: OrderedDict[bytes, None] = OrderedDict()  # update uuids
        self.checkpoint = checkpoint
        self.update_log = StatusUpdateLog(config.work_dir)
        cluster_id = self.checkpoint.load_cluster_id() or ""
        state = self.checkpoint.load_state()
        records = self.update_log.load()
        port_file = config.work_dir / "executor_port"
        port = int(port_file.read_text()) if port_file.exists() else 0
        # A stable loopback port kept in the work dir: executors find a restarted agent.
        self.executors = RouterServer(
            self.reactor, self.ctx, f"tcp://127.0.0.1:{port or '*'}", self.sender,
            self._on_executor, heartbeat=HeartbeatConfig(1.0, 5), stats=self.stats,
            name="executors")
        if not port:
            port_file.write_text(self.executors.endpoint.rsplit(":", 1)[1])
        http = self.start_http({"/state": self._http_state})
        info = common_pb2.AgentInfo(agent_id=agent_id, hostname=config.hostname,
                                    address=self.advertise_host,
                                    endpoint=self.endpoints["http"],
                                    version="offerbus-0.1")
        info.resources.extend(Resources.parse(config.resources).to_proto())
        info.attributes.extend(parse_attributes(config.attributes))
        now = self.driver.now()
        self.core = AgentCore(info, now=now, recovered=state, records=records,
                              cluster_id=cluster_id)
        self.runtime = make_runtime(config.runtime, config.work_dir / "sandboxes")
        # Container engine calls (stop, list, remove, logs) block: one worker thread makes
        # them and hands each result back to the reactor as a core event.
        self._containers_pool = ThreadPoolExecutor(1, thread_name_prefix="containers")
        self._results: Mailbox[CoreEvent] = Mailbox()
        self.reactor.add_reader(self._results, self._on_results)
        self.launcher = ExecutorLauncher(config.work_dir)
        # Launching blocks on the fork server's answer: a worker thread does it, so the
        # reactor keeps answering executors and the master while a batch of tasks starts.
        self._launch_pool = ThreadPoolExecutor(1, thread_name_prefix="launch")
        self._launched: Mailbox[tuple[str, int | Exception]] = Mailbox()
        self.reactor.add_reader(self._launched, self._on_launched)
        self._tracer = trace.get_tracer("offerbus.agent")
        self._run_spans: dict[str, Span] = {}  # executor id -> its `run` span, until forked
        self.fence = EpochFence(frozenset({MASTER}))
        self._master_link_lost = False
        self.master = LinkDealer(
            self.reactor, self.ctx, self.sender, self._on_master,
            on_connected=self._master_connected, on_gone=self._master_gone, heartbeat=self.beat,
            stats=self.stats, fence=self.fence, curve=self.curve.client, name="master",
            on_link=self._master_link)
        self.detector = detector_from_url(config.cluster_url, "master")
        self.reactor.add_reader(self.detector, self._on_leader)
        self._pending: list[su.Checkpoint] = []
        # Test-only (the chaos suite's proof that it can fail): terminal status updates are
        # never checkpointed, so never acknowledged to the executor nor forwarded.
        self._skip_terminal_checkpoint = os.environ.get(SKIP_CHECKPOINT_ENV) == "1"
        self._register_handlers()
        self._register_metrics()
        resources = self.checkpoint.load_resources() if agent_id else None
        if resources is not None:  # the master's last word on its reservations
            self.driver.dispatch(self.core.recover_resources(resources))
        self.driver.attach(self.core)  # the one timer, at the core's next deadline
        self.reactor.on_idle(self._after_wakeup)
        self.reactor.every(PID_WATCH_INTERVAL, self._watch_pids)
        self.detector.start()
        log.info("agent started", id=agent_id or "(new)", cluster=cluster_id or "(unknown)",
                 hostname=config.hostname,
                 resources=config.resources, executors=self.executors.endpoint,
                 http=http.url, recovered_tasks=len(self.core.executors))

    # -- master ----------------------------------------------------------------------------
    def _on_leader(self) -> None:
        for event in self.detector.events():
            if not isinstance(event, LeaderChanged):
                continue
            leader = event.leader
            self.fence.follow(MASTER, leader)  # what the master link acts on (bus/epoch.py)
            if leader is None or "front" not in leader.endpoints:
                log.warning("no leading master")
                self.master.disconnect()
                self._run(self.core.master_lost(self.driver.now()))
                continue
            log.info("leading master", id=leader.member_id, epoch=leader.epoch,
                     endpoint=leader.endpoints["front"])
            self.master.connect(leader.endpoints["front"])

    def _master_connected(self) -> None:
        self._run(self.core.master_detected(self.driver.now()))

    def _master_link(self, up: bool) -> None:
        """The TCP link under the master connection went down or came back (bus/link.py)."""
        if not up:
            self._master_link_lost = True
            return
        if self._master_link_lost and self.master.connected:
            log.info("master link came back: registering again")
            self._run(self.core.master_link_reset(self.driver.now()))
        self._master_link_lost = False

    def _master_gone(self) -> None:
        self._run(self.core.master_lost(self.driver.now()))

    def _on_master(self, env: codec.Envelope) -> None:
        kind = codec.payload_kind(env)
        now = self.driver.now()
        if kind == "agent_event":
            event = env.agent_event
            if event.WhichOneof("event") == "run_tasks":
                log.info("run tasks", count=len(event.run_tasks.launches),
                         tasks=",".join(x.task.task_id for x in event.run_tasks.launches[:5]))
            self._run(self.core.master_event(event, now))
        elif kind == "error":
            log.warning("master refused", code=env.error.code, message=env.error.message)
            self._run(self.core.master_error(env.error.code, now))
        else:
            self.stats.inc("frames_dropped{reason=unexpected}")

    # -- executors -------------------------------------------------------------------------
    def _on_executor(self, peer: bytes, env: codec.Envelope) -> None:
        if codec.payload_kind(env) != "executor_call":
            self.stats.inc("frames_dropped{reason=unexpected}")
            return
        call = env.executor_call
        if call.WhichOneof("call") == "update" \
                and call.update.status.reason == common_pb2.TaskStatus.REASON_TASK_UNAUTHORIZED:
            self._count_refusal(call.update.status.uuid)
        self._run(self.core.executor_call(peer, call, self.driver.now()))

    def _count_refusal(self, uuid: bytes) -> None:
        """A launch the executor refused (a privileged container, a host path outside the
        allowed list), counted once however often its update is resent."""
        if uuid in self._refusals_seen:
            return
        self._refusals_seen[uuid] = None
        while len(self._refusals_seen) > REFUSALS_REMEMBERED:
            self._refusals_seen.popitem(last=False)
        self.stats.inc("tasks_refused{reason=unauthorized}")

    def _launch(self, cmd: LaunchExecutor) -> None:
        argv = ["--agent", self.executors.endpoint, "--executor-id", cmd.executor_id,
                "--framework-id", cmd.framework_id, "--task-id", cmd.task_id,
                "--agent-id", self.core.agent_id, "--cluster-id", cmd.cluster_id,
                "--work-dir", str(self.config.work_dir / "sandboxes" / cmd.executor_id),
                "--runtime", self.config.runtime]
        # The `run` span (under the master's launch span) lasts until the executor is
        # forked; the executor's Launch carries it, so its `start` span is its child.
        span = self._tracer.start_span(
            sp.RUN, context=extract(cmd.traceparent) or Context(), attributes={
                sp.TASK_ID: cmd.task_id, sp.EXECUTOR_ID: cmd.executor_id,
                sp.FRAMEWORK_ID: cmd.framework_id, sp.AGENT_ID: self.core.agent_id,
                sp.HOSTNAME: self.config.hostname, "offerbus.runtime": self.config.runtime})
        self._run_spans[cmd.executor_id] = span
        self._run(self.core.launch_traced(cmd.executor_id, span_traceparent(span)))
        self._launch_pool.submit(self._launch_blocking, cmd.executor_id, argv)

    def _launch_blocking(self, executor_id: str, argv: list[str]) -> None:
        """On the launch thread: fork the executor, hand the pid (or error) to the reactor."""
        try:
            self._launched.put((executor_id, self.launcher.launch(executor_id, argv)))
        except Exception as exc:  # the fork server failed: the task fails, the agent goes on
            self._launched.put((executor_id, exc))

    def _on_launched(self) -> None:
        for executor_id, result in self._launched.drain():
            span = self._run_spans.pop(executor_id, None)
            if span is not None:
                if isinstance(result, Exception):
                    span.set_status(StatusCode.ERROR, f"could not start the executor: {result}")
                    span.set_attribute(sp.REASON, "REASON_EXECUTOR_TERMINATED")
                else:
                    span.set_attribute("process.pid", result)
                span.end()
            if isinstance(result, Exception):
                log.error("executor launch failed", executor=executor_id, error=repr(result))
                self._run(self.core.executor_launch_failed(executor_id, str(result),
                                                           self.driver.now()))
            else:
                self.stats.inc("executors_launched")
                self._run(self.core.executor_launched(executor_id, result))

    def _watch_pids(self) -> None:
        now = self.driver.now()
        for ex in list(self.core.executors.values()):
            if ex.pid and not ex.exited and not pid_alive(ex.pid):
                log.info("executor exited", executor=ex.executor_id, pid=ex.pid)
                self._run(self.core.executor_exited(ex.executor_id, now))

    # -- containers (on the worker thread) ---------------------------------------------------
    def _in_worker(self, work: Callable[[], CoreEvent]) -> None:
        """Run `work` on the containers thread; the core event it returns runs on the reactor."""
        def job() -> None:
            try:
                event = work()
            except Exception as exc:  # never lose the reactor's answer
                log.error("container work failed", error=repr(exc))
                return
            self._results.put(event)
        self._containers_pool.submit(job)

    def _on_results(self) -> None:
        for event in self._results.drain():
            try:
                self._run(event(self.driver.now()))
            except Exception as exc:  # one bad result never stops the reactor
                self.stats.inc("handler_errors{handler=containers}")
                log.error("container result failed", error=repr(exc))

    def _stop_containers(self, cmd: StopContainers) -> CoreEvent:
        """Kill and remove a gone executor's containers (found by their labels)."""
        removed: list[str] = []
        try:
            for handle in self.runtime.find(cmd.labels):
                self.runtime.remove(handle)
                removed.append(handle.id)
                log.info("stopped the container of a gone executor", container=handle.id[:12],
                         executor=cmd.executor_id)
        except Exception as exc:
            error = repr(exc)
            return lambda now: self.core.containers_stopped(cmd.executor_id, removed, error, now)
        return lambda now: self.core.containers_stopped(cmd.executor_id, removed, "", now)

    def _scan_containers(self, cmd: ScanContainers) -> CoreEvent:
        try:
            found = self.runtime.find(cmd.labels)
        except Exception as exc:
            error = repr(exc)
            return lambda now: self.core.containers_found([], error, now)
        return lambda now: self.core.containers_found(found, "", now)

    def _remove_containers(self, cmd: RemoveContainers) -> CoreEvent:
        removed: list[str] = []
        errors: list[str] = []
        for handle in cmd.handles:
            log.warning("removing orphan container", id=handle.id[:12], name=handle.name,
                        labels=dict(handle.labels))
            try:
                self.runtime.remove(handle)
                removed.append(handle.name)
            except Exception as exc:
                errors.append(f"{handle.name}: {exc!r}")
        return lambda now: self.core.orphans_removed(removed, errors)

    def _fetch_logs(self, cmd: FetchLogs) -> CoreEvent:
        """A running task's output comes from its container; a finished one's from the copy
        its executor left in the sandbox (the container is removed when the task ends)."""
        req = cmd.request
        call = codec.Envelope()
        reply = call.agent_call.logs_reply
        call.agent_call.agent_id = self.core.agent_id
        reply.request_id, reply.task_id, reply.stream = req.request_id, req.task_id, req.stream
        stream: Stream = "stderr" if req.stream == 2 else "stdout"
        limit = cmd.max_bytes  # capped by the core below the frame limit
        since = req.since_bytes if req.HasField("since_bytes") else None  # follow mode
        try:
            handles = (self.runtime.find({LABEL_EXECUTOR: cmd.executor_id})
                       if cmd.executor_id else [])
            if handles:
                logs: Logs = self.runtime.logs(handles[0], stream, req.tail_lines or None, limit,
                                               since)
            else:
                logs = self._sandbox_logs(req.task_id, stream, req.tail_lines, limit, since)
            reply.data, reply.truncated, reply.next_offset = \
                logs.data, logs.truncated, logs.next_offset
            reply.eof = True
        except Exception as exc:
            reply.error = str(exc)

        def send(now: float) -> list[Command]:
            self.master.send(call)  # sockets only on the reactor thread
            return []
        return send

    def _sandbox_logs(self, task_id: str, stream: str, tail_lines: int, limit: int,
                      since: int | None) -> Logs:
        sandboxes = sorted((self.config.work_dir / "sandboxes").glob(f"{task_id}.*"),
                           key=lambda p: p.stat().st_mtime)
        if not sandboxes:
            raise LookupError(f"task {task_id} has no sandbox on this agent")
        path = sandboxes[-1] / stream
        if not path.exists():
            raise LookupError(f"task {task_id} left no {stream} (it may not have started)")
        if since is not None:
            return read_file_from(path, since, limit)  # one seek, at most `limit` bytes
        return tail_file(path, tail_lines or None, limit)  # never the whole file in memory

    # -- commands, by type ----------------------------------------------------------------
    def _run(self, cmds: list[Command]) -> None:
        self.driver.dispatch(cmds)

    def _register_handlers(self) -> None:
        on = self.driver.on
        on(su.Checkpoint, lambda c: self._pending.append(c))  # (_commit swaps the list)
        on(ToMaster, self._to_master)
        on(ToExecutor, self._to_executor)
        on(LaunchExecutor, self._launch)
        on(SaveState, lambda c: self.checkpoint.save_state(c.state))
        on(SaveResources, lambda c: self.checkpoint.save_resources(c.resources))
        on(SaveAgentId, self._save_agent_id)
        on(SaveClusterId, self._save_cluster_id)
        on(LeaveMaster, lambda c: self.master.disconnect())
        on(FetchLogs, lambda c: self._in_worker(partial(self._fetch_logs, c)))
        on(StopContainers, lambda c: self._in_worker(partial(self._stop_containers, c)))
        on(ScanContainers, lambda c: self._in_worker(partial(self._scan_containers, c)))
        on(RemoveContainers, lambda c: self._in_worker(partial(self._remove_containers, c)))

    def _to_master(self, cmd: ToMaster) -> None:
        env = codec.Envelope()
        env.agent_call.CopyFrom(cmd.call)
        if not self.master.send(env):
            self.stats.inc("master_calls_unsent")

    def _to_executor(self, cmd: ToExecutor) -> None:
        env = codec.Envelope()
        env.executor_event.CopyFrom(cmd.event)
        env.traceparent = cmd.traceparent
        self.executors.send(cmd.peer, env)

    def _save_agent_id(self, cmd: SaveAgentId) -> None:
        self.checkpoint.save_agent_id(cmd.agent_id)
        self.sender.sender_id = self.member_id = cmd.agent_id

    def _save_cluster_id(self, cmd: SaveClusterId) -> None:
        self.checkpoint.save_cluster_id(cmd.cluster_id)
        log.info("cluster id checkpointed", cluster=cmd.cluster_id)

    def _commit(self) -> None:
        """Group commit: one fsync for every checkpoint record of this wake-up, then let
        the core acknowledge executors and forward."""
        while self._pending:
            batch, self._pending = self._pending, []
            if self._skip_terminal_checkpoint:
                batch = [c for c in batch if not (isinstance(c.record, su.Added)
                                                  and c.record.update.status.state
                                                  in tasks.TERMINAL)]
            self.update_log.append([c.record for c in batch])
            now = self.driver.now()
            for c in batch:
                self._run(self.core.checkpointed(c.record, now))

    def _after_wakeup(self) -> None:
        self._commit()
        self.driver.rearm()

    # -- HTTP and metrics ----------------------------------------------------------------
    def health(self) -> dict[str, Any]:
        return {"id": self.core.agent_id, "cluster_id": self.core.cluster_id,
                "registration": self.core.registration.value,
                "master_connected": self.master.connected}

    def _http_state(self, query: dict[str, list[str]]) -> Deferred:
        """On the reactor only a copy of the state (a fresh message, C-speed copies); its JSON
        is made on the request's thread (issue 8: a scrape never delays heartbeats)."""
        snapshot, registration = self.core.state(), self.core.registration.value

        def render() -> Response:
            state: dict[str, Any] = redacted(  # environments: names only (issue 11)
                MessageToDict(snapshot, preserving_proto_field_name=True))
            state["registration"] = registration
            return json_response(json.dumps(state, sort_keys=True).encode())

        return render

    def _register_metrics(self) -> None:
        m = self.metrics
        m.gauge("registered", "1 while the agent is registered with the leading master.",
                value=lambda: float(self.core.registration is Registration.REGISTERED))
        m.gauge("executors", "Executors the agent knows (running or being stopped).",
                value=lambda: float(len(self.core.executors)))
        m.labelled_counter("status_updates", "Status updates handled by the agent's status "
                           "update manager, by event.", "event",
                           lambda: {k: float(v) for k, v in self.core.updates.counts.items()})

    def close(self, linger_ms: int = 0) -> None:
        self._commit()
        self.reactor.remove_reader(self.detector)
        self.detector.close()
        self.master.close()
        self.executors.close()
        self._launch_pool.shutdown(wait=True)
        self._containers_pool.shutdown(wait=True)
        self.reactor.remove_reader(self._results)
        self._results.close()
        for span in self._run_spans.values():  # forks still unanswered: end them anyway
            span.end()
        self._run_spans.clear()
        self.reactor.remove_reader(self._launched)
        self._launched.close()
        self.launcher.close()
        self.update_log.close()
        super().close(linger_ms)


__all__ = ["AgentConfig", "AgentShell", "detect_resources", "parse_attributes"]
