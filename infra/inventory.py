"""A fleet's inventory (TOML) read and checked, and everything rendered from it, with no I/O
beyond reading the inventory and the unit files: each host's services configuration
(/etc/offerbus/offerbus.toml, checked with the services' own loader as `offerbus config
check` does), the ZooKeeper ensemble's zoo.cfg and myid, the systemd units for the host's
roles under the install prefix, CURVE on by default (every service's key options, the
master's ACL file from the inventory's principals, which keys each host gets), and the rollout
plan (the commands `python -m infra.rollout` runs, in order). See infra/inventory.example.toml
for the format and docs/OPERATIONS.md."""

from __future__ import annotations

import json
import shlex
import tempfile
import tomllib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from services.shell import config

# Also the start order. "jobs" is the job runner (frameworks/jobrunner: `offerbus job run`
# jobs run inside the cluster); the modules behind the roles: services/procs.py.
ROLES = ("zookeeper", "master", "allocator", "broker", "jobs", "agent")
SERVICE_ROLES = ("master", "allocator", "broker", "jobs", "agent")  # from the services' config
OPTIONAL_ROLES = ("jobs",)  # a fleet may have none (then `offerbus job run` jobs wait)
KEYED_ROLES = ("allocator", "jobs", "agent")  # they connect with their host's key pair
UNIT_DIR = Path(__file__).resolve().parent / "systemd"
DEFAULT_PREFIX = "/opt/offerbus"  # the prefix the unit files in infra/systemd/ name
CONFIG_PATH = "/etc/offerbus/offerbus.toml"
ZK_CONF_DIR = "/etc/offerbus/zookeeper"
ZK_DATA_DIR = "/var/lib/offerbus/zookeeper"
AGENT_WORK_DIR = "/var/lib/offerbus/agent"
KEYS_DIR = "/etc/offerbus/keys"  # on each host: its own secret, the server's public key
ALLOWED_DIR = f"{KEYS_DIR}/allowed"  # on master and broker hosts: every admitted public key
ACL_PATH = "/etc/offerbus/acl.toml"  # on master hosts: who may use which role and action
SERVER_KEY = "server"  # the key pair masters and brokers share (docs/DESIGN.md §17)
SERVER_ROLES = ("master", "broker")  # they accept connections: the server key, allowed keys
CURVE_OPTIONS = ("curve_secret_key_file", "curve_server_key_file", "curve_allowed_dir",
                 "acl_file")
USER = "offerbus"  # the services' system user (the units' User=)
SOURCE_EXCLUDES = (".git", ".venv", ".run", "__pycache__", ".mypy_cache", ".ruff_cache",
                   ".pytest_cache", "bench/results", "tests/artifacts")

CLUSTER_KEYS = {"chroot": str, "prefix": str, "ssh_user": str, "ssh_port": int,
                "zk_client_port": int, "zk_peer_port": int, "zk_election_port": int,
                "listen_host": str, "wheelhouse": str, "python": str}
CLUSTER_DEFAULTS: dict[str, Any] = {
    "chroot": "/offerbus", "prefix": DEFAULT_PREFIX, "ssh_user": "root", "ssh_port": 22,
    "zk_client_port": 2181, "zk_peer_port": 2888, "zk_election_port": 3888,
    "listen_host": "", "wheelhouse": "", "python": "python3"}
HOST_KEYS = {"name", "address", "roles", "ssh_user", "ssh_port", *SERVICE_ROLES}

_LOG4J = """\
# Rendered by infra.rollout: ZooKeeper logs to the console, which systemd sends to the journal.
log4j.rootLogger=INFO, CONSOLE
log4j.appender.CONSOLE=org.apache.log4j.ConsoleAppender
log4j.appender.CONSOLE.layout=org.apache.log4j.PatternLayout
log4j.appender.CONSOLE.layout.ConversionPattern=%-5p [%t:%C{1}@%L] - %m%n
"""


