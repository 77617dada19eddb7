"""Scale figures through the real services (issue 8): a local cluster on its own ZooKeeper
(`offerbus up --standbys 1 --agents 0`: two of each central service) and the agent emulator
(services/emulator) hosting N virtual agents on one connection. Per N:

- registration: the emulator started -> all N agents registered (its window of outstanding
  registrations at its default).
- (b) subscribe_to_running: a new framework (the SDK) subscribes -> its single task RUNNING
  (3 frameworks one after the other; each torn down before the next).
- (c) launch_rate: one framework (the SDK, the framework emulator's policy) launches
  N x TASKS_PER_AGENT tasks as offers come; tasks reported RUNNING per second, from its
  first offer to the last RUNNING.
- (d) failover: SIGKILL of the leading master with those tasks running -> the standby leads,
  every agent re-registered and every task known RUNNING again (the new master's metrics).

Heartbeats every second, or every agents/10,000 seconds beyond 10,000 agents (HEARTBEATS_PER_S).
Where the time goes: CPU seconds each process spent per phase (/proc/<pid>/stat; "bench" is
this process, which runs the frameworks through the SDK and polls the services), so a
phase's wall time can be set against the process that was busy. Ratios are against the
smallest N measured in the same run; with --rounds > 1 the sizes take turns going first.

`python -m bench scale` (sizes from OFFERBUS_BENCH_AGENTS, default 1000,10000) or
`python -m bench.scale --agents 1000,10000,50000 --tasks-per-agent 10`."""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

from prometheus_client.parser import text_string_to_metric_families

from bench.profiles import folded_summary, gc_summary, profile_summary, profiling_on
from bench.report import progress, write
from frameworks.sdk.demand import demand
from frameworks.sdk.driver import SchedulerDriver
from frameworks.sdk.scheduler import MasterInfo, Scheduler
from schemas import common_pb2
from services import tasks
from services.cli import cluster as local_cluster
from services.cli.client import CliError, find_leader
from services.emulator.frameworks import EmulatedFramework, OfferPolicy, Shape
from services.resources import Resources

SIZES = (1000, 10_000)
TASKS_PER_AGENT = 10
SUBSCRIBE_TRIALS = 3
HEARTBEAT = 1.0
# Heartbeats the master can answer per second and still work: beyond 10,000 agents the
# interval grows with them (50,000 agents at 1 s were 100,000 messages a second and the
# master stalled 3-5 s at a time), as an operator would set it (Mesos pings every 15 s).
HEARTBEATS_PER_S = 10_000
PHASES = ("registration", "subscribe_to_running", "launch", "failover")
SERVICES = ("master", "master-2", "allocator", "allocator-2", "broker", "broker-2",
            "emulator")
T = TypeVar("T")
# Not work: waiting in poll or on a lock, and importing (profiles start at interpreter start).


def _wait(predicate: Callable[[], T | None], timeout: float, what: str,
          interval: float = 0.2) -> T:
    deadline = time.monotonic() + timeout
    while True:
        try:
            value = predicate()
        except OSError:
            value = None
        if value:
            return value
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what} (after {timeout:g}s)")
        time.sleep(interval)  # polling a condition with a deadline


def _get(url: str, timeout: float = 30.0) -> bytes:
    from services.cli.client import http_headers  # OFFERBUS_HTTP_TOKEN, when the cluster has one

    req = urllib.request.Request(url, headers=http_headers())
    with urllib.request.urlopen(req, timeout=timeout) as r:
        return r.read()


AGENTS, TASKS = "offerbus_master_agents", "offerbus_master_tasks"


def gauges(url: str, *names: str) -> dict[str, dict[str, float]]:
    """Labelled gauges of one scrape of a service's /metrics: each by its one label's value."""
    out: dict[str, dict[str, float]] = {name: {} for name in names}
    for family in text_string_to_metric_families(_get(url + "/metrics").decode()):
        if family.name in out:
            for s in family.samples:
                out[family.name][next(iter(s.labels.values()), "")] = s.value
    return out


def sampling(ratio: float) -> str:
    """Set the share of traces recorded (the OpenTelemetry SDK reads OTEL_TRACES_SAMPLER
    when a process sets up tracing: the services spawned from now on and this process's
    frameworks); returns it in words for the report."""
    if ratio >= 1.0:
        return "every offer (parentbased_always_on)"
    os.environ["OTEL_TRACES_SAMPLER"] = "parentbased_traceidratio"
    os.environ["OTEL_TRACES_SAMPLER_ARG"] = repr(ratio)
    return f"a share of {ratio:g} (parentbased_traceidratio)"


