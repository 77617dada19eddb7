"""A service's spec (what `offerbus run` and job files ask for: image, instances, resources,
ports, constraints, health check) and its file in the run dir, which the service framework
watches; and the instance states of a service read from the master's /state."""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import re
from collections import Counter
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import IO, Any

from services.resources import Resources

# A service's (and a job's) name: it is part of every container's and task's name.
NAME_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,62}")
NAME_RULE = "use letters, digits, '.', '_' and '-' (at most 63, starting with a letter or digit)"


@dataclass
class ServiceSpec:
    name: str
    image: str
    instances: int
    cpus: float
    mem: float
    command: list[str] = field(default_factory=list)
    constraints: list[str] = field(default_factory=list)
    runtime: str = "docker"
    kill_grace_s: float = 3.0
    role: str = "*"
    env: dict[str, str] = field(default_factory=dict)
    # Container ports, each published on a host port taken from the offer's "ports".
    ports: list[int] = field(default_factory=list)
    health_cmd: str = ""   # a shell command run in the task's context: healthy when it exits 0
    health_http: str = ""  # an HTTP path checked on the first published port
    health_interval_s: float = 10.0
    health_failures: int = 3  # consecutive failures before the task is killed (0: never)
    # A rolling update (a new spec but for its instances) replaces running instances so that
    # at most this many of the wanted ones are down at a time.
    max_unavailable: int = 1

    def resources(self) -> Resources:
        return Resources.of(cpus=self.cpus, mem=self.mem)

    def check(self) -> None:
        if not NAME_RE.fullmatch(self.name):
            raise ValueError(f"bad service name {self.name!r}: {NAME_RULE}")
        if self.instances < 0:
            raise ValueError(f"instances must be >= 0 (got {self.instances})")
        for name, value in (("cpus", self.cpus), ("mem", self.mem)):
            if not value > 0:
                raise ValueError(f"{name} must be > 0 (got {value:g})")
        for c in self.constraints:
            parse_constraint(c)
        if any(not 0 < p < 65536 for p in self.ports) or len(set(self.ports)) != len(self.ports):
            raise ValueError(f"bad ports {self.ports}: each 1-65535, each once")
        if any(not k or "=" in k for k in self.env):
            raise ValueError(f"bad environment variable names {sorted(self.env)}")
        if self.health_cmd and self.health_http:
            raise ValueError("one health check: --health-cmd or --health-http, not both")
        if self.health_http and not self.ports:
            raise ValueError("--health-http checks the first published port: give --port")
        if self.health_interval_s <= 0 or self.health_failures < 0:
            raise ValueError("health interval must be > 0 and failures >= 0")
        if self.max_unavailable < 1:
            raise ValueError(f"max_unavailable must be >= 1 (got {self.max_unavailable})")


SPEC_LABEL = "offerbus.spec"  # TaskInfo.labels: the digest of the spec a task was launched from
ROLLOUT_FIELDS = ("instances", "max_unavailable")  # changed without replacing instances


def spec_digest(spec: ServiceSpec) -> str:
    """What an instance was launched from: every field but those a rolling update leaves
    running instances alone for (ROLLOUT_FIELDS)."""
    doc = {k: v for k, v in asdict(spec).items() if k not in ROLLOUT_FIELDS}
    return hashlib.sha256(json.dumps(doc, sort_keys=True).encode()).hexdigest()[:16]


def instance_of(name: str, task_id: str) -> tuple[int | None, int]:
    """(instance index, attempt) of a service's task id `<name>-<index>-<attempt>`; (None, 0)
    if it is not one of service `name`'s."""
    parts = task_id.rsplit("-", 2)
    if len(parts) == 3 and parts[0] == name and parts[1].isdigit() and parts[2].isdigit():
        return int(parts[1]), int(parts[2])
    return None, 0


def spec_from_doc(doc: Mapping[str, Any]) -> ServiceSpec:
    """A spec from its JSON document (a spec file, a job's record): numbers a JSON round
    trip made floats become the ints the fields hold. ValueError, naming the problem, on an
    unknown or missing field or a bad value."""
    known = {f.name: f for f in fields(ServiceSpec)}
    unknown = sorted(set(doc) - set(known))
    if unknown:
        raise ValueError(f"unknown spec field(s) {', '.join(unknown)}")
    values = dict(doc)
    for key in ("instances", "health_failures", "max_unavailable"):
        if isinstance(values.get(key), float) and float(values[key]).is_integer():
            values[key] = int(values[key])
    if isinstance(values.get("ports"), list):
        values["ports"] = [int(p) if isinstance(p, float) and p.is_integer() else p
                           for p in values["ports"]]
    try:
        spec = ServiceSpec(**values)
    except TypeError as exc:
        raise ValueError(str(exc)) from None
    spec.check()
    return spec


def parse_constraint(text: str) -> tuple[str, str]:
    name, sep, value = text.partition(":")
    if not sep or not name or not value:
        raise ValueError(f"bad constraint {text!r}: use hostname:unique or ATTRIBUTE:VALUE")
    return name, value


STATUS_SUFFIX = ".status.json"  # a service's status file, beside its spec


def spec_path(run_dir: Path, name: str) -> Path:
    return run_dir / "frameworks" / f"{name}.json"


def status_path(spec: Path) -> Path:
    """The status file the service framework of spec file `spec` keeps (its framework id,
    instances, the last failure)."""
    return spec.with_suffix(STATUS_SUFFIX)


LOCK_SUFFIX = ".lock"  # held by the service's framework process while it runs


def lock_path(spec: Path) -> Path:
    return spec.with_suffix(LOCK_SUFFIX)


def hold_service(spec: Path) -> IO[bytes] | None:
    """Take the lock of spec file `spec`'s service (an flock on its lock file) for as long as
    the returned file stays open, or None when another process holds it: one framework
    process per service (two `offerbus run`s of one name at once, a fork server's answer that
    came after the CLI started the interpreter itself). The kernel lets go when the process
    ends, however it ends."""
    f = open(lock_path(spec), "ab")  # noqa: SIM115 (held open by the caller)
    try:
        fcntl.flock(f.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        f.close()
        return None
    return f


def write_spec(run_dir: Path, spec: ServiceSpec) -> Path:
    spec.check()
    path = spec_path(run_dir, spec.name)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(asdict(spec), indent=2))
    os.replace(tmp, path)
    return path


def read_spec(run_dir: Path, name: str) -> ServiceSpec:
    path = spec_path(run_dir, name)
    if not path.exists():
        raise ValueError(f"no service {name!r} ({path} not found)")
    return ServiceSpec(**json.loads(path.read_text()))


def instance_states(state: dict[str, Any], name: str) -> Counter[str]:
    """Task states of a service's instances, from the master's /state."""
    ids = {f["framework_info"].get("framework_id") for f in state.get("frameworks", [])
           if f["framework_info"].get("name") == name}
    return Counter(t.get("status", {}).get("state", "").removeprefix("TASK_")
                   for t in state.get("tasks", []) if t.get("framework_id") in ids)
