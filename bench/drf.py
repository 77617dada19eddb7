"""DRF, measured against its definition: an independent progressive filling (Ghodsi et al.,
NSDI 2011) as the reference, and greedy frameworks driving an AllocatorCore as the broker,
the master and schedulers would (launch what offers hold, decline the rest, rescind what is
reclaimed, kill the youngest tasks a revocation names). Shared by `python -m bench fairness`
and the allocator's fair-share tests."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from services.allocator.core import AllocatorCore, Cycle
from services.allocator.fill import Shape
from services.resources import Resources

DRF_NAMES = ("cpus", "mem", "disk", "gpus")


def progressive_filling(agents: Mapping[str, Resources],
                        fws: Mapping[str, tuple[Resources, float]],
                        want: Mapping[str, int] | None = None) -> dict[str, int]:
    """Tasks per framework ({name: (task, weight)}) on these agents: repeatedly one task to
    the framework with the lowest weighted dominant share whose task still fits some agent
    (the first in order), until no task fits (or each has `want`). Ties: by name."""
    free = dict(agents)
    total = Resources.total(agents.values())
    names = [n for n in DRF_NAMES if total.scalar(n)]
    counts = dict.fromkeys(fws, 0)

    def key(f: str) -> float:
        task, w = fws[f]
        return max(counts[f] * task.scalar(n) / total.scalar(n) for n in names) / w

    while True:
        fits = [f for f in fws if (want is None or counts[f] < want[f])
                and any(r.contains(fws[f][0]) for r in free.values())]
        if not fits:
            return counts
        f = min(fits, key=lambda f: (key(f), f))
        agent = next(a for a, r in free.items() if r.contains(fws[f][0]))
        free[agent] -= fws[f][0]
        counts[f] += 1


def dominant_share(task: Resources, count: int, total: Resources) -> float:
    return max((count * task.scalar(n) / total.scalar(n) for n in DRF_NAMES
                if total.scalar(n)), default=0.0)


@dataclass
class Greedy:
    fid: str
    task: Resources
    want: int
    tasks: list[tuple[str, int]] = field(default_factory=list)  # (agent, seq), oldest first


class GreedyCluster:
    """An AllocatorCore and greedy frameworks. `declare=False` frameworks never say what
    they want: they are offered as Mesos would (whole agents in DRF order)."""

    def __init__(self, agents: Mapping[str, Resources], grace: float | None = 5.0) -> None:
        self.core = AllocatorCore(revocation_grace_s=grace)
        for aid, total in agents.items():
            self.core.agent_added(aid, aid, total)
        self.fws: dict[str, Greedy] = {}
        self.now = 0.0
        self.seq = 0
        self.cycles = 0
        self.reclaims = 0
        self.revoked = 0

    def add(self, fid: str, task: Resources, want: int, weight: float = 1.0,
            declare: bool = True) -> None:
        self.core.set_weight(fid, weight)
        self.core.framework_added(fid, role=fid)
        if declare:
            self.core.demand(fid, [Shape.of(task, want)])
        self.fws[fid] = Greedy(fid, task, want)

    def count(self, fid: str) -> int:
        return len(self.fws[fid].tasks)

    def settle(self, rounds: int = 200, validate: bool = False, quiet: int = 0) -> None:
        """Cycles until nothing moves and no deadline is pending (time jumps to each), or,
        with `quiet`, until that many cycles in a row started, ended and reclaimed nothing
        (frameworks of unknown demand decline what they cannot use, and are offered it
        again as their filters end, forever)."""
        still = 0
        for _ in range(rounds):
            before = (self.seq, self.revoked, self.reclaims)
            cycle = self.core.allocate(self.now)
            self.cycles += 1
            if validate:
                self.core.validate()
            self._answer(cycle)
            if validate:
                self.core.validate()
            still = still + 1 if (self.seq, self.revoked, self.reclaims) == before else 0
            if quiet and still >= quiet and not cycle.revocations:
                return
            if not (cycle.allocations or cycle.reclaims or cycle.revocations):
                deadline = self.core.next_deadline(self.now)
                if deadline is None:
                    return
                self.now = deadline
            self.now += 0.1
        raise AssertionError(f"did not settle in {rounds} cycles")

    def _answer(self, cycle: Cycle) -> None:
        core = self.core
        for r in cycle.reclaims:  # the broker rescinds: recovered without a filter
            self.reclaims += 1
            held = core.agents[r.agent_id].offered.get(r.framework_id)
            if held is not None:
                core.recover(r.agent_id, r.framework_id, held, 0, self.now)
        for a in cycle.allocations:  # schedulers launch what fits and decline the rest
            fw = self.fws[a.framework_id]
            left = a.resources
            while len(fw.tasks) < fw.want and left.contains(fw.task):
                left -= fw.task
                self.seq += 1
                fw.tasks.append((a.agent_id, self.seq))
                core.resources_used(a.agent_id, fw.fid, fw.task)
            if left:
                core.recover(a.agent_id, fw.fid, left, 1.0, self.now)
        for rv in cycle.revocations:  # the master kills the youngest tasks covering it
            fw = self.fws[rv.framework_id]
            freed = Resources()
            for t in sorted((t for t in fw.tasks if t[0] == rv.agent_id), key=lambda t: -t[1]):
                if freed.quantities().contains(rv.resources):
                    break
                fw.tasks.remove(t)
                freed += fw.task
                self.revoked += 1
                core.resources_released(rv.agent_id, fw.fid, fw.task)