def cpu_seconds(pids: dict[str, int]) -> dict[str, float]:
    """utime + stime of each process so far."""
    tick = os.sysconf("SC_CLK_TCK")
    out = {}
    for name, pid in pids.items():
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        out[name] = (int(fields[11]) + int(fields[12])) / tick
    return out


class OneTask(Scheduler):
    """Launches one task on its first offer and declines the rest for an hour (launches it
    again if it ended without running: an accept voided by a disconnection). `declare`: it
    declares its demand (one task of its shape) when subscribed, so the allocator offers
    it what that task needs, not every agent (Mesos's frameworks cannot)."""

    def __init__(self, declare: bool = False) -> None:
        self.subscribed_at = self.offered_at = self.running_at = 0.0
        self.launched = False
        self.relaunches = 0
        self.declare = declare

    def subscribed(self, driver: SchedulerDriver, framework_id: str,
                   master_info: MasterInfo) -> None:
        self.subscribed_at = self.subscribed_at or time.monotonic()
        if self.declare:
            driver.request([demand(Resources.of(cpus=0.1, mem=32), 1)])

    def offers(self, driver: SchedulerDriver, offers: list[common_pb2.Offer]) -> None:
        rest = [o.offer_id for o in offers]
        if not self.launched:
            self.launched, self.offered_at = True, time.monotonic()
            o = offers[0]
            rest.remove(o.offer_id)
            t = common_pb2.TaskInfo(task_id="one", name="one", agent_id=o.agent_id)
            t.resources.extend(Resources.of(cpus=0.1, mem=32).to_proto())
            t.command.value = "true"
            op = common_pb2.Operation()
            op.launch.tasks.append(t)
            driver.accept([o.offer_id], [op])
        if rest:
            driver.decline(rest, refuse_seconds=3600)

    def update(self, driver: SchedulerDriver, status: common_pb2.TaskStatus) -> None:
        if status.state == tasks.RUNNING and not self.running_at:
            self.running_at = time.monotonic()
        elif tasks.is_terminal(status.state) and not self.running_at:
            self.launched = False
            self.relaunches += 1

    def running(self) -> float:
        return self.running_at


class Launcher(EmulatedFramework):
    """The framework emulator's scheduler, timing its first offer and its last RUNNING."""

    def __init__(self, policy: OfferPolicy, total: int) -> None:
        super().__init__(policy)
        self.total = total
        self.first_offer_at = self.all_running_at = 0.0

    def offers(self, driver: SchedulerDriver, offers: list[common_pb2.Offer]) -> None:
        self.first_offer_at = self.first_offer_at or time.monotonic()
        super().offers(driver, offers)

    def update(self, driver: SchedulerDriver, status: common_pb2.TaskStatus) -> None:
        super().update(driver, status)
        if not self.all_running_at and self.states["TASK_RUNNING"] >= self.total:
            self.all_running_at = time.monotonic()


def framework_info(name: str) -> common_pb2.FrameworkInfo:
    info = common_pb2.FrameworkInfo(name=name, role="*", principal=name,
                                    failover_timeout_s=3600)
    info.capabilities.append(common_pb2.FrameworkInfo.CAPABILITY_PARTITION_AWARE)
    return info


