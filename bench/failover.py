"""Failover figures through real processes: a local cluster on its own ZooKeeper (`offerbus
up --standbys 1`: two of each central service, two agents), one framework, and per trial:

- master_kill: SIGKILL of the leading master -> offers flowing to the framework again (its
  first offer on its subscription with the new master). Floor: the ZooKeeper session
  timeout (the dead leader's member lives until its session expires); targets p50 <= floor
  + 0.3 s, max <= floor + 1 s. The session is counted from the leader's last ping to
  ZooKeeper (every third of the timeout), so a trial may beat the floor by up to that.
- master_stop: SIGTERM of the leading master -> offers flowing again. The leader withdraws
  from the election as it closes, so a standby leads at once: target <= 0.1 s.
- agent_kill: SIGKILL of an agent -> the framework told its task there is TASK_UNREACHABLE.
  Floor: the master's agent timeout; target <= floor + 1 s. Counted from the agent's last
  heartbeat, so a trial may beat the floor by up to one heartbeat.

The framework holds every offer it gets (never answers), so "offers flowing" means the
cluster offered its resources anew through the new master. One cluster serves every trial:
the killed process is started again (`services.cli.cluster.respawn`) and the cluster is back
in its steady state (a standby in each election, offers held on every agent, a task running
on every agent) before the next trial. The kinds take turns going first."""

from __future__ import annotations

import contextlib
import inspect
import os
import shutil
import signal
import statistics
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from bench.report import progress, write
from frameworks.sdk.driver import SchedulerDriver
from frameworks.sdk.scheduler import MasterInfo, Scheduler
from schemas import common_pb2
from services.bus.election import ZooKeeperContender, detector_from_url, parse_url
from services.cli import cluster as local_cluster
from services.cli.client import ElectionView
from services.resources import Resources
from services.shell.config import COMMON

TRIALS = 20
KINDS = ("master_kill", "master_stop", "agent_kill")
AGENTS = 2
AGENT_RESOURCES = "cpus:2;mem:1024;disk:10240;ports:[41000-41099]"
IMAGE = "offerbus/busybox:latest"
HEARTBEAT = 1.0  # the cluster's (`up` passes it to masters and agents)
TRIAL_DEADLINE = 30.0  # a trial that takes longer counts as failed
STEADY_DEADLINE = 60.0
T = TypeVar("T")


# -- what the cluster is configured with -------------------------------------------------
def session_timeout(url: str) -> float:
    """The ZooKeeper session timeout the services use: the URL's `?session_timeout=`, else
    the contender's default (what `contender_from_url` falls back to)."""
    given = parse_url(url)[2]
    if given:
        return given
    return float(inspect.signature(ZooKeeperContender).parameters["session_timeout"].default)


def agent_timeout() -> tuple[float, str]:
    """(seconds, where it comes from) after which the master declares a silent agent
    unreachable: its `--agent-timeout` when the master has that option, else its heartbeat
    times `--max-missed` (the front socket's peer liveness)."""
    from services.master.__main__ import OPTIONS

    env = os.environ.get("OFFERBUS_MASTER_AGENT_TIMEOUT") or os.environ.get(
        "OFFERBUS_AGENT_TIMEOUT")
    option = next((o for o in OPTIONS if o.name == "agent_timeout"), None)
    if option is not None:
        return float(env or str(option.default)), "master --agent-timeout"
    missed = next(o.default for o in COMMON if o.name == "max_missed")
    return HEARTBEAT * float(str(missed)), ("master --heartbeat x --max-missed "
                                            "(no --agent-timeout)")


