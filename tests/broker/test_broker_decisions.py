"""The offer-broker's decisions that once lived in its shell, now events of the pure core:
launches the master never answers (master changes, tasks seen on the state stream, launch
deadlines in `tick`), a new allocator epoch, allocations held until the stream syncs, the
agent and framework views read off the stream, the one next deadline, and the Verdict and
Notices the shell copies onto its spans. Each test fails if its decision goes missing."""

from __future__ import annotations

from typing import Any

from schemas import state_pb2
from services.broker.commands import AcceptRejected, LaunchRequest, Rescind, SendOffers
from services.broker.core import BrokerCore
from services.broker.launches import LaunchTracker, PendingLaunch
from services.broker.table import OfferState
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
    deleted,
    framework_entry,
    launch,
    offer_ids,
    only,
    recoveries,
    task,
    task_entry,
)

LT = 60.0  # the launch timeout of these tests


def notices(cmds: Any, kind: str) -> list[Notice]:
    return [n for n in only(cmds, Notice) if n.kind == kind]


def launching(master: int | None = 1, tasks: tuple[str, ...] = ("t1", "t2"),
              timeout: float | None = LT) -> tuple[BrokerCore, LaunchRequest]:
    """A core whose one offer was accepted: its LaunchRequest is in flight to `master`."""
    core = broker(prefix="e7", launch_timeout=timeout)
    core.master_changed(master, T0)
    core.stream_changed([agent_entry("a1"), framework_entry("f1")], T0, reset=True)
    (offer,) = only(core.allocations([alloc("x", cpus=4, mem=1024)], T0), SendOffers)
    decision = core.accept("f1", [offer.offers[0].offer_id],
                           [launch(*(task(t, cpus=1, mem=64) for t in tasks))], None, T0)
    (req,) = only(decision, LaunchRequest)
    core.validate()
    return core, req


# -- launches the master never answers -----------------------------------------------------

def test_a_launch_is_tracked_when_its_request_is_made() -> None:
    core, req = launching()
    pending = core.pending_launches[req.request_id]
    assert pending.task_ids == ("t1", "t2") and pending.master_epoch == 1
    assert core.launch_deadline(req.request_id) == T0 + LT
    assert core.next_expiry() is None and core.next_deadline() == T0 + LT  # its offer is used


def test_tasks_on_the_stream_do_not_answer_a_launch_the_master_will_answer() -> None:
    core, req = launching()
    cmds = core.stream_changed([task_entry("f1", "t1"), task_entry("f1", "t2")], T0 + 1)
    assert not recoveries(cmds) and req.request_id in core.pending_launches
    core.validate()


def test_after_a_master_change_tasks_on_the_stream_count_as_launched() -> None:
    core, req = launching()
    cmds = core.master_changed(2, T0 + 5)
    assert [n.fields()["launches"] for n in notices(cmds, "launches_orphaned")] == [1]
    assert core.launch_deadline(req.request_id) == T0 + 5 + LT  # agents may re-register
    cmds = core.stream_changed([task_entry("f1", "t1")], T0 + 6)
    assert not recoveries(cmds)  # t2 not there yet
    cmds = core.stream_changed([task_entry("f1", "t2")], T0 + 7)
    (rec,) = recoveries(cmds)
    assert rec.reason == RC.RECOVER_REASON_LAUNCHED and rec.task_ids == ("t1", "t2")
    assert not only(cmds, AcceptRejected) and notices(cmds, "launch_seen_launched")
    assert not core.pending_launches and core.state(req.offer_ids[0]) is OfferState.LAUNCHED
    core.validate()


def test_tasks_seen_before_the_master_changed_count_as_launched_when_it_does() -> None:
    core, _ = launching()
    core.stream_changed([task_entry("f1", "t1"), task_entry("f1", "t2")], T0 + 1)
    cmds = core.master_changed(None, T0 + 2)  # the master is gone: it will not answer
    assert [r.reason for r in recoveries(cmds)] == [RC.RECOVER_REASON_LAUNCHED]
    core.validate()