class Run:
    """One cluster, N virtual agents, every phase."""

    def __init__(self, agents: int, tasks_per_agent: int, window: int | None,
                 failover: bool = True, update_retry: float = 0.0, spy: str = "",
                 spy_also: tuple[str, ...] = ()) -> None:
        self.n, self.per_agent, self.window = agents, tasks_per_agent, window
        self.do_failover = failover
        self.update_retry = update_retry
        self.spy = spy  # py-spy's path: sample the standby through the failover
        self.spy_also = spy_also  # more processes sampled through it (by name)
        self.skip_subscribe = False  # only registration, launch and failover
        self.run_dir = Path(tempfile.mkdtemp(prefix=f"offerbus-bench-scale-{agents}-"))
        self.url = ""
        self.heartbeat = max(HEARTBEAT, agents / HEARTBEATS_PER_S)
        self.row: dict[str, Any] = {"agents": agents, "tasks": agents * tasks_per_agent,
                                    "heartbeat_s": self.heartbeat, "cpu_s": {}}
        self._cpu_at: dict[str, float] = {}

    def pids(self) -> dict[str, int]:
        return {k: v for k, v in local_cluster.running(self.run_dir).items() if k in SERVICES}

    @contextlib.contextmanager
    def phase(self, name: str) -> Iterator[list[float]]:
        """Times a phase (yields [start]; [start, seconds] after) and records each
        process's CPU seconds in it, also when it fails."""
        pids = {**self.pids(), "bench": os.getpid()}  # this process runs the frameworks
        before = cpu_seconds(pids)
        timing = [time.monotonic()]
        try:
            yield timing
        finally:
            timing.append(time.monotonic() - timing[0])
            now = cpu_seconds({**self.pids(), "bench": os.getpid()})
            self.row["cpu_s"][name] = {k: round(v - before.get(k, 0.0), 2)
                                       for k, v in now.items() if v - before.get(k, 0) > 0.05}

    def master_http(self) -> str:
        return find_leader(self.url, 10.0).endpoints["http"]

    def emulator_http(self) -> str:
        log = (self.run_dir / "logs" / "emulator.log").read_text()
        for line in log.splitlines():
            if "agent emulator started" in line:
                return line.split("http=", 1)[1].split()[0]
        raise OSError("the emulator has not started yet")

    def emulator_state(self) -> dict[str, Any]:
        state: dict[str, Any] = json.loads(_get(self.emulator_http() + "/state"))
        return state

    def run(self) -> dict[str, Any]:
        self.url = local_cluster.up(local_cluster.UpOptions(
            run_dir=self.run_dir, agents=0, standbys=1, offer_timeout=3600,
            heartbeat=self.heartbeat, timeout=120, jobs=False))  # no job runner: the control plane
        self.registration()
        if not self.skip_subscribe:
            self.subscribe_to_running()
        driver = self.launch()
        try:
            if self.do_failover:
                self.failover()
        finally:
            driver.stop(failover=True)  # the cluster goes down next: no mass kill first
            driver.join(10)
        return self.row

    def registration(self) -> None:
        argv = ["-m", "services.emulator", "agents", "--cluster", self.url, "--count",
                str(self.n), "--heartbeat", str(self.heartbeat)]
        if self.window:
            argv += ["--window", str(self.window)]
        if self.update_retry:
            argv += ["--update-retry-s", str(self.update_retry)]
        with self.phase("registration") as timing:
            local_cluster.spawn(self.run_dir, "emulator", argv)
            try:
                _wait(lambda: self.emulator_state()["agents"].get("registered") == self.n,
                      60 + self.n / 50, f"{self.n} agents registered")
            except TimeoutError as exc:
                raise TimeoutError(f"{exc}: {self.emulator_state()['agents']}") from None
        took = timing[1]
        # The master's view of its own state is a copy kept off its reactor: it may lag
        # the replies the emulator has already had by a moment.
        _wait(lambda: gauges(self.master_http(), AGENTS)[AGENTS].get(
            "AGENT_STATUS_REGISTERED") == self.n, 30, f"the master's /metrics: {self.n} "
              "agents registered")
        self.row["registration_s"] = took
        progress(f"{self.n} agents: all registered in {took:.2f}s ({self.n / took:.0f}/s)")

    def subscribe_to_running(self) -> None:
        samples: list[float] = []
        offers: list[float] = []
        declared: list[float] = []
        with self.phase("subscribe_to_running"):
            for i in range(SUBSCRIBE_TRIALS):  # the two kinds take turns going first
                for declare in ((False, True) if i % 2 == 0 else (True, False)):
                    self._one_task(i, declared if declare else samples,
                                   [] if declare else offers, declare)
        self.row["subscribe_to_running_s"] = sorted(samples)
        self.row["subscribe_to_offer_s"] = sorted(offers)
        self.row["subscribe_to_running_declared_s"] = sorted(declared)

    def _one_task(self, i: int, samples: list[float], offers: list[float],
                  declare: bool = False) -> None:
        """One framework subscribes and runs its single task (`declare`: of declared
        demand)."""
        sched = OneTask(declare)
        name = f"one-{i}{'-declared' if declare else ''}"
        driver = SchedulerDriver(sched, framework_info(name), self.url)
        driver.start()
        try:
            _wait(sched.running, 120, "the single task RUNNING", 0.01)
        finally:
            driver.stop(failover=False)
            driver.join(10)
        if sched.relaunches:
            progress(f"{self.n} agents: the single task was launched again "
                     f"{sched.relaunches} time(s)")
        samples.append(sched.running_at - sched.subscribed_at)
        if not declare:
            offers.append(sched.offered_at - sched.subscribed_at)
        progress(f"{self.n} agents{' (declared demand)' if declare else ''}: subscribed -> "
                 f"first offer {sched.offered_at - sched.subscribed_at:.3f}s, "
                 f"-> RUNNING {samples[-1]:.3f}s")

    def launch(self) -> SchedulerDriver:
        total = self.n * self.per_agent
        policy = OfferPolicy("load", Shape(0.1, 32), 1.0, tasks_per_offer=self.per_agent,
                             max_tasks=total, refuse_s=3600)
        sched = Launcher(policy, total)
        driver = SchedulerDriver(sched, framework_info("load"), self.url)
        try:
            with self.phase("launch"):
                driver.start()
                _wait(lambda: sched.all_running_at, 60 + total / 50,
                      f"{total} tasks RUNNING", 0.05)
        except TimeoutError:
            progress(f"launch: {sched.summary()}")
            driver.stop(failover=True)
            driver.join(10)
            raise
        took = sched.all_running_at - sched.first_offer_at
        with contextlib.suppress(OSError, ValueError, KeyError):
            # Updates the agents sent (resends of unacknowledged ones included): per-task
            # work the control plane did beyond STARTING and RUNNING once each.
            counts = self.emulator_state()["counts"]
            self.row["updates_sent"] = counts.get("updates_sent", 0)
        self.row["launch_s"] = took
        self.row["launch_rate"] = total / took
        progress(f"{self.n} agents: {total} tasks RUNNING in {took:.2f}s "
                 f"({total / took:.0f}/s); {self.row.get('updates_sent', 0) / total:.2f} "
                 "status updates sent per task")
        return driver

    def failover(self) -> None:
        total = self.n * self.per_agent
        old = self.master_http()
        name = next(n for n, pid in self.pids().items()
                    if n.startswith("master") and local_cluster.member_id_of(
                        self.run_dir, n) == self._leader_id())
        pid = self.pids()[name]
        def new_leader() -> str | None:
            http = self.master_http()
            return http if http != old else None

        standby = next((p for n, p in self.pids().items()
                        if n.startswith("master") and n != name), None)
        spies = {"standby": self._spy(standby, "standby")} \
            if self.spy and standby is not None else {}
        if self.spy:
            spies |= {n: self._spy(p, n) for n, p in self.pids().items() if n in self.spy_also}
        # The emulator's count of (re-)registration replies: its agents still look
        # registered until it notices the master is gone.
        replies = self.emulator_state()["counts"].get("registered", 0)
        with self.phase("failover") as timing:
            os.kill(pid, signal.SIGKILL)
            new = _wait(new_leader, 60, "a new leader")
            led = time.monotonic() - timing[0]

            emulator_done: list[float] = []

            def recovered() -> bool:
                """Every agent registered with the new master, which knows every task the
                agents run (at least `total`: a replaced launch may have added some)."""
                emu = self.emulator_state()
                if not emulator_done and emu["agents"].get("registered") == self.n \
                        and emu["counts"].get("registered", 0) >= replies + self.n:
                    emulator_done.append(time.monotonic() - timing[0])
                # One scrape a poll: each costs the master's GIL while it re-registers.
                seen = gauges(new, AGENTS, TASKS)
                agents, running = seen[AGENTS], seen[TASKS].get("TASK_RUNNING", 0)
                return (agents.get("AGENT_STATUS_REGISTERED") == self.n
                        and running == emu["running"] >= total)
            try:
                _wait(recovered, 120 + self.n / 20,
                      "every agent re-registered, every task known")
            finally:
                for who, spy in spies.items():
                    self._spy_done(spy, who)
        took = timing[1]
        self.row["failover_leader_s"] = led
        self.row["failover_emulator_registered_s"] = emulator_done[0] if emulator_done else None
        self.row["failover_s"] = took
        progress(f"{self.n} agents x {self.per_agent} tasks: master SIGKILL -> new leader "
                 f"{led:.2f}s, the emulator's agents all re-registered "
                 f"{emulator_done[0] if emulator_done else float('nan'):.2f}s, the new "
                 f"master's metrics show every agent and task {took:.2f}s")

    def _spy(self, pid: int, who: str) -> subprocess.Popen[bytes]:
        """py-spy sampling `who` (the standby: the next leader) from before the SIGKILL."""
        out = self.run_dir / f"{who}.folded"
        spy = subprocess.Popen([self.spy, "record", "--pid", str(pid), "--format", "raw",
                                "--rate", "200", "--nonblocking", "--output", str(out)],
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        time.sleep(0.5)  # py-spy attaches (not a test: a benchmark's setup)
        return spy

    def _spy_done(self, spy: subprocess.Popen[bytes], who: str) -> None:
        spy.send_signal(signal.SIGINT)
        try:
            spy.wait(30)
        except subprocess.TimeoutExpired:
            spy.kill()
        folded = self.run_dir / f"{who}.folded"
        if folded.exists():
            self.row.setdefault("spy_profiles", {})[who] = folded_summary(folded)
            if who == "standby":
                self.row["standby_profile"] = self.row["spy_profiles"][who]
            progress(f"{who} profile (py-spy, samples by own/total frame): {folded}")

    def _leader_id(self) -> str:
        return find_leader(self.url, 10.0).member_id

    def down(self, ok: bool, keep: bool = False) -> None:
        local_cluster.down(self.run_dir)
        if ok and not keep:
            shutil.rmtree(self.run_dir, ignore_errors=True)
        else:
            print(f"bench scale: {'kept' if ok else 'failed'}; logs in {self.run_dir / 'logs'}")


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="python -m bench.scale", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    env = os.environ.get("OFFERBUS_BENCH_AGENTS", "")
    ap.add_argument("--agents", default=env or ",".join(map(str, SIZES)),
                    help="comma-separated numbers of virtual agents")
    ap.add_argument("--tasks-per-agent", type=int, default=TASKS_PER_AGENT)
    ap.add_argument("--window", type=int, default=0,
                    help="the emulator's registration window (0: its default)")
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--skip-subscribe", action="store_true",
                    help="leave out phase (b) (registration, launch and failover only)")
    ap.add_argument("--spy", nargs="?", const=shutil.which("py-spy") or "py-spy", default="",
                    help="sample the standby master through the failover with py-spy "
                         "(its path; default: on PATH) and print its busiest frames")
    ap.add_argument("--spy-also", default="",
                    help="with --spy: more processes to sample through the failover, by name "
                         f"(comma-separated, of {', '.join(SERVICES)})")
    ap.add_argument("--profile", action="store_true",
                    help="profile every service's reactor (cProfile, bench/profiling) and "
                         "print where each spent its time (a SIGKILLed master leaves none)")
    ap.add_argument("--no-failover", action="store_true",
                    help="skip the failover phase (so the leading master exits cleanly and "
                         "leaves its profile with --profile)")
    ap.add_argument("--update-retry", type=float, default=0.0,
                    help="the emulated agents' first resend of an unacknowledged status "
                         "update, seconds (0: the agent's default)")
    ap.add_argument("--gc-stats", action="store_true",
                    help="time every service's garbage collections (bench/profiling)")
    ap.add_argument("--trace-sample", type=float, default=1.0, metavar="RATIO",
                    help="the share of traces recorded (OTEL_TRACES_SAMPLER="
                         "parentbased_traceidratio), for the services and this process's "
                         "frameworks; default 1: every offer traced, as `offerbus up` does")
    args = ap.parse_args(argv)
    if not 0.0 <= args.trace_sample <= 1.0:
        ap.error(f"--trace-sample: a ratio from 0 to 1 (got {args.trace_sample})")
    traces = sampling(args.trace_sample)
    # A SIGTERM (a timeout, `kill`) unwinds like Ctrl-C, so each cluster is taken down.
    signal.signal(signal.SIGTERM, local_cluster.exit_on_signal)
    if args.spy and not shutil.which(args.spy):
        ap.error(f"--spy: no py-spy at {args.spy!r} (give its path)")
    sizes = [int(x) for x in args.agents.split(",") if x]
    print(f"bench scale: {sizes} virtual agents x {args.tasks_per_agent} tasks, "
          f"{args.rounds} round(s), traces: {traces}")
    rows: list[dict[str, Any]] = []
    started = time.monotonic()
    for r in range(args.rounds):
        order = sizes[r % len(sizes):] + sizes[:r % len(sizes)]
        for n in order:
            run = Run(n, args.tasks_per_agent, args.window or None, not args.no_failover,
                      args.update_retry, args.spy,
                      tuple(x for x in args.spy_also.split(",") if x))
            run.skip_subscribe = args.skip_subscribe
            ok = False
            saved = profiling_on(run.run_dir, args.profile, args.gc_stats) \
                if args.profile or args.gc_stats else None
            run.row["round"] = r
            rows.append(run.row)
            try:
                run.run()
                ok = True
            except (TimeoutError, AssertionError, CliError) as exc:
                progress(f"{n} agents: FAILED ({exc})")
                run.row["failed"] = str(exc)
            finally:
                if saved is not None:
                    os.environ.clear()
                    os.environ.update(saved)
                run.down(ok, keep=args.profile or args.gc_stats or bool(args.spy))
                if args.profile:
                    run.row["profile"] = profile_summary(run.run_dir / "profiles")
                if args.gc_stats:
                    run.row["gc"] = gc_summary(run.run_dir / "gc")
                    for proc, g in sorted(run.row["gc"].items()):
                        progress(f"{n} agents: {proc} garbage collection "
                                 f"{sum(g['seconds']):.2f}s of {g['cpu_s']:.2f} CPU-s "
                                 f"(by generation: {', '.join(f'{x:.2f}' for x in g['seconds'])})")
    report(rows, {"sizes": sizes, "tasks_per_agent": args.tasks_per_agent,
                  "update_retry_s": args.update_retry or None,
                  "rounds": args.rounds, "heartbeat_s": f"{HEARTBEAT} (agents / "
                  f"{HEARTBEATS_PER_S} beyond)", "traces": traces,
                  "seconds_total": time.monotonic() - started})


