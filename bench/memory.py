"""Bytes per agent and per task held by the master's and the broker's pure cores (issue 8
(f)), measured with tracemalloc in this process: the cores are driven through their real
event methods (agents register, a framework subscribes, launches are made and reported
RUNNING; the broker takes allocations and holds their offers) and the memory they keep
after each phase is divided by the count. The peer each figure is compared with, measured
in the same run, is the serialized size of what the core must remember at least: the
agent's or task's protobuf record (AgentInfo, TaskInfo + TaskStatus; an Offer), so the
ratio is the core's overhead over its payload. Sizes alternate in order between rounds."""

from __future__ import annotations

import gc
import tracemalloc
from collections.abc import Callable
from typing import Any

from bench.report import progress, write
from schemas import agent_pb2, common_pb2, internal_pb2, scheduler_pb2
from services.broker.core import BrokerCore
from services.master.commands import ToAgent, ToFramework
from services.master.core import MasterCore
from services.resources import Resources

T0 = 1_000_000.0
SIZES = ((1_000, 10), (10_000, 10))  # (agents, tasks per agent)
AGENT_RES = "cpus:8;mem:16384;disk:100000;ports:[31000-32000]"
TASK_RES = "cpus:0.1;mem:64"
TS = common_pb2.TaskState
Internal = internal_pb2.InternalMessage


def _measured(phase: Callable[[], Any]) -> tuple[int, Any]:
    """Bytes still allocated after `phase` (its garbage collected), and its result."""
    gc.collect()
    before = tracemalloc.get_traced_memory()[0]
    result = phase()
    gc.collect()
    return tracemalloc.get_traced_memory()[0] - before, result


def _agent_info(i: int) -> common_pb2.AgentInfo:
    return common_pb2.AgentInfo(hostname=f"host-{i:05d}",
                                resources=Resources.parse(AGENT_RES).to_proto())


def _task(i: int, j: int) -> common_pb2.TaskInfo:
    return common_pb2.TaskInfo(task_id=f"t-{i}-{j}", name=f"web-{j}",
                               resources=Resources.parse(TASK_RES).to_proto())


def master(agents: int, per_agent: int) -> dict[str, float]:
    core = MasterCore("m1", 7, now=T0, agent_reregister_window_s=1e9)

    def register() -> list[str]:
        ids = []
        for i in range(agents):
            cmds = core.agent_call(f"agent-{i}".encode(), agent_pb2.AgentCall(
                register=agent_pb2.AgentCall.Register(agent_info=_agent_info(i))), T0)
            ids += [c.event.registered.agent_id for c in cmds
                    if isinstance(c, ToAgent) and c.event.WhichOneof("event") == "registered"]
        return ids

    agent_bytes, ids = _measured(register)
    assert len(ids) == agents, f"{len(ids)} of {agents} agents registered"
    info = common_pb2.FrameworkInfo(name="bench", role="*", principal="bench",
                                    failover_timeout_s=600)
    cmds = core.scheduler_call(b"fw", scheduler_pb2.SchedulerCall(
        subscribe=scheduler_pb2.SchedulerCall.Subscribe(framework_info=info)), "m1", T0)
    fid = next(c.event.subscribed.framework_id for c in cmds
               if isinstance(c, ToFramework) and c.event.WhichOneof("event") == "subscribed")

    def launch_and_run() -> None:
        for i, aid in enumerate(ids):
            tasks = [_task(i, j) for j in range(per_agent)]
            op = common_pb2.Operation(launch=common_pb2.Operation.Launch(tasks=tasks))
            core.internal_message(b"broker", Internal(launch_request=Internal.LaunchRequest(
                request_id=f"r{i}", framework_id=fid, agent_id=aid, offer_ids=[f"o{i}"],
                operations=[op])), T0, traceparent="")
            updates = [agent_pb2.StatusUpdate(framework_id=fid, status=common_pb2.TaskStatus(
                task_id=t.task_id, state=TS.TASK_RUNNING, uuid=f"u{t.task_id}".encode(),
                agent_id=aid, source=common_pb2.TaskStatus.SOURCE_EXECUTOR)) for t in tasks]
            core.agent_call(f"agent-{i}".encode(), agent_pb2.AgentCall(
                agent_id=aid, status_updates=agent_pb2.AgentCall.StatusUpdates(
                    updates=updates)), T0)

    task_bytes, _ = _measured(launch_and_run)
    tasks = agents * per_agent
    running = sum(1 for t in core.tasks.values() if t.state == TS.TASK_RUNNING)
    assert running == tasks, f"{running} of {tasks} tasks RUNNING"
    payload_agent = _agent_info(0).ByteSize()
    payload_task = (_task(0, 0).ByteSize() + common_pb2.TaskStatus(
        task_id="t-0-0", state=TS.TASK_RUNNING, uuid=b"ut-0-0", agent_id=ids[0]).ByteSize())
    return {"agents": agents, "tasks": tasks,
            "bytes_per_agent": agent_bytes / agents, "bytes_per_task": task_bytes / tasks,
            "payload_per_agent": payload_agent, "payload_per_task": payload_task}


