"""The trace's edges: the SDK driver's `decide` span (a child of the offer's span, whose
traceparent the Accept/Decline carries on), the agent core handing the `run` span's
traceparent to its executor, and a real executor's `start` and `status` spans written to
its own trace file."""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import zmq
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from frameworks.sdk import Scheduler, SchedulerDriver
from schemas import agent_pb2, common_pb2, executor_pb2, scheduler_pb2
from services import tasks
from services.agent.core import AgentCore, LaunchExecutor, ToExecutor
from services.agent.launcher import executor_environment
from services.bus import codec
from services.bus.reactor import Reactor
from services.telemetry import span_traceparent
from services.telemetry import spans as sp
from services.telemetry.file_exporter import read_spans
from tests.agent.test_agent_core import info, registered, subscribe
from tests.integration.test_executor_process import (  # noqa: F401 (env: a fixture)
    FakeAgent,
    _gone,
    env,
    make_task,
    start_executor,
)
from tests.sdk.test_driver_bus import BEAT, WAIT, MasterHarness

Event = scheduler_pb2.SchedulerEvent


# -- the SDK driver: decide ------------------------------------------------------------------
@pytest.fixture
def spans() -> Iterator[InMemorySpanExporter]:
    """Spans of this process. An SDK provider is installed before any driver starts (a driver
    never replaces one); if an earlier test's driver installed Offerbus's, we add to it."""
    exporter = InMemorySpanExporter()
    provider = trace.get_tracer_provider()
    if not isinstance(provider, TracerProvider):
        provider = TracerProvider()
        trace.set_tracer_provider(provider)
    assert isinstance(trace.get_tracer_provider(), TracerProvider)
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    yield exporter
    exporter.clear()


class Deciding(Scheduler):
    """Accepts offer o1 with a task; declines every other offer, saying why."""

    def offers(self, driver: SchedulerDriver, offers: list[common_pb2.Offer]) -> None:
        for o in offers:
            if o.offer_id == "o1":
                task = common_pb2.TaskInfo(task_id="t1", agent_id=o.agent_id,
                                           resources=list(o.resources))
                driver.accept([o.offer_id], [common_pb2.Operation(
                    launch=common_pb2.Operation.Launch(tasks=[task]))],
                    common_pb2.Filters(refuse_seconds=2.0))
            else:
                driver.decline([o.offer_id], 30.0, reason="1 instance(s) not placed: no fit")


def test_decide_span_is_a_child_of_the_offer_and_the_call_carries_it(
    tmp_path: Path, spans: InMemorySpanExporter,
) -> None:
    tracer = trace.get_tracer("test.broker")
    offer_spans = {oid: tracer.start_span(sp.OFFER) for oid in ("o1", "o2")}
    for s in offer_spans.values():
        s.end()
    offers = [common_pb2.Offer(offer_id=oid, framework_id="fw-1", agent_id="a1",
                               hostname="h1", traceparent=span_traceparent(s),
                               resources=[common_pb2.Resource(name="cpus", scalar=1.0)])
              for oid, s in offer_spans.items()]
    reactor = Reactor()
    ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
    master = MasterHarness(reactor, ctx, tmp_path, "m1")
    driver = SchedulerDriver(Deciding(), common_pb2.FrameworkInfo(name="web", role="web"),
                             f"file://{tmp_path}", heartbeat=BEAT)
    driver.start()
    try:
        peer, _ = master.next_call("subscribe")
        master.subscribed(peer, "fw-1")
        master.reply(peer, Event(offers=Event.Offers(offers=offers)))
        _, accept_env = master.next_call("accept")
        _, decline_env = master.next_call("decline")
    finally:
        driver.stop(failover=True)
        assert driver.join(WAIT)
        master.close()
        ctx.term()
    decides = {s.attributes[sp.DECISION]: s for s in spans.get_finished_spans()  # type: ignore[index]
               if s.name == sp.DECIDE}
    for decision, oid, env_ in (("accept", "o1", accept_env), ("decline", "o2", decline_env)):
        span, parent = decides[decision], offer_spans[oid].get_span_context()
        ctx_ = span.get_span_context()
        assert ctx_ is not None
        assert span.parent is not None and span.parent.span_id == parent.span_id
        assert ctx_.trace_id == parent.trace_id
        # The envelope names the decide span: the master relays it to the broker.
        assert env_.traceparent.startswith(f"00-{ctx_.trace_id:032x}-{ctx_.span_id:016x}-")
        assert span.attributes is not None
        assert list(span.attributes[sp.OFFER_IDS]) == [oid]  # type: ignore[arg-type]
        assert span.attributes[sp.FRAMEWORK_ID] == "fw-1"
        assert span.attributes[sp.FRAMEWORK_NAME] == "web"
    acc, dec = decides["accept"].attributes, decides["decline"].attributes
    assert acc is not None and dec is not None
    assert list(acc[sp.TASK_IDS]) == ["t1"] and acc[sp.REFUSE_SECONDS] == 2.0  # type: ignore[arg-type]
    assert "1 task" in str(acc[sp.REASON])
    assert dec[sp.REASON] == "1 instance(s) not placed: no fit" and dec[sp.REFUSE_SECONDS] == 30.0


