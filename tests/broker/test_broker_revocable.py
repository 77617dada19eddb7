"""Revocable offers in the broker (issue 9 item 2): an allocation the allocator marks
revocable becomes a revocable offer, and the tasks an ACCEPT launches are marked by the
broker, whatever the framework wrote: guaranteed while the ACCEPT's guaranteed offers hold
them, revocable beyond."""

from __future__ import annotations

from schemas import common_pb2
from services.broker.commands import LaunchRequest, SendOffers
from services.broker.core import BrokerCore
from services.resources import Resources
from tests.broker.harness import T0, alloc, broker, launch, offer_ids, only, reserve, task

R = Resources.parse


def offered(revocable: tuple[bool, ...], role: str = "*") -> tuple[BrokerCore, list[str]]:
    core = broker(prefix="e7")
    allocations = []
    for i, rev in enumerate(revocable):
        a = alloc(f"al{i}", role=role, cpus=2, mem=1024)
        a.revocable = rev
        allocations.append(a)
    cmds = core.allocations(allocations, T0)
    core.validate()
    (send,) = only(cmds, SendOffers)
    assert [o.to_proto().revocable for o in send.offers] == list(revocable)
    return core, offer_ids(cmds)


def tasks_of(req: LaunchRequest) -> dict[str, bool]:
    return {t.task_id: t.revocable for op in req.operations
            if op.WhichOneof("operation") == "launch" for t in op.launch.tasks}


def test_tasks_beyond_the_guaranteed_offers_are_revocable() -> None:
    core, ids = offered((False, True))
    cmds = core.accept("f1", ids, [launch(task("t1", cpus=1, mem=256),
                                          task("t2", cpus=1, mem=256)),
                                   launch(task("t3", cpus=1, mem=256))], None, T0)
    (req,) = only(cmds, LaunchRequest)
    assert tasks_of(req) == {"t1": False, "t2": False, "t3": True}


def test_a_framework_cannot_mark_its_own_tasks() -> None:
    core, ids = offered((False,))
    t = task("t1", cpus=1, mem=256)
    t.revocable = True  # not its to say
    (req,) = only(core.accept("f1", ids, [launch(t)], None, T0), LaunchRequest)
    assert tasks_of(req) == {"t1": False}
    core, ids = offered((True,))
    (req,) = only(core.accept("f1", ids, [launch(task("t1", cpus=1, mem=256))], None, T0),
                  LaunchRequest)
    assert tasks_of(req) == {"t1": True}


def test_a_reserved_task_counts_against_the_guaranteed_offer_it_came_from() -> None:
    core, ids = offered((False,), role="web")
    t1 = common_pb2.TaskInfo(task_id="t1", resources=R("cpus(web):1;mem:256").to_proto())
    ops = [reserve("web", cpus=1), launch(t1)]
    (req,) = only(core.accept("f1", ids, ops, None, T0), LaunchRequest)
    assert tasks_of(req) == {"t1": False}
    assert req.operations[0] == ops[0]


def test_without_revocable_offers_the_operations_are_passed_as_they_are() -> None:
    core, ids = offered((False,))
    ops = [launch(task("t1", cpus=1, mem=256))]
    (req,) = only(core.accept("f1", ids, ops, None, T0), LaunchRequest)
    assert req.operations[0] is ops[0]
