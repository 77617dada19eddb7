"""The master shell, in process with real sockets and a real (file) registry and election:
registry I/O never blocks the reactor (writes and the load at leadership run on the writer's
thread), and agent liveness end to end — a silent agent is declared unreachable within its
timeout, a stalled master declares nobody, and an agent heard again on its old connection is
asked to re-register and is reconciled."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import zmq

from schemas import agent_pb2, bus_pb2, common_pb2, internal_pb2
from services.bus import codec
from services.bus.peer import DealerClient, HeartbeatConfig, Sender
from services.bus.reactor import Reactor
from services.cli.keys import generate
from services.master import shell as master_shell
from services.master.records import REGISTERED, UNREACHABLE
from services.master.registry import Document, FileRegistry
from services.master.shell import MasterConfig, MasterShell
from services.resources import Resources
from tests.waiting import wait_for


class SlowRegistry(FileRegistry):
    """A real file registry whose I/O hangs until released (at most `hold` s): ZooKeeper
    away, a slow disk."""

    def __init__(self, path: Path, hold: float = 3.0) -> None:
        super().__init__(path)
        self.hold = hold
        self.release = threading.Event()
        self.calls: list[str] = []

    def _wait(self, what: str) -> None:
        self.calls.append(what)
        self.release.wait(self.hold)

    def load(self) -> Document | None:
        self._wait("load")
        return super().load()

    def write(self, data: bytes, epoch: int) -> None:
        self._wait("write")
        super().write(data, epoch)

    def store(self, document: Document, epoch: int) -> None:  # the registry's old interface
        self._wait("write")


def master_on(tmp_path: Path, **kw: Any) -> MasterShell:
    return MasterShell(MasterConfig("m1", f"file://{tmp_path}", f"file://{tmp_path}", **kw))


def lead(master: MasterShell, timeout: float = 10.0) -> None:
    assert master.reactor.run(until=lambda: master.core is not None, timeout=timeout), \
        "the master never began leading"


@pytest.fixture
def slow(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> SlowRegistry:
    registry = SlowRegistry(tmp_path / "master.registry")
    monkeypatch.setattr(master_shell, "registry_from_url", lambda url: registry)
    return registry


def test_a_master_with_curve_keys_only_for_serving_starts_and_does_not_follow(
        tmp_path: Path) -> None:
    """A master configured as a CURVE server only (it admits peers, connects to nobody)
    cannot follow another master's stream: it says so once and starts as before. The
    follower asked for client keys unconditionally, and such a master failed to start."""
    for name in ("server", "agent"):
        generate(tmp_path / "keys", name)
    (tmp_path / "allowed").mkdir()
    master = master_on(tmp_path, curve_secret_key_file=str(tmp_path / "keys" /
                                                          "server.key_secret"),
                       curve_allowed_dir=str(tmp_path / "allowed"))
    try:
        assert "curve_server_key_file" in master.follower.off
        lead(master)
        master.follower.follow()
        assert master.follower.subscriber is None
    finally:
        master.close()


def test_the_registry_load_at_leadership_does_not_block_the_reactor(
    tmp_path: Path, slow: SlowRegistry,
) -> None:
    master = master_on(tmp_path)
    try:
        held: list[float] = []
        assert master.leader is not None
        lead_ = master.leader._lead  # (the kit's: epoch stamped, then the shell's _lead)

        def timed_lead(epoch: int) -> None:
            started = time.monotonic()
            lead_(epoch)
            held.append(time.monotonic() - started)

        master.leader._lead = timed_lead
        assert master.reactor.run(until=lambda: bool(held), timeout=10)
        assert held[0] < master_shell.REGISTRY_LOAD_WAIT_S + 0.2, "the load held the reactor"
        assert slow.calls == ["load"]
        assert master.core is None  # loading on the writer's thread, not on the reactor
        started = time.monotonic()
        master.reactor.run(timeout=0.3)
        assert time.monotonic() - started < 1.0
        assert master.core is None
        slow.release.set()
        lead(master)
    finally:
        slow.release.set()
        master.close()


def test_registry_writes_do_not_block_the_reactor(tmp_path: Path, slow: SlowRegistry) -> None:
    master = master_on(tmp_path)
    try:
        slow.release.set()
        lead(master)
        slow.release.clear()
        started = time.monotonic()
        for i in range(5):
            master._persist({"cluster_id": "c", "agents": {}, "frameworks": {f"F{i}": {}},
                             "roles": {}})
        assert time.monotonic() - started < 0.5, "a registry write ran on the reactor"
        slow.release.set()
        assert master.registry.flush(10)
        assert FileRegistry(tmp_path / "master.registry").load() == {
            "cluster_id": "c", "agents": {}, "frameworks": {"F4": {}}, "roles": {}, "jobs": {}}
    finally:
        slow.release.set()
        master.close()


# -- agent liveness, end to end ------------------------------------------------------------


class Agent:
    """A bus client that registers as an agent and then only beats (on its own reactor and
    thread, like a real agent process); `stop()` silences it (SIGSTOP), `start()` resumes it.
    Asked to re-register, it does."""

    def __init__(self, endpoint: str) -> None:
        self.reactor = Reactor()
        self.ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
        self.got: list[codec.Envelope] = []
        self.agent_id = ""
        # It never gives up on the master during the test's stalls (max_missed huge).
        self.client = DealerClient(self.reactor, self.ctx, Sender("agent", codec.Role.Value(
            "ROLE_AGENT")), self._on_message, heartbeat=HeartbeatConfig(0.05, 100_000))
        self.client.connect(endpoint)
        self._send(agent_pb2.AgentCall(register=agent_pb2.AgentCall.Register(
            agent_info=self._info())))
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def _info(self) -> common_pb2.AgentInfo:
        return common_pb2.AgentInfo(agent_id=self.agent_id, hostname="vm-1",
                                    resources=Resources.parse("cpus:2;mem:512").to_proto())

    def _send(self, call: agent_pb2.AgentCall) -> None:
        env = codec.Envelope()
        env.agent_call.CopyFrom(call)
        assert self.client.send(env)

    def _on_message(self, env: codec.Envelope) -> None:
        self.got.append(env)
        kind = env.agent_event.WhichOneof("event") if env.HasField("agent_event") else None
        if kind in ("registered", "reregistered"):
            self.agent_id = getattr(env.agent_event, kind).agent_id
        elif env.HasField("error") and env.error.code == bus_pb2.NOT_REGISTERED:
            self._send(agent_pb2.AgentCall(agent_id=self.agent_id, reregister=agent_pb2
                                           .AgentCall.Reregister(agent_info=self._info())))

    def start(self) -> None:
        self._stop.clear()
        self._thread = threading.Thread(target=self.reactor.run,
                                        kwargs={"until": self._stop.is_set}, daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        assert self._thread is not None
        self._thread.join(5)

    def close(self) -> None:
        if self._thread is not None and self._thread.is_alive():
            self.stop()
        self.client.disconnect()
        self.ctx.destroy(linger=0)


@pytest.fixture
def master(tmp_path: Path) -> Iterator[MasterShell]:
    shell = master_on(tmp_path, heartbeat_interval=0.05, max_missed=100_000,
                      agent_timeout_s=0.5)
    try:
        lead(shell)
        yield shell
    finally:
        shell.close()


def status(master: MasterShell, agent_id: str) -> int | None:
    assert master.core is not None
    rec = master.core.agents.get(agent_id)
    return rec.status if rec is not None else None


def test_a_silent_agent_is_unreachable_within_its_timeout_and_asked_back_when_heard(
    master: MasterShell,
) -> None:
    agent = Agent(master.front.endpoint)
    agent.start()
    try:
        assert master.reactor.run(until=lambda: bool(agent.agent_id), timeout=5)
        aid = agent.agent_id
        master.reactor.run(timeout=1.5)  # 3 timeouts of heartbeats: still registered
        assert status(master, aid) == REGISTERED
        agent.stop()  # SIGSTOP: its connection stays, nothing comes on it
        silent_at = time.monotonic()
        assert master.reactor.run(until=lambda: status(master, aid) == UNREACHABLE,
                                  timeout=3)
        took = time.monotonic() - silent_at
        assert 0.4 < took < 0.5 + 0.5, f"declared unreachable after {took:.2f} s"
        agent.start()  # SIGCONT: heartbeats resume on the old connection
        assert master.reactor.run(until=lambda: status(master, aid) == REGISTERED, timeout=5)
        wait_for(lambda: any(e.agent_event.WhichOneof("event") == "reregistered"
                             for e in list(agent.got)), 5, message="never re-registered")
        assert any(e.HasField("error") and e.error.code == bus_pb2.NOT_REGISTERED
                   for e in agent.got)
    finally:
        agent.close()


def test_a_stalled_master_declares_no_agent_that_kept_beating(master: MasterShell) -> None:
    agent = Agent(master.front.endpoint)
    agent.start()
    try:
        assert master.reactor.run(until=lambda: bool(agent.agent_id), timeout=5)
        aid = agent.agent_id
        master.reactor.run(timeout=0.5)
        for _ in range(3):
            # A handler holds the master's reactor for 4 agent timeouts (a slow call, a
            # loaded machine), while the agent keeps beating.
            master.reactor.call_later(0, lambda: time.sleep(2.0))
            master.reactor.run(timeout=2.3)
            assert status(master, aid) == REGISTERED
        master.reactor.run(timeout=1.0)
        assert status(master, aid) == REGISTERED
    finally:
        agent.close()


# -- revocation metrics --------------------------------------------------------------------


def test_revocation_counts_are_exported_and_outlive_the_reign(tmp_path: Path) -> None:
    master = master_on(tmp_path)
    try:
        lead(master)
        core = master.core
        assert core is not None
        revoke = internal_pb2.InternalMessage(revoke_resources=internal_pb2.InternalMessage
                                              .RevokeResources(framework_id="nobody",
                                                               agent_id="nowhere"))
        master.driver.step(lambda now: core.internal_message(b"broker", revoke, now))

        def lines() -> list[str]:
            text = master.metrics.exposition().decode()
            return [ln for ln in text.splitlines() if "revo" in ln and not ln.startswith("#")]

        assert 'offerbus_master_revocations_total{outcome="ignored"} 1.0' in lines()
        assert 'offerbus_master_revocations_total{outcome="requested"} 0.0' in lines()
        assert "offerbus_master_tasks_revoked_total 0.0" in lines()
        master._step_down("test")  # a new reign's core starts at 0: the counter does not
        assert master.core is None
        assert 'offerbus_master_revocations_total{outcome="ignored"} 1.0' in lines()
    finally:
        master.close()


def test_an_error_from_a_peer_is_counted_not_answered(master: MasterShell) -> None:
    """A fenced heartbeat from a stale master is answered by the agent with an error; the
    master answered that error with another ("takes agent, scheduler and operator calls,
    not error"). An error is counted and logged; answering it could only ping-pong."""
    agent = Agent(master.front.endpoint)
    try:
        assert agent.client.send(codec.error_envelope(bus_pb2.NOT_LEADER, "fenced (stale)"))
        odd = codec.Envelope()
        odd.internal.SetInParent()  # a kind the front does not take: answered
        assert agent.client.send(odd)
        agent.start()

        def answers(kind: str) -> list[codec.Envelope]:
            return [e for e in list(agent.got)
                    if e.HasField("error") and e.error.message.endswith(f"not {kind}")]

        assert master.reactor.run(until=lambda: bool(answers("internal")), timeout=5)
        assert answers("error") == []  # answered in order: it would have come first
        assert master.stats.get("peer_errors") == 1
    finally:
        agent.close()
