"""The bound on one framework's outstanding offers (`max_offers_per_framework`): on how many
agents each framework holds offers not yet answered, whether it may be offered one more
agent, and which frameworks held back by the bound may be offered again once they answered.

A new framework is not offered every free agent of the cluster at once (10,000 offers, one
message, 9,999 declines to recover at 10,000 agents) but at most `bound` agents; the rest go
to other frameworks or stay idle. As it answers (an offer declined or recovered, used by a
task, its agent gone) it falls below the bound and is made fresh again (AllocatorCore), so
the incremental cycle offers it the idle agents it was held back from: a framework still
walks the whole cluster, page by page. Offers on an agent where it already holds one do
not count again (more tasks of its declared demand there). A framework that has answered
no offer yet gets a first page of at most FIRST_PAGE agents (slow start, as TCP's): its
first offers come after a cycle of FIRST_PAGE agents, not `bound` (at 10,000 agents
subscribe -> first offer went from ~0.45 s to ~0.1 s); its first answer opens the full bound.
Pure: the core tells it what happened; bound 0 = no bound (every agent at once, as Mesos),
and nothing is tracked."""

from __future__ import annotations

from collections.abc import Mapping

from services.allocator.model import Agent

# Large enough that a framework launching on many agents keeps a full pipeline of offers
# (a few cycles' worth at the launch rates bench.scale measures), small enough that a new
# framework's first offers cost ~0.1 s of allocator and broker CPU rather than ~2.5 s at
# 10,000 agents (DESIGN §8).
DEFAULT_MAX_OFFERS_PER_FRAMEWORK = 1000
FIRST_PAGE = 100  # agents offered to a framework before its first answer (at most `bound`)


class Fanout:
    """Per framework, the agents it holds offers on (kept only while there is a bound)."""

    def __init__(self, bound: int = DEFAULT_MAX_OFFERS_PER_FRAMEWORK) -> None:
        if bound < 0:
            raise ValueError(f"max offers per framework must be >= 0, got {bound}")
        self.bound = bound
        self.on: dict[str, set[str]] = {}  # framework -> agents with its offers outstanding
        self.held_back: set[str] = set()  # passed over at its bound since it last answered
        self.answered: set[str] = set()  # frameworks past their first page (known ones)

    def limit(self, fid: str) -> int:
        """The framework's bound now: FIRST_PAGE until it answers an offer."""
        return self.bound if fid in self.answered else min(self.bound, FIRST_PAGE)

    def full(self, fid: str, agent: Agent) -> bool:
        """At its bound: not to be offered this agent (unless it holds an offer there)."""
        if not self.bound:
            return False
        on = self.on.get(fid)
        return on is not None and len(on) >= self.limit(fid) and fid not in agent.offered

    def holds_back(self, fid: str, agent: Agent) -> bool:
        """As `full`, and if so remembers that the framework was passed over for it."""
        if self.full(fid, agent):
            self.held_back.add(fid)
            return True
        return False

    def at_bound(self, fid: str) -> bool:
        on = self.on.get(fid)
        return bool(self.bound) and on is not None and len(on) >= self.limit(fid)

    def note(self, fid: str, agent: Agent) -> bool:
        """The framework's offers on the agent changed (made, answered, used): whether it
        was held back and may now be offered again (the core makes it fresh)."""
        if not self.bound:
            return False
        if fid in agent.offered:
            self.on.setdefault(fid, set()).add(agent.agent_id)
            return False
        return self.forget(fid, agent.agent_id)

    def forget(self, fid: str, agent_id: str) -> bool:
        """Its offers on the agent are gone: as `note`."""
        on = self.on.get(fid)
        if on is None or agent_id not in on:
            return False
        on.discard(agent_id)
        if not on:
            del self.on[fid]
        self.answered.add(fid)
        if fid in self.held_back and len(on) < self.limit(fid):
            self.held_back.discard(fid)
            return True
        return False

    def drop(self, fid: str) -> None:
        """The framework is gone."""
        self.on.pop(fid, None)
        self.held_back.discard(fid)
        self.answered.discard(fid)

    def validate(self, agents: Mapping[str, Agent], frameworks: Mapping[str, object]) -> None:
        """Invariants: exactly the agents holding each framework's offers, never more than
        the bound, only known frameworks."""
        if not self.bound:
            assert not self.on and not self.held_back and not self.answered
            return
        assert self.held_back <= frameworks.keys() and self.answered <= frameworks.keys()
        assert all(self.at_bound(fid) for fid in self.held_back), self.held_back
        actual: dict[str, set[str]] = {}
        for agent_id, agent in agents.items():
            for fid in agent.offered:
                actual.setdefault(fid, set()).add(agent_id)
        assert self.on == actual, (self.on, actual)
        for fid, on in self.on.items():
            assert len(on) <= self.limit(fid), f"{fid} holds offers on {len(on)} agents"
