"""Time from submit to N RUNNING containers (N = 20, 50 and 100), three runs each, measured in
one run on the same engine, the systems' order rotated each run so none always goes first:
Offerbus through its CLI as a user types it, two ways (`offerbus run --name X --image I
--instances N -- sleep 3600`, which starts the service framework on the submitting machine,
and `offerbus job run FILE`, which submits the job to the cluster's job runner; against a
local 3-agent cluster; each returns once N instances are RUNNING), a
single-node Docker Swarm at its best (image by ID with --no-resolve-image, polled through the
API), and the floor: N containers started straight from the docker SDK by 8 threads. Also the
agent-side memory per Offerbus task: the PSS (/proc/PID/smaps_rollup) of the processes serving
the executors, divided by N, while the N tasks run.

OFFERBUS_EXECUTOR_HOSTS=0 in the environment runs the agents with a process per executor (the
old way), for a before/after comparison.

`python -m bench.launch [--sizes 20,50,100] [--runs 3]` (`make bench` runs it with the defaults)"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import docker

from bench.report import progress, write
from services.agent.launcher import HOSTS_ENV
from services.cli import cluster as local_cluster

IMAGE = "offerbus/busybox:latest"
SIZES = (20, 50, 100)
RUNS = 3
LABEL = "org.offerbus.bench"
DEADLINE = 240.0
SYSTEMS = ("floor", "swarm", "offerbus", "offerbus-job")


def _wait(predicate: Any, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what} not within {timeout:g}s")
        time.sleep(0.02)  # polling a condition with a deadline


def _gone(client: docker.DockerClient, label: str) -> None:
    _wait(lambda: not client.containers.list(all=True, sparse=True,
                                             filters={"label": label}), 120, "cleanup")


# -- the floor: the docker SDK, 8 threads ------------------------------------------------
def floor_run(client: docker.DockerClient, n: int) -> float:
    def start(i: int) -> None:
        client.containers.run(IMAGE, ["sleep", "3600"], detach=True, labels={LABEL: "floor"},
                              name=f"bench-floor-{i}")

    t = time.perf_counter()
    try:
        with ThreadPoolExecutor(8) as pool:
            list(pool.map(start, range(n)))
        return time.perf_counter() - t
    finally:  # also when interrupted
        for c in client.containers.list(all=True, filters={"label": f"{LABEL}=floor"}):
            c.remove(force=True)
        _gone(client, f"{LABEL}=floor")


# -- Docker Swarm, at its best -------------------------------------------------------------
def swarm_run(client: docker.DockerClient, image_id: str, n: int) -> float:
    t = time.perf_counter()
    out = subprocess.run(["docker", "service", "create", "--detach", "--no-resolve-image",
                          "--replicas", str(n), "--name", "bench-swarm", "--label",
                          f"{LABEL}=swarm", image_id, "sleep", "3600"],
                         capture_output=True, text=True, check=True)
    service = client.services.get(out.stdout.strip())

    def all_running() -> bool:
        tasks = service.tasks(filters={"desired-state": "running"})
        return sum(1 for task in tasks if task["Status"]["State"] == "running") >= n

    _wait(all_running, DEADLINE, f"swarm: {n} running")
    elapsed = time.perf_counter() - t
    service.remove()
    _gone(client, "com.docker.swarm.service.name=bench-swarm")
    return elapsed


# -- Offerbus, through the CLI -----------------------------------------------------------------
def _cli(run_dir: Path, *args: str, timeout: float = DEADLINE) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "services.cli", "--run-dir", str(run_dir),
                           *args], capture_output=True, text=True, timeout=timeout, check=True)


def executor_pss(run_dir: Path, name: str) -> tuple[float, int]:
    """(PSS in MiB, processes) of the live processes that serve this service's executors:
    each executor's log names its process (pid=) in its first line."""
    pids = set()
    for log in run_dir.glob(f"agents/*/sandboxes/{name}-*/executor.log"):
        with open(log) as f:
            match = re.search(r" pid=(\d+)", f.readline())
        if match:
            pids.add(int(match.group(1)))
    total_kb = 0
    for pid in pids:
        try:
            with open(f"/proc/{pid}/smaps_rollup") as f:
                total_kb += sum(int(line.split()[1]) for line in f if line.startswith("Pss:"))
        except OSError:
            continue
    return total_kb / 1024, len(pids)


