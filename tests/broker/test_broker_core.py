"""The offer-broker's pure core: a unit test per rule of the offer lifecycle (the state
machine is in test_broker_machine.py; the decisions around it in test_broker_decisions.py)."""

from __future__ import annotations

import pytest

from schemas import common_pb2, internal_pb2, state_pb2
from services.broker.commands import (
    AcceptRejected,
    LaunchRequest,
    RecoverResources,
    Recovery,
    Rescind,
    SendOffers,
    coalesce,
)
from services.broker.table import IllegalTransition, OfferState
from services.broker.validation import refuse_seconds
from services.notice import Notice
from services.resources import Resources
from tests.broker.harness import (
    RC,
    RJ,
    RR,
    T0,
    agent_entry,
    alloc,
    broker,
    filters,
    framework_entry,
    launch,
    make,
    offer_ids,
    only,
    recoveries,
    rejected,
    reserve,
    task,
)

# -- allocations become offers ----------------------------------------------------------

def test_allocations_become_offers_batched_per_framework() -> None:
    core = broker(prefix="e7")
    core.agent_updated("a1", "host-1", Resources.of(cpus=16, mem=8192), T0)
    cmds = core.allocations([alloc("x", "f1"), alloc("y", "f2"), alloc("z", "f1")], T0)
    sends = only(cmds, SendOffers)
    assert sorted((s.framework_id, len(s.offers)) for s in sends) == [("f1", 2), ("f2", 1)]
    offers = [o for s in sends for o in s.offers]
    assert [o.offer_id for o in offers if o.framework_id == "f1"] == ["e7-o1", "e7-o3"]
    o = core.offer("e7-o1")
    assert o is not None and o.hostname == "host-1" and o.expires_at == T0 + 30
    assert o.allocation_id == "x" and o.traceparent == "tp-x"
    assert o.to_proto().expires_at_us == int((T0 + 30) * 1e6)
    assert core.outstanding("a1") == Resources.of(cpus=6, mem=3072)
    msg = sends[0].to_proto()
    assert msg.framework_event.event.offers.offers[0].offer_id.startswith("e7-o")
    core.validate()


def test_offer_without_timeout_never_expires() -> None:
    core, (oid,) = make(timeout=None)
    assert core.tick(T0 + 1e9) == []
    offer = core.offer(oid)
    assert offer is not None and offer.to_proto().expires_at_us == 0


def test_ids_differ_across_broker_epochs_and_old_ids_are_unknown() -> None:
    _, (oid,) = make()
    new = broker(prefix="e8")
    assert offer_ids(new.allocations([alloc("al0")], T0)) == ["e8-o1"]
    rej = rejected(new.accept("f1", [oid], [], None, T0))
    assert rej.reason == RJ.REJECT_REASON_OFFER_UNKNOWN and "unknown" in rej.message


def test_allocation_beyond_agent_total_is_handed_back() -> None:
    core = broker(prefix="e7")
    core.agent_updated("a1", "h", Resources.of(cpus=4, mem=4096), T0)
    cmds = core.allocations([alloc("x", cpus=3, mem=1), alloc("y", cpus=2, mem=1)], T0)
    assert len(offer_ids(cmds)) == 1
    (rec,) = recoveries(cmds)
    assert rec.allocation_id == "y" and rec.reason == RC.RECOVER_REASON_RESCINDED
    assert only(cmds, Notice)[0].kind == "allocation_over_total"
    core.validate()


def test_same_port_is_never_offered_twice_even_without_a_known_total() -> None:
    core = broker(prefix="e7")
    cmds = core.allocations([alloc("x", ports=[(31000, 31004)], cpus=1),
                             alloc("y", "f2", ports=[(31004, 31006)], cpus=1)], T0)
    assert len(offer_ids(cmds)) == 1 and recoveries(cmds)[0].allocation_id == "y"


def test_allocation_for_an_agent_not_on_the_stream_is_handed_back_not_offered() -> None:
    # After a master failover the allocator can know an agent (from its own copy of the
    # stream) before the broker's copy has it: an offer would name no hostname and no
    # attributes, and a framework placing by either would be misled. It goes back.
    core = broker(prefix="e7")
    core.agent_updated("a1", "host-1", Resources.of(cpus=16, mem=8192), T0)
    cmds = core.allocations([alloc("x", agent="a9"), alloc("y", agent="a1")], T0)
    offer = core.offer("e7-o1")
    assert offer_ids(cmds) == ["e7-o1"] and offer is not None and offer.agent_id == "a1"
    (rec,) = recoveries(cmds)
    assert (rec.allocation_id, rec.agent_id) == ("x", "a9")
    assert rec.reason == RC.RECOVER_REASON_RESCINDED
    (note,) = only(cmds, Notice)
    assert note.kind == "allocation_dropped" and "not on the stream" in note.message
    core.validate()


