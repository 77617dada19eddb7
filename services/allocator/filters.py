"""Decline filters, by framework and agent, and the heap of their expiries: what refuses an
offer now, which filters ended by a given time (so a cycle revisits just their agents),
and when the next one ends (the shell's wake-up). Pure: time is an argument."""

from __future__ import annotations

import heapq
from collections.abc import Container, Iterator

from services.allocator.model import Filter

NONE: dict[str, list[Filter]] = {}  # an agent without filters (never modified)


class DeclineFilters:
    """agent -> framework -> filters in force (what a cycle looks up, agent by agent), the
    agents each framework has filters on, and a heap of (expiry, seq, filter).

    Removing filters (revive, a framework or agent gone) leaves their heap entries behind;
    an entry is dead once its filter is no longer in the table. Dead entries are dropped as
    they reach the top, and the heap is compacted whenever it doubles, so it stays within
    twice the live filters (+64)."""

    def __init__(self) -> None:
        self.by_agent: dict[str, dict[str, list[Filter]]] = {}
        self.agents_of: dict[str, set[str]] = {}  # framework -> agents it has filters on
        self.heap: list[tuple[float, int, Filter]] = []
        self._compact_at = 64  # the heap's size that triggers dropping dead entries
        self._seq = 0

    def add(self, flt: Filter) -> None:
        self.by_agent.setdefault(flt.agent_id, {}).setdefault(
            flt.framework_id, []).append(flt)
        self.agents_of.setdefault(flt.framework_id, set()).add(flt.agent_id)
        self._seq += 1
        heapq.heappush(self.heap, (flt.expires_at, self._seq, flt))
        if len(self.heap) > self._compact_at:
            self.heap = [e for e in self.heap if self._live(e[2])]
            heapq.heapify(self.heap)
            self._compact_at = 2 * len(self.heap) + 64

    def on(self, agent_id: str) -> dict[str, list[Filter]]:
        """The agent's filters in force, by framework (do not modify)."""
        return self.by_agent.get(agent_id, NONE)

    def of(self, framework_id: str) -> Iterator[tuple[str, list[Filter]]]:
        """(agent, filters) of the framework's filters in force."""
        for agent_id in self.agents_of.get(framework_id, ()):
            yield agent_id, self.by_agent[agent_id][framework_id]

    def filtered_agents(self, framework_id: str) -> int:
        """On how many agents the framework has filters in force."""
        return len(self.agents_of.get(framework_id, ()))

    def drop_framework(self, framework_id: str) -> None:
        for agent_id in self.agents_of.pop(framework_id, ()):
            self._unlink(agent_id, framework_id)

    def drop_agent(self, agent_id: str) -> None:
        for fid in self.by_agent.pop(agent_id, {}):
            agents = self.agents_of[fid]
            agents.discard(agent_id)
            if not agents:
                del self.agents_of[fid]

    def expire(self, now: float) -> Iterator[Filter]:
        """Remove and yield each filter in force that ended by `now`."""
        heap = self.heap
        while heap and heap[0][0] <= now:
            flt = heapq.heappop(heap)[2]
            by_fw = self.by_agent.get(flt.agent_id)
            flts = by_fw.get(flt.framework_id) if by_fw else None
            if not flts or flt not in flts:
                continue  # already gone: revive, or its agent or framework was removed
            flts.remove(flt)
            if not flts:
                self._unlink(flt.agent_id, flt.framework_id)
                agents = self.agents_of[flt.framework_id]
                agents.discard(flt.agent_id)
                if not agents:
                    del self.agents_of[flt.framework_id]
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

    def _unlink(self, agent_id: str, framework_id: str) -> None:
        by_fw = self.by_agent[agent_id]
        del by_fw[framework_id]
        if not by_fw:
            del self.by_agent[agent_id]

    def _live(self, flt: Filter) -> bool:
        by_fw = self.by_agent.get(flt.agent_id)
        flts = by_fw.get(flt.framework_id) if by_fw else None
        return bool(flts) and any(f is flt for f in flts)  # type: ignore[union-attr]

    def __contains__(self, framework_id: object) -> bool:
        """Whether the framework has a filter in the table."""
        return framework_id in self.agents_of

    def __len__(self) -> int:
        return sum(len(flts) for by_fw in self.by_agent.values() for flts in by_fw.values())

    def validate(self, agents: Container[str], frameworks: Container[str]) -> None:
        pairs = set()
        for agent_id, by_fw in self.by_agent.items():
            assert agent_id in agents, f"filter for unknown agent {agent_id}"
            assert by_fw, f"empty filter table of {agent_id}"
            for fid, flts in by_fw.items():
                assert fid in frameworks, f"filter for unknown framework {fid}"
                assert flts and all(f.framework_id == fid and f.agent_id == agent_id
                                    for f in flts)
                pairs.add((fid, agent_id))
        assert pairs == {(f, a) for f, agents_ in self.agents_of.items() for a in agents_}
        assert all(self.agents_of.values())
        assert len(self.heap) <= self._compact_at, (len(self.heap), self._compact_at)
