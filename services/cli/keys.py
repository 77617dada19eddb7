"""`offerbus keys generate NAME [--dir DIR]` and `offerbus keys list [--dir DIR]`: CURVE key
pairs in ZeroMQ's cert format (services/bus/curve.py): NAME.key (public, to copy into the
servers' `curve_allowed_dir`) and NAME.key_secret (mode 0600, stays with its owner)."""

from __future__ import annotations

import argparse
import re
from pathlib import Path
from typing import Any

from services.bus.curve import KeyPair, list_public_keys
from services.cli.client import CliError

DEFAULT_DIR = Path("keys")
NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")


def generate(directory: Path, name: str) -> KeyPair:
    """A new key pair saved as `directory/name.key(_secret)`; CliError on a bad name or one
    already there (a key is never overwritten: its peers would be locked out)."""
    if not NAME.fullmatch(name):
        raise CliError(f"bad key name {name!r}: 1-64 of A-Z a-z 0-9 . _ - (not first: . _ -)")
    for suffix in (".key", ".key_secret"):
        if (directory / f"{name}{suffix}").exists():
            raise CliError(f"{directory / (name + suffix)} exists; remove it first to "
                           "replace the key")
    pair = KeyPair.generate()
    try:
        pair.save(directory, name)
    except OSError as exc:
        raise CliError(f"cannot write keys in {directory}: {exc.strerror}") from exc
    return pair


def cmd_generate(args: argparse.Namespace) -> int:
    pair = generate(args.dir, args.name)
    print(f"{args.name}\t{pair.public.decode()}")
    print(f"public: {args.dir / (args.name + '.key')}  (copy into the servers' "
          f"curve_allowed_dir)")
    print(f"secret: {args.dir / (args.name + '.key_secret')}  (mode 0600; keep it here)")
    return 0


def cmd_list(args: argparse.Namespace) -> int:
    try:
        keys = list_public_keys(args.dir)
    except ValueError as exc:
        raise CliError(str(exc)) from exc
    for name, public in keys:
        secret = "secret" if (args.dir / f"{name}.key_secret").exists() else "public only"
        print(f"{name}\t{public.decode()}\t{secret}")
    return 0


def register(sub: Any) -> None:
    p = sub.add_parser("keys", help="CURVE keys: generate a pair, list a directory's keys")
    ksub = p.add_subparsers(dest="keys_command", required=True)
    g = ksub.add_parser("generate", help="a new key pair: NAME.key and NAME.key_secret")
    g.add_argument("name")
    g.add_argument("--dir", type=Path, default=DEFAULT_DIR, help=f"default: ./{DEFAULT_DIR}")
    g.set_defaults(fn=cmd_generate)
    ls = ksub.add_parser("list", help="the public keys in a directory (NAME.key)")
    ls.add_argument("--dir", type=Path, default=DEFAULT_DIR, help=f"default: ./{DEFAULT_DIR}")
    ls.set_defaults(fn=cmd_list)
