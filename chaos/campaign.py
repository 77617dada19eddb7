"""A chaos campaign: bring up a fleet, submit the chaos job to its job runner, start the
workload, play the scenario's faults one at a time (apply, repair after its duration, wait
for recovery, settle) and measure each one on one clock: detection time, MTTR, service and
job tasks lost, status updates lost or wrong, duplicate launches and invariant violations.
Returns (and writes) the JSON report."""

from __future__ import annotations

import contextlib
import json
import os
import random
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from chaos import jobwatch
from chaos.fleet import Fleet
from chaos.probe import Probe, Sample
from chaos.proxy import Impairment
from chaos.scenario import DEGRADE, Fault, Scenario
from chaos.workload import IMAGE, Workload, check_short_tasks
from chaos.workload import start as start_workload
from services import tasks as ts

POLL_S = 0.05
MAX_WAITED = 30  # changes of what a recovery waits on, kept per fault


@dataclass
class Outcome:
    index: int
    label: str
    target: str  # the process (or agent) the fault hit
    at: float  # when it was applied (seconds since the campaign's start)
    repaired_at: float | None = None
    detected_s: float | None = None
    mttr_s: float | None = None  # None: not recovered within the scenario's deadline
    tasks_lost: list[str] = field(default_factory=list)
    updates_lost: list[str] = field(default_factory=list)
    updates_wrong: list[str] = field(default_factory=list)
    duplicates: list[str] = field(default_factory=list)
    violations: list[dict[str, Any]] = field(default_factory=list)
    waiting_for: str = ""  # what was still missing when recovery timed out
    # what recovery waited on, as it changed: (seconds since the fault, what was missing)
    waited: list[tuple[float, str]] = field(default_factory=list)


