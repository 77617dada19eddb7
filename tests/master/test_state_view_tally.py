"""The view's tally (issue 8 d): /metrics counts tasks, agents and frameworks from each key's
latest entry, without building /state's replica (after a failover, the replica of 110,000
entries took ~0.9 s of the GIL from the new master's re-registrations at the first scrape);
the counts equal what the document shows through any run of publishes, reigns and scrapes,
and what waits for the replica stays bounded when only /metrics is scraped."""

from __future__ import annotations

import json
from collections import Counter
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from schemas import bus_pb2, common_pb2, state_pb2
from services.master import view as view_module
from services.master.view import StateView

Entry = bus_pb2.StateEntry
TASK_STATES = (common_pb2.TASK_STAGING, common_pb2.TASK_RUNNING, common_pb2.TASK_FINISHED)
AGENT_STATUSES = (state_pb2.AgentRecord.AGENT_STATUS_REGISTERED,
                  state_pb2.AgentRecord.AGENT_STATUS_RECOVERING)


def task(i: int, state: int = common_pb2.TASK_RUNNING, fid: str = "f") -> Entry:
    return Entry(key=f"tasks/{fid}/t{i}", value=state_pb2.StateValue(task=state_pb2.TaskRecord(
        framework_id=fid, task_info=common_pb2.TaskInfo(task_id=f"t{i}"),
        status=common_pb2.TaskStatus(state=state))))


def agent(i: int, status: int = AGENT_STATUSES[0]) -> Entry:
    return Entry(key=f"agents/a{i}", value=state_pb2.StateValue(agent=state_pb2.AgentRecord(
        agent_info=common_pb2.AgentInfo(agent_id=f"a{i}"), status=status)))


def framework(fid: str) -> Entry:
    return Entry(key=f"frameworks/{fid}", value=state_pb2.StateValue(
        framework=state_pb2.FrameworkRecord(framework_info=common_pb2.FrameworkInfo(
            framework_id=fid, name=fid))))


def gone(key: str) -> Entry:
    return Entry(key=key, deleted=True)


def expected(latest: dict[str, Entry]) -> tuple[dict[str, int], dict[str, int], int]:
    """The counts of a state (its entries by key), as /metrics should show them."""
    tasks: Counter[str] = Counter()
    agents: Counter[str] = Counter()
    frameworks = 0
    for e in latest.values():
        kind = e.value.WhichOneof("kind")
        if kind == "task":
            tasks[common_pb2.TaskState.Name(e.value.task.status.state)] += 1
        elif kind == "agent":
            agents[state_pb2.AgentRecord.Status.Name(e.value.agent.status)] += 1
        elif kind == "framework":
            frameworks += 1
    return dict(tasks), dict(agents), frameworks


def document(view: StateView) -> dict[str, Any]:
    status, body, _ = view.document({})
    assert status == 200, body
    doc: dict[str, Any] = json.loads(body)
    return doc


def test_metrics_counts_a_new_reign_without_building_the_replica() -> None:
    base = [*(agent(i) for i in range(5)), framework("f"),
            *(task(i, TASK_STATES[i % 2]) for i in range(40))]
    view = StateView("m1")
    view.lead(base, epoch=2, paused=False, cluster_id="c")
    assert view.counts() == ({"TASK_STAGING": 20, "TASK_RUNNING": 20},
                             {"AGENT_STATUS_REGISTERED": 5}, 1)
    view.publish([task(0, common_pb2.TASK_FINISHED), gone("tasks/f/t1"),
                  agent(0, AGENT_STATUSES[1]), framework("g")])
    counts = view.counts()
    assert counts == ({"TASK_STAGING": 19, "TASK_RUNNING": 19, "TASK_FINISHED": 1},
                      {"AGENT_STATUS_REGISTERED": 4, "AGENT_STATUS_RECOVERING": 1}, 2)
    # What /metrics needed built no record of /state's replica: that waits for a document.
    assert len(view.agents) == len(view.frameworks) == 0 and not view.tasks
    doc = document(view)
    assert doc["task_counts"] == counts[0] and len(doc["tasks"]) == 39
    assert len(doc["agents"]) == 5 and len(doc["frameworks"]) == 2
    assert view.counts() == counts  # and the document took nothing from the tally


def test_a_view_scraped_only_for_metrics_keeps_what_waits_for_the_replica_bounded() -> None:
    store: dict[str, Entry] = {}
    view = StateView("m1", lambda: store.values())
    view.lead([], epoch=1, paused=False, cluster_id="c")
    for i in range(3 * view_module.PENDING_SLACK):  # each task launched, then gone
        entries = [task(i), gone(f"tasks/f/t{i - 1}")]
        store[entries[0].key] = entries[0]
        store.pop(entries[1].key, None)
        view.publish(entries)
        if i % 7 == 0:
            assert view.counts() == ({"TASK_RUNNING": 1}, {}, 0)
            assert len(view._waiting) <= len(store) + view_module.PENDING_SLACK + 2
    last = 3 * view_module.PENDING_SLACK - 1
    assert [t["task_info"]["task_id"] for t in document(view)["tasks"]] == [f"t{last}"]


KEYS = st.integers(0, 5)
STEP = st.one_of(
    st.tuples(st.just("task"), KEYS, st.sampled_from(TASK_STATES)),
    st.tuples(st.just("agent"), KEYS, st.sampled_from(AGENT_STATUSES)),
    st.tuples(st.just("framework"), st.sampled_from("fgh"), st.just(0)),
    st.tuples(st.just("gone"), st.sampled_from(
        [*(f"tasks/f/t{i}" for i in range(6)), *(f"agents/a{i}" for i in range(6)),
         "frameworks/f", "frameworks/g"]), st.just(0)),
    st.tuples(st.sampled_from(("counts", "document", "lead", "step_down")), st.just(0),
              st.just(0)))


@settings(max_examples=200, deadline=None)
@given(st.lists(STEP, max_size=40))
def test_the_counts_are_the_state_shown_through_any_run(steps: list[tuple[str, Any, int]]) -> None:
    view = StateView("m1")
    latest: dict[str, Entry] = {}
    view.lead([], epoch=1, paused=False, cluster_id="c")
    leading = True
    for op, which, status in steps:
        if op in ("task", "agent", "framework", "gone"):
            entry = (task(which, status) if op == "task" else agent(which, status)
                     if op == "agent" else framework(which) if op == "framework"
                     else gone(which))
            view.publish([entry])
            if entry.deleted:
                latest.pop(entry.key, None)
            else:
                latest[entry.key] = entry
        elif op == "lead":  # a new reign: the state it holds, whole
            view.lead(list(latest.values()), epoch=2, paused=False, cluster_id="c")
            leading = True
        elif op == "step_down":
            view.step_down()
            latest, leading = {}, False
        elif op == "counts":
            assert view.counts() == (expected(latest) if leading else ({}, {}, 0))
        elif leading:
            tasks, agents, frameworks = expected(latest)
            doc = document(view)
            assert doc["task_counts"] == tasks
            assert len(doc["agents"]) == sum(agents.values())
            assert len(doc["frameworks"]) == frameworks
    assert view.counts() == (expected(latest) if leading else ({}, {}, 0))
