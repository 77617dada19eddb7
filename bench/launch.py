"""Time from submit to N RUNNING containers (N = 20 and 50), three runs each, measured in one
run on the same engine: Offerbus (the service framework through the SDK on a local
3-agent cluster), a single-node Docker Swarm at its best (image by ID with
--no-resolve-image, polled through the API), and the floor: N containers started straight
from the docker SDK by 8 threads."""

from __future__ import annotations

import shutil
import statistics
import subprocess
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import docker

from bench.report import progress, write
from frameworks.sdk.driver import SchedulerDriver
from frameworks.service import ServiceScheduler, ServiceSpec
from schemas import common_pb2
from services.cli import cluster as local_cluster

IMAGE = "offerbus/busybox:latest"
SIZES = (20, 50)
RUNS = 3
LABEL = "org.offerbus.bench"
DEADLINE = 180.0


def _wait(predicate: Any, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what} not within {timeout:g}s")
        time.sleep(0.02)  # polling a condition with a deadline


def _gone(client: docker.DockerClient, label: str) -> None:
    _wait(lambda: not client.containers.list(all=True, sparse=True,
                                             filters={"label": label}), 60, "cleanup")


# -- the floor: the docker SDK, 8 threads ------------------------------------------------
def floor_run(client: docker.DockerClient, n: int) -> float:
    def start(i: int) -> None:
        client.containers.run(IMAGE, ["sleep", "3600"], detach=True, labels={LABEL: "floor"},
                              name=f"bench-floor-{i}")

    t = time.perf_counter()
    with ThreadPoolExecutor(8) as pool:
        list(pool.map(start, range(n)))
    elapsed = time.perf_counter() - t
    for c in client.containers.list(all=True, filters={"label": f"{LABEL}=floor"}):
        c.remove(force=True)
    return elapsed


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
    swarm_label = "com.docker.swarm.service.name=bench-swarm"
    _wait(lambda: not client.containers.list(all=True, sparse=True,
                                             filters={"label": swarm_label}), 60, "swarm cleanup")
    return elapsed


# -- Offerbus --------------------------------------------------------------------------------
def offerbus_run(client: docker.DockerClient, url: str, n: int, run: int) -> float:
    name = f"bench{n}r{run}"
    spec = ServiceSpec(name=name, image=IMAGE, instances=n, cpus=0.1, mem=32,
                       command=["sleep", "3600"], kill_grace_s=0.2)
    sched = ServiceScheduler(spec)
    info = common_pb2.FrameworkInfo(name=name, role="*", principal=name, failover_timeout_s=5)
    t = time.perf_counter()
    driver = SchedulerDriver(sched, info, url)
    driver.start()

    def running() -> bool:
        with sched.lock:
            return sum(1 for i in sched.instances.values() if i.state == "TASK_RUNNING") >= n

    _wait(running, DEADLINE, f"offerbus: {n} running")
    elapsed = time.perf_counter() - t
    fid = driver.framework_id
    driver.stop(failover=False)
    driver.join(10)
    # Only this framework's containers: another cluster may share the engine (`make run`).
    _gone(client, f"org.offerbus.framework_id={fid}")
    return elapsed


def _summary(xs: list[float]) -> dict[str, float]:
    return {"min": min(xs), "median": statistics.median(xs), "max": max(xs)}


def main() -> None:
    print("bench launch: submit -> N RUNNING containers (Offerbus, Docker Swarm, docker SDK)")
    client = docker.from_env(timeout=120)
    image_id = client.images.get(IMAGE).id
    results: dict[str, Any] = {"sizes": list(SIZES), "runs": RUNS, "image": IMAGE}
    joined_swarm = client.info().get("Swarm", {}).get("LocalNodeState") != "active"
    if joined_swarm:
        subprocess.run(["docker", "swarm", "init", "--advertise-addr", "127.0.0.1"],
                       check=True, capture_output=True)
    run_dir = Path(tempfile.mkdtemp(prefix="offerbus-bench-"))
    try:
        url = local_cluster.up(local_cluster.UpOptions(
            run_dir=run_dir, agents=3, agent_resources="cpus:8;mem:8192;disk:10240;"
            "ports:[31000-31999]", standalone=False, timeout=90))
        for n in SIZES:
            times: dict[str, list[float]] = {"floor": [], "swarm": [], "offerbus": []}
            for r in range(RUNS):
                systems = ["floor", "swarm", "offerbus"]
                for system in systems[r % 3:] + systems[:r % 3]:  # none always runs first
                    if system == "floor":
                        times[system].append(floor_run(client, n))
                        _gone(client, f"{LABEL}=floor")
                    elif system == "swarm":
                        times[system].append(swarm_run(client, image_id, n))
                    else:
                        times[system].append(offerbus_run(client, url, n, r))
                progress(f"N={n} run {r + 1}/{RUNS}: floor {times['floor'][-1]:.2f}s, swarm "
                         f"{times['swarm'][-1]:.2f}s, offerbus {times['offerbus'][-1]:.2f}s")
            results[f"n{n}"] = {k: {"runs": v, **_summary(v)} for k, v in times.items()}
    finally:
        local_cluster.down(run_dir)
        shutil.rmtree(run_dir, ignore_errors=True)
        if joined_swarm:
            subprocess.run(["docker", "swarm", "leave", "--force"], capture_output=True)
    print(f"\n{'N':>4} {'docker SDK (floor)':>22} {'Swarm (by ID)':>22} {'Offerbus':>22}"
          f" {'Offerbus/floor':>15} {'Offerbus/Swarm':>15}")
    for n in SIZES:
        row = results[f"n{n}"]  # name -> {"runs", "min", "median", "max"}
        cells = [f"{row[k]['median']:.2f}s ({row[k]['min']:.2f}-{row[k]['max']:.2f})"
                 for k in ("floor", "swarm", "offerbus")]
        of = row["offerbus"]["median"] / row["floor"]["median"]
        os_ = row["offerbus"]["median"] / row["swarm"]["median"]
        row["ratios"] = {"offerbus_over_floor": of, "offerbus_over_swarm": os_,
                         "swarm_over_floor": row["swarm"]["median"] / row["floor"]["median"]}
        print(f"{n:>4} {cells[0]:>22} {cells[1]:>22} {cells[2]:>22} {of:>14.2f}x {os_:>14.2f}x")
    print("(median of 3, min-max in brackets)")
    print(f"results: {write('launch', results)}")


if __name__ == "__main__":
    main()
