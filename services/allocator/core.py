"""The allocator's pure core: which framework is offered which agent's free resources.
It owns the allocation policy (weighted DRF, roles and reservations, decline filters,
suppress/revive); events and the current time come in, allocations and decisions go out."""

from __future__ import annotations

import bisect
import enum
import heapq
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from schemas import internal_pb2
from services.allocator.sorter import DRFSorter, Sorter, scalar_vector
from services.resources import MILLI, Resources

DEFAULT_REFUSE_SECONDS = 5.0  # a decline without filters (DESIGN §4, as Mesos)
MAX_REFUSE_SECONDS = 365 * 24 * 3600.0  # Mesos caps filters at a year too
# An agent's free resources are worth offering only above these (Mesos MIN_CPUS/MIN_MEM).
MIN_CPUS = 0.01
MIN_MEM = 32.0

Attributes = Mapping[str, str | float]


class AllocatorError(ValueError):
    """An event that does not fit the allocator's state (an illegal transition)."""


# -- state ---------------------------------------------------------------------------------


@dataclass
class Agent:
    """An agent's resources, split by framework into offered (outstanding offers) and used
    (tasks seen on the state stream); `free` is what neither holds."""

    agent_id: str
    hostname: str
    total: Resources
    attributes: Attributes
    free: Resources
    offered: dict[str, Resources] = field(default_factory=dict)
    used: dict[str, Resources] = field(default_factory=dict)

    def allocated(self) -> Resources:
        out = Resources()
        for r in (*self.offered.values(), *self.used.values()):
            out += r
        return out


@dataclass
class Framework:
    framework_id: str
    role: str
    active: bool
    suppressed_roles: set[str] = field(default_factory=set)
    agents: set[str] = field(default_factory=set)  # where it holds offered or used resources

    @property
    def suppressed(self) -> bool:
        return self.role in self.suppressed_roles


@dataclass(frozen=True)
class Filter:
    """A decline filter: do not offer `resources` (None = anything) of this agent to this
    framework before `expires_at`. Like Mesos, an offer is refused only when the filter's
    resources contain it: once more is free, the agent is offered again."""

    framework_id: str
    agent_id: str
    resources: Resources | None
    expires_at: float

    def refuses(self, offer: Resources, now: float) -> bool:
        return now < self.expires_at and (self.resources is None or self.resources.contains(offer))


# -- outputs -------------------------------------------------------------------------------


@dataclass(frozen=True)
class Allocation:
    """Command: offer `resources` of `agent_id` to `framework_id` (the broker makes the offer).
    The share, dominant resource and weight are the framework's before this allocation."""

    allocation_id: str
    framework_id: str
    agent_id: str
    role: str
    resources: Resources
    dominant_share: float
    dominant_resource: str
    weight: float
    cycle: int

    def to_proto(self) -> internal_pb2.Allocation:
        return internal_pb2.Allocation(
            allocation_id=self.allocation_id, framework_id=self.framework_id,
            agent_id=self.agent_id, role=self.role, resources=self.resources.to_proto(),
            dominant_share=self.dominant_share, dominant_resource=self.dominant_resource,
            weight=self.weight, cycle=self.cycle)


class Outcome(enum.Enum):
    """internal.proto AllocatorDecision.Outcome (QUOTA_LIMIT unused until quotas)."""

    OFFERED = "OUTCOME_OFFERED"
    SUPPRESSED = "OUTCOME_SUPPRESSED"
    FILTERED = "OUTCOME_FILTERED"
    NO_FIT = "OUTCOME_NO_FIT"
    FAIR_SHARE = "OUTCOME_FAIR_SHARE"
    INACTIVE = "OUTCOME_INACTIVE"


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