class InventoryError(ValueError):
    """The inventory is not a fleet this can install; the message says what and where."""


@dataclass(frozen=True)
class Principal:
    """An operator or a framework's principal: its key's name and what the ACL lets it do."""
    name: str
    roles: tuple[str, ...]
    actions: tuple[str, ...]


@dataclass(frozen=True)
class Host:
    name: str
    address: str
    roles: tuple[str, ...]
    ssh_user: str
    ssh_port: int
    options: Mapping[str, Mapping[str, Any]]  # role -> this host's own options for it


@dataclass(frozen=True)
class Inventory:
    path: str
    cluster: Mapping[str, Any]
    services: Mapping[str, Any]  # [services]: top-level keys and a table per service role
    hosts: tuple[Host, ...]
    curve: bool = True  # `curve = false` at the top of the inventory turns it off
    principals: tuple[Principal, ...] = ()

    def with_role(self, role: str) -> list[Host]:
        return [h for h in self.hosts if role in h.roles]

    @property
    def prefix(self) -> str:
        return str(self.cluster["prefix"])

    def cluster_url(self) -> str:
        port = self.cluster["zk_client_port"]
        servers = ",".join(f"{h.address}:{port}" for h in self.with_role("zookeeper"))
        return f"zk://{servers}{self.cluster['chroot']}"


@dataclass(frozen=True)
class File:
    path: str  # on the host
    content: str
    mode: str = "0644"
    owner: str = "root"
    group: str = "root"
    key: str = ""  # a key file's name in the local keys dir: read at run time, never shown


@dataclass(frozen=True)
class Step:
    host: str  # "" for a local step
    argv: tuple[str, ...]
    what: str
    stdin: str | None = None  # a file's content, sent to the command
    stdin_key: str = ""  # or a key file's name in the local keys dir (its content not shown)
    files: tuple[str, ...] = field(default=())


def _typed(value: Any, kind: type, where: str) -> Any:
    if not isinstance(value, kind) or (isinstance(value, bool) and kind is not bool):
        raise InventoryError(f"{where}: expected {kind.__name__}, got {value!r}")
    return value


def _unknown(keys: Any, known: Any, where: str) -> None:
    extra = sorted(set(keys) - set(known))
    if extra:
        raise InventoryError(f"{where}: unknown key(s) {', '.join(extra)}; known: "
                             f"{', '.join(sorted(known))}")


def parse(text: str, path: str = "<inventory>") -> Inventory:
    """The inventory in `text`, checked; InventoryError naming the problem otherwise."""
    try:
        doc = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise InventoryError(f"{path}: not valid TOML ({exc})") from None
    _unknown(doc, ("curve", "cluster", "services", "host", "principal"), path)
    curve = _typed(doc.get("curve", True), bool, f"{path}: curve")
    raw_cluster = doc.get("cluster", {})
    _typed(raw_cluster, dict, f"{path}: [cluster]")
    _unknown(raw_cluster, CLUSTER_KEYS, f"{path}: [cluster]")
    cluster = dict(CLUSTER_DEFAULTS)
    for key, value in raw_cluster.items():
        cluster[key] = _typed(value, CLUSTER_KEYS[key], f"{path}: [cluster] {key}")
    if not str(cluster["chroot"]).startswith("/"):
        raise InventoryError(f"{path}: [cluster] chroot must start with / "
                             f"(got {cluster['chroot']!r})")
    if not str(cluster["prefix"]).startswith("/"):
        raise InventoryError(f"{path}: [cluster] prefix must be an absolute path")
    services = doc.get("services", {})
    _typed(services, dict, f"{path}: [services]")
    for key, value in services.items():
        if isinstance(value, dict) and key not in SERVICE_ROLES:
            raise InventoryError(f"{path}: [services.{key}]: not a service; a table is "
                                 f"named after one of {', '.join(SERVICE_ROLES)}")
    raw_hosts = doc.get("host", [])
    if not isinstance(raw_hosts, list) or not raw_hosts:
        raise InventoryError(f"{path}: no [[host]] entries")
    hosts = tuple(_host(entry, i, cluster, path) for i, entry in enumerate(raw_hosts))
    _check_fleet(hosts, path)
    raw_principals = _typed(doc.get("principal", []), list, f"{path}: [[principal]]")
    principals = tuple(_principal(e, i, path) for i, e in enumerate(raw_principals))
    if principals and not curve:
        raise InventoryError(f"{path}: [[principal]] entries need CURVE (the master knows a "
                             f"principal by its key); remove `curve = false` or them")
    inv = Inventory(path, cluster, services, hosts, curve, principals)
    if curve:
        _check_keys(inv)
    return inv


