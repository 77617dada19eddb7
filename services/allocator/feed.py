"""Turns the master's state stream (agents, frameworks, tasks, roles) into AllocatorCore
events, by diffing what the stream says against what the core was told. No sockets.

A delta and a snapshot reset are handled alike: the feed keeps the stream's desired view and
what it applied to the core, and reconciles the keys that changed. So a reset (new master,
resync) never rebuilds the core: offers outstanding at the broker stay counted; and an entry
the same as the one last taken in for its key (all it says applied) is not even decoded.

- agents: REGISTERED ones are in the core; UNREACHABLE, GONE, DRAINING and deleted ones are
  removed (their offers and tasks' usage vanish; tasks are replayed if the agent returns).
  A RECOVERING one (a new master waits for it to re-register) stays, away: nothing is
  offered on it and its tasks' usage stays counted, so a master failover neither drops
  nor replays 100,000 tasks.
  A changed total (reconfigured, or a reservation made or undone inside an ACCEPT: another
  reserved/unreserved split) is applied with `agent_total_changed`, which moves the labels
  of the offers the reservation came from (services/allocator/reserved.py).
- frameworks: present ones are in the core, active while `connected`; `suppressed_roles`
  follows the record (a revive seen here does not clear filters: the broker's relayed
  ReviveOffers does that, once).
- tasks: a task in a non-terminal state holds its resources on its agent; a task whose
  agent or framework the core does not know (yet), or that does not fit (e.g. found after
  a failover while its resources were re-offered), waits and is retried on every change.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from schemas import bus_pb2, common_pb2, state_pb2
from services import tasks as task_states
from services.allocator.core import AllocatorCore, AllocatorError, Attributes
from services.allocator.fill import Shape
from services.notice import Notice
from services.resources import UNRESERVED, Resources

REGISTERED = state_pb2.AgentRecord.Status.AGENT_STATUS_REGISTERED
RECOVERING = state_pb2.AgentRecord.Status.AGENT_STATUS_RECOVERING


NORM_MEMO = 4096  # distinct encodings whose Resources are remembered (then all forgotten)
_normed: dict[tuple[bytes, ...], Resources] = {}


def norm(resources: Iterable[common_pb2.Resource]) -> Resources:
    """Resources from protos, without the zero scalars `from_proto` keeps. Remembered by
    encoding: a task's record comes on the stream at each change of its state (and most
    tasks have one of a few shapes), and parsing was most of the allocator's time per task."""
    items = list(resources)
    key = tuple(r.SerializeToString(deterministic=True) for r in items)
    got = _normed.get(key)
    if got is None:
        got = Resources.from_proto(items) - Resources()  # ValueError: not remembered
        if len(_normed) >= NORM_MEMO:
            _normed.clear()
        _normed[key] = got
    return got


def attributes(attrs: Iterable[common_pb2.Attribute]) -> dict[str, str | float]:
    out: dict[str, str | float] = {}
    for a in attrs:
        out[a.name] = a.scalar if a.WhichOneof("value") == "scalar" else a.text
    return out


@dataclass(frozen=True)
class AgentView:
    hostname: str
    total: Resources
    attributes: Attributes
    away: bool = False  # RECOVERING: kept, not offered (core.agent_away)


@dataclass(frozen=True)
class FrameworkView:
    role: str
    connected: bool
    suppressed_roles: frozenset[str]
    demands: tuple[Shape, ...] = ()


@dataclass(frozen=True)
class TaskUse:
    framework_id: str
    agent_id: str
    resources: Resources


Amounts = tuple[tuple[str, float], ...]  # a quota's (name, amount), zeros kept


@dataclass(frozen=True)
class RoleView:
    weight: float = 1.0
    guarantee: Amounts = ()
    limit: Amounts = ()


def _amounts(items: Iterable[common_pb2.Resource]) -> Amounts:
    return tuple(sorted((r.name, r.scalar) for r in items))


NO_ROLE = RoleView()
KINDS = frozenset({"agents", "frameworks", "tasks", "roles"})  # what the feed reads


