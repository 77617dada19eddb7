"""`python -m bench fairness`: how far the allocation ends from DRF's, with greedy frameworks
arriving one after another (the order rotated per trial), for three allocator peers in the
same run (their order rotated too):

- `mesos`: frameworks declare nothing: whole agents' free resources in DRF order, as Mesos
  offers them (a study of DRF in Mesos found allocations up to 90% off the DRF share);
- `demand`: frameworks declare their task shape (REQUEST): progressive filling, no revocation;
- `offerbus`: demand and revocation (what a framework holds beyond its share goes back).

Each scenario runs with frameworks arriving one after another (settled in between: the
first takes all it can) and all at once ("together").

Deviation = |dominant share - DRF's| / DRF's, per framework; the table shows the worst and
the mean over frameworks (median over trials), tasks revoked, cycles to settle and the
time of one cycle. The reference is bench/drf.py's progressive filling (first fit across
agents), computed without the allocator."""

from __future__ import annotations

import statistics
import sys
import time
from typing import Any

from bench import report
from bench.drf import GreedyCluster, dominant_share, progressive_filling
from services.resources import Resources

GB = 1024.0
PEERS = ("mesos", "demand", "offerbus")
WANT = 10_000  # greedy: more than fits
# Cycles in a row without a launch, kill or reclaim (time jumping to each filter's end and
# each revocation's grace) after which an arrival has settled.
QUIET = 30


def scenarios() -> dict[str, tuple[dict[str, Resources], dict[str, tuple[Resources, float]]]]:
    paper = {"agent-1": Resources.of(cpus=9, mem=18 * GB)}
    a, b = Resources.of(cpus=1, mem=4 * GB), Resources.of(cpus=3, mem=1 * GB)
    fleet = {f"agent-{i:02d}": Resources.of(cpus=8, mem=32 * GB) for i in range(20)}
    shapes = [(1, 4), (3, 1), (2, 2), (0.5, 6), (4, 2), (1, 1)]
    return {
        "paper 1x(9cpu,18GB) A,B": (paper, {"A": (a, 1.0), "B": (b, 1.0)}),
        "paper weighted A:B=2:1": ({"agent-1": Resources.of(cpus=18, mem=36 * GB)},
                                   {"A": (a, 2.0), "B": (b, 1.0)}),
        "20x(8cpu,32GB) 6 shapes": (fleet, {f"F{i}": (Resources.of(cpus=c, mem=m * GB), 1.0)
                                           for i, (c, m) in enumerate(shapes)}),
    }


TOGETHER = " together"  # a scenario name ending so: all frameworks arrive at once


def run_one(peer: str, agents: dict[str, Resources], fws: dict[str, tuple[Resources, float]],
            order: list[str], together: bool = False) -> dict[str, Any]:
    cluster = GreedyCluster(agents, grace=5.0 if peer == "offerbus" else None)
    started = time.perf_counter()
    for fid in order:
        task, weight = fws[fid]
        cluster.add(fid, task, WANT, weight, declare=peer != "mesos")
        if not together:
            cluster.settle(rounds=5000, quiet=QUIET)
    cluster.settle(rounds=5000, quiet=QUIET)
    elapsed = time.perf_counter() - started
    total = Resources.total(agents.values())
    ref = progressive_filling(agents, fws)
    devs = {}
    for fid, (task, _) in fws.items():
        want = dominant_share(task, ref[fid], total)
        got = dominant_share(task, cluster.count(fid), total)
        devs[fid] = abs(got - want) / want if want else 0.0
    return {"counts": {f: cluster.count(f) for f in fws}, "drf": ref,
            "max_dev": max(devs.values()), "mean_dev": statistics.fmean(devs.values()),
            "revoked": cluster.revoked, "reclaims": cluster.reclaims, "cycles": cluster.cycles,
            "cycle_ms": elapsed / max(cluster.cycles, 1) * 1e3}


def all_scenarios() -> dict[str, Any]:
    """Each scenario twice: frameworks arriving one after another, and all at once."""
    out: dict[str, Any] = {}
    for name, sc in scenarios().items():
        out[name] = sc
        out[name + TOGETHER] = sc
    return out


def main(trials: int = 6) -> None:
    rows: list[dict[str, Any]] = []
    for name, (agents, fws) in all_scenarios().items():
        names = sorted(fws)
        for t in range(trials):
            order = names[t % len(names):] + names[:t % len(names)]  # arrival rotated
            peers = PEERS[t % len(PEERS):] + PEERS[:t % len(PEERS)]  # who runs first too
            for peer in peers:
                r = run_one(peer, agents, fws, order, name.endswith(TOGETHER))
                rows.append({"scenario": name, "peer": peer, "trial": t, "order": order, **r})
            report.progress(f"{name}: trial {t + 1}/{trials}")
    print(f"\n{'scenario':35} {'peer':9} {'max dev':>8} {'mean dev':>9} {'vs mesos':>9} "
          f"{'revoked':>8} {'cycles':>7} {'cycle ms':>9}  counts (DRF)")
    summary: dict[str, dict[str, dict[str, float]]] = {}
    for name in all_scenarios():
        base = None
        for peer in PEERS:
            mine = [r for r in rows if r["scenario"] == name and r["peer"] == peer]
            s = {k: statistics.median(r[k] for r in mine)
                 for k in ("max_dev", "mean_dev", "revoked", "cycles", "cycle_ms")}
            summary.setdefault(name, {})[peer] = s
            base = s["max_dev"] if peer == "mesos" else base
            ratio = f"{s['max_dev'] / base:.2f}x" if base else "-"
            last = mine[-1]
            counts = " ".join(f"{f}:{last['counts'][f]}({last['drf'][f]})"
                              for f in sorted(last["counts"]))
            print(f"{name:35} {peer:9} {s['max_dev']:8.1%} {s['mean_dev']:9.1%} {ratio:>9} "
                  f"{s['revoked']:8.0f} {s['cycles']:7.0f} {s['cycle_ms']:9.2f}  {counts}")
    path = report.write("fairness", {"trials": trials, "peers": list(PEERS),
                                     "summary": summary, "runs": rows})
    print(f"\nwritten {path}")


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 6)