def broker(agents: int, per_agent: int) -> dict[str, float]:
    core = BrokerCore(prefix="7", offer_timeout=None)

    def agents_seen() -> None:
        res = Resources.parse(AGENT_RES)
        for i in range(agents):
            core.agent_updated(f"a{i}", f"host-{i:05d}", res, T0)

    agent_bytes, _ = _measured(agents_seen)
    offer_res = Resources.parse(TASK_RES).to_proto()

    def offers() -> None:
        for i in range(agents):
            core.allocations([internal_pb2.Allocation(
                allocation_id=f"al{i}-{j}", framework_id=f"f{j}", agent_id=f"a{i}",
                role="*", resources=offer_res) for j in range(per_agent)], T0)

    offer_bytes, _ = _measured(offers)
    n = agents * per_agent
    assert len(core.outstanding_offers()) == n, "every allocation became an offer"
    payload_offer = core.outstanding_offers()[0].to_proto().ByteSize()
    return {"agents": agents, "offers": n,
            "bytes_per_agent": agent_bytes / agents, "bytes_per_offer": offer_bytes / n,
            "payload_per_offer": payload_offer}


def main() -> None:
    print("\n== memory: bytes held by the master's and broker's cores (tracemalloc)")
    tracemalloc.start()
    rows: list[dict[str, Any]] = []
    order = list(SIZES)
    for rnd, service in enumerate(("master", "broker")):
        sizes = order if rnd % 2 == 0 else order[::-1]  # alternate which size goes first
        for agents, per in sizes:
            progress(f"{service}: {agents} agents x {per}")
            fig = (master if service == "master" else broker)(agents, per)
            rows.append({"service": service, **fig})
    tracemalloc.stop()
    rows.sort(key=lambda r: (r["service"], r["agents"]))
    print(f"\n{'service':<8} {'agents':>7} {'items':>8} {'B/agent':>9} {'B/item':>8} "
          f"{'item':<6} {'payload B':>9} {'overhead':>9}")
    for r in rows:
        item = "task" if r["service"] == "master" else "offer"
        per_item = r[f"bytes_per_{item}"]
        payload = r[f"payload_per_{item}"]
        print(f"{r['service']:<8} {r['agents']:>7} {r.get('tasks', r.get('offers')):>8} "
              f"{r['bytes_per_agent']:>9.0f} {per_item:>8.0f} {item:<6} {payload:>9.0f} "
              f"{per_item / payload:>8.1f}x")
    path = write("memory", {"rows": rows, "agent_resources": AGENT_RES,
                            "task_resources": TASK_RES})
    print(f"\n  written: {path}")


if __name__ == "__main__":
    main()
