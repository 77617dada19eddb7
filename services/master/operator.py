"""Operator calls on the master (OperatorCall, the CLI's kill, logs, mark-gone, weights,
quotas and teardown), as a handler mixin of MasterCore; jobs are in jobs.py."""

from __future__ import annotations

import math

from schemas import agent_pb2, bus_pb2, operator_pb2, scheduler_pb2, state_pb2
from services import tasks
from services.master.agents import AgentHandlers
from services.master.commands import Command, Reject, ToAgent, ToFramework, ToOperator
from services.master.jobs import JobHandlers
from services.master.records import (
    UNREACHABLE,
    LogRequest,
    Reason,
    Task,
    parse_quota,
    quota_text,
)
from services.master.state import logs_error
from services.roles import role_error


class OperatorHandlers(AgentHandlers, JobHandlers):
    def _operator_call(self, peer: bytes, call: operator_pb2.OperatorCall, message_id: str,
                       ) -> list[Command]:
        kind = call.WhichOneof("call")

        def reject(code: int, why: str) -> list[Command]:
            return [Reject(peer, code, why, message_id)]

        def done(what: str) -> ToOperator:
            return ToOperator(peer, operator_pb2.OperatorEvent(
                done=operator_pb2.OperatorEvent.Done(message=what)), message_id)

        if kind == "kill_task":
            k = call.kill_task
            task, why = self._find_task(k.framework_id, k.task_id)
            if task is None:
                return reject(bus_pb2.NOT_FOUND if why.endswith("unknown") else bus_pb2.INVALID,
                              why)
            if tasks.is_terminal(task.state):
                return [done(f"task {k.task_id} already ended ({tasks.name(task.state)})")]
            grace = k.kill_grace_period_s if k.HasField("kill_grace_period_s") else None
            return [*self._kill(task, grace), done(f"kill of task {k.task_id} sent to agent "
                                                    f"{task.agent_id}")]
        if kind == "get_logs":
            g = call.get_logs
            task, why = self._find_task(g.framework_id, g.task_id)
            if task is None:
                return [logs_error(peer, g.task_id, g.stream, why, message_id)]
            agent = self.agents.get(task.agent_id)
            if agent is None or agent.peer is None or not agent.reachable:
                return [logs_error(peer, g.task_id, g.stream,
                                   f"agent {task.agent_id} is not reachable", message_id)]
            rid = self._new_id("logs", "L", self.log_requests)
            self.log_requests[rid] = LogRequest(peer, message_id, agent.agent_id, g.task_id,
                                                g.stream, self._now)
            return [ToAgent(agent.peer, agent.agent_id, agent_pb2.AgentEvent(
                logs_request=agent_pb2.AgentEvent.LogsRequest(
                    request_id=rid, framework_id=task.framework_id, task_id=g.task_id,
                    stream=g.stream, tail_lines=g.tail_lines, max_bytes=g.max_bytes,
                    since_bytes=g.since_bytes if g.HasField("since_bytes") else None)))]
        if kind == "mark_agent_gone":
            aid = call.mark_agent_gone.agent_id
            agent = self.agents.get(aid)
            if agent is None:
                return reject(bus_pb2.NOT_FOUND, f"agent {aid!r} is unknown"
                              + (" (still within its re-register window)"
                                 if aid in self.recovering else ""))
            if agent.status != UNREACHABLE:
                return reject(bus_pb2.INVALID, f"agent {aid} is "
                              f"{state_pb2.AgentRecord.Status.Name(agent.status)}; only an "
                              "unreachable agent can be marked gone")
            out = self._agent_gone(agent, tasks.GONE_BY_OPERATOR,
                                   Reason.REASON_AGENT_REMOVED_BY_OPERATOR,
                                   f"agent {aid} was marked gone by an operator")
            return [*out, done(f"agent {aid} marked gone")]
        if kind == "set_weight":
            sw = call.set_weight
            error = role_error(sw.role) or (
                None if math.isfinite(sw.weight) and sw.weight > 0 else
                f"weight {sw.weight} must be finite and > 0")
            if error is not None:
                return reject(bus_pb2.INVALID, f"set_weight: {error}")
            self.set_role(sw.role, weight=sw.weight)
            return [done(f"role {sw.role} weight {sw.weight:g}")]
        if kind == "set_quota":
            sq = call.set_quota
            try:
                quota = (parse_quota(sq.guarantee, "guarantee"), parse_quota(sq.limit, "limit"))
            except ValueError as exc:
                return reject(bus_pb2.INVALID, f"set_quota: {exc}")
            limits = {r.name: r.scalar for r in quota[1]}
            error = role_error(sq.role) or next(
                (f"guarantee {r.name}:{r.scalar:g} exceeds its limit" for r in quota[0]
                 if r.scalar > limits.get(r.name, r.scalar)), None)
            if error is not None:
                return reject(bus_pb2.INVALID, f"set_quota: {error}")
            self.set_role(sq.role, quota=quota)
            return [done(f"role {sq.role} quota guarantee {quota_text(quota[0]) or 'none'} "
                         f"limit {quota_text(quota[1]) or 'none'}")]
        if kind == "teardown_framework":
            fid = call.teardown_framework.framework_id
            fw = self.frameworks.get(fid)
            if fw is None:
                if fid in self.removed_frameworks:
                    return [done(f"framework {fid} was already removed")]
                return reject(bus_pb2.NOT_FOUND, f"framework {fid!r} is unknown")
            out = []
            if fw.peer is not None:  # its scheduler learns it is gone, and must not resubscribe
                out.append(ToFramework(fw.peer, fid, scheduler_pb2.SchedulerEvent(
                    error=scheduler_pb2.SchedulerEvent.Error(
                        message=f"framework {fid} ({fw.info.name}) was removed by the operator"))))
            count = len(fw.tasks)
            out += self._remove_framework(fw, "removed by the operator")
            return [*out, done(f"framework {fid} removed; {count} tasks killed")]
        return reject(bus_pb2.UNKNOWN_PAYLOAD, "OperatorCall carries no call")

    def _find_task(self, framework_id: str, task_id: str) -> tuple[Task | None, str]:
        if framework_id:
            task = self.tasks.get((framework_id, task_id))
            return (task, "") if task else (None, f"task {framework_id}/{task_id} is unknown")
        owners = sorted(self._owners(task_id))
        if len(owners) > 1:
            return None, f"task id {task_id!r} is ambiguous (frameworks {owners}); name one"
        if not owners:
            return None, f"task {task_id!r} is unknown"
        return self.tasks[(owners[0], task_id)], ""