def test_duplicate_and_empty_allocations_are_dropped() -> None:
    core, _ = make()
    cmds = core.allocations([alloc("al0"), internal_pb2.Allocation(
        allocation_id="e", framework_id="f1", agent_id="a1")], T0)
    assert [a.kind for a in only(cmds, Notice)] == ["allocation_dropped"] * 2
    assert not offer_ids(cmds) and not recoveries(cmds)


# -- accept ----------------------------------------------------------------------------

def test_valid_accept_launches_and_recovers_the_remainder_under_its_filter() -> None:
    core, (oid,) = make(cpus=4, mem=1024)
    ops = [launch(task("t1", cpus=1, mem=256), task("t2", cpus=2, mem=256))]
    cmds = core.accept("f1", [oid], ops, filters(10), T0 + 1)
    (req,) = only(cmds, LaunchRequest)
    assert (req.framework_id, req.agent_id, req.offer_ids) == ("f1", "a1", (oid,))
    assert list(req.operations) == ops and req.traceparents == ("tp-al0",)
    (rec,) = recoveries(cmds)
    assert rec.reason == RC.RECOVER_REASON_UNUSED and rec.refuse_seconds == 10
    assert rec.resources == Resources.of(cpus=1, mem=512)
    assert core.state(oid) is OfferState.LAUNCHING
    core.validate()
    done = core.launch_result(req.request_id, accepted=True)
    (rec,) = recoveries(done)
    assert rec.reason == RC.RECOVER_REASON_LAUNCHED and rec.task_ids == ("t1", "t2")
    assert rec.resources == Resources.of(cpus=3, mem=512) and rec.allocation_id == "al0"
    assert not only(done, AcceptRejected)
    assert core.state(oid) is OfferState.LAUNCHED
    core.validate()


def test_accept_pools_offers_of_one_agent() -> None:
    core, ids = make(2, cpus=2, mem=512)
    cmds = core.accept("f1", ids, [launch(task("t", cpus=4, mem=1024))], None, T0)
    assert only(cmds, LaunchRequest)[0].offer_ids == tuple(ids)
    assert not recoveries(cmds)  # nothing left over


def test_accept_without_operations_returns_everything_under_its_filter() -> None:
    core, (oid,) = make()
    cmds = core.accept("f1", [oid], [], None, T0)
    assert not only(cmds, LaunchRequest)
    (rec,) = recoveries(cmds)
    assert rec.reason == RC.RECOVER_REASON_UNUSED and rec.refuse_seconds == 5.0
    assert core.state(oid) is OfferState.ACCEPTED


def test_accept_of_an_expired_offer_is_rejected() -> None:
    core, (oid,) = make()
    cmds = core.accept("f1", [oid], [launch(task("t", cpus=1))], None, T0 + 30)
    rej = rejected(cmds)
    assert rej.reason == RJ.REJECT_REASON_OFFER_UNKNOWN and "expired" in rej.message
    assert rej.task_ids == ("t",)
    # The expiry itself happened first, in the same step.
    assert only(cmds, Rescind)[0].reason == RR.RESCIND_REASON_EXPIRED
    assert [r.reason for r in recoveries(cmds)] == [RC.RECOVER_REASON_EXPIRED]


def test_accept_with_a_foreign_offer_uses_up_only_its_own() -> None:
    core = broker(prefix="e7")
    mine, theirs = offer_ids(core.allocations([alloc("x", "f1"), alloc("y", "f2")], T0))
    cmds = core.accept("f1", [mine, theirs], [launch(task("t", cpus=1))], None, T0)
    rej = rejected(cmds)
    assert rej.reason == RJ.REJECT_REASON_OFFER_UNKNOWN
    assert "not an offer of this framework" in rej.message and rej.framework_id == "f1"
    (rec,) = recoveries(cmds)
    assert (rec.offer_id, rec.reason, rec.refuse_seconds) == (
        mine, RC.RECOVER_REASON_LAUNCH_REJECTED, 0.0)
    assert core.state(mine) is OfferState.REJECTED
    assert core.state(theirs) is OfferState.OFFERED
    core.validate()


