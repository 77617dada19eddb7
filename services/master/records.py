"""The master's records: an agent, a framework, a task and a log request as the master
holds them, the statuses and constants they use, and the helpers that read resources and
times off the wire. The tables of them and the rules that change them are in state.py."""

from __future__ import annotations

import math
import re
from collections import OrderedDict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import TypeAlias

from google.protobuf.json_format import MessageToDict, ParseDict, ParseError

from schemas import agent_pb2, common_pb2, state_pb2
from services import tasks
from services.resources import UNRESERVED, Resources
from services.roles import role_error

AgentStatus = state_pb2.AgentRecord.Status
Status: TypeAlias = state_pb2.AgentRecord.Status.ValueType
REGISTERED = AgentStatus.AGENT_STATUS_REGISTERED
UNREACHABLE = AgentStatus.AGENT_STATUS_UNREACHABLE
RECOVERING = AgentStatus.AGENT_STATUS_RECOVERING  # shown for a held agent (state.py), never stored
GONE = AgentStatus.AGENT_STATUS_GONE
STATUS_NAMES: dict[Status, str] = {REGISTERED: "registered", UNREACHABLE: "unreachable",
                                   GONE: "gone"}
Reason = common_pb2.TaskStatus.Reason
ReasonT: TypeAlias = common_pb2.TaskStatus.Reason.ValueType
PARTITION_AWARE = common_pb2.FrameworkInfo.Capability.CAPABILITY_PARTITION_AWARE
TaskKey = tuple[str, str]  # (framework_id, task_id)

MAX_COMPLETED_TASKS = 1000  # terminal task records kept per framework (Mesos keeps 1000)
MAX_REMOVED_FRAMEWORKS = 10_000  # ids remembered so their stragglers are shut down
LOGS_TIMEOUT_S = 60.0  # a log request unanswered this long is answered with an error
# A framework's REQUEST (its declared demand, FrameworkRecord.demands): at most this many
# task shapes, each of at most this many tasks needing at most this many host ports.
MAX_DEMANDS = 100
MAX_DEMAND_COUNT = 100_000
MAX_DEMAND_PORTS = 1000


def us(t: float) -> int:
    return int(t * 1_000_000)


def parse_resources(items: Iterable[common_pb2.Resource]) -> Resources:
    """Resources of a peer's message; ValueError when malformed (the caller rejects it)."""
    return Resources.from_proto(items)


QUOTA_RESOURCES = ("cpus", "mem", "disk", "gpus")  # the allocator's DRF scalars


def parse_quota(items: Iterable[common_pb2.Resource], what: str
                ) -> list[common_pb2.Resource]:
    """A role's guarantee or limit: unreserved scalars the allocator shares out, one per
    name, zeros kept (a limit of cpus:0 is a limit); ValueError when it is not that."""
    amounts: dict[str, float] = {}
    for r in items:
        if r.name not in QUOTA_RESOURCES or r.role not in ("", UNRESERVED) \
                or r.WhichOneof("value") != "scalar" or not r.scalar >= 0 \
                or math.isinf(r.scalar) or r.name in amounts:
            raise ValueError(f"{what} must be unreserved {', '.join(QUOTA_RESOURCES)} "
                             f"(each once, >= 0), e.g. cpus:4;mem:2048; got {r.name!r}")
        amounts[r.name] = r.scalar
    return [common_pb2.Resource(name=n, scalar=v, role=UNRESERVED)
            for n, v in sorted(amounts.items())]


def quota_text(items: Iterable[common_pb2.Resource]) -> str:
    """`cpus:4;mem:2048` (zeros kept; Resources.parse reads it back)."""
    return ";".join(f"{r.name}:{r.scalar:g}" for r in items)


