"""`python -m infra.rollout INVENTORY [--dry-run] [--only ROLE] [--host NAME]...`:
install and start an Offerbus fleet over SSH. The thin shell around infra/inventory.py
(which reads, checks and renders everything and makes the plan): it refuses a bad inventory
or a rendered configuration the services' loader rejects, then runs the plan's commands one
by one and stops at the first failure. --dry-run prints every command and every file instead
and contacts no host."""

from __future__ import annotations

import argparse
import shlex
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

from infra import inventory

REPO = Path(__file__).resolve().parent.parent


def show(step: inventory.Step) -> str:
    """A step as an operator reads it: the comment, the command, and a file's content."""
    head = f"# [{step.host or 'local'}] {step.what}\n{shlex.join(step.argv)}"
    if step.stdin is None:
        return head
    return f"{head} <<'OFFERBUS_EOF'\n{step.stdin}OFFERBUS_EOF"


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m infra.rollout", description=__doc__)
    ap.add_argument("inventory", help="the fleet's inventory (infra/inventory.example.toml)")
    ap.add_argument("--dry-run", action="store_true",
                    help="print every command and rendered file; run nothing")
    ap.add_argument("--only", choices=inventory.ROLES,
                    help="only the hosts with this role, and only start this role")
    ap.add_argument("--host", action="append", default=[], metavar="NAME",
                    help="only this host (repeatable), e.g. the standby masters first")
    ap.add_argument("--source", default=str(REPO), help="the tree to install (default: this "
                    "repository)")
    args = ap.parse_args(argv)
    try:
        inv = inventory.load(args.inventory)
        errors = inventory.check_configs(inv)
        if errors:
            for error in errors:
                print(f"rollout: {error}", file=sys.stderr)
            return 2
        steps = inventory.plan(inv, args.source, args.only, args.host)
    except inventory.InventoryError as exc:
        print(f"rollout: {exc}", file=sys.stderr)
        return 2
    if args.dry_run:
        print(f"# Offerbus rollout of {args.inventory}: {len(steps)} steps on "
              f"{len({s.host for s in steps})} hosts, cluster {inv.cluster_url()} (dry run)")
        for step in steps:
            print(show(step), end="\n\n")
        return 0
    for number, step in enumerate(steps, start=1):
        print(f"rollout: [{number}/{len(steps)}] {step.host}: {step.what}", flush=True)
        done = subprocess.run(step.argv, input=step.stdin, text=True, check=False)
        if done.returncode != 0:
            print(f"rollout: step {number} failed on {step.host} (exit {done.returncode}): "
                  f"{shlex.join(step.argv)}\nrollout: fix it and run again (each step is "
                  f"safe to repeat)", file=sys.stderr)
            return 1
    print(f"rollout: done; the cluster is {inv.cluster_url()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
