"""Service configuration, one way for every service: command-line flags, then `OFFERBUS_*`
environment variables, then a TOML file (`--config`), then the defaults; each value checked
(type, range, choices) with an error that names where the bad value came from.

A TOML file may hold common keys at the top and a table per service, which wins:

    cluster = "zk://10.0.0.1:2181,10.0.0.2:2181/offerbus"
    heartbeat = 1.0
    [broker]
    offer_timeout = 30

The environment variable of option `offer_timeout` is `OFFERBUS_OFFER_TIMEOUT`; a
service-specific `OFFERBUS_BROKER_OFFER_TIMEOUT` wins over it."""

from __future__ import annotations

import argparse
import math
import os
import tomllib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

Value = str | int | float | bool


class ConfigError(Exception):
    """A value is missing, malformed or out of range; the message says which and where."""


@dataclass(frozen=True)
class Option:
    name: str  # snake_case: flag --offer-timeout, env OFFERBUS_OFFER_TIMEOUT, TOML offer_timeout
    type: type = str  # str, int, float or bool
    default: Value | None = None  # None and not required: "unset" (the service decides)
    help: str = ""
    required: bool = False
    minimum: float | None = None
    maximum: float | None = None
    choices: tuple[str, ...] = ()

    @property
    def flag(self) -> str:
        return "--" + self.name.replace("_", "-")

    def env(self, service: str = "") -> str:
        infix = f"{service.upper()}_" if service else ""
        return f"OFFERBUS_{infix}{self.name.upper()}"

    def parse(self, raw: object, where: str) -> Value:
        """`raw` (a string from a flag or the environment, or a TOML value) as this option's
        type, checked; ConfigError naming `where` otherwise."""
        try:
            value = _convert(self.type, raw)
        except (TypeError, ValueError) as exc:
            raise ConfigError(f"{where}: {exc}") from None
        if isinstance(value, float) and not math.isfinite(value):
            raise ConfigError(f"{where}: must be a finite number (got {raw!r})")
        if isinstance(value, int | float) and not isinstance(value, bool):
            if self.minimum is not None and value < self.minimum:
                raise ConfigError(f"{where}: must be >= {self.minimum:g} (got {value})")
            if self.maximum is not None and value > self.maximum:
                raise ConfigError(f"{where}: must be <= {self.maximum:g} (got {value})")
        if self.choices and isinstance(value, str) and value not in self.choices \
                and value.upper() in self.choices:
            value = value.upper()  # `debug` is as good as `DEBUG`
        if self.choices and value not in self.choices:
            raise ConfigError(f"{where}: must be one of {', '.join(self.choices)} "
                              f"(got {value!r})")
        return value


def _convert(kind: type, raw: object) -> Value:
    if kind is bool:
        if isinstance(raw, bool):
            return raw
        text = str(raw).strip().lower()
        if text in ("1", "true", "yes", "on"):
            return True
        if text in ("0", "false", "no", "off"):
            return False
        raise ValueError(f"expected true or false, got {raw!r}")
    if kind is int:
        if isinstance(raw, bool) or (isinstance(raw, float) and not raw.is_integer()):
            raise ValueError(f"expected a whole number, got {raw!r}")
        return int(str(raw).strip()) if isinstance(raw, str) else int(raw)  # type: ignore[call-overload]
    if kind is float:
        if isinstance(raw, bool):
            raise ValueError(f"expected a number, got {raw!r}")
        try:
            return float(str(raw).strip()) if isinstance(raw, str) else float(raw)  # type: ignore[arg-type]
        except ValueError:
            raise ValueError(f"expected a number, got {raw!r}") from None
    if isinstance(raw, str):
        return raw
    raise ValueError(f"expected text, got {raw!r}")