def _principal(entry: Any, index: int, path: str) -> Principal:
    where = f"{path}: [[principal]] #{index + 1}"
    _typed(entry, dict, where)
    _unknown(entry, ("name", "roles", "actions"), where)
    if "name" not in entry:
        raise InventoryError(f"{where}: `name` is missing")
    name = _typed(entry["name"], str, f"{where}: name")
    roles = _typed(entry.get("roles", []), list, f"{where}: roles")
    actions = _typed(entry.get("actions", []), list, f"{where}: actions")
    for value in (*roles, *actions):
        _typed(value, str, f"{where}: roles and actions")
    return Principal(name, tuple(roles), tuple(actions))


def _check_keys(inv: Inventory) -> None:
    """Every key name is a valid, distinct name and the ACL loads with the master's parser."""
    from services.cli.keys import NAME
    from services.master.acl import Acl

    seen: set[str] = set()
    for name in [SERVER_KEY, *(h.name for h in inv.hosts if host_key(h)),
                 *(p.name for p in inv.principals)]:
        if not NAME.fullmatch(name):
            raise InventoryError(f"{inv.path}: key name {name!r}: 1-64 of A-Z a-z 0-9 . _ -")
        if name in seen:
            raise InventoryError(f"{inv.path}: principal {name!r}: the name of another key "
                                 f"(a host's or the server's); principals need their own")
        seen.add(name)
    try:
        Acl.parse(tomllib.loads(acl_file(inv)), f"{inv.path}: [[principal]]")
    except ValueError as exc:
        raise InventoryError(str(exc)) from None


def _host(entry: Any, index: int, cluster: Mapping[str, Any], path: str) -> Host:
    where = f"{path}: [[host]] #{index + 1}"
    _typed(entry, dict, where)
    if "name" in entry:
        where = f"{path}: host {entry['name']!r}"
    _unknown(entry, HOST_KEYS, where)
    for key in ("name", "address", "roles"):
        if key not in entry:
            raise InventoryError(f"{where}: `{key}` is missing")
    name = _typed(entry["name"], str, f"{where}: name")
    if not name or not all(c.isalnum() or c in "-_." for c in name):
        raise InventoryError(f"{where}: name must be letters, digits, '-', '_' or '.'")
    address = _typed(entry["address"], str, f"{where}: address")
    try:
        config.check_address(address)
    except ValueError as exc:
        raise InventoryError(f"{where}: address: {exc}") from None
    roles = _typed(entry["roles"], list, f"{where}: roles")
    bad = [r for r in roles if r not in ROLES]
    if bad or not roles:
        raise InventoryError(f"{where}: roles {bad or roles!r}: each must be one of "
                             f"{', '.join(ROLES)}")
    if len(set(roles)) != len(roles):
        raise InventoryError(f"{where}: a role is listed twice in {roles!r}")
    options = {}
    for role in SERVICE_ROLES:
        if role in entry:
            table = _typed(entry[role], dict, f"{where}: [host.{role}]")
            if role not in roles:
                raise InventoryError(f"{where}: options for {role} but it has no {role} role")
            options[role] = table
    return Host(name, address, tuple(r for r in ROLES if r in roles),
                _typed(entry.get("ssh_user", cluster["ssh_user"]), str, f"{where}: ssh_user"),
                _typed(entry.get("ssh_port", cluster["ssh_port"]), int, f"{where}: ssh_port"),
                options)


