"""`python -m infra.rollout INVENTORY --keys DIR [--dry-run] [--only ROLE] [--host NAME]...`:
install and start an Offerbus fleet over SSH, keyed (CURVE) unless the inventory says
`curve = false`: the fleet's missing key pairs are generated once in DIR (never overwritten)
and each host gets only the keys it needs. The thin shell around infra/inventory.py
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


def show(step: inventory.Step, keys: str = "") -> str:
    """A step as an operator reads it: the comment, the command, and a file's content (a key
    file's local path only: a secret is never printed)."""
    head = f"# [{step.host or 'local'}] {step.what}\n{shlex.join(step.argv)}"
    if step.stdin_key:
        return f"{head} < {shlex.quote(str(Path(keys) / step.stdin_key))}"
    if step.stdin is None:
        return head
    return f"{head} <<'OFFERBUS_EOF'\n{step.stdin}OFFERBUS_EOF"


def missing_keys(inv: inventory.Inventory, keys: Path) -> list[str]:
    """The fleet's key pairs not yet in `keys` (InventoryError on half a pair: one file of a
    pair without the other is a mistake to look at, not to paper over)."""
    out = []
    for name in inventory.key_names(inv):
        there = [(keys / f"{name}{s}").exists() for s in (".key", ".key_secret")]
        if all(there):
            continue
        if any(there):
            raise inventory.InventoryError(
                f"--keys {keys}: {name}.key and {name}.key_secret must both be there or "
                f"neither (it is never overwritten)")
        out.append(name)
    return out


def generate_keys(keys: Path, names: list[str]) -> None:
    from services.cli.client import CliError
    from services.cli.keys import generate

    for name in names:
        try:
            generate(keys, name)
        except CliError as exc:
            raise inventory.InventoryError(f"--keys {keys}: {exc}") from None


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m infra.rollout", description=__doc__)
    ap.add_argument("inventory", help="the fleet's inventory (infra/inventory.example.toml)")
    ap.add_argument("--dry-run", action="store_true",
                    help="print every command and rendered file; run nothing")
    ap.add_argument("--only", choices=inventory.ROLES,
                    help="only the hosts with this role, and only start this role")
    ap.add_argument("--host", action="append", default=[], metavar="NAME",
                    help="only this host (repeatable), e.g. the standby masters first")
    ap.add_argument("--keys", type=Path, metavar="DIR",
                    help="the fleet's CURVE keys (generated here when missing, never "
                    "overwritten; required unless the inventory says curve = false)")
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
        if inv.curve and args.keys is None:
            raise inventory.InventoryError(
                f"{args.inventory} is keyed (CURVE, the default): give --keys DIR, where "
                f"its key pairs are (or will be generated); see docs/OPERATIONS.md")
        new = missing_keys(inv, args.keys) if inv.curve else []
    except inventory.InventoryError as exc:
        print(f"rollout: {exc}", file=sys.stderr)
        return 2
    keys = str(args.keys or "")
    notes = [f"# {w}" for w in inventory.warnings(inv)]
    if new:
        kept = len(inventory.key_names(inv)) - len(new)
        notes.append(f"# [local] generate the key pairs {', '.join(new)} in {keys}"
                     + (f" ({kept} others are there and kept)" if kept else ""))
    if args.dry_run:
        print(f"# Offerbus rollout of {args.inventory}: {len(steps)} steps on "
              f"{len({s.host for s in steps})} hosts, cluster {inv.cluster_url()} (dry run)")
        for line in notes:
            print(line)
        print()
        for step in steps:
            print(show(step, keys), end="\n\n")
        return 0
    for line in notes:
        print(f"rollout: {line[2:]}", file=sys.stderr if "WARNING" in line else sys.stdout)
    try:
        generate_keys(Path(keys), new)
    except inventory.InventoryError as exc:
        print(f"rollout: {exc}", file=sys.stderr)
        return 2
    for number, step in enumerate(steps, start=1):
        print(f"rollout: [{number}/{len(steps)}] {step.host}: {step.what}", flush=True)
        stdin = (Path(keys) / step.stdin_key).read_text() if step.stdin_key else step.stdin
        done = subprocess.run(step.argv, input=stdin, text=True, check=False)
        if done.returncode != 0:
            print(f"rollout: step {number} failed on {step.host} (exit {done.returncode}): "
                  f"{shlex.join(step.argv)}\nrollout: fix it and run again (each step is "
                  f"safe to repeat)", file=sys.stderr)
            return 1
    print(f"rollout: done; the cluster is {inv.cluster_url()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
