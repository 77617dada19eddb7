"""Decline filters, by framework and agent, and the heap of their expiries: what refuses an
offer now, which filters ended by a given time (so a cycle revisits just their agents),
and when the next one ends (the shell's wake-up). Pure: time is an argument."""

from __future__ import annotations

import heapq
from collections.abc import Iterator

from services.allocator.model import Filter
from services.resources import Resources


class DeclineFilters:
    """framework -> agent -> filters in force, and a heap of (expiry, seq, filter).

    Removing filters (revive, a framework or agent gone) leaves their heap entries behind;
    an entry is dead once its filter is no longer in the table. Dead entries are dropped as
    they reach the top, and the heap is compacted whenever it doubles, so it stays within
    twice the live filters (+64)."""

    def __init__(self) -> None:
        self.by_framework: dict[str, dict[str, list[Filter]]] = {}
        self.heap: list[tuple[float, int, Filter]] = []
        self._compact_at = 64  # the heap's size that triggers dropping dead entries
        self._seq = 0

    def add(self, flt: Filter) -> None:
        self.by_framework.setdefault(flt.framework_id, {}).setdefault(
            flt.agent_id, []).append(flt)
        self._seq += 1
        heapq.heappush(self.heap, (flt.expires_at, self._seq, flt))
        if len(self.heap) > self._compact_at:
            self.heap = [e for e in self.heap if self._live(e[2])]
            heapq.heapify(self.heap)
            self._compact_at = 2 * len(self.heap) + 64

    def refusal(self, framework_id: str, agent_id: str, offer: Resources,
                now: float) -> float | None:
        """The latest expiry among the framework's filters refusing `offer` on the agent."""
        by_agent = self.by_framework.get(framework_id)
        flts = by_agent.get(agent_id) if by_agent else None
        if not flts:
            return None
        latest = None
        for f in flts:
            if f.refuses(offer, now) and (latest is None or f.expires_at > latest):
                latest = f.expires_at
        return latest

    def of(self, framework_id: str) -> dict[str, list[Filter]]:
        """The framework's filters in force, by agent (do not modify)."""
        return self.by_framework.get(framework_id, {})

    def drop_framework(self, framework_id: str) -> None:
        self.by_framework.pop(framework_id, None)

    def drop_agent(self, agent_id: str) -> None:
        for by_agent in self.by_framework.values():
            by_agent.pop(agent_id, None)
        for fid in [f for f, by_agent in self.by_framework.items() if not by_agent]:
            del self.by_framework[fid]

    def expire(self, now: float) -> Iterator[Filter]:
        """Remove and yield each filter in force that ended by `now`."""
        heap = self.heap
        while heap and heap[0][0] <= now:
            flt = heapq.heappop(heap)[2]
            by_agent = self.by_framework.get(flt.framework_id)
            flts = by_agent.get(flt.agent_id) if by_agent else None
            if by_agent is None or not flts or flt not in flts:
                continue  # already gone: revive, or its agent or framework was removed
            flts.remove(flt)
            if not flts:
                del by_agent[flt.agent_id]
                if not by_agent:
                    del self.by_framework[flt.framework_id]
            yield flt

    def next_expiry(self, now: float) -> float | None:
        """When the earliest filter in force after `now` ends, or None. Dead entries on top
        of the heap are dropped on the way (amortised O(log n))."""
        heap = self.heap
        while heap and not self._live(heap[0][2]):
            heapq.heappop(heap)
        if heap and heap[0][0] > now:
            return heap[0][0]
        return min((e[0] for e in heap if e[0] > now and self._live(e[2])), default=None) \
            if heap else None

    def _live(self, flt: Filter) -> bool:
        by_agent = self.by_framework.get(flt.framework_id)
        flts = by_agent.get(flt.agent_id) if by_agent else None
        return bool(flts) and any(f is flt for f in flts)  # type: ignore[union-attr]

    def __contains__(self, framework_id: object) -> bool:
        """Whether the framework has a filter in the table."""
        return framework_id in self.by_framework

    def __len__(self) -> int:
        return sum(len(flts) for by_agent in self.by_framework.values()
                   for flts in by_agent.values())

    def validate(self, agents: object, frameworks: object) -> None:
        for fid, by_agent in self.by_framework.items():
            assert fid in frameworks, f"filter for unknown framework {fid}"  # type: ignore
            assert by_agent, f"empty filter table of {fid}"
            for agent_id, flts in by_agent.items():
                assert agent_id in agents, f"filter for unknown agent {agent_id}"  # type: ignore
                assert flts and all(f.framework_id == fid and f.agent_id == agent_id
                                    for f in flts)
        assert len(self.heap) <= self._compact_at, (len(self.heap), self._compact_at)
