"""`offerbus trace task|offer`: spans written by real TracerProviders through the OTLP-JSON
file exporter, one file per service (parents carried as traceparent strings, as between
processes), come back as a waterfall: order, depth, services, key facts; and the CLI."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from opentelemetry import trace as otel_trace
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.trace import Link, Span

from services.cli import main as cli_main
from services.cli import trace as tv
from services.telemetry import extract, span_traceparent
from services.telemetry import spans as S
from services.telemetry.file_exporter import OtlpJsonFileExporter

T0 = 1_700_000_000 * 10**9  # ns
MS = 10**6
NO_FIT = ("1 instance(s) not placed: no offer fits cpus:0.1;mem:100000 "
          "(e.g. agent-2 offers cpus:4;mem:4096)")


class Services:
    """One TracerProvider (one process, one file) per service name."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.providers: dict[str, TracerProvider] = {}

    def span(self, service: str, name: str, start_ms: float, end_ms: float,
             parent: str = "", links: tuple[str, ...] = (),
             events: tuple[tuple[str, float], ...] = (), **attrs: Any) -> str:
        """Record one span; returns its traceparent (what the next hop's message carries)."""
        if service not in self.providers:
            provider = TracerProvider(resource=Resource.create({"service.name": service}))
            provider.add_span_processor(SimpleSpanProcessor(
                OtlpJsonFileExporter(self.folder / f"{service}-{len(self.providers)}.jsonl")))
            self.providers[service] = provider
        tracer = self.providers[service].get_tracer("offerbus." + service)
        span_links = []
        for tp in links:
            ctx = extract(tp)
            assert ctx is not None
            span_links.append(Link(otel_trace.get_current_span(ctx).get_span_context()))
        span: Span = tracer.start_span(
            name, context=extract(parent) if parent else None, links=span_links,
            attributes={getattr(S, k): v for k, v in attrs.items()},
            start_time=T0 + int(start_ms * MS))
        for event, at_ms in events:
            span.add_event(event, timestamp=T0 + int(at_ms * MS))
        span.end(end_time=T0 + int(end_ms * MS))
        return span_traceparent(span)

    def close(self) -> None:
        for provider in self.providers.values():
            provider.shutdown()


