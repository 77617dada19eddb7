"""`python -m bench [NAME ...]`: run the named benchmarks (default: all)."""

from __future__ import annotations

import sys

from bench import bus, launch, tracing

BENCHES = {"bus": bus.main, "launch": launch.main, "tracing": tracing.main}


def main(argv: list[str]) -> int:
    names = argv or list(BENCHES)
    unknown = [n for n in names if n not in BENCHES]
    if unknown:
        print(f"unknown benchmark(s): {', '.join(unknown)}; known: {', '.join(BENCHES)}",
              file=sys.stderr)
        return 2
    for name in names:
        BENCHES[name]()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
