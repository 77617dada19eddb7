"""A real executor, forked by the real ExecutorLauncher, against a test that plays the AGENT
with a real RouterServer, running real busybox containers on the local Docker engine: the
update sequence, kill -> TASK_KILLED within the grace, an agent restart on the same endpoint
(re-subscribe with unacked updates, the container kept running), the recovery timeout, the
process runtime; and how fast launch + subscribe is."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import zmq

from schemas import common_pb2, executor_pb2
from services import tasks
from services.agent.launcher import ExecutorLauncher
from services.bus import codec
from services.bus.peer import RouterServer, Sender
from services.bus.reactor import Reactor
from services.executor.runtime import (
    LABEL_AGENT,
    LABEL_CLUSTER,
    LABEL_EXECUTOR,
    LABEL_FRAMEWORK,
    LABEL_TASK,
)
from services.procs import pid_alive
from tests.waiting import wait_for

AGENT_ID = "agent-test"
CLUSTER_ID = "cluster-test"
ROLE_AGENT = codec.Role.Value("ROLE_AGENT")


def _gone(pid: int) -> bool:
    """Exited (a zombie nobody reaped yet counts: we are not its parent)."""
    return not pid_alive(pid)


class FakeAgent:
    """The agent's side of the executor protocol on a real ROUTER; acknowledges updates
    (when `auto_ack`) and records everything."""

    def __init__(self, ctx: zmq.Context[zmq.Socket[bytes]], endpoint: str) -> None:
        self.ctx, self.endpoint = ctx, endpoint
        self.reactor = Reactor()
        self.auto_ack = True
        self.subscribes: list[executor_pb2.ExecutorCall] = []
        self.updates: list[common_pb2.TaskStatus] = []
        self.peer = b""
        self.server: RouterServer | None = None
        self.start()

    def start(self) -> None:
        self.server = RouterServer(self.reactor, self.ctx, self.endpoint,
                                   Sender(AGENT_ID, ROLE_AGENT), self._on_message, name="agent")

    def stop(self) -> None:
        if self.server is not None:
            self.server.close()
            self.server = None

    def _on_message(self, peer: bytes, env: codec.Envelope) -> None:
        call = env.executor_call
        self.peer = peer
        if call.WhichOneof("call") == "subscribe":
            self.subscribes.append(call)
            self.send(lambda ev: setattr(ev.subscribed, "agent_id", AGENT_ID))
        elif call.WhichOneof("call") == "update":
            self.updates.append(call.update.status)
            if self.auto_ack:
                self.ack(call.update.status)

    def send(self, fill: Callable[[executor_pb2.ExecutorEvent], Any]) -> bool:
        """False when the peer is gone (an executor that exited)."""
        assert self.server is not None
        env = codec.Envelope()
        fill(env.executor_event)
        return self.server.send(self.peer, env)

    def ack(self, status: common_pb2.TaskStatus) -> None:
        def fill(ev: executor_pb2.ExecutorEvent) -> None:
            ev.acknowledged.task_id = status.task_id
            ev.acknowledged.uuid = status.uuid
        self.send(fill)

    def launch(self, task: common_pb2.TaskInfo, framework_id: str) -> None:
        def fill(ev: executor_pb2.ExecutorEvent) -> None:
            ev.launch.framework_id = framework_id
            ev.launch.task.CopyFrom(task)
        assert self.send(fill)

    def kill(self, task_id: str) -> None:
        assert self.send(lambda ev: setattr(ev.kill, "task_id", task_id))

    def states(self) -> list[tasks.State]:
        """Distinct updates in order (a retried update counts once)."""
        seen: dict[bytes, tasks.State] = {}
        for s in self.updates:
            seen.setdefault(s.uuid, s.state)
        return list(seen.values())

    def run_until(self, cond: Callable[[], object], timeout: float, what: str) -> None:
        if not self.reactor.run(until=lambda: bool(cond()), timeout=timeout):
            raise AssertionError(f"{what} (waited {timeout:g}s); updates: "
                                 f"{[tasks.name(s) for s in self.states()]}")


@pytest.fixture
def env(docker_client: Any, busybox_image: str) -> Iterator[dict[str, Any]]:
    short = tempfile.mkdtemp(prefix="obx-", dir="/tmp")  # ipc paths must stay short
    ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
    launcher = ExecutorLauncher(Path(short) / "agent")
    framework_id = f"test-{uuid.uuid4().hex[:10]}"
    state: dict[str, Any] = {"ctx": ctx, "launcher": launcher, "dir": Path(short),
                             "framework_id": framework_id, "pids": [], "image": busybox_image,
                             "docker": docker_client}
    agent = FakeAgent(ctx, f"ipc://{short}/executors.sock")
    state["agent"] = agent
    try:
        yield state
    finally:
        for pid in state["pids"]:  # executors this test started, by pid
            if not _gone(pid):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
        for c in docker_client.api.containers(
                all=True, filters={"label": f"{LABEL_FRAMEWORK}={framework_id}"}):
            docker_client.api.remove_container(c["Id"], force=True)
        agent.stop()
        launcher.close()
        ctx.destroy(linger=0)
        shutil.rmtree(short, ignore_errors=True)


def make_task(task_id: str, script: str, image: str, grace: float | None = None) -> \
        common_pb2.TaskInfo:
    task = common_pb2.TaskInfo(task_id=task_id, name=task_id, agent_id=AGENT_ID)
    task.command.shell = True
    task.command.value = script
    task.container.type = common_pb2.ContainerInfo.CONTAINER_TYPE_DOCKER
    task.container.docker.image = image
    task.resources.add(name="cpus", scalar=0.1)
    task.resources.add(name="mem", scalar=32)
    if grace is not None:
        task.kill_grace_period_s = grace
    return task


def start_executor(env: dict[str, Any], *extra: str) -> tuple[str, int, Path]:
    """Launch an executor and wait for its Subscribe; prints how long that took."""
    agent: FakeAgent = env["agent"]
    executor_id = f"e-{uuid.uuid4().hex[:8]}"
    sandbox = env["dir"] / "sandboxes" / executor_id
    argv = ["--agent", agent.endpoint, "--executor-id", executor_id,
            "--framework-id", env["framework_id"], "--task-id", "t1", "--agent-id", AGENT_ID,
            "--cluster-id", CLUSTER_ID, "--work-dir", str(sandbox), *extra]
    before = len(agent.subscribes)
    started = time.monotonic()
    pid = env["launcher"].launch(executor_id, argv)
    forked = time.monotonic()
    env["pids"].append(pid)
    agent.run_until(lambda: len(agent.subscribes) > before, 15.0, "executor never subscribed")
    done = time.monotonic()
    print(f"\nlaunch: fork {1000 * (forked - started):.1f} ms, "
          f"launch+subscribe {1000 * (done - started):.1f} ms")
    return executor_id, pid, sandbox


def containers(env: dict[str, Any], executor_id: str) -> list[dict[str, Any]]:
    return list(env["docker"].api.containers(
        all=True, filters={"label": f"{LABEL_EXECUTOR}={executor_id}"}))


def test_task_runs_to_finished_and_executor_exits(env: dict[str, Any]) -> None:
    # Warm the fork server first, so the timing below is a launch, not interpreter start-up.
    start_executor(env)
    env["agent"].send(lambda ev: setattr(ev.shutdown, "grace_period_s", 0.5))
    timings = []
    for _ in range(3):
        t0 = time.monotonic()
        executor_id, pid, sandbox = start_executor(env)
        timings.append(time.monotonic() - t0)
        env["agent"].send(lambda ev: setattr(ev.shutdown, "grace_period_s", 0.5))
    print(f"launch+subscribe warm: {[round(t * 1000, 1) for t in timings]} ms")

    agent: FakeAgent = env["agent"]
    executor_id, pid, sandbox = start_executor(env)
    agent.auto_ack = False
    agent.launch(make_task("t1", "echo hello; sleep 0.2", env["image"]), env["framework_id"])
    agent.run_until(lambda: tasks.FINISHED in agent.states(), 20.0, "no TASK_FINISHED")
    assert agent.states() == [tasks.STARTING, tasks.RUNNING, tasks.FINISHED]
    final = next(s for s in agent.updates if s.state == tasks.FINISHED)
    assert final.exit_code == 0 and final.executor_id == executor_id
    assert final.source == common_pb2.TaskStatus.SOURCE_EXECUTOR and len(final.uuid) == 16
    [container] = containers(env, executor_id)  # kept until the terminal ack
    assert container["Labels"][LABEL_AGENT] == AGENT_ID
    assert container["Labels"][LABEL_CLUSTER] == CLUSTER_ID
    assert container["Labels"][LABEL_FRAMEWORK] == env["framework_id"]
    assert container["Labels"][LABEL_TASK] == "t1"
    assert container["Names"] == [f"/offerbus-{executor_id}"]
    assert final.container_id == container["Id"]
    for status in {s.uuid: s for s in agent.updates}.values():
        agent.ack(status)
    agent.run_until(lambda: _gone(pid), 15.0, "executor did not exit after the terminal ack")
    assert containers(env, executor_id) == [], "the executor removes its container"
    assert b"hello" in (sandbox / "stdout").read_bytes(), "output kept in the sandbox"
    assert "status update" in (sandbox / "executor.log").read_text()


def test_kill_gives_killed_within_grace(env: dict[str, Any]) -> None:
    agent: FakeAgent = env["agent"]
    executor_id, pid, _ = start_executor(env)
    agent.launch(make_task("t1", "trap '' TERM; echo ready; sleep 3600", env["image"],
                           grace=1.0), env["framework_id"])
    agent.run_until(lambda: tasks.RUNNING in agent.states(), 20.0, "no TASK_RUNNING")
    [container] = containers(env, executor_id)
    wait_for(lambda: b"ready" in env["docker"].api.logs(container["Id"]), 10.0,
             message="the TERM trap was never set")
    started = time.monotonic()
    agent.kill("t1")
    agent.run_until(lambda: tasks.KILLED in agent.states(), 1.0 + 5.0, "no TASK_KILLED")
    elapsed = time.monotonic() - started
    print(f"kill with grace 1.0 s (TERM ignored) took {elapsed:.2f} s")
    assert agent.states() == [tasks.STARTING, tasks.RUNNING, tasks.KILLING, tasks.KILLED]
    assert elapsed >= 1.0, "SIGKILL came before the grace period ended"
    agent.run_until(lambda: _gone(pid), 15.0, "executor did not exit")
    assert containers(env, executor_id) == []


@pytest.mark.parametrize("outage", ["quick", "past-heartbeats"])
def test_agent_restart_executor_resubscribes_and_task_survives(env: dict[str, Any],
                                                               outage: str) -> None:
    """quick: ZeroMQ reconnects before heartbeats notice (the socket monitor tells the
    executor); past-heartbeats: the executor declared the agent gone and reconnects anew."""
    agent: FakeAgent = env["agent"]
    executor_id, pid, sandbox = start_executor(env)
    agent.launch(make_task("t1", "sleep 3600", env["image"]), env["framework_id"])
    agent.run_until(lambda: tasks.STARTING in agent.states(), 20.0, "no TASK_STARTING")
    agent.auto_ack = False  # RUNNING stays unacknowledged across the "restart"
    agent.run_until(lambda: tasks.RUNNING in agent.states(), 20.0, "no TASK_RUNNING")
    running = next(s for s in agent.updates if s.state == tasks.RUNNING)

    agent.stop()  # the agent dies ...
    assert not _gone(pid)
    if outage == "past-heartbeats":
        wait_for(lambda: "agent missed its heartbeats" in (sandbox / "executor.log").read_text(),
                 15.0, message="the executor never noticed the agent was gone")
    subscribes_before = len(agent.subscribes)
    agent.start()  # ... and a new one binds the same endpoint
    restarted = time.monotonic()
    agent.auto_ack = True
    agent.run_until(lambda: len(agent.subscribes) > subscribes_before, 15.0, "no re-subscribe")
    print(f"re-subscribed {1000 * (time.monotonic() - restarted):.0f} ms after the restart")
    sub = agent.subscribes[-1].subscribe
    assert [s.uuid for s in sub.unacknowledged_updates] == [running.uuid]
    assert list(sub.unacknowledged_tasks) == [], "the agent acknowledged STARTING already"
    [container] = containers(env, executor_id)
    assert container["State"] == "running", "the task kept running while the agent was away"
    assert not _gone(pid)

    agent.kill("t1")
    agent.run_until(lambda: tasks.KILLED in agent.states(), 10.0, "no TASK_KILLED")
    agent.run_until(lambda: _gone(pid), 15.0, "executor did not exit")
    assert containers(env, executor_id) == []


def test_agent_never_back_kills_task_after_recovery_timeout(env: dict[str, Any]) -> None:
    agent: FakeAgent = env["agent"]
    executor_id, pid, sandbox = start_executor(env, "--recovery-timeout", "1.5")
    agent.launch(make_task("t1", "sleep 3600", env["image"], grace=0.5), env["framework_id"])
    agent.run_until(lambda: tasks.RUNNING in agent.states(), 20.0, "no TASK_RUNNING")
    agent.stop()
    wait_for(lambda: _gone(pid), 15.0, message="executor did not give up on the agent")
    assert containers(env, executor_id) == [], "the task was killed and removed"
    assert "did not come back" in (sandbox / "executor.log").read_text()


def test_process_runtime_task(env: dict[str, Any]) -> None:
    agent: FakeAgent = env["agent"]
    _, pid, sandbox = start_executor(env, "--runtime", "process")
    task = make_task("t1", "echo from-a-process; exit 4", "")
    task.container.type = common_pb2.ContainerInfo.CONTAINER_TYPE_PROCESS
    agent.launch(task, env["framework_id"])
    agent.run_until(lambda: tasks.FAILED in agent.states(), 20.0, "no TASK_FAILED")
    failed = next(s for s in agent.updates if s.state == tasks.FAILED)
    assert failed.exit_code == 4 and failed.message == "exited with 4"
    agent.run_until(lambda: _gone(pid), 15.0, "executor did not exit")
    assert b"from-a-process" in (sandbox / "stdout").read_bytes()


def test_missing_image_fails_task(env: dict[str, Any]) -> None:
    agent: FakeAgent = env["agent"]
    _, pid, _ = start_executor(env)
    agent.launch(make_task("t1", "true", "offerbus/absent:never"), env["framework_id"])
    agent.run_until(lambda: tasks.FAILED in agent.states(), 10.0, "no TASK_FAILED")
    failed = next(s for s in agent.updates if s.state == tasks.FAILED)
    assert failed.reason == common_pb2.TaskStatus.REASON_IMAGE_NOT_FOUND
    agent.run_until(lambda: _gone(pid), 15.0, "executor did not exit")


def test_fork_server_restarts_and_executors_outlive_it(env: dict[str, Any]) -> None:
    agent: FakeAgent = env["agent"]
    launcher: ExecutorLauncher = env["launcher"]
    executor_id, pid, _ = start_executor(env)
    agent.launch(make_task("t1", "sleep 3600", env["image"]), env["framework_id"])
    agent.run_until(lambda: tasks.RUNNING in agent.states(), 20.0, "no TASK_RUNNING")

    server_pid = launcher.pid
    assert server_pid is not None
    os.kill(server_pid, signal.SIGKILL)  # the fork server dies (we started it)
    _, pid2, _ = start_executor(env)  # restarted once, transparently
    assert launcher.restarts == 1 and launcher.pid != server_pid
    assert not _gone(pid) and not _gone(pid2), "executors do not depend on the fork server"
    assert containers(env, executor_id)[0]["State"] == "running"

    # 20 executors at once: the cost of a launch is a fork, not an interpreter start.
    before = len(agent.subscribes)
    started = time.monotonic()
    for i in range(20):
        eid = f"burst-{i}-{uuid.uuid4().hex[:6]}"
        env["pids"].append(launcher.launch(eid, [
            "--agent", agent.endpoint, "--executor-id", eid, "--framework-id",
            env["framework_id"], "--work-dir", str(env["dir"] / "sandboxes" / eid)]))
    forked = time.monotonic()
    agent.run_until(lambda: len(agent.subscribes) >= before + 20, 30.0, "burst not subscribed")
    print(f"20 executors: forked in {1000 * (forked - started):.0f} ms, all subscribed in "
          f"{1000 * (time.monotonic() - started):.0f} ms")


def test_sigterm_kills_the_task_and_exits(env: dict[str, Any]) -> None:
    agent: FakeAgent = env["agent"]
    executor_id, pid, _ = start_executor(env)
    agent.launch(make_task("t1", "sleep 3600", env["image"], grace=0.5), env["framework_id"])
    agent.run_until(lambda: tasks.RUNNING in agent.states(), 20.0, "no TASK_RUNNING")
    os.kill(pid, signal.SIGTERM)  # our executor, by pid
    agent.run_until(lambda: tasks.KILLED in agent.states(), 10.0, "no TASK_KILLED")
    agent.run_until(lambda: _gone(pid), 15.0, "executor did not exit")
    assert containers(env, executor_id) == []


def health_task(script: str, check_script: str, image: str, failures: int) -> \
        common_pb2.TaskInfo:
    task = make_task("t1", script, image, grace=0.5)
    hc = task.health_check
    hc.command.command.shell = True
    hc.command.command.value = check_script
    hc.delay_s, hc.interval_s, hc.timeout_s = 0.2, 0.3, 5.0
    hc.consecutive_failures = failures
    return task


def test_failing_health_check_reports_unhealthy_then_kills(env: dict[str, Any]) -> None:
    agent: FakeAgent = env["agent"]
    executor_id, pid, _ = start_executor(env)
    agent.launch(health_task("sleep 3600", "echo no-such-file >&2; exit 1", env["image"], 3),
                 env["framework_id"])
    agent.run_until(lambda: tasks.KILLED in agent.states(), 30.0, "no TASK_KILLED")
    by_uuid = list({s.uuid: s for s in agent.updates}.values())
    updated = common_pb2.TaskStatus.REASON_TASK_HEALTH_CHECK_STATUS_UPDATED
    health = [s for s in by_uuid if s.reason == updated]
    assert [(s.state, s.healthy) for s in health] == [(tasks.RUNNING, False)]
    killed = next(s for s in by_uuid if s.state == tasks.KILLED)
    assert killed.reason == common_pb2.TaskStatus.REASON_HEALTH_CHECK_FAILED
    assert "3 times in a row" in killed.message and "no-such-file" in killed.message
    assert agent.states() == [tasks.STARTING, tasks.RUNNING, tasks.RUNNING, tasks.KILLING,
                              tasks.KILLED]
    agent.run_until(lambda: _gone(pid), 15.0, "executor did not exit")
    assert containers(env, executor_id) == []


def test_passing_health_check_reports_healthy(env: dict[str, Any]) -> None:
    agent: FakeAgent = env["agent"]
    executor_id, _, _ = start_executor(env)
    # Healthy once the task wrote its file: a check inside the container (docker exec).
    agent.launch(health_task("touch /tmp/ready; sleep 3600", "test -f /tmp/ready", env["image"],
                             1), env["framework_id"])
    reason = common_pb2.TaskStatus.REASON_TASK_HEALTH_CHECK_STATUS_UPDATED
    agent.run_until(lambda: any(s.reason == reason for s in agent.updates), 30.0,
                    "health never reported")
    [healthy] = list({s.uuid: s for s in agent.updates if s.reason == reason}.values())
    assert healthy.state == tasks.RUNNING and healthy.healthy is True
    assert "healthy" in healthy.message
    [container] = containers(env, executor_id)
    assert container["State"] == "running"
    agent.kill("t1")
    agent.run_until(lambda: tasks.KILLED in agent.states(), 10.0, "no TASK_KILLED")
    killed = next(s for s in agent.updates if s.state == tasks.KILLED)
    assert killed.reason != common_pb2.TaskStatus.REASON_HEALTH_CHECK_FAILED
    assert killed.healthy is True, "the last known health rides on later updates"