def _check_fleet(hosts: Sequence[Host], path: str) -> None:
    for attribute in ("name", "address"):
        seen: dict[str, str] = {}
        for host in hosts:
            value = getattr(host, attribute)
            if value in seen:
                raise InventoryError(f"{path}: duplicate {attribute} {value!r} (hosts "
                                     f"{seen[value]!r} and {host.name!r})")
            seen[value] = host.name
    needed = [r for r in ROLES if r not in OPTIONAL_ROLES]
    missing = [r for r in needed if not any(r in h.roles for h in hosts)]
    if missing:
        raise InventoryError(f"{path}: no host has the role(s) {', '.join(missing)}; a fleet "
                             f"needs each of {', '.join(needed)}")
    zk = sum("zookeeper" in h.roles for h in hosts)
    if zk % 2 == 0:
        raise InventoryError(f"{path}: {zk} ZooKeeper hosts: an ensemble needs an odd number "
                             f"(1, 3 or 5) to keep a majority when members fail")


def load(path: str) -> Inventory:
    try:
        text = Path(path).read_text()
    except OSError as exc:
        raise InventoryError(f"{path}: cannot read it ({exc.strerror})") from None
    return parse(text, path)


def _toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value)
    if isinstance(value, str):
        return json.dumps(value)  # a TOML basic string
    raise InventoryError(f"option value {value!r}: only text, numbers and true/false")


def service_config(inv: Inventory, host: Host) -> str:
    """The host's /etc/offerbus/offerbus.toml: common keys, then a table per service role."""
    top: dict[str, Any] = {"cluster": inv.cluster_url(), "host": host.address}
    if inv.cluster["listen_host"]:
        top["listen_host"] = inv.cluster["listen_host"]
    top |= {k: v for k, v in inv.services.items() if not isinstance(v, dict)}
    lines = [f"# Rendered by `python -m infra.rollout {Path(inv.path).name}` for host "
             f"{host.name}; edit the inventory, not this file.",
             *(f"{k} = {_toml_value(v)}" for k, v in top.items())]
    for role in host.roles:
        if role not in SERVICE_ROLES:
            continue
        ident = host.name if host.name.startswith(role) else f"{role}-{host.name}"
        table: dict[str, Any] = ({"work_dir": AGENT_WORK_DIR, "hostname": host.name}
                                 if role == "agent" else {"id": ident})
        table |= {k: v for k, v in curve_options(inv, host, role).items()
                  if k not in inv.services}  # a CURVE option the inventory sets wins
        table |= dict(inv.services.get(role, {})) | dict(host.options.get(role, {}))
        lines += ["", f"[{role}]", *(f"{k} = {_toml_value(v)}" for k, v in table.items())]
    return "\n".join(lines) + "\n"


def host_key(host: Host) -> str:
    """The name of the key pair of the host's allocator, job runner and agent ("" if it runs
    none of them)."""
    return host.name if any(r in host.roles for r in KEYED_ROLES) else ""


def key_names(inv: Inventory) -> list[str]:
    """Every key pair of a keyed fleet: the server's, each allocator/job runner/agent host's
    and each principal's (all of them admitted by masters and brokers)."""
    if not inv.curve:
        return []
    return [SERVER_KEY, *(host_key(h) for h in inv.hosts if host_key(h)),
            *(p.name for p in inv.principals)]


def curve_options(inv: Inventory, host: Host, role: str) -> dict[str, str]:
    """The CURVE options `role` gets on `host`: masters and brokers the server's key pair and
    the allowed keys (the master its ACL file too), the others the host's key pair."""
    if not inv.curve:
        return {}
    server = role in SERVER_ROLES
    out = {"curve_secret_key_file": f"{KEYS_DIR}/{SERVER_KEY if server else host_key(host)}"
                                    ".key_secret",
           "curve_server_key_file": f"{KEYS_DIR}/{SERVER_KEY}.key"}
    if server:
        out["curve_allowed_dir"] = ALLOWED_DIR
    if role == "master":
        out["acl_file"] = ACL_PATH
    return out


