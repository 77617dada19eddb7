"""A real agent process (`python -m services.agent`) against a test that plays the leading MASTER
(a real ROUTER on loopback, elected through the standalone election), with real executors and
real busybox containers on the local Docker engine: an executor SIGKILLed has its container
stopped and removed before its task is reported FAILED; after a restart the agent removes only
the orphan containers of its own cluster and agent id; and it refuses a master of another
cluster (no cleanup, its checkpointed cluster id kept)."""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import urllib.request
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import zmq

from schemas import common_pb2
from services.agent.checkpoint import AgentCheckpoint
from services.bus import codec
from services.bus.election.port import Elected
from services.bus.election.standalone import StandaloneContender
from services.bus.peer import RouterServer, Sender
from services.bus.reactor import Reactor
from services.executor.runtime import (
    LABEL_AGENT,
    LABEL_CLUSTER,
    LABEL_EXECUTOR,
    LABEL_FRAMEWORK,
)
from services.procs import pid_alive

S = common_pb2.TaskState
FW = f"fw-agent-test-{uuid.uuid4().hex[:8]}"  # this run's framework
TEST_LABEL = "org.offerbus.test"
ROOT = Path(__file__).resolve().parents[2]


class PlayedMaster:
    """The master's side of the agent protocol on a real ROUTER: answers (re-)registration
    with `cluster_id`, records status updates and acknowledges them, sends RunTasks."""

    def __init__(self, ctx: zmq.Context[zmq.Socket[bytes]], run_dir: Path,
                 cluster_id: str, docker: Any) -> None:
        self.reactor = Reactor()
        self.cluster_id = cluster_id
        self.docker = docker
        self.sender = Sender("played-master", codec.Role.Value("ROLE_MASTER"))
        self.server = RouterServer(self.reactor, ctx, "tcp://127.0.0.1:*", self.sender,
                                   self._on_message, name="agents")
        self.contender = StandaloneContender(run_dir, "master", "played-master",
                                             {"front": self.server.endpoint})
        self.contender.start()
        self.reactor.add_reader(self.contender, self._on_election)
        self.registrations: list[str] = []  # "register" / "reregister"
        self.updates: list[common_pb2.TaskStatus] = []
        self.executor_exits: list[str] = []
        # What Docker held for a task's executor at the moment its FAILED update arrived.
        self.containers_at_failed: dict[str, list[Any]] = {}
        self.peer = b""
        self.run_until(lambda: self.sender.epoch > 0, 10.0, "the played master was not elected")

    def _on_election(self) -> None:
        for event in self.contender.events():
            if isinstance(event, Elected):
                self.sender.epoch = event.epoch

    def _on_message(self, peer: bytes, env: codec.Envelope) -> None:
        if codec.payload_kind(env) != "agent_call":
            return
        call = env.agent_call
        kind = call.WhichOneof("call")
        self.peer = peer
        if kind in ("register", "reregister"):
            self.registrations.append(kind)
            out = codec.Envelope()
            reply = out.agent_event.registered if kind == "register" \
                else out.agent_event.reregistered
            reply.agent_id = call.agent_id or f"agent-{uuid.uuid4().hex[:8]}"
            reply.master_id = "played-master"
            reply.master_epoch = self.sender.epoch
            reply.cluster_id = self.cluster_id
            self.server.send(peer, out)
        elif kind == "status_updates":
            ack = codec.Envelope()
            for u in call.status_updates.updates:
                self.updates.append(u.status)
                if u.status.state == S.TASK_FAILED:
                    self.containers_at_failed[u.status.executor_id] = self.docker.api.containers(
                        all=True, filters={"label": f"{LABEL_EXECUTOR}={u.status.executor_id}"})
                ack.agent_event.acknowledgements.acks.add(
                    framework_id=u.framework_id, task_id=u.status.task_id, uuid=u.status.uuid)
            self.server.send(peer, ack)
        elif kind == "executor_exited":
            self.executor_exits.append(call.executor_exited.executor_id)

    def run_task(self, task: common_pb2.TaskInfo) -> None:
        env = codec.Envelope()
        env.agent_event.run_tasks.launches.add(framework_id=FW, task=task)
        env.agent_event.run_tasks.frameworks.add(framework_id=FW, name="agent-test")
        assert self.server.send(self.peer, env)

    def states(self, task_id: str) -> list[int]:
        return [s.state for s in self.updates if s.task_id == task_id]

    def run_until(self, cond: Callable[[], object], timeout: float, what: str) -> None:
        if not self.reactor.run(until=lambda: bool(cond()), timeout=timeout):
            raise AssertionError(f"{what} (waited {timeout:g}s); registrations "
                                 f"{self.registrations}, updates "
                                 f"{[(s.task_id, S.Name(s.state)) for s in self.updates]}")

    def close(self) -> None:
        self.reactor.remove_reader(self.contender)
        self.contender.close()
        self.server.close()


