"""The vocabulary of Offerbus traces: span names and attribute keys, shared by every service,
the SDK and `offerbus trace` / `offerbus why`. One trace follows one offer:

  allocate (allocator) -> offer (broker) -> decide (framework SDK) -> validate (broker)
    -> launch (master: re-validation, records the task) -> run (agent: executor started)
    -> start (executor: container created and started; event "TASK_RUNNING")

Each hop's parent arrives in a message: Allocation.traceparent (allocator -> broker),
Offer.traceparent (broker -> framework), the Envelope.traceparent of the framework's
Accept/Decline (relayed by the master to the broker), of the LaunchRequest (broker ->
master), RunTasks.Launch.traceparent (master -> agent), and the Envelope.traceparent of the
executor's Launch event (agent -> executor). The master keeps the launch span's
traceparent in TaskRecord.traceparent; later status updates are spans named "status" that
LINK to it: one "status" span per launch and state in each batch of updates forwarded
(TASK_ID for one task, TASK_IDS for several; status_spans), and none for an agent's resend
of an update already traced (StatusSpans). Rescinds and expiries are spans
named "rescind" under the offer.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Iterable

from opentelemetry import trace
from opentelemetry.trace import Link, Tracer

from schemas import common_pb2

# Span names.
ALLOCATE = "allocate"
OFFER = "offer"
RESCIND = "rescind"
DECIDE = "decide"
VALIDATE = "validate"
LAUNCH = "launch"
RUN = "run"
START = "start"
STATUS = "status"

# Attribute keys (all spans use the ones that apply).
FRAMEWORK_ID = "offerbus.framework_id"
FRAMEWORK_NAME = "offerbus.framework_name"
AGENT_ID = "offerbus.agent_id"
HOSTNAME = "offerbus.hostname"
ROLE = "offerbus.role"
OFFER_ID = "offerbus.offer_id"
OFFER_IDS = "offerbus.offer_ids"
ALLOCATION_ID = "offerbus.allocation_id"
TASK_ID = "offerbus.task_id"
TASK_IDS = "offerbus.task_ids"
EXECUTOR_ID = "offerbus.executor_id"
RESOURCES = "offerbus.resources"  # Resources.__str__, e.g. "cpus:0.5;mem:256"
DOMINANT_SHARE = "offerbus.dominant_share"
DOMINANT_RESOURCE = "offerbus.dominant_resource"
WEIGHT = "offerbus.weight"
CYCLE = "offerbus.cycle"
SKIPPED = "offerbus.skipped"  # ["<framework_id>: <outcome>: <reason>", ...] this cycle
# Why an allocation is less than the agent had free (allocate spans, only when so):
FAIR_SHARE_CUT = "offerbus.fair_share.cut"  # what progressive filling kept for others
RESERVED_ELSEWHERE = "offerbus.reserved_elsewhere"  # free, reserved for other roles
# ["<agent_id>: <what> for <framework_id>", ...]: its offers reclaimed or tasks revoked
# this cycle for frameworks below their share
FAIR_SHARE_RECLAIMED = "offerbus.fair_share.reclaimed"
REVOCABLE = "offerbus.revocable"  # bool: beyond the framework's guaranteed share
DECISION = "offerbus.decision"  # "accept" | "decline"
REASON = "offerbus.reason"  # the framework's reason, or why something was refused
REFUSE_SECONDS = "offerbus.refuse_seconds"
VALID = "offerbus.valid"  # bool: a validation's verdict
FAILED_CHECK = "offerbus.failed_check"  # which check refused it
IMAGE = "offerbus.image"
CONTAINER_ID = "offerbus.container_id"
TASK_STATE = "offerbus.task_state"
EXPIRES_AT_US = "offerbus.expires_at_us"


def status_spans(tracer: Tracer, framework_id: str, statuses: Iterable[common_pb2.TaskStatus],
                 traceparent_of: Callable[[str], str | None]) -> int:
    """The "status" spans of one batch of updates forwarded to a framework: one per launch
    (`traceparent_of(task_id)`: its TaskRecord.traceparent, None for an unknown task),
    agent, state and reason, LINKED to that launch span; returns how many. (One span per
    task was most of a busy master's tracing: the tasks of one ACCEPT are reported together.)"""
    from services.telemetry.provider import extract  # provider imports this module's names

    groups: dict[tuple[str, str, int, int, str], list[str]] = {}
    for st in statuses:
        key = (traceparent_of(st.task_id) or "", st.agent_id, st.state, st.reason, st.message)
        groups.setdefault(key, []).append(st.task_id)
    for (tp, agent_id, state, reason, message), task_ids in groups.items():
        ctx = extract(tp) if tp else None
        links = [Link(trace.get_current_span(ctx).get_span_context())] if ctx else []
        ids = list(dict.fromkeys(task_ids))
        tracer.start_span(STATUS, links=links, attributes={
            FRAMEWORK_ID: framework_id, AGENT_ID: agent_id,
            **({TASK_ID: ids[0]} if len(ids) == 1 else {TASK_IDS: ids}),
            TASK_STATE: common_pb2.TaskState.Name(state),  # type: ignore[arg-type]
            REASON: common_pb2.TaskStatus.Reason.Name(reason)  # type: ignore[arg-type]
            + (f": {message}" if message else "")}).end()
    return len(groups)


STATUS_MEMORY = 20_000  # updates (framework, task, uuid) remembered as traced, newest kept


class StatusSpans:
    """status_spans for what a master forwards, each update once: an agent resends an
    update until it is acknowledged, and its copies (the same uuid) are not traced again
    while remembered (the last `memory` traced)."""

    def __init__(self, memory: int = STATUS_MEMORY) -> None:
        self.memory = memory
        self._traced: OrderedDict[tuple[str, str, bytes], None] = OrderedDict()

    def trace(self, tracer: Tracer, framework_id: str,
              statuses: Iterable[common_pb2.TaskStatus],
              traceparent_of: Callable[[str], str | None]) -> int:
        fresh = []
        for st in statuses:
            if st.uuid:
                key = (framework_id, st.task_id, st.uuid)
                if key in self._traced:
                    continue
                self._traced[key] = None
                if len(self._traced) > self.memory:
                    self._traced.popitem(last=False)
            fresh.append(st)
        return status_spans(tracer, framework_id, fresh, traceparent_of) if fresh else 0
