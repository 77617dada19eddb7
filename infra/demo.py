"""``make run``: bring up a local Offerbus cluster (ZooKeeper, master, allocator,
offer-broker, three agents, each a separate process), deploy a demo service of several
containers through a framework, show them reach RUNNING across the agents, and say where
to look and how to stop.

    python -m infra.demo [--run-dir .run/cluster] [--instances 6]
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from pathlib import Path

DEMO_COMMAND = ["sh", "-c", 'while true; do echo "hello from $HOSTNAME at $(date)"; sleep 5; '
                "done"]


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m infra.demo", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--run-dir", type=Path, default=Path(".run/cluster"))
    ap.add_argument("--instances", type=int, default=6)
    ap.add_argument("--image", default="offerbus/busybox:latest")
    args = ap.parse_args(argv)
    os.environ.setdefault("COLUMNS", "120")

    from services.cli import main as cli
    from services.cli.lifecycle import EXIT_NAME_IN_USE

    base = ["--run-dir", str(args.run_dir), "--timeout", "90"]
    steps: list[tuple[str, list[str]]] = [
        ("1. Bring up the cluster", ["up"]),
        ("2. The agents (one per 'VM', each with its own resources and rack)", ["agents"]),
        (f"3. Deploy the demo service: {args.instances} containers through the service "
         "framework", ["run", "--name", "demo", "--image", args.image, "--instances",
                       str(args.instances), "--cpus", "0.1", "--mem", "32", "--role", "demo",
                       "--", *DEMO_COMMAND]),
        ("4. Where each instance runs", ["tasks"]),
        ("5. The cluster at a glance", ["status"]),
    ]
    for title, command in steps:
        print(f"\n== {title}\n   $ offerbus {' '.join(command[:1] + command[1:6])}"
              f"{' ...' if len(command) > 6 else ''}", flush=True)
        code = cli.main(base + command)
        if code == EXIT_NAME_IN_USE and command[0] == "run":  # `make run` again: keep it
            print("   the demo service runs already (from an earlier `make run`); setting "
                  f"its size to {args.instances}", flush=True)
            code = cli.main([*base, "scale", "demo", str(args.instances)])
        if code != 0:
            print(f"\nmake run: step failed ({title}); logs are in {args.run_dir}/logs/",
                  file=sys.stderr)
            return code
    venv = ".venv/bin/offerbus"
    print(f"""
== What to try next
   {venv} tasks                      what runs where
   {venv} logs demo-0-1              an instance's output
   {venv} kill demo-0-1              the framework replaces it
   {venv} scale demo 10              more instances
   {venv} stop demo                  remove the service and its containers
   {venv} roles                      fair shares per role (any listing takes --json)
   {venv} agents / frameworks        the fleet and who uses it
   {venv} job plan frameworks/jobs/web.toml   where a job file's instances would go
   {venv} job run frameworks/jobs/web.toml    a job the cluster keeps running (`job list`)
   {venv} roles quota demo --limit cpus:0.3   cap the demo's role; then `scale demo 10`
                                 and `{venv} why demo` names the limit
   {venv} chaos run chaos/scenarios/short.toml   a short fault campaign on its own fleet
   dashboard, /state and /metrics:   the master's address in `{venv} status`
   logs of every service:            {args.run_dir}/logs/
   stop everything:                  make down   (or {venv} down)
""")
    return 0


if __name__ == "__main__":
    sys.exit(main())
