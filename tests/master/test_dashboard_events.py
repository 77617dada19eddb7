"""/state/events (the dashboard's live feed): the /state document of the query as a
Server-Sent Event at once and again whenever the view changed, an `idle` event while the
master does not lead, a comment while nothing happens, and a bad query answered 400."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest

from schemas import bus_pb2, common_pb2, state_pb2
from services.master import dashboard
from services.master.view import StateView
from services.shell.http import Response


def framework(fid: str) -> bus_pb2.StateEntry:
    value = state_pb2.StateValue(framework=state_pb2.FrameworkRecord(
        framework_info=common_pb2.FrameworkInfo(framework_id=fid, name=fid)))
    return bus_pb2.StateEntry(key=f"frameworks/{fid}", value=value)


def event(chunk: bytes) -> tuple[str, dict[str, Any]]:
    kind, data = chunk.decode().split("\n")[:2]
    assert kind.startswith("event: ") and data.startswith("data: ") and chunk.endswith(b"\n\n")
    return kind.removeprefix("event: "), json.loads(data.removeprefix("data: "))


def test_events_follow_the_view(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(dashboard, "MIN_EVENT_GAP_S", 0.0)
    monkeypatch.setattr(dashboard, "KEEPALIVE_S", 0.05)
    view = StateView("m1")
    view.lead([framework("f1")], epoch=4, paused=False, cluster_id="c")
    route = dashboard.state_events(view).route
    bad = route({"nonsense": ["1"]})
    assert isinstance(bad, Response) and bad.status == 400
    stream = route({"decisions": ["1"], "tasks": ["0"]})
    assert isinstance(stream, Iterator)
    assert next(stream) == b"retry: 2000\n\n"
    kind, doc = event(next(stream))
    assert kind == "state" and doc["epoch"] == 4 and doc["decisions"] == []
    assert [f["framework_info"]["framework_id"] for f in doc["frameworks"]] == ["f1"]
    assert "tasks" not in doc  # the query's document

    view.publish([framework("f2")])
    kind, doc = event(next(stream))
    assert [f["framework_info"]["framework_id"] for f in doc["frameworks"]] == ["f1", "f2"]
    assert next(stream) == b": idle\n\n"  # nothing changed within the keep-alive
    view.set_meta(paused=False)  # a handover that changes nothing shown: no event
    assert next(stream) == b": idle\n\n"
    view.step_down()
    kind, doc = event(next(stream))
    assert (kind, doc) == ("idle", {"leading": False, "id": "m1"})