def test_a_launch_unanswered_past_its_deadline_with_tasks_unseen_counts_refused() -> None:
    core, req = launching()
    assert core.tick(T0 + LT - 0.001) == []
    cmds = core.tick(T0 + LT)
    (rej,) = only(cmds, AcceptRejected)
    assert rej.reason == RJ.REJECT_REASON_AGENT_UNAVAILABLE and rej.task_ids == ("t1", "t2")
    assert not rej.refused_here  # its tasks may yet appear: the master does not end them
    (rec,) = recoveries(cmds)
    assert rec.reason == RC.RECOVER_REASON_LAUNCH_REJECTED
    assert rec.resources == Resources.of(cpus=2, mem=128)
    (n,) = notices(cmds, "launch_unanswered")
    assert n.level == "warning" and n.fields()["request_id"] == req.request_id
    assert core.state(req.offer_ids[0]) is OfferState.LAUNCH_FAILED
    assert core.next_deadline() is None
    core.validate()


def test_a_launch_past_its_deadline_with_its_tasks_seen_counts_launched() -> None:
    core, _ = launching()
    core.stream_changed([task_entry("f1", "t1"), task_entry("f1", "t2")], T0 + 1)
    cmds = core.tick(T0 + LT)
    assert [r.reason for r in recoveries(cmds)] == [RC.RECOVER_REASON_LAUNCHED]
    assert not only(cmds, AcceptRejected)


def test_a_master_change_pushes_the_deadline_out() -> None:
    core, _ = launching()
    core.master_changed(2, T0 + 50)
    assert core.tick(T0 + LT) == [] and core.next_deadline() == T0 + 50 + LT
    assert only(core.tick(T0 + 50 + LT), AcceptRejected)


def test_the_same_master_again_changes_nothing() -> None:
    core, req = launching()
    assert core.master_changed(1, T0 + 50) == []
    assert core.launch_deadline(req.request_id) == T0 + LT


def test_the_master_answer_stops_the_tracking() -> None:
    core, req = launching()
    core.launch_result(req.request_id, True, now=T0 + 1)
    assert core.next_deadline() is None and core.tick(T0 + 2 * LT) == []
    cmds = core.stream_changed([task_entry("f1", "t1")], T0 + 2 * LT)
    assert not recoveries(cmds)
    core.validate()


def test_without_a_launch_timeout_only_the_stream_answers() -> None:
    core, req = launching(timeout=None)
    assert core.next_deadline() is None and core.tick(T0 + 1e9) == []
    core.master_changed(2, T0 + 1e9)
    assert req.request_id in core.pending_launches


def test_launch_tracker_deadlines_are_lazily_rescheduled() -> None:
    tracker = LaunchTracker(timeout=10.0)
    tracker.master_changed(1, T0)
    launch_ = PendingLaunch("r", "f", "a", ("o",), Resources.of(cpus=1), ("t",), T0)
    assert tracker.add(launch_, T0).master_epoch == 1
    tracker.master_changed(2, T0 + 5)
    assert tracker.next_deadline() == T0 + 15
    assert tracker.resolve(T0 + 10) == []  # the old deadline no longer counts
    tracker.validate()
    (res,) = tracker.resolve(T0 + 15)
    assert res[1] == "refused" and len(tracker) == 0 and tracker.next_deadline() is None
    tracker.validate()


# -- masters: the offers they relayed -------------------------------------------------------

