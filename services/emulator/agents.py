"""The agent emulator's pure core: thousands of virtual agents in one process, each speaking
the real agent protocol (schemas/agent.proto) on its own bus channel. Registration with a
bounded window of outstanding (re-)registrations, re-registration with tasks and frameworks
after a master failover, run/kill/reconcile/shutdown, a task's STARTING, RUNNING and (after
its scheduled run time) FINISHED, and per task a FIFO stream of status updates resent until
acknowledged (in memory; services/agent/status_updates.py is the durable original). Events
and `now` in, commands out (`ToMaster`, Notice); no sockets, clock or randomness."""

from __future__ import annotations

import enum
import heapq
import math
from collections import Counter, deque
from collections.abc import Iterable
from dataclasses import dataclass, field

from schemas import agent_pb2, bus_pb2, common_pb2
from services import report_digest, tasks
from services.agent.status_updates import MAX_BATCH, RETRY_INITIAL_S, RetryTimer
from services.notice import Notice

TaskStatus = common_pb2.TaskStatus
Key = tuple[str, str]  # (framework_id, task_id)
Command = object  # ToMaster | Notice

RUN_LABEL = "emulator.run_s"  # a task label: seconds it runs before TASK_FINISHED
REGISTER_WINDOW = 200  # (re-)registrations outstanding at once, by default
REGISTER_TIMEOUT_S = 2.0  # an unanswered (re-)registration is resent after this, doubling
REGISTER_TIMEOUT_MAX_S = 5.0  # as the real agent caps its own (services/agent/core.py)
MAX_TASKS = 1_000_000  # tasks (and update streams) the emulator keeps; beyond: TASK_FAILED
PROGRESS_STEPS = 10  # registration progress is logged this many times on the way to all


class Reg(enum.Enum):
    DISCONNECTED = "disconnected"  # no master
    QUEUED = "queued"  # waiting for a slot in the registration window
    REGISTERING = "registering"  # Register/Reregister sent, no answer yet
    REGISTERED = "registered"
    STOPPED = "stopped"  # told to shut down: the real agent exits


@dataclass(frozen=True)
class ToMaster:
    channel: str  # the virtual agent's channel (its name)
    call: agent_pb2.AgentCall


@dataclass
class VTask:
    framework_id: str
    info: common_pb2.TaskInfo
    state: tasks.State
    finish_at: float | None = None
    pending: deque[TaskStatus] = field(default_factory=deque)  # head sent, unacknowledged
    sends: int = 0  # sends of the head
    sent_at: float | None = None  # the head's first send (a round-trip sample's start)
    wait: float = 0.0  # the head's current wait between sends
    retry_at: float | None = None
    reported: bool = True  # False: an update stream only (unknown task), not re-registered
    # Its part of a Reregister (the task with its latest state, and its executor),
    # serialised, for (state, agent id) `wire_of`: made once its state settles (acknowledged),
    # so a failover's 10,000 Reregisters are joined from bytes, not built field by field.
    wire: bytes = b""
    wire_of: tuple[int, str] | None = None
    digest: int = 0  # its part of the report's digest (report_digest.py), made with `wire`

    @property
    def key(self) -> Key:
        return (self.framework_id, self.info.task_id)


@dataclass
class VAgent:
    name: str
    info: common_pb2.AgentInfo
    agent_id: str = ""
    reg: Reg = Reg.DISCONNECTED
    attempts: int = 0  # (re-)registrations sent without an answer
    register_at: float | None = None
    retry: RetryTimer = field(default_factory=RetryTimer)  # as the real agent's, its own
    tasks: dict[Key, VTask] = field(default_factory=dict)
    ready: set[Key] = field(default_factory=set)  # heads to send at the next flush