def offerbus_run(client: docker.DockerClient, run_dir: Path, n: int, run: int,
                 ) -> tuple[float, float, int]:
    """(seconds from `offerbus run` to its return with N RUNNING, PSS MiB, processes)."""
    name = f"bench{n}r{run}"
    t = time.perf_counter()
    _cli(run_dir, "run", "--name", name, "--image", IMAGE, "--instances", str(n),
         "--cpus", "0.1", "--mem", "32", "--", "sleep", "3600")
    elapsed = time.perf_counter() - t
    pss, procs = executor_pss(run_dir, name)
    _cli(run_dir, "stop", name)
    _gone(client, f"org.offerbus.cluster_id={local_cluster.known_cluster_id(run_dir)}")
    return elapsed, pss, procs


def offerbus_job_run(client: docker.DockerClient, run_dir: Path, n: int, run: int,
                     ) -> tuple[float, float, int]:
    """(seconds from `offerbus job run FILE` to its return with N RUNNING, PSS MiB,
    processes): the same service, submitted to the cluster's job runner."""
    name = f"job{n}r{run}"
    path = run_dir / f"{name}.toml"
    path.write_text(f'name = "{name}"\nimage = "{IMAGE}"\ncommand = ["sleep", "3600"]\n'
                    f'instances = {n}\n[resources]\ncpus = 0.1\nmem = 32\n')
    t = time.perf_counter()
    _cli(run_dir, "job", "run", str(path))
    elapsed = time.perf_counter() - t
    pss, procs = executor_pss(run_dir, name)
    _cli(run_dir, "job", "stop", name)
    _gone(client, f"org.offerbus.cluster_id={local_cluster.known_cluster_id(run_dir)}")
    return elapsed, pss, procs


