"""The master's /state and /metrics off its reactor (issue 8): a scrape of a master holding
thousands of tasks never holds the reactor (its timers keep their time while /state is
fetched in a loop and tasks keep changing), and the document served is the state the master
publishes, with its filters (`framework`, `framework_name`, `tasks=0`) and ETag."""

from __future__ import annotations

import gc
import itertools
import json
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from schemas import agent_pb2
from services.master.shell import MasterConfig, MasterShell
from tests.master import helpers as h

TASKS = 2000  # for the document's tests
STALL_TASKS = 20_000  # for the stall's
# Built on the reactor (before issue 8), a /state at 20,000 tasks held the reactor 1-4 s
# (bench/state.py: ~0.26 s per 5,000 tasks idle, 3-4x that on a loaded machine); off the
# reactor, what is left is GIL switches and small handovers (12-26 ms seen with a load
# average of 20-30 on 2 cores). The bound lies between the two.
MAX_STALL_S = 0.2
TICK_S = 0.01


def fetch(url: str, etag: str = "") -> tuple[int, bytes, str]:
    req = urllib.request.Request(url, headers={"If-None-Match": etag} if etag else {})
    try:
        with urllib.request.urlopen(req, timeout=30) as resp:
            return resp.status, resp.read(), resp.headers.get("ETag", "")
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read(), exc.headers.get("ETag", "")


class Populated:
    """A leading master (in process, real sockets, file election and registry) with one
    agent, frameworks `f1` and `f2` and `tasks` tasks launched on the agent."""

    def __init__(self, tmp_path: Path, tasks: int) -> None:
        # The agent is a name only (no connection, no heartbeats): it must not be declared
        # unreachable mid-test (its thousands of tasks with it, a long step of its own).
        self.master = MasterShell(MasterConfig("m1", f"file://{tmp_path}",
                                               f"file://{tmp_path}", agent_timeout_s=3600))
        m = self.master
        assert m.reactor.run(until=lambda: m.core is not None, timeout=10)
        core = m.core
        assert core is not None
        res = f"cpus:{tasks * 2 + 100};mem:{tasks * 256 + 100_000}"
        m.driver.step(lambda now: core.agent_call(b"a1", agent_pb2.AgentCall(
            register=agent_pb2.AgentCall.Register(agent_info=h.agent_info("", "a1", res))),
            now))
        self.aid = next(iter(core.agents))
        m.driver.step(lambda now: h.subscribe(core, b"f1", now=now))
        m.driver.step(lambda now: h.subscribe(core, b"f2", now=now, role="db"))
        self.f1, self.f2 = sorted(core.frameworks, key=lambda f: core.frameworks[f].info.name)
        self.launched = 0
        for i in range(0, tasks, 500):
            self.launch(self.f1 if i % 1000 == 0 else self.f2, min(500, tasks - i))
        m.reactor.run(timeout=0.05)  # the idle flush publishes

    def launch(self, fid: str, n: int) -> None:
        core = self.master.core
        assert core is not None
        tids = [f"t{j}" for j in range(self.launched, self.launched + n)]
        self.launched += n
        self.master.driver.step(lambda now: h.launch(core, fid, self.aid, *tids, now=now,
                                                     rid=f"r{self.launched}"))

    def old_document(self, published: bool = True) -> dict[str, Any]:
        """/state as the master built it before issue 8 (on the reactor, from its core), of
        the state it published (`published`), or of its core's own records: the two differ
        only in the agents' last_seen_us, refreshed by liveness reports and published with
        the agent's next change (as the state stream's subscribers have always seen it)."""
        core = self.master.core
        assert core is not None
        from services.master.view import reference_document
        entries = core.snapshot_entries()
        if published:
            store = self.master.publisher.store
            entries = [store[e.key] for e in entries if e.key in store]
        return json.loads(reference_document(self.master.view.meta(), entries))


def without_last_seen(doc: dict[str, Any]) -> dict[str, Any]:
    return {**doc, "agents": [{k: v for k, v in a.items() if k != "last_seen_us"}
                              for a in doc["agents"]]}


