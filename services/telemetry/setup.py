"""Tracer set-up from the environment, and the traceparent helpers every shell uses.

Exporters: the standard OTEL_TRACES_EXPORTER ("otlp" for OTLP/HTTP protobuf to
OTEL_EXPORTER_OTLP_[TRACES_]ENDPOINT, "console", "none"); in addition OFFERBUS_TRACES_FILE
names a file that receives OTLP JSON lines (`offerbus up` sets it per service). Sampling
follows OTEL_TRACES_SAMPLER / OTEL_TRACES_SAMPLER_ARG (the SDK reads them).
OFFERBUS_TRACES_DIR names a folder instead: each process writes `<service>-<pid>.jsonl`
there (what `offerbus up` sets, so agents' executors never share a file)."""

from __future__ import annotations

import os
import socket

from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, ConsoleSpanExporter
from opentelemetry.trace import Span
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from services.telemetry.file_exporter import OtlpJsonFileExporter

_propagator = TraceContextTextMapPropagator()
_provider: TracerProvider | None = None


def setup(service: str, **resource: str) -> trace.Tracer:
    """Configure this process's tracing once; returns its tracer. With no exporter
    configured, spans are still created (so context propagates) but go nowhere."""
    global _provider
    if os.environ.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return trace.get_tracer("offerbus." + service)  # the API's no-op tracer
    if _provider is None:
        attrs: dict[str, str | int] = {"service.name": os.environ.get("OTEL_SERVICE_NAME", service),
                 "host.name": socket.gethostname(), "process.pid": os.getpid(),
                 **{f"offerbus.{k}": v for k, v in resource.items() if v}}
        provider = TracerProvider(resource=Resource.create(attrs))
        for name in filter(None, (x.strip() for x in
                                  os.environ.get("OTEL_TRACES_EXPORTER", "").split(","))):
            if name == "otlp":
                from opentelemetry.exporter.otlp.proto.http.trace_exporter import (
                    OTLPSpanExporter,
                )

                provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))
            elif name == "console":
                provider.add_span_processor(BatchSpanProcessor(ConsoleSpanExporter()))
        path = os.environ.get("OFFERBUS_TRACES_FILE")
        folder = os.environ.get("OFFERBUS_TRACES_DIR")
        if folder and not path:
            path = os.path.join(folder, f"{service}-{os.getpid()}.jsonl")
        if path:
            provider.add_span_processor(BatchSpanProcessor(
                OtlpJsonFileExporter(path), schedule_delay_millis=500))
        trace.set_tracer_provider(provider)
        _provider = provider
    return trace.get_tracer("offerbus." + service)


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
