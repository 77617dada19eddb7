"""The scheduler driver and fair sharing: the demand a framework requests (built by
frameworks.sdk.demand) is sent at once when subscribed, kept while not, and sent again
after every (re-)subscription; a Revoke event reaches the scheduler's `revoked`."""

from __future__ import annotations

from typing import Any

import pytest

from frameworks.sdk import demand
from frameworks.sdk.core import Note, State
from frameworks.sdk.scheduler import Revoked, Scheduler
from schemas import bus_pb2, common_pb2, scheduler_pb2
from services.resources import Resources
from tests.sdk.test_sdk_core import FID, Recorder, new_core, sends, subscribe, subscribed

Event = scheduler_pb2.SchedulerEvent


def web(count: int) -> common_pb2.Demand:
    return demand(Resources.of(cpus=0.5, mem=128), count, ports=2)


def test_demand_holds_one_tasks_unreserved_scalars_count_and_ports() -> None:
    d = demand(Resources.of("web", cpus=0.5, mem=128, gpus=1, ports=[(31000, 31002)]), 4)
    assert d.count == 4 and d.ports == 3  # ports counted from the resources
    assert Resources.from_proto(d.resources) == Resources.of(cpus=0.5, mem=128, gpus=1)
    assert all(r.role in ("", "*") for r in d.resources)
    task = Resources.of(cpus=1, mem=64, ports=[(31000, 31000)]).to_proto()
    assert demand(task, 2).ports == 1 and demand(task, 2, ports=0).ports == 0
    assert demand(Resources.of(cpus=1), 0).count == 0
    with pytest.raises(ValueError):
        demand(Resources.of(cpus=1), -1)


def test_request_when_subscribed_is_sent_at_once_and_replaces_the_last() -> None:
    rec = Recorder(new_core())
    subscribe(rec)
    [call] = sends(rec.run(rec.core.request([web(3)])), "request")
    assert call.framework_id == FID and list(call.request.demands) == [web(3)]
    [call] = sends(rec.run(rec.core.request([web(5), demand(Resources.of(cpus=2), 1)])),
                   "request")
    assert [d.count for d in call.request.demands] == [5, 1]
    [call] = sends(rec.run(rec.core.request([])), "request")  # back to "unknown"
    assert call.HasField("request") and not call.request.demands


def test_no_request_is_sent_on_subscription_until_one_was_made() -> None:
    rec = Recorder(new_core())
    subscribe(rec)
    assert not sends(rec.log, "request")
    rec.run(rec.core.master_detected("m2", 2, 1.0))
    rec.run(rec.core.connected(1.1))
    assert not sends(rec.run(rec.core.on_event(subscribed(FID, 2), 1.2)), "request")


def test_request_before_subscription_is_sent_once_subscribed() -> None:
    rec = Recorder(new_core())
    out = rec.run(rec.core.request([web(2)]))
    assert not sends(out, "") and any(n.event == "request_deferred" for n in rec.notes)
    rec.run(rec.core.request([web(3)]))  # the latest wins; one Request goes out
    rec.run(rec.core.connected(0.0))
    got = rec.run(rec.core.on_event(subscribed(), 0.1))
    [call] = sends(got, "request")
    assert [d.count for d in call.request.demands] == [3] and call.framework_id == FID


@pytest.mark.parametrize("how", ["new_leader", "failover", "not_registered"])
def test_the_current_demand_is_sent_again_after_every_resubscription(how: str) -> None:
    rec = Recorder(new_core())
    subscribe(rec)
    rec.run(rec.core.request([web(3)]))
    rec.run(rec.core.request([web(4)]))
    if how == "new_leader":
        rec.run(rec.core.master_detected("m2", 2, 1.0))
        rec.run(rec.core.connected(1.1))
        got = rec.run(rec.core.on_event(subscribed(FID, 2), 1.2))
    elif how == "failover":  # a restarted scheduler with a new core, after a request
        rec = Recorder(new_core(framework_info=common_pb2.FrameworkInfo(
            framework_id=FID, name="web", role="web"), force=True))
        rec.run(rec.core.request([web(4)]))
        rec.run(rec.core.connected(0.0))
        got = rec.run(rec.core.on_event(subscribed(FID), 0.1))
    else:
        out = rec.run(rec.core.on_error(bus_pb2.NOT_REGISTERED, "who?", 1.0))
        assert sends(out, "subscribe") and not sends(out, "request")
        got = rec.run(rec.core.on_event(subscribed(FID), 1.1))
    [call] = sends(got, "request")
    assert [d.count for d in call.request.demands] == [4]


def test_the_request_goes_before_a_queued_revive() -> None:
    rec = Recorder(new_core())
    subscribe(rec)
    rec.run(rec.core.request([web(1)]))
    rec.run(rec.core.suppress())
    rec.run(rec.core.disconnected(1.0))
    rec.run(rec.core.revive())
    rec.run(rec.core.connected(1.1))
    got = rec.run(rec.core.on_event(subscribed(), 1.2))
    kinds = [e.call.WhichOneof("call") for e in got if hasattr(e, "call")]
    assert kinds == ["request", "revive"]


def test_request_after_teardown_is_dropped() -> None:
    rec = Recorder(new_core())
    subscribe(rec)
    rec.run(rec.core.teardown())
    out = rec.core.request([web(1)])
    assert [type(o) for o in out] == [Note] and rec.core.state is State.ABORTED


def test_a_revoke_event_reaches_the_schedulers_revoked_callback() -> None:
    rec = Recorder(new_core())
    subscribe(rec)
    ev = Event(revoke=Event.Revoke(agent_id="a1", task_ids=["t1", "t2"], grace_s=5.0,
                                   message="for fw-2 below its share"))
    got = rec.run(rec.core.on_event(ev, 1.0))
    assert got == [Revoked("a1", ("t1", "t2"), 5.0, "for fw-2 below its share")]

    seen: list[tuple[Any, ...]] = []

    class Sched(Scheduler):
        def revoked(self, driver: Any, agent_id: str, task_ids: list[str], grace_s: float,
                    message: str) -> None:
            seen.append((driver, agent_id, task_ids, grace_s, message))

    assert isinstance(got[0], Revoked)
    got[0].invoke(Sched(), "drv")  # type: ignore[arg-type]
    assert seen == [("drv", "a1", ["t1", "t2"], 5.0, "for fw-2 below its share")]
    Revoked("a1", (), 0.0, "").invoke(Scheduler(), "drv")  # type: ignore[arg-type]  # no-op