def populated_master(tmp_path: Path, tasks: int) -> Iterator[Populated]:
    p = Populated(tmp_path, tasks)
    # The heap built so far is frozen: the cyclic collector's full passes over it hold the
    # GIL 0.1-0.4 s at 5,000 tasks on a loaded machine, whatever /state does (the old way,
    # garbage-heavy, set them off often); they are not what these tests measure.
    gc.collect()
    gc.freeze()
    try:
        yield p
    finally:
        gc.unfreeze()
        p.master.close()


@pytest.fixture
def populated(tmp_path: Path) -> Iterator[Populated]:
    yield from populated_master(tmp_path, TASKS)


@pytest.fixture
def crowded(tmp_path: Path) -> Iterator[Populated]:
    yield from populated_master(tmp_path, STALL_TASKS)


# A scraper of its own (as `curl` or the CLI are): its reading of the documents does not
# compete for the master process's GIL. It prints one line per fetch: path, status, seconds.
SCRAPER = """
import sys, time, urllib.error, urllib.request
for _ in range(int(sys.argv[2])):
    for path in ("/state", "/metrics"):
        started = time.monotonic()
        try:
            with urllib.request.urlopen(sys.argv[1] + path, timeout=60) as resp:
                resp.read()
                status = resp.status
        except urllib.error.HTTPError as exc:
            status = exc.code
        print(path, status, time.monotonic() - started, flush=True)
"""


def test_scraping_state_and_metrics_never_holds_the_reactor(crowded: Populated) -> None:
    populated = crowded
    m = populated.master
    assert m.http is not None
    ticks: list[float] = []

    def tick() -> None:
        ticks.append(time.monotonic())
        if len(ticks) % 5 == 0:  # the state keeps changing: every scrape has news
            populated.launch(populated.f1, 1)

    timer = m.reactor.every(TICK_S, tick)
    scraper = subprocess.Popen([sys.executable, "-c", SCRAPER, m.http.url, "6"],
                               stdout=subprocess.PIPE, text=True)
    try:
        assert m.reactor.run(until=lambda: scraper.poll() is not None, timeout=120), \
            "the scraper did not finish"
    finally:
        timer.cancel()
        scraper.kill()
        out, _ = scraper.communicate()
    fetched = [line.split() for line in out.splitlines()]
    assert len(fetched) == 12 and scraper.returncode == 0, out
    gaps = [b - a for a, b in itertools.pairwise(ticks)]
    stall = max(gaps) - TICK_S
    assert stall < MAX_STALL_S, (
        f"a scrape held the reactor {stall * 1000:.0f} ms (scrapes took "
        f"{max(float(f[2]) for f in fetched) * 1000:.0f} ms at most)")
    assert all(f[1] == "200" for f in fetched), out


