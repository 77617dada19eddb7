"""The service framework and fair sharing: the demand it declares (all its instances, each
of its spec's shape and ports), re-declared only when that changes, and revoked instances
(TASK_KILLED, REASON_TASK_REVOKED) relaunched when resources come, without feeding the
crash-loop delay."""

from __future__ import annotations

from typing import Any

from frameworks.sdk.scheduler import MasterInfo
from frameworks.service import RESTART_BACKOFF_S, ServiceScheduler
from schemas import common_pb2
from services.resources import Resources
from tests.frameworks.test_service_lifecycle_core import FakeDriver, offer, running, spec

TS = common_pb2.TaskStatus
MASTER = MasterInfo("m1", 1, 1000)


def requests(driver: FakeDriver) -> list[common_pb2.Demand]:
    out = []
    for call in driver.calls:
        if call[0] == "request":
            (d,) = call[1]
            out.append(d)
    return out


def killed(sched: ServiceScheduler, driver: Any, index: int, now: float,
           reason: int = TS.REASON_TASK_REVOKED) -> None:
    inst = sched.instances[index]
    sched.update(driver, TS(task_id=inst.task_id, agent_id=inst.agent_id,
                            state=common_pb2.TASK_KILLED, reason=reason), now=now)  # type: ignore[arg-type]


def test_subscribing_declares_every_instance_of_the_specs_shape() -> None:
    driver = FakeDriver()
    sched = ServiceScheduler(spec(instances=3, cpus=0.25, mem=64.0, ports=[8080, 9090]))
    sched.subscribed(driver, "fw-1", MASTER)
    [d] = requests(driver)
    assert (d.count, d.ports) == (3, 2)
    assert Resources.from_proto(d.resources) == Resources.of(cpus=0.25, mem=64)


def test_the_demand_is_kept_while_all_run_and_not_sent_again_unchanged() -> None:
    driver = FakeDriver()
    sched = ServiceScheduler(spec(instances=2))
    sched.subscribed(driver, "fw-1", MASTER)
    running(sched, driver, 2)
    sched.subscribed(driver, "fw-1", MASTER)  # a re-subscription: the driver restates it
    sched.set_instances(driver, 2)
    assert [d.count for d in requests(driver)] == [2]
    assert ("suppress",) in driver.calls  # all run: no offers wanted, the demand stands


def test_scaling_or_a_new_shape_declares_again() -> None:
    driver = FakeDriver()
    sched = ServiceScheduler(spec(instances=2, ports=[]))
    sched.subscribed(driver, "fw-1", MASTER)
    sched.set_instances(driver, 5)
    sched.set_instances(driver, 5)
    sched.set_instances(driver, 1)
    sched.spec.mem = 256.0  # a new shape, applied with the next change of plan
    sched.set_instances(driver, 1)
    got = requests(driver)
    assert [(d.count, d.ports) for d in got] == [(2, 0), (5, 0), (1, 0), (1, 0)]
    assert Resources.from_proto(got[-1].resources).scalar("mem") == 256


def test_a_revoked_instance_is_relaunched_at_once_and_feeds_no_restart_delay() -> None:
    driver = FakeDriver()
    sched = ServiceScheduler(spec(instances=2, ports=[]))
    running(sched, driver, 2)
    sched.revoked(driver, "S-h1", [sched.instances[0].task_id], 5.0, "for fw-2")
    assert not [c for c in driver.calls if c[0] == "kill"]  # the master kills
    now = 1000.0
    killed(sched, driver, 0, now)
    inst = sched.instances[0]
    assert inst.failures == 0 and inst.not_before == now and sched.revoked_tasks == 1
    assert ("revive",) in driver.calls  # it wants offers again
    sched.offers(driver, [offer("o2", "h2", [])], now=now)
    assert inst.task_id.endswith("-2")  # relaunched on the very next offer
    # A plain kill by someone else is a failure: it waits.
    killed(sched, driver, 1, now, reason=TS.REASON_EXECUTOR_TERMINATED)
    assert sched.instances[1].not_before == now + RESTART_BACKOFF_S


def test_a_revoke_neither_grows_nor_resets_a_crash_loops_delay() -> None:
    driver = FakeDriver()
    sched = ServiceScheduler(spec(instances=1, ports=[]))
    now = 1000.0
    for attempt in range(1, 4):  # three failures in a row
        sched.offers(driver, [offer(f"o{attempt}", "h1", [])], now=now)
        inst = sched.instances[0]
        sched.update(driver, TS(task_id=inst.task_id, agent_id="S-h1",
                                state=common_pb2.TASK_FAILED), now=now)
        now = inst.not_before
    assert inst.failures == 3
    sched.offers(driver, [offer("o4", "h1", [])], now=now)
    killed(sched, driver, 0, now + 1)
    assert inst.failures == 3 and inst.not_before == now + 1
    sched.offers(driver, [offer("o5", "h1", [])], now=now + 1)
    sched.update(driver, TS(task_id=inst.task_id, agent_id="S-h1",
                            state=common_pb2.TASK_FAILED), now=now + 2)
    assert inst.failures == 4 and inst.not_before == now + 2 + RESTART_BACKOFF_S * 8
