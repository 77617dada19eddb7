"""`offerbus why`: the explanations the issue asks for, from realistic inputs — decisions
made by the real AllocatorCore and encoded as the allocator's /decisions serves them, the
master's /state encoded from its records, `decide` spans written through the real exporter,
and a status file written by the real service framework."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from google.protobuf.json_format import MessageToDict

from frameworks import service
from frameworks import spec as specs
from schemas import common_pb2, internal_pb2, state_pb2
from services.allocator.core import AllocatorCore, Cycle
from services.cli import main as cli_main
from services.cli import trace as tv
from services.cli import why
from services.resources import Resources
from tests.cli.test_trace_view import NO_FIT, write_cluster_traces

NOW = 1_700_000_000.0
AGENT = Resources.of(cpus=4, mem=4096)
NAMES = {"fw-web": "web", "fw-big": "big", "fw-batch": "batch"}


def decisions_json(cycle: Cycle) -> list[dict[str, Any]]:
    """What GET /decisions returns under "decisions" (as services/allocator/shell.py)."""
    msg = internal_pb2.InternalMessage.AllocatorDecisions(
        decisions=[d.to_proto() for d in cycle.decisions])
    return list(MessageToDict(msg, preserving_proto_field_name=True).get("decisions", []))


def core_with(frameworks: list[str], agents: int = 2) -> AllocatorCore:
    core = AllocatorCore()
    for i in range(1, agents + 1):
        core.agent_added(f"agent-{i}", f"agent-{i}", AGENT)
    for fid in frameworks:
        core.framework_added(fid, "*")
    return core


def state_json(tasks: tuple[state_pb2.TaskRecord, ...] = ()) -> dict[str, Any]:
    """What the master's /state returns (as services/master/shell.py)."""
    state: dict[str, Any] = {"agents": [], "frameworks": [], "tasks": [], "roles": []}
    for i in (1, 2):
        rec = state_pb2.AgentRecord(status=state_pb2.AgentRecord.AGENT_STATUS_REGISTERED)
        rec.agent_info.agent_id = rec.agent_info.hostname = f"agent-{i}"
        state["agents"].append(MessageToDict(rec, preserving_proto_field_name=True))
    for fid, name in NAMES.items():
        fw = state_pb2.FrameworkRecord(connected=True)
        fw.framework_info.framework_id, fw.framework_info.name = fid, name
        fw.framework_info.role = "*"
        state["frameworks"].append(MessageToDict(fw, preserving_proto_field_name=True))
    for task in tasks:
        state["tasks"].append(MessageToDict(task, preserving_proto_field_name=True))
    return state


@pytest.fixture
def spans(tmp_path: Path) -> list[tv.Span]:
    write_cluster_traces(tmp_path / "traces")
    return tv.load_spans(tmp_path / "traces")


def test_a_framework_that_suppressed(spans: list[tv.Span]) -> None:
    core = core_with(["fw-web", "fw-big"])
    core.suppress("fw-web")
    out = why.explain("web", decisions_json(core.allocate(NOW)), state_json(), spans, {})
    assert out[0].startswith("Framework web (fw-web) (role *) is connected")
    assert out[1] == ("Framework web (fw-web) gets no offers: it suppressed offers "
                      "(revive to get offers again).")


def test_a_framework_whose_decline_filter_hides_an_agent(spans: list[tv.Span]) -> None:
    core = core_with(["fw-big"], agents=0)
    core.agent_added("agent-2", "agent-2", AGENT)
    [offer] = core.allocate(NOW).allocations
    core.recover("agent-2", "fw-big", offer.resources, refuse_seconds=5.0, now=NOW)
    decisions = decisions_json(core.allocate(NOW + 1))
    assert decisions[0]["outcome"] == "OUTCOME_FILTERED"
    out = why.explain("fw-big", decisions, state_json(), spans, {}, now=NOW + 1)
    until = why._clock(NOW + 5)
    assert (f"Framework big (fw-big) got no offer in cycle 2: its decline filters are in force "
            f"on 1 agent(s), e.g. agent-2 until {until}, 4s from now") in out[1]
    assert any("declined offers o-2, o-3 from agent-2, agent-3 (filtering them for 5s" in x
               and x.endswith(f"{NO_FIT}.") for x in out[2:]), out


def test_a_framework_whose_dominant_share_is_above_the_others(spans: list[tv.Span]) -> None:
    core = core_with(["fw-web", "fw-batch"])
    core.resources_used("agent-1", "fw-web", AGENT)  # web holds half the cluster
    cycle = core.allocate(NOW)
    assert [a.framework_id for a in cycle.allocations] == ["fw-batch"]
    decisions = decisions_json(cycle)
    assert {d["framework_id"]: d["outcome"] for d in decisions}["fw-web"] == \
        "OUTCOME_FAIR_SHARE"
    out = why.explain("fw-web", decisions, state_json(), spans, {})
    assert out[1] == ("Framework web (fw-web) got no offer in cycle 1: its dominant share "
                      "0.500 (of cpus) is above framework batch (fw-batch)'s 0.500 (of cpus), "
                      "counting what it was just offered: DRF offers to the lowest share "
                      "first, and it took the free resources.")
    # With the allocate span of batch's allocation, the share DRF compared:
    spans = [*spans, {"traceId": "1" * 32, "spanId": "2" * 16, "name": "allocate",
                      "startTimeUnixNano": "1", "attrs": {
                          "offerbus.allocation_id": cycle.allocations[0].allocation_id,
                          "offerbus.dominant_share": 0.0}}]
    out = why.explain("fw-web", decisions, state_json(), spans, {})
    assert "above framework batch (fw-batch)'s 0.000 when it was offered: DRF" in out[1]


