"""A process configured only by the standard OTEL_* variables sends real OTLP/HTTP
(protobuf) to a receiver this test runs; the test decodes the payload and finds the spans,
their resource and their parentage."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)

CHILD = """
from services import telemetry
from opentelemetry import trace
tracer = telemetry.setup("offerbus-probe", agent_id="S7")
with tracer.start_as_current_span("allocate", attributes={"offerbus.cycle": 3}) as parent:
    carried = telemetry.span_traceparent(parent)
with tracer.start_as_current_span("offer", context=telemetry.extract(carried)):
    pass
telemetry.shutdown()
"""


class Receiver:
    def __init__(self) -> None:
        self.requests: list[ExportTraceServiceRequest] = []
        self.content_types: list[str] = []
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers["Content-Length"]))
                outer.content_types.append(self.headers.get("Content-Type", ""))
                req = ExportTraceServiceRequest()
                req.ParseFromString(body)
                outer.requests.append(req)
                reply = ExportTraceServiceResponse().SerializeToString()
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", str(len(reply)))
                self.end_headers()
                self.wfile.write(reply)

            def log_message(self, format: str, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/v1/traces"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    r = Receiver()
    yield r
    r.server.shutdown()


def test_spans_arrive_over_otlp_http(receiver: Receiver) -> None:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("OTEL_", "OFFERBUS_TRACES"))}
    env.update(OTEL_TRACES_EXPORTER="otlp", OTEL_EXPORTER_OTLP_TRACES_ENDPOINT=receiver.url,
               OTEL_EXPORTER_OTLP_TRACES_PROTOCOL="http/protobuf")
    out = subprocess.run([sys.executable, "-c", CHILD], env=env, capture_output=True,
                         text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    # shutdown() flushed before the process exited: the spans are here, no waiting needed.
    spans = {s.name: (s, rs.resource) for req in receiver.requests
             for rs in req.resource_spans for ss in rs.scope_spans for s in ss.spans}
    assert set(spans) == {"allocate", "offer"}
    assert all(ct == "application/x-protobuf" for ct in receiver.content_types)
    (allocate, resource), (offer, _) = spans["allocate"], spans["offer"]
    assert offer.trace_id == allocate.trace_id and offer.parent_span_id == allocate.span_id
    attrs = {a.key: a.value for a in resource.attributes}
    assert attrs["service.name"].string_value == "offerbus-probe"
    assert attrs["offerbus.agent_id"].string_value == "S7"
    assert {a.key: a.value.int_value for a in allocate.attributes}["offerbus.cycle"] == 3


def test_otel_sdk_disabled_sends_nothing(receiver: Receiver) -> None:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("OTEL_", "OFFERBUS_TRACES"))}
    env.update(OTEL_SDK_DISABLED="true", OTEL_TRACES_EXPORTER="otlp",
               OTEL_EXPORTER_OTLP_TRACES_ENDPOINT=receiver.url)
    out = subprocess.run([sys.executable, "-c", CHILD], env=env, capture_output=True,
                         text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert receiver.requests == []
