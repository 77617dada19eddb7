"""The command line and table every in-process profile driver shares (bench.alloc_profile,
bench.master_profile): phases that build their input, then run once per repeat; CPU seconds
(min of the repeats) per phase and per item; one phase profiled with cProfile on request."""

from __future__ import annotations

import argparse
import cProfile
import gc
import pstats
import time
from collections.abc import Callable, Mapping

# A phase: (agents, tasks per agent) -> (run, items); run() returns CPU seconds it spent on
# setup to leave out of the figure (0 when none).
Phase = Callable[[int, int], tuple[Callable[[], float], int]]


def main(name: str, doc: str, phases: Mapping[str, Phase], *, agents: int, item: str,
         profile_lines: int = 25) -> None:
    ap = argparse.ArgumentParser(prog=f"python -m bench.{name}", description=doc.split("\n\n")[0])
    ap.add_argument("--agents", type=int, default=agents)
    ap.add_argument("--tasks-per-agent", type=int, default=10)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--phases", default=",".join(phases))
    ap.add_argument("--profile", default="", choices=["", *phases],
                    help="a phase to profile (cProfile, once)")
    args = ap.parse_args()
    unknown = [p for p in args.phases.split(",") if p not in phases]
    if unknown:
        ap.error(f"--phases: unknown {', '.join(unknown)} (of {', '.join(phases)})")
    print(f"{name}: {args.agents} agents x {args.tasks_per_agent} tasks, min of {args.repeat}")
    print(f"{'phase':<16} {'cpu_s':>8} {item + 's':>8} {'us/' + item:>8}")
    for phase in args.phases.split(","):
        best, items = float("inf"), 0
        for _ in range(args.repeat):
            run, items = phases[phase](args.agents, args.tasks_per_agent)
            gc.collect()
            t0 = time.process_time()
            excluded = run()
            best = min(best, time.process_time() - t0 - (excluded or 0.0))
        print(f"{phase:<16} {best:8.3f} {items:8d} {best / items * 1e6:8.1f}")
    if args.profile:
        run, _ = phases[args.profile](args.agents, args.tasks_per_agent)
        prof = cProfile.Profile()
        prof.runcall(run)
        pstats.Stats(prof).sort_stats("tottime").print_stats(profile_lines)