def test_accept_of_an_already_used_offer_is_rejected() -> None:
    core, (oid,) = make()
    core.accept("f1", [oid], [launch(task("t", cpus=1))], None, T0)
    rej = rejected(core.accept("f1", [oid], [launch(task("u", cpus=1))], None, T0))
    assert rej.reason == RJ.REJECT_REASON_OFFER_UNKNOWN and "already used" in rej.message
    done, _ = make()
    done.accept("f1", [oid], [], None, T0)
    rej = rejected(done.accept("f1", [oid], [], None, T0))
    assert "no longer outstanding (accepted)" in rej.message


def test_offer_named_twice_in_one_accept_is_rejected_and_used_up() -> None:
    core, (oid,) = make()
    cmds = core.accept("f1", [oid, oid], [launch(task("t", cpus=1))], None, T0)
    assert "named twice" in rejected(cmds).message
    assert core.state(oid) is OfferState.REJECTED


def test_offers_of_two_agents_are_rejected() -> None:
    core = broker(prefix="e7")
    ids = offer_ids(core.allocations([alloc("x", agent="a1"), alloc("y", agent="a2")], T0))
    cmds = core.accept("f1", ids, [launch(task("t", cpus=1))], None, T0)
    assert rejected(cmds).reason == RJ.REJECT_REASON_OFFERS_MIXED_AGENTS
    assert {r.offer_id for r in recoveries(cmds)} == set(ids)


def test_tasks_that_do_not_fit_are_rejected() -> None:
    core, (oid,) = make(cpus=2, mem=1024)
    ops = [launch(task("t1", cpus=1.5, mem=100), task("t2", cpus=1, mem=100))]
    cmds = core.accept("f1", [oid], ops, filters(60), T0)
    rej = rejected(cmds)
    assert rej.reason == RJ.REJECT_REASON_RESOURCES_EXCEEDED and "need" in rej.message
    assert rej.task_ids == ("t1", "t2")
    (rec,) = recoveries(cmds)
    assert rec.reason == RC.RECOVER_REASON_LAUNCH_REJECTED and rec.refuse_seconds == 0
    assert rec.resources == Resources.of(cpus=2, mem=1024)
    core.validate()


@pytest.mark.parametrize(("ops", "needle"), [
    ([launch(task("t", cpus=1), task("t", cpus=1))], "duplicate task id"),
    ([launch(task("t", cpus=1)), launch(task("t", cpus=1))], "duplicate task id"),
    ([launch(task("t"))], "has no resources"),
    ([launch(task("", cpus=1))], "empty task_id"),
    ([common_pb2.Operation()], "has no kind"),
])
def test_invalid_tasks_are_rejected(ops: list[common_pb2.Operation], needle: str) -> None:
    core, (oid,) = make()
    rej = rejected(core.accept("f1", [oid], ops, None, T0))
    assert rej.reason == RJ.REJECT_REASON_TASK_INVALID and needle in rej.message


def test_port_mapping_outside_the_tasks_ports_is_rejected() -> None:
    core = broker(prefix="e7")
    (oid,) = offer_ids(core.allocations([alloc("x", ports=[(31000, 31009)], cpus=1)], T0))
    t = task("t", cpus=1, ports=[(31000, 31000)])
    t.container.docker.port_mappings.add(host_port=31005, container_port=80)
    rej = rejected(core.accept("f1", [oid], [launch(t)], None, T0))
    assert rej.reason == RJ.REJECT_REASON_TASK_INVALID and "31005" in rej.message


@pytest.mark.parametrize(("ops", "port"), [
    ([launch(task("a", cpus=1, ports=[(31000, 31000)]),
             task("b", cpus=1, ports=[(31000, 31000)]))], 31000),
    ([launch(task("a", cpus=1, ports=[(31000, 31005)]),
             task("b", cpus=1, ports=[(31005, 31009)]))], 31005),
    ([launch(task("a", cpus=1, ports=[(31000, 31000)])),
      launch(task("b", cpus=1, ports=[(31000, 31000)]))], 31000),
    ([launch(task("a", cpus=1, ports=[(31002, 31002)]),
             task("b", role="web", cpus=1, ports=[(31002, 31002)]))], 31002),
])
def test_two_tasks_of_one_accept_never_share_a_host_port(ops: list[common_pb2.Operation],
                                                         port: int) -> None:
    """Ports are resources like any other: two tasks asking for port 31000 summed to one
    range [31000-31000], which the offer held, and both were launched on the same port."""
    core = broker(prefix="e7")
    (oid,) = offer_ids(core.allocations([alloc("x", ports=[(31000, 31009)], cpus=4)], T0))
    cmds = core.accept("f1", [oid], ops, filters(60), T0)
    assert not only(cmds, LaunchRequest)
    rej = rejected(cmds)
    assert rej.reason == RJ.REJECT_REASON_TASK_INVALID, rej
    assert rej.message == f"tasks 'a' and 'b' both use port {port}"
    (rec,) = recoveries(cmds)
    assert rec.resources == Resources.of(ports=[(31000, 31009)], cpus=4)
    core.validate()


