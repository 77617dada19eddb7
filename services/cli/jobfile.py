"""Job files: a service described in TOML (name, image, command, env, resources, ports,
constraints, health check, role, update policy), parsed and validated into the service framework's
ServiceSpec (frameworks/service.py), and written back (`dumps`). Pure: text in, a spec or a
JobFileError naming the key (and its line when it can be found) out."""

from __future__ import annotations

import dataclasses
import json
import math
import re
import tomllib
from dataclasses import dataclass, field
from typing import Any

from frameworks.spec import NAME_RE, NAME_RULE, ROLLOUT_FIELDS, ServiceSpec

TOP = {"name", "image", "command", "instances", "role", "kill_grace", "env", "resources",
       "ports", "constraints", "health", "update"}
UPDATE = {"max_unavailable"}
RESOURCES = {"cpus", "mem"}
HEALTH = {"command", "http", "interval", "failures"}
CONSTRAINT = {"attribute", "op", "value"}
# Keys a reader may expect that the service framework does not act on (yet): refused with
# the reason rather than read and ignored.
NOT_YET = {
    "resources.disk": "the service framework does not reserve disk yet",
    "health.grace": "the service framework's health checks have no grace period yet",
}
DEFAULTS = ServiceSpec(name="x", image="x", instances=1, cpus=0.1, mem=32)


class JobFileError(ValueError):
    """A job file that cannot be run: what is wrong, with the key and line."""


@dataclass
class Job:
    """A parsed job file: the service's spec and the names of its ports (in order)."""

    spec: ServiceSpec
    port_names: list[str] = field(default_factory=list)


def _line_of(text: str, table: str, key: str) -> int | None:
    """The line (1-based) where `key` is set in `table` ("" for the top level, "t[2]" for
    the third `[[t]]`), or where a table `key` opens, if a simple scan finds it."""
    name, _, nth = table.partition("[")
    want = int(nth.rstrip("]")) if nth else 0
    current, seen = "", -1
    for number, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        header = re.fullmatch(r"\[\[?\s*([^\]]+?)\s*\]\]?(\s*#.*)?", line)
        if header:
            current = header.group(1)
            seen = seen + 1 if current == name else seen
            if not table and current == key:
                return number
            continue
        if current == name and seen in (want, -1) and re.match(
                rf'"?{re.escape(key)}"?\s*=', line):
            return number
    return None


class _Reader:
    """Typed reads of one table of the document, each error naming the key and line."""

    def __init__(self, text: str, doc: dict[str, Any], table: str = "",
                 known: set[str] | None = None) -> None:
        self.text, self.doc, self.table = text, doc, table
        for key in doc:
            path = f"{table}.{key}" if table else key
            if path in NOT_YET:
                self.fail(key, f"not supported: {NOT_YET[path]}")
            if known is not None and key not in known:
                self.fail(key, f"unknown key (known: {', '.join(sorted(known))})")

    def fail(self, key: str, what: str) -> None:
        path = f"{self.table}.{key}" if self.table else key
        line = _line_of(self.text, self.table, key)
        where = f" (line {line})" if line else ""
        raise JobFileError(f"{path}{where}: {what}")

    def get(self, key: str, kind: type | tuple[type, ...], default: Any = None) -> Any:
        if key not in self.doc:
            if default is None:
                self.fail(key, "missing")
            return default
        value = self.doc[key]
        if isinstance(value, bool) and bool not in (kind if isinstance(kind, tuple) else
                                                    (kind,)):
            self.fail(key, f"expected {_kind(kind)}, got a boolean")
        if not isinstance(value, kind):
            self.fail(key, f"expected {_kind(kind)}, got {type(value).__name__} {value!r}")
        return value

    def number(self, key: str, default: float | None, minimum: float = 0.0,
               above: bool = False) -> float:
        value = float(self.get(key, (int, float), default))
        if not math.isfinite(value) or value < minimum or (above and value <= minimum):
            self.fail(key, f"must be a finite number {'>' if above else '>='} {minimum:g}, "
                      f"got {value!r}")
        return value

    def count(self, key: str, default: int | None) -> int:
        value = int(self.get(key, int, default))
        if value < 0:
            self.fail(key, f"must be >= 0, got {value}")
        return value

    def text_(self, key: str, default: str | None = None, nonempty: bool = False) -> str:
        value = str(self.get(key, str, default))
        if nonempty and not value.strip():
            self.fail(key, "must not be empty")
        return value


