"""Launch tracking for the offer-broker: the LaunchRequests awaiting the master's answer,
and what to make of a master that never gives one.

A LaunchRequest is answered by the master that got it. If that master dies first (or the
request was lost on the wire), nobody will answer; the broker then reads the answer off the
state stream, where the master that recorded the tasks published them. A launch is *silent*
once the master it went to no longer leads, or once its deadline (`launch_timeout` after it
was sent) passed. A silent launch whose tasks were all seen on the stream counts as
launched (their resources stay held; the allocator counts them from the stream). A launch
whose deadline passed with its tasks still unseen counts as refused. A master change pushes
every deadline to at least `launch_timeout` from then: agents re-register with the new
master within that window, and their tasks appear on its stream. Should the tasks appear
even later, the master only launched on resources the agent really has, and the allocator
counts them when they do.

Pure: events and `now` in, resolutions out; the table is bounded by the launches in flight.
"""

from __future__ import annotations

import dataclasses
import heapq
import math
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Literal

from services.broker.table import OfferState, OfferTable
from services.resources import Resources

Outcome = Literal["launched", "refused"]


@dataclass(frozen=True)
class PendingLaunch:
    """A validated ACCEPT whose LaunchRequest awaits the master's LaunchResult."""

    request_id: str
    framework_id: str
    agent_id: str
    offer_ids: tuple[str, ...]
    resources: Resources  # what the tasks use: held until the master answers
    task_ids: tuple[str, ...]
    created_at: float
    master_epoch: int | None = None  # the master it was sent to (None: none known)


@dataclass
class _Tracked:
    launch: PendingLaunch
    deadline: float  # math.inf: never silent by time
    unseen: set[str]  # its task ids not yet seen on the state stream


