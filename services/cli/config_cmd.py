"""`offerbus config check FILE`: run the services' configuration loader (services/shell/
config.py) on a TOML file, with this environment's OFFERBUS_* variables, for every service
the file has a table for (master, allocator, broker and agent when it has none; those
named by --service), and print the effective values and where each came from; exit 2 with
the reasons when any service would refuse to start with it. `offerbus config profiles`: the
CLI config file's profiles (services/cli/profiles.py), which one is active, and where each
of the CLI's settings comes from, secrets not shown."""

from __future__ import annotations

import argparse
import importlib
import json
import os
import sys
from collections.abc import Mapping, Sequence
from typing import Any

from services.cli import profiles
from services.shell import config


def options_of(service: str) -> list[config.Option]:
    """Every option `service` takes (the kit's COMMON ones and its own)."""
    module, _, attribute = config.SERVICES[service].partition(":")
    return [*config.COMMON, *getattr(importlib.import_module(module), attribute)]


def _toml(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value)
    return json.dumps(value)  # a TOML basic string


def check(path: str, services: Sequence[str] = (),
          environ: Mapping[str, str] | None = None) -> tuple[list[str], list[str]]:
    """(the effective configuration as TOML lines, the errors), one table per service."""
    environ = os.environ if environ is None else environ
    try:
        doc = config.read_toml(path)
    except config.ConfigError as exc:
        return [], [str(exc)]
    chosen = list(services) or [s for s in config.SERVICES if s in doc] or list(config.DEPLOYED)
    lines: list[str] = []
    errors: list[str] = []
    for service in chosen:
        try:
            values, sources = config.resolve(service, options_of(service),
                                             ["--config", path], environ)
        except config.ConfigError as exc:
            errors.append(f"[{service}] {exc}")
            continue
        listen, advertise = config.addresses(values)
        lines.append(f"[{service}]")
        for name, value in values.items():
            where = sources[name]
            if value is None:
                lines.append(f"# {name}: unset  # {where}")
            elif name in config.SECRET_OPTIONS and value:
                lines.append(f"# {name}: set (not shown)  # {where}")
            else:
                lines.append(f"{name} = {_toml(value)}  # {where}")
        lines.append(f"# binds {listen}, advertises {advertise}")
        lines.append("")
    return lines, errors


def cmd_check(args: argparse.Namespace) -> int:
    lines, errors = check(args.file, args.service or ())
    if errors:
        for error in errors:
            print(f"offerbus config check: {error}", file=sys.stderr)
        return 2
    print("\n".join(lines).rstrip())
    return 0


def profiles_report(args: argparse.Namespace,
                    environ: Mapping[str, str] | None = None) -> dict[str, Any]:
    """`config profiles --json`: the file, its profiles, the active one and why, and each
    setting's value (a secret as "(set, not shown)") and source."""
    environ = os.environ if environ is None else environ
    flags = {"cluster": args.cluster,
             "run_dir": None if args.run_dir is None else str(args.run_dir)}
    res = profiles.resolve(args.profile, flags, environ)
    listed = {} if res.file is None else {
        name: {key: (profiles.SECRET if profiles.BY_NAME[key].secret else value)
               for key, value in table.items()} for name, table in res.file.profiles.items()}
    return {"file": str(res.path), "file_from": res.path_source, "exists": res.file is not None,
            "default": None if res.file is None else res.file.default,
            "active": res.profile, "chosen_by": res.chosen_by or None, "profiles": listed,
            "settings": {name: {"value": None if res.values[name][0] is None
                                else res.shown(name), "from": res.values[name][1]}
                         for name in res.values}}


def cmd_profiles(args: argparse.Namespace) -> int:
    doc = profiles_report(args)
    if args.json:
        print(json.dumps(doc, indent=2))
        return 0
    print(f"CLI config file: {doc['file']} ({doc['file_from']})"
          + ("" if doc["exists"] else ": not there"))
    for name, table in doc["profiles"].items():
        mark = "*" if name == doc["active"] else " "
        print(f" {mark} {name}" + ("  (default)" if name == doc["default"] else ""))
        for key, value in table.items():
            print(f"      {key} = {value}")
    print(f"active profile: {doc['active']} (chosen by {doc['chosen_by']})"
          if doc["active"] else "active profile: none")
    width = max(len(name) for name in doc["settings"])
    for name, item in doc["settings"].items():
        value = "unset" if item["value"] is None else item["value"]
        print(f"  {name:<{width}}  {value}  [{item['from']}]")
    return 0


def register(sub: Any) -> None:
    """`offerbus config check FILE [--service NAME]...`"""
    p = sub.add_parser("config", help="check a services' configuration file; list the "
                       "CLI's profiles")
    inner = p.add_subparsers(dest="config_command", required=True)
    c = inner.add_parser("check", help="validate a TOML file and print the effective "
                         "configuration of each service it configures (exit 2 if invalid)")
    c.add_argument("file", help="a TOML file (top-level keys, a table per service)")
    c.add_argument("--service", action="append", choices=list(config.SERVICES),
                   help="check for this service (repeatable; default: the file's tables, "
                   "or every service when it has none)")
    c.set_defaults(fn=cmd_check)
    pr = inner.add_parser("profiles", help="the CLI config file's profiles, the active one "
                          "(--profile, OFFERBUS_PROFILE or the file's default) and where each "
                          "setting comes from: flag > environment > profile > default "
                          "(secrets not shown)")
    pr.add_argument("--json", action="store_true", help="print machine-readable JSON")
    pr.set_defaults(fn=cmd_profiles)
