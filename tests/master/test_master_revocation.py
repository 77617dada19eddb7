"""Fair sharing in the master's pure core: a framework's REQUEST (its declared demand, kept in
its FrameworkRecord), and revocation (the allocator's RevokeResources: the youngest tasks that
hold what is asked, a Revoke event, and after the grace the kills still needed, with
REASON_TASK_REVOKED)."""

from __future__ import annotations

import math
from typing import Any

import pytest

from schemas import agent_pb2, bus_pb2, common_pb2
from services.master.commands import Command, ToFramework
from services.master.core import MasterCore
from services.master.records import MAX_DEMAND_COUNT, MAX_DEMAND_PORTS, MAX_DEMANDS
from services.notice import Notice
from services.resources import Resources
from tests.master.helpers import (
    T0,
    TS,
    Call,
    Internal,
    agent_events,
    cluster,
    launch,
    one,
    only,
    published,
    register,
    rejects,
    reported,
    reregister,
    sched,
    silence,
    statuses,
    subscribe,
    subscribed,
    update,
)

R = common_pb2.TaskStatus.Reason
GRACE = 30.0


def demand(res: str = "cpus:1;mem:128", count: int = 3, ports: int = 0) -> common_pb2.Demand:
    return common_pb2.Demand(resources=Resources.parse(res).to_proto(), count=count,
                             ports=ports)


def request(core: MasterCore, fid: str, *demands: common_pb2.Demand, peer: bytes = b"f1",
            now: float = T0) -> list[Command]:
    return sched(core, peer, fid, now=now, request=Call.Request(demands=demands))


def notices(cmds: list[Command], kind: str) -> list[Notice]:
    return [c for c in only(cmds, Notice) if c.kind == kind]


def revokes(cmds: list[Command]) -> list[Any]:
    return [c.event.revoke for c in only(cmds, ToFramework)
            if c.event.WhichOneof("event") == "revoke"]


def killed(cmds: list[Command]) -> list[tuple[str, int]]:
    return [(c.event.kill_task.task_id, c.event.kill_task.reason)
            for c in agent_events(cmds, "kill_task")]


# -- REQUEST -------------------------------------------------------------------------------


def test_a_request_is_kept_normalised_and_published_only_when_it_changes() -> None:
    core, _, fid = cluster()
    half = common_pb2.Resource(name="cpus", scalar=0.5)
    wanted = common_pb2.Demand(count=3, ports=2, resources=[
        common_pb2.Resource(name="mem", scalar=128), half, half])  # one cpu, in two halves
    cmds = request(core, fid, wanted)
    assert not rejects(cmds)
    [rec] = published(cmds)[f"frameworks/{fid}"].framework.demands
    assert (rec.count, rec.ports) == (3, 2)
    assert Resources.from_proto(rec.resources).same(Resources.parse("cpus:1;mem:128"))
    assert [(r.name, r.role) for r in rec.resources] == [("cpus", "*"), ("mem", "*")]
    # Restated as frameworks do, in any spelling of the same: nothing changed, nothing sent.
    assert f"frameworks/{fid}" not in published(request(core, fid, demand(count=3, ports=2)))
    # A scheduler failover keeps it (the demand is the framework's, not its connection's).
    subscribe(core, b"f1b", framework_id=fid, force=True)
    assert len(core.frameworks[fid].demands) == 1
    # An empty REQUEST: unknown again.
    cmds = request(core, fid, peer=b"f1b")
    assert not published(cmds)[f"frameworks/{fid}"].framework.demands
    assert not core.frameworks[fid].demands
    core.validate()


