"""Rolling updates (frameworks/rolling.py and the service scheduler's use of it): a new spec
(but for its instances) replaces running instances one `max_unavailable` batch at a time,
never taking more of the wanted instances down than that; a new number of instances alone
replaces nothing; an instance of unknown spec is left alone; a rollout survives the
scheduler being rebuilt from its recovery document (a job runner failover)."""

from __future__ import annotations

import dataclasses
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from frameworks import rolling
from frameworks.service import Instance, ServiceScheduler
from frameworks.spec import SPEC_LABEL, spec_digest
from schemas import common_pb2
from tests.frameworks.test_service_lifecycle_core import FakeDriver, offer, spec

TS = common_pb2.TaskStatus
RUNNING = "TASK_RUNNING"


def kills(driver: FakeDriver) -> list[str]:
    return [c[1] for c in driver.calls if c[0] == "kill"]


def settle(sched: ServiceScheduler, driver: Any, now: float) -> None:
    """Every killed instance ends; every missing one is launched and reports RUNNING."""
    for inst in list(sched.instances.values()):
        if inst.kill_sent and inst.state != "TASK_KILLED":
            sched.update(driver, TS(task_id=inst.task_id, agent_id=inst.agent_id,
                                    state=common_pb2.TASK_KILLED), now=now)
    sched.offers(driver, [offer(f"o{now}", "h1", [(31000, 31999)])], now=now)
    for inst in list(sched.instances.values()):
        if inst.state == "TASK_STAGING":
            sched.update(driver, TS(task_id=inst.task_id, agent_id=inst.agent_id,
                                    state=common_pb2.TASK_RUNNING), now=now)


def started(n: int, **kw: Any) -> tuple[ServiceScheduler, FakeDriver]:
    driver = FakeDriver()
    sched = ServiceScheduler(spec(instances=n, ports=[], **kw))
    settle(sched, driver, 1.0)
    assert [i.state for i in sched.instances.values()] == [RUNNING] * n
    return sched, driver


def test_a_new_image_replaces_the_instances_one_at_a_time() -> None:
    sched, driver = started(3)
    old = spec_digest(sched.spec)
    new = dataclasses.replace(sched.spec, image="offerbus/other")
    sched.set_spec(driver, new)
    assert kills(driver) == ["web-0-1"]  # one down at a time
    for step in range(2, 8):
        settle(sched, driver, float(step))
        assert len(kills(driver)) <= step  # at most one more per round
    assert kills(driver) == ["web-0-1", "web-1-1", "web-2-1"]
    digests = {i.digest for i in sched.instances.values()}
    assert digests == {spec_digest(new)} != {old}
    assert sched.replaced == 3 and all(i.state == RUNNING for i in sched.instances.values())
    task = [c for c in driver.calls if c[0] == "accept"][-1][2][0].launch.tasks[0]
    assert task.container.docker.image == "offerbus/other"
    assert task.labels[SPEC_LABEL] == spec_digest(new)


def test_more_at_a_time_and_instances_alone_replace_nothing() -> None:
    sched, driver = started(4)
    sched.set_spec(driver, dataclasses.replace(sched.spec, instances=5, max_unavailable=2))
    assert kills(driver) == []  # instances and max_unavailable: no new digest
    settle(sched, driver, 2.0)
    sched.set_spec(driver, dataclasses.replace(sched.spec, env={"V": "2"}))
    assert kills(driver) == ["web-0-1", "web-1-1"]


def test_an_unhealthy_instance_counts_as_down() -> None:
    sched, driver = started(2)
    sched.instances[1].healthy = False
    sched.set_spec(driver, dataclasses.replace(sched.spec, image="x"))
    assert kills(driver) == []  # one is already down: the budget of 1 is spent


def test_with_a_health_check_an_instance_serves_once_reported_healthy() -> None:
    sched, driver = started(2, health_cmd="true")
    sched.set_spec(driver, dataclasses.replace(sched.spec, image="x"))
    assert kills(driver) == []  # neither reported healthy yet: both count as down
    for inst in sched.instances.values():
        sched.update(driver, TS(task_id=inst.task_id, agent_id=inst.agent_id,
                                state=common_pb2.TASK_RUNNING, healthy=True))
    assert kills(driver) == ["web-0-1"]
    settle(sched, driver, 2.0)  # its replacement RUNNING, health not reported yet
    assert kills(driver) == ["web-0-1"]
    new = sched.instances[0]
    sched.update(driver, TS(task_id=new.task_id, agent_id=new.agent_id,
                            state=common_pb2.TASK_RUNNING, healthy=True))
    assert kills(driver) == ["web-0-1", "web-1-1"]


def test_a_rollout_goes_on_after_the_scheduler_is_rebuilt_from_its_status() -> None:
    sched, driver = started(2)
    new = dataclasses.replace(sched.spec, image="x")
    sched.set_spec(driver, new)
    settle(sched, driver, 2.0)  # instance 0 replaced, 1 still old
    doc = {k: v for k, v in sched.status().items() if k in ("framework_id", "tasks")}
    doc["tasks"] = {str(k): v for k, v in doc["tasks"].items()}
    fresh, driver2 = ServiceScheduler(new), FakeDriver()
    fresh.recover(doc)
    assert {i: x.digest for i, x in fresh.instances.items()} == {
        0: spec_digest(new), 1: spec_digest(spec(instances=2, ports=[]))}
    fresh.update(driver2, TS(task_id="web-1-1", agent_id="S-h1",
                             state=common_pb2.TASK_RUNNING))
    assert kills(driver2) == ["web-1-1"]


@settings(max_examples=200, deadline=None)
@given(states=st.lists(st.tuples(st.sampled_from([RUNNING, "TASK_STAGING", "TASK_KILLED"]),
                                 st.booleans(), st.sampled_from(["a", "b", ""]),
                                 st.sampled_from([None, True, False])), max_size=8),
       want=st.integers(0, 8), budget=st.integers(1, 3))
def test_never_more_than_max_unavailable_down(states: list[tuple[str, bool, str, Any]],
                                              want: int, budget: int) -> None:
    instances = {i: Instance(i, state=s, kill_sent=k, digest=d, healthy=h)
                 for i, (s, k, d, h) in enumerate(states)}
    for checked in (False, True):
        before = rolling.down(instances, want, checked)
        chosen = rolling.to_replace(instances, want, "b", budget, checked)
        after = {i: dataclasses.replace(x, kill_sent=x.kill_sent or i in chosen)
                 for i, x in instances.items()}
        assert rolling.down(after, want, checked) <= max(budget, before)
        assert all(instances[i].digest not in ("b", "") and i < want for i in chosen)
