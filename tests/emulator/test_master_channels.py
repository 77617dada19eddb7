"""The real master shell, in process, with two virtual agents on one DEALER (two channels):
they register as two agents, each is answered on its own channel, one cannot speak for the
other, and when the connection goes silent both are declared unreachable."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import zmq

from schemas import agent_pb2, bus_pb2, common_pb2
from services.bus import codec
from services.bus.peer import DealerClient, HeartbeatConfig, Sender
from services.master.records import REGISTERED, UNREACHABLE
from services.master.shell import MasterConfig, MasterShell
from services.resources import Resources


@pytest.fixture
def master(tmp_path: Path) -> Iterator[MasterShell]:
    shell = MasterShell(MasterConfig("m1", f"file://{tmp_path}", f"file://{tmp_path}",
                                     heartbeat_interval=0.05, max_missed=20,
                                     agent_timeout_s=0.5))
    try:
        assert shell.reactor.run(until=lambda: shell.core is not None, timeout=10)
        yield shell
    finally:
        shell.close()


def call(env_call: agent_pb2.AgentCall) -> codec.Envelope:
    env = codec.Envelope()
    env.agent_call.CopyFrom(env_call)
    return env


def register(name: str) -> codec.Envelope:
    info = common_pb2.AgentInfo(hostname=name,
                                resources=Resources.parse("cpus:2;mem:512").to_proto())
    return call(agent_pb2.AgentCall(register=agent_pb2.AgentCall.Register(agent_info=info)))


def test_two_virtual_agents_on_one_connection_are_two_agents(master: MasterShell) -> None:
    ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
    got: list[codec.Envelope] = []
    client = DealerClient(master.reactor, ctx, Sender("emulator", codec.Role.Value(
        "ROLE_AGENT")), got.append, heartbeat=HeartbeatConfig(0.05, 20))
    try:
        client.connect(master.front.endpoint)
        assert client.send(register("v1"), channel="v1")
        assert client.send(register("v2"), channel="v2")
        assert master.reactor.run(until=lambda: len(got) == 2, timeout=5)
        ids = {e.channel: e.agent_event.registered.agent_id for e in got}
        assert set(ids) == {"v1", "v2"} and len(set(ids.values())) == 2 and all(ids.values())
        core = master.core
        assert core is not None
        assert {core.agents[a].info.hostname for a in ids.values()} == {"v1", "v2"}
        assert all(core.agents[a].status == REGISTERED for a in ids.values())
        # v2 cannot speak for v1: its channel is not v1's registration.
        update = agent_pb2.AgentCall(agent_id=ids["v1"])
        update.status_updates.SetInParent()
        assert client.send(call(update), channel="v2")
        assert master.reactor.run(until=lambda: len(got) == 3, timeout=5)
        assert got[2].channel == "v2" and got[2].error.code == bus_pb2.NOT_REGISTERED
        # On v1's own channel the same call is accepted (nothing comes back).
        assert client.send(call(update), channel="v1")
        master.reactor.run(timeout=0.3)
        assert len(got) == 3
        # The connection falls silent: both its agents are declared unreachable.
        client.close()
        assert master.reactor.run(until=lambda: all(
            core.agents[a].status == UNREACHABLE for a in ids.values()), timeout=5)
    finally:
        client.close()
        ctx.destroy(linger=0)
