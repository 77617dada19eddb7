"""A process's own spans on request (/traces, issue 11): the query (`task=ID`, `offer=ID`,
`trace=TRACE_ID[,...]` or `framework=ID_OR_NAME`; exactly one), which spans it selects, the
files a process reads (its trace file, the file's rotated siblings, for an agent its
executors' files beside it), a bounded streaming scan of them, and the merge of the answers
of many processes by span id. Pure but for reading the files; no HTTP here."""

from __future__ import annotations

import json
from collections import deque
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from services.telemetry import spans as S

Span = dict[str, Any]

# One answer holds at most MAX_SPANS spans and MAX_BYTES of them (as JSON): the newest are
# kept, and "truncated" says some were left out. A line of a trace file (one export batch)
# longer than MAX_LINE_BYTES is skipped unread; a `trace=` query names at most MAX_TRACE_IDS.
MAX_SPANS = 2000
MAX_BYTES = 4 << 20
MAX_LINE_BYTES = 16 << 20
MAX_TRACE_IDS = 32

KEYS = {"task": (S.TASK_ID, S.TASK_IDS), "offer": (S.OFFER_ID, S.OFFER_IDS),
        "framework": (S.FRAMEWORK_ID, S.FRAMEWORK_NAME)}
KINDS = ("task", "offer", "trace", "framework")
_HEX = frozenset("0123456789abcdef")


class BadQuery(ValueError):
    """A /traces query that names no span set, or more than one (the message says why)."""


@dataclass(frozen=True)
class TraceQuery:
    kind: str  # one of KINDS
    values: tuple[str, ...]  # one id; for "trace", one or more trace ids

    def encode(self) -> str:
        """The query string that asks for it."""
        from urllib.parse import urlencode

        return urlencode({self.kind: ",".join(self.values)})


def parse(query: dict[str, list[str]]) -> TraceQuery:
    """The query of a /traces request (as parse_qs gives it); BadQuery otherwise."""
    usage = ("ask for exactly one of ?task=ID, ?offer=ID, ?framework=ID_OR_NAME or "
             f"?trace=TRACE_ID (up to {MAX_TRACE_IDS}, comma-separated)")
    unknown = sorted(set(query) - set(KINDS))
    if unknown:
        raise BadQuery(f"unknown parameter(s) {', '.join(unknown)}: {usage}")
    given = [k for k in KINDS if k in query]
    if len(given) != 1 or len(query[given[0]]) != 1:
        raise BadQuery(f"{'no' if not given else 'more than one'} span set named: {usage}")
    kind, raw = given[0], query[given[0]][0].strip()
    if kind != "trace":
        if not raw:
            raise BadQuery(f"empty {kind} id: {usage}")
        return TraceQuery(kind, (raw,))
    ids = tuple(dict.fromkeys(x.strip().lower() for x in raw.split(",") if x.strip()))
    if not ids or len(ids) > MAX_TRACE_IDS:
        raise BadQuery(f"{len(ids)} trace ids given: {usage}")
    bad = [x for x in ids if len(x) != 32 or not set(x) <= _HEX]
    if bad:
        raise BadQuery(f"not a trace id (32 hex digits): {bad[0][:40]!r}")
    return TraceQuery(kind, ids)


def names(span: Span, kind: str, ident: str) -> bool:
    """Whether the span's attributes name task/offer/framework `ident` (a framework by id or
    name)."""
    one, many = KEYS[kind]
    attrs = span.get("attrs", {})
    if kind == "framework":
        return ident in (attrs.get(one), attrs.get(many))
    return attrs.get(one) == ident or ident in (attrs.get(many) or ())


def matches(span: Span, q: TraceQuery) -> bool:
    """Whether the query selects the span: for a trace, a span of the trace or one linking
    into it (a task's `status` spans, each a root of its own trace, link to its launch)."""
    if q.kind == "trace":
        return span.get("traceId") in q.values or any(
            link.get("traceId") in q.values for link in span.get("links", []))
    return names(span, q.kind, q.values[0])


def needles(q: TraceQuery) -> list[bytes]:
    """Byte strings one of which a file line holding a selected span contains (the ids as
    the exporter's json.dumps writes them): a line without any is not parsed."""
    return [json.dumps(v)[1:-1].encode() for v in q.values]


