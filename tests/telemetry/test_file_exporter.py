"""The OTLP-JSON file exporter writes what OTLP/JSON readers expect (hex ids, resource and
attributes), and traceparents carry a span's context from one process's span to another's."""

from __future__ import annotations

import json
from pathlib import Path

from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor

from services.telemetry import extract, span_traceparent
from services.telemetry.file_exporter import OtlpJsonFileExporter, read_spans


def test_spans_round_trip_through_the_file_with_parentage(tmp_path: Path) -> None:
    path = tmp_path / "traces" / "svc.jsonl"
    provider = TracerProvider(resource=Resource.create({"service.name": "offerbus-test"}))
    provider.add_span_processor(SimpleSpanProcessor(OtlpJsonFileExporter(path)))
    tracer = provider.get_tracer("t")
    with tracer.start_as_current_span("allocate", attributes={"offerbus.cycle": 7}) as parent:
        carried = span_traceparent(parent)
    # Another process would only have the traceparent string:
    ctx = extract(carried)
    assert ctx is not None
    with tracer.start_as_current_span("offer", context=ctx,
                                      attributes={"offerbus.offer_ids": ["o1", "o2"]}):
        pass
    provider.shutdown()
    lines = path.read_text().splitlines()
    assert len(lines) == 2 and all(json.loads(x)["resourceSpans"] for x in lines)
    spans = {s["name"]: s for s in read_spans(path)}
    parent_span, child = spans["allocate"], spans["offer"]
    assert len(parent_span["traceId"]) == 32 and len(parent_span["spanId"]) == 16
    int(parent_span["traceId"], 16)  # hex, not base64
    assert child["traceId"] == parent_span["traceId"]
    assert child["parentSpanId"] == parent_span["spanId"]
    assert carried.split("-")[1] == parent_span["traceId"]
    assert parent_span["attrs"]["offerbus.cycle"] == 7
    assert child["attrs"]["offerbus.offer_ids"] == ["o1", "o2"]
    assert child["resource"]["service.name"] == "offerbus-test"


def test_empty_or_garbled_traceparents_name_no_parent(tmp_path: Path) -> None:
    assert extract("") is None
    assert extract("00-zz-yy-01") is None
    assert read_spans(tmp_path / "missing.jsonl") == []
    torn = tmp_path / "torn.jsonl"
    torn.write_text('{"resourceSpans": [\n')
    assert read_spans(torn) == []


def test_direct_encoding_says_what_the_protobuf_encoding_says(tmp_path: Path) -> None:
    import time

    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
    from opentelemetry.trace import Link, StatusCode

    from services.telemetry.file_exporter import to_otlp_json, to_otlp_json_via_protobuf

    memory = InMemorySpanExporter()
    provider = TracerProvider(resource=Resource.create({"service.name": "offerbus-x",
                                                        "offerbus.agent_id": "S1"}))
    provider.add_span_processor(SimpleSpanProcessor(memory))
    tracer = provider.get_tracer("offerbus.x", "1.2")
    with tracer.start_as_current_span("launch", attributes={
            "offerbus.task_ids": ["a", "b"], "offerbus.valid": True, "n": 3, "x": 0.5}) as root:
        root.add_event("TASK_RUNNING", {"offerbus.container_id": "c1"})
        root.set_status(StatusCode.ERROR, "refused: no fit")
        with tracer.start_as_current_span("run"):
            pass
    with tracer.start_as_current_span("status", links=[Link(root.get_span_context(),
                                                            {"why": "launch"})]):
        pass
    remote = extract(span_traceparent(root))  # a parent from another process
    with tracer.start_as_current_span("start", context=remote):
        pass
    spans = memory.get_finished_spans()

    def decoded(text: str) -> list[dict[str, object]]:
        path = tmp_path / f"{len(text)}-{time.perf_counter_ns()}.jsonl"
        path.write_text(text + "\n")
        keep = ("traceId", "spanId", "parentSpanId", "flags", "name", "kind", "startTimeUnixNano",
                "endTimeUnixNano", "attrs", "resource", "events", "links", "status")
        return sorted(({k: s.get(k) for k in keep} for s in read_spans(path)),
                      key=lambda s: str(s["name"]))

    assert decoded(to_otlp_json(spans)) == decoded(to_otlp_json_via_protobuf(spans))

    t = time.perf_counter()
    for _ in range(50):
        to_otlp_json(spans)
    direct = time.perf_counter() - t
    t = time.perf_counter()
    for _ in range(50):
        to_otlp_json_via_protobuf(spans)
    reference = time.perf_counter() - t
    print(f"direct {direct * 1e3 / 150:.3f} ms/span, protobuf {reference * 1e3 / 150:.3f} ms/span")
