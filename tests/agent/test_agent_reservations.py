"""The agent's reservations: the master's CheckpointResources is saved in the work dir and
reported as the agent's resources from then on, across agent restarts and master failovers,
only when it fits the agent's flags (same quantities per resource name)."""

from __future__ import annotations

from pathlib import Path

import pytest

from schemas import agent_pb2
from services.agent.checkpoint import AgentCheckpoint, CheckpointCorrupt
from services.agent.core import AgentCore, Command, SaveResources, ToMaster
from services.master.commands import Command as MasterCommand
from services.master.commands import ToAgent
from services.master.core import MasterCore
from services.notice import Notice
from services.resources import Resources
from tests.agent.test_agent_core import durable, info, registered
from tests.master.helpers import T0, broker_msgs, subscribed
from tests.master.test_master_reservations import accept, launch_op, reserve

FLAGS = "cpus:2;mem:1024"  # test_agent_core.info()'s
RESERVED = "cpus(web):1;cpus:1;mem:1024"


def checkpoint_event(res: str) -> agent_pb2.AgentEvent:
    return agent_pb2.AgentEvent(checkpoint_resources=agent_pb2.AgentEvent.CheckpointResources(
        resources=Resources.parse(res).to_proto()))


def reported(core: AgentCore, now: float) -> Resources:
    """What the agent says it has when it re-registers (with a master that admits it)."""
    call = next(c for c in core.master_detected(now) if isinstance(c, ToMaster)).call
    assert call.WhichOneof("call") == "reregister"
    ev = agent_pb2.AgentEvent()
    ev.reregistered.agent_id, ev.reregistered.cluster_id = core.agent_id, "C1"
    durable(core, core.master_event(ev, now), now)
    return Resources.from_proto(call.reregister.agent_info.resources)


def notices(cmds: list[Command]) -> list[str]:
    return [c.kind for c in cmds if isinstance(c, Notice)]


def play(store: AgentCheckpoint, cmds: list[Command]) -> list[Command]:
    """The shell's disk for SaveResources."""
    for c in cmds:
        if isinstance(c, SaveResources):
            store.save_resources(c.resources)
    return cmds


def restarted(store: AgentCheckpoint, agent_id: str, flags: str = FLAGS,
              ) -> tuple[AgentCore, list[Command]]:
    """A new agent process on the same work dir, as the shell starts it."""
    i = info()
    i.agent_id = agent_id
    del i.resources[:]
    i.resources.extend(Resources.parse(flags).to_proto())
    core = AgentCore(i, now=10.0)
    saved = store.load_resources()
    return core, (core.recover_resources(saved) if saved is not None else [])


def test_the_masters_checkpoint_is_saved_and_reported_across_a_restart(tmp_path: Path) -> None:
    store = AgentCheckpoint(tmp_path)
    core = AgentCore(info(), now=0.0)
    registered(core)
    cmds = play(store, durable(core, core.master_event(checkpoint_event(RESERVED), 1.0), 1.0))
    assert [c.resources for c in cmds if isinstance(c, SaveResources)] == [
        tuple(Resources.parse(RESERVED).to_proto())]
    assert reported(core, 2.0) == Resources.parse(RESERVED)
    # The same checkpoint again changes nothing and writes nothing.
    assert not [c for c in core.master_event(checkpoint_event(RESERVED), 3.0)
                if isinstance(c, SaveResources)]
    again, cmds = restarted(store, core.agent_id)
    assert notices(cmds) == ["resources_recovered"]
    assert reported(again, 11.0) == Resources.parse(RESERVED)
    assert again.resources.flags == Resources.parse(FLAGS)
    # An UNRESERVE back to the flags is a checkpoint too, and survives the next restart.
    play(store, durable(again, again.master_event(checkpoint_event(FLAGS), 12.0), 12.0))
    third, _ = restarted(store, core.agent_id)
    assert reported(third, 13.0) == Resources.parse(FLAGS)


