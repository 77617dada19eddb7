"""The master's pure core: the front door's state machine. Agent, scheduler, broker and
operator calls (decoded by the shell) and the time come in; commands (services/master/
commands.py) come out. No sockets, no clock, no threads; bad input becomes a Reject.

Tables and shared helpers live in state.py, the agent protocol in agents.py, agent liveness
(unreachable, gone, pruned) in liveness.py, the scheduler protocol in frameworks.py,
revocations (the allocator's RevokeResources) in revocation.py, operator calls in
operator.py, jobs in jobs.py; this module adds the broker's messages (offers relayed,
launches re-validated), peers going silent, timers, and recovery after a failover.

Each public method returns, in order: PersistRegistry (if the registry changed), the
messages to peers, one batched SchedulerEvent.Update per framework, one Publish."""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping

from schemas import (
    agent_pb2,
    bus_pb2,
    common_pb2,
    internal_pb2,
    operator_pb2,
    scheduler_pb2,
)
from services import tasks
from services.bus.codec import DEFAULT_FRAME_LIMIT
from services.master.acl import Acl
from services.master.commands import Command, Reject, ToAgent, ToFramework
from services.master.followed import Followed
from services.master.frameworks import Event
from services.master.liveness import AGENT_GONE_TIMEOUT_S, AGENT_TIMEOUT_S, MAX_GONE_AGENTS
from services.master.operator import OperatorHandlers
from services.master.records import (
    GONE,
    LOGS_TIMEOUT_S,
    MAX_COMPLETED_TASKS,
    RECOVERING,
    REGISTERED,
    UNREACHABLE,
    Agent,
    Framework,
    Reason,
    ReasonT,
    Task,
    job_record,
    parse_resources,
    role_record,
)
from services.master.revocation import RevocationHandlers, Revocations
from services.master.state import logs_error
from services.resources import UNRESERVED, Resources

RejectReason = common_pb2.RejectReason
# A framework's call relayed to the broker travels wrapped (InternalMessage, the broker's
# envelope): refuse at the front what would not fit a frame once wrapped.
MAX_RELAY_BYTES = DEFAULT_FRAME_LIMIT - 64 * 1024
Internal = internal_pb2.InternalMessage
_STATUS_OF = {"registered": REGISTERED, "unreachable": UNREACHABLE, "gone": GONE}


class _Refused(Exception):
    def __init__(self, reason: int, message: str, task_reason: ReasonT) -> None:
        super().__init__(message)
        self.reason = reason
        self.message = message
        self.task_reason = task_reason


def broker_refusal_ends(reason: int) -> tuple[tasks.State, ReasonT]:
    """How the tasks of an ACCEPT the offer-broker refused end (Mesos: offers no longer
    valid drop them; an invalid or unauthorised task is an error)."""
    if reason in (RejectReason.REJECT_REASON_TASK_INVALID,
                  RejectReason.REJECT_REASON_RESOURCES_EXCEEDED):
        return tasks.ERROR, Reason.REASON_TASK_INVALID
    if reason == RejectReason.REJECT_REASON_UNAUTHORIZED:
        return tasks.ERROR, Reason.REASON_TASK_UNAUTHORIZED
    return tasks.DROPPED, Reason.REASON_INVALID_OFFERS


