"""The service framework's decisions without a cluster: host ports taken from offers (never
one port twice), the task's port mappings, environment and health check, its own kill of an
instance that keeps reporting unhealthy, replacement of instances the executor killed, and
the master's final Error ending the framework."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from frameworks.sdk.scheduler import MasterInfo
from frameworks.service import Instance, ServiceScheduler, ServiceSpec, plan, task_info
from schemas import common_pb2
from services.resources import Resources

TS = common_pb2.TaskStatus


def offer(oid: str, host: str, ports: list[tuple[int, int]], cpus: float = 4,
          mem: float = 1024) -> common_pb2.Offer:
    o = common_pb2.Offer(offer_id=oid, agent_id=f"S-{host}", hostname=host)
    o.resources.extend(Resources.of(cpus=cpus, mem=mem, ports=ports).to_proto())
    return o


def spec(**kw: Any) -> ServiceSpec:
    base: dict[str, Any] = {"name": "web", "image": "offerbus/busybox", "instances": 3,
                            "cpus": 0.1, "mem": 32.0, "ports": [8080, 9090]}
    base.update(kw)
    return ServiceSpec(**base)


def test_host_ports_come_from_the_offer_and_are_never_given_twice() -> None:
    p = plan(spec(), {}, [offer("o1", "h1", [(31000, 31002), (31010, 31010)])])
    assert p.launches == {"o1": [0, 1]}  # 4 free ports: two instances of two ports each
    assert p.ports == {0: [31000, 31001], 1: [31002, 31010]}
    assert "1 instance(s) not placed" in p.why and "free port(s)" in p.why
    used = [port for ports in p.ports.values() for port in ports]
    assert len(used) == len(set(used))


def test_task_publishes_its_ports_and_names_them_in_its_environment() -> None:
    s = spec(env={"MODE": "blue"})
    task = task_info(s, Instance(0, attempts=1), offer("o1", "h1", [(31000, 31999)]),
                     [31005, 31006])
    res = Resources.from_proto(task.resources)
    assert res.same(Resources.of(cpus=0.1, mem=32, ports=[(31005, 31006)]))
    assert [(m.host_port, m.container_port) for m in task.container.docker.port_mappings] == \
        [(31005, 8080), (31006, 9090)]
    assert dict(task.command.env) == {"MODE": "blue", "PORT0": "31005", "PORT1": "31006",
                                      "PORT_8080": "31005", "PORT_9090": "31006"}
    with pytest.raises(ValueError, match="host port"):
        task_info(s, Instance(1, attempts=1), offer("o1", "h1", [(31000, 31999)]), [31000])


def test_health_checks_on_the_task() -> None:
    s = spec(ports=[8080], health_http="ready", health_interval_s=2.0, health_failures=4)
    task = task_info(s, Instance(0, attempts=1), offer("o1", "h1", [(31000, 31999)]), [31042])
    hc = task.health_check
    assert hc.WhichOneof("check") == "http" and hc.http.port == 31042
    assert hc.http.path == "/ready" and hc.interval_s == 2.0 and hc.consecutive_failures == 4
    s = spec(ports=[], health_cmd="test -f /tmp/ok", health_failures=2)
    hc = task_info(s, Instance(0, attempts=1), offer("o1", "h1", [])).health_check
    assert hc.command.command.shell and hc.command.command.value == "test -f /tmp/ok"
    assert hc.consecutive_failures == 2
    assert not task_info(spec(ports=[]), Instance(0), offer("o1", "h1", [])).HasField(
        "health_check")
    with pytest.raises(ValueError, match="--port"):
        spec(ports=[], health_http="/").check()


@dataclass
class FakeDriver:
    """Records the driver calls a scheduler makes (a pure-core test: no sockets)."""

    calls: list[tuple[Any, ...]] = field(default_factory=list)

    def __getattr__(self, name: str) -> Any:
        return lambda *a, **kw: self.calls.append((name, *a))


def running(sched: ServiceScheduler, driver: Any, n: int) -> None:
    sched.offers(driver, [offer("o1", "h1", [(31000, 31999)])])
    for inst in sched.instances.values():
        sched.update(driver, TS(task_id=inst.task_id, agent_id=inst.agent_id,
                                state=common_pb2.TASK_RUNNING))
    assert len(sched.instances) == n


def test_health_is_recorded_and_the_executors_health_kill_is_counted_and_replaced() -> None:
    """The executor kills after N failed checks (it reports health only when it changes, so
    the framework cannot count reports): the framework records health, counts the kill by
    its reason, and replaces the instance. It never sends a kill of its own."""
    driver = FakeDriver()
    sched = ServiceScheduler(spec(instances=2, ports=[8080], health_cmd="false",
                                  health_failures=2))
    running(sched, driver, 2)
    inst = sched.instances[0]
    for state, healthy in ((common_pb2.TASK_RUNNING, False), (common_pb2.TASK_KILLING, False)):
        sched.update(driver, TS(task_id=inst.task_id, agent_id=inst.agent_id, state=state,
                                healthy=healthy,
                                reason=TS.REASON_TASK_HEALTH_CHECK_STATUS_UPDATED))
    assert inst.healthy is False
    assert not [c for c in driver.calls if c[0] == "kill"]  # the executor's to do
    sched.update(driver, TS(task_id="web-0-1", agent_id="S-h1", state=common_pb2.TASK_KILLED,
                            healthy=False, reason=TS.REASON_HEALTH_CHECK_FAILED))
    assert sched.health_kills == 1 and sched.restarts == 1
    sched.offers(driver, [offer("o2", "h1", [(31100, 31199)])], now=1e9)
    assert sched.instances[0].task_id == "web-0-2" and sched.instances[0].healthy is None


def test_a_crash_looping_instance_is_restarted_with_a_growing_delay() -> None:
    """An instance that fails at once was relaunched on the very next offer: hundreds of
    attempts a minute. Now each failure in a row doubles its delay (capped); one that ran
    long enough starts afresh."""
    from frameworks.service import RESTART_BACKOFF_MAX_S, RESTART_STABLE_S

    driver = FakeDriver()
    sched = ServiceScheduler(spec(instances=1, ports=[]))
    now = 1000.0
    delays = []
    for attempt in range(1, 10):
        sched.offers(driver, [offer(f"o{attempt}", "h1", [])], now=now)
        inst = sched.instances[0]
        assert inst.task_id == f"web-0-{attempt}"
        sched.update(driver, TS(task_id=inst.task_id, agent_id="S-h1",
                                state=common_pb2.TASK_FAILED), now=now)
        wait = inst.not_before - now
        delays.append(wait)
        early = sched.offers(driver, [offer("early", "h1", [])], now=now + wait / 2)
        assert sched.instances[0].task_id == inst.task_id, "relaunched before its delay"
        assert "restarts in" in sched.pending_reason and early is None
        now += wait
    assert delays[:3] == [0.5, 1.0, 2.0] and delays[-1] == RESTART_BACKOFF_MAX_S
    # An attempt that ran long enough resets the delay.
    sched.offers(driver, [offer("o-stable", "h1", [])], now=now)
    inst = sched.instances[0]
    sched.update(driver, TS(task_id=inst.task_id, agent_id="S-h1",
                            state=common_pb2.TASK_RUNNING), now=now)
    sched.update(driver, TS(task_id=inst.task_id, agent_id="S-h1",
                            state=common_pb2.TASK_FAILED), now=now + RESTART_STABLE_S)
    assert inst.not_before - (now + RESTART_STABLE_S) == 0.5


def test_the_masters_error_ends_the_framework() -> None:
    sched = ServiceScheduler(spec())
    assert not sched.finished.is_set()
    sched.error(FakeDriver(), "framework fw-1 removed by the operator")
    assert sched.finished.is_set() and "removed" in sched.removed


def test_a_restarted_process_takes_over_its_instances_and_launches_none_twice(
        tmp_path: Any) -> None:
    """A new process of the service reads the last one's status file: it fails over to its
    framework id, reconciles each instance it knew, launches nothing for instances that may
    still run, and gives the next attempt of an instance reported lost a new task id."""
    import json

    driver = FakeDriver()
    first = ServiceScheduler(spec(instances=2, ports=[]), tmp_path / "web.status.json")
    first.subscribed(driver, "fw-1", MasterInfo("m1", 1, 1000))
    running(first, driver, 2)
    first.update(driver, TS(task_id="web-1-1", agent_id="S-h1", state=common_pb2.TASK_FAILED))
    first.offers(driver, [offer("o2", "h1", [])], now=1e9)
    assert first.instances[1].task_id == "web-1-2"

    driver = FakeDriver()
    again = ServiceScheduler(spec(instances=2, ports=[]), tmp_path / "web.status.json")
    assert again.recover(json.loads((tmp_path / "web.status.json").read_text())) == "fw-1"
    again.subscribed(driver, "fw-1", MasterInfo("m1", 1, 1000))
    reconciles = [c[1] for c in driver.calls if c[0] == "reconcile" and len(c) > 1]
    assert sorted(reconciles[0]) == [("web-0-1", "S-h1"), ("web-1-2", "S-h1")]
    assert ("reconcile",) in driver.calls  # and implicitly, every task the master knows
    assert again.offers(driver, [offer("o3", "h1", [])], now=1e9) is None
    assert not [c for c in driver.calls if c[0] == "accept"], "launched twice"
    # The master answers: one still runs, the other is unknown to it (lost).
    again.update(driver, TS(task_id="web-0-1", agent_id="S-h1", state=common_pb2.TASK_RUNNING))
    again.update(driver, TS(task_id="web-1-2", agent_id="S-h1", state=common_pb2.TASK_UNKNOWN))
    again.offers(driver, [offer("o4", "h1", [])], now=2e9)
    assert again.instances[1].task_id == "web-1-3" and again.instances[0].task_id == "web-0-1"
    # A late update of an attempt older than the one it recovered changes nothing.
    again.update(driver, TS(task_id="web-1-1", agent_id="S-h1", state=common_pb2.TASK_RUNNING))
    assert again.instances[1].task_id == "web-1-3"

    # Had the master removed the framework meanwhile, the next start subscribes afresh.
    late = ServiceScheduler(spec(instances=2, ports=[]), tmp_path / "web.status.json")
    late.recover(json.loads((tmp_path / "web.status.json").read_text()))
    late.error(driver, "framework fw-1 was removed; subscribe without an id")
    doc = json.loads((tmp_path / "web.status.json").read_text())
    assert doc["framework_id"] == "" and doc["tasks"] == {} and late.finished.is_set()


@settings(max_examples=150, deadline=None)
@given(ranges=st.lists(st.tuples(st.integers(31000, 31100), st.integers(0, 6)), min_size=1,
                       max_size=4),
       offers_n=st.integers(1, 3), n_ports=st.integers(0, 3), instances=st.integers(0, 12))
def test_placed_ports_lie_in_the_offer_and_are_never_shared(
        ranges: list[tuple[int, int]], offers_n: int, n_ports: int, instances: int) -> None:
    port_ranges = [(lo, lo + width) for lo, width in ranges]
    offers = [offer(f"o{i}", f"h{i}", port_ranges) for i in range(offers_n)]
    s = spec(instances=instances, ports=list(range(8000, 8000 + n_ports)))
    p = plan(s, {}, offers)
    free = Resources.of(ports=port_ranges)
    by_offer: dict[str, list[int]] = {}
    for offer_id, indexes in p.launches.items():
        for index in indexes:
            ports = p.ports.get(index, [])
            assert len(ports) == n_ports
            assert free.contains(Resources.of(ports=[(x, x) for x in ports]))
            by_offer.setdefault(offer_id, []).extend(ports)
            task_info(s, Instance(index, attempts=1), offers[0], ports)  # a valid task
    for ports in by_offer.values():
        assert len(ports) == len(set(ports))
    placed = sum(len(v) for v in p.launches.values())
    assert placed == instances or p.why


def test_a_bad_spec_names_the_value_that_is_wrong() -> None:
    """`offerbus scale demo -1` used to answer "instances must be >= 0, cpus and mem > 0",
    naming values the user never gave."""
    for bad, said in ((dict(instances=-1), "instances must be >= 0 (got -1)"),
                      (dict(cpus=0.0), "cpus must be > 0 (got 0"),
                      (dict(mem=-5.0), "mem must be > 0 (got -5")):
        with pytest.raises(ValueError) as err:
            spec(**bad).check()
        assert said in str(err.value) and "and" not in str(err.value)


def test_the_last_failure_is_in_the_status_with_its_reason_and_message() -> None:
    """What `offerbus run` shows while an instance keeps failing (the status file): the
    last failed attempt's task, state, reason and message; an instance it asked to stop, or
    one that finished, is no failure."""
    driver = FakeDriver()
    sched = ServiceScheduler(spec(instances=2, ports=[]))
    assert sched.status()["last_failure"] is None
    sched.offers(driver, [offer("o1", "h1", [])], now=0.0)
    sched.update(driver, TS(task_id="web-1-1", agent_id="S-h1", state=common_pb2.TASK_FINISHED),
                 now=1.0)
    assert sched.status()["last_failure"] is None
    sched.update(driver, TS(task_id="web-0-1", agent_id="S-h1", state=common_pb2.TASK_FAILED,
                            reason=TS.REASON_CONTAINER_LAUNCH_FAILED, message="no such image"),
                 now=2.0)
    assert sched.status()["last_failure"] == {
        "task_id": "web-0-1", "state": "TASK_FAILED",
        "reason": "REASON_CONTAINER_LAUNCH_FAILED", "message": "no such image"}


def test_a_launch_the_master_never_answered_is_reconciled_not_relaunched() -> None:
    """A launch a failed master never answered is refused by the broker (AcceptRejected,
    REJECT_REASON_AGENT_UNAVAILABLE) without ending its tasks, which may yet run: the
    service asks the master about those instances (explicit reconciliation) instead of
    waiting forever for an update, and launches none of them again meanwhile. Instances
    that already ended (by the master's update) are not asked about."""
    driver = FakeDriver()
    sched = ServiceScheduler(spec(instances=2, ports=[]))
    sched.offers(driver, [offer("o1", "h1", [])])
    tids = sorted(i.task_id for i in sched.instances.values())
    sched.update(driver, TS(task_id=tids[1], agent_id="S-h1", state=common_pb2.TASK_DROPPED))
    sched.accept_rejected(driver, ["o1"], tids, common_pb2.REJECT_REASON_AGENT_UNAVAILABLE,
                          "the master never answered the launch")
    reconciles = [c[1] for c in driver.calls if c[0] == "reconcile"]
    assert reconciles == [[(tids[0], "S-h1")]]
    accepts = [c for c in driver.calls if c[0] == "accept"]
    sched.offers(driver, [offer("o2", "h1", [])], now=1e9)
    relaunched = [c for c in driver.calls if c[0] == "accept"][len(accepts):]
    assert all(tids[0] not in str(c) for c in relaunched)