@dataclass(frozen=True)
class Cycle:
    """The result of one `allocate`: allocations to send, and every framework's decision."""

    cycle: int
    allocations: tuple[Allocation, ...]
    decisions: tuple[Decision, ...]

    def allocations_message(self) -> internal_pb2.InternalMessage:
        msg = internal_pb2.InternalMessage()
        msg.allocations.allocations.extend(a.to_proto() for a in self.allocations)
        return msg

    def decisions_message(self) -> internal_pb2.InternalMessage:
        msg = internal_pb2.InternalMessage()
        msg.allocator_decisions.decisions.extend(d.to_proto() for d in self.decisions)
        return msg


@dataclass
class _Notes:
    """What one cycle saw of one framework, to explain its decision."""

    allocation_ids: list[str] = field(default_factory=list)
    agents_filtered: int = 0
    first_filtered: tuple[str, float] | None = None  # (agent, filter expiry)
    no_fit: int = 0


# -- the core ------------------------------------------------------------------------------


class AllocatorCore:
    """Events in (agents, frameworks, roles, tasks' usage, recovered offers, suppress and
    revive), `allocate(now)` out. Every transition is one method; an illegal one raises
    AllocatorError and leaves the state unchanged.

    Stale events are not illegal: `recover` and `resources_released` for an agent or a
    framework that is gone return False (its offers and tasks went with it)."""

    def __init__(self, sorter: Sorter | None = None, id_prefix: str = "",
                 min_cpus: float = MIN_CPUS, min_mem: float = MIN_MEM) -> None:
        self.sorter: Sorter = sorter if sorter is not None else DRFSorter()
        self.id_prefix = id_prefix
        self._min_cpus = round(min_cpus * MILLI)
        self._min_mem = round(min_mem * MILLI)
        self.agents: dict[str, Agent] = {}
        self.frameworks: dict[str, Framework] = {}
        self.weights: dict[str, float] = {}  # role -> weight; absent = 1.0
        self.filters: dict[str, dict[str, list[Filter]]] = {}  # framework -> agent -> filters
        self._expiries: list[tuple[float, int, Filter]] = []  # heap, for pruning
        self._compact_at = 64  # the heap's size that triggers dropping dead entries
        self._filter_seq = 0
        self.cycle = 0

    # -- agents ------------------------------------------------------------------------
    def agent_added(self, agent_id: str, hostname: str, total: Resources,
                    attributes: Attributes | None = None) -> None:
        if agent_id in self.agents:
            raise AllocatorError(f"agent {agent_id} added twice")
        _check_resources(total, f"agent {agent_id} total")
        self.agents[agent_id] = Agent(agent_id, hostname, total, dict(attributes or {}), total)
        self.sorter.add_total(total)

    def agent_updated(self, agent_id: str, total: Resources) -> None:
        """The agent's total changed (e.g. reconfigured); it must still hold what is allocated."""
        agent = self._agent(agent_id)
        _check_resources(total, f"agent {agent_id} total")
        allocated = agent.allocated()
        if not total.contains(allocated):
            raise AllocatorError(
                f"agent {agent_id}: new total {total} does not hold allocated {allocated}")
        self.sorter.remove_total(agent.total)
        self.sorter.add_total(total)
        agent.total, agent.free = total, total - allocated

    def agent_removed(self, agent_id: str) -> None:
        """The agent is gone (or unreachable): its offers and tasks' resources vanish."""
        agent = self._agent(agent_id)
        for framework_id in {*agent.offered, *agent.used}:
            held = agent.offered.get(framework_id, Resources()) + agent.used.get(
                framework_id, Resources())
            self.sorter.unallocated(framework_id, held)
            self.frameworks[framework_id].agents.discard(agent_id)
        for by_agent in self.filters.values():
            by_agent.pop(agent_id, None)
        self.sorter.remove_total(agent.total)
        del self.agents[agent_id]

    # -- frameworks and roles ----------------------------------------------------------
    def framework_added(self, framework_id: str, role: str, active: bool = True,
                        suppressed_roles: Iterable[str] = ()) -> None:
        if framework_id in self.frameworks:
            raise AllocatorError(f"framework {framework_id} added twice")
        if not role:
            raise AllocatorError(f"framework {framework_id} has no role")
        self.frameworks[framework_id] = Framework(framework_id, role, active,
                                                  set(suppressed_roles))
        self.sorter.add(framework_id, self.weights.get(role, 1.0))

    def framework_removed(self, framework_id: str) -> None:
        """Torn down: its offers and tasks' resources return to the pool, its filters go."""
        fw = self._framework(framework_id)
        for agent_id in fw.agents:
            agent = self.agents[agent_id]
            for held in (agent.offered.pop(framework_id, None), agent.used.pop(framework_id,
                                                                               None)):
                if held is not None:
                    agent.free += held
        self.filters.pop(framework_id, None)
        self.sorter.remove(framework_id)
        del self.frameworks[framework_id]

    def framework_activated(self, framework_id: str) -> None:
        self._framework(framework_id).active = True

    def framework_deactivated(self, framework_id: str) -> None:
        """Its scheduler disconnected: no new offers until it comes back."""
        self._framework(framework_id).active = False

    def suppress(self, framework_id: str, roles: Iterable[str] = ()) -> None:
        """Stop offering to the framework (`roles` empty = all its roles)."""
        fw = self._framework(framework_id)
        fw.suppressed_roles |= set(roles) or {fw.role}

    def revive(self, framework_id: str, roles: Iterable[str] = ()) -> None:
        """Offer to the framework again, and drop its decline filters (as Mesos)."""
        fw = self._framework(framework_id)
        fw.suppressed_roles -= set(roles) or {fw.role}
        self.filters.pop(framework_id, None)

    def set_weight(self, role: str, weight: float) -> None:
        if not (weight > 0 and math.isfinite(weight)):
            raise AllocatorError(f"role {role}: weight must be positive and finite, got {weight}")
        self.weights[role] = weight
        for fw in self.frameworks.values():
            if fw.role == role:
                self.sorter.set_weight(fw.framework_id, weight)

    # -- resources held by tasks and offers --------------------------------------------
    def resources_used(self, agent_id: str, framework_id: str, resources: Resources) -> None:
        """A task of the framework holds `resources` on the agent (seen on the state stream).
        What its outstanding offers there hold is converted (the task came from an offer);
        the rest, e.g. tasks found after an allocator failover, is taken from free."""
        agent, fw = self._agent(agent_id), self._framework(framework_id)
        _check_resources(resources, f"task resources on {agent_id}")
        offered = agent.offered.get(framework_id, Resources())
        from_offer = _common(offered, resources)
        from_free = resources - from_offer
        if not agent.free.contains(from_free):
            raise AllocatorError(
                f"agent {agent_id}: framework {framework_id} uses {resources} but only "
                f"{agent.free} is free and {offered} offered to it")
        _set(agent.offered, framework_id, offered - from_offer)
        agent.used[framework_id] = agent.used.get(framework_id, Resources()) + resources
        agent.free -= from_free
        fw.agents.add(agent_id)
        self.sorter.allocated(framework_id, from_free)

    def resources_released(self, agent_id: str, framework_id: str,
                           resources: Resources) -> bool:
        """A task ended: its resources are free. False if the agent or framework is gone."""
        agent, fw = self.agents.get(agent_id), self.frameworks.get(framework_id)
        if agent is None or fw is None:
            return False
        used = agent.used.get(framework_id, Resources())
        if not used.contains(resources):
            raise AllocatorError(f"agent {agent_id}: framework {framework_id} releases "
                                 f"{resources} but its tasks hold {used}")
        self._give_back(agent, fw, agent.used, resources)
        return True

    def recover(self, agent_id: str, framework_id: str, resources: Resources,
                refuse_seconds: float | None, now: float) -> bool:
        """Offered resources came back (declined, unused, expired, rescinded, launch refused).
        `refuse_seconds` installs a decline filter: None = the default 5 s, 0 = none.
        False if the agent or framework is gone (the offer went with it)."""
        agent, fw = self.agents.get(agent_id), self.frameworks.get(framework_id)
        if agent is None or fw is None:
            return False
        offered = agent.offered.get(framework_id, Resources())
        if not offered.contains(resources):
            raise AllocatorError(f"agent {agent_id}: framework {framework_id} returns "
                                 f"{resources} but was offered {offered}")
        self._give_back(agent, fw, agent.offered, resources)
        seconds = _refuse_seconds(refuse_seconds)
        if seconds > 0 and resources:
            self.refuse(framework_id, agent_id, now + seconds, resources)
        return True

    def recover_all_offers(self) -> None:
        """The broker lost its offer table (failover): every offer is gone, without filters."""
        for agent in self.agents.values():
            for framework_id in list(agent.offered):
                self._give_back(agent, self.frameworks[framework_id], agent.offered,
                                agent.offered[framework_id])

    def refuse(self, framework_id: str, agent_id: str, until: float,
               resources: Resources | None = None) -> None:
        """Install a filter: the agent's `resources` (None = all) are not offered to the
        framework before `until`."""
        self._framework(framework_id)
        self._agent(agent_id)
        if math.isnan(until):
            raise AllocatorError("filter expiry is NaN")
        flt = Filter(framework_id, agent_id, resources, until)
        self.filters.setdefault(framework_id, {}).setdefault(agent_id, []).append(flt)
        self._filter_seq += 1
        heapq.heappush(self._expiries, (until, self._filter_seq, flt))
        if len(self._expiries) > self._compact_at:  # drop entries of filters revive removed
            live = {id(f) for by_agent in self.filters.values() for fl in by_agent.values()
                    for f in fl}
            self._expiries = [e for e in self._expiries if id(e[2]) in live]
            heapq.heapify(self._expiries)
            self._compact_at = 2 * len(self._expiries) + 64

    # -- allocation --------------------------------------------------------------------
    def allocate(self, now: float) -> Cycle:
        """One allocation cycle: each agent's free resources (those a framework's role may
        use) go whole to the framework with the lowest weighted dominant share that is
        active, not suppressed and not filtered there; it is then re-sorted."""
        self._expire_filters(now)
        self.cycle += 1
        eligible = [f.framework_id for f in self.frameworks.values()
                    if f.active and not f.suppressed]
        order = self.sorter.sort(eligible)
        notes = {fid: _Notes() for fid in eligible}
        allocations: list[Allocation] = []
        for agent in self.agents.values():
            if not order:
                break
            if not self._allocatable(agent.free):
                continue
            taken: list[str] = []
            i = 0
            while i < len(order) and self._allocatable(agent.free):
                framework_id = order[i][1]
                fw, note = self.frameworks[framework_id], notes[framework_id]
                offer = agent.free.for_role(fw.role)
                if not self._allocatable(offer):
                    note.no_fit += 1
                    i += 1
                    continue
                refusal = self._refusal(framework_id, agent.agent_id, offer, now)
                if refusal is not None:
                    note.agents_filtered += 1
                    if note.first_filtered is None:
                        note.first_filtered = (agent.agent_id, refusal)
                    i += 1
                    continue
                allocation = self._offer(agent, fw, offer, len(allocations))
                allocations.append(allocation)
                note.allocation_ids.append(allocation.allocation_id)
                taken.append(order.pop(i)[1])  # it took all it may use of this agent
            for framework_id in taken:
                bisect.insort(order, (self.sorter.key(framework_id), framework_id))
        decisions = tuple(self._decide(fw, notes.get(fw.framework_id), bool(allocations), now)
                          for _, fw in sorted(self.frameworks.items()))
        return Cycle(self.cycle, tuple(allocations), decisions)

    def _offer(self, agent: Agent, fw: Framework, offer: Resources, n: int) -> Allocation:
        share = self.sorter.share(fw.framework_id)
        fid = fw.framework_id
        agent.offered[fid] = agent.offered.get(fid, Resources()) + offer
        agent.free -= offer
        fw.agents.add(agent.agent_id)
        self.sorter.allocated(fid, offer)
        return Allocation(f"{self.id_prefix}{self.cycle}-{n}", fid, agent.agent_id, fw.role,
                          offer, share.dominant_share, share.dominant_resource, share.weight,
                          self.cycle)

    def _decide(self, fw: Framework, note: _Notes | None, any_offered: bool,
                now: float) -> Decision:
        share = self.sorter.share(fw.framework_id)
        ids: tuple[str, ...] = ()
        filtered = 0
        if not fw.active:
            outcome, reason = Outcome.INACTIVE, "not subscribed (disconnected or failing over)"
        elif fw.suppressed or note is None:
            outcome = Outcome.SUPPRESSED
            reason = f"suppressed offers for role {fw.role}; REVIVE to get offers again"
        else:
            ids, filtered = tuple(note.allocation_ids), note.agents_filtered
            if ids:
                outcome = Outcome.OFFERED
                reason = (f"offered {len(ids)} agent(s) at dominant share "
                          f"{share.dominant_share:.3f} ({share.dominant_resource or '-'}), "
                          f"weight {share.weight:g}")
            elif note.first_filtered is not None:
                agent_id, until = note.first_filtered
                outcome = Outcome.FILTERED
                reason = (f"{filtered} agent(s) filtered by its declines, e.g. {agent_id} "
                          f"until t={until:.3f}")
            elif any_offered:
                outcome = Outcome.FAIR_SHARE
                reason = (f"frameworks with a lower weighted share took the free resources "
                          f"(its share {share.key:.3f})")
            else:
                outcome = Outcome.NO_FIT
                reason = (f"no agent has free resources of role {fw.role} or '*' above "
                          f"cpus {self._min_cpus / MILLI:g} or mem {self._min_mem / MILLI:g}")
        return Decision(fw.framework_id, fw.role, outcome, reason, share.dominant_share,
                        share.dominant_resource, share.weight, share.shares, ids, filtered,
                        self.cycle, now)

    def _allocatable(self, r: Resources) -> bool:
        cpus = mem = 0
        for (name, _), v in r.scalars.items():
            if name == "cpus":
                cpus += v
            elif name == "mem":
                mem += v
        return cpus >= self._min_cpus or mem >= self._min_mem

    def _refusal(self, framework_id: str, agent_id: str, offer: Resources,
                 now: float) -> float | None:
        """The latest expiry among the framework's filters refusing `offer` on the agent."""
        by_agent = self.filters.get(framework_id)
        flts = by_agent.get(agent_id) if by_agent else None
        if not flts:
            return None
        return max((f.expires_at for f in flts if f.refuses(offer, now)), default=None)

    def next_filter_expiry(self, now: float) -> float | None:
        """When the earliest decline filter still in force ends (its resources may then be
        offered again), or None."""
        return min((f.expires_at for by_agent in self.filters.values()
                    for flts in by_agent.values() for f in flts if f.expires_at > now),
                   default=None)

    def _expire_filters(self, now: float) -> None:
        while self._expiries and self._expiries[0][0] <= now:
            flt = heapq.heappop(self._expiries)[2]
            by_agent = self.filters.get(flt.framework_id)
            flts = by_agent.get(flt.agent_id) if by_agent else None
            if by_agent is None or not flts or flt not in flts:
                continue  # already gone: revive, or its agent or framework was removed
            flts.remove(flt)
            if not flts:
                del by_agent[flt.agent_id]
                if not by_agent:
                    del self.filters[flt.framework_id]

    # -- helpers -----------------------------------------------------------------------
    def _give_back(self, agent: Agent, fw: Framework, held: dict[str, Resources],
                   resources: Resources) -> None:
        fid = fw.framework_id
        _set(held, fid, held[fid] - resources)
        agent.free += resources
        if fid not in agent.offered and fid not in agent.used:
            fw.agents.discard(agent.agent_id)
        self.sorter.unallocated(fid, resources)

    def _agent(self, agent_id: str) -> Agent:
        try:
            return self.agents[agent_id]
        except KeyError:
            raise AllocatorError(f"unknown agent {agent_id}") from None

    def _framework(self, framework_id: str) -> Framework:
        try:
            return self.frameworks[framework_id]
        except KeyError:
            raise AllocatorError(f"unknown framework {framework_id}") from None

    # -- invariants --------------------------------------------------------------------
    def validate(self) -> None:
        """Invariants, checked after every step in tests."""
        held: dict[str, Resources] = {fid: Resources() for fid in self.frameworks}
        for agent_id, agent in self.agents.items():
            assert agent.agent_id == agent_id
            for fid, r in (*agent.offered.items(), *agent.used.items()):
                assert fid in self.frameworks, f"{agent_id}: unknown framework {fid}"
                assert r, f"{agent_id}: empty entry for {fid}"
                assert agent_id in self.frameworks[fid].agents
                held[fid] += r
            allocated = agent.allocated()
            for r in (agent.total, agent.free, allocated):
                assert all(v >= 0 for v in r.scalars.values()), f"{agent_id}: negative {r}"
            assert agent.total.contains(allocated), f"{agent_id}: {allocated} > {agent.total}"
            assert (allocated + agent.free).same(agent.total), (
                f"{agent_id}: allocated {allocated} + free {agent.free} != {agent.total}")
        total = Resources()
        for agent in self.agents.values():
            total += agent.total
        assert dict(self.sorter.total) == scalar_vector(total), (self.sorter.total, total)
        for fid, fw in self.frameworks.items():
            assert fw.framework_id == fid
            assert all(a in self.agents and (fid in self.agents[a].offered
                                             or fid in self.agents[a].used)
                       for a in fw.agents), f"{fid}: stale agents {fw.agents}"
            assert dict(self.sorter.allocation(fid)) == scalar_vector(held[fid]), fid
        for fid, by_agent in self.filters.items():
            assert fid in self.frameworks, f"filter for unknown framework {fid}"
            for agent_id, flts in by_agent.items():
                assert agent_id in self.agents, f"filter for unknown agent {agent_id}"
                assert flts and all(f.framework_id == fid and f.agent_id == agent_id
                                    for f in flts)
        self.sorter.validate()