class MasterCore(OperatorHandlers, RevocationHandlers):
    """See the module docstring. `recovered_registry`: the registry document the previous
    leader persisted (registry_document()); its registered agents get
    `agent_reregister_window_s` from this core's first call to re-register."""

    def __init__(self, master_id: str, epoch: int, *, agent_reregister_window_s: float = 60.0,
                 heartbeat_interval_ms: int = 1000,
                 recovered_registry: Mapping[str, object] | None = None,
                 followed: Iterable[bus_pb2.StateEntry] | Followed = (),
                 max_completed_tasks: int = MAX_COMPLETED_TASKS,
                 cluster_id: str = "", id_prefix: str = "",
                 agent_timeout_s: float = AGENT_TIMEOUT_S,
                 agent_gone_timeout_s: float = AGENT_GONE_TIMEOUT_S,
                 max_gone_agents: int = MAX_GONE_AGENTS,
                 stall_threshold_s: float | None = None,
                 acl: Acl | None = None,
                 now: float | None = None) -> None:
        """`cluster_id`: a fresh id, used when the registry has none (a new cluster); the
        registry's is kept otherwise. `id_prefix`: unique to this leadership (see state.py).
        Agent liveness (`agent_timeout_s`, `agent_gone_timeout_s`, `max_gone_agents`,
        `stall_threshold_s`): see liveness.py. `acl`: who may use which roles and operator
        actions (acl.py), checked for calls whose principal the shell knows (CURVE).
        `followed`: the previous leader's agent and task entries as this master followed
        its stream while a standby (the shell's; none when it did not): held for the
        agents recovering, see `held` in state.py."""
        super().__init__(master_id, epoch, agent_reregister_window_s=agent_reregister_window_s,
                         heartbeat_interval_ms=heartbeat_interval_ms,
                         max_completed_tasks=max_completed_tasks,
                         max_relay_bytes=MAX_RELAY_BYTES, cluster_id=cluster_id,
                         id_prefix=id_prefix, agent_timeout_s=agent_timeout_s,
                         agent_gone_timeout_s=agent_gone_timeout_s,
                         max_gone_agents=max_gone_agents, stall_threshold_s=stall_threshold_s)
        self._offer_prefix: str | None = None
        self.acl = acl
        self.revocations = Revocations()  # revocation.py
        kept = str((recovered_registry or {}).get("cluster_id") or "")
        if kept:
            self.cluster_id = kept
        elif self.cluster_id:
            self._registry_changed()  # a new cluster: its id is written once, now
        if recovered_registry:
            self._recover(recovered_registry)
        self._hold(followed if isinstance(followed, Followed) else Followed.of(followed))
        if now is not None:  # else the first call's `now` starts the clocks
            self._begin(now)

    def _hold(self, followed: Followed) -> None:
        """The followed records of the agents recovering, taken whole (this core owns them
        now): 10,000 agents' dicts, not 110,000 entries indexed one by one."""
        recovering = self.recovering
        digests = followed.digests
        for aid, records in followed.tasks.items():
            if aid in recovering:
                self.held[aid] = records
                self.held_digests[aid] = digests[aid]
        if len(self.held) == len(followed.tasks):
            self.held_keys, self.held_made = followed.task_agent, followed.made
        else:  # some followed agents are not recovering (gone, or not in the registry)
            for aid, records in self.held.items():
                self.held_keys.update(dict.fromkeys(records, aid))
            made = followed.made
            self.held_made = {k: made[k] for k in self.held_keys if k in made}
        for aid, entry in followed.agents.items():
            if aid in recovering:
                shown = bus_pb2.StateEntry()
                shown.CopyFrom(entry)
                shown.value.agent.status = RECOVERING
                self.held_agents[aid] = shown

    def _recover(self, doc: Mapping[str, object]) -> None:
        """Rebuild what the registry holds; tasks come back with their agents."""
        for aid, entry in _section(doc, "agents").items():
            status = _STATUS_OF.get(str(entry.get("status", "")))
            if status == REGISTERED:
                self.recovering[aid] = dict(entry)
            elif status is not None:
                since = _num(entry.get("since_us")) / 1e6
                self.agents[aid] = Agent(
                    aid, common_pb2.AgentInfo(agent_id=aid,
                                              hostname=str(entry.get("hostname", ""))),
                    status, Resources(), status_since=since,
                    unreachable_since=since if status == UNREACHABLE else 0.0,
                    principal=str(entry.get("principal", "")))
                if status == UNREACHABLE:
                    self._lower_checks(gone=since + self.agent_gone_timeout_s)
        self._prune_gone()  # a registry written under a larger bound
        for fid, entry in _section(doc, "frameworks").items():
            timeout = _num(entry.get("failover_timeout_s"))
            info = common_pb2.FrameworkInfo(
                framework_id=fid, name=str(entry.get("name", "")),
                role=str(entry.get("role", "")) or UNRESERVED,
                principal=str(entry.get("principal", "")),
                failover_timeout_s=timeout if timeout >= 0 else 0.0)
            self.frameworks[fid] = Framework(
                fid, info, registered_at=_num(entry.get("registered_at_us")) / 1e6,
                recovered=True)
        for role, entry in _section(doc, "roles").items():
            rec = role_record(role, entry)
            if rec is not None:
                self.roles[role] = rec
        for name, entry in _section(doc, "jobs").items():
            job = job_record(name, entry)
            if job is not None:
                self.jobs[name] = job

    # -- public API --------------------------------------------------------------------
    def agent_call(self, peer: bytes, call: agent_pb2.AgentCall, now: float,
                   message_id: str = "", principal: str | None = None) -> list[Command]:
        """`principal`: who the agent's CURVE key was admitted as (None: not known)."""
        self._begin(now)
        self._principal = principal
        try:
            return self._end(self._agent_call(peer, call, message_id))
        finally:
            self._principal = None

    def scheduler_call(self, peer: bytes, call: scheduler_pb2.SchedulerCall, message_id: str,
                       now: float, traceparent: str = "", principal: str | None = None,
                       ) -> list[Command]:
        """`principal`: who the caller's CURVE key was admitted as (None: not known)."""
        self._begin(now)
        self._principal = principal
        try:
            return self._end(self._scheduler_call(peer, call, message_id, traceparent))
        finally:
            self._principal = None

    def broker_connected(self, peer: bytes, offer_prefix: str | None = None,
                         now: float | None = None) -> list[Command]:
        """The broker (re)connected on `peer`. `offer_prefix`: its offer-id prefix (its
        epoch); offers relayed from an older broker are then rescinded to frameworks."""
        if now is not None:
            self._begin(now)
        self.broker = peer
        if offer_prefix is None or offer_prefix == self._offer_prefix:
            return self._end([])
        self._offer_prefix = offer_prefix
        stale: dict[str, list[str]] = {}
        for fw in self.frameworks.values():
            for oid in [o for o in fw.offers if not o.startswith(f"{offer_prefix}-")]:
                fw.pop_offer(oid)
                stale.setdefault(fw.framework_id, []).append(oid)
                self._touch("framework", fw.framework_id)
        out: list[Command] = []
        for fid, ids in sorted(stale.items()):
            fw = self.frameworks[fid]
            if fw.peer is not None:
                out.append(ToFramework(fw.peer, fid, Event(rescind=Event.Rescind(
                    offer_ids=sorted(ids),
                    reason=common_pb2.RescindReason.RESCIND_REASON_BROKER_FAILOVER,
                    message="the offer broker failed over"))))
        return self._end(out)

    def internal_message(self, peer: bytes, msg: internal_pb2.InternalMessage, now: float,
                         traceparent: str = "", message_id: str = "") -> list[Command]:
        """From the broker (the shell passes only broker/allocator-role senders)."""
        self._begin(now)
        self.broker = peer
        kind = msg.WhichOneof("kind")
        out: list[Command]
        if kind == "framework_event":
            out = self._framework_event(msg.framework_event, traceparent)
        elif kind == "launch_request":
            out = self._launch(msg.launch_request, traceparent)
        elif kind == "allocator_decisions":
            for d in msg.allocator_decisions.decisions:
                if d.framework_id in self.frameworks:
                    self.decisions[d.framework_id] = d
                    self._touch("decision", d.framework_id)
            out = []
        elif kind == "revoke_resources":
            out = self._revoke(msg.revoke_resources)
        else:
            out = [Reject(peer, bus_pb2.UNEXPECTED, f"the master does not take {kind!r} "
                          "internal messages", message_id, channel="internal")]
        return self._end(out)

    def operator_call(self, peer: bytes, call: operator_pb2.OperatorCall, message_id: str,
                      now: float, principal: str | None = None) -> list[Command]:
        self._begin(now)
        kind = call.WhichOneof("call")
        if self.acl is not None and principal is not None and kind is not None \
                and not self.acl.may(principal, kind):
            why = (f"principal {principal!r} may not {kind}: the master's ACL does not give "
                   "it that operator action")
            self._notice("acl_refused", why, principal=principal, action=kind)
            return self._end([Reject(peer, bus_pb2.UNAUTHORIZED, why, message_id)])
        if kind in ("submit_job", "remove_job"):
            return self._end(self._job_call(peer, call, message_id, principal))
        return self._end(self._operator_call(peer, call, message_id))

    def agents_heard(self, heard: Mapping[bytes, float], now: float, complete: bool = True,
                     ) -> list[Command]:
        """The shell's liveness report: when each agent connection was last heard from (any
        frame, heartbeats included; only those that changed need be given). `complete`: the
        front socket was drained first, so `now` is evidence of silence (see liveness.py).
        Agents silent past the timeout become unreachable here; an unreachable agent heard
        again on its old connection is asked to re-register."""
        self._begin(now)
        return self._end(self._agents_heard(heard, complete))

    def peer_gone(self, peer: bytes, now: float) -> list[Command]:
        """The bus says `peer` missed its heartbeats. For an agent that is no verdict: the
        master's own agent timeout decides (liveness.py), on the reports of what it heard."""
        self._begin(now)
        out: list[Command] = []
        if peer in self.framework_peers:
            out += self._framework_disconnected(self.frameworks[self.framework_peers[peer]])
        if peer == self.broker:
            self.broker = b""
        for rid in [r for r, req in self.log_requests.items() if req.peer == peer]:
            del self.log_requests[rid]
        return self._end(out)

    def tick(self, now: float) -> list[Command]:
        """Timers: framework failover timeouts, the agent re-register window after a master
        failover, agents silent or unreachable too long, revocations' grace periods,
        unanswered log requests."""
        self._begin(now)
        out: list[Command] = []
        for fw in sorted(self.frameworks.values(), key=lambda f: f.framework_id):
            if not fw.connected and now >= self.failover_deadline(fw):
                out += self._remove_framework(fw, "failover timeout passed")
        assert self.started_at is not None
        if self.recovering and now >= self.started_at + self.agent_reregister_window_s:
            for aid, entry in sorted(self.recovering.items()):
                del self.recovering[aid]
                for fid, tid in self._release_held(aid):  # off the stream: not known here
                    self._touch("task", fid, tid)
                self.agents[aid] = Agent(
                    aid, common_pb2.AgentInfo(agent_id=aid,
                                              hostname=str(entry.get("hostname", ""))),
                    UNREACHABLE, Resources(), status_since=now, unreachable_since=now)
                self._touch("agent", aid)
                self._registry_changed(aid)
        out += self._expire_agents()
        out += self._revocations_due()
        for rid, req in list(self.log_requests.items()):
            if now >= req.created_at + LOGS_TIMEOUT_S:
                del self.log_requests[rid]
                out.append(logs_error(req.peer, req.task_id, req.stream,
                                      f"agent {req.agent_id} did not answer", req.message_id))
        return self._end(out)

    def next_deadline(self) -> float | None:
        """When `tick` has something to do next (None: nothing pending)."""
        times = [self.failover_deadline(fw) for fw in self.frameworks.values()
                 if not fw.connected]
        if self.recovering and self.started_at is not None:
            times.append(self.started_at + self.agent_reregister_window_s)
        times += [r.created_at + LOGS_TIMEOUT_S for r in self.log_requests.values()]
        times += self._liveness_deadlines()
        revocation = self.revocations.next_deadline()
        if revocation is not None:
            times.append(revocation)
        return min(times, default=None)

    # -- revocations end with their framework or agent -----------------------------------
    def _remove_framework(self, fw: Framework, why: str) -> list[Command]:
        self.revocations.drop_framework(fw.framework_id)
        return super()._remove_framework(fw, why)

    def _agent_unreachable(self, agent: Agent, why: str) -> list[Command]:
        self.revocations.drop_agent(agent.agent_id)
        return super()._agent_unreachable(agent, why)

    def _agent_gone(self, agent: Agent, state: tasks.State, reason: int, why: str,
                    ) -> list[Command]:
        self.revocations.drop_agent(agent.agent_id)
        return super()._agent_gone(agent, state, reason, why)

    # -- broker ------------------------------------------------------------------------
    def _framework_event(self, fe: Internal.FrameworkEvent, traceparent: str,
                         ) -> list[Command]:
        fw = self.frameworks.get(fe.framework_id)
        ev = fe.event
        kind = ev.WhichOneof("event")
        if kind == "offers":
            if fw is None or fw.peer is None:  # nobody to offer to: give them back now
                ids = [o.offer_id for o in ev.offers.offers]
                return [self._decline(fe.framework_id, ids, "framework not connected")] \
                    if ids else []
            for o in ev.offers.offers:
                try:
                    res = parse_resources(o.resources)
                except ValueError:
                    res = Resources()
                fw.add_offer(o.offer_id, o.agent_id, res)
            self._touch("framework", fw.framework_id)
        elif kind == "rescind":
            if fw is not None:
                self._offers_done(fw, ev.rescind.offer_ids)
        elif kind == "accept_rejected":
            if fw is not None:
                r = ev.accept_rejected
                self._offers_done(fw, r.offer_ids)
                if fe.end_tasks:
                    self._end_unlaunched(fw.framework_id, dict.fromkeys(r.task_ids),
                                         *broker_refusal_ends(r.reason),
                                         f"refused by the offer-broker: {r.message}")
        else:
            return [Reject(self.broker, bus_pb2.UNEXPECTED, f"framework event {kind!r} is "
                           "not the broker's to send", channel="internal")]
        if fw is None or fw.peer is None:
            return []
        return [ToFramework(fw.peer, fw.framework_id, ev, traceparent)]

    def _launch(self, req: Internal.LaunchRequest, traceparent: str) -> list[Command]:
        """Re-validate a broker-validated ACCEPT against the master's own view and launch it
        all or nothing: one RunTasks to the agent, one LaunchResult to the broker."""
        launches: list[common_pb2.TaskInfo] = [
            t for op in req.operations if op.WhichOneof("operation") == "launch"
            for t in op.launch.tasks]
        task_ids = list(dict.fromkeys(t.task_id for t in launches))
        fw = self.frameworks.get(req.framework_id)
        try:
            agent, total, used = self._check_launch(req, fw)
        except _Refused as no:
            if fw is not None:
                state = tasks.ERROR if no.reason == RejectReason.REJECT_REASON_TASK_INVALID \
                    else tasks.DROPPED
                self._end_unlaunched(fw.framework_id, task_ids, state, no.task_reason,
                                     no.message, req.agent_id)
            return [self._to_broker(Internal(launch_result=Internal.LaunchResult(
                request_id=req.request_id, accepted=False, reason=no.reason,  # type: ignore[arg-type]
                message=no.message, task_ids=task_ids)), traceparent)]
        assert fw is not None
        out: list[Command] = []
        if not agent.total.same(total):  # reservations made or undone by this ACCEPT
            agent.total = total
            self._touch("agent", agent.agent_id)
            out.append(self._checkpoint_resources(agent))  # before its tasks run on them
        event = agent_pb2.AgentEvent()  # built in place: each TaskInfo copied once into it
        run = event.run_tasks
        run.frameworks.add().CopyFrom(fw.info)
        offer_ids = tuple(req.offer_ids)
        for t, res in zip(launches, used, strict=True):
            info = common_pb2.TaskInfo()
            info.CopyFrom(t)
            info.agent_id = agent.agent_id
            st = self._status(t.task_id, tasks.STAGING, Reason.REASON_UNSPECIFIED, "",
                              agent.agent_id)
            self._add_task(Task(fw.framework_id, agent.agent_id, info, st, res, self._now,
                                traceparent, offer_ids), account=False)
            launch = run.launches.add(framework_id=fw.framework_id, traceparent=traceparent)
            launch.task.CopyFrom(info)
            launch.offer_ids.extend(offer_ids)
        if used:  # the tasks' resources summed once, not added task by task
            held = Resources.total(used)
            agent.used += held
            fw.used += held.quantities()
        self._offers_done(fw, req.offer_ids)
        if launches:
            out.append(ToAgent(agent.peer or b"", agent.agent_id, event, traceparent))
        out.append(self._to_broker(Internal(launch_result=Internal.LaunchResult(
            request_id=req.request_id, accepted=True, task_ids=task_ids)), traceparent))
        return out

    def _check_launch(self, req: Internal.LaunchRequest, fw: Framework | None,
                      ) -> tuple[Agent, Resources, list[Resources]]:
        """(agent, its total after the ACCEPT's reservations, each task's resources), or
        _Refused with the reason the broker and the framework are told."""
        if fw is None or fw.peer is None:
            raise _Refused(RejectReason.REJECT_REASON_FRAMEWORK_INACTIVE,
                           f"framework {req.framework_id} is not subscribed",
                           Reason.REASON_UNSPECIFIED)
        agent = self.agents.get(req.agent_id)
        if agent is None or not agent.reachable:
            raise _Refused(RejectReason.REJECT_REASON_AGENT_UNAVAILABLE,
                           f"agent {req.agent_id} is not registered and reachable",
                           Reason.REASON_AGENT_UNREACHABLE)

        def invalid(why: str) -> _Refused:
            return _Refused(RejectReason.REJECT_REASON_TASK_INVALID, why,
                            Reason.REASON_TASK_INVALID)

        def disjoint(named: list[tuple[str, Resources]]) -> Resources:
            try:
                return Resources.total_disjoint(named)
            except ValueError as exc:
                raise invalid(f"tasks {exc}") from exc

        total, free = agent.total, agent.free()
        seen: set[str] = set()
        named: list[tuple[str, Resources]] = []  # every task of the ACCEPT so far
        for i, op in enumerate(req.operations):
            kind = op.WhichOneof("operation")
            if kind == "launch":
                batch: list[tuple[str, Resources]] = []
                for t in op.launch.tasks:
                    tid = t.task_id
                    if not tid or "/" in tid or tid in seen:
                        raise invalid(f"task id {tid!r} is empty, has '/', or is repeated")
                    seen.add(tid)
                    old = self.tasks.get((fw.framework_id, tid))
                    if old is not None and not tasks.is_terminal(old.state):
                        raise invalid(f"task id {tid!r} is already in use by a live task")
                    if t.agent_id and t.agent_id != agent.agent_id:
                        raise invalid(f"task {tid!r} names agent {t.agent_id!r}")
                    try:
                        res = parse_resources(t.resources)
                    except ValueError as exc:
                        raise invalid(f"task {tid!r} has invalid resources: {exc}") from exc
                    if not res:
                        raise invalid(f"task {tid!r} has no resources")
                    other = sorted({k[1] for k in (*res.scalars, *res.ranges, *res.sets)}
                                   - {UNRESERVED, fw.role})
                    if other:
                        raise _Refused(RejectReason.REJECT_REASON_UNAUTHORIZED,
                                       f"task {tid!r} uses resources reserved for role "
                                       f"{other[0]!r}; the framework's role is {fw.role!r}",
                                       Reason.REASON_TASK_UNAUTHORIZED)
                    batch.append((tid, res))
                named += batch
                need = disjoint(batch)
                if not free.contains(need):
                    disjoint(named)  # a port an earlier launch took: name both tasks
                    raise _Refused(RejectReason.REJECT_REASON_AGENT_INSUFFICIENT,
                                   f"operation {i}: tasks need {need}, agent {agent.agent_id} "
                                   f"has {free} free", Reason.REASON_RESOURCES_UNKNOWN)
                free = free - need
            elif kind in ("reserve", "unreserve"):
                items = op.reserve.resources if kind == "reserve" else op.unreserve.resources
                try:
                    res = parse_resources(items)
                except ValueError as exc:
                    raise invalid(f"operation {i} ({kind}): invalid resources: {exc}") from exc
                roles = {k[1] for k in (*res.scalars, *res.ranges, *res.sets)}
                if not res or roles != {fw.role} or fw.role == UNRESERVED:
                    raise _Refused(RejectReason.REJECT_REASON_UNAUTHORIZED,
                                   f"operation {i} ({kind}): resources must be reserved for "
                                   f"the framework's role {fw.role!r}",
                                   Reason.REASON_TASK_UNAUTHORIZED)
                take, give = ((res.with_role(UNRESERVED), res) if kind == "reserve"
                              else (res, res.with_role(UNRESERVED)))
                if not free.contains(take):
                    raise _Refused(RejectReason.REJECT_REASON_AGENT_INSUFFICIENT,
                                   f"operation {i} ({kind}): {take} not free on agent "
                                   f"{agent.agent_id} ({free})", Reason.REASON_RESOURCES_UNKNOWN)
                free, total = free - take + give, total - take + give
            else:
                raise invalid(f"operation {i} has no kind")
        return agent, total, [res for _, res in named]


def _section(doc: Mapping[str, object], name: str) -> dict[str, Mapping[str, object]]:
    part = doc.get(name)
    if not isinstance(part, Mapping):
        return {}
    return {str(k): v for k, v in part.items() if isinstance(v, Mapping)}


def _num(x: object) -> float:
    if isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x):
        return float(x)
    return 0.0