class Campaign:
    def __init__(self, scenario: Scenario, run_dir: Path,
                 progress: Callable[[int, int, str], None] | None = None) -> None:
        self.s = scenario
        self.run_dir = Path(run_dir)
        self.progress = progress or (lambda done, total, msg: None)
        self.rng = random.Random(scenario.seed)
        self.fleet = Fleet(self.run_dir / "fleet", scenario.fleet)
        from services.cli.cluster import agent_resources
        from services.resources import Resources

        self.work = Workload(instances=scenario.instances,
                             short_interval=scenario.short_interval)
        self.work.totals = {  # what each agent has: offers never exceed it
            f"agent-{i}": Resources.parse(agent_resources(scenario.fleet.agent_resources,
                                                          i - 1)).quantities()
            for i in range(1, scenario.fleet.agents + 1)}
        self.probe = Probe(self.fleet)
        self.probe.job.instances = scenario.job_instances if scenario.fleet.jobs else 0
        self.t0 = 0.0
        self.outcomes: list[Outcome] = []
        self._old_endpoint: str | None = None
        self._reborn: float | None = None
        self._must_end: set[str] = set()  # tasks of a killed executor: to be told they ended
        self.events: list[dict[str, Any]] = []

    # -- the run ----------------------------------------------------------------------------------
    def run(self) -> dict[str, Any]:
        total = len(self.s.faults)
        self.progress(0, total, "starting the fleet")
        self.fleet.start(progress=lambda msg: self.progress(0, total, msg))
        driver = None
        try:
            self.t0 = time.monotonic()
            self.probe.start()
            if self.probe.job.instances:
                self.progress(0, total, "submitting the chaos job")
                jobwatch.submit(self.fleet.url, jobwatch.job_spec(self.probe.job.instances,
                                                                  IMAGE))
            driver = start_workload(self.fleet.url, self.work)
            self.progress(0, total, "waiting for the workload")
            self._wait_steady(time.monotonic(), None, self.s.recovery_timeout * 2)
            for i, fault in enumerate(self.s.faults):
                self.progress(i, total, fault.label())
                outcome = self._play(i, fault)
                self.outcomes.append(outcome)
                mttr = "-" if outcome.mttr_s is None else f"{outcome.mttr_s:.2f}"
                self.progress(i + 1, total, f"{fault.label()} on {outcome.target}: MTTR {mttr} s")
                if outcome.mttr_s is None:
                    self.progress(i + 1, total, f"{fault.label()}: not recovered "
                                                f"({outcome.waiting_for})")
                    break
                self._settle()
            self.progress(total, total, "draining the last updates")
            self.work.running = False
            end = time.monotonic()
            self._wait(lambda: not self._short_pending(end), self.s.drain)
            self._attribute_updates(end)
        finally:
            if driver is not None:
                with contextlib.suppress(Exception):
                    driver.stop()
            self.probe.stop()
            self.fleet.stop()
        return self.report()

    def _short_pending(self, before: float) -> bool:
        return bool(check_short_tasks(self.work, before)["lost"])

    def _settle(self) -> None:
        end = time.monotonic() + self.s.settle
        while time.monotonic() < end:
            time.sleep(POLL_S)  # the scenario's steady time between faults

    def _wait(self, predicate: Callable[[], bool], timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if predicate():
                return True
            time.sleep(POLL_S)  # polling a condition with a deadline
        return predicate()

    # -- one fault ------------------------------------------------------------------------------
    def _resolve(self, fault: Fault) -> str:
        """The process (or agent) `fault` hits now."""
        t = fault.target
        if t.startswith("leader:") or t.startswith("standby:"):
            kind, role = t.split(":")
            sample = self._fresh_sample(time.monotonic())
            leader = sample.leaders.get(role) if sample else None
            if kind == "leader":
                if leader is None:
                    raise RuntimeError(f"no {role} leader to hit")
                return leader
            others = sorted(n for n in self.fleet.members(role) if n != leader)
            return self.rng.choice(others)
        if t == "agent":
            return self.rng.choice(sorted(self.fleet.members("agent")))
        if t == "zk":
            return self.rng.choice([f"zk-{i}" for i in range(1, len(self.fleet.zookeepers) + 1)])
        if t == "zk:leader":
            return self.fleet.zk_leader() or "zk-1"
        if t == "executor":
            pids = sorted(self.fleet.executors().items(), key=lambda kv: sorted(kv[1][1]))
            if not pids:
                raise RuntimeError("no executor to hit")
            pid, served = pids[self.rng.randrange(len(pids))]
            self._excuse_executor(pid, served)
            return f"executor:{pid}"
        return t

    def _excuse_executor(self, pid: int, served: tuple[str, list[str]]) -> None:
        """The tasks executor process `pid` serves (on host `served[0]`: executor ids
        `served[1]`) end with it by the suite's doing: they must be told so, not run on."""
        host, ids = served
        w = self.work
        with w.lock:
            live = [t for t, s in w.states.items() if s not in ts.TERMINAL]
            self._must_end |= {t for t in live if w.executor_of.get(t) in ids}
            # launched there with no word yet: may be starting in it, so may end with it
            w.excused |= self._must_end | {t for t in live if w.where.get(t) == host
                                           and t not in w.executor_of}
        with self.probe.lock:  # the job's instances there end too (relaunched)
            self.probe.job.excuse(host, ids)

    def _apply(self, fault: Fault, victim: str) -> None:
        if victim.startswith("executor:"):
            pid = int(victim.split(":")[1])
            # Again, just before the kill: what it serves now (an executor host takes on
            # its framework's new executors, e.g. a task launched while the campaign sampled
            # the cluster after choosing it).
            served = self.fleet.executors().get(pid)
            if served is not None:
                self._excuse_executor(pid, served)
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        elif fault.kind == "partition":
            self.fleet.partition(victim, fault.peer, fault.one_way)
        elif fault.kind in DEGRADE:
            imp = Impairment(fault.delay_ms, fault.jitter_ms, fault.stall_p, fault.stall_ms,
                             fault.reset_p)
            self.fleet.degrade(victim, fault.peer, imp, self.rng.randrange(2**31))
        else:
            self.fleet.signal(victim, int(getattr(signal, fault.signal)))

    def _repair(self, fault: Fault, victim: str) -> None:
        if victim.startswith("executor:"):
            return  # the agent starts a new executor for the next task
        if fault.kind == "partition":
            self.fleet.heal(victim)
        elif fault.kind in DEGRADE:
            self.fleet.restore(victim)
        elif fault.signal == "SIGSTOP":
            self.fleet.signal(victim, signal.SIGCONT)
        else:
            self.fleet.restart(victim)

    def _play(self, index: int, fault: Fault) -> Outcome:
        self._must_end = set()
        victim = self._resolve(fault)
        before = self._fresh_sample(time.monotonic())
        running_before = {t for t in self.work.slots.values()
                          if self.work.states.get(t) == ts.RUNNING}
        violations_before = len(self.probe.violations)
        offered_before = len(self.work.violations)
        start = time.monotonic()
        self._apply(fault, victim)
        out = Outcome(index, fault.label(), victim, round(start - self.t0, 3))
        self.events.append({"t": out.at, "fault": fault.label(), "target": victim})
        agent_hit = victim.startswith("agent-")
        # The fault takes a leader out of its election (its session ends): recovered only
        # once another leads. A leader cut from a peer but not from ZooKeeper keeps leading.
        unseats = fault.target.startswith("leader:") and fault.kind not in DEGRADE and (
            fault.peer == "zk" if fault.kind == "partition" else
            fault.signal != "SIGSTOP" or fault.duration > self.s.fleet.session_timeout)
        # A killed agent is back once the master shows its new incarnation (a new endpoint)
        # and offers come after that: offers of the dead one flow until it is detected.
        self._old_endpoint = (before.endpoints.get(victim) if before and agent_hit
                              and fault.kind == "signal" and fault.signal != "SIGSTOP" else None)
        self._reborn = None
        repaired: float | None = None
        deadline = start + fault.duration + self.s.recovery_timeout
        while True:
            now = time.monotonic()
            if repaired is None and now >= start + fault.duration:
                self._repair(fault, victim)
                repaired = time.monotonic()
                out.repaired_at = round(repaired - self.t0, 3)
            if out.detected_s is None:
                seen = self._detected(fault, victim, before, start)
                if seen is not None:
                    out.detected_s = round(seen - start, 3)
            waits_repair = agent_hit or (fault.kind in ("partition", *DEGRADE)
                                         and fault.peer != "zk")
            since = repaired if waits_repair and repaired is not None else start
            missing = self._missing(start, since, victim if agent_hit else None) \
                if (repaired is not None or not waits_repair) else "the fault still holds"
            if unseats and not missing:
                # A hit leader is replaced (offers in flight before the fault still arrive;
                # a new job runner: _missing saw it serve the job, connected, all running)
                if out.detected_s is None:
                    missing = f"{victim} still leads"
                elif fault.target != "leader:jobs" and \
                        not self.work.any_offer_since(start + out.detected_s):
                    missing = "no offer since the new leader"
            if missing and (not out.waited or out.waited[-1][1] != missing) \
                    and len(out.waited) < MAX_WAITED:
                out.waited.append((round(now - start, 3), missing))
            if not missing:
                out.mttr_s = round(time.monotonic() - start, 3)
                break
            if now > deadline:
                out.waiting_for = missing
                break
            time.sleep(POLL_S)  # polling recovery with a deadline
        if repaired is None:
            self._repair(fault, victim)
            out.repaired_at = round(time.monotonic() - self.t0, 3)
        with self.work.lock:
            out.tasks_lost = sorted(
                t for t in running_before if ts.is_terminal(self.work.states.get(t, 0))  # type: ignore[arg-type]
                and t not in self.work.killed_by_us and t not in self.work.excused)
        with self.probe.lock:
            out.violations = self.probe.violations[violations_before:]
        with self.work.lock:
            out.violations += self.work.violations[offered_before:]
        return out

    def _fresh_sample(self, after: float, timeout: float = 10.0) -> Sample | None:
        """The first probe sample begun after `after` (None if none comes in `timeout`)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            sample = self.probe.latest()
            if sample is not None and sample.started > after:
                return sample
            time.sleep(POLL_S)  # waiting for the probe's next sample
        return None

    def _detected(self, fault: Fault, victim: str, before: Sample | None,
                  start: float) -> float | None:
        """When the cluster showed it noticed: another leader for a hit leader, the master
        not counting a hit agent registered, another ZooKeeper leader."""
        sample = self.probe.latest()
        if sample is None or sample.started <= start:
            return None
        if fault.target.startswith("leader:"):
            role = fault.target.split(":")[1]
            leader = sample.leaders.get(role)
            return sample.at if leader is not None and leader != victim else None
        if victim.startswith("agent-"):
            return sample.at if victim in sample.not_registered else None
        if self._must_end:  # the framework told a task of the killed executor ended
            with self.work.lock:
                ends = [h[0] for t in self._must_end for h in self.work.history.get(t, [])
                        if h[0] > start and h[1] in ts.TERMINAL]
            return min(ends) if ends else None
        if fault.target == "zk:leader":
            now_leader = self.fleet.zk_leader()
            return time.monotonic() if now_leader not in (None, victim) else None
        return None

    def _missing(self, start: float, since: float, agent: str | None) -> str:
        """'' when the cluster is back: a master serving, every role led, every agent
        registered, offers flowing (from the hit agent too), the service at M running."""
        sample = self._fresh_sample(start, timeout=1.0)
        if sample is None:
            return "no probe sample"
        if sample.serving is None:
            return "no master serving"
        unled = [r for r in self.s.fleet.elected() if sample.leaders.get(r) is None]
        if unled:
            return f"no leader for {unled}"
        want = set(self.fleet.members("agent"))
        if not want <= sample.registered:
            return f"agents not registered: {sorted(want - sample.registered)}"
        if agent is not None and self._old_endpoint is not None:
            if sample.endpoints.get(agent, self._old_endpoint) == self._old_endpoint:
                return f"{agent} not re-registered since its restart"
            if self._reborn is None:
                self._reborn = sample.at
            since = max(since, self._reborn)
        with self.work.lock:
            running_on = sorted(t for t in self._must_end
                                if self.work.states.get(t) not in ts.TERMINAL)
        if running_on:
            return f"not told that {running_on[:3]} ended with their executor"
        if not self.work.any_offer_since(since):
            return "no offer since the fault"
        if agent is not None and not self.work.offered_since(agent, since):
            return f"no offer from {agent} since its repair"
        running = self.work.running_service()
        if running < self.work.instances:
            return f"service at {running}/{self.work.instances} running"
        with self.probe.lock:
            return self.probe.job.missing(sample.job)

    def _wait_steady(self, start: float, agent: str | None, timeout: float) -> None:
        self._old_endpoint = None
        deadline = time.monotonic() + timeout
        while (missing := self._missing(start, start, agent)):
            if time.monotonic() > deadline:
                raise RuntimeError(f"the fleet never reached its steady state: {missing}")
            time.sleep(POLL_S)  # polling the steady state with a deadline

    def _attribute_updates(self, end: float) -> None:
        """Short tasks whose updates were lost or wrong, and duplicate launches, charged to
        the fault whose window (its start to the next one's) saw them launched."""
        result = check_short_tasks(self.work, end)
        self.not_started = result["not_started"]
        self.reconciled_only = result["reconciled_only"]
        starts = [self.t0 + o.at for o in self.outcomes]

        def owner(t: float) -> Outcome | None:
            idx = max((i for i, s in enumerate(starts) if s <= t), default=None)
            return None if idx is None else self.outcomes[idx]

        self.unattributed: dict[str, list[str]] = {"updates_lost": [], "updates_wrong": [],
                                                   "duplicates": []}
        for key, ids in (("updates_lost", result["lost"]), ("updates_wrong", result["wrong"])):
            for item in ids:
                task_id = item.split(":")[0]
                o = owner(self.work.launched_at.get(task_id, 0.0))
                (getattr(o, key) if o else self.unattributed[key]).append(item)
        for task_id, seen in self.probe.duplicates.items():
            o = owner(seen)
            (o.duplicates if o else self.unattributed["duplicates"]).append(task_id)
        with self.probe.lock:
            job_events = list(self.probe.job.events)
        for seen, kind, detail in job_events:  # the job's instances lost or relaunched
            o = owner(seen)
            key = "tasks_lost" if kind == "lost" else "duplicates"
            self.unattributed.setdefault(key, [])
            (getattr(o, key) if o else self.unattributed[key]).append(f"job {detail}")

    # -- the report ------------------------------------------------------------------------------
    def report(self) -> dict[str, Any]:
        from dataclasses import asdict

        with self.probe.lock:
            timeline = [{"t": round(s.at - self.t0, 3), "leader": s.serving,
                         "epoch": s.epoch, "running": s.running_tasks,
                         "registered": len(s.registered)} for s in self.probe.samples]
            containers = [(round(t - self.t0, 3), n) for t, n in self.probe.containers]
            violations = list(self.probe.violations)
        with self.work.lock:
            violations += self.work.violations
        return {
            "scenario": self.s.to_dict(),
            "fleet_id": self.fleet.fleet_id,
            "cluster_id": self.fleet.cluster_id,
            "faults_planned": len(self.s.faults),
            "outcomes": [asdict(o) for o in self.outcomes],
            "unattributed": getattr(self, "unattributed", {}),
            "violations": violations,
            "short_tasks": sum(1 for t in self.work.launched_at if t.startswith("short-")),
            # launches that never reached an executor (told TASK_DROPPED/UNKNOWN...): no loss
            "short_not_started": getattr(self, "not_started", []),
            # ends heard only as reconciliation answers (reported, not counted as lost)
            "short_reconciled_only": getattr(self, "reconciled_only", []),
            "service_instances": self.work.instances,
            "job_instances": self.probe.job.instances,
            # every job task the probe saw (instance index, agent, whether it ended, lost)
            "job_tasks": {t: {"index": r.index, "agent": r.agent, "ended": r.ended,
                              "lost": r.lost, "excused": t in self.probe.job.excused}
                          for t, r in sorted(self.probe.job.tasks.items())},
            "timeline": timeline[::2],
            "containers": containers,
            "events": self.events,
        }


def write_report(report: dict[str, Any], out_dir: Path) -> Path:
    out_dir.mkdir(parents=True, exist_ok=True)
    stamp = time.strftime("%Y%m%dT%H%M%S", time.gmtime())
    path = out_dir / f"chaos-{report['scenario']['name']}-{stamp}.json"
    path.write_text(json.dumps(report, indent=1))
    return path
