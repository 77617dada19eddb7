"""The chaos suite on a real fleet (namespaces, ZooKeeper ensemble, Docker): a short campaign
(a leading job runner's kill among its faults) passes with no loss, duplicate or violation,
and a fleet that breaks an invariant on purpose (agents skipping the checkpoint of terminal
status updates) fails it."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from chaos import scenario as sc
from chaos.campaign import Campaign
from chaos.netns import run
from chaos.report import failures, summary

SCENARIOS = Path(__file__).resolve().parents[2] / "chaos" / "scenarios"
pytestmark = [pytest.mark.integration,
              pytest.mark.skipif(os.geteuid() != 0, reason="network namespaces need root")]


def _leftovers(fleet_id: str) -> list[str]:
    names = run("ip", "netns", "list").split() + run("ip", "-o", "link", "show").split()
    return [n for n in names if f"-{fleet_id}" in n]


def _play(name: str, tmp_path: Path) -> dict[str, Any]:
    campaign = Campaign(sc.load(SCENARIOS / f"{name}.toml"), tmp_path)
    report = campaign.run()
    assert _leftovers(campaign.fleet.fleet_id) == []  # torn down: namespaces, veths, bridge
    return report


@pytest.mark.timeout(300)
def test_short_campaign_recovers_without_loss(tmp_path: Path, busybox_image: str) -> None:
    report = _play("short", tmp_path)
    assert failures(report) == []
    rows = {r["fault"]: r for r in summary(report)}
    assert set(rows) == {"SIGKILL leader:master", "SIGKILL agent", "partition agent|master",
                         "SIGKILL leader:jobs", "SIGKILL zk:leader",
                         "partition leader:master|zk", "SIGKILL executor"}
    assert all(r["recovered"] == r["n"] for r in rows.values())
    assert report["short_tasks"] > 0
    # The job ran through a leading job runner's kill: every instance it had still runs
    # (none ended, none relaunched) but for those of an executor the suite killed.
    jobs = report["job_tasks"]
    assert report["job_instances"] == 3 and len(jobs) >= 3
    assert [t for t, r in jobs.items() if r["lost"] or (r["ended"] and not r["excused"])] == []
    assert len([t for t, r in jobs.items() if not r["ended"]]) == 3
    assert rows["SIGKILL leader:jobs"]["tasks_lost"] == rows["SIGKILL leader:jobs"][
        "duplicates"] == 0


@pytest.mark.timeout(200)
def test_a_fleet_that_drops_terminal_updates_fails_the_campaign(
        tmp_path: Path, busybox_image: str) -> None:
    report = _play("broken-updates", tmp_path)
    lost = [u for o in report["outcomes"] for u in o["updates_lost"]] \
        + report["unattributed"].get("updates_lost", [])
    assert lost, "the suite did not see the lost status updates"
    assert any("updates_lost" in p for p in failures(report))


@pytest.mark.timeout(150)
def test_clean_removes_a_crashed_fleets_leftovers_and_nothing_else(tmp_path: Path) -> None:
    from chaos.fleet import Fleet, FleetSpec, clean

    spec = FleetSpec(agents=1, masters=1, allocators=1, brokers=1)
    other = Fleet(tmp_path / "other", spec)
    crashed = Fleet(tmp_path / "crashed", spec)
    other.start()
    try:
        crashed.start()
        from chaos.proxy import Impairment

        crashed.degrade("agent-1", "master", Impairment(delay_ms=10), seed=1)  # a proxy too
        proxy = crashed.degraded["agent-1"].popen
        assert proxy is not None and proxy.poll() is None
        pids = [p.pid for p in crashed.procs.values()] + [z.pid for z in crashed.zookeepers]
        # The run "crashes": nothing of it is stopped; `offerbus chaos clean` is all that runs.
        clean(tmp_path / "crashed", quiet=True)
        assert _leftovers(crashed.fleet_id) == []
        assert proxy.wait(timeout=10) is not None  # the proxy ended with its fleet
        for proc in crashed.procs.values():
            assert proc.popen is not None and proc.popen.wait(timeout=10) is not None
        for zk in crashed.zookeepers:
            assert not zk.alive()
        assert all(pid is not None for pid in pids)
        assert _leftovers(other.fleet_id) != []  # another fleet is left alone
        assert all(p.alive() for p in other.procs.values())
    finally:
        other.stop()
    assert _leftovers(other.fleet_id) == []
