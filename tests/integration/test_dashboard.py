"""The master's web dashboard against a live cluster (ZooKeeper, master, allocator,
offer-broker, two agents, the process runtime), loaded in headless Chromium: it shows the
agents, tasks and jobs the master's /state (its state stream) reports, the leader and its
epoch, and the allocator's decisions; a task named like markup shows as text, never as an element;
a screenshot lands in tests/artifacts/dashboard.png."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import threading
import time
import urllib.request
from collections.abc import Iterator
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

import pytest

from frameworks.sdk.driver import SchedulerDriver
from frameworks.spec import ServiceSpec
from infra.zookeeper import ZooKeeperServer
from schemas import common_pb2
from services.cli.client import find_leader, operator_call
from services.cli.job import submit_call
from tests.e2e import Cluster, Recorder, framework, local_cluster_in, sleep_task
from tests.waiting import wait_for

ARTIFACTS = Path(__file__).resolve().parents[1] / "artifacts"
EVIL = '<img src=x onerror="document.title=\'owned\'">'
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")

pytestmark = pytest.mark.skipif(
    CHROMIUM is None, reason="chromium is not installed: `make system` (infra/system.sh) "
    "installs Debian's chromium")


class Tables(HTMLParser):
    """The text of every table cell under each element with an id: {id: [[cell, ...], ...]}."""

    def __init__(self) -> None:
        super().__init__()
        self.tables: dict[str, list[list[str]]] = {}
        self.elements: list[str] = []  # every start tag seen
        self.title = ""
        self._section = ""
        self._row: list[str] | None = None
        self._cell: list[str] | None = None
        self._in_title = False

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.elements.append(tag)
        ids = [v for k, v in attrs if k == "id" and v]
        if ids:
            self._section = ids[0]
        if tag == "tr":
            self._row = []
        elif tag == "td":
            self._cell = []
        self._in_title = tag == "title"

    def handle_endtag(self, tag: str) -> None:
        if tag == "td" and self._cell is not None and self._row is not None:
            self._row.append("".join(self._cell).strip())
            self._cell = None
        elif tag == "tr" and self._row:
            self.tables.setdefault(self._section, []).append(self._row)
            self._row = None
        self._in_title = False

    def handle_data(self, data: str) -> None:
        if self._cell is not None:
            self._cell.append(data)
        if self._in_title:
            self.title += data


def next_state(stream: Any) -> dict[str, Any]:
    """The next `state` event's document of a /state/events stream."""
    kind = ""
    for raw in stream:
        line = raw.decode().rstrip("\n")
        if line.startswith("event: "):
            kind = line.removeprefix("event: ")
        elif line.startswith("data: ") and kind == "state":
            doc: dict[str, Any] = json.loads(line.removeprefix("data: "))
            return doc
    raise AssertionError("the event stream ended")


def chromium(*args: str, profile: Path) -> subprocess.CompletedProcess[str]:
    assert CHROMIUM is not None
    return subprocess.run(
        [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
         f"--user-data-dir={profile}", "--timeout=5000", *args],
        capture_output=True, text=True, timeout=90)


