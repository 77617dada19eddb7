"""The master's tables (agents, frameworks, task records, roles, peers; the records themselves
are in records.py) and the helpers every handler shares: task state changes, batched
Updates, the state stream's Publish, the registry.

Handlers (agents.py, frameworks.py, core.py) only mutate through these helpers, so one call in
gives few commands out: one Update per framework, one Publish, at most one PersistRegistry."""

from __future__ import annotations

import math
from collections import OrderedDict
from collections.abc import Container, Iterable

from schemas import (
    agent_pb2,
    bus_pb2,
    common_pb2,
    internal_pb2,
    operator_pb2,
    scheduler_pb2,
    state_pb2,
)
from services import report_digest, tasks
from services.master.commands import (
    Command,
    PersistRegistry,
    Publish,
    ToAgent,
    ToBroker,
    ToFramework,
    ToOperator,
)
from services.master.followed import record_item
from services.master.records import (
    GONE,
    REGISTERED,
    STATUS_NAMES,
    Agent,
    Framework,
    LogRequest,
    Reason,
    ReasonT,
    Task,
    TaskKey,
    registry_job,
    registry_role,
    us,
)
from services.notice import Notice
from services.resources import Resources

# Dirty-set keys: ("agent", id), ("framework", id), ("task", fid, tid), ("role", role),
# ("decision", fid), ("job", name). Resolved against the tables when a call ends: present -> value,
# absent -> deleted.
Dirty = tuple[str, ...]


_PREFIX = {"agent": "agents", "framework": "frameworks", "task": "tasks", "role": "roles",
           "decision": "decisions", "job": "jobs"}  # a Dirty key's kind -> its stream prefix


