"""The offer-broker's spans, made from the facts its core returns (no decision here): an
`offer` span per offer sent (child of its allocation's span; the offer the framework gets
names it), a failed `offer` span for an allocation the core did not offer, a `validate`
span per ACCEPT/DECLINE carrying the core's Verdict and Notices (the LaunchRequest
continues it), and a `rescind` span under each rescinded or expired offer's span."""

from __future__ import annotations

import math
from collections.abc import Sequence

from opentelemetry import trace
from opentelemetry.trace import Span, Status, StatusCode

from schemas import common_pb2
from services.broker.commands import Command, Rescind, SendOffers, Verdict
from services.notice import Notice
from services.telemetry import extract, span_traceparent, spans

# A proxy until services.telemetry.setup() installs the provider (see the allocator).
tracer = trace.get_tracer("offerbus.broker")
RescindReason = common_pb2.RescindReason


class BrokerTraces:
    """Each outstanding offer's span (for its rescind, and a validate without a parent),
    and each LaunchRequest's validate span (the master's launch continues it). Entries
    leave with their offer (used, rescinded, expired) or their request (sent)."""

    def __init__(self) -> None:
        self.offers: dict[str, str] = {}  # offer id -> its offer span's traceparent
        self.launches: dict[str, str] = {}  # request id -> its validate span's traceparent

    def clear(self) -> None:
        self.offers.clear()
        self.launches.clear()

    # -- ACCEPT / DECLINE ----------------------------------------------------------------
    def validate_span(self, framework_id: str, offer_ids: Sequence[str], decision: str,
                      traceparent: str) -> Span:
        """Under the framework's decide span (the envelope's traceparent) or, when it sent
        none, under the first named offer's span."""
        parent = extract(traceparent) or next(
            (ctx for ctx in (extract(self.offers.get(i, "")) for i in offer_ids) if ctx), None)
        return tracer.start_span(spans.VALIDATE, context=parent, attributes={
            spans.FRAMEWORK_ID: framework_id, spans.OFFER_IDS: list(offer_ids),
            spans.DECISION: decision})

    def end_validate(self, span: Span, verdict: Verdict) -> None:
        span.set_attribute(spans.VALID, verdict.valid)
        if verdict.task_ids:
            span.set_attribute(spans.TASK_IDS, list(verdict.task_ids))
        if verdict.refuse_seconds is not None:
            span.set_attribute(spans.REFUSE_SECONDS, verdict.refuse_seconds)
        if verdict.reason:
            span.set_attribute(spans.REASON, verdict.reason)
        if not verdict.valid:
            span.set_attribute(spans.FAILED_CHECK, verdict.failed_check)
            if verdict.failed_check != "offer_not_outstanding":  # a decline of a dead offer
                span.set_status(Status(StatusCode.ERROR, verdict.reason))
        if verdict.request_id:
            self.launches[verdict.request_id] = span_traceparent(span)
        span.end()
        for oid in verdict.used:  # used up: their spans are no longer needed
            self.offers.pop(oid, None)

    def notice(self, n: Notice, span: Span | None) -> None:
        """A Notice onto the span open for its step; one about an allocation the core did
        not offer becomes that allocation's failed `offer` span."""
        facts = n.fields()
        parent = str(facts.pop("allocation_traceparent", ""))
        if span is not None:
            span.add_event(n.kind, {"message": n.message, **facts})
        elif "allocation_id" in facts:
            failed = tracer.start_span(spans.OFFER, context=extract(parent), attributes={
                spans.ALLOCATION_ID: str(facts["allocation_id"]),
                spans.FRAMEWORK_ID: str(facts.get("framework_id", "")),
                spans.AGENT_ID: str(facts.get("agent_id", "")), spans.REASON: n.message})
            failed.set_status(Status(StatusCode.ERROR, n.message))
            failed.end()

    # -- a flush's commands --------------------------------------------------------------
    def commands(self, cmds: Sequence[Command]) -> None:
        """Before coalescing (which hides offers made and rescinded in one batch): an
        `offer` span per offer made, then a `rescind` span per offer rescinded."""
        for cmd in cmds:
            if isinstance(cmd, SendOffers):
                for o in cmd.offers:
                    span = tracer.start_span(spans.OFFER, context=extract(o.traceparent),
                                             attributes={
                        spans.ALLOCATION_ID: o.allocation_id,
                        spans.FRAMEWORK_ID: o.framework_id, spans.AGENT_ID: o.agent_id,
                        spans.OFFER_ID: o.offer_id, spans.HOSTNAME: o.hostname,
                        spans.RESOURCES: str(o.resources),
                        spans.EXPIRES_AT_US: 0 if math.isinf(o.expires_at)
                        else int(o.expires_at * 1e6)})
                    self.offers[o.offer_id] = span_traceparent(span)
                    span.end()
        for cmd in cmds:
            if isinstance(cmd, Rescind):
                why = RescindReason.Name(cmd.reason)  # type: ignore[arg-type]
                why = why.removeprefix("RESCIND_REASON_").lower()
                for oid in cmd.offer_ids:
                    tracer.start_span(spans.RESCIND, context=extract(self.offers.pop(oid, "")),
                                      attributes={
                        spans.OFFER_ID: oid, spans.FRAMEWORK_ID: cmd.framework_id,
                        spans.REASON: f"{why}: {cmd.message}" if cmd.message else why}).end()
