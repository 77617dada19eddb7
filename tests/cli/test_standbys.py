"""`offerbus up --standbys N` and who stands by: N+1 of each central service with distinct
names and ids, the process behind an election member, the members of a real ZooKeeper
election in order, and `offerbus status` naming each role's leader and standbys."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

import pytest

from services.bus.election import LeaderInfo, ZooKeeperContender
from services.cli import cluster
from services.cli import main as cli_main
from services.cli.client import ElectionView
from services.procs import service_module
from tests.waiting import wait_for


def test_standbys_give_every_central_service_n_plus_one_instances() -> None:
    opts = cluster.UpOptions(run_dir=Path("/x"), standbys=1)
    assert opts.instances() == {"master": 2, "allocator": 2, "broker": 2}
    assert cluster.UpOptions(run_dir=Path("/x")).instances() == {
        "master": 1, "allocator": 1, "broker": 1}
    # --masters still adds masters only; --standbys never lowers it.
    assert cluster.UpOptions(run_dir=Path("/x"), masters=3, standbys=1).instances() == {
        "master": 3, "allocator": 2, "broker": 2}


def test_each_instance_has_its_own_process_name_and_id() -> None:
    plan = cluster.central_argv(cluster.UpOptions(run_dir=Path("/x"), standbys=2), "zk://h/c")
    names = [name for name, _ in plan]
    assert names == ["master", "master-2", "master-3", "allocator", "allocator-2",
                     "allocator-3", "broker", "broker-2", "broker-3", "jobs", "jobs-2",
                     "jobs-3"]
    ids = [argv[argv.index("--id") + 1] for _, argv in plan]
    assert len(set(ids)) == len(ids)
    for (name, argv), member in zip(plan, ids, strict=True):
        role = name.split("-")[0]
        module = service_module(role)
        assert argv[:2] == ["-m", module] and member.startswith(f"{role}-")
        assert argv[argv.index("--cluster") + 1] == "zk://h/c"
    broker = dict(plan)["broker-2"]
    assert "--offer-timeout" in broker
    no_jobs = cluster.UpOptions(run_dir=Path("/x"), standbys=2, jobs=False)
    assert [n for n, _ in cluster.central_argv(no_jobs, "zk://h/c")] == names[:9]


def test_the_process_behind_an_election_member(tmp_path: Path) -> None:
    pids = tmp_path / "pids"
    pids.mkdir()
    for name, member in (("allocator", "allocator-1"), ("allocator-2", "allocator-2"),
                         ("agent-1", "")):
        argv = ["-m", "services.x"] + (["--id", member] if member else [])
        (pids / f"{name}.argv").write_text(json.dumps({"argv": argv, "env": {}}))
    assert cluster.member_process(tmp_path, "allocator-2") == "allocator-2"
    assert cluster.member_process(tmp_path, "allocator-1") == "allocator"
    assert cluster.member_process(tmp_path, "broker-1") is None
    assert cluster.member_id_of(tmp_path, "agent-1") is None
    assert cluster.member_id_of(tmp_path, "nothing") is None


def test_up_takes_standbys_and_refuses_nonsense() -> None:
    args = cli_main.parser().parse_args(["up", "--standbys", "1"])
    assert args.standbys == 1 and args.masters == 1
    for bad in (["--standbys", "-1"], ["--masters", "0"], ["--standbys", "two"]):
        with pytest.raises(SystemExit) as exc:
            cli_main.parser().parse_args(["up", *bad])
        assert exc.value.code == 2


def test_election_members_are_listed_leader_first(zk: Any, zk_hosts: str) -> None:
    contenders = []
    try:
        for i in (1, 2):
            c = ZooKeeperContender(zk_hosts, "allocator", f"allocator-{i}",
                                   {"http": f"http://127.0.0.1:{i}"})
            c.start()
            contenders.append(c)
            wait_for(lambda c=c: c.member_path is not None, 10, message="never joined")
        with ElectionView(f"zk://{zk_hosts}") as election:
            members = election.members("allocator")
            assert members is not None
            assert [m.member_id for m in members] == ["allocator-1", "allocator-2"]
            assert members[0].epoch < members[1].epoch
            assert members[1].endpoints == {"http": "http://127.0.0.1:2"}
            assert election.members("broker") == []  # no such election yet
    finally:
        for c in contenders:
            c.close()
    with ElectionView("file:///nowhere") as election:
        assert election.members("master") is None  # a standalone election lists no members


def test_standalone_standbys_come_from_the_run_dir(tmp_path: Path) -> None:
    pids = tmp_path / "pids"
    pids.mkdir()
    for name, member in (("broker", "broker-1"), ("broker-2", "broker-2")):
        (pids / f"{name}.pid").write_text(str(os.getpid()))  # alive: this process
        (pids / f"{name}.argv").write_text(json.dumps({"argv": ["--id", member], "env": {}}))
    leader = LeaderInfo("broker", "broker-1", 4, {})
    out = cli_main.standbys_of(f"file://{tmp_path}/election", tmp_path,
                               {"broker": leader, "allocator": None})
    assert out == {"broker": ["broker-2"], "allocator": None}


def test_status_names_leaders_and_standbys(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                           capsys: pytest.CaptureFixture[str]) -> None:
    leader = LeaderInfo("master", "master-2", 7, {"http": "http://m:1"})
    state = {"cluster_id": "c-1", "agents": [], "frameworks": [], "tasks": []}
    monkeypatch.setattr(cli_main, "master_state", lambda url, t: (leader, state))
    monkeypatch.setattr(cli_main, "find_leader", lambda url, t, role="master": LeaderInfo(
        role, f"{role}-1", 3, {}))
    monkeypatch.setattr(cli_main, "standbys_of", lambda url, run_dir, leaders: {
        "master": ["master-1"], "allocator": ["allocator-2"], "broker": []})
    monkeypatch.setattr(cli_main.console, "file", open(tmp_path / "out", "w+"))  # noqa: SIM115
    argv = ["--run-dir", str(tmp_path), "--cluster", "zk://h/c", "status"]
    assert cli_main.main([*argv, "--json"]) == 0
    assert cli_main.main(argv) == 0
    cli_main.console.file.seek(0)
    text = cli_main.console.file.read()
    doc = json.loads(text[:text.index("\n}\n") + 3])
    assert doc["leaders"]["master"]["id"] == "master-2"
    assert doc["standbys"] == {"master": ["master-1"], "allocator": ["allocator-2"],
                               "broker": []}
    human = text[text.index("\n}\n") + 3:]
    assert "standing by: master-1" in human and "standing by: allocator-2" in human
    assert "no standby" in human  # the broker has none


def test_ready_waits_for_the_standbys_to_stand(zk: Any, zk_hosts: str, tmp_path: Path,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    """wait_ready reports who leads and who stands by, and does not return before the
    expected number of members stands in each election."""
    state = {"agents": [{"status": "AGENT_STATUS_REGISTERED"}]}
    monkeypatch.setattr(cluster, "http_get", lambda url, timeout: state)
    url = f"zk://{zk_hosts}"
    contenders = []
    try:
        for role in cluster.CENTRAL:
            c = ZooKeeperContender(zk_hosts, role, f"{role}-1", {"http": "http://127.0.0.1:1"})
            c.start()
            contenders.append(c)
        with pytest.raises(cluster.CliError, match="in the election: master 1/2"):
            cluster.wait_ready(url, tmp_path, 1, 3.0, None,
                               expected={"master": 2, "allocator": 1, "broker": 1})
        second = ZooKeeperContender(zk_hosts, "master", "master-2", {})
        second.start()
        contenders.append(second)
        started = time.monotonic()
        got = cluster.wait_ready(url, tmp_path, 1, 10.0, None,
                                 expected={"master": 2, "allocator": 1, "broker": 1})
        assert time.monotonic() - started < 10
        assert got["central"]["master"] == {"leader": "master-1", "epoch": 1,
                                            "standbys": ["master-2"]}
        assert got["central"]["broker"]["standbys"] == []
        assert "master master-1 (+1 standby: master-2)" in cluster.central_summary(got)
    finally:
        for c in contenders:
            c.close()