# What every service takes.
COMMON: tuple[Option, ...] = (
    Option("cluster", required=True,
           help="zk://host:port[,host:port]/chroot (ZooKeeper) or file:///run/dir (standalone, "
                "one machine): where leaders are elected and found"),
    Option("host", default="127.0.0.1", help="address to bind and advertise"),
    Option("http_port", int, 0, "status HTTP port (/health, /metrics); 0 = any free port",
           minimum=0, maximum=65535),
    Option("heartbeat", float, 1.0, "seconds between heartbeats", minimum=0.01, maximum=60),
    Option("max_missed", int, 5, "heartbeats missed before a peer is gone", minimum=1,
           maximum=1000),
    Option("log_level", default="INFO", help="DEBUG, INFO, WARNING or ERROR",
           choices=("DEBUG", "INFO", "WARNING", "ERROR")),
)


def parser(prog: str, description: str | None,
           options: Sequence[Option]) -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(
        prog=prog, description=description,
        epilog="Every option can also come from the environment (OFFERBUS_<NAME>, e.g. "
               "OFFERBUS_CLUSTER) or a TOML file given with --config (top-level keys, or a "
               "table named after the service); flags win, then the environment, then the "
               "file.")
    ap.add_argument("--config", metavar="FILE", help="a TOML file of options")
    for opt in options:
        default = "" if opt.default is None else f" (default: {opt.default})"
        need = " (required)" if opt.required else ""
        ap.add_argument(opt.flag, dest=opt.name, default=None, metavar=opt.name.upper(),
                        help=f"{opt.help}{default}{need}")
    return ap


def load(service: str, options: Sequence[Option], argv: Sequence[str] | None = None,
         environ: Mapping[str, str] | None = None, prog: str | None = None,
         description: str | None = None) -> dict[str, Any]:
    """The options' values by name. Raises ConfigError (bad value, missing option, unreadable
    file) and SystemExit for --help or an unknown flag (argparse's own message)."""
    environ = os.environ if environ is None else environ
    ap = parser(prog or f"offerbus-{service}", description, options)
    args = vars(ap.parse_args(list(argv) if argv is not None else None))
    file_values = _read_file(args.pop("config") or environ.get("OFFERBUS_CONFIG"), service,
                             options)
    out: dict[str, Any] = {}
    for opt in options:
        if args.get(opt.name) is not None:
            out[opt.name] = opt.parse(args[opt.name], opt.flag)
            continue
        env_name = next((n for n in (opt.env(service), opt.env()) if n in environ), None)
        if env_name is not None:
            out[opt.name] = opt.parse(environ[env_name], env_name)
        elif opt.name in file_values:
            out[opt.name] = file_values[opt.name]
        elif opt.required:
            raise ConfigError(f"{opt.flag} is required (or {opt.env()}, or `{opt.name}` in "
                              f"the --config file)")
        else:
            out[opt.name] = opt.default
    return out


def _read_file(path: str | None, service: str, options: Sequence[Option]) -> dict[str, Value]:
    if not path:
        return {}
    try:
        doc = tomllib.loads(Path(path).read_text())
    except OSError as exc:
        raise ConfigError(f"--config {path}: cannot read it ({exc.strerror})") from None
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise ConfigError(f"--config {path}: not valid TOML ({exc})") from None
    by_name = {o.name: o for o in options}
    section = doc.get(service, {})
    if not isinstance(section, dict):
        raise ConfigError(f"--config {path}: [{service}] must be a table")
    merged = {k: v for k, v in doc.items() if not isinstance(v, dict)} | section
    unknown = sorted(set(merged) - set(by_name))
    if unknown:
        raise ConfigError(f"--config {path}: unknown option(s) {', '.join(unknown)}; "
                          f"known: {', '.join(sorted(by_name))}")
    return {k: by_name[k].parse(v, f"--config {path}: {k}") for k, v in merged.items()}


def common_fields(values: dict[str, Any]) -> dict[str, Any]:
    """The ServiceConfig fields (services/shell/service.py) from the COMMON options."""
    return {"host": values["host"], "http_port": values["http_port"],
            "heartbeat_interval": values["heartbeat"], "max_missed": values["max_missed"]}
