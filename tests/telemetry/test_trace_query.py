"""/traces (issue 11): the query (exactly one span set; anything else a clear 400), which
spans it selects (a trace's own and those linking into it), the files a process serves
(rotated siblings, an agent's executors' files), the bounded streaming scan (newest kept,
long lines skipped), the merge by span id; and the route on a real service kit, behind the
bearer token like the other paths, its 400s counted."""

from __future__ import annotations

import http.client
import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from services.bus.reactor import Reactor
from services.shell import service as kit_module
from services.shell.service import ServiceConfig, ServiceKit
from services.telemetry import query as Q
from services.telemetry import spans as S

T1, T2 = "a" * 32, "b" * 32


def otlp_line(*spans: dict[str, Any], service: str = "svc") -> str:
    """One ExportTraceServiceRequest as the file exporter writes it."""
    def kv(attrs: dict[str, Any]) -> list[dict[str, Any]]:
        return [{"key": k, "value": {"arrayValue": {"values": [{"stringValue": x} for x in v]}}
                 if isinstance(v, list) else {"stringValue": v}} for k, v in attrs.items()]

    raw = [{"traceId": s["traceId"], "spanId": s["spanId"], "name": s.get("name", "x"),
            "attributes": kv(s.get("attrs", {})), "links": s.get("links", [])} for s in spans]
    return json.dumps({"resourceSpans": [{
        "resource": {"attributes": kv({"service.name": service})},
        "scopeSpans": [{"scope": {"name": "t"}, "spans": raw}]}]}) + "\n"


def span(trace: str, sid: str, **attrs: Any) -> dict[str, Any]:
    links = attrs.pop("links", [])
    return {"traceId": trace, "spanId": sid, "links": links,
            "attrs": {getattr(S, k): v for k, v in attrs.items()}}


# -- the query ------------------------------------------------------------------------------
def test_a_query_names_exactly_one_span_set() -> None:
    assert Q.parse({"task": ["web-0-1"]}) == Q.TraceQuery("task", ("web-0-1",))
    assert Q.parse({"offer": ["o-1"]}).kind == "offer"
    assert Q.parse({"framework": ["web"]}).values == ("web",)
    assert Q.parse({"trace": [f"{T1.upper()}, {T2},{T1}"]}).values == (T1, T2)
    for bad, says in [({}, "no span set named"),
                      ({"task": ["a"], "offer": ["b"]}, "more than one span set"),
                      ({"task": ["a", "b"]}, "more than one span set"),
                      ({"task": ["a"], "limit": ["9"]}, "unknown parameter(s) limit"),
                      ({"task": [" "]}, "empty task id"),
                      ({"trace": ["xyz"]}, "not a trace id (32 hex digits)"),
                      ({"trace": [""]}, "0 trace ids given"),
                      ({"trace": [",".join(f"{i:032x}" for i in range(Q.MAX_TRACE_IDS + 1))]},
                       f"{Q.MAX_TRACE_IDS + 1} trace ids given")]:
        with pytest.raises(Q.BadQuery, match=None) as err:
            Q.parse(bad)
        assert says in str(err.value), (bad, str(err.value))
        assert "?task=ID" in str(err.value) or "trace id" in str(err.value)
    assert Q.parse({"task": ["a b&c"]}).encode() == "task=a+b%26c"


def test_what_a_query_selects() -> None:
    launch = span(T1, "1" * 16, TASK_IDS=["web-0-1"], FRAMEWORK_ID="fw-1")
    status = span(T2, "2" * 16, TASK_ID="web-0-1", links=[{"traceId": T1, "spanId": "1" * 16}])
    decide = span(T1, "3" * 16, FRAMEWORK_NAME="web", OFFER_IDS=["o-1", "o-2"])
    assert [Q.matches(s, Q.parse({"task": ["web-0-1"]})) for s in (launch, status, decide)] \
        == [True, True, False]
    assert [Q.matches(s, Q.parse({"offer": ["o-2"]})) for s in (launch, status, decide)] \
        == [False, False, True]
    assert [Q.matches(s, Q.parse({"framework": ["web"]})) for s in (launch, status, decide)] \
        == [False, False, True]
    assert [Q.matches(s, Q.parse({"framework": ["fw-1"]})) for s in (launch, status, decide)] \
        == [True, False, False]
    # A trace's own spans and the spans linking into it (a task's status spans).
    assert [Q.matches(s, Q.parse({"trace": [T1]})) for s in (launch, status, decide)] \
        == [True, True, True]
    assert [Q.matches(s, Q.parse({"trace": [T2]})) for s in (launch, status, decide)] \
        == [False, True, False]


# -- files and the scan -----------------------------------------------------------------------
def test_a_process_serves_its_file_its_rotated_siblings_and_its_neighbours(
        tmp_path: Path) -> None:
    own = tmp_path / "offerbus-agent-7.jsonl"
    for name in ("offerbus-agent-7.jsonl", "offerbus-agent-7.1.jsonl",
                 "offerbus-agent-7.2.jsonl", "offerbus-agent-70.jsonl",
                 "offerbus-agent-7.x.jsonl", "offerbus-executor-9.jsonl",
                 "offerbus-executor-8.jsonl", "offerbus-master-1.jsonl"):
        (tmp_path / name).write_text("")
    os.utime(tmp_path / "offerbus-executor-9.jsonl", (1, 1))  # older than executor-8
    assert [p.name for p in Q.own_files(own)] == [
        "offerbus-agent-7.2.jsonl", "offerbus-agent-7.1.jsonl", "offerbus-agent-7.jsonl"]
    assert [p.name for p in Q.own_files(own, ("offerbus-executor-*.jsonl",))][3:] == [
        "offerbus-executor-9.jsonl", "offerbus-executor-8.jsonl"]
    assert Q.own_files(None) == []