def test_offers_relayed_by_a_master_that_no_longer_leads_are_taken_back_at_once() -> None:
    """A master relays offers to frameworks over connections that die with it: a framework
    re-subscribing with the next master holds none of them (its driver voids them). They
    were left outstanding, offered to nobody, until the offer timeout (30 s by default);
    now the broker rescinds them and hands them back to the allocator, unfiltered."""
    core = broker(prefix="e7")
    core.master_changed(1, T0)
    core.stream_changed([agent_entry("a1"), framework_entry("f1"), framework_entry("f2")],
                        T0, reset=True)
    old = offer_ids(core.allocations([alloc("x", cpus=1, mem=64),
                                      alloc("y", "f2", cpus=1, mem=64)], T0))
    # No master for a moment, then the same one back: its connections may well be intact.
    assert not only(core.master_changed(None, T0 + 1), Rescind)
    assert not only(core.master_changed(1, T0 + 2), Rescind)
    assert {o.offer_id for o in core.outstanding_offers()} == set(old)
    cmds = core.master_changed(2, T0 + 3)
    assert sorted((r.framework_id, r.offer_ids, r.reason) for r in only(cmds, Rescind)) == [
        ("f1", (old[0],), RR.RESCIND_REASON_FRAMEWORK_INACTIVE),
        ("f2", (old[1],), RR.RESCIND_REASON_FRAMEWORK_INACTIVE)]
    recs = recoveries(cmds)
    assert sorted(r.offer_id for r in recs) == sorted(old)
    assert {(r.reason, r.refuse_seconds) for r in recs} == {(RC.RECOVER_REASON_RESCINDED, 0)}
    (n,) = notices(cmds, "offers_voided")
    assert n.fields()["offers"] == 2 and n.fields()["master_epoch"] == 2
    assert not core.outstanding_offers()
    # Offers relayed by the new master stay while it leads.
    new = offer_ids(core.allocations([alloc("z", cpus=1, mem=64)], T0 + 4))
    assert not only(core.master_changed(2, T0 + 5), Rescind)
    assert [o.offer_id for o in core.outstanding_offers()] == new
    core.validate()


def test_offers_made_while_no_master_led_are_taken_back_when_one_leads() -> None:
    """Nobody relayed them (the broker had no master to send them to)."""
    core = broker(prefix="e7")
    core.master_changed(None, T0)
    made = offer_ids(core.allocations([alloc("x", cpus=1, mem=64)], T0))
    cmds = core.master_changed(1, T0 + 1)
    assert [r.offer_ids for r in only(cmds, Rescind)] == [tuple(made)]
    assert [r.offer_id for r in recoveries(cmds)] == made
    core.validate()


def test_offers_relayed_over_a_link_that_broke_are_taken_back_when_it_is_back() -> None:
    """The link to the same master missed its beats (a master too busy to answer): its
    socket was closed with what was queued on it. Those offers may never have reached
    their frameworks; they were left outstanding until the offer timeout (an hour in
    bench.scale, whose launch stalled). Now: rescinded and recovered, unfiltered; a launch
    in flight stays (the stream or its deadline answers it)."""
    core, req = launching()
    core.stream_changed([agent_entry("a2"), framework_entry("f2")], T0)
    out = offer_ids(core.allocations([alloc("x", "f2", agent="a2", cpus=1, mem=64)], T0))
    cmds = core.master_link_reset(T0 + 1)
    assert [(r.framework_id, r.offer_ids) for r in only(cmds, Rescind)] == [("f2", tuple(out))]
    assert [(r.offer_id, r.reason, r.refuse_seconds) for r in recoveries(cmds)] == [
        (out[0], RC.RECOVER_REASON_RESCINDED, 0)]
    (n,) = notices(cmds, "offers_voided")
    assert n.fields()["offers"] == 1 and n.fields()["master_epoch"] == 1
    assert req.request_id in core.pending_launches and not core.outstanding_offers()
    assert core.master_link_reset(T0 + 2) == []
    core.validate()


