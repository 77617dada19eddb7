"""Chaos: SIGKILL the leading contender process, round after round, and time how long until
a standby is elected. `python -m chaos.election_failover --rounds 10 [--zk HOSTS]`.

Also home of ContenderProcess, the handle on one `python -m services.bus.election` process
that the integration tests use too."""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any, TextIO

REPO = Path(__file__).resolve().parent.parent
RESULTS = Path(__file__).resolve().parent / "results" / "election_failover.json"


class ContenderProcess:
    """One contender process; its JSON event lines are collected by a reader thread."""

    def __init__(
        self,
        url: str,
        role: str,
        member_id: str,
        *,
        session_timeout: float | None = None,
        log_dir: Path | None = None,
    ) -> None:
        self.member_id = member_id
        cmd = [
            sys.executable, "-m", "services.bus.election",
            "--url", url, "--role", role, "--member-id", member_id,
            "--endpoint", f"router=tcp://127.0.0.1:0/{member_id}",
        ]  # fmt: skip
        if session_timeout is not None:
            cmd += ["--session-timeout", str(session_timeout)]
        self._stderr: TextIO | int = subprocess.DEVNULL
        if log_dir is not None:
            log_dir.mkdir(parents=True, exist_ok=True)
            self._stderr = (log_dir / f"{member_id}.stderr").open("w")
        self.proc = subprocess.Popen(
            cmd, cwd=REPO, stdout=subprocess.PIPE, stderr=self._stderr, text=True
        )
        self.pid = self.proc.pid
        self._events: list[dict[str, Any]] = []
        self._lock = threading.Lock()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            with contextlib.suppress(ValueError), self._lock:
                self._events.append(json.loads(line))

    def events(self) -> list[dict[str, Any]]:
        with self._lock:
            return list(self._events)

    def last(self, name: str) -> dict[str, Any] | None:
        found = [e for e in self.events() if e["event"] == name]
        return found[-1] if found else None

    def leading_epoch(self) -> int | None:
        """The epoch this process leads at, judging from what it printed."""
        epoch = None
        for event in self.events():
            if event["event"] == "elected":
                epoch = int(event["epoch"])
            elif event["event"] in ("suspended", "lost", "closed"):
                epoch = None
        return epoch

    def alive(self) -> bool:
        return self.proc.poll() is None

    def kill(self) -> float:
        """SIGKILL; returns the wall-clock time of the kill (compare with event "t")."""
        t = time.time()
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(timeout=10)
        return t

    def terminate(self, timeout: float = 10.0) -> int:
        if self.alive():
            self.proc.send_signal(signal.SIGTERM)
        try:
            code = self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            code = self.proc.wait(timeout=timeout)
        self._reader.join(timeout=timeout)
        if not isinstance(self._stderr, int):
            self._stderr.close()
        return code


def wait_until(predicate: Callable[[], Any], timeout: float, what: str) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() >= deadline:
            raise TimeoutError(f"{what} (waited {timeout:g}s)")
        time.sleep(0.01)  # polling the condition until the deadline


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))]


def summarize(times: list[float]) -> dict[str, float]:
    return {
        "min": min(times),
        "median": statistics.median(times),
        "p90": percentile(times, 0.9),
        "max": max(times),
        "mean": statistics.fmean(times),
    }


def run(
    hosts: str, rounds: int, contenders: int, session_timeout: float, work: Path
) -> dict[str, Any]:
    from kazoo.client import KazooClient

    chroot = f"/chaos-{uuid.uuid4().hex[:12]}"
    role = "master"
    admin = KazooClient(hosts=hosts, timeout=5.0)
    admin.start(timeout=15.0)
    admin.create(chroot, b"")
    election = f"{chroot}/offerbus/{role}/election"
    url = f"zk://{hosts}{chroot}"

    def joined() -> int:
        with contextlib.suppress(Exception):
            return len(admin.get_children(election))
        return 0

    pool: list[ContenderProcess] = []
    records: list[dict[str, Any]] = []
    serial = 0
    try:
        for n in range(1, rounds + 1):
            while len(pool) < contenders:  # top up the standbys
                serial += 1
                pool.append(
                    ContenderProcess(
                        url, role, f"c{serial}", session_timeout=session_timeout,
                        log_dir=work / "logs",
                    )
                )  # fmt: skip
            leader = wait_until(
                lambda: next((p for p in pool if p.leading_epoch() is not None), None),
                30.0,
                f"round {n}: no leader",
            )
            wait_until(lambda: joined() == len(pool), 30.0, f"round {n}: not all joined")
            old_epoch = leader.leading_epoch()
            killed_at = leader.kill()
            pool.remove(leader)

            def successor(
                old_epoch: int = old_epoch,
            ) -> tuple[ContenderProcess, dict[str, Any]] | None:
                for p in pool:
                    e = p.last("elected")
                    if e is not None and e["epoch"] > old_epoch:
                        return p, e
                return None

            winner, event = wait_until(successor, 30.0, f"round {n}: no successor")
            took = event["t"] - killed_at
            records.append(
                {
                    "round": n,
                    "killed": leader.member_id,
                    "old_epoch": old_epoch,
                    "elected": winner.member_id,
                    "new_epoch": event["epoch"],
                    "failover_s": round(took, 4),
                }
            )
            print(
                f"round {n:3d}: killed {leader.member_id} (epoch {old_epoch}) -> "
                f"{winner.member_id} elected (epoch {event['epoch']}) in {took:.3f}s",
                flush=True,
            )
    finally:
        for p in pool:
            p.terminate()
        with contextlib.suppress(Exception):
            admin.delete(chroot, recursive=True)
        admin.stop()
        admin.close()
    times = [r["failover_s"] for r in records]
    return {
        "scenario": "SIGKILL the leading contender process; time until a standby prints elected",
        "rounds": records,
        "contenders": contenders,
        "session_timeout_s": session_timeout,
        "summary_s": summarize(times),
        "host": os.uname().nodename,
        "finished": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m chaos.election_failover")
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--zk", help="ZooKeeper hosts; default: start a local server")
    parser.add_argument("--contenders", type=int, default=3)
    parser.add_argument("--session-timeout", type=float, default=1.0)
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args(argv)
    if args.rounds < 1 or args.contenders < 2:
        parser.error("need --rounds >= 1 and --contenders >= 2")

    with tempfile.TemporaryDirectory(prefix="chaos-election-") as tmp:
        work = Path(tmp)
        server = None
        hosts = args.zk
        if hosts is None:
            from infra.zookeeper import ZooKeeperServer

            server = ZooKeeperServer(work / "zk")
            server.start(timeout=60.0)
            hosts = server.hosts
            print(f"started ZooKeeper at {hosts} (tickTime {server.tick_ms} ms)", flush=True)
        try:
            result = run(hosts, args.rounds, args.contenders, args.session_timeout, work)
        finally:
            if server is not None:
                server.stop()
    result["zookeeper"] = "local server (infra.zookeeper)" if args.zk is None else args.zk
    s = result["summary_s"]
    print(
        f"failover over {args.rounds} rounds (session timeout {args.session_timeout}s): "
        f"min {s['min']:.3f}s  median {s['median']:.3f}s  p90 {s['p90']:.3f}s  "
        f"max {s['max']:.3f}s"
    )
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
