"""CLI profiles (issue 11): a client config file naming clusters the CLI can reach from any
machine, and the one place that turns the selected profile into the settings the CLI reads
from its environment (OFFERBUS_CLUSTER, OFFERBUS_MASTER, OFFERBUS_CURVE_*_KEY_FILE,
OFFERBUS_HTTP_TOKEN[_FILE], OFFERBUS_RUN_DIR), so that every command gets them.

The file is TOML, at $OFFERBUS_CLI_CONFIG or $XDG_CONFIG_HOME/offerbus/cli.toml (default
~/.config/offerbus/cli.toml):

    default = "prod"
    [profiles.prod]
    cluster = "zk://10.0.0.1:2181,10.0.0.2:2181/offerbus"
    master = "10.0.0.1:5050"                  # a master's HTTP (reads without ZooKeeper)
    key = "keys/ops.key_secret"               # this operator's CURVE cert (`offerbus keys`)
    server_key = "keys/server.key"            # the master's public cert
    token_file = "prod.token"                 # or token = "..." (the HTTP bearer token)
    run_dir = "~/offerbus/prod"

Relative paths are taken from the file's directory. A profile is chosen by `--profile NAME`,
else OFFERBUS_PROFILE, else the file's `default` (`--profile ''`: none). Each setting comes
from, in order: its flag (--cluster, --run-dir), its environment variable, the profile, the
default. The services' own configuration variable OFFERBUS_CONFIG is not this file's: the
services `offerbus up` and `offerbus run` start inherit the CLI's environment."""

from __future__ import annotations

import argparse
import tomllib
from collections.abc import Mapping, MutableMapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from services.bus.curve import SECRET_ENV, SERVER_ENV, load_public_key, load_secret
from services.cli.client import RUN_DIR_DEFAULT, CliError
from services.shell import config

CONFIG_ENV = "OFFERBUS_CLI_CONFIG"  # the file's path (OFFERBUS_CONFIG is the services')
PROFILE_ENV = "OFFERBUS_PROFILE"
# Commands that do not reach a cluster through a profile: `up` starts a local one (and its
# services inherit the environment: a profile's CLI key must not become theirs), `keys`
# writes key files, `config` reads files (`config profiles` resolves without applying),
# `chaos` runs its own fleets.
LOCAL_COMMANDS = frozenset({"up", "keys", "config", "chaos"})
SECRET = "(set, not shown)"


class ProfileError(CliError):
    """The CLI config file or the chosen profile is wrong; the message says where."""


def check_master_address(value: str) -> None:
    """host:port (or http://host:port) of a master's HTTP; ValueError."""
    rest = value.removeprefix("http://").removeprefix("https://").rstrip("/")
    host, sep, port = rest.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"expected host:port of a master's HTTP, got {value!r}")
    config.check_address(host)


@dataclass(frozen=True)
class Setting:
    """One thing a profile sets: the key in its table, the variable the CLI reads it from."""

    name: str
    env: str
    flag: str = ""  # a global flag that wins over the variable
    path: bool = False  # a file or directory: ~ expanded, relative to the file's directory
    secret: bool = False  # never printed
    group: str = ""  # settings one variable of which overrides them all
    check: Any = None

    @property
    def option(self) -> config.Option:
        return config.Option(self.name, str, check=self.check)


TOKEN_GROUP = "token"
SETTINGS: tuple[Setting, ...] = (
    Setting("cluster", "OFFERBUS_CLUSTER", "--cluster", check=config.check_cluster_url),
    Setting("master", "OFFERBUS_MASTER", check=check_master_address),
    Setting("key", SECRET_ENV, path=True),
    Setting("server_key", SERVER_ENV, path=True),
    Setting("token", "OFFERBUS_HTTP_TOKEN", secret=True, group=TOKEN_GROUP,
            check=config.check_http_token),
    Setting("token_file", "OFFERBUS_HTTP_TOKEN_FILE", path=True, group=TOKEN_GROUP),
    Setting("run_dir", "OFFERBUS_RUN_DIR", "--run-dir", path=True),
)
BY_NAME = {s.name: s for s in SETTINGS}