def role_record(role: str, entry: object) -> state_pb2.RoleRecord | None:
    """A role's registry entry (`registry_role` wrote it), None if unreadable."""
    if not isinstance(entry, dict):
        return None
    try:
        weight = float(entry.get("weight", 1.0))
        rec = state_pb2.RoleRecord(role=role, weight=weight if weight > 0 else 1.0)
        for items, name in ((rec.quota_guarantee, "guarantee"), (rec.quota_limit, "limit")):
            items.extend(parse_quota(Resources.parse(str(entry.get(name, ""))).to_proto(),
                                     name))
    except (TypeError, ValueError):
        return None  # written by this code: not expected
    return rec


def registry_role(rec: state_pb2.RoleRecord) -> dict[str, object]:
    out: dict[str, object] = {"weight": rec.weight}
    for name, items in (("guarantee", rec.quota_guarantee), ("limit", rec.quota_limit)):
        if items:
            out[name] = quota_text(items)
    return out


# -- jobs (jobs.py) ----------------------------------------------------------------------
MAX_JOBS = 256  # jobs a cluster keeps; a submission past it is refused
MAX_JOB_SPEC_BYTES = 16 * 1024  # one job's spec, as JSON
JOB_LABEL = "offerbus.job"  # FrameworkInfo.labels: the job a framework runs
JOB_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,62}")


def job_name_error(name: str) -> str | None:
    if not JOB_NAME.fullmatch(name):
        return (f"bad job name {name!r}: 1-63 letters, digits, '_', '-', '.', starting with "
                "a letter or digit")
    return None


def registry_job(rec: state_pb2.JobRecord) -> dict[str, object]:
    return {"role": rec.role, "principal": rec.principal, "version": rec.version,
            "submitted_at_us": rec.submitted_at_us, "updated_at_us": rec.updated_at_us,
            "spec": MessageToDict(rec.spec)}


def job_record(name: str, entry: Mapping[str, object]) -> state_pb2.JobRecord | None:
    """A registry entry back as a record; None when it is not one (a hand-edited registry)."""
    spec = entry.get("spec")
    if job_name_error(name) is not None or not isinstance(spec, Mapping):
        return None
    rec = state_pb2.JobRecord(name=name, role=str(entry.get("role", "")),
                              principal=str(entry.get("principal", "")))
    try:
        ParseDict(dict(spec), rec.spec)
        rec.version = int(entry.get("version", 1))  # type: ignore[call-overload]
        rec.submitted_at_us = int(entry.get("submitted_at_us", 0))  # type: ignore[call-overload]
        rec.updated_at_us = int(entry.get("updated_at_us", 0))  # type: ignore[call-overload]
    except (ParseError, TypeError, ValueError):
        return None
    return rec if role_error(rec.role) is None else None



# -- records -------------------------------------------------------------------------------


@dataclass
class Agent:
    agent_id: str
    info: common_pb2.AgentInfo
    status: Status
    total: Resources
    status_since: float  # when `status` was entered (the registry's since_us)
    registered_at: float = 0.0
    peer: bytes | None = None
    used: Resources = field(default_factory=Resources)
    last_seen: float = 0.0
    unreachable_since: float = 0.0
    tasks: set[TaskKey] = field(default_factory=set)  # its non-terminal tasks
    # The CURVE principal that registered it ("" without CURVE): only that principal may
    # act as this agent (agents.py); kept in its registry entry across master failovers.
    principal: str = ""

    @property
    def reachable(self) -> bool:
        return self.status == REGISTERED and self.peer is not None

    def free(self) -> Resources:
        return self.total - self.used

    def record(self) -> state_pb2.AgentRecord:
        info = common_pb2.AgentInfo()
        info.CopyFrom(self.info)
        del info.resources[:]
        info.resources.extend(self.total.to_proto())
        return state_pb2.AgentRecord(
            agent_info=info, status=self.status, used_resources=self.used.to_proto(),
            registered_at_us=us(self.registered_at), last_seen_us=us(self.last_seen),
            unreachable_since_us=us(self.unreachable_since))


