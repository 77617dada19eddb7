"""The tracer provider: its set-up from the environment, and the traceparent helpers every
shell uses (the OpenTelemetry SDK is imported here, not by the package: see __init__).

Exporters: the standard OTEL_TRACES_EXPORTER ("otlp" for OTLP/HTTP protobuf to
OTEL_EXPORTER_OTLP_[TRACES_]ENDPOINT, "console", "none"); in addition OFFERBUS_TRACES_FILE
names a file that receives OTLP JSON lines (`offerbus up` sets it per service). Sampling
follows OTEL_TRACES_SAMPLER / OTEL_TRACES_SAMPLER_ARG (the SDK reads them).
OFFERBUS_TRACES_DIR names a folder instead: each process writes `<service>-<pid>.jsonl`
there (what `offerbus up` sets, so agents' executors never share a file). Files rotate past
OFFERBUS_TRACES_MAX_BYTES and a folder is pruned to OFFERBUS_TRACES_DIR_MAX_BYTES (oldest
files first) when a process starts writing into it (defaults: file_exporter.py)."""

from __future__ import annotations

import contextlib
import os
import socket
import uuid
from pathlib import Path

from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.sdk.resources import OTELResourceDetector, Resource
from opentelemetry.sdk.trace import SpanProcessor, TracerProvider
from opentelemetry.sdk.trace.export import (
    BatchSpanProcessor,
    ConsoleSpanExporter,
    SimpleSpanProcessor,
    SpanExporter,
)
from opentelemetry.trace import Span
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from services.telemetry.file_exporter import (
    MAX_FILE_BYTES,
    MAX_FOLDER_BYTES,
    OtlpJsonFileExporter,
    prune_folder,
)

_propagator = TraceContextTextMapPropagator()
_provider: TracerProvider | None = None
_file: Path | None = None  # the OTLP-JSON file this process writes (/traces serves it)


def _resource(attrs: dict[str, str | int]) -> Resource:
    """The SDK's defaults, then OTEL_RESOURCE_ATTRIBUTES, then ours — what Resource.create
    gives, without its detector entry-point scan (2.8 ms, paid by every executor)."""
    sdk = Resource({"telemetry.sdk.language": "python", "telemetry.sdk.name": "opentelemetry",
                    "telemetry.sdk.version": _sdk_version(),
                    "service.instance.id": str(uuid.uuid4())})
    return sdk.merge(OTELResourceDetector().detect()).merge(Resource(attrs))


def _sdk_version() -> str:
    from opentelemetry.sdk.version import __version__

    return __version__


def _env_bytes(name: str, default: int) -> int:
    """A size limit from the environment; a missing or bad value means `default`."""
    try:
        value = int(os.environ.get(name, ""))
    except ValueError:
        return default
    return value if value > 0 else default


def setup(service: str, *, batch: bool = True, **resource: str) -> trace.Tracer:
    """Configure this process's tracing once; returns its tracer. With no exporter
    configured, spans are still created (so context propagates) but go nowhere.
    `batch=False` exports each span as it ends, with no export thread: for short-lived
    processes with few spans (executors)."""

    def processor(exporter: SpanExporter, delay_ms: int = 5000) -> SpanProcessor:
        if not batch:
            return SimpleSpanProcessor(exporter)
        return BatchSpanProcessor(exporter, schedule_delay_millis=delay_ms)

    global _provider, _file
    if os.environ.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return trace.get_tracer("offerbus." + service)  # the API's no-op tracer
    if _provider is None:
        attrs: dict[str, str | int] = {"service.name": os.environ.get("OTEL_SERVICE_NAME", service),
                 "host.name": socket.gethostname(), "process.pid": os.getpid(),
                 **{f"offerbus.{k}": v for k, v in resource.items() if v}}
        provider = TracerProvider(resource=_resource(attrs))
        for name in filter(None, (x.strip() for x in
                                  os.environ.get("OTEL_TRACES_EXPORTER", "").split(","))):
            if name == "otlp":
                from opentelemetry.exporter.otlp.proto.http.trace_exporter import (
                    OTLPSpanExporter,
                )

                provider.add_span_processor(processor(OTLPSpanExporter()))
            elif name == "console":
                provider.add_span_processor(processor(ConsoleSpanExporter()))
        path = os.environ.get("OFFERBUS_TRACES_FILE")
        folder = os.environ.get("OFFERBUS_TRACES_DIR")
        if folder and not path:
            path = os.path.join(folder, f"{service}-{os.getpid()}.jsonl")
            with contextlib.suppress(OSError):  # tracing never stops a service
                prune_folder(Path(folder), keep=Path(path), max_bytes=_env_bytes(
                    "OFFERBUS_TRACES_DIR_MAX_BYTES", MAX_FOLDER_BYTES))
        if path:
            exporter = OtlpJsonFileExporter(
                path, max_bytes=_env_bytes("OFFERBUS_TRACES_MAX_BYTES", MAX_FILE_BYTES))
            provider.add_span_processor(processor(exporter, delay_ms=500))
            _file = exporter.path.resolve()
        trace.set_tracer_provider(provider)
        _provider = provider
    return trace.get_tracer("offerbus." + service)


def trace_file() -> Path | None:
    """The OTLP-JSON file this process writes its spans to (None: it writes none)."""
    return _file


def tracer() -> trace.Tracer:
    return trace.get_tracer("offerbus")


def shutdown() -> None:
    """Flush and stop the exporters (call on the way out)."""
    if _provider is not None:
        _provider.shutdown()


def extract(traceparent: str) -> Context | None:
    """The remote parent a message's traceparent names (None when it names none)."""
    if not traceparent:
        return None
    ctx = _propagator.extract({"traceparent": traceparent})
    span_ctx = trace.get_current_span(ctx).get_span_context()
    return ctx if span_ctx.is_valid else None


def span_traceparent(span: Span) -> str:
    """The W3C traceparent naming `span` as the parent of what follows."""
    carrier: dict[str, str] = {}
    _propagator.inject(carrier, context=trace.set_span_in_context(span))
    return carrier.get("traceparent", "")


def current_traceparent() -> str:
    carrier: dict[str, str] = {}
    _propagator.inject(carrier, context=otel_context.get_current())
    return carrier.get("traceparent", "")
