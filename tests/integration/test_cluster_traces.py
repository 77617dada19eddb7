"""`offerbus trace` reads the cluster's processes, not this machine's files (issue 11): on a
real cluster, a CLI whose run dir has no trace files (as on an operator's laptop) still
shows the task's spans, each service answering /traces from its own file (the agent also
from its executors'); by the election or, without ZooKeeper, by OFFERBUS_MASTER; a peer
that does not answer is named, not fatal; a bad /traces query is a counted 400."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from infra.zookeeper import ZooKeeperServer
from services.telemetry import spans as S
from services.telemetry.file_exporter import read_spans
from tests.e2e import Cluster, local_cluster_in
from tests.waiting import wait_for

TASK = "remote-0-1"


@pytest.fixture(scope="module")
def cluster(zk: ZooKeeperServer, zk_admin: Any, tmp_path_factory: pytest.TempPathFactory,
            docker_client: Any, busybox_image: str) -> Iterator[Cluster]:
    with local_cluster_in(zk, zk_admin, tmp_path_factory.mktemp("ctraces"), "ctraces",
                          agents=2) as c:
        c.cli("--timeout", "60", "run", "--name", "remote", "--image", busybox_image,
              "--instances", "1", "--", "sleep", "3600")
        traces = c.run_dir / "traces"

        def running_span() -> bool:  # the executor's start span is in its file: all hops are
            return any(s["name"] == S.START and s["attrs"].get(S.TASK_ID) == TASK
                       and any(e.get("name") == "TASK_RUNNING" for e in s.get("events", []))
                       for f in traces.glob("offerbus-executor-*.jsonl") for s in read_spans(f))

        def master_status_span() -> bool:  # exported by its batch processor (0.5 s) later
            return any(s["name"] == S.STATUS and TASK in (
                [s["attrs"].get(S.TASK_ID), *(s["attrs"].get(S.TASK_IDS) or [])])
                for f in traces.glob("offerbus-master-*.jsonl") for s in read_spans(f))

        wait_for(running_span, 30, message="no start span for the task in the run dir")
        wait_for(master_status_span, 30, message="no master status span for the task")
        yield c


def cli(run_dir: Path, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "services.cli", "--run-dir", str(run_dir),
                           *args], capture_output=True, text=True, timeout=60,
                          env={"COLUMNS": "250", "PATH": "/usr/bin:/bin", **env})


def rows(out: subprocess.CompletedProcess[str]) -> list[dict[str, Any]]:
    assert out.returncode == 0, out.stdout + out.stderr
    return list(json.loads(out.stdout))


def services(found: list[dict[str, Any]]) -> set[tuple[str, str]]:
    return {(r["service"], r["name"]) for r in found}


def test_trace_reads_the_services_not_the_local_files(cluster: Cluster, tmp_path: Path) -> None:
    elsewhere = tmp_path / "laptop"  # a run dir without trace files
    local = cli(elsewhere, "--cluster", cluster.url, "trace", "task", TASK, "--local")
    assert local.returncode == 1 and "no spans for task" in local.stdout  # (the old way)
    found = rows(cli(elsewhere, "--cluster", cluster.url, "trace", "task", TASK, "--json"))
    assert {("offerbus-broker", S.VALIDATE), ("offerbus-master", S.LAUNCH),
            ("offerbus-agent", S.RUN), ("offerbus-executor", S.START),
            ("offerbus-master", S.STATUS)} <= services(found), found
    # The framework runs on the cluster's machine (`offerbus run`): its decide span is in
    # that run dir only; there, the files and the services together give the whole trace.
    assert "offerbus-framework" not in {r["service"] for r in found}
    whole = rows(cli(cluster.run_dir, "--cluster", cluster.url, "trace", "task", TASK,
                     "--json"))
    assert {("offerbus-allocator", S.ALLOCATE), ("offerbus-broker", S.OFFER),
            ("offerbus-framework", S.DECIDE)} <= services(whole)
    assert len({r["span_id"] for r in whole}) == len(whole)  # each span once


def test_without_zookeeper_through_offerbus_master(cluster: Cluster, tmp_path: Path) -> None:
    master = cluster.leader().endpoints["http"].removeprefix("http://")
    found = rows(cli(tmp_path / "laptop", "trace", "task", TASK, "--json",
                     OFFERBUS_MASTER=master))
    assert {("offerbus-master", S.LAUNCH), ("offerbus-agent", S.RUN),
            ("offerbus-executor", S.START),  # and the leaders /state names (their "http")
            ("offerbus-broker", S.VALIDATE)} <= services(found), found


def test_a_bad_query_is_a_counted_400(cluster: Cluster) -> None:
    base = cluster.leader("broker").endpoints["http"]

    def bad_requests() -> float:
        with urllib.request.urlopen(base + "/metrics", timeout=5) as r:
            text = r.read().decode()
        return float(next(line.split()[-1] for line in text.splitlines()
                          if line.startswith("offerbus_broker_traces_bad_requests_total")))

    before = bad_requests()
    with pytest.raises(urllib.error.HTTPError) as err:
        urllib.request.urlopen(base + "/traces?task=a&offer=b", timeout=5)
    assert err.value.code == 400 and b"exactly one of ?task=ID" in err.value.read()
    assert bad_requests() == before + 1


def test_a_peer_that_does_not_answer_is_named_not_fatal(cluster: Cluster,
                                                        tmp_path: Path) -> None:
    from services.cli import cluster as local_cluster

    name, pid = next((n, p) for n, p in sorted(local_cluster.running(cluster.run_dir).items())
                     if n.startswith("agent"))
    os.kill(pid, signal.SIGSTOP)  # its HTTP server still accepts, and never answers
    try:
        out = cli(tmp_path / "laptop", "--cluster", cluster.url, "trace", "task", TASK,
                  "--json")
    finally:
        os.kill(pid, signal.SIGCONT)
    found = rows(out)
    assert "peers did not answer: agent " in out.stderr and "(timed out)" in out.stderr, (
        name, out.stderr)
    # The other agent serves the executors' files of the shared traces folder.
    assert ("offerbus-executor", S.START) in services(found)
