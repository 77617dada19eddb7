"""The central services' spans. The allocator and the offer-broker run as real PROCESSES
writing OTLP-JSON files (OFFERBUS_TRACES_DIR), with the test playing the master: one trace
runs allocate -> offer -> validate, each hop's parent carried in the message. The master's
shell runs in-process under a test tracer: launch continues the broker's validate span,
records its traceparent on the task and hands it to the agent; status spans link to it."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from schemas import agent_pb2, common_pb2, internal_pb2, scheduler_pb2
from services.bus import codec
from services.master import shell as master_shell
from services.master.core import MasterCore
from services.master.shell import MasterConfig, MasterShell
from services.telemetry import spans
from services.telemetry.file_exporter import read_spans
from tests.integration.test_allocator_broker import (
    START,
    STEP,
    TASK_RES,
    Master,
    agent,
    call,
    framework,
)
from tests.master.helpers import T0, launch_msg, register, subscribed, task_info

REPO = Path(__file__).resolve().parents[2]
FW = "fw-1"
DECIDE_SPAN_ID = "abababababababab"  # the framework's decide span, as a traceparent names it


def span_id(traceparent: str) -> str:
    return traceparent.split("-")[2]


def trace_id(traceparent: str) -> str:
    return traceparent.split("-")[1]


@pytest.fixture
def traces(tmp_path: Path) -> Path:
    return tmp_path / "traces"


@pytest.fixture
def spawn(tmp_path: Path, traces: Path) -> Iterator[Callable[..., subprocess.Popen[bytes]]]:
    started: list[subprocess.Popen[bytes]] = []

    def start(service: str, member_id: str, *flags: str) -> subprocess.Popen[bytes]:
        logs = (tmp_path / f"{member_id}.log").open("wb")
        env = {**os.environ, "PYTHONPATH": str(REPO), "OFFERBUS_TRACES_DIR": str(traces)}
        env.pop("OFFERBUS_TRACES_FILE", None)
        proc = subprocess.Popen(
            [sys.executable, "-m", f"services.{service}", "--cluster", f"file://{tmp_path}",
             "--id", member_id, *flags],
            cwd=REPO, stdout=logs, stderr=subprocess.STDOUT, env=env)
        started.append(proc)
        return proc

    yield start
    for proc in started:
        if proc.poll() is None:
            proc.kill()
        proc.wait()


def all_spans(folder: Path) -> list[dict[str, Any]]:
    return [s for f in sorted(folder.glob("*.jsonl")) for s in read_spans(f)]


def send_broker(master: Master, msg: internal_pb2.InternalMessage, traceparent: str) -> None:
    assert master.broker is not None
    env = codec.Envelope(traceparent=traceparent)
    env.internal.CopyFrom(msg)
    assert master.internal.send(master.broker[0], env)


def test_allocate_offer_and_validate_form_one_trace_across_processes(
    tmp_path: Path, traces: Path, spawn: Callable[..., subprocess.Popen[bytes]],
) -> None:
    master = Master(tmp_path)
    try:
        broker = spawn("broker", "b1")
        allocator = spawn("allocator", "a1", "--interval", "0.5")
        master.publish(agent("ag-1"), agent("ag-2"), framework(FW))
        offers = master.until_offered({"ag-1", "ag-2"}, 0, START, "no offers of both agents")
        # Every offer carries its own traceparent; a batch's envelope names its first one.
        assert all(o.traceparent.startswith("00-") for o in offers.values())
        for env in master.received:
            batch = env.internal.framework_event.event.offers.offers
            if batch:
                assert env.traceparent == batch[0].traceparent

        # A decline under the framework's decide span (the envelope's traceparent).
        declined = offers["ag-1"]
        decide = f"00-{trace_id(declined.traceparent)}-{DECIDE_SPAN_ID}-01"
        send_broker(master, call(FW, decline=scheduler_pb2.SchedulerCall.Decline(
            offer_ids=[declined.offer_id], filters=common_pb2.Filters(refuse_seconds=60),
            reason="not today")), decide)
        # An accept without a traceparent: its validate span falls back to the offer's.
        accepted = offers["ag-2"]
        mark = len(master.received)
        accept = scheduler_pb2.SchedulerCall.Accept(offer_ids=[accepted.offer_id])
        t = accept.operations.add().launch.tasks.add(task_id="t-1", name="web")
        t.resources.extend(TASK_RES.to_proto())
        send_broker(master, call(FW, accept=accept), "")

        def launch_envelope() -> codec.Envelope | None:
            return next((e for e in master.received[mark:]
                         if e.internal.WhichOneof("kind") == "launch_request"), None)
        request = master.pump_until(launch_envelope, STEP, "no LaunchRequest")
        assert request is not None and request.traceparent.startswith("00-")
        # An offer still outstanding when the broker stops: it is rescinded on the way out.
        master.publish(agent("ag-3"))
        left = master.until_offered({"ag-3"}, mark, STEP, "no offer of ag-3")["ag-3"]

        # The processes flush their spans on the way out (the broker rescinds what is left).
        for proc in (allocator, broker):
            proc.send_signal(signal.SIGTERM)
        master.pump_until(lambda: allocator.poll() is not None and broker.poll() is not None,
                          START, "the services did not stop on SIGTERM")
        assert allocator.returncode == 0 and broker.returncode == 0
    finally:
        master.close()

    found = all_spans(traces)
    by_id = {s["spanId"]: s for s in found}
    services = {s["resource"]["service.name"] for s in found}
    assert {"offerbus-allocator", "offerbus-broker"} <= services

    # allocate -> offer, and the Offer the master got names the offer span.
    for o in offers.values():
        offer_span = by_id[span_id(o.traceparent)]
        assert offer_span["name"] == spans.OFFER
        assert offer_span["traceId"] == trace_id(o.traceparent)
        assert offer_span["attrs"][spans.OFFER_ID] == o.offer_id
        assert offer_span["attrs"][spans.AGENT_ID] == o.agent_id
        assert offer_span["attrs"][spans.FRAMEWORK_ID] == FW
        assert offer_span["attrs"][spans.EXPIRES_AT_US] == o.expires_at_us
        allocate = by_id[offer_span["parentSpanId"]]
        assert allocate["name"] == spans.ALLOCATE
        assert allocate["traceId"] == offer_span["traceId"]
        assert allocate["resource"]["service.name"] == "offerbus-allocator"
        assert allocate["attrs"][spans.ALLOCATION_ID] == o.allocation_id
        assert allocate["attrs"][spans.AGENT_ID] == o.agent_id
        assert allocate["attrs"][spans.FRAMEWORK_ID] == FW
        assert allocate["attrs"][spans.RESOURCES] == "cpus:2;mem:1024"
        assert spans.CYCLE in allocate["attrs"] and spans.WEIGHT in allocate["attrs"]
        assert not allocate.get("parentSpanId")  # each allocation starts its trace

    # The decline: a validate span under the framework's decide span.
    validates = [s for s in found if s["name"] == spans.VALIDATE]
    decline = next(s for s in validates if s["attrs"][spans.DECISION] == "decline")
    assert decline["parentSpanId"] == DECIDE_SPAN_ID
    assert decline["traceId"] == trace_id(declined.traceparent)
    assert decline["attrs"][spans.VALID] is True
    assert decline["attrs"][spans.OFFER_IDS] == [declined.offer_id]
    assert decline["attrs"][spans.REASON] == "not today"
    assert decline["attrs"][spans.REFUSE_SECONDS] == 60

    # The accept: under the offer span (no decide span given); the LaunchRequest names it.
    acc = next(s for s in validates if s["attrs"][spans.DECISION] == "accept")
    assert acc["parentSpanId"] == span_id(accepted.traceparent)
    assert acc["attrs"][spans.VALID] is True
    assert acc["attrs"][spans.TASK_IDS] == ["t-1"]
    assert span_id(request.traceparent) == acc["spanId"]
    assert trace_id(request.traceparent) == acc["traceId"]

    # SIGTERM rescinded what was still offered: rescind spans under their offers' spans.
    rescinds = [s for s in found if s["name"] == spans.RESCIND]
    assert [r["attrs"][spans.OFFER_ID] for r in rescinds] == [left.offer_id]
    for r in rescinds:
        parent = by_id[r["parentSpanId"]]
        assert parent["name"] == spans.OFFER
        assert parent["attrs"][spans.OFFER_ID] == r["attrs"][spans.OFFER_ID]
        assert r["attrs"][spans.REASON].startswith("broker_failover")


# -- the master, in-process -------------------------------------------------------------------


@pytest.fixture
def recorded(monkeypatch: pytest.MonkeyPatch) -> InMemorySpanExporter:
    """The master shell's spans, under a provider of the test's own (not the global one)."""
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    monkeypatch.setattr(master_shell, "tracer", provider.get_tracer("test"))
    return exporter


@pytest.fixture
def master(tmp_path: Path) -> Iterator[tuple[MasterShell, list[codec.Envelope]]]:
    shell = MasterShell(MasterConfig("m1", f"file://{tmp_path}", f"file://{tmp_path}"))
    sent: list[codec.Envelope] = []
    shell._send = lambda server, peer, env: sent.append(env)  # type: ignore[method-assign]
    try:
        yield shell, sent
    finally:
        shell.close()


def broker_env(msg: internal_pb2.InternalMessage, traceparent: str) -> codec.Envelope:
    env = codec.Envelope(sender_role=codec.Role.Value("ROLE_BROKER"), epoch=3,
                         traceparent=traceparent)
    env.internal.CopyFrom(msg)
    return env


def test_the_master_continues_validate_with_launch_and_links_status_to_it(
    master: tuple[MasterShell, list[codec.Envelope]], recorded: InMemorySpanExporter,
) -> None:
    shell, sent = master
    core = shell.core = MasterCore("m1", 7, now=T0)
    aid = register(core, b"a1")
    fid = subscribed(core, b"f1")
    validate = "00-0123456789abcdef0123456789abcdef-cdcdcdcdcdcdcdcd-01"

    shell._on_internal(b"broker", broker_env(
        launch_msg(fid, aid, task_info("t1"), task_info("t2")), validate))
    launch = next(s for s in recorded.get_finished_spans() if s.name == spans.LAUNCH)
    ctx = launch.get_span_context()
    assert ctx is not None and launch.parent is not None
    assert format(ctx.trace_id, "032x") == "0123456789abcdef0123456789abcdef"
    assert format(launch.parent.span_id, "016x") == "cdcdcdcdcdcdcdcd"
    attrs = launch.attributes or {}
    assert attrs[spans.VALID] is True and list(attrs[spans.TASK_IDS]) == ["t1", "t2"]  # type: ignore[arg-type]
    assert attrs[spans.AGENT_ID] == aid and attrs[spans.FRAMEWORK_ID] == fid
    launch_tp = f"00-{ctx.trace_id:032x}-{ctx.span_id:016x}-01"
    run = next(e for e in sent if e.agent_event.WhichOneof("event") == "run_tasks")
    assert run.traceparent == launch_tp
    assert [lt.traceparent for lt in run.agent_event.run_tasks.launches] == [launch_tp] * 2
    assert core.tasks[(fid, "t1")].traceparent == launch_tp

    # A launch the master refuses (t1 is live): VALID false, the failed check named.
    shell._on_internal(b"broker", broker_env(
        launch_msg(fid, aid, task_info("t1"), rid="r2"), validate))
    refused = [s for s in recorded.get_finished_spans() if s.name == spans.LAUNCH][-1]
    assert (refused.attributes or {})[spans.VALID] is False
    assert (refused.attributes or {})[spans.FAILED_CHECK] == "task_invalid"

    # RUNNING: a status span linked to the launch span; STARTING: none (kept cheap).
    for state in (common_pb2.TaskState.TASK_STARTING, common_pb2.TaskState.TASK_RUNNING):
        su = agent_pb2.StatusUpdate(framework_id=fid, status=common_pb2.TaskStatus(
            task_id="t1", state=state, uuid=b"u%d" % state, agent_id=aid,
            source=common_pb2.TaskStatus.SOURCE_EXECUTOR))
        env = codec.Envelope(sender_role=codec.Role.Value("ROLE_AGENT"))
        env.agent_call.CopyFrom(agent_pb2.AgentCall(
            agent_id=aid, status_updates=agent_pb2.AgentCall.StatusUpdates(updates=[su])))
        shell._on_front(b"a1", env)
    status = [s for s in recorded.get_finished_spans() if s.name == spans.STATUS]
    assert len(status) == 1
    assert (status[0].attributes or {})[spans.TASK_STATE] == "TASK_RUNNING"
    assert (status[0].attributes or {})[spans.TASK_ID] == "t1"
    assert [lk.context.span_id for lk in status[0].links] == [ctx.span_id]


def test_relayed_offers_keep_their_own_traceparents(
    master: tuple[MasterShell, list[codec.Envelope]], recorded: InMemorySpanExporter,
) -> None:
    shell, sent = master
    core = shell.core = MasterCore("m1", 7, now=T0)
    aid = register(core, b"a1")
    fid = subscribed(core, b"f1")
    tps = [f"00-{'1' * 32}-{'2' * 16}-01", f"00-{'3' * 32}-{'4' * 16}-01"]
    ev = scheduler_pb2.SchedulerEvent(offers=scheduler_pb2.SchedulerEvent.Offers(offers=[
        common_pb2.Offer(offer_id=f"3-o{i}", framework_id=fid, agent_id=aid, traceparent=tp)
        for i, tp in enumerate(tps)]))
    msg = internal_pb2.InternalMessage(framework_event=internal_pb2.InternalMessage
                                       .FrameworkEvent(framework_id=fid, event=ev))
    shell._on_internal(b"broker", broker_env(msg, ""))
    out = next(e for e in sent if e.scheduler_event.WhichOneof("event") == "offers")
    assert [o.traceparent for o in out.scheduler_event.offers.offers] == tps
    assert out.traceparent == tps[0]


def test_status_spans_are_one_per_launch_and_state_in_an_update(
    master: tuple[MasterShell, list[codec.Envelope]], recorded: InMemorySpanExporter,
) -> None:
    """Tasks of one launch reported together share one status span (TASK_IDS, linked to
    their launch); tasks of another launch get their own, linked to theirs."""
    shell, _sent = master
    core = shell.core = MasterCore("m1", 7, now=T0)
    aid = register(core, b"a1")
    fid = subscribed(core, b"f1")
    a = "00-0123456789abcdef0123456789abcdef-cdcdcdcdcdcdcdcd-01"
    b = "00-fedcba9876543210fedcba9876543210-dcdcdcdcdcdcdcdc-01"
    shell._on_internal(b"broker", broker_env(
        launch_msg(fid, aid, task_info("t1"), task_info("t2"), offers=("o1",)), a))
    shell._on_internal(b"broker", broker_env(
        launch_msg(fid, aid, task_info("t3"), rid="r2", offers=("o2",)), b))
    launches = {format(s.context.trace_id, "032x"): s.context.span_id
                for s in recorded.get_finished_spans() if s.name == spans.LAUNCH}
    updates = [agent_pb2.StatusUpdate(framework_id=fid, status=common_pb2.TaskStatus(
        task_id=t, state=common_pb2.TaskState.TASK_RUNNING, uuid=t.encode(), agent_id=aid,
        source=common_pb2.TaskStatus.SOURCE_EXECUTOR)) for t in ("t1", "t3", "t2")]
    env = codec.Envelope(sender_role=codec.Role.Value("ROLE_AGENT"))
    env.agent_call.CopyFrom(agent_pb2.AgentCall(
        agent_id=aid, status_updates=agent_pb2.AgentCall.StatusUpdates(updates=updates)))
    shell._on_front(b"a1", env)
    status = [s for s in recorded.get_finished_spans() if s.name == spans.STATUS]
    assert len(status) == 2
    by_link = {s.links[0].context.span_id: s for s in status if len(s.links) == 1}
    one = by_link[launches[trace_id(a)]].attributes or {}
    assert list(one[spans.TASK_IDS]) == ["t1", "t2"] and spans.TASK_ID not in one  # type: ignore[arg-type]
    assert one[spans.TASK_STATE] == "TASK_RUNNING" and one[spans.AGENT_ID] == aid
    other = by_link[launches[trace_id(b)]].attributes or {}
    assert other[spans.TASK_ID] == "t3" and spans.TASK_IDS not in other


def test_a_retried_update_is_not_traced_again(
    master: tuple[MasterShell, list[codec.Envelope]], recorded: InMemorySpanExporter,
) -> None:
    """An agent resends an update until its framework acknowledges it: the master forwards
    each copy, but the task's trace gets one status span for it."""
    shell, _sent = master
    core = shell.core = MasterCore("m1", 7, now=T0)
    aid = register(core, b"a1")
    fid = subscribed(core, b"f1")
    shell._on_internal(b"broker", broker_env(
        launch_msg(fid, aid, task_info("t1")),
        "00-0123456789abcdef0123456789abcdef-cdcdcdcdcdcdcdcd-01"))

    def running(uuid: bytes) -> codec.Envelope:
        su = agent_pb2.StatusUpdate(framework_id=fid, status=common_pb2.TaskStatus(
            task_id="t1", state=common_pb2.TaskState.TASK_RUNNING, uuid=uuid,
            agent_id=aid, source=common_pb2.TaskStatus.SOURCE_EXECUTOR))
        env = codec.Envelope(sender_role=codec.Role.Value("ROLE_AGENT"))
        env.agent_call.CopyFrom(agent_pb2.AgentCall(
            agent_id=aid, status_updates=agent_pb2.AgentCall.StatusUpdates(updates=[su])))
        return env

    shell._on_front(b"a1", running(b"u1"))
    # The reactor's wake-up ends: the turn's updates go out (as the idle flush sends them;
    # this shell does not lead, so it publishes nothing).
    shell._send_framework(shell._updates_out.drain())
    shell._on_front(b"a1", running(b"u1"))  # the retry, at a later wake-up
    shell._send_framework(shell._updates_out.drain())
    forwarded = [e for e in _sent if e.scheduler_event.WhichOneof("event") == "update"]
    assert len(forwarded) == 2  # still forwarded: the agent needs its acknowledgement
    assert len([s for s in recorded.get_finished_spans() if s.name == spans.STATUS]) == 1


