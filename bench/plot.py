"""How the control plane's costs grow with agents (issue 8 (f)): one PNG with (a) the
allocation cycle (Mesos's decline shape, incremental and full scan, per framework count),
(b) subscribe -> single task RUNNING and (c) tasks RUNNING per second (bench scale), drawn
from the JSON the benchmarks wrote in bench/results/. `python -m bench plot` (after
`allocation` and `scale`); writes bench/results/scale.png. Log-log axes: a straight line of
slope 1 is linear growth."""

from __future__ import annotations

import json
import statistics
from typing import Any

from bench.report import RESULTS


def _load(name: str) -> dict[str, Any] | None:
    path = RESULTS / f"{name}.json"
    return json.loads(path.read_text()) if path.exists() else None


def main() -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    alloc, scale = _load("allocation"), _load("scale")
    if alloc is None and scale is None:
        print("bench plot: no results yet: run `python -m bench allocation scale` first")
        return
    fig, axes = plt.subplots(1, 3, figsize=(15, 4.5))
    ax = axes[0]
    if alloc is not None:
        series: dict[tuple[str, int], list[tuple[int, float]]] = {}
        for row in alloc["runs"]:
            if row.get("filter") != "default" or "decline_p50_s" not in row:
                continue  # (the 5 s filter of a decline without one; Mesos's shape)
            series.setdefault((row["peer"], row["frameworks"]), []).append(
                (row["agents"], row["decline_p50_s"] * 1e3))
        for (peer, frameworks), points in sorted(series.items()):
            points.sort()
            ax.plot([p[0] for p in points], [p[1] for p in points], marker="o",
                    label=f"{peer}, {frameworks} frameworks")
        ax.axhline(250, color="grey", linestyle=":", label="target at 10k x 1k: 250 ms")
    _axes(ax, "(a) allocation cycle, all declining", "ms per cycle (p50)")
    ax = axes[1]
    rows = [r for r in (scale or {}).get("rows", []) if "subscribe_to_running_s" in r]
    if rows:
        pts = sorted((r["agents"], statistics.median(r["subscribe_to_running_s"]) * 1e3)
                     for r in rows)
        ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o",
                label="subscribe -> RUNNING (median)")
        ax.axhline(250, color="grey", linestyle=":", label="target at 50k: 250 ms")
    _axes(ax, "(b) a new framework's first task", "ms")
    ax = axes[2]
    rows = [r for r in (scale or {}).get("rows", []) if "launch_rate" in r]
    if rows:
        pts = sorted((r["agents"], r["launch_rate"]) for r in rows)
        ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o",
                label="tasks RUNNING per second")
        ax.axhline(5000, color="grey", linestyle=":", label="target: 5,000/s")
    _axes(ax, "(c) control-plane throughput", "tasks/s")
    fig.suptitle("Offerbus control plane against the number of agents (log-log)")
    fig.tight_layout()
    out = RESULTS / "scale.png"
    fig.savefig(out, dpi=110)
    print(f"written {out}")


def _axes(ax: Any, title: str, ylabel: str) -> None:
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("agents")
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.grid(True, which="both", alpha=0.3)
    if ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize=8)


if __name__ == "__main__":
    main()

