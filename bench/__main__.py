"""`python -m bench [--trials N] [NAME ...]`: run the named benchmarks (default: all).
`--trials` sets the failover benchmark's trials per kind (default 20; e.g. 3 for a quick
look)."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable

from bench import (
    allocation,
    bus,
    failover,
    fairness,
    launch,
    memory,
    plot,
    scale,
    state,
    tracing,
)

BENCHES: dict[str, Callable[[], None]] = {
    "bus": bus.main, "launch": lambda: launch.main([]), "tracing": tracing.main,
    "failover": failover.main,
    "memory": memory.main, "state": state.main, "scale": lambda: scale.main([]),
    "allocation": allocation.main, "fairness": fairness.main, "plot": plot.main}


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench", description=__doc__)
    ap.add_argument("names", nargs="*", metavar="NAME",
                    help=f"benchmarks to run (default: all of {', '.join(BENCHES)})")
    ap.add_argument("--trials", type=int, default=failover.TRIALS,
                    help=f"failover trials per kind (default {failover.TRIALS})")
    args = ap.parse_args(argv)
    names = args.names or list(BENCHES)
    unknown = [n for n in names if n not in BENCHES]
    if unknown:
        print(f"unknown benchmark(s): {', '.join(unknown)}; known: {', '.join(BENCHES)}",
              file=sys.stderr)
        return 2
    if args.trials < 1:
        print("--trials must be at least 1", file=sys.stderr)
        return 2
    for name in names:
        if name == "failover":
            failover.main(args.trials)
        else:
            BENCHES[name]()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
