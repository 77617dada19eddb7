"""What a chaos campaign sees of the cluster, sampled on one clock (time.monotonic()): the
election (who leads each role), every master's /state (who answers as leader, at which
epoch), the leader's agents and tasks, and Docker's running task containers. Checks the
invariants on each sample: two masters leading in one epoch, an agent over-allocated, one
task id in two running containers."""

from __future__ import annotations

import contextlib
import json
import threading
import time
import urllib.error
import urllib.request
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

from chaos.fleet import ROLES, Fleet
from chaos.jobwatch import JobView, JobWatch
from schemas import common_pb2
from services import tasks as ts

MAX_SAMPLES = 200_000
INTERVAL_S = 0.1
DOCKER_EVERY_S = 1.0


@dataclass
class Sample:
    started: float  # when the sample began (every fact in it is from later)
    at: float
    leaders: dict[str, str | None]  # role -> member id, by the election
    serving: str | None  # the master answering /state as leader
    epoch: int
    registered: set[str]  # agent hostnames
    not_registered: set[str]
    running_tasks: int  # by the master
    endpoints: dict[str, str]  # agent hostname -> its endpoint (a new one per incarnation)
    job: JobView | None = None  # the chaos job (None: the campaign runs none)


@dataclass
class Probe:
    fleet: Fleet
    samples: list[Sample] = field(default_factory=list)
    containers: list[tuple[float, int]] = field(default_factory=list)  # (t, running)
    violations: list[dict[str, Any]] = field(default_factory=list)
    duplicates: dict[str, float] = field(default_factory=dict)  # task id -> first seen
    lock: threading.Lock = field(default_factory=threading.Lock)
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None
    _http: dict[str, str] = field(default_factory=dict)  # master id -> http endpoint
    job: JobWatch = field(default_factory=JobWatch)  # guarded by `lock` too

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="chaos-probe", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(10)

    def latest(self) -> Sample | None:
        with self.lock:
            return self.samples[-1] if self.samples else None

    def _violation(self, kind: str, at: float, detail: str) -> None:
        with self.lock:
            if len(self.violations) < 1000:
                self.violations.append({"kind": kind, "at": at, "detail": detail})

    def _run(self) -> None:
        from services.cli.client import ElectionView

        next_docker = 0.0
        docker_client = _docker()
        while not self._stop.is_set():
            try:
                with ElectionView(self.fleet.url, timeout=5.0) as election:
                    while not self._stop.is_set():
                        t0 = time.monotonic()
                        self._sample(election, t0)
                        if docker_client is not None and t0 >= next_docker:
                            next_docker = t0 + DOCKER_EVERY_S
                            self._docker(docker_client, t0)
                        self._stop.wait(max(0.0, INTERVAL_S - (time.monotonic() - t0)))
            except Exception:  # ZooKeeper unreachable a while: sample again shortly
                self._stop.wait(0.5)

    def _sample(self, election: Any, started: float) -> None:
        leaders: dict[str, str | None] = {}
        runner_http: str | None = None
        for role in ROLES:
            members = election.members(role) or []
            leaders[role] = members[0].member_id if members else None
            if role == "jobs" and members:
                runner_http = members[0].endpoints.get("http")
            if role == "master":
                for m in members:
                    if "http" in m.endpoints:
                        self._http[m.member_id] = m.endpoints["http"]
        answering: list[tuple[str, int, dict[str, Any]]] = []
        for member, http in list(self._http.items()):
            proc = self.fleet.procs.get(member)
            if proc is None or not proc.alive() or proc.stopped:
                continue
            doc = _get(f"{http}/state", 0.5)
            if doc is not None:
                answering.append((member, int(doc.get("epoch", 0)), doc))
        at = time.monotonic()
        epochs: dict[int, list[str]] = defaultdict(list)
        for member, epoch, _ in answering:
            epochs[epoch].append(member)
        for epoch, who in epochs.items():
            if len(who) > 1:
                self._violation("two leaders in one epoch", at, f"epoch {epoch}: {who}")
        serving, epoch, doc = max(answering, key=lambda a: a[1]) if answering else (None, 0, {})
        registered: set[str] = set()
        other: set[str] = set()
        endpoints: dict[str, str] = {}
        for agent in doc.get("agents", []):
            host = agent["agent_info"]["hostname"]
            endpoints[host] = agent["agent_info"].get("endpoint", "")
            (registered if agent.get("status") == "AGENT_STATUS_REGISTERED" else other).add(host)
        running = 0
        if doc:
            running = self._check_allocation(doc, at)
        job = None
        if self.job.instances:
            phase = self._job_phase(runner_http, leaders.get("jobs"))
            with self.lock:
                job = self.job.observe_master(doc, phase, at)
        sample = Sample(started, at, leaders, serving, epoch, registered, other, running,
                        endpoints, job)
        with self.lock:
            self.samples.append(sample)
            del self.samples[:-MAX_SAMPLES]

    def _job_phase(self, http: str | None, leader: str | None) -> str | None:
        """The leading job runner's phase for the job ("" if it has none; None when no
        runner answers as leader)."""
        proc = self.fleet.procs.get(leader or "")
        if http is None or proc is None or not proc.alive() or proc.stopped:
            return None
        doc = _get(f"{http}/jobs", 0.5)
        if doc is None or not doc.get("leading"):
            return None
        return str(doc.get("jobs", {}).get(self.job.name, {}).get("phase", ""))

    def _check_allocation(self, doc: dict[str, Any], at: float) -> int:
        """Running tasks by the master; a violation when an agent's live tasks use more
        cpus or mem than it has."""
        total: dict[str, dict[str, float]] = {}
        for agent in doc.get("agents", []):
            info = agent["agent_info"]
            total[info["agent_id"]] = {r["name"]: float(r.get("scalar", 0))
                                       for r in info.get("resources", []) if "scalar" in r}
        used: dict[str, dict[str, float]] = defaultdict(lambda: defaultdict(float))
        running = 0
        for task in doc.get("tasks", []):
            name = task.get("status", {}).get("state", "")
            if name == "TASK_RUNNING":
                running += 1
            if name in _TERMINAL_NAMES:
                continue
            for r in task.get("task_info", {}).get("resources", []):
                if "scalar" in r:
                    used[task.get("agent_id", "")][r["name"]] += float(r["scalar"])
        for agent_id, res in used.items():
            for name, amount in res.items():
                have = total.get(agent_id, {}).get(name)
                if have is not None and amount > have + 1e-6:
                    self._violation("agent over-allocated", at,
                                    f"{agent_id}: {name} {amount:g} > {have:g}")
        return running

    def _docker(self, client: Any, t: float) -> None:
        from services.executor.runtime import LABEL_CLUSTER, LABEL_TASK

        cid = self.fleet.cluster_id
        if not cid:
            return
        try:
            listed = client.api.containers(filters={"label": f"{LABEL_CLUSTER}={cid}",
                                                    "status": "running"})
        except Exception:
            return
        by_task: dict[str, int] = defaultdict(int)
        for c in listed:
            by_task[(c.get("Labels") or {}).get(LABEL_TASK, "")] += 1
        with self.lock:
            if self.job.instances:
                self.job.observe_containers(
                    [(c.get("Labels") or {}).get(LABEL_TASK, "") for c in listed], t)
            self.containers.append((t, len(listed)))
            del self.containers[:-MAX_SAMPLES]
            for task_id, n in by_task.items():
                if n > 1 and task_id not in self.duplicates:
                    self.duplicates[task_id] = t


_TERMINAL_NAMES = {common_pb2.TaskState.Name(s) for s in ts.TERMINAL}


def _get(url: str, timeout: float) -> dict[str, Any] | None:
    """The JSON at `url` when it answers 200 (a standby answers 503), else None."""
    try:
        with urllib.request.urlopen(url, timeout=timeout) as r:
            return dict(json.loads(r.read()))
    except (urllib.error.URLError, OSError, ValueError):
        return None


def _docker() -> Any:
    with contextlib.suppress(Exception):
        import docker

        return docker.from_env(timeout=10)
    return None