def _kind(kind: type | tuple[type, ...]) -> str:
    kinds = kind if isinstance(kind, tuple) else (kind,)
    names = {int: "an integer", float: "a number", str: "a string", list: "an array",
             dict: "a table", bool: "a boolean"}
    return " or ".join(names.get(k, k.__name__) for k in kinds)


def loads(text: str) -> Job:
    """The job a job file's text describes, or JobFileError."""
    try:
        doc = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise JobFileError(f"not valid TOML: {exc}") from None
    top = _Reader(text, doc, "", TOP)
    name = top.text_("name", nonempty=True)
    if not NAME_RE.fullmatch(name):
        top.fail("name", f"{name!r}: {NAME_RULE}")
    image = top.text_("image", nonempty=True)
    command = top.get("command", list, [])
    if not all(isinstance(c, str) for c in command):
        top.fail("command", "expected an array of strings")
    env_doc = top.get("env", dict, {})
    env = _Reader(text, env_doc, "env")
    for key, value in env_doc.items():
        if not isinstance(value, str):
            env.fail(key, f"expected a string, got {type(value).__name__} {value!r}")
        if not key or "=" in key:
            env.fail(key, "bad environment variable name")
    res = _Reader(text, top.get("resources", dict, {}), "resources", RESOURCES)
    ports, port_names = _ports(text, top)
    constraints = _constraints(text, top.get("constraints", list, []))
    health = _Reader(text, top.get("health", dict, {}), "health", HEALTH)
    update = _Reader(text, top.get("update", dict, {}), "update", UPDATE)
    max_unavailable = update.count("max_unavailable", DEFAULTS.max_unavailable)
    if max_unavailable < 1:
        update.fail("max_unavailable", f"must be >= 1, got {max_unavailable}")
    spec = ServiceSpec(
        name=name, image=image, command=list(command), env=dict(env_doc),
        instances=top.count("instances", DEFAULTS.instances),
        role=top.text_("role", DEFAULTS.role, nonempty=True),
        kill_grace_s=top.number("kill_grace", DEFAULTS.kill_grace_s),
        cpus=res.number("cpus", DEFAULTS.cpus, above=True),
        mem=res.number("mem", DEFAULTS.mem, above=True),
        ports=ports, constraints=constraints,
        health_cmd=health.text_("command", "", nonempty="command" in health.doc),
        health_http=health.text_("http", "", nonempty="http" in health.doc),
        health_interval_s=health.number("interval", DEFAULTS.health_interval_s, above=True),
        health_failures=health.count("failures", DEFAULTS.health_failures),
        max_unavailable=max_unavailable)
    try:
        spec.check()
    except ValueError as exc:  # e.g. both health checks, http without a port
        raise JobFileError(str(exc).replace("--health-cmd", "health.command").replace(
            "--health-http", "health.http").replace("--port", "ports")) from None
    return Job(spec, port_names)


def _ports(text: str, top: _Reader) -> tuple[list[int], list[str]]:
    """`ports = [8080, 9090]` or a table of named ports `[ports] http = 8080`."""
    raw = top.get("ports", (list, dict), [])
    named = isinstance(raw, dict)
    items = list(raw.items()) if named else [(str(i), p) for i, p in enumerate(raw)]
    reader = _Reader(text, raw if named else {}, "ports")
    ports = []
    for key, port in items:
        if isinstance(port, bool) or not isinstance(port, int) or not 0 < port < 65536:
            if named:
                reader.fail(key, f"expected a port number 1-65535, got {port!r}")
            top.fail("ports", f"expected port numbers 1-65535, got {port!r}")
        if port in ports:
            (reader.fail(key, f"port {port} given twice") if named
             else top.fail("ports", f"port {port} given twice"))
        ports.append(port)
    return ports, [k for k, _ in items] if named else []