def test_tasks_on_distinct_ports_of_one_offer_launch() -> None:
    core = broker(prefix="e7")
    (oid,) = offer_ids(core.allocations([alloc("x", ports=[(31000, 31009)], cpus=4)], T0))
    ops = [launch(task("a", cpus=1, ports=[(31000, 31004)])),
           launch(task("b", cpus=1, ports=[(31005, 31009)]))]
    cmds = core.accept("f1", [oid], ops, filters(60), T0)
    assert only(cmds, LaunchRequest) and not only(cmds, AcceptRejected)
    (rec,) = recoveries(cmds)
    assert rec.resources == Resources.of(cpus=2)  # every port went, each to one task


def test_reserve_then_launch_on_the_reservation() -> None:
    core = broker(prefix="e7")
    (oid,) = offer_ids(core.allocations([alloc("x", role="web", cpus=4, mem=512)], T0))
    ops = [reserve("web", cpus=2), launch(task("t", role="web", cpus=1), task("u", mem=128))]
    cmds = core.accept("f1", [oid], ops, None, T0)
    assert only(cmds, LaunchRequest)
    (rec,) = recoveries(cmds)  # the unused part of the reservation goes back reserved
    assert rec.resources == Resources.of(cpus=2, mem=384) + Resources.of("web", cpus=1)
    bad = core.allocations([alloc("y", role="web", cpus=1, mem=1)], T0)
    (oid,) = offer_ids(bad)
    ops = [reserve("web", cpus=1), launch(task("t", role="web", cpus=1, mem=1))]
    assert rejected(core.accept("f1", [oid], ops, None, T0)).reason == (
        RJ.REJECT_REASON_RESOURCES_EXCEEDED)  # mem was not reserved


@pytest.mark.parametrize(("op", "reason"), [
    (reserve("web", cpus=5), RJ.REJECT_REASON_RESOURCES_EXCEEDED),
    (reserve("db", cpus=1), RJ.REJECT_REASON_UNAUTHORIZED),
    (reserve("*", cpus=1), RJ.REJECT_REASON_TASK_INVALID),
    (common_pb2.Operation(unreserve=common_pb2.Operation.Unreserve(
        resources=Resources.of("web", cpus=1).to_proto())), RJ.REJECT_REASON_RESOURCES_EXCEEDED),
])
def test_reservations_only_on_resources_in_the_offer(op: common_pb2.Operation,
                                                      reason: int) -> None:
    core = broker(prefix="e7")
    (oid,) = offer_ids(core.allocations([alloc("x", role="web", cpus=4, mem=512)], T0))
    assert rejected(core.accept("f1", [oid], [op], None, T0)).reason == reason


# -- decline, expiry, launch results, removals -------------------------------------------

@pytest.mark.parametrize(("given", "expected"), [
    (5.0, 5.0), (None, 5.0), (0.0, 0.0), (12.5, 12.5), (-1.0, 5.0), (float("nan"), 5.0),
    (float("inf"), 365 * 24 * 3600.0),
])
def test_decline_recovers_under_the_filter(given: float | None, expected: float) -> None:
    core, (oid,) = make()
    cmds = core.decline("f1", [oid], filters(given), T0, reason="needs a gpu")
    (rec,) = recoveries(cmds)
    assert rec.reason == RC.RECOVER_REASON_DECLINED and rec.refuse_seconds == expected
    assert core.state(oid) is OfferState.DECLINED and not core.outstanding("a1")
    assert refuse_seconds(None) == 5.0
    core.validate()


def test_decline_of_foreign_or_unknown_offers_is_ignored() -> None:
    core, (oid,) = make()
    cmds = core.decline("f2", [oid, "nope"], None, T0)
    assert not recoveries(cmds) and len(only(cmds, Notice)) == 2
    assert core.state(oid) is OfferState.OFFERED


