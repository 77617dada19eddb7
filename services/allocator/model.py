"""The allocator's state and its outputs as values: agents, frameworks and decline filters
as the core holds them; allocations, decisions and cycles as it hands them out."""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass, field

from schemas import internal_pb2
from services.allocator.fill import Shape
from services.resources import Resources

Attributes = Mapping[str, str | float]
NOTHING = Resources()


class AllocatorError(ValueError):
    """An event that does not fit the allocator's state (an illegal transition)."""


# -- state ---------------------------------------------------------------------------------


@dataclass(slots=True)
class Agent:
    """An agent's resources, split by framework into offered (outstanding offers) and used
    (tasks seen on the state stream); `free` is what neither holds."""

    agent_id: str
    hostname: str
    total: Resources
    attributes: Attributes
    free: Resources
    seq: int = 0  # the order agents were added in: the order a cycle visits them
    offered: dict[str, Resources] = field(default_factory=dict)
    used: dict[str, Resources] = field(default_factory=dict)

    def allocated(self) -> Resources:
        out = Resources()
        for r in (*self.offered.values(), *self.used.values()):
            out += r
        return out


@dataclass(slots=True)
class Framework:
    framework_id: str
    role: str
    active: bool
    suppressed_roles: set[str] = field(default_factory=set)
    agents: set[str] = field(default_factory=set)  # where it holds offered or used resources
    demands: tuple[Shape, ...] = ()  # declared (REQUEST); empty = unknown, offered as Mesos
    offered: dict[str, int] = field(default_factory=dict)  # DRF scalars of its offers, milli

    @property
    def suppressed(self) -> bool:
        return self.role in self.suppressed_roles


@dataclass(frozen=True, slots=True)
class Filter:
    """A decline filter: do not offer `resources` (None = anything) of this agent to this
    framework before `expires_at`. Like Mesos, an offer is refused only when the filter's
    resources contain it: once more is free, the agent is offered again."""

    framework_id: str
    agent_id: str
    resources: Resources | None
    expires_at: float

    def refuses(self, offer: Resources, now: float) -> bool:
        r = self.resources
        return now < self.expires_at and (r is None or r is offer or r == offer
                                          or r.contains(offer))


# -- outputs -------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Allocation:
    """Command: offer `resources` of `agent_id` to `framework_id` (the broker makes the offer).
    The share, dominant resource and weight are the framework's before this allocation.
    Why it got less than the agent had free, for its span: `fair_share_cut`, what
    progressive filling kept for frameworks of declared demand (its headroom), and
    `reserved_elsewhere`, the free resources reserved for other roles."""

    allocation_id: str
    framework_id: str
    agent_id: str
    role: str
    resources: Resources
    dominant_share: float
    dominant_resource: str
    weight: float
    cycle: int
    fair_share_cut: Resources = NOTHING
    reserved_elsewhere: Resources = NOTHING
    revocable: bool = False  # beyond the framework's guaranteed share (cycle.py)

    def to_proto(self) -> internal_pb2.Allocation:
        return internal_pb2.Allocation(
            allocation_id=self.allocation_id, framework_id=self.framework_id,
            agent_id=self.agent_id, role=self.role, resources=self.resources.to_proto(),
            dominant_share=self.dominant_share, dominant_resource=self.dominant_resource,
            weight=self.weight, cycle=self.cycle, revocable=self.revocable)


class Outcome(enum.Enum):
    """internal.proto AllocatorDecision.Outcome."""

    OFFERED = "OUTCOME_OFFERED"
    SUPPRESSED = "OUTCOME_SUPPRESSED"
    FILTERED = "OUTCOME_FILTERED"
    NO_FIT = "OUTCOME_NO_FIT"
    FAIR_SHARE = "OUTCOME_FAIR_SHARE"
    INACTIVE = "OUTCOME_INACTIVE"
    DEMAND_MET = "OUTCOME_DEMAND_MET"
    QUOTA_LIMIT = "OUTCOME_QUOTA_LIMIT"


@dataclass(frozen=True)
class Decision:
    """A framework's standing after one allocation cycle, for `offerbus why`."""

    framework_id: str
    role: str
    outcome: Outcome
    reason: str
    dominant_share: float
    dominant_resource: str
    weight: float
    shares: Mapping[str, float]
    allocation_ids: tuple[str, ...]
    agents_filtered: int
    cycle: int
    decided_at: float

    def to_proto(self) -> internal_pb2.AllocatorDecision:
        return internal_pb2.AllocatorDecision(
            framework_id=self.framework_id, role=self.role,
            outcome=internal_pb2.AllocatorDecision.Outcome.Value(self.outcome.value),
            reason=self.reason, dominant_share=self.dominant_share,
            dominant_resource=self.dominant_resource, weight=self.weight,
            shares=dict(self.shares), allocation_ids=list(self.allocation_ids),
            agents_filtered=self.agents_filtered, cycle=self.cycle,
            decided_at_us=int(self.decided_at * 1_000_000))


