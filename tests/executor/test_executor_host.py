"""Executor hosts through the real fork server (ExecutorLauncher), with process-runtime tasks
against a test that plays the agent on a real ROUTER: the tasks of one framework share a host
process, yet one task's kill or crash never ends another's; frameworks get separate hosts, so a
host killed takes only its own framework's tasks; a fork server that crashed is restarted on the
next launch and the tasks already running are untouched; an idle host exits."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import tempfile
import uuid
from collections.abc import Iterator
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
from services.executor.process_runtime import RECORD
from services.procs import pid_alive

AGENT_ID = "agent-test"
ROLE_AGENT = codec.Role.Value("ROLE_AGENT")


class Agent:
    """The agent's side of the executor protocol for many executors: launches each task
    when its executor subscribes, acknowledges every update, records them by task."""

    def __init__(self, ctx: zmq.Context[zmq.Socket[bytes]], endpoint: str) -> None:
        self.reactor = Reactor()
        self.endpoint = endpoint
        self.peers: dict[str, bytes] = {}  # executor id -> peer
        self.tasks: dict[str, tuple[common_pb2.TaskInfo, str]] = {}  # executor -> task, fw
        self.updates: dict[str, list[tasks.State]] = {}  # task id -> states in order
        self.server = RouterServer(self.reactor, ctx, endpoint, Sender(AGENT_ID, ROLE_AGENT),
                                   self._on_message, name="agent")

    def _send(self, peer: bytes, fill: Any) -> None:
        env = codec.Envelope()
        fill(env.executor_event)
        self.server.send(peer, env)

    def _on_message(self, peer: bytes, env: codec.Envelope) -> None:
        call = env.executor_call
        if call.WhichOneof("call") == "subscribe":
            self.peers[call.executor_id] = peer
            self._send(peer, lambda ev: setattr(ev.subscribed, "agent_id", AGENT_ID))
            task, fw = self.tasks[call.executor_id]

            def launch(ev: executor_pb2.ExecutorEvent) -> None:
                ev.launch.framework_id = fw
                ev.launch.task.CopyFrom(task)
            if task.task_id not in self.updates:
                self.updates[task.task_id] = []
                self._send(peer, launch)
        elif call.WhichOneof("call") == "update":
            status = call.update.status
            states = self.updates.setdefault(status.task_id, [])
            if not states or states[-1] != status.state:
                states.append(status.state)

            def ack(ev: executor_pb2.ExecutorEvent) -> None:
                ev.acknowledged.task_id = status.task_id
                ev.acknowledged.uuid = status.uuid
            self._send(peer, ack)

    def kill(self, executor_id: str, task_id: str) -> None:
        def fill(ev: executor_pb2.ExecutorEvent) -> None:
            ev.kill.task_id = task_id
            ev.kill.kill_grace_period_s = 0.5
        self._send(self.peers[executor_id], fill)

    def state(self, task_id: str) -> tasks.State | None:
        states = self.updates.get(task_id)
        return states[-1] if states else None

    def run_until(self, cond: Any, timeout: float, what: str) -> None:
        if not self.reactor.run(until=lambda: bool(cond()), timeout=timeout):
            seen = {t: [tasks.name(s) for s in v] for t, v in self.updates.items()}
            raise AssertionError(f"{what} (waited {timeout:g}s); updates: {seen}")


@pytest.fixture
def env() -> Iterator[dict[str, Any]]:
    short = Path(tempfile.mkdtemp(prefix="obh-", dir="/tmp"))  # ipc paths must stay short
    ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
    launcher = ExecutorLauncher(short / "agent")
    agent = Agent(ctx, f"ipc://{short}/executors.sock")
    state: dict[str, Any] = {"dir": short, "launcher": launcher, "agent": agent, "pids": set()}
    try:
        yield state
    finally:
        for pid in state["pids"]:  # hosts this test started
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        for record in short.glob(f"agent/sandboxes/*/{RECORD}"):
            with contextlib.suppress(OSError, ValueError, KeyError):  # the tasks' processes
                os.killpg(json.loads(record.read_text())["pid"], signal.SIGKILL)
        agent.server.close()
        launcher.close()
        ctx.destroy(linger=0)
        shutil.rmtree(short, ignore_errors=True)


def launch(env: dict[str, Any], framework_id: str, script: str) -> tuple[str, str, int]:
    """Start an executor for a new process task; returns (executor id, task id, pid)."""
    agent: Agent = env["agent"]
    task_id = f"t-{uuid.uuid4().hex[:6]}"
    executor_id = f"{task_id}.e"
    task = common_pb2.TaskInfo(task_id=task_id, name=task_id, agent_id=AGENT_ID)
    task.command.shell = True
    task.command.value = script
    task.kill_grace_period_s = 0.5
    agent.tasks[executor_id] = (task, framework_id)
    sandbox = env["dir"] / "agent" / "sandboxes" / executor_id
    argv = ["--agent", agent.endpoint, "--executor-id", executor_id, "--framework-id",
            framework_id, "--task-id", task_id, "--agent-id", AGENT_ID, "--work-dir",
            str(sandbox), "--runtime", "process", "--recovery-timeout", "5"]
    pid = env["launcher"].launch(executor_id, argv)
    env["pids"].add(pid)
    return executor_id, task_id, pid


def running(env: dict[str, Any], *task_ids: str) -> None:
    agent: Agent = env["agent"]
    agent.run_until(lambda: all(agent.state(t) == tasks.RUNNING for t in task_ids), 20.0,
                    "tasks not RUNNING")


def test_one_frameworks_tasks_share_a_host_and_a_kill_ends_only_its_task(
        env: dict[str, Any]) -> None:
    agent: Agent = env["agent"]
    ex_a, task_a, pid_a = launch(env, "fw-1", "sleep 60")
    ex_b, task_b, pid_b = launch(env, "fw-1", "sleep 60")
    assert pid_a == pid_b, "one host process serves a framework's executors"
    running(env, task_a, task_b)
    agent.kill(ex_a, task_a)
    agent.run_until(lambda: agent.state(task_a) == tasks.KILLED, 10.0, "no TASK_KILLED")
    # B's executor still answers: a kill of B now is served, so it was alive all along.
    assert agent.state(task_b) == tasks.RUNNING and pid_alive(pid_b)
    agent.kill(ex_b, task_b)
    agent.run_until(lambda: agent.state(task_b) == tasks.KILLED, 10.0, "B not served")


def test_a_crashing_task_does_not_disturb_its_neighbour(env: dict[str, Any]) -> None:
    agent: Agent = env["agent"]
    _, task_a, pid = launch(env, "fw-1", "sleep 0.5; kill -SEGV $$")
    ex_b, task_b, _ = launch(env, "fw-1", "sleep 60")
    agent.run_until(lambda: agent.state(task_a) == tasks.FAILED, 20.0, "A did not fail")
    assert agent.state(task_b) == tasks.RUNNING and pid_alive(pid)
    ex_c, task_c, pid_c = launch(env, "fw-1", "sleep 60")  # the host takes more work
    assert pid_c == pid
    running(env, task_b, task_c)
    for ex, task in ((ex_b, task_b), (ex_c, task_c)):
        agent.kill(ex, task)
    agent.run_until(lambda: agent.state(task_b) == agent.state(task_c) == tasks.KILLED, 10.0,
                    "not killed")


def test_frameworks_have_separate_hosts_and_a_killed_host_ends_only_its_own(
        env: dict[str, Any]) -> None:
    agent: Agent = env["agent"]
    _, task_a, pid_a = launch(env, "fw-1", "sleep 60")
    ex_b, task_b, pid_b = launch(env, "fw-2", "sleep 60")
    assert pid_a != pid_b, "frameworks never share a host"
    running(env, task_a, task_b)
    os.kill(pid_a, signal.SIGKILL)
    agent.run_until(lambda: not pid_alive(pid_a), 10.0, "host A still alive")
    ex_c, task_c, pid_c = launch(env, "fw-1", "sleep 60")  # fw-1 gets a new host
    assert pid_c not in (pid_a, pid_b)
    running(env, task_b, task_c)
    assert agent.state(task_b) == tasks.RUNNING
    agent.kill(ex_b, task_b)
    agent.kill(ex_c, task_c)
    agent.run_until(lambda: agent.state(task_b) == agent.state(task_c) == tasks.KILLED, 10.0,
                    "not killed")


def test_a_crashed_fork_server_is_restarted_and_running_tasks_stay(env: dict[str, Any]) -> None:
    agent: Agent = env["agent"]
    launcher: ExecutorLauncher = env["launcher"]
    ex_a, task_a, pid_a = launch(env, "fw-1", "sleep 60")
    running(env, task_a)
    server = launcher.pid
    assert server is not None
    os.kill(server, signal.SIGKILL)
    agent.run_until(lambda: not pid_alive(server), 10.0, "fork server still alive")
    ex_b, task_b, pid_b = launch(env, "fw-1", "sleep 60")  # restarts the fork server
    assert launcher.restarts == 1 and launcher.pid != server
    running(env, task_a, task_b)
    assert pid_alive(pid_a), "the host of the running task outlived its fork server"
    # The old host serves its task to the end, then exits (it can be sent no more).
    agent.kill(ex_a, task_a)
    agent.run_until(lambda: agent.state(task_a) == tasks.KILLED, 10.0, "A not served")
    agent.run_until(lambda: not pid_alive(pid_a), 10.0, "the orphaned host did not exit")
    assert pid_alive(pid_b) and agent.state(task_b) == tasks.RUNNING
    agent.kill(ex_b, task_b)
    agent.run_until(lambda: agent.state(task_b) == tasks.KILLED, 10.0, "B not served")


def test_an_idle_host_exits_and_the_next_launch_gets_a_new_one(env: dict[str, Any]) -> None:
    agent: Agent = env["agent"]
    _, task_a, pid_a = launch(env, "fw-1", "true")
    agent.run_until(lambda: agent.state(task_a) == tasks.FINISHED, 20.0, "A not finished")
    agent.run_until(lambda: not pid_alive(pid_a), 15.0, "the idle host did not exit")
    ex_b, task_b, pid_b = launch(env, "fw-1", "sleep 60")
    assert pid_b != pid_a
    running(env, task_b)
    agent.kill(ex_b, task_b)
    agent.run_until(lambda: agent.state(task_b) == tasks.KILLED, 10.0, "B not served")