# -- the agent core: the Launch carries the run span's traceparent ---------------------------
def test_agent_core_hands_the_traced_launch_to_the_executor() -> None:
    core = AgentCore(info(), now=0.0, new_id=lambda: "x")
    registered(core)
    ev = agent_pb2.AgentEvent()
    launch = ev.run_tasks.launches.add(framework_id="F1", traceparent="00-launch")
    launch.task.task_id = "t1"
    [cmd] = [c for c in core.master_event(ev, 0.0) if isinstance(c, LaunchExecutor)]
    assert cmd.traceparent == "00-launch"  # the run span's parent
    assert core.executors[cmd.executor_id].traceparent == "00-launch"
    core.launch_traced(cmd.executor_id, "00-run")
    sent = [c for c in subscribe(core, cmd.executor_id) if isinstance(c, ToExecutor)]
    [launch_cmd] = [c for c in sent if c.event.WhichOneof("event") == "launch"]
    assert launch_cmd.traceparent == "00-run"


def test_executors_get_their_own_trace_files_not_the_agents() -> None:
    env_ = executor_environment({"OFFERBUS_TRACES_FILE": "/run/x/traces/agent.jsonl",
                                 "OTEL_SERVICE_NAME": "offerbus-agent",
                                 "OTEL_TRACES_EXPORTER": "otlp"})
    assert "OFFERBUS_TRACES_FILE" not in env_ and "OTEL_SERVICE_NAME" not in env_
    assert env_["OFFERBUS_TRACES_DIR"] == "/run/x/traces"
    assert env_["OTEL_TRACES_EXPORTER"] == "otlp"


# -- a real executor: start, TASK_RUNNING, status ----------------------------------------------
@pytest.fixture
def traced_env(monkeypatch: pytest.MonkeyPatch, request: pytest.FixtureRequest) -> \
        tuple[dict[str, Any], Path]:
    """The executor harness, its launcher (and so its executors) writing traces to a dir."""
    folder = Path(f"/tmp/obx-traces-{uuid.uuid4().hex[:8]}")
    monkeypatch.setenv("OFFERBUS_TRACES_DIR", str(folder))
    monkeypatch.delenv("OFFERBUS_TRACES_FILE", raising=False)
    monkeypatch.setenv("OTEL_TRACES_EXPORTER", "none")
    request.addfinalizer(lambda: __import__("shutil").rmtree(folder, ignore_errors=True))
    return request.getfixturevalue("env"), folder


def test_executor_start_span_event_and_linked_status(
    traced_env: tuple[dict[str, Any], Path],
) -> None:
    harness, folder = traced_env
    agent: FakeAgent = harness["agent"]
    executor_id, pid, _ = start_executor(harness)
    trace_id, run_span_id = uuid.uuid4().hex, uuid.uuid4().hex[:16]
    env_ = codec.Envelope(traceparent=f"00-{trace_id}-{run_span_id}-01")
    ev: executor_pb2.ExecutorEvent = env_.executor_event
    ev.launch.framework_id = harness["framework_id"]
    ev.launch.task.CopyFrom(make_task("t1", "echo hi", harness["image"]))
    assert agent.server is not None and agent.server.send(agent.peer, env_)
    agent.run_until(lambda: tasks.FINISHED in agent.states(), 20.0, "no TASK_FINISHED")
    final = next(s for s in agent.updates if s.state == tasks.FINISHED)
    agent.run_until(lambda: _gone(pid), 15.0, "executor did not exit after the terminal ack")

    path = folder / f"offerbus-executor-{pid}.jsonl"
    assert path.exists(), f"no trace file; {sorted(os.listdir(folder))}"
    by_name = {s["name"]: s for s in read_spans(path)}
    start, status = by_name[sp.START], by_name[sp.STATUS]
    assert start["traceId"] == trace_id and start["parentSpanId"] == run_span_id
    assert start["attrs"][sp.IMAGE] == harness["image"]
    assert start["attrs"][sp.CONTAINER_ID] == final.container_id != ""
    assert start["attrs"][sp.TASK_ID] == "t1"
    assert start["attrs"][sp.EXECUTOR_ID] == executor_id
    assert start["attrs"][sp.FRAMEWORK_ID] == harness["framework_id"]
    assert [e["name"] for e in start.get("events", [])] == ["TASK_RUNNING"]
    assert start["resource"]["service.name"] == "offerbus-executor"
    # The process is the framework's executor host (it may serve several executors): its
    # resource names the framework; the executor is the span's own attribute (above).
    assert start["resource"]["offerbus.framework_id"] == harness["framework_id"]
    [link] = status["links"]
    assert link["traceId"] == trace_id and link["spanId"] == start["spanId"]
    assert status["attrs"][sp.TASK_STATE] == "TASK_FINISHED"
    assert status["attrs"]["offerbus.exit_code"] == 0