def test_offer_expires_at_exactly_its_timeout() -> None:
    core, ids = make(2, fw="f1")
    assert core.next_expiry() == T0 + 30
    assert core.tick(T0 + 29.999) == []
    cmds = core.tick(T0 + 30)
    (resc,) = only(cmds, Rescind)
    assert resc.reason == RR.RESCIND_REASON_EXPIRED and sorted(resc.offer_ids) == sorted(ids)
    recs = recoveries(cmds)
    assert [r.reason for r in recs] == [RC.RECOVER_REASON_EXPIRED] * 2
    assert all(r.refuse_seconds == 0 for r in recs)
    assert core.next_expiry() is None and core.tick(T0 + 60) == []
    core.validate()


def test_launch_refused_by_the_master() -> None:
    core, (oid,) = make(cpus=4, mem=1024)
    cmds = core.accept("f1", [oid], [launch(task("t", cpus=1, mem=100))], None, T0)
    (req,) = only(cmds, LaunchRequest)
    done = core.launch_result(req.request_id, accepted=False,
                              reason=RJ.REJECT_REASON_AGENT_INSUFFICIENT, message="full")
    (rej,) = only(done, AcceptRejected)
    assert (rej.reason, rej.message, rej.task_ids, rej.offer_ids) == (
        RJ.REJECT_REASON_AGENT_INSUFFICIENT, "full", ("t",), (oid,))
    assert not rej.refused_here  # the master refused it, and told its tasks so
    (rec,) = recoveries(done)
    assert rec.reason == RC.RECOVER_REASON_LAUNCH_REJECTED and rec.refuse_seconds == 0
    assert rec.resources == Resources.of(cpus=1, mem=100)
    assert core.state(oid) is OfferState.LAUNCH_FAILED
    again = core.launch_result(req.request_id, accepted=True)
    assert [type(c) for c in again] == [Notice]
    core.validate()


def test_agent_removed_rescinds_without_recovery() -> None:
    core = broker(prefix="e7")
    core.allocations([alloc("x", "f1"), alloc("y", "f2"), alloc("z", agent="a2")], T0)
    cmds = core.agent_removed("a1", T0)
    assert sorted((r.framework_id, r.reason) for r in only(cmds, Rescind)) == [
        ("f1", RR.RESCIND_REASON_AGENT_REMOVED), ("f2", RR.RESCIND_REASON_AGENT_REMOVED)]
    assert not recoveries(cmds) and not core.outstanding("a1") and core.outstanding("a2")
    core.validate()


def test_an_agent_a_new_master_waits_for_has_its_offers_rescinded_and_recovered() -> None:
    """RECOVERING on the stream: the allocator keeps the agent (away), so what was offered
    there goes back to it; without the Recovery it would count it offered for good."""
    core = broker(prefix="e7")
    core.stream_changed([agent_entry("a1"), agent_entry("a2"), framework_entry("f1")], T0,
                        reset=True)
    core.allocations([alloc("x", "f1"), alloc("z", agent="a2")], T0)
    recovering = agent_entry("a1", status=state_pb2.AgentRecord.Status.AGENT_STATUS_RECOVERING)
    cmds = core.stream_changed([recovering], T0 + 1)
    assert [r.reason for r in only(cmds, Rescind)] == [RR.RESCIND_REASON_AGENT_REMOVED]
    (rec,) = recoveries(cmds)
    assert rec.agent_id == "a1" and rec.reason == RC.RECOVER_REASON_RESCINDED
    assert not core.outstanding("a1") and core.outstanding("a2")
    core.validate()


def test_framework_removed_rescinds_and_recovers() -> None:
    core = broker(prefix="e7")
    core.allocations([alloc("x", "f1"), alloc("y", "f2"), alloc("z", "f1", "a2")], T0)
    cmds = core.framework_removed("f1", T0)
    (resc,) = only(cmds, Rescind)
    assert resc.reason == RR.RESCIND_REASON_FRAMEWORK_INACTIVE and len(resc.offer_ids) == 2
    assert {r.reason for r in recoveries(cmds)} == {RC.RECOVER_REASON_RESCINDED}
    assert [o.framework_id for o in core.outstanding_offers()] == ["f2"]


def test_agent_shrinking_below_its_offers_rescinds_them() -> None:
    core = broker(prefix="e7")
    core.agent_updated("a1", "h", Resources.of(cpus=8, mem=8192), T0)
    core.allocations([alloc("x", cpus=4, mem=1)], T0)
    cmds = core.agent_updated("a1", "h", Resources.of(cpus=2, mem=8192), T0)
    assert only(cmds, Rescind)[0].reason == RR.RESCIND_REASON_RECLAIMED
    assert recoveries(cmds)[0].reason == RC.RECOVER_REASON_RESCINDED
    core.validate()


