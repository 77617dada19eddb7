"""Where the time of one `offerbus run` goes (issue 8 e), against a running cluster (`make run`'s,
or the run dir given): the CLI is run as a user types it, N instances, R rounds, and each
step is set against the moment the CLI was started: the framework process subscribed (its
log), the first and last container created and started (the engine's own timestamps), the
CLI's return. The service is stopped after each round. Also the CPU seconds each group of
processes used from the CLI's start to its return, against the cores' total (on 2 cores
the engine competes with the services for them): Offerbus's services (every cluster's on
the machine), the CLI, ZooKeeper, the container engine (its shims and runc), kernel
threads (where the engine's network and file-system set-up runs) and the rest, but for
init (the orphans it reaps, as an earlier round's executor hosts, would count their whole
lives at their end). Prints the median of each step and writes
bench/results/timeline.json.

`python -m bench.timeline [--instances 20] [--rounds 3] [--run-dir .run/cluster] [--job]`
(--job: `offerbus job run FILE`, the job runner's path, instead of `offerbus run`)"""

from __future__ import annotations

import argparse
import datetime as dt
import os
import re
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import docker

from bench.report import progress, write
from frameworks import forkserver

IMAGE = "offerbus/busybox:latest"
STEPS = ("framework subscribed", "first container created", "last container created",
         "first container started", "last container started", "CLI returned")
_LOG_TIME = re.compile(r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}) ")


def _engine_time(text: str) -> float:
    """Seconds since the epoch of the engine's RFC 3339 time (nanoseconds cut to micro)."""
    base, _, frac = text.rstrip("Z").partition(".")
    when = dt.datetime.fromisoformat(base).replace(tzinfo=dt.UTC).timestamp()
    return when + float("0." + (frac or "0")[:6])


def _log_time(line: str) -> float | None:
    """A service log line's local time (`2026-11-24 20:17:01,898 INFO ...`)."""
    match = _LOG_TIME.match(line)
    if match is None:
        return None
    return dt.datetime.strptime(match.group(1), "%Y-%m-%d %H:%M:%S,%f").timestamp()


def _cli(run_dir: Path, *args: str) -> None:
    """The CLI as a user runs it; if it fails, the bench stops with the CLI's own words."""
    out = subprocess.run([sys.executable, "-m", "services.cli", "--run-dir", str(run_dir),
                          *args], capture_output=True, text=True, timeout=300)
    if out.returncode != 0:
        raise SystemExit(f"bench timeline: `offerbus {' '.join(args[:3])} ...` failed "
                         f"(exit {out.returncode}):\n{out.stderr or out.stdout}")


ENGINE = ("dockerd", "containerd", "containerd-shim", "runc", "docker-init", "docker-proxy")
OFFERBUS = "Offerbus services"
FORKED_FRAMEWORK = forkserver.COMM.decode()
GROUPS = (OFFERBUS, "the CLI", "ZooKeeper", "container engine", "kernel threads",
          "other")


def _group(pid: int, comm: str, cmdline: str) -> str:
    if pid == os.getpid():
        return "the CLI"  # this process's waited-for children: the CLI runs
    if not cmdline:
        return "kernel threads"
    if comm.startswith(ENGINE) or os.path.basename(cmdline.split(" ")[0]).startswith(ENGINE):
        return "container engine"
    if comm == FORKED_FRAMEWORK:  # its command line is its fork server's
        return f"{OFFERBUS}: frameworks.service (forked)"
    module = re.search(r" -m ((?:services|frameworks)\.[\w.]+)", cmdline)
    if module is not None:  # by module: an executor host is its agent's launcher, forked
        return f"{OFFERBUS}: {module.group(1).replace('.__main__', '')}"
    if "zookeeper" in cmdline.lower() or "QuorumPeerMain" in cmdline:
        return "ZooKeeper"
    return "other"


