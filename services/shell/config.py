"""Service configuration, one way for every service: command-line flags, then `OFFERBUS_*`
environment variables, then a TOML file (`--config`), then the defaults; each value checked
(type, range, choices) with an error that names where the bad value came from.

A TOML file may hold common keys at the top and a table per service, which wins:

    cluster = "zk://10.0.0.1:2181,10.0.0.2:2181/offerbus"
    heartbeat = 1.0
    [broker]
    offer_timeout = 30

The environment variable of option `offer_timeout` is `OFFERBUS_OFFER_TIMEOUT`; a
service-specific `OFFERBUS_BROKER_OFFER_TIMEOUT` wins over it. A table not named after a
service (SERVICES) and a key no option of the service has are refused.

Addresses: `listen_host` is what a service binds (0.0.0.0: every interface), and
`advertise_host` what it tells others to connect to (the election's endpoints, an agent's
registration); each defaults to `host`. `offerbus config check FILE` runs this loader for
each service the file configures and prints the effective values and their sources."""

from __future__ import annotations

import argparse
import ipaddress
import math
import os
import re
import tomllib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

Value = str | int | float | bool
# The services that read a configuration, and where each one's own options are
# ("module:attribute"): the tables a TOML file may have (`offerbus config check` reads the
# options from there). A file without tables is checked for the DEPLOYED ones.
SERVICES: dict[str, str] = {
    "master": "services.master.__main__:OPTIONS",
    "allocator": "services.allocator.__main__:OPTIONS",
    "broker": "services.broker.__main__:OPTIONS",
    "agent": "services.agent.__main__:OPTIONS",
    "jobs": "frameworks.jobrunner.__main__:OPTIONS",
    "emulator_agents": "services.emulator.__main__:AGENT_OPTIONS",
    "emulator_frameworks": "services.emulator.frameworks:OPTIONS"}
DEPLOYED = ("master", "allocator", "broker", "agent")
DEFAULT_HOST = "127.0.0.1"  # one machine's cluster: nothing reachable from elsewhere
SECRET_OPTIONS = frozenset({"http_token"})  # never printed (`offerbus config check`)
WILDCARDS = ("0.0.0.0", "*")  # listen on every interface ("*" is ZeroMQ's spelling)


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
    check: Callable[[Any], None] | None = None  # raises ValueError on a bad value

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
        if self.check is not None:
            try:
                self.check(value)
            except ValueError as exc:
                raise ConfigError(f"{where}: {exc}") from None
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


_HOSTNAME = re.compile(r"(?=.{1,253}$)([a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?)"
                       r"(\.[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?)*\.?$", re.IGNORECASE)


def check_address(value: str, *, wildcard: bool = False) -> None:
    """An IPv4 address or a host name (a wildcard only where `wildcard`); ValueError."""
    if wildcard and value in WILDCARDS:
        return
    try:
        address = ipaddress.ip_address(value)
    except ValueError:
        if value.replace(".", "").isdigit() or not _HOSTNAME.match(value):
            raise ValueError(f"not an IPv4 address or host name: {value!r}") from None
        return
    if address.version == 6:
        raise ValueError(f"IPv6 addresses are not supported yet (got {value!r})")
    if not wildcard and address.is_unspecified:
        raise ValueError(f"{value} is not an address others can reach: give this machine's "
                         "address (to bind every interface: listen_host = 0.0.0.0)")


def check_listen_address(value: str) -> None:
    check_address(value, wildcard=True)


TOKEN_PATTERN = re.compile(r"[A-Za-z0-9._~-]{16,512}")  # e.g. `secrets.token_urlsafe(32)`


def check_http_token(token: str) -> None:
    if token and not TOKEN_PATTERN.fullmatch(token):
        raise ValueError("an HTTP token is 16 to 512 characters from A-Z a-z 0-9 . _ ~ - "
                         "(make one with: python -c 'import secrets; "
                         "print(secrets.token_urlsafe(32))')")


def read_http_token(path: str) -> str:
    """The token in file `path` (surrounding whitespace dropped), checked; ConfigError."""
    try:
        token = Path(path).read_text().strip()
    except OSError as exc:
        raise ConfigError(f"http_token_file {path}: cannot read it ({exc.strerror})") from None
    try:
        check_http_token(token)
    except ValueError as exc:
        raise ConfigError(f"http_token_file {path}: {exc}") from None
    if not token:
        raise ConfigError(f"http_token_file {path}: the file is empty")
    return token


def check_cluster_url(url: str) -> None:
    """zk://host:port[,host:port...][/chroot][?session_timeout=S] or file:///dir."""
    parts = urlsplit(url)
    if parts.scheme == "file":
        if not parts.path.startswith("/"):
            raise ValueError(f"file URL without an absolute path: {url!r}")
        return
    if parts.scheme != "zk":
        raise ValueError(f"expected zk://host:port[,host:port]/chroot or file:///dir, "
                         f"got {url!r}")
    if not parts.netloc:
        raise ValueError(f"zk URL without hosts: {url!r}")
    for server in parts.netloc.split(","):
        host, _, port = server.rpartition(":")
        if not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise ValueError(f"bad ZooKeeper server {server!r} in {url!r}: expected host:port")
        check_address(host)


