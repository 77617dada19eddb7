"""Tracing overhead, measured in one run: the same local cluster with tracing off
(OTEL_SDK_DISABLED=true) and on (every span sampled and exported to OTLP-JSON files):
offer round trip (a framework declines with refuse_seconds=0; time until the same agent is
offered again, p50/p99) and tasks launched per second (40 process-runtime tasks through the
service framework, submit to all RUNNING; median of 5)."""

from __future__ import annotations

import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from bench.report import progress, summary, write

ROUND_TRIPS = 600
TASKS = 40
LAUNCH_RUNS = 5
MODES = {
    "off": {"OTEL_SDK_DISABLED": "true"},
    "on": {"OTEL_TRACES_SAMPLER": "always_on"},
}


def worker(url: str) -> dict[str, Any]:
    """In a child process with the mode's environment: run both measurements."""
    from frameworks.sdk.driver import SchedulerDriver
    from frameworks.sdk.scheduler import Scheduler
    from frameworks.service import ServiceScheduler, ServiceSpec
    from schemas import common_pb2

    samples: list[float] = []
    declined: dict[str, float] = {}
    done = threading.Event()

    class Decliner(Scheduler):
        def offers(self, driver: Any, offers: list[common_pb2.Offer]) -> None:
            now = time.perf_counter()
            for o in offers:
                if o.agent_id in declined:
                    samples.append(now - declined.pop(o.agent_id))
                if len(samples) >= ROUND_TRIPS:
                    done.set()
                    return
                declined[o.agent_id] = time.perf_counter()
                driver.decline([o.offer_id], 0.0, reason="measuring the offer round trip")

    info = common_pb2.FrameworkInfo(name="rtt", role="*", principal="rtt")
    driver = SchedulerDriver(Decliner(), info, url)
    driver.start()
    if not done.wait(120):
        raise TimeoutError(f"only {len(samples)} offer round trips in 120 s")
    driver.stop()
    driver.join(10)

    rates = []
    for r in range(LAUNCH_RUNS):
        spec = ServiceSpec(name=f"rate{r}", image="", instances=TASKS, cpus=0.05, mem=16,
                           command=["sleep", "3600"], runtime="process", kill_grace_s=0.2)
        sched = ServiceScheduler(spec)
        t = time.perf_counter()
        d2 = SchedulerDriver(sched, common_pb2.FrameworkInfo(name=spec.name, role="*",
                                                             principal="rate"), url)
        d2.start()
        deadline = time.monotonic() + 120
        while True:
            with sched.lock:
                running = sum(1 for i in sched.instances.values()
                              if i.state == "TASK_RUNNING")
            if running >= TASKS:
                break
            if time.monotonic() > deadline:
                raise TimeoutError(f"{running}/{TASKS} RUNNING in 120 s")
            time.sleep(0.01)  # polling with a deadline
        rates.append(TASKS / (time.perf_counter() - t))
        # End this batch completely before the next, so runs do not overlap teardown.
        sched.set_instances(d2, 0)
        deadline = time.monotonic() + 60
        while True:
            with sched.lock:
                live = sum(1 for i in sched.instances.values() if i.live)
            if not live:
                break
            if time.monotonic() > deadline:
                raise TimeoutError(f"{live} tasks still live 60 s after scaling to 0")
            time.sleep(0.01)  # polling with a deadline
        d2.stop()
        d2.join(10)
    elapsed = TASKS / statistics.median(rates)
    return {"round_trip_s": samples, "launch_s": elapsed, "tasks_per_s": TASKS / elapsed,
            "tasks_per_s_runs": rates}


def run_mode(mode: str) -> dict[str, Any]:
    from services.cli import cluster as local_cluster

    run_dir = Path(tempfile.mkdtemp(prefix=f"offerbus-trace-{mode}-"))
    saved = dict(os.environ)
    os.environ.update(MODES[mode])
    try:
        url = local_cluster.up(local_cluster.UpOptions(
            run_dir=run_dir, agents=2, standalone=True, runtime="process", timeout=60,
            agent_resources="cpus:8;mem:8192;disk:1024;"
            "ports:[31000-31999]"))
        env = dict(os.environ)
        if mode == "on":
            env["OFFERBUS_TRACES_DIR"] = str(run_dir / "traces")
        out = subprocess.run([sys.executable, "-m", "bench.tracing", "--worker", url],
                             env=env, capture_output=True, text=True, timeout=400)
        if out.returncode != 0:
            raise RuntimeError(f"worker ({mode}) failed: {out.stderr[-2000:]}")
        result: dict[str, Any] = json.loads(out.stdout.strip().splitlines()[-1])
        spans = sum(len(f.read_text().splitlines()) for f in (run_dir / "traces").glob("*"))\
            if (run_dir / "traces").exists() else 0
        result["export_lines"] = spans
        return result
    finally:
        local_cluster.down(run_dir)
        os.environ.clear()
        os.environ.update(saved)
        shutil.rmtree(run_dir, ignore_errors=True)


def main() -> None:
    print("bench tracing: offer round trip and launch rate, tracing off vs on (100% sampled)")
    results: dict[str, Any] = {"round_trips": ROUND_TRIPS, "tasks": TASKS}
    for mode in MODES:
        progress(f"tracing {mode}: cluster up, {ROUND_TRIPS} offer round trips, "
                 f"{TASKS} launches")
        raw = run_mode(mode)
        rtt = summary(raw["round_trip_s"])
        results[mode] = {"offer_round_trip_ms": {k: v * 1000 if k != "n" else v
                                                 for k, v in rtt.items()},
                         "tasks_per_s": raw["tasks_per_s"], "launch_s": raw["launch_s"],
                         "tasks_per_s_runs": raw["tasks_per_s_runs"],
                         "export_lines": raw["export_lines"]}
    off, on = results["off"], results["on"]
    results["overhead"] = {
        "round_trip_p50": on["offer_round_trip_ms"]["p50"] / off["offer_round_trip_ms"]["p50"]
        - 1,
        "round_trip_p99": on["offer_round_trip_ms"]["p99"] / off["offer_round_trip_ms"]["p99"]
        - 1,
        "tasks_per_s": 1 - on["tasks_per_s"] / off["tasks_per_s"],
    }
    print(f"{'':28}{'tracing off':>14}{'tracing on':>14}{'overhead':>10}")
    for key, label in (("p50", "offer round trip p50"), ("p99", "offer round trip p99")):
        a, b = off["offer_round_trip_ms"][key], on["offer_round_trip_ms"][key]
        print(f"{label:28}{a:>11.1f} ms{b:>11.1f} ms{(b / a - 1) * 100:>9.1f}%")
    print(f"{'tasks launched per second':28}{off['tasks_per_s']:>14.1f}{on['tasks_per_s']:>14.1f}"
          f"{results['overhead']['tasks_per_s'] * 100:>9.1f}%")
    print(f"(tracing on exported {on['export_lines']} OTLP-JSON batches; {ROUND_TRIPS} round "
          f"trips and the median of {LAUNCH_RUNS} launches of {TASKS} per mode)")
    print(f"results: {write('tracing', results)}")


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--worker":
        print(json.dumps(worker(sys.argv[2])))
    else:
        main()
