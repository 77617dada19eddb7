"""OpenTelemetry for every Offerbus process: set-up from the standard OTEL_* variables
(plus OFFERBUS_TRACES_FILE for a local OTLP-JSON file), and the W3C traceparent carried in
each Envelope, so one trace follows an offer across processes."""

from services.telemetry.setup import (
    current_traceparent,
    extract,
    setup,
    shutdown,
    span_traceparent,
    trace_file,
    tracer,
)

__all__ = ["current_traceparent", "extract", "setup", "shutdown", "span_traceparent", "trace_file",
           "tracer"]
