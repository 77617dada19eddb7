"""The master's side of the agent protocol: admission (Register, Reregister and the rebuild
of task records from an agent's report), status updates, log replies. Agents going silent,
unreachable and gone are liveness.py's."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from schemas import agent_pb2, bus_pb2, common_pb2, operator_pb2, scheduler_pb2
from services import tasks
from services.master.acl import Acl
from services.master.commands import Command, Reject, ToAgent, ToFramework, ToOperator
from services.master.followed import made_record
from services.master.liveness import AgentLiveness
from services.master.records import (
    GONE,
    REGISTERED,
    Agent,
    Framework,
    Reason,
    Task,
    TaskKey,
    parse_resources,
)
from services.master.state import copy_status, finite_nonneg
from services.notice import Notice
from services.resources import UNRESERVED, Resources

Reported = agent_pb2.AgentCall.Reregister.Task


@dataclass
class _Plan:
    """What a (re-)registration will do to the task records, decided before any change."""

    add: list[Task] = field(default_factory=list)  # records to create
    refresh: list[tuple[Task, common_pb2.TaskStatus]] = field(default_factory=list)
    kill: list[Task] = field(default_factory=list)  # live on the agent, but must not run
    kill_unrecorded: list[tuple[str, str]] = field(default_factory=list)  # (fid, tid)
    reconcile: list[Task] = field(default_factory=list)  # STAGING, maybe still in flight
    dropped: list[Task] = field(default_factory=list)  # the agent does not have them
    shutdown: set[str] = field(default_factory=set)  # removed frameworks it still runs
    adopt: dict[str, common_pb2.FrameworkInfo] = field(default_factory=dict)
    # Of `add`: the records as the previous leader had them, taken back whole (state.py
    # `held`): already on the stream.
    taken: set[TaskKey] = field(default_factory=set)
    whole: bool = False  # taken whole by the report's digest (`_plan_whole`)

    def added(self) -> dict[str, Resources]:
        """What the live records to create hold, by framework (each summed once: a failover
        re-registers every agent with all its tasks at once)."""
        by_fid: dict[str, list[Resources]] = {}
        for t in self.add:
            if t.status.state not in tasks.TERMINAL:
                by_fid.setdefault(t.framework_id, []).append(t.resources)
        return {fid: Resources.total(bags) for fid, bags in by_fid.items()}


class AgentHandlers(AgentLiveness):
    _principal: str | None = None  # the current call's CURVE principal, when known
    acl: Acl | None = None  # who may act as an agent (acl.py); None: no check

    def _agent_call(self, peer: bytes, call: agent_pb2.AgentCall, message_id: str,
                    ) -> list[Command]:
        kind = call.WhichOneof("call")
        refused = self._impostor(peer, call.register.agent_info.agent_id if kind == "register"
                                 else call.reregister.agent_info.agent_id
                                 if kind == "reregister" else call.agent_id, message_id)
        if refused:
            return refused
        if kind == "register":
            return self._admit(peer, call.register.agent_info, (), (), message_id, rereg=False)
        if kind == "reregister":
            r = call.reregister
            return self._admit(peer, r.agent_info, r.tasks, r.frameworks, message_id,
                               rereg=True, digest=r.tasks_digest
                               if r.HasField("tasks_digest") else None)
        if kind is None:
            return [Reject(peer, bus_pb2.UNKNOWN_PAYLOAD, "AgentCall carries no call",
                           message_id)]
        agent = self.agents.get(call.agent_id)
        if agent is None or agent.status == GONE:
            why = "is gone" if agent is not None else "is not known to this master"
            code = bus_pb2.NOT_FOUND if agent is not None else bus_pb2.NOT_REGISTERED
            return [Reject(peer, code,
                           f"agent {call.agent_id!r} {why}; register first", message_id)]
        if agent.peer != peer:
            return [Reject(peer, bus_pb2.NOT_REGISTERED,
                           f"agent {call.agent_id!r} is not registered on this connection; "
                           "re-register", message_id)]
        agent.last_seen = self._now
        if kind == "status_updates":
            return self._status_updates(agent, call.status_updates.updates)
        if kind == "executor_exited":
            e = call.executor_exited
            fw = self.frameworks.get(e.framework_id)
            if fw is None or fw.peer is None:
                return []
            ev = scheduler_pb2.SchedulerEvent(failure=scheduler_pb2.SchedulerEvent.Failure(
                agent_id=agent.agent_id, executor_id=e.executor_id))
            if e.HasField("exit_status"):
                ev.failure.exit_status = e.exit_status
            return [ToFramework(fw.peer, fw.framework_id, ev)]
        if kind == "unregister":
            return self._agent_gone(agent, tasks.GONE, Reason.REASON_AGENT_REMOVED,
                                    f"agent {agent.agent_id} unregistered: "
                                    f"{call.unregister.reason or 'no reason given'}")
        if kind == "logs_reply":
            return self._logs_reply(agent, call.logs_reply)
        return [Reject(peer, bus_pb2.UNEXPECTED, f"unexpected agent call {kind}", message_id)]

    def _impostor(self, peer: bytes, aid: str, message_id: str) -> list[Command]:
        """The refusal of a call for agent `aid` from a principal the ACL does not let act
        as an agent, or other than the one `aid` is bound to (the key that registered it;
        a gone agent's id binds no more); [] when neither (and always when no principal is
        known: CURVE off)."""
        who = self._principal
        if who is None:
            return []
        if self.acl is not None and not self.acl.may_act_as_agent(who):
            why = f"principal {who!r} may not act as an agent (the master's ACL: agents)"
            self._notice("acl_refused", why, principal=who, agent_id=aid)
            return [Reject(peer, bus_pb2.UNAUTHORIZED, why, message_id)]
        if not aid:
            return []
        agent = self.agents.get(aid)
        if agent is not None and agent.status == GONE:
            return []  # nothing of it to take: a registration gets a new id
        owner = agent.principal if agent is not None else \
            str((self.recovering.get(aid) or {}).get("principal", ""))
        if not owner or owner == who:
            return []
        why = (f"agent {aid!r} belongs to principal {owner!r}; this connection's key is "
               f"principal {who!r}")
        self._notice("acl_refused", why, principal=who, agent_id=aid)
        return [Reject(peer, bus_pb2.UNAUTHORIZED, why, message_id)]

    # -- admission ---------------------------------------------------------------------
    def _admit(self, peer: bytes, info: common_pb2.AgentInfo, reported: Sequence[Reported],
               frameworks: Sequence[common_pb2.FrameworkInfo], message_id: str,
               rereg: bool, digest: int | None = None) -> list[Command]:
        """`digest`: the report's tasks_digest, when the agent gave one."""
        def reject(code: int, why: str) -> list[Command]:
            return [Reject(peer, code, why, message_id)]

        if peer in self.framework_peers:
            return reject(bus_pb2.INVALID, "this connection is subscribed as framework "
                          f"{self.framework_peers[peer]!r}; an agent needs its own")
        try:
            total = parse_resources(info.resources)
        except ValueError as exc:
            return reject(bus_pb2.INVALID, f"agent resources are invalid: {exc}")
        aid = info.agent_id
        known = self.agents.get(aid) if aid else None
        if rereg and not aid:
            return reject(bus_pb2.INVALID, "Reregister needs the agent's id")
        if known is not None and known.status == GONE:
            if rereg:  # told to shut down: no more asking it to re-register
                self._forget_lost_peer(aid)
                return [*reject(bus_pb2.NOT_FOUND, f"agent {aid!r} was declared gone"),
                        ToAgent(peer, aid, agent_pb2.AgentEvent(shutdown=agent_pb2.AgentEvent
                                .Shutdown(reason=f"agent {aid} was declared gone")))]
            aid, known = "", None  # a fresh agent on a gone machine: a new id
        if not aid:
            aid = self._new_id("agent", "S", self.agents, self.recovering)
        # The master's word on the agent's reservations wins over an agent that missed it
        # (a CheckpointResources lost with its connection, or a restart before it was
        # saved), as Mesos's master resends its checkpointed resources: same quantities
        # per name, other reservations. Other quantities: its flags changed, its report is
        # its total. After a master failover the agent's checkpoint is the only word.
        resend = known is not None and bool(known.total) and not known.total.same(total) \
            and known.total.with_role(UNRESERVED).same(total.with_role(UNRESERVED))
        if resend:
            assert known is not None
            total = known.total
        plan = self._plan(aid, known, reported, frameworks, digest)
        added = plan.added()
        need = Resources.total([*added.values(), *(t.resources for t in plan.reconcile),
                                *(t.resources for t, s in plan.refresh
                                  if not tasks.is_terminal(s.state)),
                                *(t.resources for t in plan.kill)])
        if not total.contains(need):
            return reject(bus_pb2.INVALID, f"agent {aid}: its tasks use {need}, more than its "
                          f"resources {total}; fix the agent's resources")
        out: list[Command] = []
        other = self.agent_peers.get(peer)
        if other is not None and other != aid:  # the machine restarted under a new id
            out += self._agent_unreachable(self.agents[other],
                                           f"agent {other} was replaced on its connection")
        info = _copy_info(info)
        info.agent_id = aid
        was = self.recovering.pop(aid, None)
        for fid, tid in self._release_held(aid).keys() - plan.taken:  # the agent's word
            self._touch("task", fid, tid)
        self.tasks_held_back += len(plan.taken)
        self.reports_taken_whole += plan.whole
        if known is None:
            # Back after a master failover as the registry has it: registered since then.
            kept = was is not None and was.get("status") == "registered" \
                and was.get("hostname") == info.hostname
            since = _since(was) if kept and was is not None else self._now
            known = Agent(aid, info, REGISTERED, total, status_since=since,
                          registered_at=self._now,
                          principal=str((was or {}).get("principal", "")) if kept else "")
            self.agents[aid] = known
            self._registry_changed(aid)
        else:
            if known.status != REGISTERED or known.info.hostname != info.hostname:
                self._registry_changed(aid)
                known.status_since = self._now
            known.info, known.total, known.status = info, total, REGISTERED
            known.unreachable_since = 0.0
        if was is not None and was.get("status") != "registered":
            self._registry_changed(aid)
        owner = self._principal if self._principal is not None else \
            known.principal or str((was or {}).get("principal", ""))
        if owner != known.principal:  # bound to the key that registered it (CURVE)
            known.principal = owner
            self._registry_changed(aid)
        if was is not None and self._registry_entry(aid) == was:
            self._registry_agents.discard(aid)  # the stored entry stands: nothing to write
        self._bind_agent(known, peer)
        self._agent_back(known, peer)
        self._touch("agent", aid)
        out += self._apply_plan(known, plan, added)
        if was is not None and not self.recovering and self.started_at is not None:
            out.append(Notice.of(
                "agents_recovered", "every agent of the registry is back after the master "
                "failover", agents=sum(a.status != GONE for a in self.agents.values()),
                tasks_held_back=self.tasks_held_back,
                reports_taken_whole=self.reports_taken_whole,
                seconds=round(self._now - self.started_at, 3)))
        reply = agent_pb2.AgentEvent()
        body = reply.reregistered if rereg else reply.registered
        body.agent_id, body.master_id = aid, self.master_id
        body.master_epoch, body.heartbeat_interval_ms = self.epoch, self.heartbeat_interval_ms
        body.cluster_id = self.cluster_id
        out.insert(0, ToAgent(peer, aid, reply))
        if resend:
            out.insert(1, self._checkpoint_resources(known))
        if plan.reconcile:
            ev = agent_pb2.AgentEvent(reconcile=agent_pb2.AgentEvent.Reconcile(tasks=[
                agent_pb2.AgentEvent.Reconcile.Task(framework_id=t.framework_id,
                                                    task_id=t.info.task_id, state=t.state)
                for t in plan.reconcile]))
            out.append(ToAgent(peer, aid, ev))
        return out

    def _checkpoint_resources(self, agent: Agent) -> ToAgent:
        """The agent's total with its reservations, for it to checkpoint and report."""
        return ToAgent(agent.peer or b"", agent.agent_id, agent_pb2.AgentEvent(
            checkpoint_resources=agent_pb2.AgentEvent.CheckpointResources(
                resources=agent.total.to_proto())))

    def _plan(self, aid: str, known: Agent | None, reported: Sequence[Reported],
              frameworks: Sequence[common_pb2.FrameworkInfo], digest: int | None = None,
              ) -> _Plan:
        infos = {f.framework_id: f for f in frameworks if f.framework_id}
        held = self.held.get(aid) if known is None else None
        if held is not None and digest is not None and digest == self.held_digests.get(aid) \
                and len(reported) == len(held):
            whole = self._plan_whole(aid, held, infos)
            if whole is not None:
                return whole
        plan = _Plan()
        seen: set[TaskKey] = set()
        # The last task's resources, parsed: an agent's tasks mostly share one shape, and
        # comparing two messages costs half of parsing one (100,000 after a failover).
        shape: tuple[Sequence[common_pb2.Resource], Resources] | None = None
        for r in reported:
            task_info, reported_status = r.task_info, r.latest_status
            fid, tid = key = (r.framework_id, task_info.task_id)
            state = reported_status.state
            if not fid or not tid or key in seen or state not in tasks.STORABLE:
                self._notice("bad_task_report", f"agent {aid}: bad task report {fid!r}/{tid!r}",
                             agent_id=aid)
                continue
            seen.add(key)
            if fid in self.removed_frameworks:
                plan.shutdown.add(fid)
                continue
            fw = self.frameworks.get(fid)
            if fw is None and fid not in plan.adopt:
                plan.adopt[fid] = infos.get(fid) or common_pb2.FrameworkInfo(
                    framework_id=fid, failover_timeout_s=self.agent_reregister_window_s)
            elif fw is not None and not fw.connected and fid in infos:
                plan.adopt[fid] = infos[fid]  # fills in what the registry does not keep
            items = task_info.resources
            if shape is not None and items == shape[0]:
                res = shape[1]
            else:
                try:
                    res = parse_resources(items)
                    shape = (items, res)
                except ValueError:
                    res = Resources()
                    self._notice("invalid_task_resources",
                                 f"agent {aid}: task {fid}/{tid} has invalid resources",
                                 agent_id=aid)
            task = self.tasks.get(key)
            followed = held.get(key) if held is not None and task is None else None
            if followed is not None:
                prior = followed.value.task
                held_status = prior.status
                if held_status.state == state and held_status.executor_id == (
                        reported_status.executor_id or r.executor_id):
                    # The same run, in the same state, as the previous leader recorded it:
                    # its record's parts are taken, not copied (the record is this core's).
                    plan.add.append(Task(fid, aid, prior.task_info, held_status, res,
                                         prior.launched_at_us / 1e6, prior.traceparent,
                                         tuple(prior.offer_ids)))
                    plan.taken.add(key)
                    continue
            status = common_pb2.TaskStatus()
            status.CopyFrom(reported_status)
            status.agent_id = aid
            if task is None:
                info = common_pb2.TaskInfo()
                info.CopyFrom(task_info)
                info.agent_id = aid
                if not status.executor_id:
                    status.executor_id = r.executor_id
                plan.add.append(Task(fid, aid, info, status, res, self._now))
            elif task.agent_id != aid and not tasks.is_terminal(task.state):
                self._notice("task_on_other_agent", f"agent {aid} reports {fid}/{tid}, "
                             f"recorded on {task.agent_id}: ignored", agent_id=aid)
            elif tasks.is_terminal(task.state):
                if not tasks.is_terminal(state):  # its framework was told it ended
                    plan.kill_unrecorded.append((fid, tid))
            elif tasks.is_terminal(state):
                plan.refresh.append((task, status))
            elif task.state == tasks.KILLING or (
                    task.state == tasks.UNREACHABLE and fw is not None
                    and not fw.partition_aware):
                # A kill is pending, or a non-partition-aware framework was told TASK_LOST.
                plan.kill.append(task)
            else:
                plan.refresh.append((task, status))
        if known is not None:
            for key in sorted(known.tasks - seen):
                task = self.tasks[key]
                if task.state == tasks.STAGING:
                    plan.reconcile.append(task)
                else:
                    plan.dropped.append(task)
        return plan

    def _plan_whole(self, aid: str, held: dict[TaskKey, bus_pb2.StateEntry],
                    infos: dict[str, common_pb2.FrameworkInfo]) -> _Plan | None:
        """The plan of an agent whose report has the digest of its held records: each taken
        back whole, as `_plan` takes a record the report matches, its record made as it was
        followed (`held_made`) or now, without the report read task by task (100,000 after
        a failover at 10k agents). None when a record cannot be taken so (its resources do
        not parse, a framework removed, a key known otherwise): `_plan` reads the report."""
        if not self.tasks.keys().isdisjoint(held):
            return None
        made = self.held_made
        add: list[Task] = []
        for key, entry in held.items():
            task = made.get(key) or made_record(key, aid, entry.value.task)
            if task is None:
                return None
            add.append(task)
        plan = _Plan(add=add, taken=set(held), whole=True)
        for fid in dict.fromkeys(key[0] for key in held):  # in the order followed
            if fid in self.removed_frameworks:
                return None
            fw = self.frameworks.get(fid)
            if fw is None:
                plan.adopt[fid] = infos.get(fid) or common_pb2.FrameworkInfo(
                    framework_id=fid, failover_timeout_s=self.agent_reregister_window_s)
            elif not fw.connected and fid in infos:
                plan.adopt[fid] = infos[fid]
        return plan

    def _apply_plan(self, agent: Agent, plan: _Plan, added: dict[str, Resources],
                    ) -> list[Command]:
        """`added`: plan.added(). Their resources are summed once, not added task by task."""
        out: list[Command] = []
        for fid, info in plan.adopt.items():
            self._adopt_framework(fid, info)
        taken = plan.taken
        for task in plan.add:
            self._add_task(task, account=False,
                           publish=not taken or (task.framework_id, task.info.task_id)
                           not in taken)
        if added:
            agent.used += Resources.total(added.values())
            for fid, held in added.items():
                self.frameworks[fid].used += held.quantities()  # the scalars: they add up
        for task, status in plan.refresh:
            back = task.state == tasks.UNREACHABLE and not tasks.is_terminal(status.state)
            if tasks.is_terminal(status.state) or status.state != task.state:
                self._set_status(task, status, checked=False)
            if back:  # its framework was told TASK_UNREACHABLE: tell it the task is back
                told = copy_status(status)
                told.reason = Reason.REASON_AGENT_REREGISTERED
                told.source = common_pb2.TaskStatus.SOURCE_MASTER
                told.uuid = b""  # the master's word: no acknowledgement expected
                told.message = f"agent {agent.agent_id} re-registered with the task"
                told.timestamp_us = int(self._now * 1_000_000)
                self._notify(task.framework_id, told)
        for task in plan.kill:  # a kill's reason (a revocation's) is on its KILLING status
            out += self._kill(task, None, task.status.reason if task.state == tasks.KILLING
                              else Reason.REASON_UNSPECIFIED)
        for fid, tid in plan.kill_unrecorded:
            out.append(ToAgent(agent.peer or b"", agent.agent_id, agent_pb2.AgentEvent(
                kill_task=agent_pb2.AgentEvent.KillTask(framework_id=fid, task_id=tid))))
        for task in plan.dropped:
            self._end_task(task, tasks.DROPPED, Reason.REASON_AGENT_RESTARTED,
                           f"agent {agent.agent_id} did not report the task when it "
                           "re-registered")
        for fid in sorted(plan.shutdown):
            cmd = self._shutdown_framework(agent, fid, f"framework {fid} was removed")
            if cmd is not None:
                out.append(cmd)
        return out

    def _adopt_framework(self, fid: str, info: common_pb2.FrameworkInfo) -> None:
        """A framework an agent runs tasks of, not (yet) re-subscribed: known, disconnected,
        its failover timeout running."""
        fw = self.frameworks.get(fid)
        if fw is not None:  # refresh a recovered framework's info from the agent's copy
            keep = (fw.info.role, fw.info.principal, fw.info.failover_timeout_s)
            fw.info.CopyFrom(info)
            fw.info.framework_id = fid
            fw.info.role, fw.info.principal, fw.info.failover_timeout_s = keep
            self._touch("framework", fid)
            return
        if not finite_nonneg(info.failover_timeout_s):
            info.failover_timeout_s = self.agent_reregister_window_s
        self.frameworks[fid] = Framework(fid, info, registered_at=self._now,
                                         disconnected_at=self._now)
        self._touch("framework", fid)
        self._registry_changed()

    # -- status updates ----------------------------------------------------------------
    def _status_updates(self, agent: Agent, updates: Sequence[agent_pb2.StatusUpdate],
                        ) -> list[Command]:
        """Record each update (if it moves the task forward) and forward it to its
        framework if connected. Not forwarded = not acknowledged: the agent retries."""
        shutdown: set[str] = set()
        stale: list[str] = []
        for su in updates:
            fid, st = su.framework_id, su.status
            if fid not in self.frameworks:
                if fid in self.removed_frameworks:
                    shutdown.add(fid)
                else:
                    self._notice("update_unknown_framework",
                                 f"update for unknown framework {fid!r} dropped")
                continue
            if st.state not in tasks.STORABLE:
                self._notice("update_bad_state", f"update {fid}/{st.task_id}: bad state {st.state}")
                continue
            task = self.tasks.get((fid, st.task_id))
            if task is not None and task.agent_id == agent.agent_id:
                if st.uuid and st.uuid == task.status.uuid:
                    pass  # a retry: the framework has not acknowledged it yet
                elif tasks.can_transition(task.state, st.state):
                    status = copy_status(st)
                    status.agent_id = agent.agent_id
                    self._set_status(task, status)
                else:  # older than what the master knows (e.g. RUNNING after KILLING)
                    stale.append(f"{fid}/{st.task_id}: {tasks.name(task.state)} -> "
                                 f"{tasks.name(st.state)}")
            if not st.agent_id:
                st = copy_status(st)
                st.agent_id = agent.agent_id
            self._notify(fid, st)  # forwarded even if stale: the agent's stream needs its ack
        if stale:  # one notice per call: an agent back after a failover resends them all
            self._notice("update_stale", f"{len(stale)} update(s) not applied (stale), "
                         f"first {stale[0]}", agent_id=agent.agent_id, count=len(stale))
        out: list[Command] = []
        for fid in sorted(shutdown):
            cmd = self._shutdown_framework(agent, fid, f"framework {fid} was removed")
            if cmd is not None:
                out.append(cmd)
        return out

    def _logs_reply(self, agent: Agent, reply: agent_pb2.AgentCall.LogsReply) -> list[Command]:
        req = self.log_requests.get(reply.request_id)
        if req is None or req.agent_id != agent.agent_id:
            self._notice("logs_reply_unknown",
                         f"logs reply for unknown request {reply.request_id!r}")
            return []
        if reply.eof or reply.error:
            del self.log_requests[reply.request_id]
        ev = operator_pb2.OperatorEvent(logs=operator_pb2.OperatorEvent.Logs(
            task_id=reply.task_id or req.task_id, stream=reply.stream or req.stream,
            data=reply.data, truncated=reply.truncated, error=reply.error,
            next_offset=reply.next_offset))
        return [ToOperator(req.peer, ev, req.message_id)]


def _since(entry: dict[str, object]) -> float:
    """A registry entry's since_us, in seconds (0 when missing or not a number)."""
    raw = entry.get("since_us")
    ok = isinstance(raw, (int, float)) and not isinstance(raw, bool) and finite_nonneg(raw)
    return float(raw) / 1e6 if ok else 0.0  # type: ignore[arg-type]


def _copy_info(info: common_pb2.AgentInfo) -> common_pb2.AgentInfo:
    out = common_pb2.AgentInfo()
    out.CopyFrom(info)
    return out