def test_the_scan_keeps_the_newest_within_its_bounds(tmp_path: Path) -> None:
    older, newer = tmp_path / "s.1.jsonl", tmp_path / "s.jsonl"
    older.write_text("".join(otlp_line(span(T1, f"{i:016x}", TASK_ID="t-1"),
                                       span(T1, f"{i + 100:016x}", TASK_ID="t-2"))
                             for i in range(5)) + "{torn\n" + "[1, 2]\n")
    newer.write_text(otlp_line(*(span(T2, f"{i + 10:016x}", TASK_ID="t-1") for i in range(5)),
                               service="master"))
    q = Q.parse({"task": ["t-1"]})
    found, truncated = Q.scan([older, newer, tmp_path / "gone.jsonl"], q)
    assert len(found) == 10 and not truncated
    assert {s["attrs"][S.TASK_ID] for s in found} == {"t-1"}
    assert found[-1]["resource"]["service.name"] == "master"
    assert "attributes" not in found[0]  # sent once, as "attrs"
    found, truncated = Q.scan([older, newer], q, max_spans=3)
    assert truncated and [s["spanId"] for s in found] == [f"{i:016x}" for i in (12, 13, 14)]
    one = len(json.dumps(found[-1], separators=(",", ":")))
    found, truncated = Q.scan([older, newer], q, max_bytes=2 * one + 1)
    assert truncated and len(found) == 2
    status, body = Q.answer([older, newer], {"task": ["t-2"]})
    assert status == 200 and json.loads(body) == {"spans": json.loads(body)["spans"],
                                                  "truncated": False}
    assert len(json.loads(body)["spans"]) == 5
    status, body = Q.answer([older, newer], {"task": ["t-2"], "offer": ["o"]})
    assert status == 400 and b"more than one span set" in body


def test_a_line_longer_than_the_limit_is_skipped_unread(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "s.jsonl"
    small = otlp_line(span(T1, "1" * 16, TASK_ID="t-1"))
    big = otlp_line(*(span(T1, f"{i + 2:016x}", TASK_ID="t-1") for i in range(40)))
    path.write_text(small + big + small.replace("1" * 16, "f" * 16))
    monkeypatch.setattr(Q, "MAX_LINE_BYTES", len(small) + 10)
    assert len(big) > 3 * Q.MAX_LINE_BYTES
    found, _ = Q.scan([path], Q.parse({"task": ["t-1"]}))
    assert [s["spanId"] for s in found] == ["1" * 16, "f" * 16]


def test_merge_keeps_each_span_once_and_linked_traces_follow_links() -> None:
    a, b = span(T1, "1" * 16), span(T2, "2" * 16, links=[{"traceId": T1, "spanId": "1" * 16}])
    c = span(T2, "3" * 16, links=[{"traceId": "c" * 32, "spanId": "4" * 16}])
    assert Q.merge([a, b], [dict(a), c], [b]) == [a, b, c]
    assert Q.linked_traces([b, c, a]) == [T2, T1, "c" * 32]


# -- the route on a service kit ---------------------------------------------------------------
@pytest.fixture
def kit(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[ServiceKit]:
    own = tmp_path / "offerbus-test-1.jsonl"
    own.write_text(otlp_line(span(T1, "1" * 16, TASK_ID="t-1"), span(T1, "2" * 16)))
    (tmp_path / "offerbus-test-1.1.jsonl").write_text(otlp_line(span(T2, "3" * 16,
                                                                     TASK_ID="t-1")))
    monkeypatch.setattr(kit_module, "trace_file", lambda: own)
    k = ServiceKit("test", "test-1", 0, ServiceConfig(http_token="tok"), Reactor())
    k.start_http()
    yield k
    k.close()


def get(k: ServiceKit, path: str, token: str = "tok") -> tuple[int, bytes]:
    assert k.http is not None
    conn = http.client.HTTPConnection("127.0.0.1", k.http.port, timeout=10)
    conn.request("GET", path, headers={"Authorization": f"Bearer {token}"} if token else {})
    resp = conn.getresponse()
    body = resp.read()
    conn.close()
    return resp.status, body


def test_the_traces_route_answers_from_the_process_files(kit: ServiceKit) -> None:
    status, body = get(kit, "/traces?task=t-1")
    assert status == 200
    doc = json.loads(body)
    assert doc["truncated"] is False
    assert [s["spanId"] for s in doc["spans"]] == ["3" * 16, "1" * 16]  # rotated first
    status, body = get(kit, f"/traces?trace={T1}")
    assert status == 200 and len(json.loads(body)["spans"]) == 2
    assert get(kit, "/traces?task=t-1", token="")[0] == 401
    assert get(kit, "/traces?task=t-1", token="wrong")[0] == 401
    for bad in ("/traces", "/traces?task=a&offer=b", "/traces?trace=nothex"):
        status, body = get(kit, bad)
        assert status == 400 and b"400 bad request:" in body, (bad, body)
    metrics = kit.metrics.exposition().decode()  # (its /metrics route needs the reactor)
    assert "offerbus_test_traces_bad_requests_total 3.0" in metrics