class AgentsCore:
    def __init__(self, infos: Iterable[common_pb2.AgentInfo], *, nonce: bytes,
                 run_s: float = math.inf, window: int = REGISTER_WINDOW,
                 register_timeout_s: float = REGISTER_TIMEOUT_S,
                 max_tasks: int = MAX_TASKS, update_retry_s: float = RETRY_INITIAL_S) -> None:
        """`infos`: one per virtual agent, its hostname its name (and channel); `nonce`: 8
        random bytes (status update uuids are nonce + counter); `run_s`: a task's run time
        unless its RUN_LABEL says otherwise (inf: until killed); `update_retry_s`: the first
        resend of an unacknowledged update at the least (then doubling; longer when the
        agent's acknowledgements take longer, as the real agent's RetryTimer), the real
        agent's by default."""
        self.agents: dict[str, VAgent] = {}
        for info in infos:
            copy = common_pb2.AgentInfo()
            copy.CopyFrom(info)
            self.agents[info.hostname] = VAgent(info.hostname, copy,
                                                retry=RetryTimer(initial=update_retry_s))
        if len(nonce) != 8:
            raise ValueError("the nonce is 8 bytes")
        self.nonce, self.run_s, self.window = nonce, run_s, max(1, window)
        self.register_timeout_s, self.max_tasks = register_timeout_s, max_tasks
        self.frameworks: dict[str, common_pb2.FrameworkInfo] = {}
        self._fw_tasks: Counter[str] = Counter()  # live tasks per framework (prunes the above)
        self._fw_wire: dict[str, bytes] = {}  # each framework's part of a Reregister
        self.by_id: dict[str, str] = {}  # agent id -> name
        self.tasks = 0
        self.counts: Counter[str] = Counter()
        self._queue: deque[str] = deque()
        self._registering: set[str] = set()
        self._timers: list[tuple[float, int, str, str, Key]] = []  # lazily invalidated
        self._seq = 0
        self._uuids = 0
        self._dirty: set[str] = set()  # agents with ready heads
        self._n_registered = 0
        self._progress_step = max(1, len(self.agents) // PROGRESS_STEPS)
        self.detected_at: float | None = None
        self._states: Counter[str] = Counter({Reg.DISCONNECTED.value: len(self.agents)})
        self._running = 0

    # -- the master ------------------------------------------------------------------------
    def master_detected(self, now: float) -> list[Command]:
        """Connected to a (new) leading master: every agent (re-)registers, `window` at once."""
        self.master_lost(now)
        self.detected_at = now
        for a in self.agents.values():
            if a.reg is not Reg.STOPPED:
                self._set(a, Reg.QUEUED)
                self._queue.append(a.name)
        return self._pump(now)

    def master_lost(self, now: float) -> list[Command]:
        for a in self.agents.values():
            if a.reg is not Reg.STOPPED:
                self._set(a, Reg.DISCONNECTED)
                a.register_at, a.attempts = None, 0
        self._queue.clear()
        self._registering.clear()
        self._n_registered = 0
        return []

    def _pump(self, now: float) -> list[Command]:
        out: list[Command] = []
        while self._queue and len(self._registering) < self.window:
            a = self.agents[self._queue.popleft()]
            if a.reg is Reg.QUEUED:
                self._set(a, Reg.REGISTERING)
                a.attempts = 0
                self._registering.add(a.name)
                out.append(self._register(a, now))
        return out

    def _register(self, a: VAgent, now: float) -> ToMaster:
        a.attempts += 1
        a.register_at = now + min(self.register_timeout_s * 2 ** (a.attempts - 1),
                                  REGISTER_TIMEOUT_MAX_S)
        self._schedule(a.register_at, "register", a.name, ("", ""))
        call = agent_pb2.AgentCall(agent_id=a.agent_id)
        if a.agent_id:
            self.counts["reregistrations_sent"] += 1
            rr = call.reregister
            rr.agent_info.CopyFrom(a.info)
            rr.agent_info.agent_id = a.agent_id
            used: set[str] = set()
            parts: list[bytes] = []
            digest = 0
            for t in a.tasks.values():
                if t.reported:
                    used.add(t.framework_id)
                    parts.append(_wire(t, a.agent_id))
                    digest += t.digest
            parts += [self._fw_wire[f] for f in sorted(used) if f in self._fw_wire]
            # Each part is a Reregister of one task and its executor, or of one framework:
            # joined, they parse as the whole (repeated fields append, in order).
            rr.MergeFromString(b"".join(parts))
            rr.tasks_digest = digest & report_digest.MASK
        else:
            self.counts["registrations_sent"] += 1
            call.register.agent_info.CopyFrom(a.info)
        return ToMaster(a.name, call)

    def master_error(self, channel: str, code: int, now: float) -> list[Command]:
        """The master refused a call of `channel`'s agent: not registered on this connection
        (or not leading) means register again."""
        a = self.agents.get(channel)
        if a is None:
            self.counts["errors_unknown_channel"] += 1
            return []
        self.counts["errors"] += 1
        if code in (bus_pb2.NOT_REGISTERED, bus_pb2.NOT_LEADER) and a.reg is Reg.REGISTERED:
            self._set(a, Reg.QUEUED)
            self._n_registered -= 1
            self._queue.append(a.name)
            return self._pump(now)
        return []

    def master_event(self, channel: str, event: agent_pb2.AgentEvent,
                     now: float) -> list[Command]:
        a = self.agents.get(channel)
        if a is None:
            self.counts["events_unknown_channel"] += 1
            return []
        kind = event.WhichOneof("event")
        out: list[Command] = []
        if kind in ("registered", "reregistered"):
            if a.reg in (Reg.REGISTERING, Reg.QUEUED, Reg.REGISTERED):
                out += self._registered(a, getattr(event, kind).agent_id, now)
        elif kind == "shutdown":
            if a.reg is not Reg.STOPPED:
                out += self._shutdown(a, event.shutdown.reason, now)
        elif a.reg is not Reg.REGISTERED:
            self.counts["events_ignored"] += 1  # from a master we are not registered with
        elif kind == "run_tasks":
            self._run_tasks(a, event.run_tasks, now)
        elif kind == "kill_task":
            self._kill(a, event.kill_task.framework_id, event.kill_task.task_id, now)
        elif kind == "acknowledgements":
            for ack in event.acknowledgements.acks:
                self._acknowledge(a, (ack.framework_id, ack.task_id), ack.uuid, now)
        elif kind == "reconcile":
            for r in event.reconcile.tasks:
                if (r.framework_id, r.task_id) not in a.tasks:
                    self._unknown_task(a, r.framework_id, r.task_id, now,
                                       "task unknown to this agent")
        elif kind == "shutdown_framework":
            # The framework was removed: its tasks are killed and its update streams
            # forgotten (the master takes no more updates of it), as the real agent does.
            fid = event.shutdown_framework.framework_id
            for key in [k for k in a.tasks if k[0] == fid]:
                self.counts["tasks_killed"] += not tasks.is_terminal(a.tasks[key].state)
                self._forget(a, key)
        elif kind == "logs_request":
            out.append(self._no_logs(a, event.logs_request))
        return out + self._flush(now)

    def _registered(self, a: VAgent, agent_id: str, now: float) -> list[Command]:
        out: list[Command] = []
        if a.reg is not Reg.REGISTERED:
            self._n_registered += 1
            if self._n_registered % self._progress_step == 0 or \
                    self._n_registered == len(self.agents):
                out.append(Notice.of("registration_progress", "virtual agents registered",
                                     registered=self._n_registered, total=len(self.agents),
                                     after_s=round(now - (self.detected_at or now), 3)))
        if agent_id and agent_id != a.agent_id:
            self.by_id.pop(a.agent_id, None)
            a.agent_id = agent_id
            self.by_id[agent_id] = a.name
        self.counts["registered"] += 1
        self._set(a, Reg.REGISTERED)
        a.register_at, a.attempts = None, 0
        self._registering.discard(a.name)
        a.retry = RetryTimer(initial=a.retry.initial)  # another master's round trip
        for t in a.tasks.values():  # every head at once, backoff reset
            if t.pending:
                t.sends, t.sent_at, t.retry_at = 0, None, None
                a.ready.add(t.key)
        if a.ready:
            self._dirty.add(a.name)
        return out + self._pump(now)

    def _shutdown(self, a: VAgent, reason: str, now: float) -> list[Command]:
        """The agent was removed: the real one kills everything and exits; so does this one
        (its tasks are forgotten: the master ended them already)."""
        for key in list(a.tasks):
            self._forget(a, key)
        a.ready.clear()
        if a.reg is Reg.REGISTERED:
            self._n_registered -= 1
        self._registering.discard(a.name)
        self._set(a, Reg.STOPPED)
        a.register_at = None
        self.counts["shutdowns"] += 1
        return [Notice.of("agent_shut_down", "a virtual agent was told to shut down",
                          "warning", agent=a.name, agent_id=a.agent_id, reason=reason),
                *self._pump(now)]

    def _no_logs(self, a: VAgent, req: agent_pb2.AgentEvent.LogsRequest) -> ToMaster:
        call = agent_pb2.AgentCall(agent_id=a.agent_id)
        r = call.logs_reply
        r.request_id, r.task_id, r.stream = req.request_id, req.task_id, req.stream
        r.error, r.eof = "a virtual agent (the agent emulator) keeps no task logs", True
        return ToMaster(a.name, call)

    # -- tasks -----------------------------------------------------------------------------
    def _run_tasks(self, a: VAgent, run: agent_pb2.AgentEvent.RunTasks, now: float) -> None:
        for fw in run.frameworks:
            fid = fw.framework_id
            if self.frameworks.get(fid) != fw:
                kept = common_pb2.FrameworkInfo()
                kept.CopyFrom(fw)
                self.frameworks[fid] = kept
                self._fw_wire[fid] = agent_pb2.AgentCall.Reregister(
                    frameworks=[kept]).SerializeToString()
        for launch in run.launches:
            key = (launch.framework_id, launch.task.task_id)
            if key in a.tasks:
                self.counts["duplicate_launches"] += 1
                continue
            info = common_pb2.TaskInfo()
            info.CopyFrom(launch.task)
            if self.tasks >= self.max_tasks:
                self._add(a, VTask(key[0], info, tasks.FAILED))
                self._update(a, key, tasks.FAILED, now, TaskStatus.SOURCE_AGENT,
                             TaskStatus.REASON_CONTAINER_LAUNCH_FAILED,
                             f"the agent emulator holds {self.max_tasks} tasks already")
                continue
            t = VTask(key[0], info, tasks.STAGING)
            self._add(a, t)
            self.counts["tasks_launched"] += 1
            self._update(a, key, tasks.STARTING, now)
            self._update(a, key, tasks.RUNNING, now)
            run_s = task_run_s(info, self.run_s)
            if math.isfinite(run_s):
                t.finish_at = now + run_s
                self._schedule(t.finish_at, "finish", a.name, key)

    def _add(self, a: VAgent, t: VTask) -> None:
        a.tasks[t.key] = t
        self.tasks += 1
        self._fw_tasks[t.framework_id] += 1

    def _forget(self, a: VAgent, key: Key) -> None:
        t = a.tasks.pop(key, None)
        a.ready.discard(key)
        if t is None:
            return
        self.tasks -= 1
        self._running -= t.state == tasks.RUNNING
        self._fw_tasks[t.framework_id] -= 1
        if self._fw_tasks[t.framework_id] <= 0:
            del self._fw_tasks[t.framework_id]
            self.frameworks.pop(t.framework_id, None)
            self._fw_wire.pop(t.framework_id, None)

    def _kill(self, a: VAgent, framework_id: str, task_id: str, now: float) -> None:
        t = a.tasks.get((framework_id, task_id))
        if t is None:
            self._unknown_task(a, framework_id, task_id, now,
                               "kill of a task unknown to this agent")
        elif not tasks.is_terminal(t.state):
            t.finish_at = None
            self.counts["tasks_killed"] += 1
            self._update(a, t.key, tasks.KILLED, now, message="killed by the framework")

    def _unknown_task(self, a: VAgent, framework_id: str, task_id: str, now: float,
                      why: str) -> None:
        """TASK_DROPPED for a task this agent does not run (an update stream only)."""
        if self.tasks >= self.max_tasks:
            self.counts["unknown_tasks_unanswered"] += 1
            return
        key = (framework_id, task_id)
        self._add(a, VTask(framework_id, common_pb2.TaskInfo(task_id=task_id), tasks.DROPPED,
                           reported=False))
        self._update(a, key, tasks.DROPPED, now, TaskStatus.SOURCE_AGENT,
                     TaskStatus.REASON_RECONCILIATION, why)

    def _finish(self, a: VAgent, key: Key, now: float) -> None:
        t = a.tasks.get(key)
        if t is None or t.finish_at is None or t.finish_at > now or tasks.is_terminal(t.state):
            return
        t.finish_at = None
        self.counts["tasks_finished"] += 1
        self._update(a, key, tasks.FINISHED, now, message="its scheduled run time ended")

    # -- status updates --------------------------------------------------------------------
    def _update(self, a: VAgent, key: Key, state: tasks.State, now: float,
                source: TaskStatus.Source.ValueType = TaskStatus.SOURCE_EXECUTOR,
                reason: TaskStatus.Reason.ValueType = TaskStatus.REASON_UNSPECIFIED,
                message: str = "") -> None:
        t = a.tasks[key]
        self._uuids += 1
        t.pending.append(TaskStatus(
            task_id=key[1], state=state, source=source, reason=reason, message=message,
            uuid=self.nonce + self._uuids.to_bytes(8, "big"), agent_id=a.agent_id,
            executor_id=executor_id(key[1]), timestamp_us=int(now * 1e6)))
        self._running += (state == tasks.RUNNING) - (t.state == tasks.RUNNING)
        t.state = state
        self.counts["updates_created"] += 1
        if len(t.pending) == 1:
            a.ready.add(key)
            self._dirty.add(a.name)

    def _acknowledge(self, a: VAgent, key: Key, uuid: bytes, now: float) -> None:
        t = a.tasks.get(key)
        if t is None or not t.pending or t.pending[0].uuid != uuid:
            self.counts["acks_stale"] += 1
            return
        self.counts["updates_acked"] += 1
        t.pending.popleft()
        if t.sends == 1 and t.sent_at is not None:
            a.retry.sample(now - t.sent_at)
        t.sends, t.sent_at, t.retry_at = 0, None, None
        if t.pending:
            a.ready.add(key)
            self._dirty.add(a.name)
        elif tasks.is_terminal(t.state):
            self._forget(a, key)
        elif t.reported and t.state != tasks.STARTING:  # RUNNING comes at once after it
            _wire(t, a.agent_id)  # settled: ready for the next re-registration

    def _flush(self, now: float) -> list[Command]:
        """One StatusUpdates call per registered agent with ready heads (MAX_BATCH each)."""
        out: list[Command] = []
        for name in sorted(self._dirty):
            a = self.agents[name]
            if a.reg is not Reg.REGISTERED:
                continue  # sent when it (re-)registers
            call = agent_pb2.AgentCall(agent_id=a.agent_id)
            batch = call.status_updates.updates
            for key in sorted(a.ready):
                t = a.tasks.get(key)
                if t is None or not t.pending:
                    a.ready.discard(key)
                    continue
                if len(batch) >= MAX_BATCH:
                    break
                a.ready.discard(key)
                head = t.pending[0]
                head.agent_id = a.agent_id
                batch.add(framework_id=t.framework_id).status.CopyFrom(head)
                t.sends += 1
                if t.sends == 1:
                    t.sent_at = now
                t.wait = a.retry.wait(t.sends, t.wait)
                t.retry_at = now + t.wait
                self._schedule(t.retry_at, "retry", name, key)
            if batch:
                self.counts["updates_sent"] += len(batch)
                self.counts["update_batches_sent"] += 1
                out.append(ToMaster(name, call))
        self._dirty = {n for n in self._dirty if self.agents[n].ready
                       and self.agents[n].reg is Reg.REGISTERED}
        return out

    # -- time ------------------------------------------------------------------------------
    def _schedule(self, at: float, kind: str, name: str, key: Key) -> None:
        self._seq += 1
        heapq.heappush(self._timers, (at, self._seq, kind, name, key))

    def _live(self, at: float, kind: str, name: str, key: Key) -> bool:
        """Whether a timer still stands (timers are dropped lazily, when they surface)."""
        a = self.agents[name]
        if kind == "register":
            return a.reg is Reg.REGISTERING and a.register_at == at
        t = a.tasks.get(key)
        if kind == "finish":
            return t is not None and t.finish_at == at
        return t is not None and t.retry_at == at and a.reg is Reg.REGISTERED

    def tick(self, now: float) -> list[Command]:
        out: list[Command] = []
        while self._timers and self._timers[0][0] <= now:
            at, _, kind, name, key = heapq.heappop(self._timers)
            if not self._live(at, kind, name, key):
                continue
            a = self.agents[name]
            if kind == "register":
                self.counts["registration_retries"] += 1
                out.append(self._register(a, now))
            elif kind == "finish":
                self._finish(a, key, now)
            else:
                self.counts["update_retries"] += 1
                a.retry.expired(now)
                a.ready.add(key)
                self._dirty.add(name)
        return out + self._flush(now)

    def next_deadline(self) -> float | None:
        """When tick() has work (None: only events make work); timers no longer standing
        are dropped on the way."""
        while self._timers:
            at, _, kind, name, key = self._timers[0]
            if self._live(at, kind, name, key):
                break
            heapq.heappop(self._timers)
        return self._timers[0][0] if self._timers else None

    # -- views -----------------------------------------------------------------------------
    def _set(self, a: VAgent, reg: Reg) -> None:
        self._states[a.reg.value] -= 1
        self._states[reg.value] += 1
        a.reg = reg

    def by_state(self) -> Counter[str]:
        """Virtual agents by registration state (kept as they change: read often)."""
        return +self._states

    def running(self) -> int:
        """Tasks whose latest state is TASK_RUNNING."""
        return self._running

    def validate(self) -> None:
        assert self.tasks == sum(len(a.tasks) for a in self.agents.values())
        assert self._fw_wire.keys() == self.frameworks.keys()
        assert len(self._registering) <= self.window
        assert +self._states == Counter(a.reg.value for a in self.agents.values())
        assert self._running == sum(t.state == tasks.RUNNING for a in self.agents.values()
                                    for t in a.tasks.values())
        assert self._n_registered == sum(a.reg is Reg.REGISTERED for a in self.agents.values())
        for a in self.agents.values():
            assert a.ready <= set(a.tasks), "ready heads belong to known tasks"
            for t in a.tasks.values():
                assert t.pending or not tasks.is_terminal(t.state), "an ended task is acked"
                if t.pending:
                    assert t.pending[-1].state == t.state
            assert (a.name in self._registering) == (a.reg is Reg.REGISTERING)


def executor_id(task_id: str) -> str:
    return f"{task_id}.emu"


def _wire(t: VTask, agent_id: str) -> bytes:
    """The task's part of its agent's Reregister, serialised (made again when its state
    or its agent's id changed)."""
    if t.wire_of != (t.state, agent_id):
        tid = t.info.task_id
        ex_id = executor_id(tid)
        part = agent_pb2.AgentCall.Reregister()
        rt = part.tasks.add(framework_id=t.framework_id, executor_id=ex_id)
        rt.task_info.CopyFrom(t.info)
        status = rt.latest_status
        status.task_id, status.state, status.agent_id = tid, t.state, agent_id
        status.executor_id = ex_id
        part.executors.add(executor_id=ex_id, framework_id=t.framework_id, agent_id=agent_id,
                           task_ids=[tid])
        t.wire, t.wire_of = part.SerializeToString(), (t.state, agent_id)
        t.digest = report_digest.item(t.framework_id, tid, t.state, ex_id)
    return t.wire


def task_run_s(info: common_pb2.TaskInfo, default: float) -> float:
    """The task's run time: its RUN_LABEL (a number of seconds; negative or "inf": until
    killed), else `default`."""
    raw = info.labels.get(RUN_LABEL)
    if raw is None:
        return default
    try:
        value = float(raw)
    except ValueError:
        return default
    return value if math.isfinite(value) and value >= 0 else math.inf