class StreamFeed:
    def __init__(self, core: AllocatorCore) -> None:
        self.core = core
        self.agents: dict[str, AgentView] = {}  # offerable agents, as the stream says
        self.frameworks: dict[str, FrameworkView] = {}
        self.roles: dict[str, RoleView] = {}  # roles with a weight or quota, as the stream says
        self.tasks: dict[str, TaskUse] = {}  # key -> usage of non-terminal tasks
        self.applied: dict[str, TaskUse] = {}  # what the core holds as used
        # The applied keys by agent and by framework: an agent or framework removed (a
        # master's snapshot taken before its agents re-registered removes thousands) finds
        # its tasks without scanning every applied one.
        self._on_agent: dict[str, set[str]] = {}
        self._of_framework: dict[str, set[str]] = {}
        self.waiting: set[str] = set()  # task keys not (yet) applied
        # Why each waits: for its agent or framework to appear on the stream (indexed by
        # "agents/<id>" / "frameworks/<id>", retried when that entry comes), or for room on
        # its agent (`_short`, retried on every change). After a master failover 100,000
        # tasks can wait for their agents: re-checking all of them on every delta was
        # quadratic.
        self._waiting_on: dict[str, set[str]] = {}
        self._waits_for: dict[str, str] = {}  # task key -> its key in _waiting_on
        self._short: set[str] = set()
        self._reported: set[str] = set()  # waiting keys whose failure was reported
        self.notices: list[Notice] = []  # for the shell to log and count; it drains them
        # The entry last taken in per key, while what it says is all applied (a task
        # counted, or ended; an agent, framework or role as it says): the same entry again
        # -- a new master re-announces 100,000 tasks it already had -- is not decoded nor
        # diffed. A key leaves when its entry is refused or waits (it is tried again), and
        # when it leaves the stream. The entries are the subscriber's store's own.
        self._seen: dict[str, bus_pb2.StateEntry] = {}
        self._refused: set[str] = set()  # keys refused in this apply (not settled)

    # -- input -----------------------------------------------------------------------------
    def reset(self, store: Mapping[str, bus_pb2.StateEntry]) -> None:
        """A whole new copy of the stream: everything we know and it lacks is deleted."""
        known = {*(f"agents/{a}" for a in self.agents),
                 *(f"frameworks/{f}" for f in self.frameworks),
                 *(f"roles/{r}" for r in self.roles), *self.tasks}
        for k in self._seen.keys() - store.keys():
            del self._seen[k]
        # Deleted by key (a new master leads before its agents re-register: 110,000 keys
        # at 10,000 agents, no message made for each).
        self.apply(store.values(), deleted=known - store.keys())

    def apply(self, entries: Iterable[bus_pb2.StateEntry], deleted: Iterable[str] = ()) -> bool:
        """A delta (`deleted`: more keys deleted, as entries marked deleted would say; none
        of them among `entries`). Returns whether the allocator's inputs changed (worth an
        allocation)."""
        agents: dict[str, AgentView | None] = {}
        frameworks: dict[str, FrameworkView | None] = {}
        touched_tasks: set[str] = set()
        changed = False
        seen = self._seen
        taken: dict[str, bus_pb2.StateEntry | None] = {}  # key -> its last entry decoded
        self._refused = set()
        for e in entries:
            key = e.key
            prev = seen.get(key)
            if prev is not None and key not in taken and (prev is e or prev == e):
                seen[key] = e  # the same record, newer message (the old one can go)
                continue
            kind, _, name = key.partition("/")
            if kind not in KINDS:
                continue
            value = None if e.deleted else e.value
            taken[key] = None if value is None else e
            if kind == "agents":
                agents[name] = _agent(value)
            elif kind == "frameworks":
                frameworks[name] = _framework(value)
            elif kind == "tasks":
                use = _task(value)
                if use is None:
                    self.tasks.pop(e.key, None)
                else:
                    self.tasks[e.key] = use
                touched_tasks.add(e.key)
            elif kind == "roles":
                changed |= self._role(name, value)
        for key in deleted:
            kind, _, name = key.partition("/")
            if kind not in KINDS:
                continue
            taken[key] = None
            if kind == "agents":
                agents[name] = None
            elif kind == "frameworks":
                frameworks[name] = None
            elif kind == "tasks":
                self.tasks.pop(key, None)
                touched_tasks.add(key)
            elif kind == "roles":
                changed |= self._role(name, None)
        # Removals first (they free resources), then additions, then tasks: releases
        # before uses, so a task ending and one starting on a full agent both fit.
        for agent_id, view in agents.items():
            if view is None and agent_id in self.agents:
                changed = True
                del self.agents[agent_id]
                self._forget_tasks(agent_id=agent_id)
                self.core.agent_removed(agent_id)
        for fid, fview in frameworks.items():
            if fview is None and fid in self.frameworks:
                changed = True
                del self.frameworks[fid]
                self._forget_tasks(framework_id=fid)
                self.core.framework_removed(fid)
        for agent_id, view in agents.items():
            if view is not None:
                changed |= self._agent_changed(agent_id, view)
        for fid, fview in frameworks.items():
            if fview is not None:
                changed |= self._framework_changed(fid, fview)
        due = touched_tasks | self._short
        for agent_id, view in agents.items():
            if view is not None:
                due |= self._waiting_on.pop(f"agents/{agent_id}", set())
        for fid, fview in frameworks.items():
            if fview is not None:
                due |= self._waiting_on.pop(f"frameworks/{fid}", set())
        changed |= self._reconcile_tasks(due)
        refused, waiting = self._refused, self.waiting
        for key, entry in taken.items():
            if entry is None or key in refused or key in waiting:
                seen.pop(key, None)
            else:
                seen[key] = entry
        return changed

    def retry(self) -> bool:
        """Retry the tasks waiting for room (after resources came back)."""
        return self._reconcile_tasks(set(self._short)) if self._short else False

    def _wait(self, key: str, want: TaskUse) -> None:
        """`key` waits for its agent or framework to appear (one of them is absent)."""
        self._unwait(key)
        self._seen.pop(key, None)
        on = (f"agents/{want.agent_id}" if want.agent_id not in self.agents
              else f"frameworks/{want.framework_id}")
        self.waiting.add(key)
        self._waiting_on.setdefault(on, set()).add(key)
        self._waits_for[key] = on

    def _unwait(self, key: str) -> None:
        self.waiting.discard(key)
        self._short.discard(key)
        on = self._waits_for.pop(key, None)
        if on is not None:
            keys = self._waiting_on.get(on)
            if keys is not None:
                keys.discard(key)
                if not keys:
                    del self._waiting_on[on]

    # -- agents, frameworks, roles -------------------------------------------------------
    def _agent_changed(self, agent_id: str, view: AgentView) -> bool:
        old = self.agents.get(agent_id)
        if old == view:
            return False
        if old is None:
            if view.away:
                return False  # nothing of it here to keep: its tasks wait for it to be back
            self.core.agent_added(agent_id, view.hostname, view.total, view.attributes)
        elif old.total != view.total:
            try:
                self.core.agent_total_changed(agent_id, view.total)
            except AllocatorError as exc:  # it shrank under what is allocated: keep the old
                self.notices.append(Notice.of("agent_update_refused", f"{exc}", "warning"))
                self._refused.add(f"agents/{agent_id}")
                view = AgentView(view.hostname, old.total, view.attributes, view.away)
        if old is not None and view.away != old.away:
            (self.core.agent_away if view.away else self.core.agent_back)(agent_id)
        # (hostname and attributes are read by the broker, not the allocation policy)
        self.agents[agent_id] = view
        return True

    def _framework_changed(self, fid: str, view: FrameworkView) -> bool:
        old = self.frameworks.get(fid)
        if old == view:
            return False
        if old is not None and old.role != view.role:  # a new role: start it afresh
            self._forget_tasks(framework_id=fid)
            self.core.framework_removed(fid)
            old = None
        if old is None:
            if not view.role:
                self.notices.append(Notice.of("framework_ignored", f"{fid} has no role", "warning"))
                self._refused.add(f"frameworks/{fid}")
                return False
            self.core.framework_added(fid, view.role, view.connected, view.suppressed_roles)
        else:
            if view.connected != old.connected:
                (self.core.framework_activated if view.connected
                 else self.core.framework_deactivated)(fid)
            fw = self.core.frameworks[fid]
            if view.suppressed_roles - old.suppressed_roles:
                self.core.suppress(fid, view.suppressed_roles - old.suppressed_roles)
            fw.suppressed_roles -= old.suppressed_roles - view.suppressed_roles
        if view.demands != (old.demands if old is not None else ()):
            self.core.demand(fid, view.demands)
        self.frameworks[fid] = view
        return True

    def _role(self, role: str, value: state_pb2.StateValue | None) -> bool:
        """A role's weight and quota (guarantee, limit); absent = 1 and none."""
        view = NO_ROLE
        if value is not None and value.WhichOneof("kind") == "role":
            rec = value.role
            view = RoleView(rec.weight if rec.weight > 0 else 1.0,
                            _amounts(rec.quota_guarantee), _amounts(rec.quota_limit))
        old = self.roles.get(role, NO_ROLE)
        if view == old:
            return False
        try:
            if view.weight != old.weight:
                self.core.set_weight(role, view.weight)
            if (view.guarantee, view.limit) != (old.guarantee, old.limit):
                self.core.set_quota(role, dict(view.guarantee), dict(view.limit))
        except AllocatorError as exc:
            self.notices.append(Notice.of("role_refused", f"{role}: {exc}", "warning"))
            self._refused.add(f"roles/{role}")
            return False
        if view == NO_ROLE:
            self.roles.pop(role, None)
        else:
            self.roles[role] = view
        return True

    # -- tasks ---------------------------------------------------------------------------
    def _forget_tasks(self, agent_id: str = "", framework_id: str = "") -> None:
        """The core dropped these tasks' usage with their agent or framework."""
        keys = self._on_agent.get(agent_id, set()) | self._of_framework.get(framework_id, set())
        for key in keys:
            self._unapply(key)
            if key in self.tasks:
                self._wait(key, self.tasks[key])

    def _apply(self, key: str, use: TaskUse) -> None:
        self.applied[key] = use
        self._on_agent.setdefault(use.agent_id, set()).add(key)
        self._of_framework.setdefault(use.framework_id, set()).add(key)

    def _unapply(self, key: str) -> None:
        use = self.applied.pop(key)
        for index, by in ((self._on_agent, use.agent_id), (self._of_framework,
                                                           use.framework_id)):
            keys = index[by]
            keys.discard(key)
            if not keys:
                del index[by]

    def _reconcile_tasks(self, keys: set[str]) -> bool:
        changed = False
        for key in sorted(keys):  # releases first
            have, want = self.applied.get(key), self.tasks.get(key)
            if have is not None and have != want:
                changed = True
                self._unapply(key)
                try:
                    self.core.resources_released(have.agent_id, have.framework_id,
                                                 have.resources)
                except AllocatorError as exc:
                    self.notices.append(Notice.of("release_refused", f"{key}: {exc}", "warning"))
        # What to apply, by agent and framework: each group's sum is taken in one call (an
        # agent back after a failover brings its tasks at once); a group whose sum does not
        # fit is applied task by task, as it would be alone (some fit, the rest wait).
        groups: dict[tuple[str, str], list[tuple[str, TaskUse]]] = {}
        for key in sorted(keys):
            want = self.tasks.get(key)
            if want is None:
                self._unwait(key)
                self._reported.discard(key)
                continue
            if self.applied.get(key) == want:
                continue
            if want.agent_id not in self.agents or want.framework_id not in self.frameworks:
                self._wait(key, want)  # its agent is away, or not known yet
                continue
            groups.setdefault((want.agent_id, want.framework_id), []).append((key, want))
        for (agent_id, fid), group in groups.items():
            if len(group) > 1:
                try:
                    self.core.resources_used(agent_id, fid,
                                             Resources.total(w.resources for _, w in group))
                except AllocatorError:
                    pass  # task by task, below
                else:
                    changed = True
                    for key, want in group:
                        self._apply(key, want)
                        self._unwait(key)
                        self._reported.discard(key)
                    continue
            changed |= self._use_each(group)
        return changed

    def _use_each(self, group: list[tuple[str, TaskUse]]) -> bool:
        """Apply each task's use on its own; those that do not fit wait for room."""
        changed = False
        for key, want in group:
            try:
                self.core.resources_used(want.agent_id, want.framework_id, want.resources)
            except AllocatorError as exc:
                self._unwait(key)
                self._seen.pop(key, None)
                self.waiting.add(key)
                self._short.add(key)
                if key not in self._reported:
                    self._reported.add(key)
                    self.notices.append(Notice.of("usage_waiting", f"{key}: {exc}", "warning"))
                continue
            changed = True
            self._apply(key, want)
            self._unwait(key)
            self._reported.discard(key)
        return changed