def jobs_principals(inv: Inventory) -> list[Principal]:
    """The job runners' principals (their hosts' keys). A runner registers each job's
    framework in the job's own role under its key's name, so it may use every role a job can
    be submitted in: each role of a principal with the submit_job action (the master checks
    the submitter's principal for the job's role; in the ACL "*" is the default role, not
    "any"). It calls no operator action: none."""
    roles = sorted({r for p in inv.principals if "submit_job" in p.actions for r in p.roles})
    return [Principal(host_key(h), tuple(roles), ()) for h in inv.with_role("jobs")]


def acl_file(inv: Inventory) -> str:
    """The master's ACL: each principal's roles and operator actions, and the job runner
    hosts' keys (jobs_principals); only the agent hosts' keys may act as agents."""
    agents = [host_key(h) for h in inv.with_role("agent")]
    lines = ["# Rendered by infra.rollout from the inventory's [[principal]] entries.",
             f"agents = [{', '.join(json.dumps(a) for a in agents)}]"]
    runners = jobs_principals(inv)
    if runners:
        lines += ["", "# The job runners' host keys: each registers the framework of every "
                  "`offerbus job run`", "# job in the job's role, so it may use every role a "
                  "principal may submit a job in", "# (the submitter's principal is checked "
                  "for it on submit_job); it calls no operator action."]
    for p in [*runners, *inv.principals]:
        lines += ["", f"[principals.{json.dumps(p.name)}]",
                  f"roles = [{', '.join(json.dumps(r) for r in p.roles)}]",
                  f"operator = [{', '.join(json.dumps(a) for a in p.actions)}]"]
    return "\n".join(lines) + "\n"


def key_files(inv: Inventory, host: Host) -> list[File]:
    """The keys `host` gets: the server's public key; masters and brokers the server's secret
    and every admitted public key; allocators, job runners and agents their host's secret.
    Secrets are 0600 and the services' user's."""
    if not inv.curve or not any(r in SERVICE_ROLES for r in host.roles):
        return []
    out = [File(f"{KEYS_DIR}/{SERVER_KEY}.key", "", key=f"{SERVER_KEY}.key")]
    secrets = [SERVER_KEY] if any(r in SERVER_ROLES for r in host.roles) else []
    secrets += [host_key(host)] if host_key(host) else []
    out += [File(f"{KEYS_DIR}/{name}.key_secret", "", "0600", USER, USER,
                 key=f"{name}.key_secret") for name in secrets]
    if secrets and secrets[0] == SERVER_KEY:
        out += [File(f"{ALLOWED_DIR}/{name}.key", "", key=f"{name}.key")
                for name in key_names(inv)]
    return out


def zoo_cfg(inv: Inventory) -> str:
    """The ensemble's zoo.cfg (the same on every member; each member's id is in myid)."""
    c = inv.cluster
    lines = ["# Rendered by infra.rollout from the inventory; the same on every member.",
             "tickTime=2000", "initLimit=10", "syncLimit=5", f"dataDir={ZK_DATA_DIR}",
             f"clientPort={c['zk_client_port']}", "maxClientCnxns=1000",
             "admin.enableServer=false", "4lw.commands.whitelist=ruok,srvr,mntr,stat",
             # Old snapshots and transaction logs are pruned: keep 5, purge every 6 hours.
             "autopurge.snapRetainCount=5", "autopurge.purgeInterval=6"]
    for myid, host in enumerate(inv.with_role("zookeeper"), start=1):
        lines.append(f"server.{myid}={host.address}:{c['zk_peer_port']}:"
                     f"{c['zk_election_port']}")
    return "\n".join(lines) + "\n"


