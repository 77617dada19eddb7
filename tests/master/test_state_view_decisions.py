"""The allocator's latest decisions, which the master already publishes on its state stream,
in /state on request (`?decisions=1`, for the dashboard): left out by default, filtered
with the frameworks, and gone when the stream deletes them."""

from __future__ import annotations

import json
from typing import Any

import pytest

from schemas import bus_pb2, common_pb2, internal_pb2, state_pb2
from services.master.view import BadQuery, StateView


def decision(fid: str, outcome: internal_pb2.AllocatorDecision.Outcome.ValueType,
             share: float) -> bus_pb2.StateEntry:
    value = state_pb2.StateValue(decision=internal_pb2.AllocatorDecision(
        framework_id=fid, role="web", outcome=outcome, dominant_share=share,
        reason=f"why {fid}"))
    return bus_pb2.StateEntry(key=f"decisions/{fid}", value=value)


def framework(fid: str, name: str) -> bus_pb2.StateEntry:
    value = state_pb2.StateValue(framework=state_pb2.FrameworkRecord(
        framework_info=common_pb2.FrameworkInfo(framework_id=fid, name=name)))
    return bus_pb2.StateEntry(key=f"frameworks/{fid}", value=value)


def doc(view: StateView, query: dict[str, list[str]]) -> dict[str, Any]:
    status, body, _ = view.document(query)
    assert status == 200
    doc: dict[str, Any] = json.loads(body)
    return doc


def test_decisions_are_shown_on_request_filtered_and_removed() -> None:
    offered = internal_pb2.AllocatorDecision.OUTCOME_OFFERED
    fair = internal_pb2.AllocatorDecision.OUTCOME_FAIR_SHARE
    view = StateView("m1")
    view.lead([framework("f1", "one"), framework("f2", "two"), decision("f1", offered, 0.25)],
              epoch=3, paused=False, cluster_id="c")
    assert "decisions" not in doc(view, {})  # /state as it always was
    [d] = doc(view, {"decisions": ["1"]})["decisions"]
    assert (d["framework_id"], d["outcome"], d["dominant_share"]) == (
        "f1", "OUTCOME_OFFERED", 0.25)

    _, _, etag = view.document({"decisions": ["1"]})
    view.publish([decision("f2", fair, 0.5)])
    _, _, etag2 = view.document({"decisions": ["1"]})
    assert etag2 != etag  # a new decision is a new version
    both = doc(view, {"decisions": ["1"]})["decisions"]
    assert [x["framework_id"] for x in both] == ["f1", "f2"]
    only = doc(view, {"decisions": ["1"], "framework_name": ["two"]})["decisions"]
    assert [x["framework_id"] for x in only] == ["f2"]

    view.publish([bus_pb2.StateEntry(key="decisions/f1", deleted=True)])
    assert [x["framework_id"] for x in doc(view, {"decisions": ["1"]})["decisions"]] == ["f2"]
    with pytest.raises(BadQuery, match="decisions"):
        view.document({"decisions": ["yes"]})