@dataclass
class Framework:
    framework_id: str
    info: common_pb2.FrameworkInfo
    registered_at: float
    peer: bytes | None = None
    disconnected_at: float = 0.0
    # Known from the registry after a master failover and not re-subscribed since: it gets
    # at least the re-register window, whatever its failover timeout (see failover_deadline).
    recovered: bool = False
    suppressed_roles: set[str] = field(default_factory=set)
    # Its declared demand (REQUEST), normalised; empty = unknown. Kept while the master
    # leads (across its scheduler's re-subscriptions), not in the registry: a framework
    # re-subscribing to a new leader restates it.
    demands: tuple[common_pb2.Demand, ...] = ()
    # Offers relayed to it and not yet used, declined or rescinded: id -> (agent, resources).
    # Changed only through add_offer / pop_offer / clear_offers, which keep `offered`, the
    # sum of their quantities, as `used` is (a record is published on every change: summing
    # 10,000 offers each time was three quarters of a busy master's time).
    offers: dict[str, tuple[str, Resources]] = field(default_factory=dict)
    offered: Resources = field(default_factory=Resources)
    used: Resources = field(default_factory=Resources)  # quantities of its live tasks (all agents)
    tasks: set[str] = field(default_factory=set)  # non-terminal task ids
    completed: OrderedDict[str, None] = field(default_factory=OrderedDict)  # oldest first

    @property
    def connected(self) -> bool:
        return self.peer is not None

    @property
    def role(self) -> str:
        return self.info.role or UNRESERVED

    @property
    def partition_aware(self) -> bool:
        return PARTITION_AWARE in self.info.capabilities

    def add_offer(self, offer_id: str, agent_id: str, resources: Resources) -> None:
        self.pop_offer(offer_id)
        self.offers[offer_id] = (agent_id, resources)
        self.offered += resources.quantities()

    def pop_offer(self, offer_id: str) -> tuple[str, Resources] | None:
        got = self.offers.pop(offer_id, None)
        if got is not None:
            self.offered = Resources() if not self.offers else \
                self.offered - got[1].quantities()
        return got

    def clear_offers(self) -> None:
        self.offers.clear()
        self.offered = Resources()

    def record(self) -> state_pb2.FrameworkRecord:
        return state_pb2.FrameworkRecord(
            framework_info=self.info, connected=self.connected,
            registered_at_us=us(self.registered_at),
            disconnected_at_us=0 if self.connected else us(self.disconnected_at),
            suppressed_roles=sorted(self.suppressed_roles),
            offered_resources=self.offered.to_proto(),
            used_resources=self.used.to_proto(), demands=self.demands)


@dataclass(slots=True)  # no instance dict: a master holds 100,000s of these
class Task:
    framework_id: str
    agent_id: str
    info: common_pb2.TaskInfo
    status: common_pb2.TaskStatus
    resources: Resources
    launched_at: float
    traceparent: str = ""
    offer_ids: tuple[str, ...] = ()

    @property
    def key(self) -> TaskKey:
        return (self.framework_id, self.info.task_id)

    @property
    def state(self) -> tasks.State:
        return self.status.state

    def record(self) -> state_pb2.TaskRecord:
        out = state_pb2.TaskRecord()
        self.record_into(out)
        return out

    def record_into(self, out: state_pb2.TaskRecord) -> None:
        """Fill an empty `out` (e.g. a stream entry's, in place: one copy of each part)."""
        out.framework_id = self.framework_id
        out.agent_id = self.agent_id
        out.task_info.CopyFrom(self.info)
        out.status.CopyFrom(self.status)
        out.launched_at_us = us(self.launched_at)
        if self.traceparent:
            out.traceparent = self.traceparent
        if self.offer_ids:  # none after a failover (each extend costs, even of nothing)
            out.offer_ids.extend(self.offer_ids)


@dataclass
class LogRequest:
    """A GetLogs relayed to an agent, waiting for its LogsReply parts."""

    peer: bytes
    message_id: str
    agent_id: str
    task_id: str
    stream: agent_pb2.LogStream.ValueType
    created_at: float