@dataclass(frozen=True, slots=True)
class Reclaim:
    """Command: rescind `framework_id`'s outstanding offers on `agent_id` (the broker
    recovers them without a filter): `for_framework_id`, below its share, needs them."""

    framework_id: str
    agent_id: str
    for_framework_id: str
    reason: str

    def to_proto(self) -> internal_pb2.InternalMessage.ReclaimOffers.Reclaim:
        return internal_pb2.InternalMessage.ReclaimOffers.Reclaim(
            framework_id=self.framework_id, agent_id=self.agent_id, reason=self.reason)


@dataclass(frozen=True, slots=True)
class Revocation:
    """Command: `framework_id` runs above its share; `resources` of its tasks on `agent_id`
    go back to `for_framework_id` (the master kills its youngest tasks there after
    `grace_s`, unless it frees them first)."""

    framework_id: str
    agent_id: str
    resources: Resources
    grace_s: float
    for_framework_id: str
    reason: str

    def to_message(self) -> internal_pb2.InternalMessage:
        return internal_pb2.InternalMessage(
            revoke_resources=internal_pb2.InternalMessage.RevokeResources(
                framework_id=self.framework_id, agent_id=self.agent_id,
                resources=self.resources.to_proto(), grace_s=self.grace_s,
                for_framework_id=self.for_framework_id, reason=self.reason))


@dataclass(frozen=True)
class Cycle:
    """The result of one `allocate`: allocations to send, every framework's standing
    decision, and those of them re-made in this cycle (the rest stand from earlier ones)."""

    cycle: int
    allocations: tuple[Allocation, ...]
    decisions: tuple[Decision, ...]
    remade: tuple[Decision, ...] = ()
    visited: int = 0  # agents the cycle looked at
    reclaims: tuple[Reclaim, ...] = ()
    revocations: tuple[Revocation, ...] = ()

    def reclaims_message(self) -> internal_pb2.InternalMessage:
        msg = internal_pb2.InternalMessage()
        msg.reclaim_offers.reclaims.extend(r.to_proto() for r in self.reclaims)
        return msg

    def allocations_message(self) -> internal_pb2.InternalMessage:
        msg = internal_pb2.InternalMessage()
        msg.allocations.allocations.extend(a.to_proto() for a in self.allocations)
        return msg

    def decisions_message(self) -> internal_pb2.InternalMessage:
        msg = internal_pb2.InternalMessage()
        msg.allocator_decisions.decisions.extend(d.to_proto() for d in self.decisions)
        return msg


@dataclass(slots=True)
class Notes:
    """What one cycle saw of one framework, to explain its decision."""

    allocation_ids: list[str] = field(default_factory=list)
    agents_filtered: int = 0
    first_filtered: tuple[str, float] | None = None  # (agent, filter expiry)
    no_fit: int = 0
    demand_met: bool = False  # it holds all it declared
    unfit: Shape | None = None  # its next declared task fitted no agent visited
    units: int = 0  # declared task shapes offered this cycle
    # agent -> what it could take there before fair share cut it to its headroom
    cut: dict[str, Resources] = field(default_factory=dict)
    cut_agents: int = 0  # agents offered with a fair-share cut
    reserved_agents: int = 0  # agents offered where resources reserved for others were left
    revocable: int = 0  # revocable allocations (beyond its guaranteed share)
    split: int = 0  # agents offered in two allocations, guaranteed and revocable
    quota: str = ""  # what of its role's quota cut or refused an offer: limit, guarantee
    held_back: int = 0  # agents not offered: it holds its bound of offers unanswered (fanout.py)


def check_resources(r: Resources, what: str) -> None:
    """AllocatorError when `r` holds a negative scalar."""
    if any(v < 0 for v in r.scalars.values()):
        raise AllocatorError(f"{what}: negative scalar in {r}")


def set_held(held: dict[str, Resources], key: str, r: Resources) -> None:
    """`held[key] = r`, or no entry when `r` is nothing."""
    if r:
        held[key] = r
    else:
        held.pop(key, None)
