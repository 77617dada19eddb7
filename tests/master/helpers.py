"""Builders for the master core's tests: calls from agents, schedulers, the broker and
operators, and views of the commands that come out."""

from __future__ import annotations

import math
from typing import Any, TypeVar

from schemas import agent_pb2, common_pb2, internal_pb2, operator_pb2, scheduler_pb2
from services import report_digest
from services.master.commands import (
    Command,
    PersistRegistry,
    Publish,
    Reject,
    ToAgent,
    ToBroker,
    ToFramework,
)
from services.master.core import MasterCore
from services.resources import Resources

T0 = 1_000_000.0
TS = common_pb2.TaskState
PA = common_pb2.FrameworkInfo.Capability.CAPABILITY_PARTITION_AWARE
Internal = internal_pb2.InternalMessage
Call = scheduler_pb2.SchedulerCall
C = TypeVar("C")


def only(cmds: list[Command], cls: type[C]) -> list[C]:
    return [c for c in cmds if isinstance(c, cls)]


def one(cmds: list[Command], cls: type[C]) -> C:
    found = only(cmds, cls)
    assert len(found) == 1, (cls.__name__, cmds)
    return found[0]


def statuses(cmds: list[Command], fid: str | None = None) -> list[common_pb2.TaskStatus]:
    out: list[common_pb2.TaskStatus] = []
    for c in only(cmds, ToFramework):
        if c.event.WhichOneof("event") == "update" and (fid is None or c.framework_id == fid):
            out.extend(c.event.update.statuses)
    return out


def agent_events(cmds: list[Command], kind: str) -> list[ToAgent]:
    return [c for c in only(cmds, ToAgent) if c.event.WhichOneof("event") == kind]


def broker_msgs(cmds: list[Command], kind: str) -> list[Any]:
    return [getattr(c.message, kind) for c in only(cmds, ToBroker)
            if c.message.WhichOneof("kind") == kind]


def published(cmds: list[Command]) -> dict[str, Any]:
    """key -> StateValue (None when deleted), over every Publish in `cmds`."""
    out: dict[str, Any] = {}
    for p in only(cmds, Publish):
        for e in p.entries:
            out[e.key] = None if e.deleted else e.value
    return out


def registry(cmds: list[Command]) -> dict[str, Any] | None:
    """What the registry changes of `cmds` write (see registry.merge)."""
    docs = only(cmds, PersistRegistry)
    return docs[-1].change if docs else None


def rejects(cmds: list[Command]) -> list[Reject]:
    return only(cmds, Reject)


def agent_info(agent_id: str = "", hostname: str = "h1", res: str = "cpus:4;mem:4096",
               ) -> common_pb2.AgentInfo:
    return common_pb2.AgentInfo(agent_id=agent_id, hostname=hostname,
                                resources=Resources.parse(res).to_proto())


def register(core: MasterCore, peer: bytes, now: float = T0, res: str = "cpus:4;mem:4096",
             agent_id: str = "") -> str:
    cmds = core.agent_call(peer, agent_pb2.AgentCall(register=agent_pb2.AgentCall.Register(
        agent_info=agent_info(agent_id, peer.decode(), res))), now)
    ev = agent_events(cmds, "registered")
    assert ev, cmds
    return ev[0].event.registered.agent_id


def reported(fid: str, tid: str, state: int, res: str = "cpus:1;mem:128",
             ) -> agent_pb2.AgentCall.Reregister.Task:
    return agent_pb2.AgentCall.Reregister.Task(
        framework_id=fid, task_info=task_info(tid, res),
        latest_status=common_pb2.TaskStatus(task_id=tid, state=state))  # type: ignore[arg-type]


def reregister(core: MasterCore, peer: bytes, agent_id: str, tasks: list[Any],
               frameworks: list[common_pb2.FrameworkInfo] = (),  # type: ignore[assignment]
               now: float = T0, res: str = "cpus:4;mem:4096", digest: bool = False,
               ) -> list[Command]:
    """`digest`: the report carries its tasks' digest, as agents send it."""
    call = agent_pb2.AgentCall(agent_id=agent_id, reregister=agent_pb2.AgentCall.Reregister(
        agent_info=agent_info(agent_id, peer.decode(), res), tasks=tasks,
        frameworks=frameworks))
    if digest:
        call.reregister.tasks_digest = report_digest.of_report(call.reregister.tasks)
    return core.agent_call(peer, call, now)


