"""Agent liveness, in the master's core: when each agent was last heard from and when the
master itself was last listening; agents leaving (unreachable, gone) and the bound on the gone.

Rules (issue 10; Mesos's in brackets):
- An agent silent for `agent_timeout_s` becomes UNREACHABLE [agent_ping_timeout x
  max_agent_ping_timeouts, 75 s]: its live tasks TASK_UNREACHABLE (TASK_LOST to frameworks that
  are not partition-aware), every framework gets a Failure. Silence is judged only on evidence
  the shell read *after* the deadline (a "complete" liveness report: the front socket drained),
  so heartbeats queued behind a busy reactor never condemn their agent; and when the reports
  themselves stopped for longer than `stall_threshold_s` (the master was stalled, not the
  agents), that gap does not count against anyone.
- An agent heard again on its old connection after it was declared is asked to re-register
  (an error NOT_REGISTERED, which every agent answers with Reregister); when it does, its tasks
  are rebuilt from its report (agents.py) and those the frameworks were told are unreachable
  are told RUNNING again.
- UNREACHABLE for `agent_gone_timeout_s` becomes GONE [registry_max_agent_age]: its tasks
  TASK_GONE, and its id is never admitted again (Reregister is answered with Shutdown).
- At most `max_gone_agents` GONE agents are kept, in the tables and the registry znode
  [registry_max_agent_count]; the oldest are pruned first. A pruned agent is unknown, as in
  Mesos once the registry forgot it (reconciliation answers TASK_UNKNOWN)."""

from __future__ import annotations

import math
from collections import OrderedDict
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from schemas import bus_pb2, scheduler_pb2
from services import tasks
from services.master.commands import Command, Reject, ToFramework
from services.master.records import GONE, REGISTERED, UNREACHABLE, Agent, Reason
from services.master.state import MasterState
from services.notice import Notice

AGENT_TIMEOUT_S = 5.0  # silent this long -> unreachable (DESIGN: 1 s heartbeats x 5)
AGENT_GONE_TIMEOUT_S = 600.0  # unreachable this long -> gone
MAX_GONE_AGENTS = 1000  # gone agents remembered (tables and registry)
MAX_FORGOTTEN_PEERS = 10_000  # connections of pruned agents, remembered (memory only)


@dataclass
class LostPeer:
    """The connection an agent had when it was declared unreachable (or gone): if it is heard
    on it again, it is asked to re-register."""

    agent_id: str
    declared_at: float  # only a frame heard after this is news
    asked_at: float | None = None  # asked again at most once a heartbeat interval


