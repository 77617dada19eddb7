"""A span exporter that appends OTLP JSON to a file: one ExportTraceServiceRequest per line,
in the OTLP/JSON encoding (hex trace and span ids, lowerCamelCase fields), as the
OpenTelemetry Collector's file exporter writes it. The file can be replayed into any OTLP
backend; `offerbus trace` reads it."""

from __future__ import annotations

import base64
import json
import math
import os
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import orjson
from google.protobuf.json_format import MessageToDict
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult

from services.telemetry.query import file_spans

_ID_FIELDS = ("traceId", "spanId", "parentSpanId")


def _hex_ids(node: Any) -> Any:
    """OTLP/JSON writes trace and span ids as hex, where protobuf's JSON mapping uses base64."""
    if isinstance(node, dict):
        for key, value in node.items():
            if key in _ID_FIELDS and isinstance(value, str):
                node[key] = base64.b64decode(value).hex()
            else:
                _hex_ids(value)
    elif isinstance(node, list):
        for item in node:
            _hex_ids(item)
    return node


def to_otlp_json_via_protobuf(spans: Sequence[ReadableSpan]) -> bytes:
    """The reference encoding (OTel's protobuf encoder + protobuf's JSON mapping): about
    ten times slower than to_otlp_json; kept to check that one against."""
    request = encode_spans(spans)
    doc = MessageToDict(request, use_integers_for_enums=True)
    return json.dumps(_hex_ids(doc), separators=(",", ":")).encode()


def _value(v: Any) -> dict[str, Any]:
    if isinstance(v, str):  # most attributes: ids, names, resources
        return {"stringValue": v}
    if isinstance(v, bool):
        return {"boolValue": v}
    if isinstance(v, int):
        return {"intValue": str(v)}  # int64 is a string in proto3 JSON
    if isinstance(v, float):
        # proto3 JSON spells the non-finite doubles as strings (JSON has no NaN).
        return {"doubleValue": v if math.isfinite(v) else
                "NaN" if math.isnan(v) else "Infinity" if v > 0 else "-Infinity"}
    if isinstance(v, bytes):
        return {"bytesValue": base64.b64encode(v).decode()}
    if isinstance(v, list | tuple):
        return {"arrayValue": {"values": [_value(x) for x in v]}}
    return {"stringValue": str(v)}


def _attrs(attrs: Any) -> list[dict[str, Any]]:
    return [{"key": k, "value": {"stringValue": v} if type(v) is str else _value(v)}
            for k, v in attrs.items()] if attrs else []


def _flags(parent: Any) -> int:
    """OTLP span/link flags: "has is-remote" (0x100), and "is remote" (0x200) when the
    parent (or linked) context came from another process."""
    return 0x100 | (0x200 if parent is not None and parent.is_remote else 0)


_NO_STATUS: dict[str, Any] = {}


def _span(span: ReadableSpan) -> dict[str, Any]:
    ctx = span.context
    assert ctx is not None
    parent = span.parent
    out: dict[str, Any] = {"traceId": f"{ctx.trace_id:032x}", "spanId": f"{ctx.span_id:016x}"}
    if parent is not None:
        out["parentSpanId"] = f"{parent.span_id:016x}"
    out["flags"] = 0x300 if parent is not None and parent.is_remote else 0x100
    out["name"] = span.name
    out["kind"] = span.kind.value + 1  # OTLP numbers SPAN_KIND_INTERNAL as 1
    out["startTimeUnixNano"] = str(span.start_time or 0)
    out["endTimeUnixNano"] = str(span.end_time or 0)
    attributes = span.attributes
    if attributes:
        out["attributes"] = _attrs(attributes)
    events = span.events
    if events:
        out["events"] = [{"timeUnixNano": str(e.timestamp), "name": e.name,
                          **({"attributes": _attrs(e.attributes)} if e.attributes else {})}
                         for e in events]
    links = span.links
    if links:
        out["links"] = [{"traceId": f"{link.context.trace_id:032x}",
                         "spanId": f"{link.context.span_id:016x}",
                         "flags": _flags(link.context),
                         **({"attributes": _attrs(link.attributes)} if link.attributes
                            else {})} for link in links]
    status = span.status
    code = status.status_code.value
    if code or status.description:
        out["status"] = {**({"code": code} if code else {}),  # UNSET 0, OK 1, ERROR 2
                         **({"message": status.description} if status.description else {})}
    else:
        out["status"] = _NO_STATUS
    return out