class MasterState:
    """The tables, and the helpers that keep them, the stream and the registry in step."""

    def __init__(self, master_id: str, epoch: int, *, agent_reregister_window_s: float,
                 heartbeat_interval_ms: int, max_completed_tasks: int, max_relay_bytes: int,
                 cluster_id: str = "", id_prefix: str = "") -> None:
        self.master_id = master_id
        self.epoch = epoch
        # The cluster's id: the registry's, else `cluster_id` (a fresh one the shell made),
        # which the next registry write then keeps for good (see MasterCore._recover).
        self.cluster_id = cluster_id
        # Agent and framework ids are "<id_prefix>-S<n>" / "-F<n>": the shell gives a prefix
        # unique to this leadership, so ids never repeat across clusters or registry resets.
        self.id_prefix = id_prefix or master_id
        self.agent_reregister_window_s = agent_reregister_window_s
        self.heartbeat_interval_ms = heartbeat_interval_ms
        self.max_completed_tasks = max_completed_tasks
        self.max_relay_bytes = max_relay_bytes
        self.agents: dict[str, Agent] = {}
        self.frameworks: dict[str, Framework] = {}
        self.tasks: dict[TaskKey, Task] = {}
        self.roles: dict[str, state_pb2.RoleRecord] = {}
        self.decisions: dict[str, internal_pb2.AllocatorDecision] = {}
        self.jobs: dict[str, state_pb2.JobRecord] = {}  # jobs.py
        # After a master failover: registry agents not re-registered yet (id -> entry).
        self.recovering: dict[str, dict[str, object]] = {}
        # After a master failover: the previous leader's task records of recovering agents,
        # as this master followed its stream while a standby (agent id -> task key ->
        # record; `held_keys`: task key -> agent id). They stay on this leader's stream as
        # they were (its snapshot has them: subscribers keep what they had, unchanged). An
        # agent re-registering with a task in the same state and run gets the record back
        # whole, published no more (the stream has it); what the agent reports differently
        # or not at all is its word, published (agents.py `_plan`). An agent's held records
        # go when it re-registers or its window ends. `held_digests`: agent id -> the report
        # digest of its held records (an agent reporting the same digest gets them all back
        # without its report read task by task).
        self.held: dict[str, dict[TaskKey, bus_pb2.StateEntry]] = {}
        self.held_keys: dict[TaskKey, str] = {}
        self.held_digests: dict[str, int] = {}
        self.held_made: dict[TaskKey, Task] = {}  # their records, made as they were followed
        # Their agents' entries as the previous leader published them, now RECOVERING (not
        # offered; the allocator keeps their tasks counted) until re-registered here.
        self.held_agents: dict[str, bus_pb2.StateEntry] = {}
        self.tasks_held_back = 0  # re-registered tasks whose held record was taken back
        self.reports_taken_whole = 0  # re-registrations whose report's digest matched
        self.removed_frameworks: OrderedDict[str, None] = OrderedDict()
        self.agent_peers: dict[bytes, str] = {}
        self.framework_peers: dict[bytes, str] = {}
        self.broker: bytes = b""
        self.log_requests: dict[str, LogRequest] = {}
        self.started_at: float | None = None
        self._notices: list[Notice] = []  # input ignored or corrected, this call
        self._task_ids: dict[str, set[str]] = {}  # task_id -> framework ids having it
        self._seq = {"agent": 0, "framework": 0, "logs": 0}
        # Per call:
        self._now = 0.0
        self._dirty: dict[Dirty, None] = {}
        self._registry_agents: set[str] = set()  # agents whose registry entry changed
        self._registry_sections = False  # the cluster id, frameworks or roles changed
        self._updates: dict[str, list[common_pb2.TaskStatus]] = {}

    # -- per-call bookkeeping ----------------------------------------------------------
    def _begin(self, now: float) -> None:
        self._now = now
        if self.started_at is None:
            self.started_at = now
            for fw in self.frameworks.values():
                if not fw.connected and not fw.disconnected_at:
                    fw.disconnected_at = now  # recovered: its failover clock starts now

    def _end(self, out: list[Command]) -> list[Command]:
        head: list[Command] = []
        if self._registry_agents or self._registry_sections:
            head.append(PersistRegistry(self._registry_change()))
        for fid, statuses in self._updates.items():
            fw = self.frameworks.get(fid)
            if fw is not None and fw.peer is not None and statuses:
                event = scheduler_pb2.SchedulerEvent()  # each status copied once, into it
                event.update.statuses.extend(statuses)
                out.append(ToFramework(fw.peer, fid, event))
        entries = [self._entry(k) for k in self._dirty]
        if entries:
            out.append(Publish(entries))
        self._dirty = {}
        self._updates = {}
        notices, self._notices = self._notices, []
        return head + out + notices

    def _notice(self, kind: str, message: str, **facts: str | int | float | bool) -> None:
        """Input ignored or corrected: a Notice (logged, counted) at the end of this call."""
        self._notices.append(Notice.of(kind, message, "warning", **facts))

    def failover_deadline(self, fw: Framework) -> float:
        """When a disconnected framework is removed: its failover timeout after it went
        silent; but a master failure never removes a framework, so one recovered from the
        registry has at least the re-register window from this leader's start."""
        deadline = fw.disconnected_at + fw.info.failover_timeout_s
        if fw.recovered and self.started_at is not None:
            deadline = max(deadline, self.started_at + self.agent_reregister_window_s)
        return deadline

    def _touch(self, *key: str) -> None:
        self._dirty[key] = None

    def _entry(self, key: Dirty) -> bus_pb2.StateEntry:
        """The stream entry of `key` now, each record copied once, into the entry."""
        kind = key[0]
        if kind == "agent" and key[1] not in self.agents and key[1] in self.held_agents:
            return self.held_agents[key[1]]
        if kind == "task" and (key[1], key[2]) not in self.tasks:
            aid = self.held_keys.get((key[1], key[2]))
            if aid is not None:  # as the previous leader published it (never changed)
                return self.held[aid][(key[1], key[2])]
        entry = bus_pb2.StateEntry(key=self._key(key))
        value = entry.value
        if kind == "task" and (key[1], key[2]) in self.tasks:
            self.tasks[(key[1], key[2])].record_into(value.task)
        elif kind == "agent" and key[1] in self.agents:
            value.agent.CopyFrom(self.agents[key[1]].record())
        elif kind == "framework" and key[1] in self.frameworks:
            value.framework.CopyFrom(self.frameworks[key[1]].record())
        elif kind == "role" and key[1] in self.roles:
            value.role.CopyFrom(self.roles[key[1]])
        elif kind == "decision" and key[1] in self.decisions:
            value.decision.CopyFrom(self.decisions[key[1]])
        elif kind == "job" and key[1] in self.jobs:
            value.job.CopyFrom(self.jobs[key[1]])
        else:
            entry.deleted = True
        return entry

    @staticmethod
    def _key(key: Dirty) -> str:
        return "/".join((_PREFIX[key[0]], *key[1:]))

    def snapshot_entries(self) -> list[bus_pb2.StateEntry]:
        """The whole state, for a fresh publisher (after a failover, or a restart)."""
        keys: list[Dirty] = [("agent", a) for a in sorted(self.agents.keys()
                                                           | self.held_agents.keys())]
        keys += [("framework", f) for f in sorted(self.frameworks)]
        keys += [("task", f, t) for f, t in sorted(self.tasks)]
        entries = [self._entry(k) for k in keys]
        # The held records of tasks not known otherwise, as followed (not looked up one by
        # one, not sorted: 100,000 at 10k agents x 10).
        tasks = self.tasks
        entries += [e for recs in self.held.values() for k, e in recs.items() if k not in tasks]
        keys = [("role", r) for r in sorted(self.roles)]
        keys += [("decision", f) for f in sorted(self.decisions)]
        keys += [("job", j) for j in sorted(self.jobs)]
        return entries + [self._entry(k) for k in keys]

    # -- registry --------------------------------------------------------------------------
    def registry_document(self) -> dict[str, object]:
        """The small persisted registry, whole: agents (registered/unreachable/gone),
        frameworks, role weights. Recovering agents keep the entry they had. (What is
        written is built from changes: `_registry_change`; this is the same document.)"""
        agents = {aid: self._registry_entry(aid) for aid in [*self.recovering, *self.agents]}
        return {"cluster_id": self.cluster_id, "agents": dict(sorted(agents.items())),
                **self._registry_sections_doc()}

    def _registry_entry(self, agent_id: str) -> dict[str, object] | None:
        a = self.agents.get(agent_id)
        if a is not None:
            entry: dict[str, object] = {"status": STATUS_NAMES.get(a.status, "registered"),
                                        "hostname": a.info.hostname,
                                        "since_us": us(a.status_since)}
            if a.principal:  # the agent id's owner (CURVE): kept across failovers
                entry["principal"] = a.principal
            return entry
        kept = self.recovering.get(agent_id)
        return dict(kept) if kept is not None else None

    def _registry_sections_doc(self) -> dict[str, object]:
        frameworks: dict[str, object] = {
            f.framework_id: {"name": f.info.name, "role": f.info.role,
                             "principal": f.info.principal,
                             "failover_timeout_s": f.info.failover_timeout_s,
                             "registered_at_us": us(f.registered_at)}
            for f in self.frameworks.values()}
        roles: dict[str, object] = {r: registry_role(rec) for r, rec in self.roles.items()}
        return {"frameworks": dict(sorted(frameworks.items())),
                "roles": dict(sorted(roles.items())),
                "jobs": {j: registry_job(rec) for j, rec in sorted(self.jobs.items())}}

    def _registry_change(self) -> dict[str, object]:
        change: dict[str, object] = {"agents": {
            aid: self._registry_entry(aid) for aid in sorted(self._registry_agents)}}
        if self._registry_sections:
            change.update(cluster_id=self.cluster_id, **self._registry_sections_doc())
        self._registry_agents, self._registry_sections = set(), False
        return change

    def set_role(self, role: str, weight: float | None = None,
                 quota: tuple[Iterable[common_pb2.Resource], Iterable[common_pb2.Resource]]
                 | None = None) -> state_pb2.RoleRecord:
        """An operator set the role's weight or its quota (guarantee, limit): kept in the
        registry's roles and published (roles/<role>)."""
        rec = self.roles.setdefault(role, state_pb2.RoleRecord(role=role, weight=1.0))
        if weight is not None:
            rec.weight = weight
        if quota is not None:
            for items, given in zip((rec.quota_guarantee, rec.quota_limit), quota, strict=True):
                del items[:]
                items.extend(given)
        self._touch("role", role)
        self._registry_changed()
        return rec

    def _release_held(self, agent_id: str) -> dict[TaskKey, bus_pb2.StateEntry]:
        """The agent's held records, held no more (the caller publishes each key again
        whose record it did not take back whole: as this core has it then, or deleted)."""
        self.held_agents.pop(agent_id, None)
        self.held_digests.pop(agent_id, None)
        held = self.held.pop(agent_id, {})
        for key in held:
            if self.held_keys.get(key) == agent_id:
                del self.held_keys[key]
                self.held_made.pop(key, None)
        return held

    def _registry_changed(self, *agent_ids: str) -> None:
        """The registry entries of `agent_ids` changed; with none, the cluster id, the
        frameworks or the roles did."""
        if agent_ids:
            self._registry_agents.update(agent_ids)
        else:
            self._registry_sections = True

    # -- ids and peers ---------------------------------------------------------------------
    def _new_id(self, kind: str, letter: str, *taken: Container[str]) -> str:
        """The next id of `kind` in none of `taken` (O(1): membership tests, no copies)."""
        while True:
            self._seq[kind] += 1
            candidate = f"{self.id_prefix}-{letter}{self._seq[kind]}"
            if not any(candidate in t for t in taken):
                return candidate

    def _bind_agent(self, agent: Agent, peer: bytes) -> None:
        if agent.peer is not None and agent.peer != peer:
            self.agent_peers.pop(agent.peer, None)
        agent.peer = peer
        self.agent_peers[peer] = agent.agent_id

    def _unbind_agent(self, agent: Agent) -> None:
        if agent.peer is not None:
            self.agent_peers.pop(agent.peer, None)
        agent.peer = None

    def _bind_framework(self, fw: Framework, peer: bytes) -> None:
        if fw.peer is not None and fw.peer != peer:
            self.framework_peers.pop(fw.peer, None)
        fw.peer = peer
        self.framework_peers[peer] = fw.framework_id

    def _unbind_framework(self, fw: Framework) -> None:
        if fw.peer is not None:
            self.framework_peers.pop(fw.peer, None)
        fw.peer = None

    # -- broker ----------------------------------------------------------------------------
    def _to_broker(self, msg: internal_pb2.InternalMessage, traceparent: str = "") -> ToBroker:
        return ToBroker(self.broker, msg, traceparent)

    def _offers_done(self, fw: Framework, offer_ids: Iterable[str]) -> None:
        """These offers are used, declined or rescinded: no longer outstanding."""
        popped = [fw.pop_offer(i) for i in offer_ids]
        if any(p is not None for p in popped):
            self._touch("framework", fw.framework_id)

    def _give_back_offers(self, fw: Framework) -> list[Command]:
        """The framework's connection ended (disconnect, failover, removal): decline every
        offer relayed to it with no filter, so the broker recovers them now, not at expiry."""
        if not fw.offers:
            return []
        ids = sorted(fw.offers)
        fw.clear_offers()
        self._touch("framework", fw.framework_id)
        return [self._decline(fw.framework_id, ids, "the framework's scheduler disconnected")]

    def _decline(self, framework_id: str, offer_ids: list[str], why: str) -> ToBroker:
        call = scheduler_pb2.SchedulerCall(
            framework_id=framework_id, decline=scheduler_pb2.SchedulerCall.Decline(
                offer_ids=offer_ids, filters=common_pb2.Filters(refuse_seconds=0.0),
                reason=why))
        return self._to_broker(internal_pb2.InternalMessage(
            framework_call=internal_pb2.InternalMessage.FrameworkCall(
                framework_id=framework_id, call=call)))

    # -- tasks -----------------------------------------------------------------------------
    def _status(self, task_id: str, state: tasks.State, reason: ReasonT, message: str,
                agent_id: str = "", source: int = common_pb2.TaskStatus.SOURCE_MASTER,
                ) -> common_pb2.TaskStatus:
        return common_pb2.TaskStatus(
            task_id=task_id, state=state, reason=reason, message=message, agent_id=agent_id,
            source=source,  # type: ignore[arg-type]
            timestamp_us=us(self._now))

    def _end_unlaunched(self, framework_id: str, task_ids: Iterable[str], state: tasks.State,
                        reason: ReasonT, message: str, agent_id: str = "") -> None:
        """Tell the framework these tasks of a refused ACCEPT ended (they never ran), as
        Mesos does; a live task of the same id is not told it ended."""
        for tid in task_ids:
            known = self.tasks.get((framework_id, tid))
            if known is not None and not tasks.is_terminal(known.state):
                continue
            self._notify(framework_id, self._status(tid, state, reason, message, agent_id))

    def _notify(self, framework_id: str, status: common_pb2.TaskStatus) -> bool:
        """Queue `status` (as the framework may see it) for the call's batched Update.
        Returns False when the framework is not connected: nothing is sent."""
        fw = self.frameworks.get(framework_id)
        if fw is None or not fw.connected:
            return False
        seen = tasks.as_seen_by(status.state, fw.partition_aware)
        if seen != status.state:
            status = _copy(status)
            status.state = seen
        self._updates.setdefault(framework_id, []).append(status)
        return True

    def _add_task(self, task: Task, *, account: bool = True, publish: bool = True) -> None:
        """A new record (launch, or an agent's report). Non-terminal ones hold resources
        (`account` False: the caller adds them to the agent's and framework's `used`).
        `publish` False: the stream has the record already (a held one taken back)."""
        state = task.status.state
        tasks.check_storable(state)
        fid, tid = key = (task.framework_id, task.info.task_id)  # read once (a failover adds 100k)
        old = self.tasks.get(key)
        if old is not None:  # a reused id of a completed task (Mesos allows it)
            assert tasks.is_terminal(old.state), f"task {key} recorded twice"
            self._forget_task(old)
        self.tasks[key] = task
        owners = self._task_ids.get(tid)
        if owners is None:
            self._task_ids[tid] = {fid}
        else:
            owners.add(fid)
        fw = self.frameworks[fid]
        dirty = self._dirty
        if state in tasks.TERMINAL:
            self._complete(fw, task)
        else:
            fw.tasks.add(tid)
            agent = self.agents[task.agent_id]
            agent.tasks.add(key)
            if account:
                fw.used += task.resources.quantities()
                agent.used += task.resources
            dirty["agent", task.agent_id] = None
        dirty["framework", fid] = None
        if publish:
            dirty["task", fid, tid] = None

    def _set_status(self, task: Task, status: common_pb2.TaskStatus, *,
                    checked: bool = True) -> None:
        """Make `status` the task's latest. `checked`: through the state machine (raises
        IllegalTransition); else any storable state (an agent's report). Ending releases."""
        if checked:
            tasks.transition(task.state, status.state)
        else:
            tasks.check_storable(status.state)
        ended = not tasks.is_terminal(task.state) and tasks.is_terminal(status.state)
        assert not (tasks.is_terminal(task.state) and not tasks.is_terminal(status.state)), \
            f"task {task.key} would leave a terminal state"
        if not status.agent_id:
            status = _copy(status)
            status.agent_id = task.agent_id
        task.status = status
        self._touch("task", *task.key)
        if ended:
            self._release(task)

    def _end_task(self, task: Task, state: tasks.State, reason: ReasonT, message: str,
                  notify: bool = True, unreachable_since: float = 0.0) -> None:
        """A master-generated state (LOST, DROPPED, GONE..., UNREACHABLE), told to the
        framework (translated for non-partition-aware ones)."""
        st = self._status(task.info.task_id, state, reason, message, task.agent_id)
        st.executor_id = task.status.executor_id
        st.container_id = task.status.container_id
        if unreachable_since:
            st.unreachable_since_us = us(unreachable_since)
        self._set_status(task, st)
        if notify:
            self._notify(task.framework_id, st)

    def _release(self, task: Task) -> None:
        fw = self.frameworks[task.framework_id]
        fw.tasks.discard(task.info.task_id)
        fw.used -= task.resources.quantities()
        agent = self.agents.get(task.agent_id)
        if agent is not None and task.key in agent.tasks:
            agent.tasks.discard(task.key)
            agent.used -= task.resources
            self._touch("agent", agent.agent_id)
        self._touch("framework", task.framework_id)
        self._complete(fw, task)

    def _complete(self, fw: Framework, task: Task) -> None:
        fw.completed[task.info.task_id] = None
        fw.completed.move_to_end(task.info.task_id)
        while len(fw.completed) > self.max_completed_tasks:
            oldest, _ = fw.completed.popitem(last=False)
            self._forget_task(self.tasks[(fw.framework_id, oldest)])

    def _forget_task(self, task: Task) -> None:
        """Drop a terminal record (evicted, or its framework removed)."""
        assert tasks.is_terminal(task.state) or task.framework_id not in self.frameworks
        self.tasks.pop(task.key, None)
        fw = self.frameworks.get(task.framework_id)
        if fw is not None:
            fw.completed.pop(task.info.task_id, None)
        owners = self._task_ids.get(task.info.task_id)
        if owners is not None:
            owners.discard(task.framework_id)
            if not owners:
                del self._task_ids[task.info.task_id]
        self._touch("task", *task.key)

    def _owners(self, task_id: str) -> set[str]:
        return self._task_ids.get(task_id, set())

    def _kill(self, task: Task, grace: float | None,
              reason: ReasonT = Reason.REASON_UNSPECIFIED, message: str = "kill requested",
              ) -> list[Command]:
        """Ask the task's agent to kill it; the record goes TASK_KILLING (re-sent when an
        unreachable agent comes back). `reason` (REASON_TASK_REVOKED) goes to the agent,
        which puts it on the TASK_KILLED update."""
        if task.state != tasks.KILLING:
            st = _copy(task.status)
            st.state = tasks.KILLING
            st.source = common_pb2.TaskStatus.SOURCE_MASTER
            st.uuid = b""
            st.reason = reason
            st.message = message
            st.timestamp_us = us(self._now)
            self._set_status(task, st)
        agent = self.agents.get(task.agent_id)
        if agent is None or agent.peer is None or not agent.reachable:
            return []
        ev = agent_pb2.AgentEvent(kill_task=agent_pb2.AgentEvent.KillTask(
            framework_id=task.framework_id, task_id=task.info.task_id))
        if grace is not None:
            ev.kill_task.kill_grace_period_s = grace
        if reason:
            ev.kill_task.reason = reason
        return [ToAgent(agent.peer, agent.agent_id, ev)]

    def _shutdown_framework(self, agent: Agent, framework_id: str, why: str) -> ToAgent | None:
        if agent.peer is None:
            return None
        return ToAgent(agent.peer, agent.agent_id, agent_pb2.AgentEvent(
            shutdown_framework=agent_pb2.AgentEvent.ShutdownFramework(
                framework_id=framework_id, reason=why)))

    def _fail_log_requests(self, agent_id: str, why: str) -> list[Command]:
        out: list[Command] = []
        for rid, req in list(self.log_requests.items()):
            if agent_id in ("", req.agent_id):
                del self.log_requests[rid]
                out.append(logs_error(req.peer, req.task_id, req.stream, why, req.message_id))
        return out

    # -- invariants ------------------------------------------------------------------------
    def validate(self) -> None:
        """Invariants, checked after every step in tests."""
        for aid, agent in self.agents.items():
            assert agent.agent_id == aid
            live = [self.tasks[k] for k in agent.tasks]
            assert all(t.agent_id == aid and not tasks.is_terminal(t.state) for t in live)
            assert agent.used.same(Resources.total(t.resources for t in live)), (aid, agent.used)
            if agent.status == REGISTERED:
                assert agent.total.contains(agent.used), f"agent {aid} over-committed"
            if agent.status == GONE:
                assert not agent.tasks and agent.peer is None
            if agent.peer is not None:
                assert agent.status == REGISTERED and self.agent_peers.get(agent.peer) == aid
            assert aid not in self.recovering
        assert self.held.keys() <= self.recovering.keys()
        assert self.held_agents.keys() <= self.recovering.keys()
        assert self.held_keys == {k: aid for aid, recs in self.held.items() for k in recs}
        assert self.held_made.keys() <= self.held_keys.keys()
        assert self.held_digests == {aid: report_digest.combine(
            record_item(k, e) for k, e in recs.items()) for aid, recs in self.held.items()}
        assert all(self.agents[a].peer == p for p, a in self.agent_peers.items())
        for fid, fw in self.frameworks.items():
            assert fw.framework_id == fid
            live = [self.tasks[(fid, t)] for t in fw.tasks]
            assert all(not tasks.is_terminal(t.state) for t in live)
            assert fw.used.same(Resources.total(t.resources.quantities() for t in live)), fid
            assert fw.offered.same(Resources.total(r.quantities() for _, r in fw.offers.values()))
            assert all(tasks.is_terminal(self.tasks[(fid, t)].state) for t in fw.completed)
            assert len(fw.completed) <= self.max_completed_tasks
            assert not fw.tasks & set(fw.completed)
            if fw.peer is not None:
                assert self.framework_peers.get(fw.peer) == fid
        assert all(self.frameworks[f].peer == p for p, f in self.framework_peers.items())
        for key, task in self.tasks.items():
            assert task.key == key
            assert task.state in tasks.STORABLE, f"task {key}: {tasks.name(task.state)}"
            owner = self.frameworks.get(task.framework_id)
            assert owner is not None, f"task {key} of an unknown framework"
            if tasks.is_terminal(task.state):
                assert task.info.task_id in owner.completed, key
            else:
                assert task.info.task_id in owner.tasks, key
                assert key in self.agents[task.agent_id].tasks, key
            assert task.framework_id in self._owners(task.info.task_id)
        assert sum(len(v) for v in self._task_ids.values()) == len(self.tasks)


def _copy(status: common_pb2.TaskStatus) -> common_pb2.TaskStatus:
    out = common_pb2.TaskStatus()
    out.CopyFrom(status)
    return out


def copy_status(status: common_pb2.TaskStatus) -> common_pb2.TaskStatus:
    return _copy(status)


def logs_error(peer: bytes, task_id: str, stream: agent_pb2.LogStream.ValueType, error: str,
               in_reply_to: str = "") -> ToOperator:
    return ToOperator(peer, operator_pb2.OperatorEvent(logs=operator_pb2.OperatorEvent.Logs(
        task_id=task_id, stream=stream, error=error)), in_reply_to)


def finite_nonneg(x: float) -> bool:
    return not math.isnan(x) and not math.isinf(x) and x >= 0
