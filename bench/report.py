"""Shared helpers for benchmarks: timing summaries, progress lines, JSON results."""

from __future__ import annotations

import json
import platform
import statistics
import time
from pathlib import Path
from typing import Any

RESULTS = Path(__file__).parent / "results"


def summary(samples: list[float]) -> dict[str, float]:
    ordered = sorted(samples)

    def pct(p: float) -> float:
        return ordered[min(len(ordered) - 1, int(p * len(ordered)))]

    return {"n": len(ordered), "min": ordered[0], "p50": pct(0.5), "p99": pct(0.99),
            "max": ordered[-1], "mean": statistics.fmean(ordered)}


def progress(msg: str) -> None:
    print(f"  .. {msg}", flush=True)


def write(name: str, results: dict[str, Any]) -> Path:
    RESULTS.mkdir(parents=True, exist_ok=True)
    path = RESULTS / f"{name}.json"
    doc = {"benchmark": name, "when": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
           "machine": {"python": platform.python_version(), "cpus": _cpus()}, **results}
    path.write_text(json.dumps(doc, indent=2, sort_keys=True) + "\n")
    return path


def _cpus() -> int:
    import os

    return os.cpu_count() or 0
