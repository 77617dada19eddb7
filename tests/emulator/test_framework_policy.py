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
