"""A chaos report read back: the summary per fault type (p50/p95/max detection and MTTR,
losses, duplicates, violations) printed with rich, the list of what failed (any loss or
violation, any fault not recovered), and two PNG plots: the timeline (leader epoch and
running tasks with fault markers) and MTTR per fault type."""

from __future__ import annotations

import itertools
import statistics
from collections import defaultdict
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

LOSSES = ("tasks_lost", "updates_lost", "updates_wrong", "duplicates", "violations")


def _pct(values: list[float], q: float) -> float | None:
    if not values:
        return None
    if len(values) == 1:
        return values[0]
    return statistics.quantiles(values, n=100, method="inclusive")[int(q) - 1]


def summary(report: dict[str, Any]) -> list[dict[str, Any]]:
    """One row per fault type, in the order the types first occurred."""
    by: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for o in report["outcomes"]:
        by[o["label"]].append(o)
    rows = []
    for label, outs in by.items():
        mttr = [o["mttr_s"] for o in outs if o["mttr_s"] is not None]
        det = [o["detected_s"] for o in outs if o["detected_s"] is not None]
        rows.append({"fault": label, "n": len(outs), "recovered": len(mttr),
                     "detect_p50": _pct(det, 50),
                     "mttr_p50": _pct(mttr, 50), "mttr_p95": _pct(mttr, 95),
                     "mttr_max": max(mttr) if mttr else None,
                     **{k: sum(len(o[k]) for o in outs) for k in LOSSES}})
    return rows


def failures(report: dict[str, Any]) -> list[str]:
    """Everything that makes the campaign fail: a loss, a violation, an unrecovered fault,
    faults planned but not played."""
    out = []
    for o in report["outcomes"]:
        if o["mttr_s"] is None:
            out.append(f"fault {o['index']} ({o['label']} on {o['target']}) not recovered: "
                       f"{o['waiting_for']}")
        for key in LOSSES:
            if o[key]:
                out.append(f"fault {o['index']} ({o['label']} on {o['target']}): "
                           f"{key} {o[key][:5]}")
    for key, items in report.get("unattributed", {}).items():
        if items:
            out.append(f"before any fault: {key} {items[:5]}")
    played = len(report["outcomes"])
    if played < report["faults_planned"]:
        out.append(f"only {played} of {report['faults_planned']} faults played")
    return out


def _f(v: float | None) -> str:
    return "-" if v is None else f"{v:.2f}"


def print_summary(report: dict[str, Any], console: Console | None = None) -> None:
    console = console or Console()
    sc = report["scenario"]
    table = Table(title=f"chaos {sc['name']} (seed {sc['seed']}, fleet {report['fleet_id']}: "
                        f"{sc['fleet']['agents']} agents, {report['service_instances']} "
                        f"service containers, {report.get('job_instances', 0)} job "
                        f"instances, {report['short_tasks']} short tasks)")
    for col in ("fault", "n", "recovered", "detect p50 s", "MTTR p50 s", "MTTR p95 s",
                "MTTR max s", "tasks lost", "updates lost", "updates wrong", "dup launches",
                "violations"):
        table.add_column(col, justify="left" if col == "fault" else "right")
    for r in summary(report):
        table.add_row(r["fault"], str(r["n"]), str(r["recovered"]), _f(r["detect_p50"]),
                      _f(r["mttr_p50"]), _f(r["mttr_p95"]), _f(r["mttr_max"]),
                      *(str(r[k]) for k in LOSSES))
    console.print(table)
    not_started = report.get("short_not_started", [])
    if not_started:
        console.print(f"{len(not_started)} short task(s) never reached an executor (a launch "
                      f"lost in a failover, answered by reconciliation): {not_started[:5]}")
    reconciled = report.get("short_reconciled_only", [])
    if reconciled:
        console.print(f"{len(reconciled)} short task(s) whose end the framework heard only by "
                      f"reconciliation: {reconciled[:5]}")
    problems = failures(report)
    if problems:
        console.print(f"[red]FAILED[/]: {len(problems)} problem(s)")
        for p in problems[:20]:
            console.print(f"  - {p}")
    else:
        console.print("[green]passed[/]: no loss, no duplicate launch, no violation")


def plot(report: dict[str, Any], stem: Path) -> list[Path]:
    """<stem>-timeline.png and <stem>-mttr.png; [] when matplotlib is missing."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return []
    paths = []
    tl = report["timeline"]
    nan = float("nan")
    t = [p["t"] for p in tl]

    def served(key: str) -> list[float]:  # no master serving: a gap, not a zero
        return [float(p[key]) if p["leader"] else nan for p in tl]

    fig, (ax1, ax2) = plt.subplots(2, 1, figsize=(12, 6), sharex=True)
    ax1.step(t, served("epoch"), where="post", color="tab:blue")
    for p, q in itertools.pairwise(tl):
        if not p["leader"]:
            ax1.axvspan(p["t"], q["t"], color="tab:red", alpha=0.25, lw=0)
    ax1.set_ylabel("master epoch\n(red: no master serving)")
    ax2.plot(t, served("running"), label="running tasks (master)", color="tab:green")
    ax2.plot(t, served("registered"), label="agents registered", color="tab:orange")
    if report.get("containers"):
        ax2.plot([c[0] for c in report["containers"]], [c[1] for c in report["containers"]],
                 label="running containers (Docker)", color="tab:gray", alpha=0.6)
    colors: dict[str, Any] = {}
    for e in report["events"]:
        c = colors.setdefault(e["fault"], plt.get_cmap("tab20")(len(colors) % 20))
        for ax in (ax1, ax2):
            ax.axvline(e["t"], color=c, alpha=0.5, linestyle="--")
    for label, c in colors.items():
        ax1.plot([], [], color=c, linestyle="--", label=label)
    ax1.legend(loc="upper left", fontsize=7)
    ax2.legend(loc="lower left", fontsize=7)
    ax2.set_xlabel("seconds since the campaign started")
    fig.suptitle(f"chaos {report['scenario']['name']}: timeline")
    fig.tight_layout()
    paths.append(stem.with_name(stem.name + "-timeline.png"))
    fig.savefig(paths[-1], dpi=100)
    plt.close(fig)
    rows = [r for r in summary(report) if r["recovered"]]
    data = [[o["mttr_s"] for o in report["outcomes"]
             if o["label"] == r["fault"] and o["mttr_s"] is not None] for r in rows]
    fig, ax = plt.subplots(figsize=(10, 4 + 0.2 * len(rows)))
    if data:
        ax.boxplot(data, vert=False, tick_labels=[r["fault"] for r in rows])
        for i, d in enumerate(data, 1):
            ax.scatter(d, [i] * len(d), s=10, alpha=0.6)
    ax.set_xlabel("MTTR (s): fault -> master serving, agents registered, offers, M running")
    fig.suptitle(f"chaos {report['scenario']['name']}: MTTR per fault type")
    fig.tight_layout()
    paths.append(stem.with_name(stem.name + "-mttr.png"))
    fig.savefig(paths[-1], dpi=100)
    plt.close(fig)
    return paths