# -- files --------------------------------------------------------------------------------
def own_files(path: Path | None, neighbours: Sequence[str] = ()) -> list[Path]:
    """What a process writing `path` serves, oldest first: the file's rotated siblings
    (`<stem>.<n>.jsonl`, highest n oldest), the file, then the files of its folder matching
    the `neighbours` globs (an agent's executors), by modification time."""
    if path is None:
        return []
    rotated = []
    for p in path.parent.glob(f"{path.stem}.*{path.suffix}"):
        n = p.name[len(path.stem) + 1:-len(path.suffix) or None]
        if n.isdigit():
            rotated.append((-int(n), p))
    out = [p for _, p in sorted(rotated)] + [path]
    others: dict[Path, float] = {}
    for pattern in neighbours:
        for p in path.parent.glob(pattern):
            try:
                others.setdefault(p, p.stat().st_mtime)
            except OSError:
                continue  # pruned or rotated meanwhile
    return out + sorted((p for p in others if p not in out), key=lambda p: others[p])


def _lines(f: IO[bytes]) -> Iterator[bytes]:
    """The file's lines, each at most MAX_LINE_BYTES (a longer one is skipped)."""
    while True:
        line = f.readline(MAX_LINE_BYTES)
        if not line:
            return
        if line.endswith(b"\n") or len(line) < MAX_LINE_BYTES:
            yield line
            continue
        while line and not line.endswith(b"\n"):  # the rest of the long line
            line = f.readline(MAX_LINE_BYTES)


def line_spans(line: bytes | str) -> list[Span]:
    """The spans of one OTLP-JSON line, each with its resource's attributes under
    "resource" and its own as a dict under "attrs" (a torn or foreign line: none)."""
    try:
        doc = json.loads(line)
    except ValueError:
        return []
    out: list[Span] = []
    if not isinstance(doc, dict):
        return out
    for rs in doc.get("resourceSpans", []):
        resource = attributes(rs.get("resource", {}).get("attributes", []))
        for ss in rs.get("scopeSpans", []):
            for span in ss.get("spans", []):
                span["resource"] = resource
                span["attrs"] = attributes(span.pop("attributes", []))
                out.append(span)
    return out


def file_spans(path: Path, only: Sequence[bytes] = ()) -> Iterator[Span]:
    """The spans of an OTLP-JSON lines file, streamed; with `only`, of the lines holding
    one of those byte strings (a missing file: none)."""
    try:
        f = open(path, "rb")  # noqa: SIM115 (closed below, also when the caller stops)
    except (FileNotFoundError, IsADirectoryError, PermissionError):
        return
    with f:
        for line in _lines(f):
            if not only or any(n in line for n in only):
                yield from line_spans(line)


def scan(paths: Iterable[Path], q: TraceQuery, *, max_spans: int = MAX_SPANS,
         max_bytes: int = MAX_BYTES) -> tuple[list[Span], bool]:
    """(the newest spans of `paths` the query selects, within the bounds; whether some were
    left out). Memory stays within the bounds plus one line."""
    kept: deque[tuple[Span, int]] = deque()
    size, truncated = 0, False
    only = needles(q)
    for path in paths:
        for span in file_spans(path, only):
            if not matches(span, q):
                continue
            n = len(json.dumps(span, separators=(",", ":")))
            kept.append((span, n))
            size += n
            while kept and (len(kept) > max_spans or size > max_bytes):
                size -= kept.popleft()[1]
                truncated = True
    return [s for s, _ in kept], truncated


def answer(paths: Iterable[Path], query: dict[str, list[str]]) -> tuple[int, bytes]:
    """/traces: (200, {"spans": [...], "truncated": bool}) or (400, why) for a bad query."""
    try:
        q = parse(query)
    except BadQuery as exc:
        return 400, f"400 bad request: {exc}\n".encode()
    found, truncated = scan(paths, q)
    return 200, json.dumps({"spans": found, "truncated": truncated},
                           separators=(",", ":")).encode()


def merge(*batches: Iterable[Span]) -> list[Span]:
    """The spans of every batch, each (trace id, span id) once (the first seen)."""
    out: dict[tuple[str, str], Span] = {}
    for batch in batches:
        for s in batch:
            out.setdefault((str(s.get("traceId", "")), str(s.get("spanId", ""))), s)
    return list(out.values())


def linked_traces(spans: Iterable[Span]) -> list[str]:
    """The trace ids of the spans and of the spans they link to, in first-seen order."""
    out: dict[str, None] = {}
    for s in spans:
        for t in (s.get("traceId"), *(x.get("traceId") for x in s.get("links", []))):
            if t:
                out[str(t)] = None
    return list(out)


def attributes(items: list[dict[str, Any]]) -> dict[str, Any]:
    """OTLP key/value list -> plain dict."""
    out: dict[str, Any] = {}
    for item in items:
        value = item.get("value", {})
        if not value:
            out[item["key"]] = None
            continue
        kind, raw = next(iter(value.items()))
        if kind == "intValue":
            raw = int(raw)
        elif kind == "arrayValue":
            raw = [next(iter(v.values())) for v in raw.get("values", [])]
        out[item["key"]] = raw
    return out