def _pending_status(tmp_path: Path) -> dict[str, dict[str, Any]]:
    """The big service wants 100000 MiB per instance: the real planner's reason, written
    by the real scheduler to <run-dir>/frameworks/big.status.json."""
    spec = service.ServiceSpec(name="big", image="", instances=1, cpus=0.1, mem=100000,
                               runtime="process")
    offer = common_pb2.Offer(offer_id="o-2", agent_id="agent-2", hostname="agent-2")
    offer.resources.extend(AGENT.to_proto())
    placed = service.plan(spec, {}, [offer])
    declines, reason = placed.declines, placed.why
    assert declines == ["o-2"] and reason == NO_FIT
    path = specs.spec_path(tmp_path, "big").with_suffix(".status.json")
    path.parent.mkdir(parents=True)
    scheduler = service.ServiceScheduler(spec, path)
    scheduler.pending_reason = reason
    scheduler._write_status()
    return why.load_statuses(tmp_path / "frameworks")


def test_a_task_that_fits_no_agent(spans: list[tv.Span], tmp_path: Path) -> None:
    statuses = _pending_status(tmp_path)
    out = why.explain("big-0-1", [], state_json(), spans, statuses)
    assert out[0] == ("The master does not know task big-0-1: its framework has not launched "
                      "it (service big has it pending).")
    assert "framework big declined offers o-2, o-3 from agent-2, agent-3" in out[1]
    assert "no offer fits cpus:0.1;mem:100000 (e.g. agent-2 offers cpus:4;mem:4096)" in out[1]
    assert out[2] == f"Service big runs 0 of 1 instance(s); its status file says: {NO_FIT}."
    # From the spans alone (no status file), and from the status file alone (no tracing):
    assert NO_FIT in why.explain("big-0-1", [], state_json(), spans, {})[1]
    assert why.explain("big-0-1", [], state_json(), [], statuses)[1].endswith(f"{NO_FIT}.")
    assert "is tracing on" in why.explain("nothing-1", [], state_json(), [], {})[-1]


def test_a_task_the_master_knows(spans: list[tv.Span]) -> None:
    task = state_pb2.TaskRecord(framework_id="fw-web", agent_id="agent-1")
    task.task_info.task_id = "web-0-1"
    task.status.state = common_pb2.TASK_RUNNING
    out = why.explain("web-0-1", [], state_json((task,)), spans, {})
    assert out == ["Task web-0-1 of framework web (fw-web) is RUNNING on agent agent-1 "
                   "(agent-1). `offerbus trace task web-0-1` shows how it got there."]


@pytest.mark.parametrize(("setup", "expected"), [
    (lambda c: c.framework_deactivated("fw-web"), "it is not subscribed"),
    (lambda c: None, "was offered resources in cycle 1: 1 allocation(s)"),
])
def test_other_outcomes(setup: Any, expected: str, spans: list[tv.Span]) -> None:
    core = core_with(["fw-web"], agents=1)
    setup(core)
    out = why.explain("web", decisions_json(core.allocate(NOW)), state_json(), spans, {})
    assert expected in out[1], out


def test_no_fit_outcome() -> None:
    core = core_with(["fw-web", "fw-big"], agents=1)
    core.resources_used("agent-1", "fw-big", AGENT)
    out = why.explain("web", decisions_json(core.allocate(NOW)), state_json(), [], {})
    assert "no agent has free resources it may use" in out[1], out


