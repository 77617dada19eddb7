"""The job runner's pure core: which jobs' service frameworks this process runs, decided from
what the master's state stream shows (jobs/<name>, the frameworks labelled offerbus.job, their
tasks) and from the schedulers it runs. Events in (leading, the stream, a scheduler
subscribed or ended, the time), commands out (Start, Update, Stop). No sockets, no clock.

A job's runner moves through one table (`_MOVES`): STARTING (its scheduler was started and
has not subscribed yet) -> SUBSCRIBED -> ENDED (the master removed its framework, or refused
it; restarted after a back-off as a new framework) -> STARTING. A job removed from the
stream stops its runner; stepping down stops every runner with failover (the tasks keep
running; the next leader's schedulers take them back)."""

from __future__ import annotations

import enum
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from google.protobuf.json_format import MessageToDict

from frameworks.spec import SPEC_LABEL, ServiceSpec, instance_of, spec_from_doc
from schemas import bus_pb2, common_pb2, state_pb2
from services import tasks as task_states
from services.master.records import JOB_LABEL

MAX_RUNNERS = 256  # schedulers one runner keeps (the master keeps at most as many jobs)
RESTART_FIRST_S, RESTART_MAX_S = 1.0, 30.0  # back-off of a job whose framework ended


class Phase(enum.Enum):
    STARTING = "starting"
    SUBSCRIBED = "subscribed"
    ENDED = "ended"


_MOVES = {(None, Phase.STARTING), (Phase.STARTING, Phase.SUBSCRIBED),
          (Phase.STARTING, Phase.ENDED), (Phase.SUBSCRIBED, Phase.ENDED),
          (Phase.ENDED, Phase.STARTING), (Phase.SUBSCRIBED, Phase.SUBSCRIBED)}


class IllegalMove(Exception):
    pass


@dataclass(frozen=True)
class Start:
    """Run the job's scheduler: failing over to `framework_id` (its tasks given as a
    recovery document, as ServiceScheduler.recover reads) or, with "", as a new framework."""

    name: str
    spec: ServiceSpec
    version: int
    framework_id: str
    recovered: dict[str, Any]


@dataclass(frozen=True)
class Update:
    """A new version of a running job: its scheduler takes the new spec (its instances at
    once; other fields by a rolling update)."""

    name: str
    spec: ServiceSpec
    version: int


@dataclass(frozen=True)
class Stop:
    """Stop the job's scheduler: `failover` keeps its tasks running (stepping down); without
    it the framework is torn down (the job was removed)."""

    name: str
    failover: bool


Command = Start | Update | Stop


@dataclass
class Runner:
    version: int
    phase: Phase | None = None
    framework_id: str = ""
    failures: int = 0  # ends in a row
    not_before: float = 0.0
    why: str = ""  # the last end's message


@dataclass
class _Job:
    version: int
    spec: ServiceSpec | None
    error: str = ""  # why its spec cannot run here


