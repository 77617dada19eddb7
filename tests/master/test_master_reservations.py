"""The master's pure core and reservations: a dynamic reservation (RESERVE/UNRESERVE in an
ACCEPT) is sent to its agent to checkpoint (AgentEvent.CheckpointResources) and survives the
agent re-registering (after an agent restart, a lost connection, a master failover); a static
reservation (the agent's flags) is its registered total."""

from __future__ import annotations

from schemas import agent_pb2, common_pb2
from services.master.commands import Command, ToAgent
from services.master.core import MasterCore
from services.resources import Resources
from tests.master.helpers import (
    T0,
    TS,
    Internal,
    agent_events,
    broker_msgs,
    cluster,
    only,
    published,
    register,
    rejects,
    reregister,
    subscribed,
    task_info,
    update,
)

RJ = common_pb2.RejectReason
STATIC = "cpus:4;mem:4096"  # what cluster()'s agent a1 has on its flags
RESERVED = "cpus(web):1;cpus:3;mem:4096"  # its total after RESERVE cpus(web):1


def accept(core: MasterCore, fid: str, aid: str, *ops: common_pb2.Operation,
           rid: str = "r1") -> list[Command]:
    return core.internal_message(b"broker", Internal(launch_request=Internal.LaunchRequest(
        request_id=rid, framework_id=fid, agent_id=aid, offer_ids=[f"o-{rid}"],
        operations=ops)), T0, traceparent="00-tp")


def reserve(res: str) -> common_pb2.Operation:
    return common_pb2.Operation(reserve=common_pb2.Operation.Reserve(
        resources=Resources.parse(res).to_proto()))


def unreserve(res: str) -> common_pb2.Operation:
    return common_pb2.Operation(unreserve=common_pb2.Operation.Unreserve(
        resources=Resources.parse(res).to_proto()))


def launch_op(tid: str, res: str) -> common_pb2.Operation:
    return common_pb2.Operation(launch=common_pb2.Operation.Launch(tasks=[task_info(tid, res)]))


def web_task(tid: str = "t1") -> agent_pb2.AgentCall.Reregister.Task:
    return agent_pb2.AgentCall.Reregister.Task(
        framework_id="", task_info=task_info(tid, "cpus(web):1"),
        latest_status=common_pb2.TaskStatus(task_id=tid, state=TS.TASK_RUNNING))


def reserved_and_launched() -> tuple[MasterCore, str, str, list[Command]]:
    """cluster()'s framework (role web) reserves cpus(web):1 on a1 and runs t1 on it."""
    core, aid, fid = cluster()
    cmds = accept(core, fid, aid, reserve("cpus(web):1"), launch_op("t1", "cpus(web):1"))
    assert broker_msgs(cmds, "launch_result")[0].accepted, cmds
    update(core, b"a1", aid, fid, "t1", TS.TASK_RUNNING, uuid=b"run")
    return core, aid, fid, cmds


def report(fid: str) -> list[agent_pb2.AgentCall.Reregister.Task]:
    t = web_task()
    t.framework_id = fid
    return [t]


def checkpoints(cmds: list[Command]) -> list[Resources]:
    return [Resources.from_proto(c.event.checkpoint_resources.resources)
            for c in agent_events(cmds, "checkpoint_resources")]


def test_an_agent_reregistering_without_the_reservation_its_task_uses_is_admitted() -> None:
    """Issue 9: after RESERVE cpus(web):1 + LAUNCH on it, the agent re-registered with its
    flags' resources and was rejected ('its tasks use cpus(web):1, more than its
    resources'). The master's total (with the reservation) is what the agent has: it is
    kept, and sent to the agent to checkpoint."""
    core, aid, fid, _ = reserved_and_launched()
    cmds = reregister(core, b"a1", aid, report(fid), res=STATIC, now=T0 + 1)
    assert not rejects(cmds), rejects(cmds)
    assert agent_events(cmds, "reregistered")
    assert core.agents[aid].total == Resources.parse(RESERVED)
    assert checkpoints(cmds) == [Resources.parse(RESERVED)]
    assert core.tasks[(fid, "t1")].state == TS.TASK_RUNNING
    core.validate()