def cpu_by_process() -> dict[int, tuple[str, float]]:
    """Each live process's group and the CPU seconds it has used (/proc: its own, and its
    waited-for children's: runc's go to the engine's shims, each CLI run to this process)."""
    tick = os.sysconf("SC_CLK_TCK")
    used: dict[int, tuple[str, float]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or entry == "1":
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                stat = f.read()
            with open(f"/proc/{entry}/cmdline", "rb") as fb:
                cmdline = fb.read().replace(b"\0", b" ").decode(errors="replace").strip()
        except OSError:
            continue  # it ended meanwhile
        comm = stat[stat.index("(") + 1:stat.rindex(")")]
        fields = stat[stat.rindex(")") + 2:].split()
        ticks = sum(int(x) for x in fields[11:15])  # utime, stime, cutime, cstime
        used[int(entry)] = (_group(int(entry), comm, cmdline), ticks / tick)
    return used


def cpu_by_group(before: dict[int, tuple[str, float]]) -> dict[str, float]:
    """CPU seconds each group used since `before` (cpu_by_process()): processes alive now,
    from their start if they are new. (A process that ended unwaited-for took its time
    with it: the kernel's short-lived workers, mostly.)"""
    used = dict.fromkeys(GROUPS, 0.0)
    for pid, (group, seconds) in cpu_by_process().items():
        was = before.get(pid)
        spent = seconds - (was[1] if was is not None and was[0] == group else 0.0)
        if group.startswith(f"{OFFERBUS}: "):  # its module's row, and the services' total
            used[group] = used.get(group, 0.0) + spent
            group = OFFERBUS
        used[group] += spent
    return used


def _subscribed(run_dir: Path, name: str, job: bool) -> float:
    """When the service's framework subscribed: its own log's line, or for a job the job
    runner's first such line after the one that started the job's driver."""
    log = run_dir / "logs" / ("jobs.log" if job else f"framework-{name}.log")
    lines = iter(log.read_text().splitlines())
    if job:
        next((line for line in lines if f"driver started framework={name} " in line), "")
    return next((t for line in lines if " subscribed " in line
                 and (t := _log_time(line)) is not None), float("nan"))


def one_round(client: docker.DockerClient, run_dir: Path, n: int, name: str,
              job: bool = False) -> dict[str, float]:
    """Each step's seconds after the CLI started, for one `offerbus run` of `n` (with `job`:
    `offerbus job run FILE`), and the CPU seconds each group of processes used meanwhile
    ("cpu: GROUP")."""
    if job:
        path = run_dir / f"{name}.toml"
        path.write_text(f'name = "{name}"\nimage = "{IMAGE}"\ncommand = ["sleep", "3600"]\n'
                        f'instances = {n}\n[resources]\ncpus = 0.1\nmem = 32\n')
        submit = ["job", "run", str(path)]
    else:
        submit = ["run", "--name", name, "--image", IMAGE, "--instances", str(n),
                  "--cpus", "0.1", "--mem", "32", "--", "sleep", "3600"]
    before = cpu_by_process()
    started = time.time()
    _cli(run_dir, *submit)
    returned = time.time()
    used = cpu_by_group(before)
    try:
        ours = [c for c in client.containers.list(filters={"label": "org.offerbus.task_id"})
                if c.labels.get("org.offerbus.task_id", "").startswith(f"{name}-")]
        created = sorted(_engine_time(c.attrs["Created"]) for c in ours)
        running = sorted(_engine_time(c.attrs["State"]["StartedAt"]) for c in ours)
        subscribed = _subscribed(run_dir, name, job)
    finally:
        _cli(run_dir, *(["job", "stop"] if job else ["stop"]), name)
        if job:
            path.unlink(missing_ok=True)
    if len(created) != n:
        raise RuntimeError(f"{name}: {len(created)} containers found, {n} expected")
    at = {"framework subscribed": subscribed, "first container created": created[0],
          "last container created": created[-1], "first container started": running[0],
          "last container started": running[-1], "CLI returned": returned}
    return {**{step: at[step] - started for step in STEPS},
            **{f"cpu: {g}": v for g, v in used.items()}}


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="python -m bench.timeline", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--instances", type=int, default=20)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--run-dir", type=Path, default=Path(".run/cluster"))
    ap.add_argument("--job", action="store_true",
                    help="time `offerbus job run FILE` (the cluster's job runner) instead")
    args = ap.parse_args(argv)
    client = docker.from_env()
    rounds: list[dict[str, float]] = []
    how = "offerbus job run" if args.job else "offerbus run"
    print(f"bench timeline: `{how}` of {args.instances} instances, {args.rounds} rounds, "
          f"against the cluster of {args.run_dir}")
    for r in range(args.rounds):
        name = f"tl{args.instances}r{r}x{int(time.time()) % 100000}"
        rounds.append(one_round(client, args.run_dir, args.instances, name, args.job))
        progress(f"round {r + 1}/{args.rounds}: " + ", ".join(
            f"{step} +{rounds[-1][step]:.3f}s" for step in STEPS) + "; CPU-s " + ", ".join(
            f"{g} {rounds[-1][f'cpu: {g}']:.2f}" for g in GROUPS))
    medians = {step: statistics.median(r[step] for r in rounds) for step in STEPS}
    print(f"\n{'step':28s} {'median':>8s}   min-max (seconds after the CLI started)")
    for step in STEPS:
        values = [r[step] for r in rounds]
        print(f"{step:28s} {medians[step]:7.3f}s   {min(values):.3f}-{max(values):.3f}")
    cores = os.cpu_count() or 1
    print(f"\nCPU seconds from the CLI's start to its return ({cores} cores: "
          f"{cores * medians['CLI returned']:.1f} CPU-s in all)")
    modules = sorted({k for r in rounds for k in r if k.startswith(f"cpu: {OFFERBUS}: ")})
    for key in [f"cpu: {g}" for g in GROUPS[:1]] + modules + [f"cpu: {g}" for g in GROUPS[1:]]:
        values = [r.get(key, 0.0) for r in rounds]
        label = key.removeprefix("cpu: ").replace(f"{OFFERBUS}: ", "  ")
        print(f"{label:28s} {statistics.median(values):7.2f}    "
              f"{min(values):.2f}-{max(values):.2f}")
    result: dict[str, Any] = {"instances": args.instances, "submit": how, "rounds": rounds,
                              "median": medians}
    print(f"results: {write('timeline-job' if args.job else 'timeline', result)}")


if __name__ == "__main__":
    main()