@dataclass
class JobRunnerCore:
    principal: str = ""  # the frameworks this runner registers carry it
    leading: bool = False
    paused: bool = False  # the reign is in doubt (its ZooKeeper session): start nothing
    synced: bool = False  # a whole snapshot of the stream was applied
    jobs: dict[str, _Job] = field(default_factory=dict)
    runners: dict[str, Runner] = field(default_factory=dict)
    # Job frameworks the master knows: framework id -> (job name, registered_at_us)
    frameworks: dict[str, tuple[str, int]] = field(default_factory=dict)
    # Their live tasks: framework id -> task id -> (agent id, state name, spec digest,
    # healthy: None when never reported)
    tasks: dict[str, dict[str, tuple[str, str, str, bool | None]]] = field(
        default_factory=dict)
    now: float = 0.0

    # -- events ------------------------------------------------------------------------------
    def lead(self, now: float) -> list[Command]:
        self.now, self.leading = now, True
        return self._reconcile()

    def pause(self) -> list[Command]:
        """Running schedulers go on (they talk to the master, not to ZooKeeper); nothing is
        started, restarted or updated until `resume` (another runner may lead by then); a
        removed job's scheduler is still stopped."""
        self.paused = True
        return []

    def resume(self, now: float) -> list[Command]:
        self.now, self.paused = now, False
        return self._reconcile()

    def step_down(self) -> list[Command]:
        out: list[Command] = [Stop(name, failover=True) for name in sorted(self.runners)]
        self.leading, self.synced, self.paused = False, False, False
        self.runners.clear()
        return out

    def stream(self, entries: Iterable[bus_pb2.StateEntry], now: float, *,
               reset: bool = False) -> list[Command]:
        """The stream's entries: a delta, or (`reset`) the whole state."""
        self.now = now
        if reset:
            self.jobs.clear()
            self.frameworks.clear()
            self.tasks.clear()
            self.synced = True
        for entry in entries:
            self._apply(entry)
        return self._reconcile()

    def subscribed(self, name: str, framework_id: str, now: float) -> list[Command]:
        self.now = now
        runner = self.runners.get(name)
        if runner is not None and runner.phase in (Phase.STARTING, Phase.SUBSCRIBED):
            self._move(runner, Phase.SUBSCRIBED)
            runner.framework_id = framework_id
            runner.failures = 0
        return []

    def ended(self, name: str, why: str, now: float) -> list[Command]:
        """The job's scheduler stopped by itself (its framework removed or refused)."""
        self.now = now
        runner = self.runners.get(name)
        if runner is None or runner.phase is Phase.ENDED:
            return []
        self._move(runner, Phase.ENDED)
        runner.failures += 1
        runner.why = why
        runner.framework_id = ""
        runner.not_before = now + min(RESTART_MAX_S,
                                      RESTART_FIRST_S * 2 ** (runner.failures - 1))
        return [Stop(name, failover=True)]  # the shell joins the ended driver

    def tick(self, now: float) -> list[Command]:
        self.now = now
        return self._reconcile()

    def next_deadline(self) -> float | None:
        if self.paused:
            return None
        times = [r.not_before for r in self.runners.values() if r.phase is Phase.ENDED]
        return min(times) if times else None

    # -- the stream ---------------------------------------------------------------------------
    def _apply(self, entry: bus_pb2.StateEntry) -> None:
        kind, _, rest = entry.key.partition("/")
        value = entry.value
        if kind == "jobs":
            if entry.deleted or value.WhichOneof("kind") != "job":
                self.jobs.pop(rest, None)
            else:
                self.jobs[rest] = _parse_job(value.job)
        elif kind == "frameworks":
            info = value.framework.framework_info
            name = info.labels.get(JOB_LABEL, "") if not entry.deleted else ""
            if name and (not self.principal or info.principal == self.principal):
                self.frameworks[rest] = (name, value.framework.registered_at_us)
            else:
                self.frameworks.pop(rest, None)
                self.tasks.pop(rest, None)
        elif kind == "tasks":
            fid, _, tid = rest.partition("/")
            live = not entry.deleted and value.WhichOneof("kind") == "task" \
                and not task_states.is_terminal(value.task.status.state)
            if live and fid in self.frameworks:
                self.tasks.setdefault(fid, {})[tid] = (
                    value.task.agent_id, common_pb2.TaskState.Name(value.task.status.state),
                    value.task.task_info.labels.get(SPEC_LABEL, ""),
                    value.task.status.healthy if value.task.status.HasField("healthy")
                    else None)
            elif fid in self.tasks:
                self.tasks[fid].pop(tid, None)

    def framework_of(self, name: str) -> str:
        """The framework the master knows for job `name` (the latest registered), or ""."""
        ids = [(at, fid) for fid, (job, at) in self.frameworks.items() if job == name]
        return max(ids)[1] if ids else ""

    def recovered(self, name: str, framework_id: str) -> dict[str, Any]:
        """What ServiceScheduler.recover reads: the framework id and each instance's task."""
        tasks: dict[str, dict[str, Any]] = {}
        for tid, (agent_id, state, digest, healthy) in sorted(
                self.tasks.get(framework_id, {}).items()):
            index, _ = instance_of(name, tid)
            if index is not None:
                tasks[str(index)] = {"task_id": tid, "agent_id": agent_id, "state": state,
                                     "digest": digest, "healthy": healthy}
        return {"framework_id": framework_id, "tasks": tasks}

    # -- decisions -------------------------------------------------------------------------
    def _reconcile(self) -> list[Command]:
        if not self.leading or not self.synced:
            return []
        out: list[Command] = []
        for name in sorted(set(self.runners) - set(self.jobs)):  # removed jobs: even paused
            del self.runners[name]
            out.append(Stop(name, failover=False))
        if self.paused:
            return out
        for name, job in sorted(self.jobs.items()):
            if job.spec is None:
                continue
            runner = self.runners.get(name)
            if runner is None:
                if len(self.runners) >= MAX_RUNNERS:
                    job.error = f"this runner keeps at most {MAX_RUNNERS} jobs"
                    continue
                runner = self.runners[name] = Runner(job.version)
                out.append(self._start(name, runner, job.spec))
            elif runner.phase is Phase.ENDED:
                if self.now >= runner.not_before:
                    runner.version = job.version
                    out.append(self._start(name, runner, job.spec))
            elif runner.version != job.version:
                runner.version = job.version
                out.append(Update(name, job.spec, job.version))
        return out

    def _start(self, name: str, runner: Runner, spec: ServiceSpec) -> Start:
        self._move(runner, Phase.STARTING)
        fid = self.framework_of(name)
        return Start(name, spec, runner.version, fid, self.recovered(name, fid) if fid else {})

    @staticmethod
    def _move(runner: Runner, to: Phase) -> None:
        if (runner.phase, to) not in _MOVES:
            raise IllegalMove(f"{runner.phase} -> {to}")
        runner.phase = to

    def validate(self) -> None:
        assert not self.runners or (self.leading and self.synced), "runners while not leading"
        assert set(self.runners) <= set(self.jobs), "a runner without its job"
        assert len(self.runners) <= MAX_RUNNERS
        for runner in self.runners.values():
            assert runner.phase is not None
            assert runner.phase is not Phase.SUBSCRIBED or runner.framework_id
        assert set(self.tasks) <= set(self.frameworks), "tasks of an unknown framework"

    def view(self) -> dict[str, Any]:
        """For /jobs: every job, its runner's phase and last end."""
        return {name: {"version": job.version, "error": job.error,
                       **({"phase": r.phase.value if r.phase else "", "framework_id":
                           r.framework_id, "restarts": r.failures, "last_end": r.why}
                          if (r := self.runners.get(name)) is not None else {})}
                for name, job in sorted(self.jobs.items())}


def _parse_job(rec: state_pb2.JobRecord) -> _Job:
    try:
        return _Job(rec.version, spec_from_doc(MessageToDict(rec.spec)))
    except ValueError as exc:
        return _Job(rec.version, None, f"its spec cannot run: {exc}")