# What every service takes.
COMMON: tuple[Option, ...] = (
    Option("cluster", required=True,
           help="zk://host:port[,host:port]/chroot (ZooKeeper) or file:///run/dir (standalone, "
                "one machine): where leaders are elected and found", check=check_cluster_url),
    Option("host", default=DEFAULT_HOST, check=check_address,
           help="this service's address: bound, and advertised to others (unless "
                "listen_host or advertise_host say otherwise)"),
    Option("listen_host", check=check_listen_address,
           help="address to bind, e.g. 0.0.0.0 for every interface (default: host)"),
    Option("advertise_host", check=check_address,
           help="address others connect to, in the election and an agent's registration "
                "(default: host)"),
    Option("zk_wait", float, 10.0, "seconds to wait at start for ZooKeeper to answer; then "
           "exit 2 (0: do not check)", minimum=0, maximum=3600),
    Option("http_port", int, 0, "status HTTP port (/health, /metrics); 0 = any free port",
           minimum=0, maximum=65535),
    Option("http_token", default="", check=check_http_token,
           help="a bearer token the status HTTP server wants on every path but /health "
                "(\"\": none, the local dev cluster's default); prefer OFFERBUS_HTTP_TOKEN "
                "or http_token_file to a flag, which other users can see"),
    Option("http_token_file", default="",
           help="a file holding the HTTP token (wins over http_token)"),
    Option("curve_secret_key_file", default="",
           help="this service's CURVE cert (NAME.key_secret from `offerbus keys generate`): "
                "with it every bus socket is encrypted and authenticated (\"\": off, the "
                "local dev cluster's default)"),
    Option("curve_allowed_dir", default="",
           help="with CURVE, a directory of the public certs (*.key) of the peers allowed to "
                "connect to this service; every other key is refused and counted (required "
                "by the services that accept connections: master, offer-broker)"),
    Option("curve_server_key_file", default="",
           help="with CURVE, the public cert of the central services this one connects to "
                "(master, offer-broker: they share one server key pair)"),
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
    return resolve(service, options, argv, environ, prog, description)[0]


def resolve(service: str, options: Sequence[Option], argv: Sequence[str] | None = None,
            environ: Mapping[str, str] | None = None, prog: str | None = None,
            description: str | None = None) -> tuple[dict[str, Any], dict[str, str]]:
    """(values, where each came from: its flag, its variable, the file's path or "default")."""
    environ = os.environ if environ is None else environ
    ap = parser(prog or f"offerbus-{service}", description, options)
    args = vars(ap.parse_args(list(argv) if argv is not None else None))
    path = args.pop("config") or environ.get("OFFERBUS_CONFIG")
    file_values = _read_file(path, service, options)
    out: dict[str, Any] = {}
    sources: dict[str, str] = {}
    for opt in options:
        if args.get(opt.name) is not None:
            out[opt.name], sources[opt.name] = opt.parse(args[opt.name], opt.flag), opt.flag
            continue
        env_name = next((n for n in (opt.env(service), opt.env()) if n in environ), None)
        if env_name is not None:
            out[opt.name], sources[opt.name] = opt.parse(environ[env_name], env_name), env_name
        elif opt.name in file_values:
            out[opt.name], sources[opt.name] = file_values[opt.name], str(path)
        elif opt.required:
            raise ConfigError(f"{opt.flag} is required (or {opt.env()}, or `{opt.name}` in "
                              f"the --config file)")
        else:
            out[opt.name], sources[opt.name] = opt.default, "default"
    return out, sources


def _read_file(path: str | None, service: str, options: Sequence[Option]) -> dict[str, Value]:
    if not path:
        return {}
    doc = read_toml(path)
    by_name = {o.name: o for o in options}
    section = doc.get(service, {})
    if not isinstance(section, dict):
        raise ConfigError(f"--config {path}: [{service}] must be a table")
    merged = {k: v for k, v in doc.items() if not isinstance(v, dict)} | section
    unknown = sorted(set(merged) - set(by_name))
    if unknown:
        raise ConfigError(f"--config {path}: unknown option(s) {', '.join(unknown)}"
                          f"{f' in [{service}]' if set(unknown) & set(section) else ''}; "
                          f"known: {', '.join(sorted(by_name))}")
    return {k: by_name[k].parse(v, f"--config {path}: {k}") for k, v in merged.items()}


def read_toml(path: str) -> dict[str, Any]:
    """A configuration file's document; ConfigError when unreadable, not TOML, or with a
    table not named after a service."""
    try:
        doc = tomllib.loads(Path(path).read_text())
    except OSError as exc:
        raise ConfigError(f"--config {path}: cannot read it ({exc.strerror})") from None
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise ConfigError(f"--config {path}: not valid TOML ({exc})") from None
    tables = sorted(k for k, v in doc.items() if isinstance(v, dict) and k not in SERVICES)
    if tables:
        raise ConfigError(f"--config {path}: unknown table(s) {', '.join(tables)}; a table "
                          f"is named after a service: {', '.join(SERVICES)}")
    return doc


def addresses(values: Mapping[str, Any]) -> tuple[str, str]:
    """(address to bind, address to advertise) from host, listen_host and advertise_host."""
    listen = values["listen_host"] or values["host"]
    return ("0.0.0.0" if listen == "*" else listen), values["advertise_host"] or values["host"]


def common_fields(values: dict[str, Any]) -> dict[str, Any]:
    """The ServiceConfig fields (services/shell/service.py) from the COMMON options."""
    listen, advertise = addresses(values)
    token = read_http_token(values["http_token_file"]) if values.get("http_token_file") \
        else values.get("http_token") or ""
    return {"host": listen, "advertise_host": advertise, "http_port": values["http_port"],
            "http_token": token, "heartbeat_interval": values["heartbeat"],
            "curve_secret_key_file": values.get("curve_secret_key_file") or "",
            "curve_allowed_dir": values.get("curve_allowed_dir") or "",
            "curve_server_key_file": values.get("curve_server_key_file") or "",
            "max_missed": values["max_missed"]}
