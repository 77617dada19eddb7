"""A span exporter that appends OTLP JSON to a file: one ExportTraceServiceRequest per line,
in the OTLP/JSON encoding (hex trace and span ids, lowerCamelCase fields), as the
OpenTelemetry Collector's file exporter writes it. The file can be replayed into any OTLP
backend; `offerbus trace` reads it."""

from __future__ import annotations

import json
import os
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from google.protobuf.json_format import MessageToDict
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult

_ID_FIELDS = ("traceId", "spanId", "parentSpanId")


def _hex_ids(node: Any) -> Any:
    """OTLP/JSON writes trace and span ids as hex, where protobuf's JSON mapping uses base64."""
    import base64

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


def to_otlp_json(spans: Sequence[ReadableSpan]) -> str:
    request = encode_spans(spans)
    doc = MessageToDict(request, use_integers_for_enums=True)
    return json.dumps(_hex_ids(doc), separators=(",", ":"))


class OtlpJsonFileExporter(SpanExporter):
    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._lock = threading.Lock()
        self._file = open(self.path, "a", encoding="utf-8")  # noqa: SIM115 (kept open)

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        if not spans:
            return SpanExportResult.SUCCESS
        line = to_otlp_json(spans)
        with self._lock:
            if self._file.closed:
                return SpanExportResult.FAILURE
            self._file.write(line + "\n")
            self._file.flush()
        return SpanExportResult.SUCCESS

    def shutdown(self) -> None:
        with self._lock:
            self._file.close()

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        return True


def read_spans(path: str | os.PathLike[str]) -> list[dict[str, Any]]:
    """Every span in an OTLP-JSON lines file, each with its resource's attributes merged in
    under "resource" (service.name etc.). Torn or foreign lines are skipped."""
    out: list[dict[str, Any]] = []
    try:
        lines = Path(path).read_text(encoding="utf-8").splitlines()
    except FileNotFoundError:
        return out
    for line in lines:
        try:
            doc = json.loads(line)
        except ValueError:
            continue
        for rs in doc.get("resourceSpans", []):
            resource = attributes(rs.get("resource", {}).get("attributes", []))
            for ss in rs.get("scopeSpans", []):
                for span in ss.get("spans", []):
                    span["resource"] = resource
                    span["attrs"] = attributes(span.get("attributes", []))
                    out.append(span)
    return out


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
