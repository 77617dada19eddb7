"""OpenTelemetry for every Offerbus process: set-up from the standard OTEL_* variables
(plus OFFERBUS_TRACES_FILE for a local OTLP-JSON file), and the W3C traceparent carried in
each Envelope, so one trace follows an offer across processes.

The set-up and the traceparent helpers live in `provider`, which imports the OpenTelemetry
SDK (~20 ms); they are imported from there on first use, so a process that reads only span
names (`spans`) or trace files (`query`), as the CLI does, does not pay for the SDK."""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from services.telemetry.provider import (
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


def __getattr__(name: str) -> Any:
    if name in __all__:
        value = getattr(importlib.import_module("services.telemetry.provider"), name)
        globals()[name] = value  # once
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