def unit(role: str, prefix: str) -> str:
    """The systemd unit of `role`, its install prefix rewritten to `prefix`."""
    text = (UNIT_DIR / f"offerbus-{role}.service").read_text()
    return text.replace(DEFAULT_PREFIX + "/", prefix.rstrip("/") + "/")


def files_for(inv: Inventory, host: Host) -> list[File]:
    """Every file the rollout writes on `host`."""
    out: list[File] = []
    if any(r in SERVICE_ROLES for r in host.roles):
        out.append(File(CONFIG_PATH, service_config(inv, host), "0640", "root", USER))
    if inv.curve and "master" in host.roles:
        out.append(File(ACL_PATH, acl_file(inv), "0640", "root", USER))
    out += key_files(inv, host)
    if "zookeeper" in host.roles:
        myid = inv.with_role("zookeeper").index(host) + 1
        out += [File(f"{ZK_CONF_DIR}/zoo.cfg", zoo_cfg(inv)),
                File(f"{ZK_CONF_DIR}/log4j.properties", _LOG4J),
                File(f"{ZK_DATA_DIR}/myid", f"{myid}\n", "0644", USER, USER)]
    for role in host.roles:
        out.append(File(f"/etc/systemd/system/offerbus-{role}.service",
                        unit(role, inv.prefix)))
    return out


def check_configs(inv: Inventory, environ: Mapping[str, str] | None = None) -> list[str]:
    """The services' loader run on each host's rendered offerbus.toml, for the roles the host
    runs (as `offerbus config check` does): the errors, each naming its host. The local
    OFFERBUS_* variables are not used unless `environ` gives them."""
    from services.cli import config_cmd

    errors: list[str] = []
    with tempfile.TemporaryDirectory(prefix="offerbus-inventory-") as tmp:
        for host in inv.hosts:
            roles = [r for r in host.roles if r in SERVICE_ROLES]
            if not roles:
                continue
            path = Path(tmp) / f"{host.name}.toml"
            path.write_text(service_config(inv, host))
            _, errs = config_cmd.check(str(path), roles, environ or {})
            errors += [f"host {host.name}: {e.replace(str(path), CONFIG_PATH)}" for e in errs]
    return errors


def _ssh(inv: Inventory, host: Host, command: str) -> tuple[str, ...]:
    return ("ssh", "-o", "BatchMode=yes", "-p", str(host.ssh_port),
            f"{host.ssh_user}@{host.address}", command)


def _sudo(host: Host, script: str) -> str:
    shell = f"sh -euc {shlex.quote(script)}"
    return shell if host.ssh_user == "root" else f"sudo {shell}"


def _key_dirs(inv: Inventory, host: Host) -> str:
    if not key_files(inv, host):
        return ""
    return f"; install -d -m 0750 -o root -g {USER} {KEYS_DIR} {ALLOWED_DIR}"


def warnings(inv: Inventory) -> list[str]:
    """What the plan's reader must know: a fleet without CURVE."""
    if inv.curve:
        return []
    return [f"WARNING: {inv.path} sets curve = false: the bus is neither encrypted nor "
            "authenticated, and any peer that reaches a port can act as an agent, a framework "
            "or an operator; only for a network nobody else can reach"]