def _constraints(text: str, items: list[Any]) -> list[str]:
    """`[[constraints]]` tables: attribute = "hostname", op = "unique"; or attribute =
    "rack", op = "equals", value = "a" (the service framework's two kinds)."""
    out = []
    for i, item in enumerate(items):
        table = f"constraints[{i}]"
        if not isinstance(item, dict):
            raise JobFileError(f"{table}: expected a table (attribute, op, value)")
        c = _Reader(text, item, table, CONSTRAINT)
        attribute = c.text_("attribute", nonempty=True)
        op = c.text_("op", "equals")
        if op == "unique":
            if attribute != "hostname" or "value" in item:
                c.fail("op", "unique applies to attribute \"hostname\" alone, without value")
            out.append("hostname:unique")
        elif op == "equals":
            value = c.text_("value", nonempty=True)
            if ":" in attribute or (value == "unique" and attribute == "hostname"):
                c.fail("attribute", f"{attribute!r} cannot be matched")
            out.append(f"{attribute}:{value}")
        else:
            c.fail("op", f"{op!r}: use \"unique\" or \"equals\"")
    return out


# -- writing ------------------------------------------------------------------------------
def _str(value: str) -> str:
    """A TOML basic string (JSON's escapes are TOML's, but TOML wants DEL escaped too)."""
    return json.dumps(value, ensure_ascii=False).replace("\x7f", "\\u007f")


def _key(key: str) -> str:
    return key if re.fullmatch(r"[A-Za-z0-9_-]+", key) else _str(key)


def dumps(job: Job | ServiceSpec) -> str:
    """The job file of a spec (`loads(dumps(job))` gives the job back)."""
    job = job if isinstance(job, Job) else Job(job)
    s = job.spec
    lines = [f"name = {_str(s.name)}", f"image = {_str(s.image)}",
             f"instances = {s.instances}", f"role = {_str(s.role)}",
             f"kill_grace = {s.kill_grace_s!r}"]
    if s.command:
        lines.append(f"command = [{', '.join(_str(c) for c in s.command)}]")
    if s.ports and not job.port_names:
        lines.append(f"ports = [{', '.join(str(p) for p in s.ports)}]")
    lines += ["", "[resources]", f"cpus = {s.cpus!r}", f"mem = {s.mem!r}"]
    if s.env:
        lines += ["", "[env]", *(f"{_key(k)} = {_str(v)}" for k, v in s.env.items())]
    if s.ports and job.port_names:
        lines += ["", "[ports]", *(f"{_key(n)} = {p}"
                                   for n, p in zip(job.port_names, s.ports, strict=True))]
    lines += ["", "[health]", f"interval = {s.health_interval_s!r}",
              f"failures = {s.health_failures}"]
    if s.health_cmd:
        lines.append(f"command = {_str(s.health_cmd)}")
    if s.health_http:
        lines.append(f"http = {_str(s.health_http)}")
    lines += ["", "[update]", f"max_unavailable = {s.max_unavailable}"]
    for c in s.constraints:
        attribute, _, value = c.partition(":")
        op = "unique" if c == "hostname:unique" else "equals"
        lines += ["", "[[constraints]]", f"attribute = {_str(attribute)}", f'op = "{op}"']
        if op == "equals":
            lines.append(f"value = {_str(value)}")
    return "\n".join(lines) + "\n"


def changed(current: ServiceSpec, new: ServiceSpec) -> list[str]:
    """The fields, other than the number of instances and the update policy, on which two
    specs differ: what a `job run` of a running job applies by a rolling update."""
    a, b = dataclasses.asdict(current), dataclasses.asdict(new)
    return sorted(k for k in a if k not in ROLLOUT_FIELDS and a[k] != b.get(k))