def test_cli_why_asks_the_allocator_for_the_framework(
        spans: list[tv.Span], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from rich.console import Console

    from services.bus.election import LeaderInfo

    core = core_with(["fw-web"])
    core.suppress("fw-web")
    decisions = decisions_json(core.allocate(NOW))
    asked = []

    def http_get(url: str, timeout: float = 5.0) -> Any:
        asked.append(url)
        return {"decisions": decisions}

    leader = LeaderInfo("allocator", "allocator-1", 1, {"http": "http://alloc:1"})
    monkeypatch.setattr(why, "master_state", lambda url, t: (None, state_json()))
    monkeypatch.setattr(why, "find_leader", lambda url, t, role: leader)
    monkeypatch.setattr(why, "http_get", http_get)
    console = Console(width=200, record=True)
    monkeypatch.setattr(cli_main, "console", console)
    code = cli_main.main(["--run-dir", str(tmp_path), "--cluster", "file:///x", "why", "web"])
    assert code == 0
    assert asked == ["http://alloc:1/decisions?framework=fw-web"]
    assert "it suppressed offers (revive to get offers again)" in console.export_text()


@pytest.mark.parametrize("ended", ["TASK_GONE_BY_OPERATOR", "TASK_GONE", "TASK_KILLED"])
def test_ended_tasks_are_not_counted_live(ended: str) -> None:
    """Every terminal state of services/tasks.py ends a task for `why` (TASK_GONE_BY_OPERATOR
    was counted live when why.py kept its own list)."""
    running = state_pb2.TaskRecord(framework_id="fw-web", agent_id="agent-1")
    running.task_info.task_id = "web-0-1"
    running.status.state = common_pb2.TASK_RUNNING
    gone = state_pb2.TaskRecord(framework_id="fw-web", agent_id="agent-1")
    gone.task_info.task_id = "web-1-1"
    gone.status.state = common_pb2.TaskState.Value(ended)
    out = why.explain_framework("fw-web", [], state_json((running, gone)), [])
    assert "has 1 live task(s)" in out[0], out


def test_why_says_what_is_reclaimed_for_a_framework_below_its_share(
        spans: list[tv.Span]) -> None:
    """A framework with declared demand whose task fits nowhere: `why` tells what the
    allocator does for it (reclaiming a sitting framework's offers), not only the shares."""
    from services.allocator.fill import Shape

    core = core_with(["fw-web"], agents=1)
    core.allocate(NOW)  # web, of unknown demand, sits on the whole agent
    core.framework_added("fw-batch", "*")
    core.demand("fw-batch", [Shape.of(Resources.of(cpus=1, mem=128), 1)])
    core.resources_used("agent-1", "fw-web", Resources.of(cpus=0.1, mem=32))
    cycle = core.allocate(NOW + 1)
    decisions = decisions_json(cycle)
    mine = {d["framework_id"]: d for d in decisions}["fw-batch"]
    assert mine["outcome"] == "OUTCOME_FAIR_SHARE", mine
    out = why.explain("fw-batch", decisions, state_json(), spans, {})
    assert "the allocator says: below its fair share" in out[1], out
    assert "reclaiming offers of fw-web on agent-1" in out[1], out


def held_by_a_limit(limited: str, role: str) -> tuple[AllocatorCore, list[str]]:
    """`why web` on framework web of `role`, which holds all of role `limited`'s limit."""
    core = AllocatorCore()
    core.agent_added("agent-1", "agent-1", AGENT)
    core.set_quota(limited, limit=Resources.of(cpus=0.5))
    core.framework_added("fw-web", role)
    core.resources_used("agent-1", "fw-web", Resources.of(cpus=0.5))
    return core, why.explain("web", decisions_json(core.allocate(NOW)), state_json(), [], {})


def test_why_names_a_quota_limit_and_a_guarantee() -> None:
    core, out = held_by_a_limit("web", "web")
    assert "its role's quota limit holds it back" in out[1], out
    assert "web limit cpus:0.5" in out[1] and "offerbus roles quota web" in out[1], out
    core.framework_removed("fw-web")
    core.set_quota("gold", guarantee=AGENT)
    core.framework_added("fw-gold", "gold")
    core.refuse("fw-gold", "agent-1", NOW + 100)  # it declines for now; its role has demand
    core.framework_added("fw-web", "*")
    out = why.explain("web", decisions_json(core.allocate(NOW + 1)), state_json(), [], {})
    assert "set aside for the quota guarantee of role(s) gold" in out[1], out


def test_why_names_the_role_whose_limit_holds_a_sub_role_back() -> None:
    """Seen this stop: a service of role q/web held by the limit on q was told to run
    `offerbus roles quota q/web --limit ...`, which sets another limit and leaves q's."""
    _, out = held_by_a_limit("q", "q/web")
    assert "q limit cpus:0.5" in out[1], out
    assert "offerbus roles quota q --limit" in out[1], out
    assert "quota q/web" not in out[1], out


def test_why_says_which_offers_a_framework_holds_unanswered() -> None:
    """A framework offered two agents declines one and holds the other's offer: `why` names
    the filter and the offer held (no one else is offered it meanwhile). Once it declines
    that one too, in a later cycle, both agents are counted: CI at stop 23 declined them in
    two cycles, and `why` counted the last cycle's one."""
    core = core_with(["fw-web"])
    first = core.allocate(NOW)
    assert {a.agent_id for a in first.allocations} == {"agent-1", "agent-2"}
    declined = next(a for a in first.allocations if a.agent_id == "agent-2")
    core.recover("agent-2", "fw-web", declined.resources, 120.0, NOW + 1)
    out = why.explain("web", decisions_json(core.allocate(NOW + 2)), state_json(), [], {},
                      now=NOW + 2)
    assert "decline filters are in force on 1 agent(s)" in out[1], out
    assert "It holds 1 offer(s) not answered yet (e.g. on agent-1)" in out[1], out
    core.recover("agent-1", "fw-web", core.agents["agent-1"].offered["fw-web"], 120.0, NOW + 3)
    out = why.explain("web", decisions_json(core.allocate(NOW + 4)), state_json(), [], {},
                      now=NOW + 4)
    assert "decline filters are in force on 2 agent(s)" in out[1], out
    assert "not answered" not in out[1], out