def _agent(value: state_pb2.StateValue | None) -> AgentView | None:
    if value is None or value.WhichOneof("kind") != "agent":
        return None
    rec = value.agent
    if rec.status != REGISTERED and rec.status != RECOVERING:
        return None
    try:
        total = norm(rec.agent_info.resources)
    except ValueError:
        return None
    return AgentView(rec.agent_info.hostname, total, attributes(rec.agent_info.attributes),
                     rec.status == RECOVERING)


def _framework(value: state_pb2.StateValue | None) -> FrameworkView | None:
    if value is None or value.WhichOneof("kind") != "framework":
        return None
    rec = value.framework
    return FrameworkView(rec.framework_info.role, rec.connected,
                         frozenset(rec.suppressed_roles), _demands(rec.demands))


def _demands(demands: Iterable[common_pb2.Demand]) -> tuple[Shape, ...]:
    """The declared demand (the master validated it; a shape that is still unusable makes
    the whole demand unknown rather than half-read)."""
    try:
        return tuple(Shape.of(norm(d.resources).with_role(UNRESERVED), d.count, d.ports)
                     for d in demands)
    except ValueError:
        return ()


def _task(value: state_pb2.StateValue | None) -> TaskUse | None:
    if value is None or value.WhichOneof("kind") != "task":
        return None
    rec = value.task
    if rec.status.state not in task_states.ACTIVE or not rec.agent_id:
        return None
    items = rec.task_info.resources
    last = _last_shape
    # Tasks come in runs of one shape (an agent's, a launch's). The very same container
    # again may have been changed in place since: decoded again.
    if last and items is not last[0] and items == last[0]:
        res = last[1]
    else:
        try:
            res = norm(items)
        except ValueError:
            return None
        _last_shape[:] = (items, res)
    return TaskUse(rec.framework_id, rec.agent_id, res) if res else None


# The last task's resources as the stream had them, and normalised: the next task's, when
# equal (one comparison), are not encoded again for norm's memo.
_last_shape: list[Any] = []