BAD = {
    "count 0": [demand(count=0)],
    "count over the bound": [demand(count=MAX_DEMAND_COUNT + 1)],
    "too many ports": [demand(ports=MAX_DEMAND_PORTS + 1)],
    "no resources": [common_pb2.Demand(count=1)],
    "ranges": [demand("cpus:1;ports:[31000-31001]")],
    "reserved": [demand("cpus(web):1")],
    "zero": [common_pb2.Demand(count=1, resources=[common_pb2.Resource(name="cpus", scalar=0)])],
    "negative": [common_pb2.Demand(count=1, resources=[
        common_pb2.Resource(name="cpus", scalar=-1)])],
    "nan": [common_pb2.Demand(count=1, resources=[
        common_pb2.Resource(name="cpus", scalar=math.nan)])],
    "infinite": [common_pb2.Demand(count=1, resources=[
        common_pb2.Resource(name="mem", scalar=math.inf)])],
    "no value": [common_pb2.Demand(count=1, resources=[common_pb2.Resource(name="cpus")])],
    "too many demands": [demand()] * (MAX_DEMANDS + 1),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_a_bad_request_is_refused_with_the_reason_and_changes_nothing(case: str) -> None:
    core, _, fid = cluster()
    request(core, fid, demand(count=7))
    cmds = request(core, fid, demand(count=1), *BAD[case])
    [no] = rejects(cmds)
    assert no.peer == b"f1" and no.code == bus_pb2.INVALID and no.in_reply_to == "m1"
    assert no.message.startswith(f"request of framework {fid} refused: ")
    assert "demand 1" in no.message or case == "too many demands", no.message
    assert not published(cmds)
    assert [d.count for d in core.frameworks[fid].demands] == [7]


def test_a_request_on_a_connection_not_subscribed_is_refused() -> None:
    core, _, fid = cluster()
    [no] = rejects(request(core, fid, demand(), peer=b"other"))
    assert no.code == bus_pb2.NOT_REGISTERED
    assert not core.frameworks[fid].demands


# -- revocation ----------------------------------------------------------------------------


def three_tasks(res: str = "cpus:1;mem:256") -> tuple[MasterCore, str, str]:
    """f1 runs t1, t2, t3 on a1, launched a second apart (t3 the youngest)."""
    core, aid, fid = cluster()
    for n, tid in enumerate(("t1", "t2", "t3")):
        launch(core, fid, aid, tid, res=res, now=T0 + n, rid=f"r{n}")
        update(core, b"a1", aid, fid, tid, TS.TASK_RUNNING, uuid=f"{tid}-run".encode(),
               now=T0 + n)
    return core, aid, fid


def revoke(core: MasterCore, fid: str, aid: str, res: str = "cpus:1.5", now: float = T0 + 10,
           grace: float = GRACE) -> list[Command]:
    core.tick(now)  # the shell's timer ran meanwhile (validate() checks the agents' timers)
    return core.internal_message(b"broker", Internal(revoke_resources=Internal.RevokeResources(
        framework_id=fid, agent_id=aid, resources=Resources.parse(res).to_proto(),
        grace_s=grace, for_framework_id="fw-poor", reason="fw-poor is below its share")), now)


def test_a_revocation_picks_the_youngest_tasks_that_hold_what_is_asked() -> None:
    core, aid, fid = three_tasks()
    cmds = revoke(core, fid, aid, "cpus:1.5;ports:[31000-31000]")  # ports are not revoked
    [ev] = revokes(cmds)
    assert one(cmds, ToFramework).peer == b"f1"
    assert (ev.agent_id, list(ev.task_ids), ev.grace_s) == (aid, ["t3", "t2"], GRACE)
    assert "fw-poor" in ev.message and "below its share" in ev.message
    assert not killed(cmds)  # not before the grace has passed
    assert core.next_deadline() == T0 + 10 + GRACE
    assert core.revocations.requested == 1 and notices(cmds, "revocation_requested")
    core.validate()


def test_mem_alone_is_revoked_from_the_youngest_tasks_holding_mem() -> None:
    core, aid, fid = three_tasks()
    [ev] = revokes(revoke(core, fid, aid, "mem:300"))
    assert list(ev.task_ids) == ["t3", "t2"]


def test_after_the_grace_the_chosen_tasks_are_killed_with_the_revoked_reason() -> None:
    core, aid, fid = three_tasks()
    revoke(core, fid, aid)
    assert not killed(core.tick(T0 + 10 + GRACE - 0.1))
    cmds = core.tick(T0 + 10 + GRACE)
    assert killed(cmds) == [("t3", R.REASON_TASK_REVOKED), ("t2", R.REASON_TASK_REVOKED)]
    for tid in ("t2", "t3"):
        assert core.tasks[(fid, tid)].state == TS.TASK_KILLING
        assert core.tasks[(fid, tid)].status.reason == R.REASON_TASK_REVOKED
    assert core.tasks[(fid, "t1")].state == TS.TASK_RUNNING
    assert core.revocations.tasks_revoked == 2 and not core.revocations.pending
    later = core.next_deadline()
    assert later is None or later > T0 + 10 + GRACE
    core.validate()


def test_a_framework_that_frees_enough_itself_during_the_grace_loses_nothing_more() -> None:
    core, aid, fid = three_tasks()
    [ev] = revokes(revoke(core, fid, aid))
    assert list(ev.task_ids) == ["t3", "t2"]
    # It keeps its younger tasks and gives up t1 and t3 instead: 2 cpus freed, 1.5 asked.
    for tid in ("t1", "t3"):
        sched(core, b"f1", fid, now=T0 + 12, kill=Call.Kill(task_id=tid))
        update(core, b"a1", aid, fid, tid, TS.TASK_KILLED, uuid=f"{tid}-k".encode(),
               now=T0 + 13)
    cmds = core.tick(T0 + 10 + GRACE)
    assert not killed(cmds)
    assert core.tasks[(fid, "t2")].state == TS.TASK_RUNNING
    assert notices(cmds, "revocation_done")[0].fields()["killed"] == 0
    core.validate()


def test_only_as_many_as_are_still_needed_are_killed_youngest_first() -> None:
    core, aid, fid = three_tasks()
    revoke(core, fid, aid)
    # t1 ends by itself (1 cpu freed): 0.5 cpu is still owed, which t3 alone holds.
    update(core, b"a1", aid, fid, "t1", TS.TASK_FINISHED, uuid=b"t1-f", now=T0 + 20)
    cmds = core.tick(T0 + 10 + GRACE)
    assert killed(cmds) == [("t3", R.REASON_TASK_REVOKED)]
    assert core.tasks[(fid, "t2")].state == TS.TASK_RUNNING


def test_a_task_being_killed_by_its_framework_counts_as_freed() -> None:
    core, aid, fid = three_tasks()
    revoke(core, fid, aid, "cpus:1")
    sched(core, b"f1", fid, now=T0 + 12, kill=Call.Kill(task_id="t1"))  # not yet ended
    assert not killed(core.tick(T0 + 10 + GRACE))


def test_the_agents_killed_update_reaches_the_framework_with_the_reason() -> None:
    core, aid, fid = three_tasks()
    revoke(core, fid, aid, "cpus:1")
    assert killed(core.tick(T0 + 10 + GRACE)) == [("t3", R.REASON_TASK_REVOKED)]
    # The agent puts the kill's reason on TASK_KILLED (tests/agent).
    su = common_pb2.TaskStatus(task_id="t3", state=TS.TASK_KILLED, uuid=b"k3", agent_id=aid,
                               reason=R.REASON_TASK_REVOKED)
    cmds = core.agent_call(b"a1", agent_pb2.AgentCall(
        agent_id=aid, status_updates=agent_pb2.AgentCall.StatusUpdates(
            updates=[agent_pb2.StatusUpdate(framework_id=fid, status=su)])), T0 + 41)
    [st] = statuses(cmds, fid)
    assert (st.state, st.reason) == (TS.TASK_KILLED, R.REASON_TASK_REVOKED)
    assert core.tasks[(fid, "t3")].status.reason == R.REASON_TASK_REVOKED
    core.tick(T0 + 41)
    core.validate()


def test_a_second_revocation_of_the_same_framework_and_agent_is_ignored() -> None:
    core, aid, fid = three_tasks()
    revoke(core, fid, aid)
    cmds = revoke(core, fid, aid, "cpus:1", now=T0 + 11)
    assert not revokes(cmds) and not killed(cmds)
    [n] = notices(cmds, "revocation_ignored")
    assert "pending" in n.message
    assert (core.revocations.requested, core.revocations.ignored) == (1, 1)
    # The first one keeps its own deadline and tasks.
    assert killed(core.tick(T0 + 10 + GRACE)) == [("t3", R.REASON_TASK_REVOKED),
                                                 ("t2", R.REASON_TASK_REVOKED)]


@pytest.mark.parametrize("case", ["unknown framework", "unknown agent", "cannot cover",
                                  "nothing revocable", "bad grace", "all being killed"])
def test_a_revocation_that_cannot_be_carried_out_is_ignored(case: str) -> None:
    core, aid, fid = three_tasks()
    args: dict[str, Any] = {}
    if case == "unknown framework":
        fid = "nobody"
    elif case == "unknown agent":
        aid = "nowhere"
    elif case == "cannot cover":
        args["res"] = "cpus:3.5"
    elif case == "nothing revocable":
        args["res"] = "ports:[31000-31000]"
    elif case == "bad grace":
        args["grace"] = math.nan
    else:
        for tid in ("t1", "t2", "t3"):
            sched(core, b"f1", fid, kill=Call.Kill(task_id=tid))
    cmds = revoke(core, fid, aid, **args)
    assert not revokes(cmds) and not core.revocations.pending
    assert len(notices(cmds, "revocation_ignored")) == 1 and core.revocations.ignored == 1
    core.validate()


def test_a_disconnected_framework_is_not_told_but_its_tasks_are_still_revoked() -> None:
    core, aid, fid = three_tasks()
    core.peer_gone(b"f1", T0 + 5)
    cmds = revoke(core, fid, aid, "cpus:1")
    assert not only(cmds, ToFramework) and core.revocations.pending
    assert killed(core.tick(T0 + 10 + GRACE)) == [("t3", R.REASON_TASK_REVOKED)]


def test_a_revocation_ends_with_its_framework_or_its_agent() -> None:
    core, aid, fid = three_tasks()
    fid2 = subscribed(core, b"f2")
    launch(core, fid2, aid, "u1", now=T0 + 3, rid="ru")
    revoke(core, fid, aid)
    revoke(core, fid2, aid, "cpus:1")
    assert len(core.revocations.pending) == 2
    sched(core, b"f1", fid, now=T0 + 11, teardown=Call.Teardown())
    assert list(core.revocations.pending) == [(fid2, aid)]
    core.validate()
    silence(core, T0 + 20)  # the agent goes unreachable
    assert not core.revocations.pending
    core.validate()
    assert not killed(core.tick(T0 + 10 + GRACE))
    # A new agent, and the same framework's tasks there: revocable again.
    aid2 = register(core, b"a2", now=T0 + 21)
    launch(core, fid2, aid2, "u2", now=T0 + 21, rid="ru2")
    assert revokes(revoke(core, fid2, aid2, "cpus:1", now=T0 + 22))


def test_a_revocation_kill_resent_to_a_re_registering_agent_keeps_its_reason() -> None:
    """The agent restarted before it killed the task (it re-registers, still running it): the
    kill is sent again, still a revocation's."""
    core, aid, fid = three_tasks()
    revoke(core, fid, aid, "cpus:1")
    assert killed(core.tick(T0 + 10 + GRACE)) == [("t3", R.REASON_TASK_REVOKED)]
    cmds = reregister(core, b"a1-new", aid, [
        reported(fid, tid, TS.TASK_RUNNING, "cpus:1;mem:256") for tid in ("t1", "t2", "t3")],
        now=T0 + 41)
    assert killed(cmds) == [("t3", R.REASON_TASK_REVOKED)]