@dataclass(frozen=True)
class ProfilesFile:
    path: Path
    default: str | None
    profiles: Mapping[str, Mapping[str, str]]  # name -> setting -> value (paths resolved)


def config_path(environ: Mapping[str, str]) -> tuple[Path, str]:
    """(the CLI config file's path, what named it: the variable or "default location")."""
    if environ.get(CONFIG_ENV):
        return Path(environ[CONFIG_ENV]).expanduser(), CONFIG_ENV
    base = environ.get("XDG_CONFIG_HOME") or str(
        Path(environ.get("HOME") or Path.home()) / ".config")
    return Path(base) / "offerbus" / "cli.toml", "default location"


def load(path: Path) -> ProfilesFile:
    """The file's profiles, each value checked (type, address, token form); ProfileError
    naming the file, the profile and the key. Files named are not opened here (`check`)."""
    try:
        doc = tomllib.loads(path.read_text())
    except OSError as exc:
        raise ProfileError(f"CLI config {path}: cannot read it ({exc.strerror})") from None
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise ProfileError(f"CLI config {path}: not valid TOML ({exc})") from None
    unknown = sorted(set(doc) - {"default", "profiles"})
    if unknown:
        raise ProfileError(f"CLI config {path}: unknown key(s) {', '.join(unknown)}; known: "
                           "default, profiles")
    tables = doc.get("profiles", {})
    if not isinstance(tables, dict):
        raise ProfileError(f"CLI config {path}: `profiles` must be a table of [profiles.NAME]")
    profiles: dict[str, dict[str, str]] = {}
    for name, table in tables.items():
        where = f"CLI config {path}: [profiles.{name}]"
        if not isinstance(table, dict):
            raise ProfileError(f"{where} must be a table")
        unknown = sorted(set(table) - set(BY_NAME))
        if unknown:
            raise ProfileError(f"{where}: unknown key(s) {', '.join(unknown)}; known: "
                               f"{', '.join(BY_NAME)}")
        if "token" in table and "token_file" in table:
            raise ProfileError(f"{where}: give token or token_file, not both")
        if ("key" in table) != ("server_key" in table):
            raise ProfileError(f"{where}: key and server_key go together (CURVE needs this "
                               "CLI's secret cert and the master's public one)")
        values: dict[str, str] = {}
        for key, raw in table.items():
            try:
                value = str(BY_NAME[key].option.parse(raw, f"{where} {key}"))
            except config.ConfigError as exc:
                if BY_NAME[key].secret and not isinstance(raw, str):  # never echo a secret
                    raise ProfileError(f"{where} {key}: expected text") from None
                raise ProfileError(str(exc)) from None
            if not value:
                raise ProfileError(f"{where} {key}: empty (leave the key out instead)")
            if BY_NAME[key].path:
                value = str(path.parent / Path(value).expanduser())
            values[key] = value
        profiles[str(name)] = values
    default = doc.get("default")
    if default is not None:
        if not isinstance(default, str):
            raise ProfileError(f"CLI config {path}: default: expected a profile's name, "
                               f"got {default!r}")
        if default not in profiles:
            raise ProfileError(f"CLI config {path}: default = {default!r} names no profile "
                               f"(profiles: {', '.join(profiles) or 'none'})")
    return ProfilesFile(path, default, profiles)


def check_file(setting: str, value: str, where: str) -> None:
    """The file a profile names is there and is what it should be; ProfileError."""
    try:
        if setting == "key":
            load_secret(Path(value))
        elif setting == "server_key":
            load_public_key(Path(value))
        elif setting == "token_file":
            config.read_http_token(value)
    except (ValueError, config.ConfigError) as exc:
        raise ProfileError(f"{where} {setting}: {exc}") from None


@dataclass
class Resolution:
    """Where the CLI's settings come from: the file, the chosen profile and why, and each
    setting's value and source (a flag, a variable, `profile NAME`, or "default")."""

    path: Path
    path_source: str
    file: ProfilesFile | None
    profile: str | None
    chosen_by: str
    values: dict[str, tuple[str | None, str]] = field(default_factory=dict)

    def exports(self) -> dict[str, str]:
        """The variables the profile sets (those no flag or variable set already)."""
        return {BY_NAME[name].env: value for name, (value, source) in self.values.items()
                if value is not None and source.startswith("profile ")}

    def shown(self, name: str) -> str:
        value, _ = self.values[name]
        if value is None:
            return "unset"
        return SECRET if BY_NAME[name].secret else value


