"""The chaos job: one job submitted to the cluster's job runner (frameworks/jobrunner) at the
start of a campaign, and what the probe sees of its instances (`JobWatch`): whether its
framework is connected, how many instances run, and every instance lost (its container gone,
or its task ended, other than by the suite's own doing) or relaunched while the old task
still ran (two live tasks, or two running containers, of one instance at once).

`JobWatch` is fed facts (the master's /state, the leading runner's /jobs, Docker's running
task ids) with their time; it keeps no clock and opens no socket."""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

from frameworks.spec import ServiceSpec, instance_of

JOB_NAME = "chaos-job"
JOB_COMMAND = ["sleep", "86400"]
MAX_TASKS = 10_000  # job task ids remembered at most (a campaign relaunches a few)
MAX_EVENTS = 1_000
_TERMINAL = {"TASK_FINISHED", "TASK_FAILED", "TASK_KILLED", "TASK_LOST", "TASK_ERROR",
             "TASK_DROPPED", "TASK_GONE", "TASK_GONE_BY_OPERATOR", "TASK_UNKNOWN"}


def job_spec(instances: int, image: str) -> ServiceSpec:
    """The campaign's job: `instances` sleeping containers of the workload's image."""
    spec = ServiceSpec(name=JOB_NAME, image=image, instances=instances, cpus=0.1, mem=16,
                       command=list(JOB_COMMAND), kill_grace_s=0.5)
    spec.check()
    return spec


def submit(url: str, spec: ServiceSpec, timeout: float = 10.0) -> str:
    """Submit `spec` as a job to the cluster at `url` (OperatorCall.SubmitJob to the leading
    master); the master's answer."""
    from services.cli.client import find_leader, operator_call
    from services.cli.job import submit_call

    event = operator_call(find_leader(url, timeout), submit_call(spec), timeout)
    return str(event.done.message)


@dataclass
class JobTask:
    index: int
    agent: str = ""  # agent hostname
    executor: str = ""  # executor id, once an update named it
    ran: bool = False  # seen RUNNING (by the master) or in a running container
    container: bool = False  # in the last Docker listing
    ended: str = ""  # the terminal state the master showed
    lost: bool = False  # reported lost (once)


@dataclass
class JobView:
    """The job in one probe sample."""

    phase: str | None = None  # the leading runner's phase for the job (None: unreadable)
    connected: bool = False  # its framework subscribed to the master that answered
    running: int = 0  # instances (index < wanted) with a RUNNING task


@dataclass
class JobWatch:
    name: str = JOB_NAME
    instances: int = 0  # wanted (0: no job in this campaign)
    tasks: dict[str, JobTask] = field(default_factory=dict)
    excused: set[str] = field(default_factory=set)  # ended by the suite (executor killed)
    # (time, "lost" | "duplicate", detail)
    events: list[tuple[float, str, str]] = field(default_factory=list)
    _dups: set[frozenset[str]] = field(default_factory=set)

    def _event(self, at: float, kind: str, detail: str) -> None:
        if len(self.events) < MAX_EVENTS:
            self.events.append((at, kind, detail))

    def _task(self, task_id: str) -> JobTask | None:
        index, _ = instance_of(self.name, task_id)
        if index is None:
            return None
        rec = self.tasks.get(task_id)
        if rec is None and len(self.tasks) < MAX_TASKS:
            rec = self.tasks[task_id] = JobTask(index)
        return rec

    def _lost(self, task_id: str, rec: JobTask, at: float, why: str) -> None:
        if rec.ran and not rec.lost and task_id not in self.excused:
            rec.lost = True
            self._event(at, "lost", f"{task_id}: {why}")

    def _duplicate(self, ids: list[str], at: float, where: str) -> None:
        live = [t for t in ids if t.split(" ")[0] not in self.excused]
        bare = frozenset(t.split(" ")[0] for t in live)  # one relaunch, seen anywhere: once
        key = bare if len(bare) > 1 else frozenset(live)
        if len(live) > 1 and key not in self._dups:
            self._dups.add(key)
            self._event(at, "duplicate", f"{' and '.join(sorted(live))}: {where}")

    def observe_master(self, doc: dict[str, Any], phase: str | None, at: float) -> JobView:
        """The job in the leading master's /state `doc` (and the runner's `phase`)."""
        view = JobView(phase=phase)
        fids = {f["framework_info"].get("framework_id"): bool(f.get("connected"))
                for f in doc.get("frameworks", [])
                if f.get("framework_info", {}).get("name") == self.name}
        view.connected = any(fids.values())
        hosts = {a["agent_info"].get("agent_id"): a["agent_info"].get("hostname", "")
                 for a in doc.get("agents", [])}
        live: dict[int, set[str]] = defaultdict(set)  # index -> "task id (framework id)"
        running: set[int] = set()
        for t in doc.get("tasks", []):
            if t.get("framework_id") not in fids:
                continue
            task_id = t.get("task_info", {}).get("task_id", "")
            rec = self._task(task_id)
            if rec is None:
                continue
            status = t.get("status", {})
            state = status.get("state", "")
            rec.agent = hosts.get(t.get("agent_id"), rec.agent)
            rec.executor = status.get("executor_id") or rec.executor
            if state in _TERMINAL:
                if not rec.ended:
                    rec.ended = state
                    self._lost(task_id, rec, at,
                               f"{state} {status.get('message', '')!r}".rstrip())
                continue
            live[rec.index].add(f"{task_id} ({t.get('framework_id')})")
            if state == "TASK_RUNNING":
                rec.ran = True
                if rec.index < self.instances:
                    running.add(rec.index)
        for index, tasks in live.items():
            self._duplicate(sorted(tasks), at, f"instance {index} live twice in the master's "
                                               f"state")
        view.running = len(running)
        return view

    def observe_containers(self, task_ids: list[str], at: float) -> None:
        """Docker's running task containers (one successful listing: every task id, one
        per container)."""
        now: dict[str, int] = defaultdict(int)
        for task_id in task_ids:
            if self._task(task_id) is not None:
                now[task_id] += 1
        by_index: dict[int, list[str]] = defaultdict(list)
        for task_id, n in now.items():
            by_index[self.tasks[task_id].index] += [task_id] if n == 1 else [
                f"{task_id} (container {i + 1})" for i in range(n)]
        for index, ids in by_index.items():
            self._duplicate(ids, at, f"instance {index} in two running containers")
        for task_id, rec in self.tasks.items():
            if rec.container and task_id not in now:
                self._lost(task_id, rec, at, "its container is gone")
            rec.container = task_id in now
            rec.ran = rec.ran or rec.container

    def excuse(self, host: str, executor_ids: list[str]) -> set[str]:
        """Job tasks on an executor the suite kills (on `host`, serving `executor_ids`;
        one whose executor is unknown yet, on that host): they end by the suite's doing."""
        hit = {t for t, r in self.tasks.items() if not r.ended and (
            r.executor in executor_ids or (not r.executor and r.agent == host))}
        self.excused |= hit
        return hit

    def missing(self, view: JobView | None) -> str:
        """'' when the job is back: its runner says subscribed, its framework is connected,
        every instance runs."""
        if not self.instances:
            return ""
        if view is None or view.phase is None:
            return "no leading job runner answering"
        if view.phase != "subscribed":
            return f"the job runner's job is {view.phase or 'not started'}"
        if not view.connected:
            return "the job's framework not connected"
        if view.running < self.instances:
            return f"job at {view.running}/{self.instances} running"
        return ""