def write_cluster_traces(folder: Path) -> None:
    """Two offers of one allocation cycle, as the services would trace them: web's offer o-1
    on agent-1 is accepted and task web-0-1 runs; big's offer o-2 on agent-2 is declined
    because no offer fits its instances."""
    svc = Services(folder)
    alloc = svc.span("allocator", S.ALLOCATE, 0, 2, FRAMEWORK_ID="fw-web",
                     FRAMEWORK_NAME="web", ALLOCATION_ID="a7-0", AGENT_ID="agent-1",
                     DOMINANT_SHARE=0.125, DOMINANT_RESOURCE="cpus", CYCLE=7,
                     SKIPPED=["fw-batch: FAIR_SHARE: frameworks with a lower weighted share "
                              "took the free resources (its share 0.500)"])
    offer = svc.span("broker", S.OFFER, 2, 3, parent=alloc, OFFER_ID="o-1",
                     FRAMEWORK_ID="fw-web", AGENT_ID="agent-1", HOSTNAME="agent-1",
                     ALLOCATION_ID="a7-0", RESOURCES="cpus:4;mem:4096")
    decide = svc.span("framework-web", S.DECIDE, 3, 5, parent=offer, DECISION="accept",
                      OFFER_IDS=["o-1"], TASK_IDS=["web-0-1"], FRAMEWORK_ID="fw-web",
                      FRAMEWORK_NAME="web", REFUSE_SECONDS=1.0,
                      REASON="accepted: 1 task(s) to launch; operations launch")
    valid = svc.span("broker", S.VALIDATE, 5, 6, parent=decide, VALID=True,
                     OFFER_IDS=["o-1"], DECISION="accept", FRAMEWORK_ID="fw-web")
    launch = svc.span("master", S.LAUNCH, 6, 8, parent=valid, TASK_IDS=["web-0-1"],
                      AGENT_ID="agent-1", FRAMEWORK_ID="fw-web")
    run = svc.span("agent", S.RUN, 8, 20, parent=launch, TASK_ID="web-0-1",
                   EXECUTOR_ID="web-0-1", AGENT_ID="agent-1", HOSTNAME="agent-1")
    svc.span("executor", S.START, 10, 40, parent=run, events=(("TASK_RUNNING", 39),),
             TASK_ID="web-0-1", IMAGE="nginx:alpine", CONTAINER_ID="c0ffee0123456789abcdef")
    svc.span("master", S.STATUS, 41, 42, links=(launch,), TASK_ID="web-0-1",
             TASK_STATE="TASK_RUNNING", AGENT_ID="agent-1", REASON="REASON_UNSPECIFIED")
    # The same cycle's other allocations, each in its own trace: big declines both offers
    # in one call, under the first offer's span and linking the second.
    alloc2 = svc.span("allocator", S.ALLOCATE, 1, 2, FRAMEWORK_ID="fw-big",
                      ALLOCATION_ID="a7-1", AGENT_ID="agent-2", DOMINANT_SHARE=0.0, CYCLE=7)
    offer2 = svc.span("broker", S.OFFER, 2, 4, parent=alloc2, OFFER_ID="o-2",
                      FRAMEWORK_ID="fw-big", AGENT_ID="agent-2", HOSTNAME="agent-2",
                      ALLOCATION_ID="a7-1", RESOURCES="cpus:4;mem:4096")
    alloc3 = svc.span("allocator", S.ALLOCATE, 1, 2, FRAMEWORK_ID="fw-big",
                      ALLOCATION_ID="a7-2", AGENT_ID="agent-3", DOMINANT_SHARE=0.0, CYCLE=7)
    offer3 = svc.span("broker", S.OFFER, 2, 4, parent=alloc3, OFFER_ID="o-3",
                      FRAMEWORK_ID="fw-big", AGENT_ID="agent-3", HOSTNAME="agent-3",
                      ALLOCATION_ID="a7-2", RESOURCES="cpus:4;mem:4096")
    svc.span("framework-big", S.DECIDE, 4, 6, parent=offer2, links=(offer3,),
             DECISION="decline", OFFER_IDS=["o-2", "o-3"], TASK_IDS=[],
             FRAMEWORK_ID="fw-big", FRAMEWORK_NAME="big", REFUSE_SECONDS=5.0, REASON=NO_FIT)
    svc.close()


@pytest.fixture
def traces(tmp_path: Path) -> Iterator[Path]:
    folder = tmp_path / "traces"
    write_cluster_traces(folder)
    yield folder


def test_task_waterfall_follows_the_offer_to_the_running_container(traces: Path) -> None:
    assert len(list(traces.glob("*.jsonl"))) == 7  # one file per service
    rows = tv.waterfall(tv.select(tv.load_spans(traces), "task", "web-0-1"))
    assert [(r.name, r.depth, r.service) for r in rows] == [
        ("allocate", 0, "allocator"), ("offer", 1, "broker"), ("decide", 2, "framework-web"),
        ("validate", 3, "broker"), ("launch", 4, "master"), ("run", 5, "agent"),
        ("start", 6, "executor"), ("status", 5, "master")]
    assert len({r.trace_id for r in rows}) == 2  # the status span's own trace, linked
    by = {r.name: r for r in rows}
    assert by["status"].linked and not by["start"].linked
    assert (by["start"].offset_ms, by["start"].duration_ms) == (10.0, 30.0)
    assert by["status"].end_frac == 1.0 and by["allocate"].start_frac == 0.0
    assert "dominant share 0.125 (cpus)" in by["allocate"].facts
    assert "skipped: fw-batch: FAIR_SHARE" in by["allocate"].facts
    assert by["decide"].facts.startswith("accept; tasks web-0-1; refuse 1.0; reason: acc")
    assert by["validate"].facts == "accept; valid"
    assert by["status"].facts == "task web-0-1; on agent-1; TASK_RUNNING"
    assert "image nginx:alpine" in by["start"].facts
    assert "container c0ffee012345" in by["start"].facts
    assert "events: TASK_RUNNING" in by["start"].facts
    assert "TASK_RUNNING" in by["status"].facts
    assert "o-2" not in " ".join(r.facts for r in rows)  # the other offer's trace is not here


