"""An agent cannot impersonate another (issue 11): with CURVE, the master core binds an agent
id to the principal whose key registered it, keeps the binding in the agent's registry entry
(so a new leader keeps it), and refuses any agent call for that id from another principal,
clearly (UNAUTHORIZED) and counted (a Notice `acl_refused`), leaving the agent and its tasks
as they were. Its own principal re-registers as before; without a principal (CURVE off)
nothing is checked."""

from __future__ import annotations

import pytest

from schemas import agent_pb2, bus_pb2, common_pb2
from services.master.acl import Acl
from services.master.commands import Command, Reject
from services.master.core import MasterCore
from services.notice import Notice
from tests.master.helpers import (
    T0,
    TS,
    agent_events,
    agent_info,
    launch,
    one,
    registry,
    rejects,
    reported,
    silence,
    subscribed,
    update,
)


def call(core: MasterCore, peer: bytes, agent_call: agent_pb2.AgentCall, key: str | None,
         now: float = T0) -> list[Command]:
    return core.agent_call(peer, agent_call, now, "m-agent", principal=key)


def reregistration(aid: str, peer: bytes, tasks: list[agent_pb2.AgentCall.Reregister.Task],
                   ) -> agent_pb2.AgentCall:
    return agent_pb2.AgentCall(agent_id=aid, reregister=agent_pb2.AgentCall.Reregister(
        agent_info=agent_info(aid, peer.decode()), tasks=tasks))


def counted(cmds: list[Command]) -> list[Notice]:
    return [c for c in cmds if isinstance(c, Notice) and c.kind == "acl_refused"]


def keyed_cluster(key: str | None = "agent-a") -> tuple[MasterCore, str, str]:
    """Agent S1 registered by `key` on peer a1, framework f1 with task t1 RUNNING on it."""
    core = MasterCore("m1", 7, now=T0)
    cmds = call(core, b"a1", agent_pb2.AgentCall(register=agent_pb2.AgentCall.Register(
        agent_info=agent_info("", "a1"))), key)
    aid = agent_events(cmds, "registered")[0].event.registered.agent_id
    fid = subscribed(core, b"f1")
    launch(core, fid, aid, "t1")
    update(core, b"a1", aid, fid, "t1", TS.TASK_RUNNING, uuid=b"run")
    return core, aid, fid


def assert_untouched(core: MasterCore, aid: str, fid: str) -> None:
    agent = core.agents[aid]
    assert agent.peer == b"a1" and agent.principal == "agent-a"
    assert core.tasks[(fid, "t1")].state == TS.TASK_RUNNING
    assert agent.tasks == {(fid, "t1")}


def test_the_registering_principal_is_bound_to_the_agent_and_kept_in_the_registry() -> None:
    core = MasterCore("m1", 7, now=T0)
    cmds = call(core, b"a1", agent_pb2.AgentCall(register=agent_pb2.AgentCall.Register(
        agent_info=agent_info("", "a1"))), "agent-a")
    aid = agent_events(cmds, "registered")[0].event.registered.agent_id
    assert core.agents[aid].principal == "agent-a"
    change = registry(cmds)
    assert change is not None and change["agents"][aid]["principal"] == "agent-a"
    assert core.registry_document()["agents"][aid]["principal"] == "agent-a"  # type: ignore[index]


def test_another_principal_re_registering_the_agent_is_refused_and_counted() -> None:
    core, aid, fid = keyed_cluster()
    cmds = call(core, b"rogue", reregistration(aid, b"rogue", []), "agent-b")
    reject = one(cmds, Reject)
    assert reject.code == bus_pb2.UNAUTHORIZED
    assert reject.message == (f"agent {aid!r} belongs to principal 'agent-a'; this "
                              "connection's key is principal 'agent-b'")
    assert len(counted(cmds)) == 1
    assert not agent_events(cmds, "reregistered")
    assert_untouched(core, aid, fid)  # t1 not dropped though the rogue reported no tasks


def test_another_principal_registering_with_the_agents_id_is_refused() -> None:
    core, aid, fid = keyed_cluster()
    cmds = call(core, b"rogue", agent_pb2.AgentCall(register=agent_pb2.AgentCall.Register(
        agent_info=agent_info(aid, "rogue"))), "agent-b")
    assert [r.code for r in rejects(cmds)] == [bus_pb2.UNAUTHORIZED]
    assert len(counted(cmds)) == 1 and not agent_events(cmds, "registered")
    assert_untouched(core, aid, fid)


def test_another_principal_on_the_agents_routing_id_cannot_send_its_calls() -> None:
    """A peer that took over the agent's routing id (a ROUTER handover) with another key."""
    core, aid, fid = keyed_cluster()
    su = agent_pb2.AgentCall(agent_id=aid, status_updates=agent_pb2.AgentCall.StatusUpdates(
        updates=[agent_pb2.StatusUpdate(framework_id=fid, status=common_pb2.TaskStatus(
            task_id="t1", state=TS.TASK_FINISHED, uuid=b"fin"))]))
    cmds = call(core, b"a1", su, "agent-b")
    assert [r.code for r in rejects(cmds)] == [bus_pb2.UNAUTHORIZED]
    assert len(counted(cmds)) == 1
    gone = call(core, b"a1", agent_pb2.AgentCall(
        agent_id=aid, unregister=agent_pb2.AgentCall.Unregister(reason="x")), "agent-b")
    assert [r.code for r in rejects(gone)] == [bus_pb2.UNAUTHORIZED]
    assert_untouched(core, aid, fid)