def test_status_spans_remember_a_bounded_number_of_updates() -> None:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracer = provider.get_tracer("test")
    traced = spans.StatusSpans(memory=2)

    def running(tid: str) -> common_pb2.TaskStatus:
        return common_pb2.TaskStatus(task_id=tid, uuid=tid.encode(), agent_id="a",
                                     state=common_pb2.TaskState.TASK_RUNNING)

    for tid in ("t1", "t2", "t3", "t3", "t1"):  # t1 forgotten when t3 came: traced again
        traced.trace(tracer, FW, [running(tid)], lambda _tid: None)
    assert [(s.attributes or {})[spans.TASK_ID] for s in exporter.get_finished_spans()] == [
        "t1", "t2", "t3", "t1"]
    assert len(traced._traced) == 2


def test_a_wake_ups_updates_reach_their_framework_as_one_update(
    master: tuple[MasterShell, list[codec.Envelope]], recorded: InMemorySpanExporter,
) -> None:
    """Updates from two agents in one wake-up: one Update to the framework (in order), and
    still a status span per launch (services/master/outbox.py)."""
    shell, sent = master
    core = shell.core = MasterCore("m1", 7, now=T0)
    agents = [register(core, b"a1"), register(core, b"a2")]
    fid = subscribed(core, b"f1")
    for i, aid in enumerate(agents):
        shell._on_internal(b"broker", broker_env(
            launch_msg(fid, aid, task_info(f"t{i}"), rid=f"r{i}", offers=(f"o{i}",)),
            f"00-{i + 1:032x}-cdcdcdcdcdcdcdcd-01"))
    for i, aid in enumerate(agents):
        env = codec.Envelope(sender_role=codec.Role.Value("ROLE_AGENT"))
        env.agent_call.CopyFrom(agent_pb2.AgentCall(
            agent_id=aid, status_updates=agent_pb2.AgentCall.StatusUpdates(updates=[
                agent_pb2.StatusUpdate(framework_id=fid, status=common_pb2.TaskStatus(
                    task_id=f"t{i}", state=common_pb2.TaskState.TASK_RUNNING,
                    uuid=f"u{i}".encode(), agent_id=aid,
                    source=common_pb2.TaskStatus.SOURCE_EXECUTOR))])))
        shell._on_front(f"a{i + 1}".encode(), env)
    assert not [e for e in sent if e.scheduler_event.WhichOneof("event") == "update"]
    shell._send_framework(shell._updates_out.drain())  # the wake-up's idle flush
    updates = [e for e in sent if e.scheduler_event.WhichOneof("event") == "update"]
    assert [[s.task_id for s in e.scheduler_event.update.statuses] for e in updates] == [
        ["t0", "t1"]]
    assert len([s for s in recorded.get_finished_spans() if s.name == spans.STATUS]) == 2
