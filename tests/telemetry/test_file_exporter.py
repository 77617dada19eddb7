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