def test_the_agents_own_principal_re_registers_from_a_new_connection() -> None:
    core, aid, fid = keyed_cluster()
    cmds = call(core, b"a1-new", reregistration(
        aid, b"a1-new", [reported(fid, "t1", TS.TASK_RUNNING)]), "agent-a")
    assert agent_events(cmds, "reregistered") and not rejects(cmds) and not counted(cmds)
    assert core.agents[aid].peer == b"a1-new"
    assert core.tasks[(fid, "t1")].state == TS.TASK_RUNNING


def test_without_a_principal_nothing_is_checked() -> None:
    core, aid, fid = keyed_cluster(key=None)
    assert core.agents[aid].principal == ""
    cmds = call(core, b"other", reregistration(
        aid, b"other", [reported(fid, "t1", TS.TASK_RUNNING)]), None)
    assert agent_events(cmds, "reregistered") and not counted(cmds)
    assert core.agents[aid].peer == b"other"


def test_a_new_leader_keeps_the_binding_of_a_registered_agent() -> None:
    old, aid, fid = keyed_cluster()
    new = MasterCore("m2", 8, recovered_registry=old.registry_document(), now=T0 + 10)
    cmds = call(new, b"rogue", reregistration(aid, b"rogue", []), "agent-b", now=T0 + 11)
    assert [r.code for r in rejects(cmds)] == [bus_pb2.UNAUTHORIZED]
    assert len(counted(cmds)) == 1 and aid in new.recovering and aid not in new.agents
    cmds = call(new, b"a1", reregistration(
        aid, b"a1", [reported(fid, "t1", TS.TASK_RUNNING)]), "agent-a", now=T0 + 12)
    assert agent_events(cmds, "reregistered") and not counted(cmds)
    assert new.agents[aid].principal == "agent-a"
    assert new.registry_document()["agents"][aid]["principal"] == "agent-a"  # type: ignore[index]


def test_a_new_leader_keeps_the_binding_of_an_unreachable_agent() -> None:
    old, aid, _ = keyed_cluster()
    silence(old, T0 + old.agent_timeout_s + 1)
    assert old.registry_document()["agents"][aid]["status"] == "unreachable"  # type: ignore[index]
    new = MasterCore("m2", 8, recovered_registry=old.registry_document(), now=T0 + 100)
    assert new.agents[aid].principal == "agent-a"
    cmds = call(new, b"rogue", reregistration(aid, b"rogue", []), "agent-b", now=T0 + 101)
    assert [r.code for r in rejects(cmds)] == [bus_pb2.UNAUTHORIZED]
    assert len(counted(cmds)) == 1


def test_an_acl_with_an_agents_list_admits_only_those_principals_as_agents() -> None:
    core = MasterCore("m1", 7, acl=Acl.parse({"agents": ["agent-a"]}), now=T0)
    register_call = agent_pb2.AgentCall(register=agent_pb2.AgentCall.Register(
        agent_info=agent_info("", "a1")))
    cmds = call(core, b"f", register_call, "framework")
    assert [r.message for r in rejects(cmds)] == [
        "principal 'framework' may not act as an agent (the master's ACL: agents)"]
    assert [r.code for r in rejects(cmds)] == [bus_pb2.UNAUTHORIZED]
    assert len(counted(cmds)) == 1 and not core.agents
    cmds = call(core, b"a1", register_call, "agent-a")
    assert agent_events(cmds, "registered") and not counted(cmds)


def test_an_acl_without_an_agents_list_admits_every_key_as_an_agent() -> None:
    core = MasterCore("m1", 7, acl=Acl.parse({"principals": {"ops": {"roles": ["*"]}}}),
                      now=T0)
    cmds = call(core, b"a1", agent_pb2.AgentCall(register=agent_pb2.AgentCall.Register(
        agent_info=agent_info("", "a1"))), "agent-a")
    assert agent_events(cmds, "registered") and not counted(cmds)


def test_an_acls_agents_must_be_a_list_of_strings() -> None:
    with pytest.raises(ValueError, match="agents must be a list of strings"):
        Acl.parse({"agents": "agent-a"})


def test_once_the_agent_is_gone_another_key_with_its_id_registers_under_a_new_id() -> None:
    core, aid, _ = keyed_cluster()
    call(core, b"a1", agent_pb2.AgentCall(
        agent_id=aid, unregister=agent_pb2.AgentCall.Unregister(reason="retired")), "agent-a")
    cmds = call(core, b"a2", agent_pb2.AgentCall(register=agent_pb2.AgentCall.Register(
        agent_info=agent_info(aid, "a2"))), "agent-b")
    assert not counted(cmds) and not rejects(cmds)
    new = agent_events(cmds, "registered")[0].event.registered.agent_id
    assert new != aid and core.agents[new].principal == "agent-b"