class AgentProcess:
    """`python -m services.agent` in its own work dir (kept across restarts)."""

    def __init__(self, run_dir: Path, work_dir: Path) -> None:
        self.run_dir, self.work_dir = run_dir, work_dir
        self.log_path = work_dir.parent / "agent.log"
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        self.work_dir.mkdir(parents=True, exist_ok=True)
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "services.agent", "--cluster", f"file://{self.run_dir}",
                 "--work-dir", str(self.work_dir), "--hostname", "agent-test",
                 "--resources", "cpus:2;mem:1024;disk:1024;ports:[31000-31010]",
                 "--runtime", "docker"],
                cwd=ROOT, stdout=log, stderr=log,
                env={**os.environ, "OTEL_SDK_DISABLED": "true"})

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.proc = None

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def executor_pids(self) -> dict[str, int]:
        state = AgentCheckpoint(self.work_dir).load_state()
        return {e.executor_id: e.pid for e in state.executors} if state else {}


@pytest.fixture
def env(docker_client: Any, busybox_image: str) -> Iterator[dict[str, Any]]:
    top = Path(tempfile.mkdtemp(prefix="obag-", dir="/tmp"))
    ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
    run_id = uuid.uuid4().hex[:10]
    cluster_id = f"cl-{run_id}"
    master = PlayedMaster(ctx, top / "run", cluster_id, docker_client)
    agent = AgentProcess(top / "run", top / "agent")
    state = {"master": master, "agent": agent, "docker": docker_client, "image": busybox_image,
             "run_id": run_id, "cluster_id": cluster_id}
    try:
        yield state
    finally:
        pids = agent.executor_pids()
        agent.stop()
        for pid in pids.values():  # executors our agent started, by pid
            if pid > 0 and pid_alive(pid):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
        for label in (f"{TEST_LABEL}={run_id}", f"{LABEL_CLUSTER}={cluster_id}",
                      f"{LABEL_FRAMEWORK}={FW}"):
            for c in docker_client.api.containers(all=True, filters={"label": label}):
                docker_client.api.remove_container(c["Id"], force=True)
        master.close()
        ctx.destroy(linger=0)
        shutil.rmtree(top, ignore_errors=True)


def sleep_task(task_id: str, image: str) -> common_pb2.TaskInfo:
    task = common_pb2.TaskInfo(task_id=task_id, name=task_id, kill_grace_period_s=0.5)
    task.resources.add(name="cpus", scalar=0.1)
    task.resources.add(name="mem", scalar=32)
    task.container.type = common_pb2.ContainerInfo.CONTAINER_TYPE_DOCKER
    task.container.docker.image = image
    task.command.value = "sleep"
    task.command.arguments.append("3600")
    return task


def by_hand(env: dict[str, Any], labels: dict[str, str]) -> str:
    """A busybox container started by the test, labelled as if Offerbus had started it."""
    api = env["docker"].api
    created = api.create_container(env["image"], command=["sleep", "3600"],
                                   labels={TEST_LABEL: env["run_id"], **labels},
                                   name=f"obtest-{env['run_id']}-{uuid.uuid4().hex[:6]}")
    api.start(created["Id"])
    return str(created["Id"])


def exists(env: dict[str, Any], container_id: str) -> bool:
    return bool(env["docker"].api.containers(all=True, filters={"id": container_id}))