def test_a_reserve_is_sent_to_the_agent_to_checkpoint_before_its_tasks() -> None:
    core, aid, fid, cmds = reserved_and_launched()
    order = [c.event.WhichOneof("event") for c in only(cmds, ToAgent)]
    assert order == ["checkpoint_resources", "run_tasks"]  # the task runs on a known total
    assert checkpoints(cmds) == [Resources.parse(RESERVED)]
    assert published(cmds)[f"agents/{aid}"].agent.agent_info.resources == \
        Resources.parse(RESERVED).to_proto()
    # A launch that reserves nothing checkpoints nothing.
    cmds = accept(core, fid, aid, launch_op("t2", "cpus:1"), rid="r2")
    assert broker_msgs(cmds, "launch_result")[0].accepted and not checkpoints(cmds)
    core.validate()


def test_an_unreserve_is_checkpointed_too() -> None:
    core, aid, fid = cluster()
    accept(core, fid, aid, reserve("cpus(web):2"))
    cmds = accept(core, fid, aid, unreserve("cpus(web):1"), rid="r2")
    assert broker_msgs(cmds, "launch_result")[0].accepted
    assert checkpoints(cmds) == [Resources.parse("cpus(web):1;cpus:3;mem:4096")]
    assert core.agents[aid].total == Resources.parse("cpus(web):1;cpus:3;mem:4096")
    core.validate()


def test_an_agent_reporting_its_checkpointed_reservation_is_told_nothing_more() -> None:
    core, aid, fid, _ = reserved_and_launched()
    cmds = reregister(core, b"a1", aid, report(fid), res=RESERVED, now=T0 + 1)
    assert agent_events(cmds, "reregistered") and not checkpoints(cmds)
    assert core.agents[aid].total == Resources.parse(RESERVED)
    core.validate()


def test_an_agent_with_other_quantities_is_taken_at_its_word() -> None:
    """Its flags changed (more memory): the master's reservations do not apply to other
    quantities, the agent's report is its total (and tasks on a reservation it no longer
    reports are refused, as before)."""
    core, aid, fid, _ = reserved_and_launched()
    cmds = reregister(core, b"a1", aid, report(fid), res="cpus:4;mem:8192", now=T0 + 1)
    assert [r.message for r in rejects(cmds)] == [
        f"agent {aid}: its tasks use cpus(web):1, more than its resources cpus:4;mem:8192; "
        "fix the agent's resources"]
    cmds = reregister(core, b"a1", aid, [], res="cpus:4;mem:8192", now=T0 + 1)
    assert agent_events(cmds, "reregistered") and not checkpoints(cmds)
    assert core.agents[aid].total == Resources.parse("cpus:4;mem:8192")
    core.validate()


def test_after_a_master_failover_the_agents_checkpointed_total_is_its_total() -> None:
    """The registry keeps no totals: a new leader learns the reservation from the agent's
    re-registration (its checkpoint), as Mesos's master does, and publishes it."""
    old, aid, fid, _ = reserved_and_launched()
    new = MasterCore("m2", 8, recovered_registry=old.registry_document(), now=T0 + 100)
    cmds = reregister(new, b"a1-new", aid, report(fid),
                      frameworks=[old.frameworks[fid].info], res=RESERVED, now=T0 + 101)
    assert agent_events(cmds, "reregistered") and not rejects(cmds)
    assert new.agents[aid].total == Resources.parse(RESERVED)
    assert published(cmds)[f"agents/{aid}"].agent.agent_info.resources == \
        Resources.parse(RESERVED).to_proto()
    # The reservation is still the framework's: it can unreserve what its task does not use.
    assert subscribed(new, b"f1-new", framework_id=fid, now=T0 + 102) == fid
    new.validate()


def test_a_static_reservation_is_the_agents_registered_total() -> None:
    core = MasterCore("m1", 7, now=T0)
    aid = register(core, b"a1", res="cpus(web):2;cpus:2;mem:1024")
    assert core.agents[aid].total == Resources.parse("cpus(web):2;cpus:2;mem:1024")
    fid = subscribed(core, b"f1", role="web")
    other = subscribed(core, b"f2", role="batch")
    cmds = accept(core, fid, aid, launch_op("t1", "cpus(web):1;cpus:1"))
    assert broker_msgs(cmds, "launch_result")[0].accepted and not checkpoints(cmds)
    # Another role cannot launch on the reservation, whatever its broker said.
    cmds = accept(core, other, aid, launch_op("t2", "cpus(web):1"), rid="r2")
    result = broker_msgs(cmds, "launch_result")[0]
    assert not result.accepted and result.reason == RJ.REJECT_REASON_UNAUTHORIZED
    assert "reserved for role 'web'" in result.message, result.message
    assert not agent_events(cmds, "run_tasks")
    core.validate()
