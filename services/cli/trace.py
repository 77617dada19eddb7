"""`offerbus trace task|offer ID`: the spans that name a task or an offer, gathered from the
cluster's processes (their /traces: services/cli/cluster_traces.py) and this machine's
<run-dir>/traces/ files, laid out as a terminal waterfall. The selection and the rows are
pure functions of span dicts (as services.telemetry.query reads them)."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table
from rich.text import Text

from services.cli.client import CliError
from services.telemetry import query as Q
from services.telemetry import spans as S
from services.telemetry.query import names

Span = dict[str, Any]
KEYS = {kind: Q.KEYS[kind] for kind in ("task", "offer")}
BAR_WIDTH = 32
STATUS_ERROR = 2  # OTLP Status.code


@dataclass(frozen=True)
class Row:
    """One span of the waterfall."""

    trace_id: str
    span_id: str
    depth: int
    offset_ms: float  # from the earliest span shown
    duration_ms: float
    start_frac: float  # where the bar starts and ends, as fractions of the total time
    end_frac: float
    service: str
    name: str
    facts: str
    error: bool = False
    linked: bool = False  # placed under the span it links to (a task's status spans)


# -- reading ------------------------------------------------------------------------------
def load_spans(folder: Path) -> list[Span]:
    """Every span in every *.jsonl file of `folder` (missing folder: none)."""
    from services.cli.cluster_traces import local_spans

    return local_spans(folder)


def start_ns(span: Span) -> int:
    return int(span.get("startTimeUnixNano") or 0)


def end_ns(span: Span) -> int:
    return max(int(span.get("endTimeUnixNano") or 0), start_ns(span))


def service_of(span: Span) -> str:
    return str(span.get("resource", {}).get("service.name", "?"))


def _links(span: Span) -> list[tuple[str, str]]:
    return [(x.get("traceId", ""), x.get("spanId", "")) for x in span.get("links", [])]


# -- selection ----------------------------------------------------------------------------
def select(spans: list[Span], kind: str, ident: str) -> list[Span]:
    """The spans naming the task/offer, their ancestors and descendants in their traces; for
    a root span among them, the spans it links to (a task's `status` spans link to its
    launch) with their ancestors; for an offer, the spans linking to any of these (its
    tasks' status spans). Sorted by start time."""
    by_id = {(s["traceId"], s["spanId"]): s for s in spans}
    children: dict[tuple[str, str], list[Span]] = {}
    for s in spans:
        if s.get("parentSpanId"):
            children.setdefault((s["traceId"], s["parentSpanId"]), []).append(s)
    hits = [s for s in spans if names(s, kind, ident)]
    keep: dict[tuple[str, str], Span] = {}

    def up(span: Span | None) -> None:
        while span is not None and (span["traceId"], span["spanId"]) not in keep:
            keep[(span["traceId"], span["spanId"])] = span
            span = by_id.get((span["traceId"], span.get("parentSpanId", "")))

    def down(span: Span) -> None:
        stack = [span]
        while stack:
            s = stack.pop()
            keep[(s["traceId"], s["spanId"])] = s
            stack.extend(c for c in children.get((s["traceId"], s["spanId"]), [])
                         if (c["traceId"], c["spanId"]) not in keep)

    for s in hits:
        down(s)
        keep.pop((s["traceId"], s["spanId"]))
        up(s)
        if not s.get("parentSpanId"):  # a root's links stand in for its parent (status)
            for link in _links(s):
                up(by_id.get(link))
    if hits and kind == "offer":  # a task's own status spans are hits already
        for s in spans:
            if any(link in keep for link in _links(s)):
                down(s)
    return sorted(keep.values(), key=lambda s: (start_ns(s), end_ns(s) * -1))


# -- the waterfall ------------------------------------------------------------------------
def waterfall(spans: list[Span]) -> list[Row]:
    """One row per span, sorted by start time, with its depth in the parent tree (a root
    that links to a span shown sits under it) and its bar within the total time."""
    if not spans:
        return []
    by_id = {(s["traceId"], s["spanId"]): s for s in spans}
    depth: dict[tuple[str, str], int] = {}

    def depth_of(key: tuple[str, str], seen: frozenset[tuple[str, str]]) -> int:
        if key in depth:
            return depth[key]
        span = by_id[key]
        parent = (span["traceId"], span.get("parentSpanId", ""))
        if parent not in by_id:
            parent = next((x for x in _links(span) if x in by_id), ("", ""))
        d = depth_of(parent, seen | {key}) + 1 if parent in by_id and parent not in seen else 0
        depth[key] = d
        return d

    t0 = min(start_ns(s) for s in spans)
    total = max(max(end_ns(s) for s in spans) - t0, 1)
    rows = []
    for s in sorted(spans, key=lambda s: (start_ns(s), -end_ns(s))):
        key = (s["traceId"], s["spanId"])
        parent_here = (s["traceId"], s.get("parentSpanId", "")) in by_id
        rows.append(Row(
            trace_id=s["traceId"], span_id=s["spanId"], depth=depth_of(key, frozenset()),
            offset_ms=(start_ns(s) - t0) / 1e6, duration_ms=(end_ns(s) - start_ns(s)) / 1e6,
            start_frac=(start_ns(s) - t0) / total, end_frac=(end_ns(s) - t0) / total,
            service=service_of(s), name=s.get("name", ""), facts=facts(s),
            error=s.get("status", {}).get("code") == STATUS_ERROR,
            linked=not parent_here and any(x in by_id for x in _links(s))))
    return rows


def _ids(value: Any) -> str:
    items = [str(v) for v in value or ()]
    return ",".join(items[:3]) + (f" +{len(items) - 3}" if len(items) > 3 else "")


def facts(span: Span) -> str:
    """The key facts of a span, by its name (spans.py vocabulary), then its events."""
    a, name = span.get("attrs", {}), span.get("name", "")
    out: list[str] = []

    def add(label: str, key: str) -> None:
        if a.get(key) not in (None, "", []):
            out.append(f"{label}{a[key]}")

    where = a.get(S.HOSTNAME) or a.get(S.AGENT_ID)
    if name == S.ALLOCATE:
        add("framework ", S.FRAMEWORK_NAME if a.get(S.FRAMEWORK_NAME) else S.FRAMEWORK_ID)
        if a.get(S.DOMINANT_SHARE) is not None:
            out.append(f"dominant share {float(a[S.DOMINANT_SHARE]):.3f}"
                       + (f" ({a[S.DOMINANT_RESOURCE]})" if a.get(S.DOMINANT_RESOURCE) else ""))
        add("cycle ", S.CYCLE)
        if a.get(S.SKIPPED):
            out.append("skipped: " + "; ".join(str(x) for x in a[S.SKIPPED]))
    elif name == S.OFFER:
        out.append(f"offer {_ids(a.get(S.OFFER_IDS) or [a.get(S.OFFER_ID, '')])}")
        if where:
            out.append(f"on {where}")
        add("", S.RESOURCES)
    elif name == S.DECIDE:
        out.append(str(a.get(S.DECISION, "?")))
        if a.get(S.TASK_IDS):
            out.append(f"tasks {_ids(a[S.TASK_IDS])}")
        add("refuse ", S.REFUSE_SECONDS)
        if a.get(S.REASON):
            out.append(f"reason: {a[S.REASON]}")
    elif name in (S.VALIDATE, S.LAUNCH) and S.VALID in a:
        add("", S.DECISION)
        out.append("valid" if a[S.VALID] else f"refused ({a.get(S.FAILED_CHECK) or '?'})")
        if not a[S.VALID] and a.get(S.REASON):
            out.append(str(a[S.REASON]))
    if name in (S.LAUNCH, S.RUN, S.START, S.STATUS, S.VALIDATE):
        add("task ", S.TASK_ID)
        if a.get(S.TASK_IDS):
            out.append(f"tasks {_ids(a[S.TASK_IDS])}")
        if name != S.OFFER and where:
            out.append(f"on {where}")
    if name == S.RUN:
        add("executor ", S.EXECUTOR_ID)
        add("", S.REASON)
    elif name == S.START:
        add("image ", S.IMAGE)
        if a.get(S.CONTAINER_ID):
            out.append(f"container {str(a[S.CONTAINER_ID])[:12]}")
    elif name == S.STATUS:
        add("", S.TASK_STATE)
        if a.get(S.REASON) and not str(a[S.REASON]).startswith("REASON_UNSPECIFIED"):
            out.append(str(a[S.REASON]))
    elif name == S.RESCIND:
        add("offer ", S.OFFER_ID)
        add("", S.REASON)
    events = [e.get("name", "") for e in span.get("events", [])]
    if events:
        out.append("events: " + ", ".join(events))
    status = span.get("status", {})
    if status.get("code") == STATUS_ERROR:
        out.append(f"ERROR {status.get('message', '')}".strip())
    return "; ".join(out)


def bar(start_frac: float, end_frac: float, width: int = BAR_WIDTH) -> str:
    """The span's place in the total time: spaces, then at least one block."""
    first = min(int(start_frac * width), width - 1)
    last = max(first + 1, min(width, round(end_frac * width)))
    return " " * first + "█" * (last - first) + " " * (width - last)


# -- printing -----------------------------------------------------------------------------
def table(rows: Iterable[Row], title: str, width: int = 160) -> Table:
    """The rows as a rich table for a terminal `width` wide (the bar shrinks to fit)."""
    bar_width = max(6, min(BAR_WIDTH, width - 100))
    t = Table(title=title, title_justify="left", show_edge=False, pad_edge=False,
              box=None, header_style="bold", padding=(0, 1, 0, 0))
    t.add_column("+ms", justify="right", no_wrap=True, min_width=5)
    t.add_column("ms", justify="right", no_wrap=True, min_width=5)
    t.add_column("", no_wrap=True, min_width=bar_width)
    t.add_column("service", no_wrap=True, overflow="ellipsis", max_width=20)
    t.add_column("span", no_wrap=True)
    t.add_column("facts", overflow="fold", min_width=20)
    for r in rows:
        colour = "red" if r.error else "cyan" if r.linked else "green"
        t.add_row(f"{r.offset_ms:.1f}", f"{r.duration_ms:.1f}",
                  Text(bar(r.start_frac, r.end_frac, bar_width), style=colour), r.service,
                  "  " * r.depth + ("↳ " if r.linked else "") + r.name, Text(r.facts))
    return t


def no_spans_message(kind: str, ident: str, folder: Path, run_dir: Path,
                     cluster: bool = False) -> str:
    from services.cli.cluster import traces_dir

    found = len(list(folder.glob("*.jsonl"))) if folder.is_dir() else 0
    where = f"the cluster's processes nor {folder}" if cluster else str(folder)
    return (f"no spans for {kind} {ident} in {where} ({found} trace files) — is tracing on? "
            f"`offerbus up` writes traces to {traces_dir(run_dir)}/ (OFFERBUS_TRACES_DIR); "
            f"spans reach the files about a second after they end")


def cmd_trace(args: argparse.Namespace, console: Console) -> int:
    from services.cli.cluster import traces_dir
    from services.cli.cluster_traces import collect

    folder = args.traces or traces_dir(args.run_dir)
    spans, notes = collect(args, folder, [Q.TraceQuery(args.kind, (args.id,))], follow=True)
    for note in notes:  # on stderr: --json stays one document
        print(f"offerbus trace: {note}", file=sys.stderr)
    chosen = select(spans, args.kind, args.id)
    if not chosen:
        local = args.local or args.traces is not None
        raise CliError(no_spans_message(args.kind, args.id, folder, args.run_dir,
                                        cluster=not local and not any(
                                            n.startswith("no cluster") for n in notes)))
    rows = waterfall(chosen)
    if getattr(args, "json", False):
        from dataclasses import asdict

        from services.cli.views import print_json

        print_json(console, [asdict(r) for r in rows])
        return 0
    traces = sorted({r.trace_id for r in rows})
    total = max(r.offset_ms + r.duration_ms for r in rows)
    console.print(table(rows, f"{args.kind} {args.id}: {len(rows)} spans in "
                              f"{len(traces)} trace(s) over {total:.1f} ms "
                              f"(trace {', '.join(t[:12] for t in traces)})", console.width))
    return 0


def add_parser(sub: Any) -> None:
    p = sub.add_parser("trace", help="a task's or an offer's trace, as a waterfall")
    p.add_argument("kind", choices=sorted(KEYS))
    p.add_argument("id")
    p.add_argument("--traces", type=Path, default=None,
                   help="read only this folder of OTLP-JSON trace files")
    p.add_argument("--local", action="store_true",
                   help="read only <run-dir>/traces, not the cluster's processes' /traces")
    p.add_argument("--json", action="store_true", help="print the spans' rows as JSON")