def test_a_killed_executor_has_its_container_removed_before_the_task_fails(
        env: dict[str, Any]) -> None:
    master: PlayedMaster = env["master"]
    agent: AgentProcess = env["agent"]
    agent.start()
    master.run_until(lambda: master.registrations, 30.0, "the agent never registered")
    master.run_task(sleep_task("t1", env["image"]))
    master.run_until(lambda: S.TASK_RUNNING in master.states("t1"), 30.0, "no TASK_RUNNING")
    executor_id = next(s.executor_id for s in master.updates if s.state == S.TASK_RUNNING)
    [container] = env["docker"].api.containers(
        filters={"label": f"{LABEL_EXECUTOR}={executor_id}"})
    assert container["Labels"][LABEL_CLUSTER] == env["cluster_id"], "labelled with the cluster"
    assert (agent.work_dir / "cluster_id").read_text().strip() == env["cluster_id"]
    master.run_until(lambda: agent.executor_pids().get(executor_id), 10.0,
                     "the executor's pid was never checkpointed")
    pid = agent.executor_pids()[executor_id]

    os.kill(pid, signal.SIGKILL)  # the executor our agent started dies; its container runs on
    master.run_until(lambda: S.TASK_FAILED in master.states("t1"), 30.0, "no TASK_FAILED")
    failed = next(s for s in master.updates if s.state == S.TASK_FAILED)
    assert failed.reason == common_pb2.TaskStatus.REASON_EXECUTOR_TERMINATED
    assert "container was stopped" in failed.message, failed.message
    assert master.containers_at_failed[executor_id] == [], \
        "the container still existed when the task was reported FAILED"
    assert env["docker"].api.containers(
        all=True, filters={"label": f"{LABEL_EXECUTOR}={executor_id}"}) == []
    master.run_until(lambda: executor_id in master.executor_exits, 10.0, "no ExecutorExited")


def test_restart_removes_only_this_clusters_orphans_and_refuses_another_cluster(
        env: dict[str, Any]) -> None:
    master: PlayedMaster = env["master"]
    agent: AgentProcess = env["agent"]
    cluster, other = env["cluster_id"], f"other-{env['run_id']}"
    agent.start()
    master.run_until(lambda: master.registrations, 30.0, "the agent never registered")
    master.run_until(lambda: (agent.work_dir / "cluster_id").exists(), 10.0,
                     "the cluster id was never checkpointed")
    agent_id = (agent.work_dir / "agent_id").read_text().strip()
    agent.stop()

    # Two "clusters" of containers on one engine, and containers of no cluster or agent.
    orphan = by_hand(env, {LABEL_CLUSTER: cluster, LABEL_AGENT: agent_id,
                           LABEL_EXECUTOR: "ghost-1"})
    keep = {
        "another cluster's, same agent id": by_hand(
            env, {LABEL_CLUSTER: other, LABEL_AGENT: agent_id, LABEL_EXECUTOR: "ghost-2"}),
        "no cluster label": by_hand(env, {LABEL_AGENT: agent_id, LABEL_EXECUTOR: "ghost-3"}),
        "another agent's": by_hand(
            env, {LABEL_CLUSTER: cluster, LABEL_AGENT: "agent-other", LABEL_EXECUTOR: "g-4"}),
    }
    agent.start()
    master.run_until(lambda: not exists(env, orphan), 30.0,
                     "this cluster's orphan was not removed")
    master.run_until(lambda: "orphans_removed" in agent.log(), 10.0, "no orphans_removed line")
    for what, cid in keep.items():
        assert exists(env, cid), f"{what} container was removed"
    agent.stop()

    # The same work dir answered by a master of the other cluster: refused, nothing removed.
    orphan2 = by_hand(env, {LABEL_CLUSTER: cluster, LABEL_AGENT: agent_id,
                            LABEL_EXECUTOR: "ghost-5"})
    master.cluster_id = other
    before = len(master.registrations)
    agent.start()
    master.run_until(lambda: len(master.registrations) > before, 30.0, "no re-registration")
    master.run_until(lambda: "cluster_mismatch" in agent.log(), 10.0, "no cluster_mismatch line")
    line = next(x for x in agent.log().splitlines() if "cluster_mismatch" in x)
    assert "ERROR" in line and other in line and cluster in line
    http = re.findall(r"agent started .* http=(\S+)", agent.log())[-1]
    with urllib.request.urlopen(f"{http}/metrics", timeout=5) as r:
        assert 'offerbus_agent_notices_total{kind="cluster_mismatch",level="error"} 1.0' \
            in r.read().decode()
    with urllib.request.urlopen(f"{http}/health", timeout=5) as r:
        assert json.loads(r.read())["registration"] == "refused"
    assert (agent.work_dir / "cluster_id").read_text().strip() == cluster
    assert exists(env, orphan2), "an orphan was removed on a master of another cluster"
    for what, cid in keep.items():  # ghost-2 would be an orphan if it adopted `other`
        assert exists(env, cid), f"{what} container was removed"