def plan(inv: Inventory, source: str, only: str | None = None,
         hosts: Sequence[str] = ()) -> list[Step]:
    """The rollout's commands in order: on every chosen host the user, the source tree, the
    venv and the files; then the services started role by role (ZooKeeper first, agents
    last), one host at a time, so a rolling upgrade keeps the others serving. `only` keeps
    the hosts with that role and starts only it; `hosts` (names) keeps only those hosts."""
    if only is not None and only not in ROLES:
        raise InventoryError(f"--only {only}: not a role; one of {', '.join(ROLES)}")
    unknown = sorted(set(hosts) - {h.name for h in inv.hosts})
    if unknown:
        raise InventoryError(f"--host {', '.join(unknown)}: not in {inv.path}")
    chosen = [h for h in inv.hosts if (only is None or only in h.roles)
              and (not hosts or h.name in hosts)]
    prefix = inv.prefix
    venv = f"{prefix}/venv"
    # Editable: the services run the rsynced tree itself, with its data files (the
    # dashboard's static/, job files), which a wheel built from pyproject leaves out.
    steps: list[Step] = []
    for host in chosen:
        groups = "usermod -aG docker offerbus; " if "agent" in host.roles else ""
        steps.append(Step(host.name, _ssh(inv, host, _sudo(host, (
            f"getent passwd {USER} >/dev/null || useradd --system --user-group "
            f"--home-dir /var/lib/offerbus --shell /usr/sbin/nologin {USER}; {groups}"
            f"mkdir -p {prefix}/src /etc/offerbus {ZK_CONF_DIR}; "
            f"install -d -o {USER} -g {USER} /var/lib/offerbus{_key_dirs(inv, host)}"))),
            "the offerbus user and the directories"))
        rsync_path = "rsync" if host.ssh_user == "root" else "sudo rsync"
        excludes = [f"--exclude={e}" for e in SOURCE_EXCLUDES]
        steps.append(Step(host.name, (
            "rsync", "-a", "--delete", *excludes, "-e",
            f"ssh -o BatchMode=yes -p {host.ssh_port}", f"--rsync-path={rsync_path}",
            source.rstrip("/") + "/", f"{host.ssh_user}@{host.address}:{prefix}/src/"),
            "the source tree"))
        if inv.cluster["wheelhouse"]:
            steps.append(Step(host.name, (
                "rsync", "-a", "-e", f"ssh -o BatchMode=yes -p {host.ssh_port}",
                f"--rsync-path={rsync_path}", inv.cluster["wheelhouse"].rstrip("/") + "/",
                f"{host.ssh_user}@{host.address}:{prefix}/wheels/"), "the wheelhouse"))
            index = f"--no-index --find-links {prefix}/wheels "
        else:
            index = ""
        steps.append(Step(host.name, _ssh(inv, host, _sudo(host, (
            f"test -x {venv}/bin/python || {inv.cluster['python']} -m venv {venv}; "
            f"{venv}/bin/pip install --quiet {index}--editable {prefix}/src"))),
            "the venv, with offerbus installed from the tree (editable)"))
        for f in files_for(inv, host):
            steps.append(Step(host.name, _ssh(inv, host, _sudo(host, (
                f"install -D -m {f.mode} -o {f.owner} -g {f.group} /dev/stdin {f.path}"))),
                f"write {f.path}", stdin=None if f.key else f.content, stdin_key=f.key,
                files=(f.path,)))
        if inv.curve and any(r in SERVER_ROLES for r in host.roles):
            keep = "|".join(f"{name}.key" for name in key_names(inv))
            steps.append(Step(host.name, _ssh(inv, host, _sudo(host, (
                f'for f in {ALLOWED_DIR}/*.key; do case "${{f##*/}}" in {keep}) ;; '
                f'*) rm -f "$f" ;; esac; done'))),
                "remove the allowed keys the inventory no longer names"))
        if any(r in SERVICE_ROLES for r in host.roles):
            roles = " ".join(f"--service {r}" for r in host.roles if r in SERVICE_ROLES)
            steps.append(Step(host.name, _ssh(inv, host, _sudo(host, (
                f"{venv}/bin/python -m services.cli config check {roles} {CONFIG_PATH} "
                ">/dev/null"))), "check the configuration with the installed loader"))
    for role in ROLES:
        if only is not None and role != only:
            continue
        for host in (h for h in chosen if role in h.roles):
            name = f"offerbus-{role}.service"
            steps.append(Step(host.name, _ssh(inv, host, _sudo(host, (
                f"systemctl daemon-reload; systemctl enable {name}; systemctl restart {name}; "
                f"systemctl is-active {name}"))),
                f"start (or restart) {role}"))
    return steps