def test_offer_waterfall_of_a_declined_offer(traces: Path) -> None:
    rows = tv.waterfall(tv.select(tv.load_spans(traces), "offer", "o-2"))
    assert [(r.name, r.depth, r.service) for r in rows] == [
        ("allocate", 0, "allocator"), ("offer", 1, "broker"), ("decide", 2, "framework-big")]
    assert rows[0].offset_ms == 0.0 and rows[-1].end_frac == 1.0
    assert rows[1].facts == "offer o-2; on agent-2; cpus:4;mem:4096"
    assert rows[2].facts == f"decline; refuse 5.0; reason: {NO_FIT}"
    assert [r.name for r in tv.waterfall(tv.select(tv.load_spans(traces), "offer", "o-3"))] \
        == ["allocate", "allocate", "offer", "offer", "decide"]  # o-3's, and the decline's
    accepted = tv.waterfall(tv.select(tv.load_spans(traces), "offer", "o-1"))
    assert [r.name for r in accepted][-1] == "status"  # linked to the offer's launch


def test_bar_scales_to_the_total_time() -> None:
    assert tv.bar(0.0, 1.0, 10) == "█" * 10
    assert tv.bar(0.5, 0.5, 10) == " " * 5 + "█" + " " * 4  # an instant still shows
    assert tv.bar(1.0, 1.0, 10) == " " * 9 + "█"


def _run(argv: list[str], monkeypatch: pytest.MonkeyPatch) -> tuple[int, str]:
    from rich.console import Console

    console = Console(width=250, record=True, force_terminal=False)
    monkeypatch.setattr(cli_main, "console", console)
    code = cli_main.main(argv)
    return code, console.export_text()


def test_cli_prints_the_waterfall_and_explains_missing_spans(
        traces: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    code, out = _run(["--run-dir", str(tmp_path), "trace", "task", "web-0-1",
                      "--traces", str(traces)], monkeypatch)
    assert code == 0, out
    assert "task web-0-1: 8 spans in 2 trace(s) over 42.0 ms" in out
    lines = out.splitlines()
    start = next(x for x in lines if "start" in x and "executor" in x)
    assert "image nginx:alpine" in start and "events: TASK_RUNNING" in start
    assert "            start" in start  # indented six levels
    code, out = _run(["--run-dir", str(tmp_path), "trace", "offer", "o-2",
                      "--traces", str(traces)], monkeypatch)
    assert code == 0 and "decline" in out and "no offer fits" in out
    code, out = _run(["--run-dir", str(tmp_path), "trace", "task", "nope",
                      "--traces", str(traces)], monkeypatch)
    assert code == 1
    assert "no spans for task nope in" in out and "is tracing on?" in out
    assert str(tmp_path / "traces") in out


def test_trace_fits_80_columns_and_takes_json(
        traces: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import json

    from rich.console import Console

    console = Console(width=80, record=True)
    monkeypatch.setattr(cli_main, "console", console)
    assert cli_main.main(["--run-dir", str(tmp_path), "trace", "task", "web-0-1",
                          "--traces", str(traces)]) == 0
    out = console.export_text()
    assert max(len(line) for line in out.splitlines()) <= 80, out
    buf = tmp_path / "out.json"
    with open(buf, "w") as f:
        console.file = f
        assert cli_main.main(["--run-dir", str(tmp_path), "trace", "task", "web-0-1",
                              "--traces", str(traces), "--json"]) == 0
    rows = json.loads(buf.read_text())
    assert len(rows) == 8 and {"service", "name", "offset_ms", "facts"} <= set(rows[0])
