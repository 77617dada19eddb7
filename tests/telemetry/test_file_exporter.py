"""The OTLP-JSON file exporter writes what OTLP/JSON readers expect (hex ids, resource and
attributes), and traceparents carry a span's context from one process's span to another's."""

from __future__ import annotations

import json
import os
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


def test_a_span_with_a_lone_surrogate_or_a_nan_is_written_not_lost(tmp_path: Path) -> None:
    """orjson refuses a str that is not UTF-8 (a name decoded with surrogateescape) and JSON
    has no NaN: the batch is still written (escaped; proto3 JSON's "NaN"), with its
    neighbours, and read back."""
    path = tmp_path / "svc.jsonl"
    provider = TracerProvider(resource=Resource.create({"service.name": "offerbus-test"}))
    provider.add_span_processor(SimpleSpanProcessor(OtlpJsonFileExporter(path)))
    tracer = provider.get_tracer("t")
    tracer.start_span("odd", attributes={"name": "bad\udcff", "share": float("nan"),
                                         "limit": float("inf")}).end()
    tracer.start_span("plain").end()
    provider.shutdown()
    spans = {s["name"]: s for s in read_spans(path)}
    assert set(spans) == {"odd", "plain"}
    assert spans["odd"]["attrs"]["name"] == "bad\udcff"
    assert spans["odd"]["attrs"]["share"] == "NaN"
    assert spans["odd"]["attrs"]["limit"] == "Infinity"


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

    def decoded(text: bytes) -> list[dict[str, object]]:
        path = tmp_path / f"{len(text)}-{time.perf_counter_ns()}.jsonl"
        path.write_bytes(text + b"\n")
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


def test_a_trace_file_is_rotated_and_its_folder_kept_within_its_budget(tmp_path: Path) -> None:
    """Trace files never grow without bound (issue 10, defect 8): past `max_bytes` the file
    is rotated to `<name>.1.jsonl` (older backups dropped), and readers still see every
    file; a folder over its budget loses its oldest files first, never the live one."""
    from services.telemetry.file_exporter import prune_folder

    folder = tmp_path / "traces"
    path = folder / "svc-1.jsonl"
    provider = TracerProvider(resource=Resource.create({"service.name": "offerbus-test"}))
    provider.add_span_processor(SimpleSpanProcessor(
        OtlpJsonFileExporter(path, max_bytes=4096, backups=1)))
    tracer = provider.get_tracer("t")
    for i in range(200):
        with tracer.start_as_current_span(f"s{i}", attributes={"pad": "x" * 100}):
            pass
    provider.shutdown()
    files = sorted(p.name for p in folder.iterdir())
    assert files == ["svc-1.1.jsonl", "svc-1.jsonl"], files
    assert all(p.stat().st_size <= 4096 + 2048 for p in folder.iterdir())
    names = [s["name"] for p in sorted(folder.glob("*.jsonl")) for s in read_spans(p)]
    assert "s199" in names and "s0" not in names  # the newest kept, the oldest dropped

    old = [folder / f"executor-{n}.jsonl" for n in range(5)]
    for age, p in enumerate(old):
        p.write_text("x" * 1000 + "\n")
        os.utime(p, (1_000_000 + age, 1_000_000 + age))
    budget = path.stat().st_size + (folder / "svc-1.1.jsonl").stat().st_size + 1001 + 10
    removed = prune_folder(folder, max_bytes=budget, keep=path)
    assert [p.name for p in removed] == ["executor-0.jsonl", "executor-1.jsonl",
                                         "executor-2.jsonl", "executor-3.jsonl"]
    assert path.exists() and (folder / "executor-4.jsonl").exists()