def test_offers_the_shell_could_not_send_go_back_without_a_rescind() -> None:
    core = broker(prefix="e7")
    core.master_changed(1, T0)
    core.stream_changed([agent_entry("a1"), agent_entry("a2"), framework_entry("f1")], T0,
                        reset=True)
    made = offer_ids(core.allocations([alloc("x", cpus=1, mem=64), alloc("y", agent="a2",
                                                                            cpus=1, mem=64)], T0))
    cmds = core.offers_undelivered([made[0], "e7-o999"], T0 + 1)
    assert not only(cmds, Rescind)  # no framework saw it
    assert [(r.offer_id, r.reason, r.refuse_seconds) for r in recoveries(cmds)] == [
        (made[0], RC.RECOVER_REASON_RESCINDED, 0)]
    assert notices(cmds, "offers_undelivered")[0].fields()["offers"] == 1
    assert [o.offer_id for o in core.outstanding_offers()] == [made[1]]
    assert core.offers_undelivered([made[0]], T0 + 2) == []  # once
    core.validate()


def test_a_launch_in_flight_is_not_voided_by_a_master_change() -> None:
    core, req = launching()
    cmds = core.master_changed(2, T0 + 1)
    assert not only(cmds, Rescind) and not recoveries(cmds)
    assert req.request_id in core.pending_launches
    core.validate()


# -- allocators ----------------------------------------------------------------------------

def test_a_new_allocator_epoch_rescinds_the_old_offers_without_recovery() -> None:
    core, req = launching()
    assert core.allocator_seen(3, T0) == []  # the first allocator: nothing to undo
    core.allocations([alloc("y", "f2", cpus=1, mem=1)], T0)
    assert core.allocator_seen(3, T0) == [] and core.allocator_seen(2, T0) == []
    cmds = core.allocator_seen(4, T0 + 1)
    (resc,) = only(cmds, Rescind)
    assert resc.reason == RR.RESCIND_REASON_RECLAIMED and resc.framework_id == "f2"
    assert "new allocator" in resc.message and not recoveries(cmds)
    (n,) = notices(cmds, "allocator_failover")
    assert n.fields()["old_epoch"] == 3 and n.fields()["rescinded"] == 1
    assert not core.outstanding_offers() and req.request_id in core.pending_launches
    assert core.allocator_epoch == 4
    core.validate()


def test_a_new_allocator_drops_what_the_old_one_had_held() -> None:
    core = broker(prefix="e7")
    core.allocator_seen(1, T0)
    core.allocations([alloc("x")], T0, synced=False)
    assert core.held == 1
    core.allocator_seen(2, T0)
    assert core.held == 0
    assert not only(core.stream_changed([agent_entry("a1")], T0, reset=True), SendOffers)


# -- the state stream ----------------------------------------------------------------------

def test_allocations_wait_for_the_stream_then_name_what_it_says() -> None:
    core = broker(prefix="e7")
    cmds = core.allocations([alloc("x"), alloc("y", "f2")], T0, synced=False)
    assert not only(cmds, SendOffers) and not recoveries(cmds)
    assert notices(cmds, "allocations_held") and core.held == 2
    core.validate()
    cmds = core.stream_changed([agent_entry("a1", "h1", rack="r9"), framework_entry("f1"),
                                framework_entry("f2")], T0 + 1, reset=True)
    offers = [o for c in only(cmds, SendOffers) for o in c.offers]
    assert [o.allocation_id for o in offers] == ["x", "y"]
    assert {o.hostname for o in offers} == {"h1"} and offers[0].created_at == T0 + 1
    assert offers[0].attributes[0].text == "r9" and core.held == 0
    core.validate()


def test_held_allocations_are_bounded_and_the_rest_handed_back() -> None:
    core = broker(prefix="e7", max_held=2)
    cmds = core.allocations([alloc("x"), alloc("y"), alloc("z")], T0, synced=False)
    (rec,) = recoveries(cmds)
    assert rec.allocation_id == "z" and rec.reason == RC.RECOVER_REASON_RESCINDED
    assert notices(cmds, "allocation_dropped") and core.held == 2
    core.validate()


