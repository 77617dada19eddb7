"""The master's side of the scheduler protocol: subscription and failover, authorisation of
every call (a framework touches only its own tasks), kills, acks, reconciliation, removal."""

from __future__ import annotations

import math
from collections.abc import Sequence

from schemas import agent_pb2, bus_pb2, common_pb2, internal_pb2, scheduler_pb2
from services import tasks
from services.master.acl import Acl
from services.master.commands import Command, Reject, ToAgent, ToFramework
from services.master.records import (
    GONE,
    MAX_DEMAND_COUNT,
    MAX_DEMAND_PORTS,
    MAX_DEMANDS,
    MAX_REMOVED_FRAMEWORKS,
    REGISTERED,
    UNREACHABLE,
    Framework,
    Reason,
)
from services.master.state import MasterState, copy_status, finite_nonneg
from services.resources import UNRESERVED, Resources

Call = scheduler_pb2.SchedulerCall
Event = scheduler_pb2.SchedulerEvent


class FrameworkHandlers(MasterState):
    acl: Acl | None = None  # who may use which role (acl.py); None: no check
    _principal: str | None = None  # the current call's CURVE principal, when known

    def _scheduler_call(self, peer: bytes, call: Call, message_id: str, traceparent: str,
                        ) -> list[Command]:
        kind = call.WhichOneof("call")
        if kind == "subscribe":
            return self._subscribe(peer, call, message_id)
        if kind is None:
            return [Reject(peer, bus_pb2.UNKNOWN_PAYLOAD, "SchedulerCall carries no call",
                           message_id)]
        fw = self.frameworks.get(call.framework_id)
        if fw is None or fw.peer != peer:
            return [Reject(peer, bus_pb2.NOT_REGISTERED, f"framework {call.framework_id!r} "
                           "is not subscribed on this connection", message_id)]
        if kind == "teardown":
            return self._remove_framework(fw, "torn down by its scheduler")
        if kind in ("accept", "decline"):
            msg = internal_pb2.InternalMessage(framework_call=internal_pb2.InternalMessage
                                               .FrameworkCall(framework_id=fw.framework_id,
                                                              call=call))
            if msg.ByteSize() > self.max_relay_bytes:  # its offers stay outstanding
                return [Reject(peer, bus_pb2.FRAME_TOO_LARGE, f"{kind} of {msg.ByteSize()} "
                               f"bytes is too large to relay to the offer-broker (at most "
                               f"{self.max_relay_bytes}); split it", message_id)]
            self._offers_done(fw, call.accept.offer_ids if kind == "accept"
                              else call.decline.offer_ids)
            if not self.broker:  # nobody would validate it: its offers died with the broker
                return self._no_broker(fw, call) if kind == "accept" else []
            return [self._to_broker(msg, traceparent)]
        if kind in ("revive", "suppress"):
            return self._revive_or_suppress(fw, call, kind, message_id, traceparent)
        if kind == "kill":
            return self._kill_call(fw, call.kill, message_id)
        if kind == "acknowledge":
            return self._acknowledge(fw, call.acknowledge.acks, message_id)
        if kind == "reconcile":
            return self._reconcile(fw, call.reconcile.tasks)
        if kind == "request":
            return self._request(fw, call.request, message_id)
        return [Reject(peer, bus_pb2.UNEXPECTED, f"unexpected scheduler call {kind}",
                       message_id)]

    def _no_broker(self, fw: Framework, call: Call) -> list[Command]:
        """An ACCEPT while no offer-broker is connected: its offers are void (a new broker
        rescinds them all), so it launches nothing. Say so, and end its tasks as DROPPED,
        rather than let it vanish."""
        why = "no offer-broker is connected (it failed over); these offers are void"
        task_ids = list(dict.fromkeys(t.task_id for op in call.accept.operations
                                      if op.WhichOneof("operation") == "launch"
                                      for t in op.launch.tasks))
        self._end_unlaunched(fw.framework_id, task_ids, tasks.DROPPED,
                             Reason.REASON_INVALID_OFFERS, why)
        assert fw.peer is not None
        return [ToFramework(fw.peer, fw.framework_id, Event(
            accept_rejected=Event.AcceptRejected(
                offer_ids=call.accept.offer_ids, task_ids=task_ids,
                reason=common_pb2.RejectReason.REJECT_REASON_OFFER_UNKNOWN, message=why)))]

    # -- subscription ------------------------------------------------------------------
    def _acl_refusal(self, info: common_pb2.FrameworkInfo) -> str | None:
        """Why the ACL refuses this subscription by the current caller, or None: a
        framework's principal is its key's, and its role one the ACL gives that principal
        (so no framework takes over another's id or uses another's role)."""
        who = self._principal
        if self.acl is None or who is None:
            return None
        if info.principal != who:
            return (f"this connection's key is principal {who!r}; it may not subscribe as "
                    f"principal {info.principal!r}")
        if not self.acl.may_use_role(who, info.role):
            return f"principal {who!r} may not use role {info.role!r} (the master's ACL)"
        return None

    def _subscribe(self, peer: bytes, call: Call, message_id: str) -> list[Command]:
        """New framework, or a re-subscription (scheduler failover, or after a master
        failover). Refusals are SchedulerEvent.Error: fatal for that subscription."""
        sub = call.subscribe
        info = common_pb2.FrameworkInfo()
        info.CopyFrom(sub.framework_info)
        fid = info.framework_id or call.framework_id

        def refuse(why: str) -> list[Command]:
            return [ToFramework(peer, fid, Event(error=Event.Error(message=why)))]

        if call.framework_id and info.framework_id and call.framework_id != info.framework_id:
            return refuse(f"framework_id {call.framework_id!r} and framework_info.framework_id "
                          f"{info.framework_id!r} differ")
        if peer in self.agent_peers:
            return refuse(f"this connection is agent {self.agent_peers[peer]!r}")
        bound = self.framework_peers.get(peer)
        if bound is not None and not fid:
            # A Subscribe sent again before its Subscribed came (the driver's retry crossed a
            # slow answer): the same framework on its own connection, answered again.
            fid = info.framework_id = bound
        if bound is not None and bound != fid:
            return refuse(f"this connection is already subscribed as framework {bound!r}")
        if not finite_nonneg(info.failover_timeout_s):
            return refuse(f"failover_timeout_s {info.failover_timeout_s} must be >= 0")
        if "/" in fid:
            return refuse(f"framework id {fid!r} may not contain '/'")
        info.role = info.role or UNRESERVED
        why = self._acl_refusal(info)
        if why is not None:
            self._notice("acl_refused", why, principal=self._principal or "",
                         action="subscribe", role=info.role)
            return refuse(why)
        out: list[Command] = []
        fw = self.frameworks.get(fid) if fid else None
        if fw is None and fid in self.removed_frameworks:
            return refuse(f"framework {fid} was removed; subscribe without an id")
        if fw is None:
            fid = fid or self._new_id("framework", "F", self.frameworks)
            info.framework_id = fid
            fw = Framework(fid, info, registered_at=self._now)
            self.frameworks[fid] = fw
            self._registry_changed()
        else:
            if info.principal != fw.info.principal:
                return refuse(f"framework {fid} belongs to principal {fw.info.principal!r}, "
                              f"not {info.principal!r}")
            if info.role != fw.role:
                return refuse(f"framework {fid} has role {fw.role!r}; the role cannot change "
                              "on re-subscription")
            if fw.peer is not None and fw.peer != peer:
                if not sub.force:
                    return refuse(f"framework {fid} is subscribed on another connection; "
                                  "subscribe with force to take over")
                out.append(ToFramework(fw.peer, fid, Event(error=Event.Error(
                    message=f"framework {fid} failed over to another scheduler"))))
                self._unbind_framework(fw)
            if fw.peer != peer:  # a new connection: offers made to the old one are void
                out += self._give_back_offers(fw)
            info.framework_id = fid
            if (info.failover_timeout_s != fw.info.failover_timeout_s
                    or info.name != fw.info.name):
                self._registry_changed()
            fw.info = info
        self._bind_framework(fw, peer)
        fw.disconnected_at = 0.0
        fw.recovered = False
        fw.suppressed_roles = set(sub.suppressed_roles)
        self._touch("framework", fid)
        out.append(ToFramework(peer, fid, Event(subscribed=Event.Subscribed(
            framework_id=fid, heartbeat_interval_ms=self.heartbeat_interval_ms,
            master_id=self.master_id, master_epoch=self.epoch,
            cluster_id=self.cluster_id))))
        return out

    def _framework_disconnected(self, fw: Framework) -> list[Command]:
        """Its scheduler went silent: tasks keep running until the failover timeout."""
        self._unbind_framework(fw)
        fw.disconnected_at = self._now
        self._touch("framework", fw.framework_id)
        if fw.info.failover_timeout_s <= 0:
            return self._remove_framework(fw, "disconnected with no failover timeout")
        return self._give_back_offers(fw)

    def _remove_framework(self, fw: Framework, why: str) -> list[Command]:
        """Torn down or failover timeout passed: agents shut its tasks down, records go."""
        fid = fw.framework_id
        out = self._give_back_offers(fw)
        agents = sorted({self.tasks[(fid, t)].agent_id for t in fw.tasks})
        for aid in agents:
            agent = self.agents[aid]
            cmd = self._shutdown_framework(agent, fid, f"framework {fid} removed: {why}")
            if cmd is not None:
                out.append(cmd)
        for tid in sorted(fw.tasks):
            task = self.tasks[(fid, tid)]
            st = self._status(tid, tasks.KILLED, Reason.REASON_FRAMEWORK_REMOVED,
                              f"framework removed: {why}", task.agent_id)
            self._set_status(task, st)
        for tid in list(fw.completed):
            self._forget_task(self.tasks[(fid, tid)])
        self._unbind_framework(fw)
        del self.frameworks[fid]
        if self.decisions.pop(fid, None) is not None:
            self._touch("decision", fid)
        self._touch("framework", fid)
        self.removed_frameworks[fid] = None
        while len(self.removed_frameworks) > MAX_REMOVED_FRAMEWORKS:
            self.removed_frameworks.popitem(last=False)
        self._registry_changed()
        return out

    # -- calls -------------------------------------------------------------------------
    def _revive_or_suppress(self, fw: Framework, call: Call, kind: str, message_id: str,
                            traceparent: str) -> list[Command]:
        roles = list(call.revive.roles if kind == "revive" else call.suppress.roles)
        foreign = sorted(set(roles) - {fw.role, fw.info.role})
        if foreign:
            return [Reject(fw.peer or b"", bus_pb2.INVALID, f"framework {fw.framework_id} has "
                           f"role {fw.role!r}, not {foreign}", message_id)]
        msg = internal_pb2.InternalMessage()
        if kind == "revive":
            fw.suppressed_roles.clear()
            msg.revive_offers.framework_id = fw.framework_id
            msg.revive_offers.roles.extend(roles)
        else:
            fw.suppressed_roles.add(fw.role)
            msg.suppress_offers.framework_id = fw.framework_id
            msg.suppress_offers.roles.extend(roles)
        self._touch("framework", fw.framework_id)
        return [self._to_broker(msg, traceparent)]

    def _request(self, fw: Framework, req: Call.Request, message_id: str) -> list[Command]:
        """Its declared demand replaces the one before (none = unknown again); published
        only when it changed (frameworks restate it often). A bad one changes nothing."""
        try:
            if len(req.demands) > MAX_DEMANDS:
                raise ValueError(f"{len(req.demands)} demands, at most {MAX_DEMANDS}")
            demands = tuple(_demand(i, d) for i, d in enumerate(req.demands))
        except ValueError as exc:
            return [Reject(fw.peer or b"", bus_pb2.INVALID, f"request of framework "
                           f"{fw.framework_id} refused: {exc}", message_id)]
        if demands != fw.demands:
            fw.demands = demands
            self._touch("framework", fw.framework_id)
        return []

    def _kill_call(self, fw: Framework, kill: Call.Kill, message_id: str) -> list[Command]:
        task = self.tasks.get((fw.framework_id, kill.task_id))
        grace = kill.kill_grace_period_s if kill.HasField("kill_grace_period_s") else None
        if task is None:
            if self._owners(kill.task_id):
                return [Reject(fw.peer or b"", bus_pb2.UNAUTHORIZED,
                               f"task {kill.task_id!r} is not a task of framework "
                               f"{fw.framework_id}", message_id)]
            # Unknown: answered as reconciliation would (TASK_UNKNOWN / TASK_LOST), per Mesos.
            self._answer_unknown(fw, kill.task_id, kill.agent_id)
            return []
        if tasks.is_terminal(task.state):
            self._notify(fw.framework_id, self._reconciled(task.status))
            return []
        return self._kill(task, grace)

    def _acknowledge(self, fw: Framework, acks: Sequence[Call.Acknowledge.Ack], message_id: str,
                     ) -> list[Command]:
        """Authorise each ack (the task is this framework's, or unknown to the master) and
        forward them to the agents, one Acknowledgements per agent."""
        fid = fw.framework_id
        # Each agent's event built in place (a launch brings two acks a task: 200,000 at
        # 10,000 agents x 10 tasks); None: the agent is away or unknown, its acks dropped.
        per_agent: dict[str, agent_pb2.AgentEvent | None] = {}
        refused: list[str] = []
        tasks_get, agents = self.tasks.get, self.agents
        for ack in acks:
            tid = ack.task_id
            task = tasks_get((fid, tid))
            if task is None and self._owners(tid):
                refused.append(tid)
                continue
            uuid = ack.uuid
            if not uuid:
                continue
            aid = ack.agent_id or (task.agent_id if task is not None else "")
            if aid in per_agent:
                event = per_agent[aid]
            else:
                agent = agents.get(aid)
                # Not reachable: the agent resends the update once it is back; ack it then.
                event = per_agent[aid] = agent_pb2.AgentEvent() \
                    if agent is not None and agent.reachable else None
            if event is not None:
                event.acknowledgements.acks.add(framework_id=fid, task_id=tid, uuid=uuid)
        out: list[Command] = []
        for aid, event in sorted(per_agent.items()):
            if event is not None:
                out.append(ToAgent(self.agents[aid].peer or b"", aid, event))
        if refused:
            out.append(Reject(fw.peer or b"", bus_pb2.UNAUTHORIZED,
                              f"tasks {sorted(set(refused))} are not tasks of framework {fid}; "
                              "their acknowledgements were dropped", message_id))
        return out

    def _reconcile(self, fw: Framework, wanted: Sequence[Call.Reconcile.Task]) -> list[Command]:
        """Explicit: each task's latest state, or what the master can say of an unknown one.
        Implicit (no tasks): every task the master knows of the framework."""
        fid = fw.framework_id
        if not wanted:
            for tid in sorted(fw.tasks) + list(fw.completed):
                self._notify(fid, self._reconciled(self.tasks[(fid, tid)].status))
            return []
        for w in wanted:
            task = self.tasks.get((fid, w.task_id))
            if task is not None:
                self._notify(fid, self._reconciled(task.status))
            else:
                self._answer_unknown(fw, w.task_id, w.agent_id)
        return []

    def _reconciled(self, status: common_pb2.TaskStatus) -> common_pb2.TaskStatus:
        st = copy_status(status)
        st.reason = Reason.REASON_RECONCILIATION
        st.source = common_pb2.TaskStatus.SOURCE_MASTER
        st.uuid = b""
        return st

    def _answer_unknown(self, fw: Framework, task_id: str, agent_id: str) -> None:
        """Mesos's rules for a task the master does not know: TASK_UNREACHABLE/GONE when its
        agent is, silence while agents may still re-register after a failover, else
        TASK_UNKNOWN (TASK_LOST to frameworks that are not partition-aware)."""
        agent = self.agents.get(agent_id) if agent_id else None
        if agent_id in self.recovering or (not agent_id and self.recovering):
            return  # the task may still come back with its agent
        if agent is not None and agent.status == UNREACHABLE:
            st = self._status(task_id, tasks.UNREACHABLE, Reason.REASON_RECONCILIATION,
                              f"agent {agent_id} is unreachable", agent_id)
            st.unreachable_since_us = int(agent.unreachable_since * 1_000_000)
        elif agent is not None and agent.status == GONE:
            st = self._status(task_id, tasks.GONE, Reason.REASON_RECONCILIATION,
                              f"agent {agent_id} is gone", agent_id)
        elif agent is None and agent_id:
            st = self._status(task_id, tasks.UNKNOWN, Reason.REASON_AGENT_UNKNOWN,
                              f"agent {agent_id} is not known to the master", agent_id)
        else:
            assert agent is None or agent.status == REGISTERED
            st = self._status(task_id, tasks.UNKNOWN, Reason.REASON_RECONCILIATION,
                              "the master does not know this task", agent_id)
        self._notify(fw.framework_id, st)


