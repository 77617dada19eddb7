"""The framework emulator's offer policy (services/emulator/frameworks.py): exactly the set
fraction of offers accepted, as many tasks of the set shape as fit (up to the set number),
a total cap, and every other offer declined with its filter."""

from __future__ import annotations

import math

import pytest

from schemas import common_pb2
from services.emulator.agents import RUN_LABEL
from services.emulator.frameworks import Decline, Launch, OfferPolicy, Shape
from services.resources import Resources


def offer(i: int, spec: str = "cpus:1;mem:256") -> common_pb2.Offer:
    o = common_pb2.Offer(offer_id=f"o{i}", agent_id=f"S{i}")
    o.resources.extend(Resources.parse(spec).to_proto())
    return o


@pytest.mark.parametrize(("rate", "accepted"), [(0.0, 0), (0.25, 5), (0.5, 10), (1.0, 20)])
def test_the_accept_rate_is_kept_exactly(rate: float, accepted: int) -> None:
    policy = OfferPolicy("f", Shape(0.5, 64), rate, tasks_per_offer=1, refuse_s=7)
    out = policy.offers([offer(i) for i in range(20)])
    launches = [d for d in out if isinstance(d, Launch)]
    declines = [d for d in out if isinstance(d, Decline)]
    assert len(launches) == accepted
    assert sum(len(d.offer_ids) for d in declines) == 20 - accepted
    assert all(d.refuse_s == 7 for d in declines)


def test_as_many_tasks_as_fit_up_to_the_set_number_and_the_cap() -> None:
    policy = OfferPolicy("f", Shape(0.3, 64, run_s=2.0), 1.0, tasks_per_offer=5, max_tasks=4)
    out = policy.offers([offer(1), offer(2), offer(3, "cpus:0.1;mem:512")])
    launches = [d for d in out if isinstance(d, Launch)]
    assert [len(d.tasks) for d in launches] == [3, 1]  # 3 fit in 1 cpu; then the cap
    assert [t.task_id for d in launches for t in d.tasks] == ["f-1", "f-2", "f-3", "f-4"]
    t = launches[0].tasks[0]
    assert t.agent_id == "S1" and t.labels[RUN_LABEL] == "2.0"
    assert Resources.from_proto(t.resources).same(Resources.of(cpus=0.3, mem=64))
    assert [d.offer_ids for d in out if isinstance(d, Decline)] == [("o3",)]


def test_an_offer_too_small_for_one_task_is_declined() -> None:
    policy = OfferPolicy("f", Shape(2, 64, run_s=math.inf), 1.0, tasks_per_offer=1)
    out = policy.offers([offer(1)])
    assert out == [Decline(("o1",), 5.0)] and policy.launched == 0


def test_a_rate_outside_zero_to_one_is_refused() -> None:
    with pytest.raises(ValueError):
        OfferPolicy("f", Shape(), 1.5, 1)


def test_a_task_that_never_ran_is_replaced_within_the_cap() -> None:
    from services.emulator.frameworks import EmulatedFramework

    sched = EmulatedFramework(OfferPolicy("f", Shape(0.5, 64), 1.0, tasks_per_offer=2,
                                          max_tasks=2))
    out = sched.policy.offers([offer(1)])
    assert [len(d.tasks) for d in out if isinstance(d, Launch)] == [2]
    assert sched.policy.offers([offer(2)]) == [Decline(("o2",), 5.0)]  # the cap
    # f-1 ran and was killed; f-2's accept was voided (TASK_DROPPED before it ran).
    for tid, state in (("f-1", common_pb2.TASK_RUNNING), ("f-1", common_pb2.TASK_KILLED),
                       ("f-2", common_pb2.TASK_DROPPED)):
        sched.update(None, common_pb2.TaskStatus(task_id=tid, state=state))  # type: ignore[arg-type]
    assert sched.summary()["ended"] == 2
    again = sched.policy.offers([offer(3)])
    assert [[t.task_id for t in d.tasks] for d in again if isinstance(d, Launch)] == [["f-3"]]