def test_the_document_is_the_published_state_with_filters_and_etag(
    populated: Populated,
) -> None:
    m = populated.master
    assert m.http is not None
    url = m.http.url
    status, body, etag = fetch(url + "/state")
    assert status == 200 and etag
    doc = json.loads(body)
    old = populated.old_document()
    assert {k: doc[k] for k in old} == old  # every key of before, the same values
    assert without_last_seen({k: doc[k] for k in old}) == without_last_seen(
        populated.old_document(published=False))
    assert doc["task_counts"] == {"TASK_STAGING": TASKS}
    assert fetch(url + "/state", etag)[0] == 304  # unchanged: nothing sent
    populated.launch(populated.f2, 1)
    m.reactor.run(timeout=0.05)
    status, body, etag2 = fetch(url + "/state", etag)
    assert status == 200 and etag2 != etag
    doc = json.loads(body)
    assert len(doc["tasks"]) == TASKS + 1
    assert doc == {**populated.old_document(), "task_counts": {"TASK_STAGING": TASKS + 1}}

    status, body, _ = fetch(url + f"/state?framework={populated.f1}")
    only = json.loads(body)
    assert [f["framework_info"]["framework_id"] for f in only["frameworks"]] == [populated.f1]
    assert {t["framework_id"] for t in only["tasks"]} == {populated.f1}
    assert len(only["tasks"]) == only["task_counts"]["TASK_STAGING"] == TASKS // 2
    assert only["agents"] == doc["agents"]
    status, body, _ = fetch(url + "/state?framework_name=f2&tasks=0")
    named = json.loads(body)
    assert [f["framework_info"]["name"] for f in named["frameworks"]] == ["f2"]
    assert "tasks" not in named and named["task_counts"] == {"TASK_STAGING": TASKS // 2 + 1}
    assert "agents" in named and "agents" not in json.loads(fetch(url + "/state?agents=0")[1])
    status, body, _ = fetch(url + "/state?tasks=maybe")
    assert status == 400 and b"tasks" in body
    status, body, _ = fetch(url + "/state?nonsense=1")
    assert status == 400 and b"framework_name" in body

    status, body, _ = fetch(url + "/metrics")
    text = body.decode()
    assert f'offerbus_master_tasks{{state="TASK_STAGING"}} {TASKS + 1}.0' in text
    assert 'offerbus_master_agents{status="AGENT_STATUS_REGISTERED"} 1.0' in text
    assert "offerbus_master_frameworks 2.0" in text


def test_a_master_that_steps_down_serves_not_leading(populated: Populated) -> None:
    m = populated.master
    assert m.http is not None
    m._step_down("test")
    status, body, _ = fetch(m.http.url + "/state")
    assert status == 503 and json.loads(body) == {"leading": False, "id": "m1"}


def test_the_run_poll_gets_counts_only_and_nothing_again_while_nothing_changes(
    populated: Populated,
) -> None:
    from collections import Counter

    from services.bus.election import LeaderInfo
    from services.cli import lifecycle

    m = populated.master
    assert m.http is not None
    poll = lifecycle.StatePoller("file:///unused", 5.0, lifecycle.service_query("f1"))
    poll.leader = LeaderInfo("master", "m1", 1, {"http": m.http.url})
    first = poll()
    assert "tasks" not in first and "agents" not in first
    full = json.loads(fetch(m.http.url + "/state")[1])
    want = TASKS
    assert lifecycle.service_counts(first, "f1", want) == lifecycle.service_counts(
        full, "f1", want) == Counter(STAGING=TASKS // 2, pending=TASKS // 2)
    assert poll() is first  # 304: the document it has
    populated.launch(populated.f1, 1)
    m.reactor.run(timeout=0.05)
    again = poll()
    assert again is not first
    assert lifecycle.service_counts(again, "f1", want) == Counter(STAGING=TASKS // 2 + 1,
                                                                  pending=TASKS // 2 - 1)


def test_unscraped_changes_wait_at_most_the_state_and_a_slack() -> None:
    """Nobody scrapes while tasks come and go for long: what waits for the HTTP side stays
    bounded (by the state's size and a slack), and the document is then still exact."""
    from schemas import bus_pb2, common_pb2, state_pb2
    from services.master import view as view_module

    store: dict[str, bus_pb2.StateEntry] = {}

    def task(i: int) -> bus_pb2.StateEntry:
        value = state_pb2.StateValue(task=state_pb2.TaskRecord(
            framework_id="f", task_info=common_pb2.TaskInfo(task_id=f"t{i}"),
            status=common_pb2.TaskStatus(state=common_pb2.TASK_RUNNING)))
        return bus_pb2.StateEntry(key=f"tasks/f/t{i}", value=value)

    view = view_module.StateView("m1", lambda: store.values())
    view.lead([], epoch=1, paused=False, cluster_id="c")
    for i in range(3 * view_module.PENDING_SLACK):  # each task launched, then gone
        entries = [task(i), bus_pb2.StateEntry(key=f"tasks/f/t{i - 1}", deleted=True)]
        store[entries[0].key] = entries[0]
        store.pop(entries[1].key, None)
        view.publish(entries)
        # What waits for a scrape (coalesced, and handed over as published) stays bounded
        # by the state's size.
        assert len(view._pending) <= len(store) + view_module.PENDING_SLACK + 2
        assert view._batched <= 2 * len(store) + view_module.PENDING_SLACK + 2
    status, body, _ = view.document({})
    last = 3 * view_module.PENDING_SLACK - 1
    assert status == 200 and [t["task_info"]["task_id"] for t in json.loads(body)["tasks"]] \
        == [f"t{last}"]