def _sizes(text: str) -> tuple[int, ...]:
    try:
        sizes = tuple(int(part) for part in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a list of sizes: {text!r}") from None
    if not sizes or min(sizes) < 1:
        raise argparse.ArgumentTypeError(f"sizes must be at least 1: {text!r}")
    return sizes


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="python -m bench.launch",
                                 description=(__doc__ or "").split("\n\n")[0])
    ap.add_argument("--sizes", type=_sizes, default=SIZES, help="N, comma-separated (default "
                    f"{','.join(map(str, SIZES))})")
    ap.add_argument("--runs", type=int, default=RUNS, choices=range(1, 100), metavar="R",
                    help=f"rotated runs of each size (default {RUNS})")
    args = ap.parse_args(argv)
    sizes, runs = args.sizes, args.runs
    hosts = os.environ.get(HOSTS_ENV, "1") != "0"
    print("bench launch: submit -> N RUNNING containers (Offerbus CLI, Docker Swarm, docker "
          f"SDK); executors: {'hosts' if hosts else 'a process each'}")
    client = docker.from_env(timeout=120)
    image_id = client.images.get(IMAGE).id
    results: dict[str, Any] = {"sizes": list(sizes), "runs": runs, "image": IMAGE,
                               "executor_hosts": hosts}
    joined_swarm = client.info().get("Swarm", {}).get("LocalNodeState") != "active"
    if joined_swarm:
        subprocess.run(["docker", "swarm", "init", "--advertise-addr", "127.0.0.1"],
                       check=True, capture_output=True)
    run_dir = Path(tempfile.mkdtemp(prefix="offerbus-bench-"))
    try:
        local_cluster.up(local_cluster.UpOptions(
            run_dir=run_dir, agents=3, agent_resources="cpus:8;mem:8192;disk:10240;"
            "ports:[31000-31999]", standalone=False, timeout=90))
        k = 0
        for n in sizes:
            times: dict[str, list[float]] = {s: [] for s in SYSTEMS}
            pss: list[float] = []
            load: list[float] = []  # 1-minute load average after each run: how quiet it was
            for r in range(runs):
                turn = k % len(SYSTEMS)
                for system in SYSTEMS[turn:] + SYSTEMS[:turn]:  # none always runs first
                    if system == "floor":
                        times[system].append(floor_run(client, n))
                    elif system == "swarm":
                        times[system].append(swarm_run(client, image_id, n))
                    else:
                        how = offerbus_run if system == "offerbus" else offerbus_job_run
                        elapsed, mib, procs = how(client, run_dir, n, r)
                        times[system].append(elapsed)
                        if system == "offerbus":
                            pss.append(mib / n)
                k += 1
                load.append(os.getloadavg()[0])
                progress(f"N={n} run {r + 1}/{runs}: floor {times['floor'][-1]:.2f}s, swarm "
                         f"{times['swarm'][-1]:.2f}s, offerbus run {times['offerbus'][-1]:.2f}s,"
                         f" job run {times['offerbus-job'][-1]:.2f}s, {pss[-1]:.2f} MiB/task "
                         f"over {procs} processes, load {load[-1]:.1f}")
            results[f"n{n}"] = {s: {"runs": v, **_summary(v)} for s, v in times.items()}
            results[f"n{n}"]["pss_mib_per_task"] = {"runs": pss, **_summary(pss)}
            results[f"n{n}"]["load_average"] = load
    finally:
        local_cluster.down(run_dir)
        shutil.rmtree(run_dir, ignore_errors=True)
        if joined_swarm:
            subprocess.run(["docker", "swarm", "leave", "--force"], capture_output=True)
    _table(results, sizes, runs)
    print(f"results: {write('launch' if hosts else 'launch-process-executors', results)}")


def _summary(xs: list[float]) -> dict[str, float]:
    return {"min": min(xs), "median": statistics.median(xs), "max": max(xs)}


def _table(results: dict[str, Any], sizes: tuple[int, ...], runs: int) -> None:
    print(f"\n{'N':>4} {'docker SDK (floor)':>22} {'Swarm (by ID)':>22} {'offerbus run':>22}"
          f" {'offerbus job run':>22} {'run/floor':>9} {'run/Swarm':>9} {'job/floor':>9}"
          f" {'job/Swarm':>9} {'PSS/task':>9}")
    for n in sizes:
        row = results[f"n{n}"]  # name -> {"runs", "min", "median", "max"}
        cells = [f"{row[k]['median']:.2f}s ({row[k]['min']:.2f}-{row[k]['max']:.2f})"
                 for k in SYSTEMS]
        floor, swarm = row["floor"]["median"], row["swarm"]["median"]
        run, job = row["offerbus"]["median"], row["offerbus-job"]["median"]
        row["ratios"] = {"offerbus_over_floor": run / floor, "offerbus_over_swarm": run / swarm,
                         "job_over_floor": job / floor, "job_over_swarm": job / swarm,
                         "swarm_over_floor": swarm / floor}
        pss = row["pss_mib_per_task"]["median"]
        print(f"{n:>4} {cells[0]:>22} {cells[1]:>22} {cells[2]:>22} {cells[3]:>22}"
              f" {run / floor:>8.2f}x {run / swarm:>8.2f}x {job / floor:>8.2f}x"
              f" {job / swarm:>8.2f}x {pss:>5.2f} MiB")
    print(f"(median of {runs}, min-max in brackets; PSS/task: the executors' processes, agent "
          "side, of `offerbus run`)")


if __name__ == "__main__":
    main()
