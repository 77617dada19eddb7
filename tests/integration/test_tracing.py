"""One connected trace per offer on a real cluster: allocate (allocator) -> offer (broker)
-> decide (framework) -> validate (broker) -> launch (master) -> run (agent) -> start
(executor, TASK_RUNNING), each hop a separate process writing its own OTLP-JSON file; and
`offerbus trace` shows it."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from infra.zookeeper import ZooKeeperServer
from services.telemetry import spans as S
from services.telemetry.file_exporter import read_spans
from tests.e2e import Cluster, local_cluster_in
from tests.waiting import wait_for

CHAIN = [  # (span name, service) from the task back to the allocation
    (S.START, "offerbus-executor"), (S.RUN, "offerbus-agent"), (S.LAUNCH, "offerbus-master"),
    (S.VALIDATE, "offerbus-broker"), (S.DECIDE, "offerbus-framework"),
    (S.OFFER, "offerbus-broker"), (S.ALLOCATE, "offerbus-allocator"),
]


@pytest.fixture(scope="module")
def cluster(zk: ZooKeeperServer, zk_admin: Any, tmp_path_factory: pytest.TempPathFactory,
            docker_client: Any, busybox_image: str) -> Iterator[Cluster]:
    with local_cluster_in(zk, zk_admin, tmp_path_factory.mktemp("traced"), "trace",
                          agents=2,
                          agent_resources="cpus:2;mem:2048;disk:10240;ports:[31000-31999]") as c:
        yield c


def all_spans(traces: Path) -> list[dict[str, Any]]:
    return [s for f in sorted(traces.glob("*.jsonl")) for s in read_spans(f)]


def chain_for(spans: list[dict[str, Any]], task_id: str) -> list[dict[str, Any]] | None:
    """The spans from the task's executor `start` up to its `allocate`, or None if any hop
    is missing (yet)."""
    by_id = {(s["traceId"], s["spanId"]): s for s in spans}
    start = next((s for s in spans if s["name"] == S.START
                  and s["attrs"].get(S.TASK_ID) == task_id
                  and any(e.get("name") == "TASK_RUNNING" for e in s.get("events", []))), None)
    if start is None:
        return None
    chain = [start]
    while chain[-1].get("parentSpanId"):
        parent = by_id.get((chain[-1]["traceId"], chain[-1]["parentSpanId"]))
        if parent is None:
            return None
        chain.append(parent)
    return chain


def test_a_task_has_one_trace_from_allocation_to_running(cluster: Cluster) -> None:
    traces = cluster.run_dir / "traces"
    cluster.cli("--timeout", "60", "run", "--name", "traced", "--image",
                "offerbus/busybox:latest", "--instances", "1", "--", "sleep", "3600")
    task_id = "traced-0-1"
    found: list[list[dict[str, Any]]] = []

    def complete() -> bool:
        chain = chain_for(all_spans(traces), task_id)
        if chain is not None and [s["name"] for s in chain] == [n for n, _ in CHAIN]:
            found.append(chain)
            return True
        return False

    wait_for(complete, 30, message=lambda: "spans so far: " + ", ".join(
        sorted({f"{s['resource'].get('service.name')}/{s['name']}" for s in all_spans(traces)})))
    chain = found[-1]
    assert len({s["traceId"] for s in chain}) == 1
    assert [s["resource"]["service.name"] for s in chain] == [svc for _, svc in CHAIN]
    named = {s["name"]: s["attrs"] for s in chain}
    assert named[S.START][S.IMAGE] == "offerbus/busybox:latest" and named[S.START][
        S.CONTAINER_ID]
    assert named[S.DECIDE][S.DECISION] == "accept" and task_id in named[S.DECIDE][S.TASK_IDS]
    assert named[S.VALIDATE][S.VALID] is True
    assert named[S.ALLOCATE][S.FRAMEWORK_ID] == named[S.DECIDE][S.FRAMEWORK_ID]
    assert 0.0 <= float(named[S.ALLOCATE][S.DOMINANT_SHARE]) <= 1.0
    assert named[S.OFFER][S.OFFER_ID] in named[S.DECIDE][S.OFFER_IDS]
    # Each hop starts no earlier than its parent.
    starts = [int(s["startTimeUnixNano"]) for s in reversed(chain)]
    assert starts == sorted(starts)

    # The operator's view of the same trace.
    out = cluster.cli("trace", "task", task_id)
    for name, service in CHAIN:
        assert name in out and service in out


def test_why_a_task_that_fits_no_agent_is_pending(cluster: Cluster) -> None:
    cluster.cli("run", "--name", "huge", "--image", "offerbus/busybox:latest", "--instances",
                "1", "--mem", "100000", "--no-wait", "--", "sleep", "3600")
    outputs: list[str] = []

    def explained() -> bool:
        outputs.append(cluster.cli("why", "huge-0-1"))
        return "no offer fits" in outputs[-1] and "mem:100000" in outputs[-1]

    wait_for(explained, 30, message=lambda: f"why said: {outputs[-1] if outputs else ''}")


def test_why_a_framework_that_suppressed_gets_no_offers(cluster: Cluster) -> None:
    cluster.cli("--timeout", "60", "run", "--name", "calm", "--image",
                "offerbus/busybox:latest", "--instances", "1", "--", "sleep", "3600")
    outputs: list[str] = []

    def explained() -> bool:  # all its instances run, so the service suppressed offers
        outputs.append(cluster.cli("why", "calm"))
        return "suppressed" in outputs[-1]

    wait_for(explained, 30, message=lambda: f"why said: {outputs[-1] if outputs else ''}")


def test_why_decline_filters_hide_the_agents(cluster: Cluster) -> None:
    """A framework declines one agent's offer and holds the other's; `why` names the filter
    and the offer held. Once it declines that one too, in a later cycle, `why` counts both
    agents: stop 23's CI failure, where declines landing in two cycles were counted 1."""
    from frameworks.sdk.driver import SchedulerDriver
    from tests.e2e import Recorder, framework

    lock = threading.Lock()
    held: list[str] = []  # offers not answered yet (all but the first)

    def on_offers(d: SchedulerDriver, offers: list[Any]) -> None:
        with lock:
            for o in offers:
                if rec.offers_seen and o.offer_id == rec.offers_seen[0][1].offer_id:
                    d.decline([o.offer_id], 120.0, reason="not today")
                else:
                    held.append(o.offer_id)

    rec = Recorder(on_offers=on_offers)
    driver = SchedulerDriver(rec, framework("picky"), cluster.url)
    driver.start()
    try:
        outputs: list[str] = []
        agents = cluster.agent_ids()
        assert len(agents) == 2

        def why_says(*parts: str) -> Callable[[], bool]:
            def check() -> bool:
                outputs.append(cluster.cli("why", "picky"))
                return all(p in outputs[-1] for p in parts)
            return check

        def said() -> str:  # where each agent's offers went, should it fail
            with rec.lock:
                seen = [(round(t, 2), o.agent_id, o.offer_id) for t, o in rec.offers_seen]
                rescinded = list(rec.rescinds)
            offered = [(f.get("framework_info", {}).get("name"), f.get("offered_resources"))
                       for f in cluster.state().get("frameworks", [])]
            return (f"why said: {outputs[-1] if outputs else ''}\npicky saw offers "
                    f"(time, agent, offer): {seen}; rescinded: {rescinded}; errors: "
                    f"{rec.errors}\noffered, by the master's state: {offered}")

        wait_for(why_says("decline filters are in force on 1 agent(s)",
                          "It holds 1 offer(s) not answered yet"), 30, message=said)
        with lock:
            assert len(held) == 1, held
            driver.decline(held, 120.0, reason="not today either")
        wait_for(why_says("decline filters are in force on 2 agent(s)"), 30, message=said)
        assert any(agent in outputs[-1] for agent in agents)
        assert "REVIVE" in outputs[-1] and "not answered" not in outputs[-1], outputs[-1]
    finally:
        driver.stop()
        driver.join(10)