def test_rescind_all_empties_the_table_without_recovery() -> None:
    core = broker(prefix="e7")
    ids = offer_ids(core.allocations([alloc("x", "f1"), alloc("y", "f2"), alloc("z", "f1")],
                                     T0))
    (req,) = only(core.accept("f1", [ids[0]], [launch(task("t", cpus=1))], None, T0),
                  LaunchRequest)
    cmds = core.rescind_all()
    assert sorted((r.framework_id, len(r.offer_ids)) for r in only(cmds, Rescind)) == [
        ("f1", 1), ("f2", 1)]
    assert {r.reason for r in only(cmds, Rescind)} == {RR.RESCIND_REASON_BROKER_FAILOVER}
    assert not recoveries(cmds)
    assert not core.outstanding_offers() and not core.pending_launches
    assert core.state(ids[0]) is OfferState.ABANDONED
    assert only(core.launch_result(req.request_id, True), Notice)
    core.validate()


def test_illegal_transitions_raise() -> None:
    core, (oid,) = make()
    core.decline("f1", [oid], None, T0)
    with pytest.raises(IllegalTransition):
        core._move(oid, OfferState.LAUNCHING)
    with pytest.raises(IllegalTransition):
        core._move("never", OfferState.DECLINED)


def test_coalesce_batches_a_drain_and_hides_offers_rescinded_within_it() -> None:
    core = broker(prefix="e7")
    cmds = core.allocations([alloc("x", "f1"), alloc("y", "f2")], T0)
    cmds += core.allocations([alloc("z", "f1", "a2")], T0)
    cmds += core.agent_removed("a2", T0)
    cmds += core.decline("f2", offer_ids(cmds)[1:2], None, T0).commands
    out = coalesce(cmds)
    sends = only(out, SendOffers)
    assert [(s.framework_id, [o.offer_id for o in s.offers]) for s in sends] == [
        ("f1", ["e7-o1"]), ("f2", ["e7-o2"])]
    assert not only(out, Rescind)
    assert len(only(out, RecoverResources)) == 1


def test_recovery_proto_always_carries_an_explicit_filter() -> None:
    rec = Recovery("f1", "a1", Resources.of(cpus=1), RC.RECOVER_REASON_EXPIRED)
    msg = RecoverResources((rec,)).to_proto()
    assert msg.recover_resources.recoveries[0].filters.HasField("refuse_seconds")
    assert msg.recover_resources.recoveries[0].filters.refuse_seconds == 0
    rej = AcceptRejected("f1", ("o",), ("t",), RJ.REJECT_REASON_TASK_INVALID, "bad")
    assert rej.to_proto().framework_event.event.accept_rejected.message == "bad"
    resc = Rescind("f1", ("o",), RR.RESCIND_REASON_EXPIRED)
    assert list(resc.to_proto().framework_event.event.rescind.offer_ids) == ["o"]
    req = LaunchRequest("r", "f1", "a1", ("o",), (launch(task("t", cpus=1)),))
    assert req.to_proto().launch_request.operations[0].launch.tasks[0].task_id == "t"


def test_offers_of_one_framework_go_in_messages_that_fit_a_frame() -> None:
    # 10,000 agents offered to a new framework in one cycle made one 4 MiB+ message, which
    # the bus refused: the framework never saw an offer.
    from services.broker.commands import Offer
    from services.bus import codec

    res = Resources.of(cpus=8, mem=16384, ports=[(31000, 31099), (32000, 32099)])
    offers = tuple(Offer(offer_id=f"e7-o{i}", framework_id="f1", agent_id=f"agent-{i:05d}",
                         hostname=f"host-{i:05d}.example.internal", resources=res, role="*",
                         created_at=T0, expires_at=T0 + 30, allocation_id=f"al{i}",
                         traceparent="00-" + "1" * 32 + "-" + "2" * 16 + "-01")
                   for i in range(20_000))
    limit = codec.DEFAULT_FRAME_LIMIT - codec.FRAME_MARGIN
    msgs = SendOffers("f1", offers).to_protos(limit)
    assert len(msgs) > 1 and all(m.ByteSize() <= limit for m in msgs)
    sent = [o.offer_id for m in msgs for o in m.framework_event.event.offers.offers]
    assert sent == [o.offer_id for o in offers]  # all, once, in order