def test_a_checkpoint_that_does_not_fit_the_flags_is_refused() -> None:
    core = AgentCore(info(), now=0.0)
    registered(core)
    for res in ("cpus(web):2;cpus:1;mem:1024", "cpus(web):1;mem:1024", "cpus:2;mem:1024;gpus:1"):
        cmds = core.master_event(checkpoint_event(res), 1.0)
        assert notices(cmds) == ["resources_checkpoint_refused"], res
        assert not [c for c in cmds if isinstance(c, SaveResources)]
        assert reported(core, 2.0) == Resources.parse(FLAGS)
    bad = agent_pb2.AgentEvent()
    bad.checkpoint_resources.resources.add(name="cpus", scalar=-1.0)
    assert notices(core.master_event(bad, 3.0)) == ["resources_checkpoint_refused"]


def test_a_checkpoint_made_under_other_flags_is_ignored_with_a_warning(tmp_path: Path) -> None:
    store = AgentCheckpoint(tmp_path)
    store.save_resources(Resources.parse(RESERVED).to_proto())
    core, cmds = restarted(store, "S1", flags="cpus:4;mem:1024")  # the operator added cpus
    [warning] = [c for c in cmds if isinstance(c, Notice)]
    assert (warning.kind, warning.level) == ("resources_checkpoint_ignored", "warning")
    assert "do not fit the agent's flags" in warning.message
    assert reported(core, 11.0) == Resources.parse("cpus:4;mem:1024")
    # Static reservations in the flags are the base too: a checkpoint moves them only within
    # the same quantities.
    core, cmds = restarted(store, "S1", flags="cpus(web):1;cpus:1;mem:1024")
    assert notices(cmds) == ["resources_recovered"]
    assert reported(core, 11.0) == Resources.parse(RESERVED)


def test_an_unreadable_resources_checkpoint_stops_the_agent(tmp_path: Path) -> None:
    store = AgentCheckpoint(tmp_path)
    assert store.load_resources() is None
    store.resources_path.write_bytes(b"\xff\xff\xff")
    with pytest.raises(CheckpointCorrupt):
        store.load_resources()


def test_a_reservation_survives_an_agent_restart_and_a_master_failover(tmp_path: Path) -> None:
    """Issue 9: the agent core and the master core together. A framework of role web
    reserves cpus(web):1 and runs a task on it; the agent restarts, the master fails over,
    the agent re-registers with the new leader: admitted, with its reservation (before, the
    agent never learnt it and the new master refused it: 'its tasks use cpus(web):1, more
    than its resources')."""
    store = AgentCheckpoint(tmp_path)
    master = MasterCore("m1", 7, now=T0)
    agent = AgentCore(info(), now=T0)

    def deliver(core: AgentCore, cmds: list[MasterCommand], now: float) -> list[Command]:
        out: list[Command] = []
        for c in cmds:
            if isinstance(c, ToAgent):
                out += play(store, durable(core, core.master_event(c.event, now), now))
        return out

    call = next(c for c in agent.master_detected(T0) if isinstance(c, ToMaster)).call
    deliver(agent, master.agent_call(b"a1", call, T0), T0)
    aid = agent.agent_id
    fid = subscribed(master, b"f1", role="web")
    cmds = accept(master, fid, aid, reserve("cpus(web):1"), launch_op("t1", "cpus(web):1"))
    assert broker_msgs(cmds, "launch_result")[0].accepted
    deliver(agent, cmds, T0 + 1)
    assert [t.task_id for t in (ex.task for ex in agent.executors.values())] == ["t1"]

    state = agent.state()  # the agent restarts on its work dir
    flags = info()
    flags.agent_id = aid  # as the shell builds it: the flags, the checkpointed id
    again = AgentCore(flags, now=T0 + 5, recovered=state)
    again.recover_resources(store.load_resources() or [])
    new = MasterCore("m2", 8, recovered_registry=master.registry_document(), now=T0 + 10)
    call = next(c for c in again.master_detected(T0 + 10) if isinstance(c, ToMaster)).call
    assert call.WhichOneof("call") == "reregister"
    cmds = new.agent_call(b"a1-new", call, T0 + 10)
    assert [c.event.WhichOneof("event") for c in cmds if isinstance(c, ToAgent)][:1] == [
        "reregistered"], cmds
    assert new.agents[aid].total == Resources.parse(RESERVED)
    assert (fid, "t1") in new.tasks
    new.validate()
