"""What the broker core's tests share: the core as they start it (with agents a0..a3 on its
copy of the state stream, no totals, since the broker offers only agents the stream names),
builders of allocations, tasks, operations and stream entries, and readers of commands."""

from __future__ import annotations

from typing import Any

from schemas import common_pb2, internal_pb2, state_pb2
from services.broker.commands import (
    AcceptRejected,
    Command,
    Decision,
    LaunchRequest,
    RecoverResources,
    Recovery,
    SendOffers,
)
from services.broker.core import BrokerCore
from services.bus.stream_core import StateEntry
from services.resources import Resources

AGENTS = ("a0", "a1", "a2", "a3")


def broker(agents: tuple[str, ...] = AGENTS, **kw: Any) -> BrokerCore:
    core = BrokerCore(**kw)
    for agent_id in agents:
        core.agent_updated(agent_id, f"host-{agent_id}", None, 0.0)
    return core


RR = common_pb2.RescindReason
RJ = common_pb2.RejectReason
RC = internal_pb2.InternalMessage.RecoverResources.Reason
T0 = 1_000.0


def alloc(aid: str, fw: str = "f1", agent: str = "a1", role: str = "*",
          ports: list[tuple[int, int]] | None = None,
          **res: Any) -> internal_pb2.Allocation:
    r = Resources.of(ports=ports or (), **(res or {"cpus": 2, "mem": 1024}))
    return internal_pb2.Allocation(allocation_id=aid, framework_id=fw, agent_id=agent,
                                   role=role, resources=r.to_proto(), traceparent=f"tp-{aid}")


def task(tid: str, role: str = "*", ports: list[tuple[int, int]] | None = None,
         **res: Any) -> common_pb2.TaskInfo:
    return common_pb2.TaskInfo(task_id=tid, name=tid,
                               resources=Resources.of(role, ports or (), **res).to_proto())


def launch(*tasks: common_pb2.TaskInfo) -> common_pb2.Operation:
    return common_pb2.Operation(launch=common_pb2.Operation.Launch(tasks=tasks))


def reserve(role: str, **res: Any) -> common_pb2.Operation:
    return common_pb2.Operation(reserve=common_pb2.Operation.Reserve(
        resources=Resources.of(role, **res).to_proto()))


def filters(refuse: float | None) -> common_pb2.Filters:
    return common_pb2.Filters() if refuse is None else common_pb2.Filters(refuse_seconds=refuse)


Out = list[Command] | Decision


def commands(out: Out) -> list[Command]:
    return out.commands if isinstance(out, Decision) else out


def only(out: Out, cls: type[Any]) -> list[Any]:
    return [c for c in commands(out) if isinstance(c, cls)]


def recoveries(out: Out) -> list[Recovery]:
    return [r for c in only(out, RecoverResources) for r in c.recoveries]


def offer_ids(out: Out) -> list[str]:
    return [o.offer_id for c in only(out, SendOffers) for o in c.offers]


def make(n: int = 1, fw: str = "f1", agent: str = "a1", timeout: float | None = 30.0,
         **res: Any) -> tuple[BrokerCore, list[str]]:
    core = broker(prefix="e7", offer_timeout=timeout)
    cmds = core.allocations([alloc(f"al{i}", fw, agent, **res) for i in range(n)], T0)
    core.validate()
    return core, offer_ids(cmds)


def rejected(cmds: Out) -> AcceptRejected:
    """The one AcceptRejected of an ACCEPT the broker refused itself: nothing left it, so the
    master is asked to end its tasks."""
    (rej,) = only(cmds, AcceptRejected)
    assert not only(cmds, LaunchRequest)
    assert rej.refused_here and rej.to_proto().framework_event.end_tasks
    return rej


def agent_entry(agent_id: str, hostname: str = "", cpus: float = 8, mem: float = 4096,
                status: int = state_pb2.AgentRecord.Status.AGENT_STATUS_REGISTERED,
                rack: str = "") -> StateEntry:
    e = StateEntry(key=f"agents/{agent_id}")
    rec = e.value.agent
    rec.status = status  # type: ignore[assignment]
    rec.agent_info.agent_id = agent_id
    rec.agent_info.hostname = hostname or f"host-{agent_id}"
    rec.agent_info.resources.extend(Resources.of(cpus=cpus, mem=mem).to_proto())
    if rack:
        rec.agent_info.attributes.add(name="rack", text=rack)
    return e


def framework_entry(fid: str, connected: bool = True) -> StateEntry:
    e = StateEntry(key=f"frameworks/{fid}")
    e.value.framework.framework_info.framework_id = fid
    e.value.framework.connected = connected
    return e


def task_entry(fid: str, tid: str) -> StateEntry:
    e = StateEntry(key=f"tasks/{fid}/{tid}")
    e.value.task.framework_id = fid
    e.value.task.task_info.task_id = tid
    return e


def deleted(key: str) -> StateEntry:
    return StateEntry(key=key, deleted=True)