def subscribe(core: MasterCore, peer: bytes, now: float = T0, framework_id: str = "",
              pa: bool = False, failover: float = 60.0, principal: str = "p",
              force: bool = False, role: str = "web") -> list[Command]:
    info = common_pb2.FrameworkInfo(framework_id=framework_id, name=peer.decode(), role=role,
                                    principal=principal, failover_timeout_s=failover,
                                    capabilities=[PA] if pa else [])
    call = Call(framework_id=framework_id,
                subscribe=Call.Subscribe(framework_info=info, force=force))
    return core.scheduler_call(peer, call, "m-sub", now)


def subscribed(core: MasterCore, peer: bytes, **kw: Any) -> str:
    cmds = subscribe(core, peer, **kw)
    ev = [c for c in only(cmds, ToFramework) if c.event.WhichOneof("event") == "subscribed"]
    assert ev, cmds
    return ev[0].event.subscribed.framework_id


def task_info(tid: str, res: str = "cpus:1;mem:128") -> common_pb2.TaskInfo:
    return common_pb2.TaskInfo(task_id=tid, name=tid, resources=Resources.parse(res).to_proto())


def launch_msg(fid: str, aid: str, *tasks: common_pb2.TaskInfo, rid: str = "r1",
               offers: tuple[str, ...] = ("o1",)) -> internal_pb2.InternalMessage:
    op = common_pb2.Operation(launch=common_pb2.Operation.Launch(tasks=tasks))
    return Internal(launch_request=Internal.LaunchRequest(
        request_id=rid, framework_id=fid, agent_id=aid, offer_ids=offers, operations=[op]))


def launch(core: MasterCore, fid: str, aid: str, *tids: str, res: str = "cpus:1;mem:128",
           now: float = T0, rid: str = "r1") -> list[Command]:
    return core.internal_message(b"broker", launch_msg(
        fid, aid, *(task_info(t, res) for t in tids), rid=rid), now, traceparent="00-tp")


def update(core: MasterCore, peer: bytes, aid: str, fid: str, tid: str, state: int,
           uuid: bytes = b"u", now: float = T0) -> list[Command]:
    su = agent_pb2.StatusUpdate(framework_id=fid, status=common_pb2.TaskStatus(
        task_id=tid, state=state, uuid=uuid, agent_id=aid,  # type: ignore[arg-type]
        source=common_pb2.TaskStatus.SOURCE_EXECUTOR))
    return core.agent_call(peer, agent_pb2.AgentCall(
        agent_id=aid, status_updates=agent_pb2.AgentCall.StatusUpdates(updates=[su])), now)


def sched(core: MasterCore, peer: bytes, fid: str, now: float = T0, **call: Any,
          ) -> list[Command]:
    return core.scheduler_call(peer, Call(framework_id=fid, **call), "m1", now)


def operator(core: MasterCore, peer: bytes, now: float = T0, **call: Any) -> list[Command]:
    return core.operator_call(peer, operator_pb2.OperatorCall(**call), "op1", now)


def cluster(pa: bool = False, failover: float = 60.0) -> tuple[MasterCore, str, str]:
    """A master with agent a1 (peer b"a1") and framework f1 (peer b"f1")."""
    core = MasterCore("m1", 7, now=T0)
    aid = register(core, b"a1")
    fid = subscribed(core, b"f1", pa=pa, failover=failover)
    return core, aid, fid


def silence(core: MasterCore, until: float, alive: tuple[bytes, ...] = (),
            step: float = 0.5) -> list[Command]:
    """The shell's liveness reports every `step` s up to `until` (from where the last one left
    off, or one agent timeout before): the `alive` peers were heard just before each, every
    other agent was silent. Agents silent for the timeout go unreachable."""
    start = core.observed_at if core.observed_at is not None else until - core.agent_timeout_s
    out: list[Command] = []
    n = max(0, math.ceil((until - start) / step - 1e-9))
    for k in range(1, n + 1):
        t = min(start + k * step, until)
        out += core.agents_heard({p: t - step / 5 for p in alive}, t)
    return out


def running(core: MasterCore, aid: str, fid: str, *tids: str) -> None:
    launch(core, fid, aid, *tids)
    for tid in tids:
        update(core, b"a1", aid, fid, tid, TS.TASK_RUNNING, uuid=f"{tid}-run".encode())
