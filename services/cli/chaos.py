"""`offerbus chaos run SCENARIO`, `offerbus chaos replay REPORT`, `offerbus chaos clean`:
fault-injection campaigns on a real fleet (chaos/), with a progress bar, a JSON report, a
summary table and plots under chaos/results/."""

from __future__ import annotations

import argparse
import json
import signal
import sys
from pathlib import Path
from typing import Any

from rich.console import Console

console = Console()
RESULTS = Path("chaos/results")
RUN_DIR = Path(".run/chaos")


def register(sub: Any) -> None:
    """Add `chaos` and its commands to the CLI's subparsers."""
    p = sub.add_parser("chaos", help="fault-injection campaigns on a real local fleet")
    cs = p.add_subparsers(dest="chaos_cmd", required=True)
    run = cs.add_parser("run", help="run the campaign of a scenario file (TOML)")
    run.add_argument("scenario", type=Path)
    run.add_argument("--seed", type=int, help="override the scenario's seed")
    replay = cs.add_parser("replay", help="run a report's campaign again from its seed")
    replay.add_argument("report", type=Path)
    for q in (run, replay):
        q.add_argument("--out", type=Path, default=RESULTS, help="where reports go")
        q.add_argument("--work-dir", type=Path, default=RUN_DIR,
                       help="the fleet's run dir (logs, ZooKeeper data, agents)")
    clean = cs.add_parser("clean", help="remove a crashed campaign's fleet (its own only)")
    clean.add_argument("--work-dir", type=Path, default=RUN_DIR)
    p.set_defaults(fn=main)


def run_campaign(scenario: Any, work_dir: Path, out: Path) -> tuple[dict[str, Any], Path]:
    """Play `scenario` with a progress bar; the report and where it was written."""
    import logging

    from chaos.campaign import Campaign, write_report
    from chaos.fleet import clean

    work_dir.mkdir(parents=True, exist_ok=True)
    handler = logging.FileHandler(work_dir / "campaign.log")  # the framework's own lines
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    logging.getLogger().handlers[:] = [handler]
    logging.getLogger().setLevel(logging.INFO)
    logging.getLogger("kazoo").setLevel(logging.WARNING)

    clean(work_dir / "fleet", quiet=True)  # a crashed earlier run of this work dir
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    with Progress(TextColumn("[bold]{task.description}"), BarColumn(),
                  TextColumn("{task.completed}/{task.total} faults"), TimeElapsedColumn(),
                  console=console, transient=False) as bar:
        task = bar.add_task("starting", total=len(scenario.faults))

        def progress(done: int, total: int, msg: str) -> None:
            bar.update(task, completed=done, description=msg[:60])
            if not console.is_terminal:  # no live bar (a log, CI): one line per step
                console.print(f"[{done}/{total}] {msg}", highlight=False)

        campaign = Campaign(scenario, work_dir, progress)
        old = signal.signal(signal.SIGTERM, lambda *_: (_ for _ in ()).throw(KeyboardInterrupt))
        try:
            report = campaign.run()
        finally:
            signal.signal(signal.SIGTERM, old)
    return report, write_report(report, out)


def finish(report: dict[str, Any], path: Path) -> int:
    from chaos.report import failures, plot, print_summary

    print_summary(report, console if console.is_terminal else Console(width=160))
    pngs = plot(report, path.with_suffix(""))
    console.print(f"report: {path}" + (f"; plots: {', '.join(map(str, pngs))}" if pngs else
                                       " (no matplotlib: no plots)"))
    return 1 if failures(report) else 0


def main(args: argparse.Namespace) -> int:
    from chaos import scenario as sc
    from chaos.fleet import clean

    if args.chaos_cmd == "clean":
        done = clean(args.work_dir / "fleet", quiet=True)
        console.print(f"cleaned {args.work_dir}: {done or 'nothing recorded there'}")
        return 0
    try:
        if args.chaos_cmd == "run":
            scenario = sc.load(args.scenario)
            if args.seed is not None:
                scenario = sc.parse({**_toml(args.scenario), "seed": args.seed},
                                    scenario.name)
        else:
            scenario = sc.from_report(json.loads(args.report.read_text()))
    except (sc.ScenarioError, OSError, ValueError, KeyError, TypeError) as exc:
        console.print(f"[red]chaos:[/] {exc}")
        return 2
    try:
        report, path = run_campaign(scenario, args.work_dir, args.out)
    except KeyboardInterrupt:
        console.print("[yellow]interrupted[/]: the fleet was torn down")
        return 130
    return finish(report, path)


def _toml(path: Path) -> dict[str, Any]:
    import tomllib

    return tomllib.loads(path.read_text())


if __name__ == "__main__":
    ap = argparse.ArgumentParser(prog="offerbus")
    register(ap.add_subparsers(dest="cmd", required=True))
    ns = ap.parse_args()
    sys.exit(ns.fn(ns))