def test_agents_read_off_the_stream() -> None:
    core = broker(prefix="e7")
    core.stream_changed([agent_entry("a1"), agent_entry("a2")], T0, reset=True)
    core.allocations([alloc("x", agent="a1"), alloc("y", agent="a2"),
                      alloc("z", agent="a2", cpus=1, mem=1)], T0)
    # Unchanged: nothing. Shrunk below its offers: rescinded. Unreachable: removed.
    assert core.stream_changed([agent_entry("a1")], T0) == []
    cmds = core.stream_changed([agent_entry("a2", cpus=2)], T0)
    assert only(cmds, Rescind)[0].reason == RR.RESCIND_REASON_RECLAIMED
    core.allocations([alloc("w", agent="a2", cpus=1, mem=1)], T0)
    cmds = core.stream_changed([agent_entry(
        "a1", status=state_pb2.AgentRecord.Status.AGENT_STATUS_UNREACHABLE)], T0)
    assert only(cmds, Rescind)[0].reason == RR.RESCIND_REASON_AGENT_REMOVED
    assert not recoveries(cmds)
    # A fresh copy without a2: a2 is gone.
    cmds = core.stream_changed([agent_entry("a3")], T0, reset=True)
    (resc,) = only(cmds, Rescind)
    assert resc.reason == RR.RESCIND_REASON_AGENT_REMOVED and not core.outstanding_offers()
    core.allocations([alloc("v", agent="a3")], T0)
    cmds = core.stream_changed([deleted("agents/a3")], T0)
    assert only(cmds, Rescind)[0].reason == RR.RESCIND_REASON_AGENT_REMOVED
    core.validate()


def test_frameworks_read_off_the_stream() -> None:
    core = broker(prefix="e7")
    core.stream_changed([agent_entry("a1"), framework_entry("f1"), framework_entry("f2"),
                         framework_entry("f3")], T0, reset=True)
    core.allocations([alloc("x", "f1", cpus=1, mem=1), alloc("y", "f2", cpus=1, mem=1),
                      alloc("z", "f3", cpus=1, mem=1)], T0)
    cmds = core.stream_changed([framework_entry("f1", connected=False)], T0)
    (resc,) = only(cmds, Rescind)
    assert (resc.framework_id, resc.reason) == ("f1", RR.RESCIND_REASON_FRAMEWORK_INACTIVE)
    assert [r.reason for r in recoveries(cmds)] == [RC.RECOVER_REASON_RESCINDED]
    cmds = core.stream_changed([deleted("frameworks/f2")], T0)
    assert [r.framework_id for r in only(cmds, Rescind)] == ["f2"]
    cmds = core.stream_changed([agent_entry("a1")], T0, reset=True)  # f3 absent: gone
    assert [r.framework_id for r in only(cmds, Rescind)] == ["f3"]
    assert not core.outstanding_offers()
    core.validate()


# -- the one deadline, verdicts ------------------------------------------------------------

def test_next_deadline_is_the_earliest_of_offer_expiry_and_launch_deadlines() -> None:
    core, _ = launching(timeout=10.0)
    core.allocations([alloc("y", cpus=1, mem=1)], T0 + 1)
    assert core.next_deadline() == T0 + 10  # the launch's, before the offer's T0 + 31
    core.tick(T0 + 10)
    assert core.next_deadline() == T0 + 31


def test_verdicts_carry_what_the_validate_span_needs() -> None:
    core, _ = launching()
    (oid,) = [o.offer_id for c in only(core.allocations([alloc("y", cpus=1, mem=64)], T0),
                                        SendOffers) for o in c.offers]
    bad = core.accept("f1", [oid], [launch(task("u", cpus=5))], None, T0)
    assert not bad.verdict.valid and bad.verdict.failed_check == "resources_exceeded"
    assert bad.verdict.used == (oid,) and "need" in bad.verdict.reason
    assert not bad.verdict.request_id
    (oid,) = [o.offer_id for c in only(core.allocations([alloc("z", cpus=1, mem=64)], T0),
                                        SendOffers) for o in c.offers]
    good = core.accept("f1", [oid], [launch(task("u", cpus=1))], None, T0)
    (req,) = only(good, LaunchRequest)
    assert good.verdict.valid and good.verdict.request_id == req.request_id
    dec = core.decline("f1", [oid, "nope"], None, T0)
    assert not dec.verdict.valid and dec.verdict.failed_check == "offer_not_outstanding"
    assert dec.verdict.used == () and len(notices(dec, "decline_ignored")) == 2
    assert all(n.fields()["framework_id"] == "f1" for n in notices(dec, "decline_ignored"))