def _demand(i: int, d: common_pb2.Demand) -> common_pb2.Demand:
    """One demand, checked (ValueError says why) and normalised (resources merged, sorted,
    role "*")."""
    if not 1 <= d.count <= MAX_DEMAND_COUNT:
        raise ValueError(f"demand {i}: count {d.count} must be 1 to {MAX_DEMAND_COUNT}")
    if d.ports > MAX_DEMAND_PORTS:
        raise ValueError(f"demand {i}: {d.ports} ports, at most {MAX_DEMAND_PORTS}")
    if not d.resources:
        raise ValueError(f"demand {i}: no resources")
    for r in d.resources:
        if not r.name or r.WhichOneof("value") != "scalar":
            raise ValueError(f"demand {i}: resource {r.name!r} is not a named scalar (ports "
                             "go in `ports`)")
        if r.role not in ("", UNRESERVED):
            raise ValueError(f"demand {i}: resource {r.name} is reserved for {r.role!r}; "
                             "demands are unreserved")
        if not (math.isfinite(r.scalar) and r.scalar > 0 and Resources.from_proto([r])):
            raise ValueError(f"demand {i}: resource {r.name} is {r.scalar}; it must be a "
                             "finite number of at least 0.001")
    return common_pb2.Demand(resources=Resources.from_proto(d.resources).to_proto(),
                             count=d.count, ports=d.ports)
