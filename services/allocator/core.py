"""The allocator's pure core: which framework is offered which agent's free resources.
It owns the allocation policy (weighted DRF, roles and reservations, decline filters,
suppress/revive) and keeps it incremental: a cycle visits only the agents whose free
resources changed (or whose filter ended) and, on agents every framework refused, only the
frameworks that became eligible since; a cluster where nothing changed costs nothing.
Events and the current time come in, allocations and decisions go out."""

from __future__ import annotations

import math
from collections.abc import Iterable

from services.allocator.cycle import visit
from services.allocator.decide import decide
from services.allocator.fanout import DEFAULT_MAX_OFFERS_PER_FRAMEWORK, Fanout
from services.allocator.fill import Shape, add_into, next_unit
from services.allocator.filters import DeclineFilters
from services.allocator.invariants import check
from services.allocator.model import (
    Agent,
    Allocation,
    AllocatorError,
    Attributes,
    Cycle,
    Decision,
    Filter,
    Framework,
    Notes,
    Outcome,
    check_resources,
    set_held,
)
from services.allocator.quota import (
    Quotas,
    QuotaSpec,
    Rooms,
    apply,
    demanding_roles,
    guard_rooms,
    guarded,
    quota_vector,
    rooms_grew,
)
from services.allocator.reclaim import Plan
from services.allocator.reclaim import plan as plan_reclaims
from services.allocator.reserved import as_held, follow_split, overlap, swap_for_use
from services.allocator.sorter import DRFSorter, Sorter, role_path
from services.decline import DEFAULT_REFUSE_SECONDS, MAX_REFUSE_SECONDS, refuse_seconds_of
from services.resources import MILLI, Resources

# An agent's free resources are worth offering only above these (Mesos MIN_CPUS/MIN_MEM).
MIN_CPUS = 0.01
MIN_MEM = 32.0
# Revocation: a framework above its share is asked to give tasks back, and they are killed
# after this long (it may free as much itself first); None turns revocation off.
DEFAULT_REVOCATION_GRACE_S = 5.0
NOTHING = Resources()

__all__ = ["DEFAULT_REFUSE_SECONDS", "MAX_REFUSE_SECONDS", "MIN_CPUS", "MIN_MEM", "Agent",
           "Allocation", "AllocatorCore", "AllocatorError", "Attributes", "Cycle",
           "Decision", "Filter", "Framework", "Outcome"]



