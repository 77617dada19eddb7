"""Chaos scenarios: the TOML file (see chaos/README.md) as a FleetSpec, workload settings and
a fault sequence. A scenario's random part is expanded and shuffled by its seed, and every
"random" target is drawn from a generator seeded the same way, so one seed gives one fault
sequence (`offerbus chaos replay` relies on it)."""

from __future__ import annotations

import random
import signal
import tomllib
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

from chaos.fleet import FleetSpec

KINDS = ("signal", "partition", "latency", "loss")
DEGRADE = ("latency", "loss")  # through chaos/proxy.py
PEERS = ("master", "allocator", "broker", "jobs", "agent", "zk")
SIGNALS = ("SIGKILL", "SIGTERM", "SIGSTOP")
TARGETS = ("leader:master", "standby:master", "leader:allocator", "standby:allocator",
           "leader:broker", "standby:broker", "leader:jobs", "standby:jobs", "agent", "zk",
           "zk:leader", "executor")


class ScenarioError(ValueError):
    pass


@dataclass(frozen=True)
class Fault:
    kind: str = "signal"  # signal | partition | latency | loss
    target: str = "leader:master"  # see TARGETS; "agent" / "zk" pick one at random
    signal: str = "SIGKILL"  # signal faults
    duration: float = 1.0  # down (KILL/TERM) or stopped (STOP) or cut (partition), seconds
    peer: str = "master"  # partition: the role the agent is cut from
    one_way: bool = False  # partition: drop only what the agent sends
    delay_ms: float = 0.0  # latency/loss: every chunk, each way, delayed by this
    jitter_ms: float = 0.0  # ... +- up to this (uniform)
    stall_p: float = 0.0  # loss: per chunk, the probability of a stall of stall_ms
    stall_ms: float = 500.0
    reset_p: float = 0.0  # loss: per chunk, the probability the connection is reset

    def label(self) -> str:
        """The fault type a summary groups by."""
        if self.kind == "partition":
            way = " one-way" if self.one_way else ""
            who = "agent" if self.target.startswith("agent") else self.target
            return f"partition {who}|{self.peer}{way}"
        if self.kind in DEGRADE:
            who = "agent" if self.target.startswith("agent") else self.target
            what = f"{self.delay_ms:g}ms" if self.kind == "latency" else \
                f"stall {self.stall_p:g} reset {self.reset_p:g}"
            return f"{self.kind} {who}|{self.peer} {what}"
        return f"{self.signal} {self.target}"

    def check(self) -> Fault:
        if self.kind not in KINDS:
            raise ScenarioError(f"fault kind {self.kind!r}: one of {', '.join(KINDS)}")
        if self.kind == "signal" and self.signal not in SIGNALS:
            raise ScenarioError(f"signal {self.signal!r}: one of {', '.join(SIGNALS)}")
        base = self.target.split("-")[0] if self.target.startswith(("agent-", "zk-")) \
            else self.target
        if base not in TARGETS:
            raise ScenarioError(f"target {self.target!r}: one of {', '.join(TARGETS)}, "
                                f"agent-N or zk-N")
        if self.target == "executor" and (self.kind, self.signal) != ("signal", "SIGKILL"):
            raise ScenarioError("an executor fault is a SIGKILL (its tasks end, told)")
        if self.kind == "latency" and not 0 < self.delay_ms <= 10000:
            raise ScenarioError(f"latency delay_ms {self.delay_ms}: 0 < delay_ms <= 10000")
        if self.kind == "loss" and not (self.stall_p or self.reset_p):
            raise ScenarioError("a loss fault needs stall_p or reset_p above 0")
        if not (0 <= self.stall_p <= 1 and 0 <= self.reset_p <= 1
                and self.stall_p + self.reset_p <= 1):
            raise ScenarioError("stall_p, reset_p: probabilities adding up to at most 1")
        if not (0 <= self.jitter_ms <= self.delay_ms or self.jitter_ms == 0) \
                or not 0 <= self.stall_ms <= 60000:
            raise ScenarioError("jitter_ms: 0..delay_ms; stall_ms: 0..60000")
        if self.kind != "signal" and self.target.startswith("zk"):
            raise ScenarioError("a partition, latency or loss hits an agent or a central "
                                "service (with [fleet] central_namespaces) and a peer role")
        if self.peer not in PEERS:
            raise ScenarioError(f"peer {self.peer!r}: one of {', '.join(PEERS)}")
        if not 0 <= self.duration <= 600:
            raise ScenarioError(f"duration {self.duration}: 0..600 seconds")
        getattr(signal, self.signal)
        return self