@pytest.fixture(scope="module")
def cluster(zk: ZooKeeperServer, zk_admin: Any,
            tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    with local_cluster_in(zk, zk_admin, tmp_path_factory.mktemp("dash"), "dash", agents=2,
                          runtime="process",
                          agent_resources="cpus:2;mem:2048;disk:4096;ports:[46100-46199]") as c:
        yield c


def test_the_dashboard_shows_what_the_state_stream_reports(cluster: Cluster,
                                                           tmp_path: Path) -> None:
    wanted = {"dash-a": "dash-a", "dash-b": "dash-b", "dash-evil": EVIL}
    lock = threading.Lock()
    placed: set[str] = set()

    def on_offers(driver: SchedulerDriver, offers: list[common_pb2.Offer]) -> None:
        ops, used = [], []
        with lock:
            for offer, tid in zip(offers, sorted(set(wanted) - placed), strict=False):
                task = sleep_task(tid, offer, cpus=0.5, mem=64, command=["sleep", "600"])
                task.name = wanted[tid]
                ops.append((offer.offer_id, task))
                placed.add(tid)
                used.append(offer.offer_id)
        for offer_id, task in ops:
            op = common_pb2.Operation()
            op.launch.tasks.append(task)
            driver.accept([offer_id], [op])
        rest = [o.offer_id for o in offers if o.offer_id not in used]
        if rest:
            driver.decline(rest, refuse_seconds=1.0)

    rec = Recorder(on_offers=on_offers)
    driver = SchedulerDriver(rec, framework("dash"), cluster.url)
    driver.start()
    # A job, run by the cluster's job runner: the page lists it with its running instances.
    job = ServiceSpec(name="dash-job", image="-", instances=1, cpus=0.1, mem=16,
                      command=["sleep", "600"], runtime="process")
    operator_call(find_leader(cluster.url), submit_call(job))
    try:
        wait_for(lambda: all(rec.state_of(t) == common_pb2.TASK_RUNNING for t in wanted), 60,
                 message=lambda: f"tasks not running: {dict(rec.updates)}")
        wait_for(lambda: [t["task_info"]["task_id"] for t in cluster.state()["tasks"]
                          if t["task_info"]["task_id"].startswith("dash-job-")
                          and t["status"]["state"] == "TASK_RUNNING"], 60,
                 message="the job's instance not running")
        state = cluster.state()
        url = cluster.leader().endpoints["http"] + "/"

        def page() -> tuple[Tables, str] | None:
            out = chromium("--dump-dom", url, profile=tmp_path / "profile")
            parsed = Tables()
            parsed.feed(out.stdout)
            tasks = {row[0] for row in parsed.tables.get("tasks", [])}
            return (parsed, out.stdout) if set(wanted) <= tasks else None

        shown = wait_for(page, 90, interval=0.5, message="the page never listed the tasks")
        assert shown is not None
        dom, raw = shown
        agents = {row[0]: row for row in dom.tables["agents"]}
        assert set(agents) == {a["agent_info"]["agent_id"] for a in state["agents"]}
        for a in state["agents"]:
            row = agents[a["agent_info"]["agent_id"]]
            assert row[2] == "registered" and "/ 2" in row[3]  # cpus used / total bar
        tasks = {row[0]: row for row in dom.tables["tasks"]}
        assert set(tasks) == {t["task_info"]["task_id"] for t in state["tasks"]}
        assert all(tasks[t][4] == "running" for t in wanted)
        assert tasks["dash-evil"][1] == EVIL  # the markup shows as its characters ...
        assert "img" not in dom.elements and dom.title == "Offerbus"  # ... and never ran
        [fw] = [f for f in dom.tables["frameworks"] if f[1] == "dash"]
        assert fw[0] == rec.framework_id
        [job_row] = dom.tables["jobs"]
        assert job_row[:7] == ["dash-job", "*", "1", "-", "-", "1", "1"], job_row
        leader = re.search(r"master (\S+) leading, epoch (\S+?) ·", raw)
        assert leader is not None and leader.groups() == (state["master_id"], str(state["epoch"]))
        assert f"cluster {state['cluster_id']} " in raw
        assert re.search(r"allocator allocator-1 \(epoch \d+\) · broker broker-1 \(epoch", raw)
        assert fw[7] != "-"  # the allocator's latest decision about it
        assert "live · changed" in raw  # the page follows /state/events

        ARTIFACTS.mkdir(exist_ok=True)
        shot = ARTIFACTS / "dashboard.png"
        shot.unlink(missing_ok=True)
        out = chromium(f"--screenshot={shot}", "--window-size=1400,900", url,
                       profile=tmp_path / "profile")
        assert shot.exists() and shot.stat().st_size > 10_000, out.stderr[-2000:]

        # Live: a change reaches an open /state/events stream without asking again.
        base = cluster.leader().endpoints["http"]
        with urllib.request.urlopen(base + "/state/events", timeout=30) as stream:
            first = next_state(stream)
            assert {t["task_info"]["task_id"]: t["status"]["state"] for t in first["tasks"]
                    if t["framework_id"] == rec.framework_id} == {t: "TASK_RUNNING"
                                                                  for t in wanted}
            driver.kill("dash-b")
            deadline = time.monotonic() + 30
            while True:  # each read waits at most the socket's timeout
                assert time.monotonic() < deadline, "the kill never reached the stream"
                doc = next_state(stream)
                states = {t["task_info"]["task_id"]: t["status"]["state"]
                          for t in doc["tasks"]}
                if states["dash-b"] == "TASK_KILLED":
                    break
    finally:
        driver.stop(failover=False)
        driver.join(10)