def test_a_dropped_allocation_names_its_trace() -> None:
    core = broker(prefix="e7")
    a = alloc("x")
    a.ClearField("resources")
    (n,) = notices(core.allocations([a], T0), "allocation_dropped")
    assert n.fields()["allocation_id"] == "x"
    assert n.fields()["allocation_traceparent"] == "tp-x"


def test_rescind_all_forgets_tracked_launches_and_held_allocations() -> None:
    core, _ = launching()
    core.allocations([alloc("y", cpus=1, mem=1)], T0, synced=False)
    core.rescind_all()
    assert not core.pending_launches and core.held == 0 and core.next_deadline() is None
    core.validate()



def test_held_allocations_of_agents_or_frameworks_gone_meanwhile_are_not_offered() -> None:
    """Found by the state machine: the stream that releases held allocations may also say
    their agent or framework is gone; offering them would offer what nobody has."""
    core = broker(prefix="e7")
    core.stream_changed([agent_entry("a1"), agent_entry("a2"), framework_entry("f1"),
                         framework_entry("f2")], T0, reset=True)
    core.allocations([alloc("x", "f1", "a1"), alloc("y", "f2", "a2"), alloc("z", "f1", "a2")],
                     T0, synced=False)
    cmds = core.stream_changed([deleted("agents/a1"), framework_entry("f2", connected=False)],
                               T0)
    offers = [o for c in only(cmds, SendOffers) for o in c.offers]
    assert [o.allocation_id for o in offers] == ["z"]
    # Both handed back (a1's too: see the next test), neither offered.
    assert sorted((r.allocation_id, r.reason) for r in recoveries(cmds)) == [
        ("x", RC.RECOVER_REASON_RESCINDED), ("y", RC.RECOVER_REASON_RESCINDED)]
    assert len(notices(cmds, "allocation_dropped")) == 2
    core.allocations([alloc("w", "f1", "a2", cpus=1, mem=1)], T0, synced=False)
    cmds = core.stream_changed([agent_entry("a2")], T0, reset=True)  # f1 absent: gone
    assert not only(cmds, SendOffers)
    assert {r.allocation_id for r in recoveries(cmds)} >= {"w"}
    core.validate()


def test_allocations_held_for_an_agent_missing_from_a_new_copy_go_back_to_the_allocator(
) -> None:
    """Seen in the failover bench: a new master's first snapshot lacked the agents (they
    were published as they re-registered, a moment later). The broker dropped the
    allocations it held for them without a Recovery, as if the allocator would see the
    agents leave too; but the allocator's copy, taken a moment later, had them: it counted
    those resources as offered for good and never offered them again. Now they go back
    (a Recovery for an agent the allocator dropped meanwhile is stale and ignored)."""
    core = broker(prefix="e7")
    core.master_changed(1, T0)
    core.stream_changed([agent_entry("a1"), framework_entry("f1")], T0, reset=True)
    core.master_changed(2, T0 + 1)
    core.allocations([alloc("x", "f1", "a1", cpus=1, mem=64)], T0 + 1, synced=False)
    cmds = core.stream_changed([framework_entry("f1")], T0 + 1, reset=True)  # no agents yet
    assert not only(cmds, SendOffers)
    (rec,) = recoveries(cmds)
    assert (rec.allocation_id, rec.agent_id, rec.reason, rec.refuse_seconds) == (
        "x", "a1", RC.RECOVER_REASON_RESCINDED, 0)
    assert rec.resources == Resources.of(cpus=1, mem=64)
    assert core.held == 0
    core.validate()