class AgentLiveness(MasterState):
    def __init__(self, *args: Any, agent_timeout_s: float = AGENT_TIMEOUT_S,
                 agent_gone_timeout_s: float = AGENT_GONE_TIMEOUT_S,
                 max_gone_agents: int = MAX_GONE_AGENTS,
                 stall_threshold_s: float | None = None, **kw: Any) -> None:
        super().__init__(*args, **kw)
        self.agent_timeout_s = agent_timeout_s
        self.agent_gone_timeout_s = agent_gone_timeout_s
        self.max_gone_agents = max_gone_agents
        # Liveness reports come every fraction of a heartbeat; none for this long means the
        # master was not listening.
        self.stall_threshold_s = stall_threshold_s if stall_threshold_s is not None else max(
            1.0, 2 * self.heartbeat_interval_ms / 1000)
        self.observed_at: float | None = None  # the latest complete liveness report
        self.lost_peers: dict[bytes, LostPeer] = {}
        self._lost_peer_of: dict[str, bytes] = {}
        # Connections of pruned agents (at most MAX_FORGOTTEN_PEERS, oldest dropped): heard
        # again, they too are asked to register, or they would beat on as zombies.
        self._forgotten_peers: OrderedDict[bytes, LostPeer] = OrderedDict()
        # Lower bounds of the next agent deadlines (recomputed by _expire_agents).
        self._unreachable_check: float | None = None
        self._gone_check: float | None = None
        self._checked_at = -math.inf  # when _expire_agents last ran
        # An agent is due and only a report can tell whether it beat: the shell reports at
        # once, not at its usual pace.
        self.awaiting_report = False

    # -- evidence ----------------------------------------------------------------------------
    def _agents_heard(self, heard: Mapping[bytes, float], complete: bool) -> list[Command]:
        now = self._now
        out: list[Command] = []
        if complete:
            self._observe(now)
        for peer, at in heard.items():
            at = min(at, now)
            aid = self.agent_peers.get(peer)
            if aid is not None:
                agent = self.agents[aid]
                agent.last_seen = max(agent.last_seen, at)
                continue
            lost = self.lost_peers.get(peer) or self._forgotten_peers.get(peer)
            if lost is None or at <= lost.declared_at or (
                    lost.asked_at is not None
                    and now - lost.asked_at < self.heartbeat_interval_ms / 1000):
                continue
            lost.asked_at = now
            known = self.agents.get(lost.agent_id)
            status = "unknown" if known is None else "gone" if known.status == GONE \
                else "unreachable"
            out.append(Reject(peer, bus_pb2.NOT_REGISTERED, f"agent {lost.agent_id} is "
                              f"{status} on this master; re-register"))
        if self.awaiting_report or any(t <= now for t in self._liveness_deadlines()):
            out += self._expire_agents()  # else no agent is due: its checks are lower bounds
        return out

    def _observe(self, now: float) -> None:
        """A complete report at `now`: the master was listening. After a gap far longer than
        reports come (a stalled master), that gap does not count against any agent."""
        prev = self.observed_at
        self.observed_at = now if prev is None else max(prev, now)
        if prev is None or now - prev <= self.stall_threshold_s:
            return
        gap = now - prev
        shifted = 0
        for agent in self.agents.values():
            if agent.status == REGISTERED and agent.last_seen < now:
                agent.last_seen = min(agent.last_seen + gap, now)
                shifted += 1
        self._notice("master_stalled", f"no liveness report for {gap:.1f} s (more than "
                     f"{self.stall_threshold_s:g} s): the master was not listening; "
                     f"{shifted} agents get that time back", gap_s=round(gap, 3))

    def _expire_agents(self) -> list[Command]:
        """Agents silent past the timeout (as of the latest complete report) -> unreachable;
        unreachable past the gone timeout -> gone. Recomputes the next deadlines."""
        now = self._checked_at = self._now
        seen = self.observed_at
        silent: list[Agent] = []
        expired: list[Agent] = []
        next_silent = next_gone = math.inf
        self.awaiting_report = False
        for agent in self.agents.values():
            if agent.status == REGISTERED:
                due = agent.last_seen + self.agent_timeout_s
                if seen is not None and due <= seen:
                    silent.append(agent)
                elif due > now:
                    next_silent = min(next_silent, due)
                else:  # due, but no report read since: the next one decides
                    self.awaiting_report = True
            elif agent.status == UNREACHABLE:
                due = agent.unreachable_since + self.agent_gone_timeout_s
                if due <= now:
                    expired.append(agent)
                else:
                    next_gone = min(next_gone, due)
        self._unreachable_check = next_silent if next_silent < math.inf else None
        self._gone_check = next_gone if next_gone < math.inf else None
        out: list[Command] = []  # (the transitions lower the checks they need)
        for agent in sorted(silent, key=lambda a: a.agent_id):
            out += self._agent_unreachable(
                agent, f"agent {agent.agent_id} was silent for more than "
                f"{self.agent_timeout_s:g} s")
        for agent in sorted(expired, key=lambda a: a.agent_id):
            out += self._agent_gone(
                agent, tasks.GONE, Reason.REASON_AGENT_REMOVED,
                f"agent {agent.agent_id} was unreachable for more than "
                f"{self.agent_gone_timeout_s:g} s")
        return out

    def _lower_checks(self, unreachable: float | None = None, gone: float | None = None,
                      ) -> None:
        if unreachable is not None:
            self._unreachable_check = unreachable if self._unreachable_check is None else min(
                self._unreachable_check, unreachable)
        if gone is not None:
            self._gone_check = gone if self._gone_check is None else min(self._gone_check,
                                                                         gone)

    def watched_peers(self) -> list[bytes]:
        """The connections whose liveness the shell reports: agents', and those lost."""
        return [*self.agent_peers, *self.lost_peers, *self._forgotten_peers]

    def _liveness_deadlines(self) -> list[float]:
        return [t for t in (self._unreachable_check, self._gone_check) if t is not None]

    def _agent_back(self, agent: Agent, peer: bytes) -> None:
        """(Re-)admitted on `peer`: heard now, nothing lost any more."""
        agent.last_seen = max(agent.last_seen, self._now)
        self._forget_lost_peer(agent.agent_id)
        old = self.lost_peers.pop(peer, None)
        if old is not None:
            self._lost_peer_of.pop(old.agent_id, None)
        self._forgotten_peers.pop(peer, None)
        self._lower_checks(unreachable=agent.last_seen + self.agent_timeout_s)

    def _forget_lost_peer(self, agent_id: str) -> None:
        peer = self._lost_peer_of.pop(agent_id, None)
        if peer is not None:
            self.lost_peers.pop(peer, None)

    # -- agents leaving ----------------------------------------------------------------------
    def _agent_unreachable(self, agent: Agent, why: str) -> list[Command]:
        """Silent (or replaced on its connection): its live tasks become TASK_UNREACHABLE
        (told as TASK_LOST to frameworks that are not partition-aware); resources stay
        counted until it is back or gone."""
        if agent.status != REGISTERED:
            return []
        self._remember_peer(agent)
        self._unbind_agent(agent)
        agent.status = UNREACHABLE
        agent.status_since = agent.unreachable_since = self._now
        self._touch("agent", agent.agent_id)
        self._registry_changed(agent.agent_id)
        self._lower_checks(gone=self._now + self.agent_gone_timeout_s)
        for key in sorted(agent.tasks):
            task = self.tasks[key]
            if task.state != tasks.UNREACHABLE:
                self._end_task(task, tasks.UNREACHABLE, Reason.REASON_AGENT_UNREACHABLE, why,
                               unreachable_since=self._now)
        out = self._failure_to_all(agent.agent_id)
        return out + self._fail_log_requests(agent.agent_id, f"agent {agent.agent_id} is "
                                             "unreachable")

    def _agent_gone(self, agent: Agent, state: tasks.State, reason: int, why: str,
                    ) -> list[Command]:
        """Unregistered, declared gone by an operator, or unreachable too long: its tasks end
        for good, and gone agents beyond the bound are pruned."""
        was_registered = agent.status == REGISTERED
        if was_registered:
            self._remember_peer(agent)
        self._unbind_agent(agent)
        agent.status = GONE
        agent.status_since = self._now
        self._touch("agent", agent.agent_id)
        self._registry_changed(agent.agent_id)
        for key in sorted(agent.tasks):
            self._end_task(self.tasks[key], state, reason, why)  # type: ignore[arg-type]
        out = self._failure_to_all(agent.agent_id) if was_registered else []
        out += self._fail_log_requests(agent.agent_id, f"agent {agent.agent_id} is gone")
        self._prune_gone()
        return out

    def _remember_peer(self, agent: Agent) -> None:
        if agent.peer is None:
            return
        self._forget_lost_peer(agent.agent_id)
        self.lost_peers[agent.peer] = LostPeer(agent.agent_id, declared_at=self._now)
        self._lost_peer_of[agent.agent_id] = agent.peer

    def _failure_to_all(self, agent_id: str) -> list[Command]:
        ev = scheduler_pb2.SchedulerEvent(
            failure=scheduler_pb2.SchedulerEvent.Failure(agent_id=agent_id))
        return [ToFramework(fw.peer, fw.framework_id, ev)
                for fw in self.frameworks.values() if fw.peer is not None]

    def _prune_gone(self) -> None:
        """Keep the newest `max_gone_agents` gone agents; forget the rest (oldest first)."""
        gone = [a for a in self.agents.values() if a.status == GONE]
        excess = len(gone) - self.max_gone_agents
        if excess <= 0:
            return
        gone.sort(key=lambda a: (a.status_since, a.agent_id))
        for agent in gone[:excess]:
            del self.agents[agent.agent_id]
            peer = self._lost_peer_of.get(agent.agent_id)
            if peer is not None:
                self._forgotten_peers[peer] = self.lost_peers[peer]
            self._forget_lost_peer(agent.agent_id)
            self._touch("agent", agent.agent_id)  # published as deleted
            self._registry_changed(agent.agent_id)
        while len(self._forgotten_peers) > MAX_FORGOTTEN_PEERS:
            self._forgotten_peers.popitem(last=False)
        self._notices.append(Notice.of(
            "gone_agents_pruned", f"{excess} gone agents forgotten (at most "
            f"{self.max_gone_agents} are kept)", "info", count=excess))

    def validate(self) -> None:
        super().validate()
        assert len(self.lost_peers) == len(self._lost_peer_of)
        for peer, lost in self.lost_peers.items():
            assert self._lost_peer_of.get(lost.agent_id) == peer
            assert peer not in self.agent_peers, "a lost peer is bound again"
            assert self.agents[lost.agent_id].status in (UNREACHABLE, GONE)
        assert sum(a.status == GONE for a in self.agents.values()) <= self.max_gone_agents
        for agent in self.agents.values():
            if agent.status == REGISTERED:
                due = agent.last_seen + self.agent_timeout_s
                assert self.observed_at is None or due > self.observed_at, \
                    f"agent {agent.agent_id} is overdue but registered"
                assert due <= self._checked_at or (self._unreachable_check is not None
                                            and self._unreachable_check <= due), \
                    f"no timer for agent {agent.agent_id}"
            elif agent.status == UNREACHABLE:
                due = agent.unreachable_since + self.agent_gone_timeout_s
                assert self._gone_check is not None and self._gone_check <= due, \
                    f"no timer for unreachable agent {agent.agent_id}"
        assert len(self._forgotten_peers) <= MAX_FORGOTTEN_PEERS
        assert not self._forgotten_peers.keys() & self.agent_peers.keys()