def to_otlp_json(spans: Sequence[ReadableSpan]) -> bytes:
    """One ExportTraceServiceRequest in OTLP/JSON (UTF-8), written straight from the spans
    by orjson (the exporters run in services' processes: the protobuf route held the GIL
    ~0.25 ms a span, the standard library's encoder half of the ~20 us left)."""
    groups: dict[int, tuple[Any, dict[tuple[str, str], list[dict[str, Any]]]]] = {}
    for span in spans:
        resource_key = id(span.resource)
        _, scopes = groups.setdefault(resource_key, (span.resource, {}))
        scope = span.instrumentation_scope
        key = (scope.name if scope else "", (scope.version or "") if scope else "")
        scopes.setdefault(key, []).append(_span(span))
    doc = {"resourceSpans": [
        {"resource": {"attributes": _attrs(resource.attributes)},
         "scopeSpans": [{"scope": {"name": name, **({"version": version} if version else {})},
                         "spans": items} for (name, version), items in scopes.items()]}
        for resource, scopes in groups.values()]}
    try:
        return orjson.dumps(doc)
    except orjson.JSONEncodeError:  # a string that is not UTF-8 (a lone surrogate): escaped
        return json.dumps(doc, separators=(",", ":")).encode()


# Trace files never grow without bound: each is rotated past MAX_FILE_BYTES (BACKUPS older
# files kept), and a traces folder shared by many processes (executors come and go) is pruned
# to MAX_FOLDER_BYTES, oldest files first, by each process that starts writing into it.
MAX_FILE_BYTES = 32 << 20
BACKUPS = 1
MAX_FOLDER_BYTES = 512 << 20


def backup_path(path: Path, n: int) -> Path:
    """`svc-1.jsonl` -> `svc-1.<n>.jsonl` (still *.jsonl: readers see rotated files too)."""
    return path.with_name(f"{path.stem}.{n}{path.suffix}")


class OtlpJsonFileExporter(SpanExporter):
    def __init__(self, path: str | os.PathLike[str], *, max_bytes: int = MAX_FILE_BYTES,
                 backups: int = BACKUPS) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.max_bytes = max_bytes
        self.backups = max(backups, 0)
        self._lock = threading.Lock()
        self._file = open(self.path, "ab")  # noqa: SIM115 (kept open)
        self._size = self._file.tell()

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        if not spans:
            return SpanExportResult.SUCCESS
        line = to_otlp_json(spans) + b"\n"
        with self._lock:
            if self._file.closed:
                return SpanExportResult.FAILURE
            if self._size and self._size + len(line) > self.max_bytes:
                self._rotate()
            self._file.write(line)
            self._file.flush()
            self._size += len(line)
        return SpanExportResult.SUCCESS

    def _rotate(self) -> None:
        self._file.close()
        if self.backups == 0:
            self.path.unlink(missing_ok=True)
        else:
            backup_path(self.path, self.backups).unlink(missing_ok=True)
            for n in range(self.backups - 1, 0, -1):
                if backup_path(self.path, n).exists():
                    backup_path(self.path, n).rename(backup_path(self.path, n + 1))
            self.path.rename(backup_path(self.path, 1))
        self._file = open(self.path, "ab")  # noqa: SIM115 (kept open)
        self._size = 0

    def shutdown(self) -> None:
        with self._lock:
            self._file.close()

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        return True


def prune_folder(folder: Path, *, max_bytes: int = MAX_FOLDER_BYTES,
                 keep: Path | None = None) -> list[Path]:
    """Remove the oldest *.jsonl files of `folder` (never `keep`) until the folder's trace
    files take at most `max_bytes`; the removed paths, oldest first."""
    files = []
    for p in folder.glob("*.jsonl"):
        try:
            st = p.stat()
        except FileNotFoundError:  # another process pruned or rotated it meanwhile
            continue
        files.append((st.st_mtime, p.name, p, st.st_size))
    total = sum(size for *_, size in files)
    removed: list[Path] = []
    for _, _, p, size in sorted(files):
        if total <= max_bytes:
            break
        if keep is not None and p == keep:
            continue
        p.unlink(missing_ok=True)
        total -= size
        removed.append(p)
    return removed


def read_spans(path: str | os.PathLike[str]) -> list[dict[str, Any]]:
    """Every span in an OTLP-JSON lines file, each with its resource's attributes merged in
    under "resource" (service.name etc.) and its own under "attrs". Torn or foreign lines
    are skipped; the file is read a line at a time (services/telemetry/query.py)."""
    return list(file_spans(Path(path)))