def resolve(profile_flag: str | None, flags: Mapping[str, str | None],
            environ: Mapping[str, str]) -> Resolution:
    """The settings for flags `flags` (setting name -> value given, or None), `--profile`
    `profile_flag` (None: not given) and `environ`; ProfileError when the file is invalid,
    the chosen profile is not in it, or a file it names (and that is used) is bad."""
    path, path_source = config_path(environ)
    if profile_flag is not None:
        name, chosen_by = profile_flag or None, "--profile"
    elif environ.get(PROFILE_ENV):
        name, chosen_by = environ[PROFILE_ENV], PROFILE_ENV
    else:
        name, chosen_by = None, ""
    loaded: ProfilesFile | None = None
    if path.exists():
        loaded = load(path)
    elif name is not None or path_source == CONFIG_ENV:
        wanted = f" to find profile {name!r} in" if name else ""
        raise ProfileError(f"no CLI config file at {path} ({path_source}){wanted}: write one "
                           "(docs/OPERATIONS.md, \"Using the CLI from another machine\") or "
                           f"set {CONFIG_ENV}")
    if name is None and profile_flag is None and loaded is not None and loaded.default:
        name, chosen_by = loaded.default, f"default in {path}"
    if name is not None and loaded is not None and name not in loaded.profiles:
        raise ProfileError(f"no profile {name!r} in {path} ({chosen_by}); profiles: "
                           f"{', '.join(loaded.profiles) or 'none'}")
    profile = loaded.profiles[name] if loaded is not None and name is not None else {}
    out = Resolution(path, path_source, loaded, name, chosen_by)
    env_groups = {s.group for s in SETTINGS if s.group and environ.get(s.env)}
    for s in SETTINGS:
        if flags.get(s.name):
            out.values[s.name] = (flags[s.name], s.flag)
        elif environ.get(s.env):
            out.values[s.name] = (environ[s.env], s.env)
        elif s.name in profile and s.group not in env_groups:
            check_file(s.name, profile[s.name], f"profile {name} ({path}):")
            out.values[s.name] = (profile[s.name], f"profile {name}")
        elif s.name == "run_dir":
            out.values[s.name] = (RUN_DIR_DEFAULT, "default")
        else:
            out.values[s.name] = (None, "default")
    return out


def start(args: argparse.Namespace, environ: MutableMapping[str, str]) -> Resolution | None:
    """At the CLI's start, before any command: the chosen profile's settings into `environ`
    (where every command and the processes `run` starts read them) and `args.run_dir`.
    Commands in LOCAL_COMMANDS take no profile (an explicit --profile is refused)."""
    if args.command in LOCAL_COMMANDS:
        if args.profile is not None and args.command != "config":
            raise ProfileError(f"`offerbus {args.command}` takes no --profile (a profile "
                               "names a cluster to reach)")
        if args.run_dir is None and args.command != "config":  # `config profiles` shows it
            args.run_dir = Path(environ.get("OFFERBUS_RUN_DIR") or RUN_DIR_DEFAULT)
        return None
    flags = {"cluster": args.cluster,
             "run_dir": None if args.run_dir is None else str(args.run_dir)}
    resolution = resolve(args.profile, flags, environ)
    environ.update(resolution.exports())
    args.run_dir = Path(str(resolution.values["run_dir"][0]))
    return resolution


def add_flag(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--profile", metavar="NAME", default=None,
                    help=f"a profile of the CLI config file (${CONFIG_ENV}, else "
                    "$XDG_CONFIG_HOME/offerbus/cli.toml, else ~/.config/offerbus/cli.toml): "
                    f"the cluster, master, keys, token and run dir to use (default: "
                    f"${PROFILE_ENV}, else the file's `default`; '' for none). Each setting "
                    "comes from its flag, else its OFFERBUS_* variable, else the profile, else "
                    "the default (`offerbus config profiles` shows which)")