def report(rows: list[dict[str, Any]], config: dict[str, Any]) -> None:
    done = [r for r in rows if "failed" not in r]
    base = min(done, key=lambda r: r["agents"]) if done else None
    print(f"\n{'agents':>7} {'tasks':>7} {'register':>9} {'agents/s':>9} {'sub->run':>9} "
          f"{'declared':>9} {'tasks/s':>8} {'failover':>9} "
          f"{'x base (reg, sub, rate, failover)':>36}")
    for r in rows:
        if "failed" in r:
            print(f"{r['agents']:>7}  FAILED: {r['failed']}")
            continue
        subs = r.get("subscribe_to_running_s") or [math.nan]
        sub = subs[len(subs) // 2]
        decl = r.get("subscribe_to_running_declared_s") or [math.nan]
        declared = decl[len(decl) // 2]
        r.setdefault("failover_s", float("nan"))
        ratios = "-"
        if base is not None and base is not r:
            bsubs = base.get("subscribe_to_running_s") or [math.nan]
            bsub = bsubs[len(bsubs) // 2]
            ratios = (f"{r['registration_s'] / base['registration_s']:.1f}x "
                      f"{sub / bsub:.1f}x {r['launch_rate'] / base['launch_rate']:.2f}x "
                      f"{r['failover_s'] / base.get('failover_s', math.nan):.1f}x")
        print(f"{r['agents']:>7} {r['tasks']:>7} {r['registration_s']:>8.2f}s "
              f"{r['agents'] / r['registration_s']:>9.0f} {sub:>8.3f}s {declared:>8.3f}s "
              f"{r['launch_rate']:>8.0f} {r['failover_s']:>8.2f}s {ratios:>36}")
    print("\nwhere the time goes (CPU seconds per process, per phase):")
    for r in rows:
        for phase in PHASES:
            cpu = r["cpu_s"].get(phase)
            if cpu:
                busiest = ", ".join(f"{k} {v:.1f}" for k, v in
                                    sorted(cpu.items(), key=lambda kv: -kv[1]))
                print(f"  {r['agents']:>6} {phase:<21} {busiest}")
    for r in rows:
        for proc, fns in r.get("profile", {}).items():
            if proc.startswith(("master", "allocator", "broker", "emulator")) and fns:
                print(f"  {r['agents']:>6} {proc}: own time by function (s, calls):")
                for tt, nc, where in fns[:5]:
                    print(f"           {tt:>7.2f} {nc:>9} {where}")
    for r in rows:
        for who, prof in r.get("spy_profiles", {}).items():
            print(f"  {r['agents']:>6} {'standby master' if who == 'standby' else who} "
                  "through the failover (py-spy samples):")
            for kind in ("inclusive", "own", "other threads"):
                print(f"         {kind}:")
                for n, where in prof[kind][9 if kind == "inclusive" else 0:]:
                    print(f"           {n:>7} {where}")
    print(f"({config['seconds_total']:.0f}s in all)")
    print(f"results: {write('scale', {'config': config, 'rows': rows})}")


if __name__ == "__main__":
    main(sys.argv[1:])
