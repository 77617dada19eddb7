"""Revocation, in the master's core: the allocator (through the broker) asks that a framework
running above its fair share give back resources on one agent to a framework below its
share (InternalMessage.RevokeResources). The master picks that framework's youngest tasks
there that together hold the resources (its revocable ones first: launched on an offer beyond
its guaranteed share, TaskInfo.revocable), tells the framework (SchedulerEvent.Revoke), and when
the grace period has passed kills those still needed (TASK_KILLED, REASON_TASK_REVOKED).

Rules:
- Only the scalars cpus, mem, disk and gpus are revoked (whatever their role); ports and
  other resources in the request are ignored.
- Ignored (a Notice, counted): a framework/agent pair with a revocation pending, an unknown
  framework, an agent not registered and reachable, nothing revocable asked, a grace that is
  not a finite number >= 0, and tasks there (those not already being killed) that cannot
  cover what is asked.
- At the deadline, what the framework's tasks on that agent have freed since the revocation
  (ended, e.g. killed by the framework during the grace, or being killed) counts: of the
  chosen tasks still live, youngest first, only as many are killed as are still needed (none
  when enough was freed).
- At most one revocation per framework/agent pair; one is dropped when its framework is
  removed or its agent becomes unreachable or gone (the allocator asks again if it must).
  Not kept across master failovers.

`Revocations` is the pure table; `RevocationHandlers` the core's side of it."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from schemas import internal_pb2, scheduler_pb2
from services import tasks
from services.master.commands import Command, ToFramework
from services.master.records import REGISTERED, Reason, Task, parse_resources
from services.master.state import MasterState
from services.notice import Notice
from services.resources import UNRESERVED, Resources

REVOKED_SCALARS = frozenset({"cpus", "mem", "disk", "gpus"})
Pair = tuple[str, str]  # (framework_id, agent_id)


def revocable(res: Resources) -> Resources:
    """The revocable scalars of `res`, their roles stripped."""
    q = res.quantities().with_role(UNRESERVED)
    return Resources({k: v for k, v in q.scalars.items() if k[0] in REVOKED_SCALARS})


def short_of(need: Resources, have: Resources) -> Resources:
    """What `have` lacks of `need`, scalar by scalar (never negative)."""
    return Resources({k: v - have.scalars.get(k, 0) for k, v in need.scalars.items()
                      if v > have.scalars.get(k, 0)})


def youngest_first(candidates: list[Task]) -> list[Task]:
    """Revocable tasks (TaskInfo.revocable) first, each kind youngest first."""
    return sorted(candidates, key=lambda t: (t.info.revocable, t.launched_at, t.info.task_id),
                  reverse=True)


def choose(need: Resources, candidates: list[Task]) -> list[Task] | None:
    """The first of `candidates` (youngest_first) that together hold `need` (revocable
    scalars), or None when all of them cannot."""
    chosen: list[Task] = []
    missing = need
    for task in youngest_first(candidates):
        if not missing:
            break
        gives = revocable(task.resources)
        if gives.scalars.keys() & missing.scalars.keys():
            chosen.append(task)
            missing = short_of(missing, gives)
    return None if missing else chosen


@dataclass
class Revocation:
    framework_id: str
    agent_id: str
    need: Resources  # revocable scalars
    chosen: list[Task]  # youngest first
    # Every live task of the framework on the agent when it was asked: what those that end
    # before the deadline held counts as freed. (The records themselves: a task id reused
    # after its task ended is another record.)
    held: list[Task]
    deadline: float
    for_framework_id: str = ""
    reason: str = ""


@dataclass
class Revocations:
    """Pending revocations, one per framework/agent pair, and what was counted."""

    pending: dict[Pair, Revocation] = field(default_factory=dict)
    requested: int = 0
    ignored: int = 0
    tasks_revoked: int = 0

    def add(self, rev: Revocation) -> None:
        assert (rev.framework_id, rev.agent_id) not in self.pending
        self.pending[(rev.framework_id, rev.agent_id)] = rev
        self.requested += 1

    def due(self, now: float) -> list[Revocation]:
        """Those whose deadline has come, removed, earliest first."""
        ready = sorted((r for r in self.pending.values() if r.deadline <= now),
                       key=lambda r: (r.deadline, r.framework_id, r.agent_id))
        for r in ready:
            del self.pending[(r.framework_id, r.agent_id)]
        return ready

    def next_deadline(self) -> float | None:
        return min((r.deadline for r in self.pending.values()), default=None)

    def drop_framework(self, framework_id: str) -> None:
        for pair in [p for p in self.pending if p[0] == framework_id]:
            del self.pending[pair]

    def drop_agent(self, agent_id: str) -> None:
        for pair in [p for p in self.pending if p[1] == agent_id]:
            del self.pending[pair]


class RevocationHandlers(MasterState):
    revocations: Revocations

    def _revoke(self, req: internal_pb2.InternalMessage.RevokeResources) -> list[Command]:
        fid, aid = req.framework_id, req.agent_id

        def ignore(why: str) -> list[Command]:
            self.revocations.ignored += 1
            self._notices.append(Notice.of(
                "revocation_ignored", f"revocation of {fid!r} on agent {aid!r} ignored: {why}",
                "info", framework_id=fid, agent_id=aid, why=why))
            return []

        if (fid, aid) in self.revocations.pending:
            return ignore("one is pending for this framework and agent")
        fw = self.frameworks.get(fid)
        if fw is None:
            return ignore("unknown framework")
        agent = self.agents.get(aid)
        if agent is None or not agent.reachable:
            return ignore("agent not registered and reachable")
        if not (math.isfinite(req.grace_s) and req.grace_s >= 0):
            return ignore(f"grace_s {req.grace_s} is not a finite number >= 0")
        try:
            need = revocable(parse_resources(req.resources))
        except ValueError as exc:
            return ignore(f"invalid resources: {exc}")
        if not need:
            return ignore("no cpus, mem, disk or gpus asked")
        mine = [self.tasks[k] for k in sorted(agent.tasks) if k[0] == fid]
        chosen = choose(need, [t for t in mine if t.state != tasks.KILLING])
        if chosen is None:
            return ignore(f"its tasks there cannot cover {need}")
        rev = Revocation(fid, aid, need, chosen, mine, self._now + req.grace_s,
                         req.for_framework_id, req.reason)
        self.revocations.add(rev)
        self._notices.append(Notice.of(
            "revocation_requested", f"framework {fid} gives back {need} on agent {aid} to "
            f"{req.for_framework_id or '?'}: {len(chosen)} tasks, in {req.grace_s:g} s",
            "info", framework_id=fid, agent_id=aid, for_framework_id=req.for_framework_id,
            tasks=len(chosen)))
        if fw.peer is None:
            return []
        why = f" ({req.reason})" if req.reason else ""
        return [ToFramework(fw.peer, fid, scheduler_pb2.SchedulerEvent(
            revoke=scheduler_pb2.SchedulerEvent.Revoke(
                agent_id=aid, task_ids=[t.info.task_id for t in chosen], grace_s=req.grace_s,
                message=f"framework {fid} runs above its fair share and framework "
                        f"{req.for_framework_id or '?'}, below its share, needs {need} on "
                        f"agent {aid}{why}: these tasks are killed in {req.grace_s:g} s "
                        "unless the framework frees as much there first")))]

    def _revocations_due(self) -> list[Command]:
        out: list[Command] = []
        for rev in self.revocations.due(self._now):
            # Ended, or being killed (by the framework, most likely): freed, or about to be.
            ended = [t for t in rev.held if tasks.is_terminal(t.state) or t.state == tasks.KILLING]
            missing = short_of(rev.need, Resources.total(revocable(t.resources) for t in ended))
            kill: list[Task] = []
            for task in rev.chosen:
                if not missing:
                    break
                if task not in ended:
                    kill.append(task)
                    missing = short_of(missing, revocable(task.resources))
            for task in kill:
                out += self._kill(task, None, Reason.REASON_TASK_REVOKED,
                                  f"revoked for framework {rev.for_framework_id or '?'}")
            self.revocations.tasks_revoked += len(kill)
            self._notices.append(Notice.of(
                "revocation_done", f"revocation of {rev.framework_id} on agent "
                f"{rev.agent_id}: {len(kill)} tasks killed ({len(ended)} ended meanwhile)",
                "info", framework_id=rev.framework_id, agent_id=rev.agent_id,
                killed=len(kill), ended=len(ended)))
        return out

    def validate(self) -> None:
        super().validate()
        for (fid, aid), rev in self.revocations.pending.items():
            assert (rev.framework_id, rev.agent_id) == (fid, aid)
            assert fid in self.frameworks, f"revocation of removed framework {fid}"
            agent = self.agents.get(aid)
            assert agent is not None and agent.status == REGISTERED, \
                f"revocation on agent {aid}, not registered"
            assert rev.need and all(t in rev.held for t in rev.chosen)
            assert all(t.framework_id == fid and t.agent_id == aid for t in rev.held)
            assert math.isfinite(rev.deadline)