class AllocatorCore:
    """Events in (agents, frameworks, roles, tasks' usage, recovered offers, suppress and
    revive), `allocate(now)` out. Every transition is one method; an illegal one raises
    AllocatorError and leaves the state unchanged.

    Stale events are not illegal: `recover` and `resources_released` for an agent or a
    framework that is gone return False (its offers and tasks went with it).

    Incremental (the default): events mark what a cycle must look at. An agent whose free
    resources changed, or whose decline filter ended, is *dirty*: the next cycle offers it
    as a full scan would (every eligible framework, in DRF order). After a visit, an agent
    with allocatable resources left is *idle*: every eligible framework refused it (a filter
    or nothing of its role), and keeps refusing until the agent is dirty again or the
    framework is *fresh* (added, activated or revived), so idle agents are visited only
    when some framework is fresh, and then only by the fresh ones. A framework's decision
    is re-made in the cycles that concern it (an event of its own, or a visited agent
    considered for it); the others stand. `incremental=False` visits every agent and
    framework each cycle (the reference the tests and the benchmark compare with)."""

    def __init__(self, sorter: Sorter | None = None, id_prefix: str = "",
                 min_cpus: float = MIN_CPUS, min_mem: float = MIN_MEM,
                 incremental: bool = True,
                 revocation_grace_s: float | None = DEFAULT_REVOCATION_GRACE_S,
                 max_offers_per_framework: int = DEFAULT_MAX_OFFERS_PER_FRAMEWORK) -> None:
        self.sorter: Sorter = sorter if sorter is not None else DRFSorter()
        self.id_prefix = id_prefix
        self.incremental = incremental
        self.min_cpus = round(min_cpus * MILLI)
        self.min_mem = round(min_mem * MILLI)
        self.agents: dict[str, Agent] = {}
        self.frameworks: dict[str, Framework] = {}
        self.weights: dict[str, float] = {}  # role -> weight; absent = 1.0
        self.quotas = Quotas()  # role -> guarantee and limit (quota.py)
        # A role with demand was below its guarantee in the last cycle: free resources may
        # have been refused for it. The next cycle visits the idle agents again if some were
        # (`_guard_refused`, since the idle agents were last all visited) and either no role
        # is below its guarantee now or some role may take more than as the last cycle
        # ended (`_end_rooms`: rooms only shrink while a cycle allocates, so a refusal made
        # in it stands otherwise). The roles with demand are those at the cycle's start.
        self._guarded = False
        self._end_rooms: Rooms = {}
        self._guard_refused = False
        self._demanding: set[str] | None = None
        self._declared = 0  # frameworks that declared demand (none: the cycle is Mesos's)
        self.filters = DeclineFilters()
        self.fanout = Fanout(max_offers_per_framework)  # offers outstanding per framework
        self.decisions: dict[str, Decision] = {}  # the standing one per framework
        self.cycle = 0
        self._agent_seq = 0
        self._dirty: set[str] = set()  # agents the next cycle visits with every framework
        self.away: set[str] = set()  # agents never visited until back (agent_away)
        self._idle: set[str] = set()  # agents left allocatable, refused by every framework
        self._fresh: set[str] = set()  # frameworks the next cycle tries on idle agents
        self._touched: set[str] = set()  # frameworks whose decision the next cycle re-makes
        # Fair share (reclaim.py): frameworks with unmet declared demand, offered nothing;
        # those with a reclaim in flight (until when); pending revocations per (holder,
        # agent) (until when); and what is being done for each, for its decision.
        self.revocation_grace_s = revocation_grace_s
        self._wanting: set[str] = set()
        self._reclaiming: dict[str, float] = {}
        self._revoking: dict[tuple[str, str], float] = {}
        self.said: dict[str, str] = {}

    # -- agents ------------------------------------------------------------------------
    def agent_added(self, agent_id: str, hostname: str, total: Resources,
                    attributes: Attributes | None = None) -> None:
        if agent_id in self.agents:
            raise AllocatorError(f"agent {agent_id} added twice")
        check_resources(total, f"agent {agent_id} total")
        self._agent_seq += 1
        self.agents[agent_id] = Agent(agent_id, hostname, total, dict(attributes or {}), total,
                                      self._agent_seq)
        self.sorter.add_total(total)
        self._dirty.add(agent_id)

    def agent_updated(self, agent_id: str, total: Resources) -> None:
        """The agent's total changed (e.g. reconfigured); it must still hold what is allocated."""
        agent = self._agent(agent_id)
        check_resources(total, f"agent {agent_id} total")
        allocated = agent.allocated()
        if not total.contains(allocated):
            raise AllocatorError(
                f"agent {agent_id}: new total {total} does not hold allocated {allocated}")
        self.sorter.remove_total(agent.total)
        self.sorter.add_total(total)
        agent.total, agent.free = total, total - allocated
        self._dirty.add(agent_id)

    def agent_total_changed(self, agent_id: str, total: Resources) -> None:
        """The agent's total as the master now has it: reconfigured, or a reservation made
        or undone inside an ACCEPT (another reserved/unreserved split of the same amounts):
        its frameworks' offers there follow the split (reserved.py), then as agent_updated."""
        agent = self._agent(agent_id)
        before = agent.offered
        agent.offered = follow_split(agent.total, total, before,
                                     {fid: self.frameworks[fid].role for fid in before})
        try:
            self.agent_updated(agent_id, total)
        except AllocatorError:
            agent.offered = before
            raise

    def agent_away(self, agent_id: str) -> None:
        """The agent is known but not reachable for now (a new master waits for it to
        re-register): nothing is offered on it, its tasks' resources stay counted."""
        self._agent(agent_id)
        self.away.add(agent_id)
        self._dirty.discard(agent_id)
        self._idle.discard(agent_id)

    def agent_back(self, agent_id: str) -> None:
        """An away agent is reachable again: visited with every framework next cycle."""
        self._agent(agent_id)
        if agent_id in self.away:
            self.away.discard(agent_id)
            self._dirty.add(agent_id)

    def agent_removed(self, agent_id: str) -> None:
        """The agent is gone (or unreachable): its offers and tasks' resources vanish."""
        agent = self._agent(agent_id)
        for framework_id in {*agent.offered, *agent.used}:
            held = agent.offered.get(framework_id, NOTHING) + agent.used.get(
                framework_id, NOTHING)
            self.sorter.unallocated(framework_id, held)
            fw = self.frameworks[framework_id]
            if fw.demands:
                add_into(fw.offered, agent.offered.get(framework_id, NOTHING), -1)
            fw.agents.discard(agent_id)
            self._touched.add(framework_id)
            if self.fanout.forget(framework_id, agent_id) or fw.demands:  # it holds less:
                self._fresh.add(framework_id)  # an idle agent may now fit its next task
            self._room_grew(fw.role)
        self.filters.drop_agent(agent_id)
        self.sorter.remove_total(agent.total)
        self._revoking = {k: t for k, t in self._revoking.items() if k[1] != agent_id}
        del self.agents[agent_id]
        self._dirty.discard(agent_id)
        self._idle.discard(agent_id)
        self.away.discard(agent_id)

    # -- frameworks and roles ----------------------------------------------------------
    def framework_added(self, framework_id: str, role: str, active: bool = True,
                        suppressed_roles: Iterable[str] = ()) -> None:
        if framework_id in self.frameworks:
            raise AllocatorError(f"framework {framework_id} added twice")
        if not role:
            raise AllocatorError(f"framework {framework_id} has no role")
        self.frameworks[framework_id] = Framework(framework_id, role, active,
                                                  set(suppressed_roles))
        self.sorter.add(framework_id, role)
        self._fresh.add(framework_id)
        self._touched.add(framework_id)

    def framework_removed(self, framework_id: str) -> None:
        """Torn down: its offers and tasks' resources return to the pool, its filters go."""
        fw = self._framework(framework_id)
        for agent_id in fw.agents:
            agent = self.agents[agent_id]
            for held in (agent.offered.pop(framework_id, None), agent.used.pop(framework_id,
                                                                               None)):
                if held is not None:
                    agent.free += held
            self._dirty.add(agent_id)
        self.filters.drop_framework(framework_id)
        self.fanout.drop(framework_id)
        self.sorter.remove(framework_id)
        self._declared -= 1 if fw.demands else 0
        del self.frameworks[framework_id]
        self._room_grew(fw.role)
        self.decisions.pop(framework_id, None)
        self._fresh.discard(framework_id)
        self._touched.discard(framework_id)
        self._forget_wants(framework_id)
        self._revoking = {k: t for k, t in self._revoking.items() if k[0] != framework_id}

    def _forget_wants(self, framework_id: str) -> None:
        self._wanting.discard(framework_id)
        self._reclaiming.pop(framework_id, None)
        self.said.pop(framework_id, None)

    def demand(self, framework_id: str, shapes: Iterable[Shape]) -> None:
        """The framework declared what it wants (REQUEST): tasks of these shapes, in total
        (held plus wanted). Empty = unknown: offered as Mesos would."""
        fw = self._framework(framework_id)
        new = tuple(shapes)
        if new != fw.demands:
            if not fw.demands:  # what it is offered is tracked while it declares demand
                fw.offered = {}
                for agent_id in fw.agents:
                    add_into(fw.offered, self.agents[agent_id].offered.get(framework_id, NOTHING))
            self._declared += (1 if new else 0) - (1 if fw.demands else 0)
            fw.demands = new
            if not new:
                fw.offered = {}
            self._fresh.add(framework_id)
            self._touched.add(framework_id)
            self._forget_wants(framework_id)

    def framework_activated(self, framework_id: str) -> None:
        fw = self._framework(framework_id)
        if not fw.active:
            fw.active = True
            self._fresh.add(framework_id)
        self._touched.add(framework_id)

    def framework_deactivated(self, framework_id: str) -> None:
        """Its scheduler disconnected: no new offers until it comes back."""
        self._framework(framework_id).active = False
        self._touched.add(framework_id)
        self._forget_wants(framework_id)

    def suppress(self, framework_id: str, roles: Iterable[str] = ()) -> None:
        """Stop offering to the framework (`roles` empty = all its roles)."""
        fw = self._framework(framework_id)
        fw.suppressed_roles |= set(roles) or {fw.role}
        self._touched.add(framework_id)

    def revive(self, framework_id: str, roles: Iterable[str] = ()) -> None:
        """Offer to the framework again, and drop its decline filters (as Mesos)."""
        fw = self._framework(framework_id)
        fw.suppressed_roles -= set(roles) or {fw.role}
        self.filters.drop_framework(framework_id)
        self._fresh.add(framework_id)
        self._touched.add(framework_id)

    def set_weight(self, role: str, weight: float) -> None:
        if not (weight > 0 and math.isfinite(weight)):
            raise AllocatorError(f"role {role}: weight must be positive and finite, got {weight}")
        self.weights[role] = weight
        self.sorter.set_role_weight(role, weight)
        self._touched.update(self.sorter.role_clients(role))

    def set_quota(self, role: str, guarantee: QuotaSpec = None, limit: QuotaSpec = None
                  ) -> None:
        """The role's quota (quota.py; None or empty: none): its subtree's frameworks are
        never offered beyond `limit` together, and `guarantee` is set aside for it while
        it has demand. Nothing running is taken back."""
        if not self.quotas.set(role, quota_vector(guarantee), quota_vector(limit)):
            return
        self._fresh.update(self.sorter.role_clients(role))
        self._touched.update(self.frameworks)  # a guarantee concerns every other role

    def _room_grew(self, role: str) -> None:
        """A role holds less: under a limit, idle agents may now be offered to its
        subtree's frameworks (those of the limited roles it is in)."""
        if self.quotas.limited:
            for p in role_path(role):
                if p in self.quotas.limited:
                    clients = self.sorter.role_clients(p)
                    self._fresh.update(clients)
                    self._touched.update(clients)

    # -- resources held by tasks and offers --------------------------------------------
    def resources_used(self, agent_id: str, framework_id: str, resources: Resources) -> None:
        """A task of the framework holds `resources` on the agent (seen on the state stream).
        What its outstanding offers there hold is converted (the task came from an offer);
        the rest, e.g. tasks found after an allocator failover, is taken from free."""
        agent, fw = self._agent(agent_id), self._framework(framework_id)
        check_resources(resources, f"task resources on {agent_id}")
        offered = agent.offered.get(framework_id, NOTHING)
        if offered and offered.contains(resources):
            # A task launched from its offer (the usual case): all of it comes from the
            # offer, the overlap of the two (no label to swap, nothing from free).
            from_offer, from_free = resources, NOTHING
        else:
            offered = self._labels_for_use(agent, framework_id, resources)
            from_offer = overlap(offered, resources)
            from_free = resources - from_offer
            if not agent.free.contains(from_free):
                raise AllocatorError(
                    f"agent {agent_id}: framework {framework_id} uses {resources} but only "
                    f"{agent.free} is free and {offered} offered to it")
        set_held(agent.offered, framework_id, offered - from_offer)
        if self.fanout.note(framework_id, agent):  # the offer answered: it may have more
            self._fresh.add(framework_id)
        if fw.demands:
            add_into(fw.offered, from_offer, -1)
        agent.used[framework_id] = agent.used.get(framework_id, NOTHING) + resources
        fw.agents.add(agent_id)
        self._touched.add(framework_id)
        if fw.demands:  # what it runs counts on every agent: its next shape may change
            self._fresh.add(framework_id)
        if from_free:
            agent.free -= from_free
            self.sorter.allocated(framework_id, from_free)
            self._dirty.add(agent_id)

    def _labels_for_use(self, agent: Agent, framework_id: str, resources: Resources) -> Resources:
        """The framework's offer on the agent, its labels swapped with free ones where a
        reservation made or undone in its ACCEPT moved them (reserved.py)."""
        offered = agent.offered.get(framework_id, NOTHING)
        if offered and not offered.contains(resources):
            swapped, free = swap_for_use(offered, agent.free, resources,
                                         self.frameworks[framework_id].role)
            if swapped != offered:
                set_held(agent.offered, framework_id, swapped)
                agent.free, offered = free, swapped
                self._dirty.add(agent.agent_id)
        return offered

    def resources_released(self, agent_id: str, framework_id: str,
                           resources: Resources) -> bool:
        """A task ended: its resources are free. False if the agent or framework is gone."""
        agent, fw = self.agents.get(agent_id), self.frameworks.get(framework_id)
        if agent is None or fw is None:
            return False
        used = agent.used.get(framework_id, NOTHING)
        if not used.contains(resources):
            raise AllocatorError(f"agent {agent_id}: framework {framework_id} releases "
                                 f"{resources} but its tasks hold {used}")
        self._give_back(agent, fw, agent.used, resources)
        self._revoking.pop((framework_id, agent_id), None)  # served (or freed anyway)
        return True

    def recover(self, agent_id: str, framework_id: str, resources: Resources,
                refuse_seconds: float | None, now: float) -> bool:
        """Offered resources came back (declined, unused, expired, rescinded, launch refused).
        `refuse_seconds` installs a decline filter: None = the default 5 s, 0 = none.
        False if the agent or framework is gone (the offer went with it)."""
        agent, fw = self.agents.get(agent_id), self.frameworks.get(framework_id)
        if agent is None or fw is None:
            return False
        offered = agent.offered.get(framework_id, NOTHING)
        if not offered.contains(resources):  # (else as_held would give them back as they are)
            resources = as_held(offered, resources, fw.role)  # relabelled by a (un)reservation
            if not offered.contains(resources):
                raise AllocatorError(f"agent {agent_id}: framework {framework_id} returns "
                                     f"{resources} but was offered {offered}")
        self._give_back(agent, fw, agent.offered, resources)
        seconds = refuse_seconds_of(refuse_seconds)
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
        self.filters.add(Filter(framework_id, agent_id, resources, until))
        self._touched.add(framework_id)

    def next_deadline(self, now: float) -> float | None:
        """When the next cycle is due without an event: the earliest decline filter still
        in force ends (its resources may then be offered again), or a reclaim's patience
        ends (it is tried again); None if neither."""
        times = [t for t in (self.filters.next_expiry(now), *self._reclaiming.values(),
                             *self._revoking.values()) if t is not None]
        return min(times, default=None)

    # -- fair share: reclaims in flight (reclaim.py) -----------------------------------
    def reclaim_started(self, framework_id: str, until: float) -> None:
        self._reclaiming[framework_id] = until

    def revocation_started(self, framework_id: str, holder: str, agent_id: str,
                           until: float) -> None:
        self._reclaiming[framework_id] = until
        self._revoking[(holder, agent_id)] = until

    def revoking(self, holder: str, agent_id: str, now: float) -> bool:
        return self._revoking.get((holder, agent_id), -math.inf) > now

    # -- allocation --------------------------------------------------------------------
    def allocate(self, now: float) -> Cycle:
        """One allocation cycle: each visited agent's free resources (those a framework's
        role may use) are filled progressively (`_fill`): the framework with the lowest
        weighted dominant share that is active, not suppressed and not filtered there takes
        one task of its declared demand, or all it may take if its demand is unknown; it
        is then re-sorted. Visited: dirty agents (with every framework), and idle ones if a
        framework is fresh (with the fresh ones), in the order agents were added — what a
        full scan would offer, since every other agent would be refused by every framework.
        Then frameworks below their share that got nothing reclaim (reclaim.py)."""
        for flt in self.filters.expire(now):
            self._dirty.add(flt.agent_id)
            self._touched.add(flt.framework_id)
        self.cycle += 1
        if not self.incremental:
            self._dirty.update(self.agents)
            self._touched.update(self.frameworks)
        self._demanding = demanding_roles(self) if self.quotas.guaranteed else None
        was_guarded = self._guarded
        self._guarded = self._demanding is not None and guarded(self, self._demanding)
        if was_guarded and self._guard_refused and (not self._guarded or rooms_grew(
                guard_rooms(self, self._demanding or set()), self._end_rooms)):
            self._dirty |= self._idle  # offers refused for a guarantee may be due now
            self._guard_refused = False  # this cycle's visits say it again if still so
        fws = self.frameworks
        fresh = {f for f in self._fresh if fws[f].active and not fws[f].suppressed}
        notes: dict[str, Notes] = {}
        allocations: list[Allocation] = []
        visited = 0
        if self._dirty or (fresh and self._idle):
            visited = visit(self, fresh, notes, allocations, now)
        self._dirty, self._fresh = set(), set()
        self._end_rooms = guard_rooms(self, self._demanding or set()) if self._guarded else {}
        touched, self._touched = self._touched.union(notes), set()
        plan = self._plan_reclaims(fresh, touched, allocations, bool(visited), now)
        remade = []
        for fid in sorted(touched):
            d = decide(self, fws[fid], notes.get(fid), bool(allocations), now)
            self.decisions[fid] = d
            remade.append(d)
        return Cycle(self.cycle, tuple(allocations), tuple(self.decisions.values()),
                     tuple(remade), visited, tuple(plan.reclaims), tuple(plan.revocations))

    def _wants(self, fid: str) -> bool:
        """Below its declared demand, with no offer outstanding: it reclaims if it can."""
        fw = self.frameworks[fid]
        if not (fw.active and not fw.suppressed and fw.demands and not fw.offered):
            return False
        unit = next_unit(fw.demands, self.sorter.allocation(fid))
        return unit is not None and (not self.quotas.roles or apply(
            self, fw, unit.resources, self._demanding)[0] is not None)

    def _plan_reclaims(self, fresh: set[str], touched: set[str],
                       allocations: list[Allocation], visited: bool, now: float) -> Plan:
        """Keep the wanting set (declared demand unmet, offered nothing) for the frameworks
        this cycle concerns, and plan reclaims for them and for fresh frameworks of
        unknown demand offered nothing; `touched` gains those whose decision changes."""
        fws = self.frameworks
        got = {a.framework_id for a in allocations}
        for fid in got:
            self._forget_wants(fid)
        if self.quotas.roles:  # under quotas, wanting depends on other roles' demand too
            touched.update(f for f, fw in fws.items() if fw.demands and f not in touched
                           and (f in self._wanting) is not self._wants(f))
        for fid in touched - got:
            if self._wants(fid):
                self._wanting.add(fid)
            else:
                self._forget_wants(fid)
        expired = [f for f, t in self._reclaiming.items() if t <= now]
        for fid in expired:
            del self._reclaiming[fid]
            self.said.pop(fid, None)
            touched.add(fid)
        if self._revoking:
            left = {k: t for k, t in self._revoking.items() if t > now}
            expired += [k[0] for k in self._revoking.keys() - left.keys()]
            self._revoking = left
        newcomers = [f for f in fresh if not fws[f].demands and f not in got
                     and not self.fanout.at_bound(f)]
        wanting = [f for f in self._wanting if f not in self._reclaiming]
        if not (wanting or newcomers) or not (visited or touched or expired):
            return Plan()
        out = plan_reclaims(self, wanting, newcomers, now)
        self.said.update(out.said)
        touched.update(out.said)
        return out

    def demand_held(self, fid: str, agent: Agent) -> dict[str, int]:
        """What counts against a framework's declared demand when filling `agent`: what
        its tasks use, and what it is offered on this agent (not elsewhere: a framework
        sees every agent it may use, up to its demand on each, and places its tasks)."""
        held = dict(self.sorter.allocation(fid))
        for n, v in self.frameworks[fid].offered.items():
            held[n] -= v
        offered = agent.offered.get(fid)
        if offered is not None:
            add_into(held, offered)
        return held

    def allocatable(self, r: Resources) -> bool:
        """Worth offering: at least MIN_CPUS or MIN_MEM."""
        return self._allocatable(r)

    def _allocatable(self, r: Resources) -> bool:
        cpus = mem = 0
        for (name, _), v in r.scalars.items():
            if name == "cpus":
                cpus += v
            elif name == "mem":
                mem += v
        return cpus >= self.min_cpus or mem >= self.min_mem

    # -- helpers -----------------------------------------------------------------------
    def _give_back(self, agent: Agent, fw: Framework, held: dict[str, Resources],
                   resources: Resources) -> None:
        fid = fw.framework_id
        set_held(held, fid, held[fid] - resources)
        if held is agent.offered and fw.demands:
            add_into(fw.offered, resources, -1)
        agent.free = agent.free + resources if agent.free else resources
        if fid not in agent.offered and fid not in agent.used:
            fw.agents.discard(agent.agent_id)
        self.sorter.unallocated(fid, resources)
        self._dirty.add(agent.agent_id)
        self._touched.add(fid)
        if (held is agent.offered and self.fanout.note(fid, agent)) or fw.demands:
            self._fresh.add(fid)  # it holds less: an idle agent may now fit its next task
        if self.quotas.limited:
            self._room_grew(fw.role)

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
        """Invariants, checked after every step in tests (invariants.py)."""
        check(self)