@dataclass
class LaunchTracker:
    """The launches in flight, by request id, with their deadlines and unseen tasks."""

    timeout: float | None = 60.0  # None or 0: a launch never goes silent by time
    master_epoch: int | None = None  # the leading master, as last told
    _launches: dict[str, _Tracked] = field(default_factory=dict)
    _by_task: dict[tuple[str, str], set[str]] = field(default_factory=dict)  # unseen -> rids
    _by_agent: dict[str, set[str]] = field(default_factory=dict)  # agent id -> rids
    _deadlines: list[tuple[float, str]] = field(default_factory=list)  # heap, lazy deletion
    _orphans: set[str] = field(default_factory=set)  # sent to a master that no longer leads

    def __len__(self) -> int:
        return len(self._launches)

    def pending(self) -> dict[str, PendingLaunch]:
        return {rid: t.launch for rid, t in self._launches.items()}

    def held_on(self, agent_id: str) -> Resources:
        """What the launches in flight on this agent use (by an index: a scan of every
        launch per offer checked was 15 of 21 broker CPU-s at 100,000 tasks)."""
        rids = self._by_agent.get(agent_id)
        if not rids:
            return Resources()
        return Resources.total(self._launches[rid].launch.resources for rid in rids)

    def deadline(self, request_id: str) -> float | None:
        t = self._launches.get(request_id)
        return None if t is None else t.deadline

    # -- events --------------------------------------------------------------------------
    def add(self, launch: PendingLaunch, now: float) -> PendingLaunch:
        """A LaunchRequest leaves now, to the current master: track it."""
        launch = dataclasses.replace(launch, master_epoch=self.master_epoch)
        tracked = _Tracked(launch, self._from(now), set(launch.task_ids))
        self._launches[launch.request_id] = tracked
        self._by_agent.setdefault(launch.agent_id, set()).add(launch.request_id)
        for tid in tracked.unseen:
            self._by_task.setdefault((launch.framework_id, tid), set()).add(launch.request_id)
        self._push(tracked)
        return launch

    def pop(self, request_id: str) -> PendingLaunch | None:
        """The launch is answered (or abandoned): stop tracking it."""
        t = self._launches.pop(request_id, None)
        if t is None:
            return None
        on_agent = self._by_agent.get(t.launch.agent_id)
        if on_agent is not None:
            on_agent.discard(request_id)
            if not on_agent:
                del self._by_agent[t.launch.agent_id]
        for tid in t.unseen:
            self._unindex((t.launch.framework_id, tid), request_id)
        self._orphans.discard(request_id)
        return t.launch

    def clear(self) -> None:
        self._launches.clear()
        self._by_task.clear()
        self._by_agent.clear()
        self._deadlines.clear()
        self._orphans.clear()

    def master_changed(self, epoch: int | None, now: float) -> int:
        """A new master leads (None: none does). Every launch gets at least `timeout` from
        now for its tasks to show up on the new master's stream. Returns how many launches
        the change orphaned (0 when the master did not change)."""
        if epoch == self.master_epoch:
            return 0
        self.master_epoch = epoch
        later = self._from(now)
        for t in self._launches.values():
            if later > t.deadline:
                t.deadline = later
                self._push(t)
        self._orphans = {rid for rid, t in self._launches.items()
                         if t.launch.master_epoch != epoch}
        return len(self._orphans)

    def tasks_seen(self, keys: Iterable[tuple[str, str]]) -> None:
        """These (framework id, task id) are on the state stream."""
        for key in keys:
            for rid in self._by_task.pop(key, ()):
                self._launches[rid].unseen.discard(key[1])

    def resolve(self, now: float) -> list[tuple[PendingLaunch, Outcome]]:
        """The launches the master will not answer, and what they count as: silent ones
        whose tasks were all seen are launched; those past their deadline, refused. The
        resolved launches are no longer tracked."""
        due = set()
        while (when := self.next_deadline()) is not None and when <= now:
            due.add(heapq.heappop(self._deadlines)[1])
        out: list[tuple[PendingLaunch, Outcome]] = []
        for rid in sorted(due | {r for r in self._orphans if not self._launches[r].unseen}):
            t = self._launches[rid]
            out.append((t.launch, "refused" if t.unseen else "launched"))
        for launch, _ in out:
            self.pop(launch.request_id)
        return out

    def next_deadline(self) -> float | None:
        """When `resolve` may next have something to do by time alone."""
        while self._deadlines:
            when, rid = self._deadlines[0]
            t = self._launches.get(rid)
            if t is not None and t.deadline == when:
                return when
            heapq.heappop(self._deadlines)
        return None

    # -- helpers -------------------------------------------------------------------------
    def _from(self, now: float) -> float:
        return now + self.timeout if self.timeout else math.inf

    def _unindex(self, key: tuple[str, str], request_id: str) -> None:
        rids = self._by_task.get(key)
        if rids is not None:
            rids.discard(request_id)
            if not rids:
                del self._by_task[key]

    def _push(self, t: _Tracked) -> None:
        if not math.isinf(t.deadline):
            heapq.heappush(self._deadlines, (t.deadline, t.launch.request_id))

    def validate(self, table: OfferTable | None = None) -> None:
        """Invariants, checked after every step in tests; with the broker's `table`, also
        that the launches and the LAUNCHING offers are the same, each in one launch of its
        agent and framework."""
        if table is not None:
            pending = self.pending()
            launching = [i for p in pending.values() for i in p.offer_ids]
            assert len(launching) == len(set(launching)), "an offer in two launches"
            assert set(launching) == {i for i, s in table.states.items()
                                      if s is OfferState.LAUNCHING}
            for p in pending.values():
                assert all(table.offers[i].agent_id == p.agent_id
                           and table.offers[i].framework_id == p.framework_id
                           for i in p.offer_ids)
        index: dict[tuple[str, str], set[str]] = {}
        for rid, t in self._launches.items():
            for tid in t.unseen:
                index.setdefault((t.launch.framework_id, tid), set()).add(rid)
        assert index == self._by_task, "the unseen-task index drifted"
        by_agent: dict[str, set[str]] = {}
        for rid, t in self._launches.items():
            by_agent.setdefault(t.launch.agent_id, set()).add(rid)
        assert by_agent == self._by_agent, "the agent index drifted"
        for rid, t in self._launches.items():
            assert rid == t.launch.request_id
            assert t.unseen <= set(t.launch.task_ids)
            assert t.deadline >= t.launch.created_at
            if not math.isinf(t.deadline):
                assert (t.deadline, rid) in self._deadlines, f"{rid}: deadline not scheduled"
        assert self._orphans == {rid for rid, t in self._launches.items()
                                 if t.launch.master_epoch != self.master_epoch}
