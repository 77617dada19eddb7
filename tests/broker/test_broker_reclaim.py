"""The offer-broker's core and fair sharing: the allocator's ReclaimOffers rescinds a
framework's outstanding offers on an agent (RESCIND_REASON_RECLAIMED) and recovers them
unfiltered; an offer an ACCEPT used first is not rescinded, and one rescinded first cannot
be used."""

from __future__ import annotations

from schemas import internal_pb2
from services.broker.commands import AcceptRejected, LaunchRequest, Rescind, SendOffers
from services.broker.table import OfferState
from services.notice import Notice
from services.resources import Resources
from tests.broker.harness import (
    RC,
    RJ,
    RR,
    T0,
    alloc,
    broker,
    launch,
    offer_ids,
    only,
    recoveries,
    task,
)

Reclaim = internal_pb2.InternalMessage.ReclaimOffers.Reclaim


def reclaim(fw: str, agent: str, reason: str = "") -> Reclaim:
    return Reclaim(framework_id=fw, agent_id=agent, reason=reason)


def test_reclaim_rescinds_the_frameworks_offers_on_the_agent_and_recovers_unfiltered() -> None:
    core = broker(prefix="e7")
    ids = offer_ids(core.allocations([
        alloc("x", "f1", "a1"), alloc("y", "f1", "a1", cpus=1, mem=10),
        alloc("z", "f1", "a2"), alloc("w", "f2", "a1")], T0))
    cmds = core.reclaim_offers([reclaim("f1", "a1", "for f3 below its share")], T0 + 1)
    (resc,) = only(cmds, Rescind)
    assert resc.framework_id == "f1" and resc.reason == RR.RESCIND_REASON_RECLAIMED
    assert sorted(resc.offer_ids) == sorted(ids[:2]) and resc.message == "for f3 below its share"
    recs = recoveries(cmds)
    assert sorted(r.offer_id for r in recs) == sorted(ids[:2])
    assert {(r.reason, r.refuse_seconds, r.framework_id, r.agent_id) for r in recs} == {
        (RC.RECOVER_REASON_RESCINDED, 0.0, "f1", "a1")}
    assert sorted(r.allocation_id for r in recs) == ["x", "y"]
    assert recs[0].to_proto().filters.refuse_seconds == 0
    assert {core.state(i) for i in ids[:2]} == {OfferState.RESCINDED}
    assert sorted(o.offer_id for o in core.outstanding_offers()) == sorted(ids[2:])
    assert core.outstanding("a1") == Resources.of(cpus=2, mem=1024)  # f2's is still out
    core.validate()


def test_reclaim_without_a_reason_says_why_anyway() -> None:
    core = broker(prefix="e7")
    core.allocations([alloc("x", "f1", "a1")], T0)
    (resc,) = only(core.reclaim_offers([reclaim("f1", "a1")], T0), Rescind)
    assert resc.message


def test_reclaim_of_pairs_with_nothing_outstanding_is_ignored_and_counted() -> None:
    core = broker(prefix="e7")
    (oid,) = offer_ids(core.allocations([alloc("x", "f1", "a1")], T0))
    core.decline("f1", [oid], None, T0)
    cmds = core.reclaim_offers([reclaim("f1", "a1"), reclaim("f2", "a1"),
                                reclaim("f1", "nowhere")], T0)
    assert not only(cmds, Rescind) and not recoveries(cmds)
    (n,) = only(cmds, Notice)
    assert n.kind == "reclaim_ignored" and n.fields()["reclaims"] == 3
    assert core.state(oid) is OfferState.DECLINED
    core.validate()


def test_accept_first_then_reclaim_the_offer_is_launched_not_rescinded() -> None:
    core = broker(prefix="e7")
    (oid,) = offer_ids(core.allocations([alloc("x", "f1", "a1")], T0))
    (req,) = only(core.accept("f1", [oid], [launch(task("t", cpus=1, mem=10))], None, T0),
                  LaunchRequest)
    cmds = core.reclaim_offers([reclaim("f1", "a1")], T0)
    assert not only(cmds, Rescind) and not recoveries(cmds)
    assert [n.kind for n in only(cmds, Notice)] == ["reclaim_ignored"]
    assert core.state(oid) is OfferState.LAUNCHING
    done = core.launch_result(req.request_id, True, now=T0)
    assert [r.reason for r in recoveries(done)] == [RC.RECOVER_REASON_LAUNCHED]
    core.validate()


def test_reclaim_first_then_accept_the_offer_is_refused_not_launched() -> None:
    core = broker(prefix="e7")
    (oid,) = offer_ids(core.allocations([alloc("x", "f1", "a1")], T0))
    core.reclaim_offers([reclaim("f1", "a1")], T0)
    cmds = core.accept("f1", [oid], [launch(task("t", cpus=1, mem=10))], None, T0)
    assert not only(cmds, LaunchRequest) and not recoveries(cmds)  # recovered once, above
    (rej,) = only(cmds, AcceptRejected)
    assert rej.reason == RJ.REJECT_REASON_OFFER_UNKNOWN and "rescinded" in rej.message
    core.validate()


def test_reclaim_hands_back_allocations_held_for_the_stream() -> None:
    core = broker(prefix="e7")
    core.allocations([alloc("x", "f1", "a1"), alloc("y", "f2", "a1")], T0, synced=False)
    assert core.held == 2
    cmds = core.reclaim_offers([reclaim("f1", "a1")], T0)
    assert [(r.allocation_id, r.reason, r.refuse_seconds) for r in recoveries(cmds)] == [
        ("x", RC.RECOVER_REASON_RESCINDED, 0.0)]
    assert not only(cmds, Rescind) and core.held == 1  # the framework never saw it
    later = core.allocations([], T0, synced=True)
    assert [o.allocation_id for c in only(later, SendOffers) for o in c.offers] == ["y"]
    core.validate()


def test_reclaim_of_several_agents_and_frameworks_in_one_message() -> None:
    core = broker(prefix="e7")
    core.allocations([alloc("x", "f1", "a1"), alloc("y", "f1", "a2"), alloc("z", "f2", "a2"),
                      alloc("w", "f2", "a3")], T0)
    cmds = core.reclaim_offers([reclaim("f1", "a1"), reclaim("f1", "a2"),
                                reclaim("f2", "a2")], T0)
    assert sorted((c.framework_id, len(c.offer_ids)) for c in only(cmds, Rescind)) == [
        ("f1", 2), ("f2", 1)]
    assert sorted(r.allocation_id for r in recoveries(cmds)) == ["x", "y", "z"]
    assert [o.allocation_id for o in core.outstanding_offers()] == ["w"]
    core.validate()