# -- the framework -----------------------------------------------------------------------
class Holder(Scheduler):
    """Keeps every offer; records subscriptions, offers and task updates with their time."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.subscriptions: list[tuple[float, int]] = []  # (time, master epoch)
        self.offers_at: list[tuple[float, str]] = []  # (time, hostname)
        self.outstanding: dict[str, common_pb2.Offer] = {}
        self.updates: dict[str, list[tuple[float, int]]] = {}  # task id -> (time, state)

    def subscribed(self, driver: SchedulerDriver, framework_id: str,
                   master_info: MasterInfo) -> None:
        with self.lock:
            self.subscriptions.append((time.monotonic(), master_info.epoch))
            self.outstanding.clear()  # offers of an earlier connection are void

    def disconnected(self, driver: SchedulerDriver) -> None:
        with self.lock:
            self.outstanding.clear()

    def offers(self, driver: SchedulerDriver, offers: list[common_pb2.Offer]) -> None:
        now = time.monotonic()
        with self.lock:
            for o in offers:
                self.offers_at.append((now, o.hostname))
                self.outstanding[o.offer_id] = o
            del self.offers_at[:-1000]  # bounded

    def rescinded(self, driver: SchedulerDriver, offer_ids: list[str], reason: int) -> None:
        with self.lock:
            for oid in offer_ids:
                self.outstanding.pop(oid, None)

    def update(self, driver: SchedulerDriver, status: common_pb2.TaskStatus) -> None:
        with self.lock:
            self.updates.setdefault(status.task_id, []).append((time.monotonic(), status.state))

    # -- views ---------------------------------------------------------------------------
    def holding(self) -> set[str]:
        with self.lock:
            return {o.hostname for o in self.outstanding.values()}

    def take(self, host: str) -> common_pb2.Offer | None:
        with self.lock:
            oid = next((i for i, o in self.outstanding.items() if o.hostname == host), None)
            return None if oid is None else self.outstanding.pop(oid)

    def offered_after(self, host: str, t: float) -> bool:
        with self.lock:
            return any(at > t and h == host for at, h in self.offers_at)

    def epoch(self) -> int:
        with self.lock:
            return self.subscriptions[-1][1] if self.subscriptions else 0

    def first_offer_after_subscribing(self, epoch_above: int) -> float | None:
        """When the first offer came on a subscription with a master above that epoch."""
        with self.lock:
            since = next((t for t, e in self.subscriptions if e > epoch_above), None)
            if since is None:
                return None
            return next((t for t, _ in self.offers_at if t >= since), None)

    def state(self, task_id: str) -> int | None:
        with self.lock:
            history = self.updates.get(task_id)
            return history[-1][1] if history else None

    def history(self, task_id: str) -> list[str]:
        with self.lock:
            return [common_pb2.TaskState.Name(s) for _, s in  # type: ignore[arg-type]
                    self.updates.get(task_id, [])]

    def when(self, task_id: str, state: int, after: float) -> float | None:
        with self.lock:
            return next((t for t, s in self.updates.get(task_id, []) if s == state
                         and t >= after), None)


def sleep_task(task_id: str, offer: common_pb2.Offer) -> common_pb2.Operation:
    task = common_pb2.TaskInfo(task_id=task_id, name=task_id, agent_id=offer.agent_id,
                               kill_grace_period_s=0.5)
    task.resources.extend(Resources.of(cpus=0.1, mem=32).to_proto())
    task.container.type = common_pb2.ContainerInfo.CONTAINER_TYPE_DOCKER
    task.container.docker.image = IMAGE
    task.command.shell = False
    task.command.value = "sleep"
    task.command.arguments.append("3600")
    op = common_pb2.Operation()
    op.launch.tasks.append(task)
    return op


# -- the bench ---------------------------------------------------------------------------
def _wait(predicate: Callable[[], T | None], timeout: float, what: str) -> T:
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what}: not within {timeout:g}s")
        time.sleep(0.005)  # polling a condition with a deadline


class Bench:
    def __init__(self, run_dir: Path, url: str, sched: Holder, driver: SchedulerDriver) -> None:
        self.run_dir, self.url, self.sched, self.driver = run_dir, url, sched, driver
        self.tasks: dict[str, str] = {}  # hostname -> the task running there
        self.launched = 0
        self.relaunched = 0  # tasks that did not come back with their agent
        self.launch_failures: list[str] = []

    # -- steady state --------------------------------------------------------------------
    def leader(self, role: str) -> tuple[str, Any]:
        detector = detector_from_url(self.url, role)
        detector.start()
        try:
            info = detector.wait_for_leader(10.0)
        finally:
            detector.close()
        if info is None:
            raise TimeoutError(f"no leading {role}")
        name = local_cluster.member_process(self.run_dir, info.member_id)
        if name is None:
            raise RuntimeError(f"no process of {self.run_dir} is {info.member_id}")
        return name, info

    def standbys_ready(self) -> bool:
        with ElectionView(self.url) as election:
            return all(len(election.members(role) or []) >= 2 for role in local_cluster.CENTRAL)

    def launch(self, host: str) -> bool:
        """A sleep task on `host`; True once RUNNING, False if it ended first."""
        offer = _wait(lambda: self.sched.take(host), STEADY_DEADLINE, f"an offer of {host}")
        self.launched += 1
        task_id = f"{host}-t{self.launched}"
        self.driver.accept([offer.offer_id], [sleep_task(task_id, offer)],
                           common_pb2.Filters(refuse_seconds=0))
        state = _wait(lambda: self.sched.state(task_id) not in (
            None, common_pb2.TASK_STAGING, common_pb2.TASK_STARTING) and self.sched.state(
            task_id), STEADY_DEADLINE, f"task {task_id} RUNNING")
        if state != common_pb2.TASK_RUNNING:
            self.launch_failures.append(f"{task_id}: {self.sched.history(task_id)}")
            return False
        self.tasks[host] = task_id
        return True

    def running_on(self, host: str) -> bool:
        task = self.tasks.get(host)
        return task is not None and self.sched.state(task) == common_pb2.TASK_RUNNING

    def steady(self) -> None:
        """A standby in every election, a task running on every agent, offers held on all."""
        _wait(self.standbys_ready, STEADY_DEADLINE, "a standby of every central service")
        hosts = {f"agent-{i}" for i in range(1, AGENTS + 1)}
        for host in sorted(hosts):
            attempts = 0
            while not self.running_on(host):
                attempts += 1
                if attempts > 3:
                    raise TimeoutError(f"no task would run on {host}: {self.launch_failures}")
                if host in self.tasks:
                    self.relaunched += 1
                self.launch(host)
        _wait(lambda: self.sched.holding() >= hosts, STEADY_DEADLINE,
              "offers held on every agent")

    # -- trials --------------------------------------------------------------------------
    def master(self, sig: int) -> float:
        name, info = self.leader("master")
        epoch = max(info.epoch, self.sched.epoch())
        pid = local_cluster.running(self.run_dir)[name]
        t0 = time.monotonic()
        os.kill(pid, sig)
        first = _wait(lambda: self.sched.first_offer_after_subscribing(epoch),
                      TRIAL_DEADLINE, "offers through the new master")
        _wait(lambda: name not in local_cluster.running(self.run_dir), 15,
              f"{name} to exit")
        local_cluster.respawn(self.run_dir, name)
        return first - t0

    def agent(self, trial: int) -> float:
        host = f"agent-{trial % AGENTS + 1}"
        task = self.tasks[host]
        pid = local_cluster.running(self.run_dir)[host]
        t0 = time.monotonic()
        os.kill(pid, signal.SIGKILL)
        told = _wait(lambda: self.sched.when(task, common_pb2.TASK_UNREACHABLE, t0),
                     TRIAL_DEADLINE, f"{task} on {host} reported TASK_UNREACHABLE")
        local_cluster.respawn(self.run_dir, host)
        # Back on its machine, the agent recovers its executor and re-registers (offers of
        # it come again); the framework reconciles to learn its task runs (the master does
        # not tell it unasked). `steady` relaunches it (counted) if it does not run.
        with contextlib.suppress(TimeoutError):
            _wait(lambda: self.sched.offered_after(host, told), 20, f"{host} back")
            self.driver.reconcile()
            _wait(lambda: self.sched.when(task, common_pb2.TASK_RUNNING, told), 10,
                  f"{task} RUNNING again")
        return told - t0

    def trial(self, kind: str, trial: int) -> float:
        if kind == "master_kill":
            return self.master(signal.SIGKILL)
        if kind == "master_stop":
            return self.master(signal.SIGTERM)
        return self.agent(trial)


def _pct(xs: list[float], p: float) -> float:
    ordered = sorted(xs)
    return ordered[min(len(ordered) - 1, int(p * len(ordered)))]


def figures(xs: list[float]) -> dict[str, float]:
    return {"n": len(xs), "min": min(xs), "p50": statistics.median(xs), "p90": _pct(xs, 0.9),
            "max": max(xs), "mean": statistics.fmean(xs)}


def targets(session: float, agent: float) -> dict[str, dict[str, Any]]:
    """Per kind: the floor (None: none) and the targets ((statistic, seconds) pairs)."""
    return {
        "master_kill": {"floor": session, "floor_is": "ZooKeeper session timeout (from the "
                        "last ping: a trial may beat it by up to a third of it)",
                        "targets": [("p50", session + 0.3), ("max", session + 1.0)]},
        "master_stop": {"floor": None, "floor_is": "none (the leader withdraws at once)",
                        "targets": [("max", 0.1)]},
        "agent_kill": {"floor": agent, "floor_is": "agent timeout (from the last heartbeat: "
                       "a trial may beat it by up to one heartbeat)",
                       "targets": [("max", agent + 1.0)]},
    }


def main(trials: int = TRIALS) -> None:
    print(f"bench failover: {trials} trials each of {', '.join(KINDS)} (kill -> offers "
          "flowing again / framework told)")
    run_dir = Path(tempfile.mkdtemp(prefix="offerbus-bench-failover-"))
    results: dict[str, Any] = {"trials": trials}
    times: dict[str, list[float]] = {k: [] for k in KINDS}
    failures: dict[str, list[str]] = {k: [] for k in KINDS}
    started = time.monotonic()
    driver: SchedulerDriver | None = None
    ok = False
    try:
        url = local_cluster.up(local_cluster.UpOptions(
            run_dir=run_dir, agents=AGENTS, standbys=1, agent_resources=AGENT_RESOURCES,
            offer_timeout=3600, heartbeat=HEARTBEAT, timeout=120, jobs=False))
        session = session_timeout(url)
        agent_s, agent_source = agent_timeout()
        results["config"] = {"session_timeout_s": session, "agent_timeout_s": agent_s,
                             "agent_timeout_source": agent_source, "heartbeat_s": HEARTBEAT,
                             "agents": AGENTS, "standbys": 1,
                             "framework": "SDK defaults (subscribe backoff included)"}
        sched = Holder()
        info = common_pb2.FrameworkInfo(name="failover-bench", role="*",
                                        principal="failover-bench", failover_timeout_s=600)
        info.capabilities.append(common_pb2.FrameworkInfo.CAPABILITY_PARTITION_AWARE)
        driver = SchedulerDriver(sched, info, url)
        driver.start()
        bench = Bench(run_dir, url, sched, driver)
        for i in range(trials):
            order = list(KINDS[i % len(KINDS):] + KINDS[:i % len(KINDS)])
            for kind in order:
                bench.steady()
                try:
                    took = bench.trial(kind, i)
                except TimeoutError as exc:
                    failures[kind].append(str(exc))
                    progress(f"trial {i + 1}/{trials} {kind}: FAILED ({exc})")
                    continue
                times[kind].append(took)
                progress(f"trial {i + 1}/{trials} {kind}: {took:.3f}s")
        bench.steady()
        results["relaunched_after_agent_restart"] = bench.relaunched
        results["launch_failures"] = bench.launch_failures
        ok = True
    finally:
        if driver is not None:
            driver.stop(failover=False)
            driver.join(10)
        local_cluster.down(run_dir)
        if ok:
            shutil.rmtree(run_dir, ignore_errors=True)
        else:
            print(f"bench failover: failed; the cluster's logs are in {run_dir / 'logs'}")
    results["seconds_total"] = time.monotonic() - started
    report(results, times, failures)


def report(results: dict[str, Any], times: dict[str, list[float]],
           failures: dict[str, list[str]]) -> None:
    config = results["config"]
    goals = targets(config["session_timeout_s"], config["agent_timeout_s"])
    print(f"\n{'trial':<12} {'n':>3} {'p50':>7} {'p90':>7} {'max':>7} {'floor':>7} "
          f"{'p50/floor':>9}  target")
    for kind in KINDS:
        xs, goal = times[kind], goals[kind]
        row: dict[str, Any] = {"samples": xs, "failures": failures[kind], **goal}
        if not xs:
            print(f"{kind:<12} {0:>3}  (every trial failed)")
            results[kind] = row
            continue
        fig = figures(xs)
        floor = goal["floor"]
        ratio = fig["p50"] / floor if floor else None
        met = [(stat, limit, fig[stat] <= limit) for stat, limit in goal["targets"]]
        row.update(fig, p50_over_floor=ratio,
                   targets=[{"stat": s, "seconds": lim, "met": ok} for s, lim, ok in met],
                   met=all(ok for _, _, ok in met) and not failures[kind])
        results[kind] = row
        floor_cell = f"{floor:.2f}s" if floor else "-"
        ratio_cell = f"{ratio:.2f}x" if ratio else "-"
        goal_cell = ", ".join(f"{s} <= {lim:.2f}s {'ok' if ok else 'MISSED'}"
                              for s, lim, ok in met)
        fails = f" ({len(failures[kind])} failed)" if failures[kind] else ""
        print(f"{kind:<12} {fig['n']:>3} {fig['p50']:>6.3f}s {fig['p90']:>6.3f}s "
              f"{fig['max']:>6.3f}s {floor_cell:>7} {ratio_cell:>9}  {goal_cell}{fails}")
    print(f"(session timeout {config['session_timeout_s']:g}s; agent timeout "
          f"{config['agent_timeout_s']:g}s from {config['agent_timeout_source']}; "
          f"{results['seconds_total']:.0f}s in all)")
    print(f"results: {write('failover', results)}")


if __name__ == "__main__":
    main()