@dataclass
class Scenario:
    name: str = "scenario"
    seed: int = 1
    fleet: FleetSpec = field(default_factory=FleetSpec)
    instances: int = 3  # long-running service containers
    short_interval: float = 1.0  # seconds between short tasks
    job_instances: int = 3  # instances of the chaos job (chaos/jobwatch.py; 0: no job)
    settle: float = 1.0  # steady seconds between a recovery and the next fault
    recovery_timeout: float = 60.0  # a fault not recovered by then counts as failed
    drain: float = 10.0  # seconds at the end for the last updates to arrive
    faults: list[Fault] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["faults"] = [asdict(f) for f in self.faults]
        return out


def _fields(cls: Any, table: dict[str, Any], where: str) -> dict[str, Any]:
    known = {f.name for f in fields(cls)}
    unknown = sorted(set(table) - known)
    if unknown:
        raise ScenarioError(f"{where}: unknown key(s) {', '.join(unknown)}; known: "
                            f"{', '.join(sorted(known))}")
    return table


def parse(doc: dict[str, Any], name: str = "scenario") -> Scenario:
    """A scenario from its TOML document: [fleet], [workload], [campaign], [[fault]] (played
    in order) and [[random]] (each `count` times, shuffled by `seed`)."""
    top = _fields(Scenario, {k: v for k, v in doc.items()
                             if k in ("name", "seed")}, "top level")
    extra = sorted(set(doc) - {"name", "seed", "fleet", "workload", "campaign", "fault",
                               "random"})
    if extra:
        raise ScenarioError(f"unknown table(s) {', '.join(extra)}")
    fleet = FleetSpec(**_fields(FleetSpec, doc.get("fleet", {}), "[fleet]"))
    scen = Scenario(name=str(top.get("name", name)), seed=int(top.get("seed", 1)),
                    fleet=fleet)
    for key, value in {**doc.get("workload", {}), **doc.get("campaign", {})}.items():
        if key not in ("instances", "short_interval", "job_instances", "settle",
                       "recovery_timeout", "drain"):
            raise ScenarioError(f"[workload]/[campaign]: unknown key {key!r}")
        if key == "job_instances" and not 0 <= int(value) <= 100:
            raise ScenarioError(f"job_instances {value}: 0..100")
        setattr(scen, key, type(getattr(scen, key))(value))
    scen.faults = [Fault(**_fields(Fault, f, "[[fault]]")).check()
                   for f in doc.get("fault", [])]
    pool: list[Fault] = []
    for entry in doc.get("random", []):
        entry = dict(entry)
        count = int(entry.pop("count", 1))
        pool += [Fault(**_fields(Fault, entry, "[[random]]")).check()] * count
    random.Random(scen.seed).shuffle(pool)
    scen.faults += pool
    for f in scen.faults:  # a leader or standby the fleet runs
        if f.target.startswith(("leader:", "standby:")):
            kind, role = f.target.split(":")
            if fleet.counts()[role] < (2 if kind == "standby" else 1):
                raise ScenarioError(f"target {f.target}: the fleet runs "
                                    f"{fleet.counts()[role]} of role {role}")
    return scen


def load(path: Path) -> Scenario:
    try:
        doc = tomllib.loads(Path(path).read_text())
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise ScenarioError(f"{path}: {exc}") from None
    return parse(doc, Path(path).stem)


def from_report(report: dict[str, Any]) -> Scenario:
    """The scenario a report was run from (its seed and every setting), to replay it."""
    s = dict(report["scenario"])
    fleet = FleetSpec(**s.pop("fleet"))
    faults = [Fault(**f).check() for f in s.pop("faults")]
    return Scenario(fleet=fleet, faults=faults, **s)
