"""Scenario files and reports, without a fleet: seeded shuffles, checked keys, the summary and
the verdict."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from chaos import scenario as sc
from chaos.report import failures, summary

SCENARIOS = Path(__file__).resolve().parents[2] / "chaos" / "scenarios"
DOC = {"seed": 5, "random": [{"target": "agent", "count": 4},
                             {"target": "leader:master", "signal": "SIGSTOP", "count": 3},
                             {"kind": "partition", "target": "agent", "count": 3}]}


def test_one_seed_gives_one_fault_sequence_and_another_seed_another() -> None:
    a, b = sc.parse(DOC), sc.parse(DOC)
    assert [f.label() for f in a.faults] == [f.label() for f in b.faults]
    others = {tuple(f.label() for f in sc.parse({**DOC, "seed": s}).faults) for s in range(6)}
    assert len(others) > 1
    assert sorted(f.label() for f in a.faults) == sorted(
        ["SIGKILL agent"] * 4 + ["SIGSTOP leader:master"] * 3 + ["partition agent|master"] * 3)


def test_a_report_replays_its_scenario() -> None:
    scen = sc.load(SCENARIOS / "default.toml")
    again = sc.from_report({"scenario": scen.to_dict()})
    assert again == scen
    labels = [f.label() for f in scen.faults]
    assert labels.count("SIGKILL leader:master") >= 20 and labels.count("SIGKILL agent") >= 20
    assert labels.count("partition agent|master") >= 5
    assert sum(1 for x in labels if "zk" in x) >= 3


def test_the_degraded_scenario_parses_into_latency_and_loss_faults() -> None:
    scen = sc.load(Path(__file__).resolve().parents[2] / "chaos" / "scenarios" / "degraded.toml")
    labels = [f.label() for f in scen.faults]
    assert labels == ["latency agent|master 200ms", "loss agent|master stall 0.2 reset 0",
                      "latency leader:allocator|master 300ms"]
    assert scen.faults[0].jitter_ms == 50 and scen.faults[1].stall_ms == 400


def test_job_runner_targets_parse_and_the_default_campaign_hits_them() -> None:
    scen = sc.parse({"fleet": {"jobs": 2}, "workload": {"job_instances": 4}, "fault": [
        {"target": "leader:jobs", "signal": "SIGKILL"},
        {"target": "leader:jobs", "signal": "SIGSTOP", "duration": 3.0},
        {"target": "standby:jobs", "signal": "SIGTERM"},
        {"kind": "partition", "target": "leader:jobs", "peer": "zk"}]})
    assert [f.label() for f in scen.faults] == [
        "SIGKILL leader:jobs", "SIGSTOP leader:jobs", "SIGTERM standby:jobs",
        "partition leader:jobs|zk"]
    assert scen.job_instances == 4 and scen.fleet.elected() == [
        "master", "allocator", "broker", "jobs"]
    assert sc.parse({"fleet": {"jobs": 0}}).fleet.elected() == ["master", "allocator", "broker"]
    labels = [f.label() for f in sc.load(SCENARIOS / "default.toml").faults]
    assert labels.count("SIGKILL leader:jobs") >= 4 and labels.count("SIGSTOP leader:jobs") >= 1
    short = sc.load(SCENARIOS / "short.toml")
    assert "SIGKILL leader:jobs" in [f.label() for f in short.faults]
    assert short.fleet.jobs >= 2 and short.job_instances >= 1


@pytest.mark.parametrize("doc, words", [
    ({"fault": [{"target": "leader:nobody"}]}, "target"),
    ({"fault": [{"signal": "SIGHUP"}]}, "signal"),
    ({"fault": [{"kind": "partition", "target": "zk"}]}, "partition"),
    ({"fault": [{"kind": "latency", "target": "agent"}]}, "delay_ms"),
    ({"fault": [{"kind": "loss", "target": "agent"}]}, "stall_p or reset_p"),
    ({"fault": [{"kind": "loss", "target": "agent", "reset_p": 1.5}]}, "probabilities"),
    ({"fault": [{"kind": "latency", "target": "zk", "delay_ms": 9}]}, "latency"),
    ({"fleet": {"agentz": 3}}, "agentz"),
    ({"campaign": {"setle": 1}}, "setle"),
    ({"faults": []}, "faults"),
    ({"fault": [{"target": "leader:jobz"}]}, "target"),
    ({"fleet": {"jobs": 0}, "fault": [{"target": "leader:jobs"}]}, "runs 0 of role jobs"),
    ({"fleet": {"jobs": 1}, "random": [{"target": "standby:jobs"}]}, "runs 1 of role jobs"),
    ({"workload": {"job_instances": -1}}, "job_instances"),
])
def test_a_bad_scenario_is_refused_naming_what_is_wrong(doc: dict[str, Any], words: str) -> None:
    with pytest.raises(sc.ScenarioError, match=words):
        sc.parse(doc)


def _outcome(i: int, label: str, mttr: float | None, **losses: list[str]) -> dict[str, Any]:
    base = {"index": i, "label": label, "target": "x", "at": float(i), "detected_s": 0.5,
            "mttr_s": mttr, "waiting_for": "" if mttr else "agents not registered",
            "tasks_lost": [], "updates_lost": [], "updates_wrong": [], "duplicates": [],
            "violations": []}
    return {**base, **losses}


def test_the_summary_and_the_verdict() -> None:
    report = {"outcomes": [_outcome(0, "SIGKILL agent", 2.0), _outcome(1, "SIGKILL agent", 4.0),
                           _outcome(2, "SIGKILL leader:master", 1.2)],
              "faults_planned": 3, "unattributed": {}}
    rows = {r["fault"]: r for r in summary(report)}
    assert rows["SIGKILL agent"]["mttr_p50"] == 3.0 and rows["SIGKILL agent"]["mttr_max"] == 4.0
    assert failures(report) == []
    report["outcomes"].append(_outcome(3, "SIGKILL agent", None, updates_lost=["short-1-x0"]))
    report["faults_planned"] = 5
    found = failures(report)
    assert any("not recovered" in f for f in found)
    assert any("updates_lost" in f for f in found)
    assert any("only 4 of 5" in f for f in found)


def test_the_probe_reports_an_agent_given_more_than_it_has() -> None:
    from chaos.probe import Probe

    def doc(cpus: list[float]) -> dict[str, Any]:
        agent = {"agent_info": {"agent_id": "a1", "hostname": "agent-1", "resources": [
            {"name": "cpus", "scalar": 1.0}, {"name": "mem", "scalar": 256.0}]},
            "status": "AGENT_STATUS_REGISTERED"}
        tasks = [{"agent_id": "a1", "status": {"state": state},
                  "task_info": {"resources": [{"name": "cpus", "scalar": c}]}}
                 for c, state in zip(cpus, ["TASK_RUNNING", "TASK_STAGING", "TASK_FINISHED"],
                                     strict=False)]
        return {"agents": [agent], "tasks": tasks}

    probe = Probe(fleet=None)  # type: ignore[arg-type]
    assert probe._check_allocation(doc([0.5, 0.5, 5.0]), 1.0) == 1  # a finished task holds none
    assert probe.violations == []
    probe._check_allocation(doc([0.5, 0.6]), 2.0)
    assert [v["kind"] for v in probe.violations] == ["agent over-allocated"]
    assert "cpus 1.1 > 1" in probe.violations[0]["detail"]


def test_the_framework_reports_an_agent_offered_twice_at_once() -> None:
    from chaos.workload import ChaosFramework, Workload
    from schemas import common_pb2
    from services.resources import Resources

    def offer(oid: str, cpus: float) -> common_pb2.Offer:
        o = common_pb2.Offer(offer_id=oid, hostname="agent-1", agent_id="a1")
        o.resources.extend(Resources.of(cpus=cpus, mem=64).to_proto())
        return o

    work = Workload(totals={"agent-1": Resources.of(cpus=2, mem=256)})
    fw = ChaosFramework(work)
    fw._check_offers([offer("o1", 1.0), offer("o2", 1.0)], 1.0)
    assert work.violations == []
    fw._check_offers([offer("o3", 1.5), offer("o4", 1.5)], 2.0)
    assert [v["kind"] for v in work.violations] == ["offered twice at once"]


def test_a_fleet_starts_without_an_earlier_runs_agent_checkpoints_or_zookeeper_data(
        tmp_path: Path) -> None:
    """An earlier run's agent checkpoints put its tasks (the same ids) into the new cluster."""
    from chaos.fleet import Fleet

    for stale in ("agents/agent-1/meta/state.json", "zk/zk1/data/myid", "logs/agent-1.log"):
        (tmp_path / stale).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / stale).write_text("old")
    Fleet(tmp_path)._fresh()
    assert not (tmp_path / "agents").exists() and not (tmp_path / "zk").exists()
    assert (tmp_path / "logs" / "agent-1.log").read_text() == "old"  # logs are kept
