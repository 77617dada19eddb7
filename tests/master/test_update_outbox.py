"""The master's outbox of status updates to frameworks (services/master/outbox.py): one
event per framework connection and turn, in order, bounded."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from schemas import common_pb2, scheduler_pb2
from services.master.outbox import UpdateOutbox

Update = scheduler_pb2.SchedulerEvent.Update


def update(*tids: str) -> Update:
    return Update(statuses=[common_pb2.TaskStatus(task_id=t, state=common_pb2.TASK_RUNNING)
                            for t in tids])


def ids(events: list[tuple[bytes, str, scheduler_pb2.SchedulerEvent, str]]) -> list[list[str]]:
    return [[s.task_id for s in e.update.statuses] for _, _, e, _ in events]


def test_a_turns_updates_to_one_framework_go_as_one_event_in_order() -> None:
    box = UpdateOutbox()
    assert box.add(b"f1", "F1", update("a", "b"), "tp-1") == []
    assert box.add(b"f2", "F2", update("x"), "tp-2") == []
    assert box.add(b"f1", "F1", update("c"), "tp-3") == []
    out = box.drain()
    assert [(p, f, tp) for p, f, _, tp in out] == [(b"f1", "F1", "tp-1"), (b"f2", "F2", "tp-2")]
    assert ids(out) == [["a", "b", "c"], ["x"]]
    assert box.drain() == [] and len(box) == 0


def test_taking_one_connections_updates_leaves_the_others() -> None:
    box = UpdateOutbox()
    box.add(b"f1", "F1", update("a"), "")
    box.add(b"f2", "F2", update("x"), "")
    assert ids(box.take(b"f1")) == [["a"]] and box.take(b"f1") == []
    assert ids(box.drain()) == [["x"]]


def test_a_connection_taken_over_by_another_framework_sends_the_first_ones_updates() -> None:
    box = UpdateOutbox()
    box.add(b"p", "F1", update("a"), "")
    out = box.add(b"p", "F2", update("b"), "")
    assert [(f, i) for (_, f, _, _), i in zip(out, ids(out), strict=True)] == [("F1", ["a"])]
    assert [f for _, f, _, _ in box.drain()] == ["F2"]


@given(st.lists(st.tuples(st.sampled_from([b"f1", b"f2"]), st.integers(1, 7)), max_size=40),
       st.integers(1, 10))
def test_no_event_is_over_the_bound_and_every_status_goes_once_in_order(
        adds: list[tuple[bytes, int]], bound: int) -> None:
    box = UpdateOutbox(max_statuses=bound)
    sent: list[tuple[bytes, str, scheduler_pb2.SchedulerEvent, str]] = []
    made: dict[bytes, list[str]] = {b"f1": [], b"f2": []}
    for k, (peer, n) in enumerate(adds):
        tids = [f"{k}-{i}" for i in range(n)]
        made[peer] += tids
        sent += box.add(peer, peer.decode(), update(*tids), "")
    sent += box.drain()
    for peer, want in made.items():
        got = [t for p, _, e, _ in sent if p == peer for t in (s.task_id for s in
                                                                e.update.statuses)]
        assert got == want
    # An event holds more than the bound only when one update alone does.
    assert all(len(e.update.statuses) <= max(bound, 7) for _, _, e, _ in sent)
    assert len(box) == 0
