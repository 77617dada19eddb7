"""Failover between contender PROCESSES (`python -m services.bus.election`): SIGKILL the
leader, time the standby's election. The time is printed and recorded, not asserted
beyond a generous deadline (chaos/election_failover.py measures it properly)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from chaos.election_failover import ContenderProcess
from services.bus.election import StandaloneDetector
from tests.waiting import wait_for

ROLE = "master"
SESSION_TIMEOUT = 1.0
DEADLINE = 5.0  # generous: the expected figure is ~1.0-1.3 s for ZooKeeper, ~0 for flock
START = 20.0  # a cold Python + kazoo start, on a busy machine


@pytest.fixture
def spawn(tmp_path: Path) -> Iterator[Callable[..., ContenderProcess]]:
    started: list[ContenderProcess] = []

    def start(url: str, member_id: str) -> ContenderProcess:
        proc = ContenderProcess(
            url, ROLE, member_id, session_timeout=SESSION_TIMEOUT, log_dir=tmp_path / "logs"
        )
        started.append(proc)
        wait_for(lambda: proc.last("started"), START, message=f"{member_id} did not start")
        return proc

    yield start
    for proc in started:
        proc.terminate()


def elected_epoch(proc: ContenderProcess) -> int:
    event = wait_for(
        lambda: proc.last("elected"), START, message=f"{proc.member_id} was never elected"
    )
    assert event is not None
    return int(event["epoch"])


@pytest.fixture
def joined(zk_hosts: str, zk_admin: Any) -> Callable[[], int]:
    """How many members stand in the election (read through the un-chrooted admin client)."""
    chroot = "/" + zk_hosts.split("/", 1)[1]
    return lambda: len(zk_admin.get_children(f"{chroot}/offerbus/{ROLE}/election"))


def measure_failover(leader: ContenderProcess, standby: ContenderProcess) -> dict[str, Any]:
    old_epoch = elected_epoch(leader)
    assert standby.last("elected") is None
    killed_at = leader.kill()
    event = wait_for(
        lambda: standby.last("elected"),
        DEADLINE,
        message=lambda: f"standby not elected after the kill; it printed {standby.events()}",
    )
    assert event is not None
    took = event["t"] - killed_at
    assert event["epoch"] > old_epoch
    return {"old_epoch": old_epoch, "new_epoch": event["epoch"], "failover_s": took}


def test_zookeeper_standby_process_takes_over_after_sigkill(
    spawn: Callable[..., ContenderProcess],
    zk_hosts: str,
    joined: Callable[[], int],
    record_property: Callable[[str, object], None],
) -> None:
    url = f"zk://{zk_hosts}"
    leader = spawn(url, "a")
    elected_epoch(leader)
    standby = spawn(url, "b")
    wait_for(lambda: joined() == 2, START, message="the standby never joined")
    result = measure_failover(leader, standby)
    # The killed leader's member went with its session; only the standby's is left.
    assert joined() == 1
    record_property("zk_failover_s", round(result["failover_s"], 3))
    print(f"\nZooKeeper failover after SIGKILL (session timeout {SESSION_TIMEOUT}s): {result}")
    assert standby.alive()
    assert standby.terminate() == 0
    assert standby.last("closed") is not None


def test_zookeeper_sigterm_hands_over_at_once(
    spawn: Callable[..., ContenderProcess], zk_hosts: str, joined: Callable[[], int]
) -> None:
    url = f"zk://{zk_hosts}"
    leader = spawn(url, "a")
    old_epoch = elected_epoch(leader)
    standby = spawn(url, "b")
    wait_for(lambda: joined() == 2, START, message="the standby never joined")
    assert leader.terminate() == 0  # close(): the session ends, the member goes with it
    closed = leader.last("closed")
    assert closed is not None
    new_epoch = elected_epoch(standby)
    event = standby.last("elected")
    assert event is not None and new_epoch > old_epoch
    # No session timeout to wait out: far below it.
    print(f"\nZooKeeper handover after SIGTERM: {event['t'] - closed['t']:.3f}s")
    assert event["t"] - closed["t"] < DEADLINE


def test_standalone_standby_process_takes_over_after_sigkill(
    spawn: Callable[..., ContenderProcess],
    tmp_path: Path,
    record_property: Callable[[str, object], None],
) -> None:
    run_dir = tmp_path / "run"
    url = f"file://{run_dir}"
    detector = StandaloneDetector(run_dir, ROLE)
    detector.start()
    try:
        leader = spawn(url, "a")
        old_epoch = elected_epoch(leader)
        info = detector.wait_for_leader(START)
        assert info is not None and info.key() == ("a", old_epoch)
        standby = spawn(url, "b")
        result = measure_failover(leader, standby)
        record_property("standalone_failover_s", round(result["failover_s"], 3))
        print(f"\nstandalone (flock) failover after SIGKILL: {result}")
        wait_for(
            lambda: (i := detector.leader()) is not None and i.key() == ("b", result["new_epoch"]),
            DEADLINE,
            message=lambda: f"detector shows {detector.leader()}",
        )
        # With the last contender killed too, the leader file stays behind, but its pid is
        # dead: the detector reports no leader.
        standby.kill()
        wait_for(lambda: detector.leader() is None, DEADLINE, message="dead leader still shown")
        assert (run_dir / f"{ROLE}.leader.json").exists()
    finally:
        detector.close()
