"""Helpers for end-to-end tests on a real local cluster (ZooKeeper, master, allocator,
offer-broker and agents as separate processes, Docker containers): the cluster fixture's
object and a scheduler that records what the master tells it."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
import uuid
from collections import defaultdict
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from frameworks.sdk.driver import SchedulerDriver
from frameworks.sdk.scheduler import MasterInfo, Scheduler
from schemas import common_pb2
from services.bus.election import LeaderInfo, detector_from_url
from services.resources import Resources

S = common_pb2.TaskState


@dataclass
class Cluster:
    url: str
    run_dir: Path

    def state(self) -> dict[str, Any]:
        detector = detector_from_url(self.url, "master")
        detector.start()
        try:
            leader = detector.wait_for_leader(5.0)
        finally:
            detector.close()
        assert leader is not None, "no leading master"
        # Elected is not yet leading: until its reign begins (the registry loaded) the new
        # leader answers 503; wait for it (a failover's first read hit that in CI).
        deadline = time.monotonic() + 15.0
        while True:
            try:
                with urllib.request.urlopen(leader.endpoints["http"] + "/state",
                                            timeout=5) as r:
                    return json.loads(r.read())  # type: ignore[no-any-return]
            except urllib.error.HTTPError as exc:
                if exc.code != 503 or time.monotonic() > deadline:
                    raise
            time.sleep(0.05)  # polling the leader's reign with a deadline

    def cli(self, *args: str) -> str:
        out = subprocess.run([sys.executable, "-m", "services.cli", "--cluster", self.url,
                              "--run-dir", str(self.run_dir), *args],
                             capture_output=True, text=True, timeout=60,
                             env={"COLUMNS": "250", "PATH": "/usr/bin:/bin"})
        assert out.returncode == 0, out.stdout + out.stderr
        return out.stdout

    def agent_ids(self) -> dict[str, str]:
        """agent id -> hostname"""
        return {a["agent_info"]["agent_id"]: a["agent_info"]["hostname"]
                for a in self.state()["agents"]}

    def leader(self, role: str = "master", timeout: float = 5.0) -> LeaderInfo:
        """Who leads `role` ("master", "allocator", "broker") now, by the election."""
        return leader_of(self.url, role, timeout)

    def leader_process(self, role: str) -> tuple[str, LeaderInfo]:
        """(name of this cluster's process that leads `role`, its LeaderInfo)."""
        from services.cli import cluster as local_cluster

        info = self.leader(role)
        name = local_cluster.member_process(self.run_dir, info.member_id)
        assert name is not None, f"no process of {self.run_dir} has id {info.member_id}"
        return name, info

    def kill_leader(self, role: str, sig: int = signal.SIGKILL) -> tuple[str, LeaderInfo, float]:
        """Send `sig` to the process leading `role`: (its name, the LeaderInfo it had, the
        time.monotonic() of the kill). `services.cli.cluster.respawn` starts it again."""
        from services.cli import cluster as local_cluster

        name, info = self.leader_process(role)
        pid = local_cluster.running(self.run_dir)[name]
        os.kill(pid, sig)
        return name, info, time.monotonic()


def leader_of(url: str, role: str = "master", timeout: float = 5.0) -> LeaderInfo:
    detector = detector_from_url(url, role)
    detector.start()
    try:
        info = detector.wait_for_leader(timeout)
    finally:
        detector.close()
    assert info is not None, f"no leading {role}"
    return info


def members_of(url: str, role: str = "master") -> list[LeaderInfo]:
    """Every contender of `role` (ZooKeeper elections), leader and standbys, in order."""
    from services.cli.client import ElectionView

    with ElectionView(url) as election:
        members = election.members(role)
    assert members is not None, f"{url}: not a ZooKeeper election (members unknown)"
    return members


def metric(info: LeaderInfo, name: str) -> float:
    """An unlabelled sample of a service's /metrics (0 when absent)."""
    with urllib.request.urlopen(info.endpoints["http"] + "/metrics", timeout=5) as r:
        text = r.read().decode()
    found = re.search(rf"^{re.escape(name)} (\S+)$", text, re.M)
    return float(found.group(1)) if found else 0.0


@contextmanager
def local_cluster_in(zk: Any, zk_admin: Any, run_dir: Path, name: str,
                     **options: Any) -> Iterator[Cluster]:
    """A local cluster (`offerbus up`) on the tests' ZooKeeper under its own chroot
    `/<name>-<random>`, taken down (only its own processes and containers) afterwards."""
    from services.cli import cluster as local_cluster

    chroot = f"/{name}-{uuid.uuid4().hex[:8]}"
    zk_admin.create(chroot)
    url = f"zk://{zk.hosts}{chroot}"
    local_cluster.up(local_cluster.UpOptions(run_dir=run_dir, cluster_url=url, timeout=60,
                                             **options))
    try:
        yield Cluster(url, run_dir)
    finally:
        local_cluster.down(run_dir)


def sleep_task(task_id: str, offer: common_pb2.Offer, *, cpus: float = 0.1, mem: float = 32,
               image: str = "offerbus/busybox:latest",
               command: list[str] | None = None) -> common_pb2.TaskInfo:
    task = common_pb2.TaskInfo(task_id=task_id, name=task_id, agent_id=offer.agent_id,
                               kill_grace_period_s=0.5)
    task.resources.extend(Resources.of(cpus=cpus, mem=mem).to_proto())
    task.container.type = common_pb2.ContainerInfo.CONTAINER_TYPE_DOCKER
    task.container.docker.image = image
    argv = command or ["sleep", "3600"]
    task.command.shell = False
    task.command.value = argv[0]
    task.command.arguments.extend(argv[1:])
    return task


def launch(task: common_pb2.TaskInfo) -> common_pb2.Operation:
    op = common_pb2.Operation()
    op.launch.tasks.append(task)
    return op


@dataclass
class Recorder(Scheduler):
    """Records every callback; `on_offers` (if set) decides what to do with offers."""

    on_offers: Callable[[SchedulerDriver, list[common_pb2.Offer]], None] | None = None
    framework_id: str = ""
    offers_seen: list[tuple[float, common_pb2.Offer]] = field(default_factory=list)
    rescinds: list[tuple[float, str]] = field(default_factory=list)
    updates: dict[str, list[common_pb2.TaskStatus]] = field(
        default_factory=lambda: defaultdict(list))
    rejected: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    refusals: list[tuple[int, str]] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def subscribed(self, driver: SchedulerDriver, framework_id: str,
                   master_info: MasterInfo) -> None:
        self.framework_id = framework_id

    def offers(self, driver: SchedulerDriver, offers: list[common_pb2.Offer]) -> None:
        with self.lock:
            self.offers_seen += [(time.monotonic(), o) for o in offers]
        if self.on_offers is not None:
            self.on_offers(driver, offers)

    def rescinded(self, driver: SchedulerDriver, offer_ids: list[str], reason: int) -> None:
        with self.lock:
            self.rescinds += [(time.monotonic(), oid) for oid in offer_ids]

    def update(self, driver: SchedulerDriver, status: common_pb2.TaskStatus) -> None:
        with self.lock:
            self.updates[status.task_id].append(status)

    def accept_rejected(self, driver: SchedulerDriver, offer_ids: list[str],
                        task_ids: list[str], reason: int, message: str) -> None:
        with self.lock:
            self.rejected.append(message)

    def refused(self, driver: SchedulerDriver, code: int, message: str) -> None:
        with self.lock:
            self.refusals.append((code, message))

    def error(self, driver: SchedulerDriver, message: str) -> None:
        with self.lock:
            self.errors.append(message)

    def state_of(self, task_id: str) -> int | None:
        with self.lock:
            history = self.updates.get(task_id)
            return history[-1].state if history else None

    def last(self, task_id: str) -> common_pb2.TaskStatus | None:
        with self.lock:
            history = self.updates.get(task_id)
            return history[-1] if history else None


def framework(name: str, role: str = "*") -> common_pb2.FrameworkInfo:
    info = common_pb2.FrameworkInfo(name=name, role=role, principal=name,
                                    failover_timeout_s=30.0)
    info.capabilities.append(common_pb2.FrameworkInfo.CAPABILITY_PARTITION_AWARE)
    return info


def reset_connections(pid: int, port: int) -> int:
    """Abort every established TCP connection of process `pid` to local `port` (the kernel
    resets both ends, `ss -K`): a real connection loss for that process only, the processes
    untouched. How many were reset."""
    out = subprocess.run(["ss", "-tnpH", "state", "established", "dport", "=", f":{port}"],
                         capture_output=True, text=True, check=True).stdout
    ports = [m.group(1) for line in out.splitlines() if f"pid={pid}," in line
             if (m := re.search(r"127\.0\.0\.1:(\d+)\s", line))]
    for p in ports:
        subprocess.run(["ss", "-K", "state", "established", "dport", "=", f":{port}",
                        "sport", "=", f":{p}"], capture_output=True, check=True)
    return len(ports)


def stop_processes(procs: list[subprocess.Popen[bytes]], timeout: float = 20.0) -> None:
    """SIGTERM every process, then wait for each (SIGKILL after `timeout`)."""
    for proc in procs:
        proc.terminate()
    for proc in procs:
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