class Driver:
    """Records the calls an EmulatedFramework makes (a stand-in for the SDK's driver)."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, object]] = []

    def accept(self, offer_ids: list[str], ops: list[common_pb2.Operation]) -> None:
        self.calls.append(("accept", offer_ids))

    def decline(self, offer_ids: list[str], refuse_seconds: float) -> None:
        self.calls.append(("decline", offer_ids))

    def reconcile(self, tasks: list[tuple[str, str]]) -> None:
        self.calls.append(("reconcile", list(tasks)))

    def revive(self) -> None:
        self.calls.append(("revive", None))

    def of(self, kind: str) -> list[object]:
        return [arg for k, arg in self.calls if k == kind]


def test_after_a_failover_launches_never_heard_of_are_reconciled_and_lost_ones_replaced() -> None:
    # The bench's launch at 10k agents stalled for good: accepts that died with a master
    # were never heard of, the framework counted them launched and declined every offer
    # (filtered for an hour) while waiting for them.
    from frameworks.sdk.scheduler import MasterInfo
    from services.emulator.frameworks import RECONCILE_S, EmulatedFramework

    now = [0.0]
    sched = EmulatedFramework(OfferPolicy("f", Shape(0.5, 64), 1.0, tasks_per_offer=2,
                                          max_tasks=4, refuse_s=3600), clock=lambda: now[0])
    d = Driver()
    info = MasterInfo("m1", 1, "")
    sched.subscribed(d, "F", info)  # type: ignore[arg-type]
    sched.offers(d, [offer(1), offer(2)])  # type: ignore[arg-type]
    sched.update(d, common_pb2.TaskStatus(task_id="f-1", state=common_pb2.TASK_RUNNING))  # type: ignore[arg-type]
    sched.offers(d, [offer(3)])  # type: ignore[arg-type]
    assert d.of("decline") == [["o3"]] and not d.of("reconcile")  # full; nothing stale yet
    sched.subscribed(d, "F", MasterInfo("m2", 2, ""))  # type: ignore[arg-type]
    assert d.of("reconcile") == [[("f-2", "S1"), ("f-3", "S2"), ("f-4", "S2")]]
    sched.offers(d, [offer(4)])  # type: ignore[arg-type]
    assert len(d.of("reconcile")) == 1  # at most every RECONCILE_S
    now[0] += RECONCILE_S
    sched.offers(d, [offer(5)])  # type: ignore[arg-type]
    assert len(d.of("reconcile")) == 2  # the master keeps silent while agents re-register
    # The master's answers: f-2 runs; f-3 is unknown to it (its accept died); f-4 too.
    for tid, state in (("f-2", common_pb2.TASK_RUNNING), ("f-3", common_pb2.TASK_UNKNOWN),
                       ("f-4", common_pb2.TASK_UNKNOWN), ("f-4", common_pb2.TASK_UNKNOWN)):
        sched.update(d, common_pb2.TaskStatus(task_id=tid, state=state))  # type: ignore[arg-type]
    assert d.of("revive") == [None]  # once: its declines were filtered for an hour
    assert sched.policy.never_ran == 2 and sched.summary()["ended"] == 2  # not 3
    assert not sched.policy.stale() and not sched.policy.unseen
    sched.offers(d, [offer(6, "cpus:2;mem:256")])  # type: ignore[arg-type]
    assert d.of("accept") == [["o1"], ["o2"], ["o6"]]  # f-5 and f-6 replace f-3 and f-4


def test_an_accept_rejected_is_reconciled_not_assumed() -> None:
    from services.emulator.frameworks import EmulatedFramework

    sched = EmulatedFramework(OfferPolicy("f", Shape(0.5, 64), 1.0, tasks_per_offer=1))
    d = Driver()
    sched.offers(d, [offer(1)])  # type: ignore[arg-type]
    sched.accept_rejected(d, ["o1"], ["f-1", "nope"], 0, "launch unanswered")  # type: ignore[arg-type]
    assert d.of("reconcile") == [[("f-1", "S1")]]


def test_the_stale_tasks_are_looked_for_at_most_every_reconcile_period() -> None:
    # Each offers callback sorted every task launched and not yet heard of (thousands in a
    # 10k-agent launch) when none was stale: 14% of the bench's framework process.
    from frameworks.sdk.scheduler import MasterInfo
    from services.emulator.frameworks import RECONCILE_S, EmulatedFramework

    now = [0.0]
    sched = EmulatedFramework(OfferPolicy("f", Shape(0.1, 16), 1.0, tasks_per_offer=1,
                                          refuse_s=3600), clock=lambda: now[0])
    looked: list[int] = []
    stale = sched.policy.stale
    sched.policy.stale = lambda: (looked.append(1), stale())[1]  # type: ignore[method-assign]
    d = Driver()
    sched.subscribed(d, "F", MasterInfo("m1", 1, ""))  # type: ignore[arg-type]
    for i in range(20):
        sched.offers(d, [offer(i)])  # type: ignore[arg-type]
    assert len(looked) == 1  # nothing stale: not looked for again within the period
    now[0] += RECONCILE_S
    sched.offers(d, [offer(99)])  # type: ignore[arg-type]
    assert len(looked) == 2
    sched.subscribed(d, "F", MasterInfo("m2", 2, ""))  # type: ignore[arg-type]
    assert len(looked) == 3 and len(d.of("reconcile")) == 1  # a new master: at once