# -- resource helpers ------------------------------------------------------------------------


def _refuse_seconds(seconds: float | None) -> float:
    """A decline's filter duration; like Mesos, a missing or invalid one is the default."""
    if seconds is None or math.isnan(seconds) or seconds < 0:
        return DEFAULT_REFUSE_SECONDS
    return min(seconds, MAX_REFUSE_SECONDS)


def _check_resources(r: Resources, what: str) -> None:
    if any(v < 0 for v in r.scalars.values()):
        raise AllocatorError(f"{what}: negative scalar in {r}")


def _set(held: dict[str, Resources], key: str, r: Resources) -> None:
    if r:
        held[key] = r
    else:
        held.pop(key, None)


def _common(a: Resources, b: Resources) -> Resources:
    """The largest resources both `a` and `b` contain (per name and reservation role)."""
    scalars = {k: min(v, b.scalars[k]) for k, v in a.scalars.items()
               if k in b.scalars and min(v, b.scalars[k]) > 0}
    ranges = {}
    for k, rs in a.ranges.items():
        both = [(max(lo, blo), min(hi, bhi)) for lo, hi in rs for blo, bhi in b.ranges.get(k, ())
                if max(lo, blo) <= min(hi, bhi)]
        if both:
            ranges[k] = tuple(sorted(both))
    sets = {k: items & b.sets[k] for k, items in a.sets.items() if items & b.sets.get(k, set())}
    return Resources() + Resources(scalars, ranges, sets)  # `+` normalises the ranges
