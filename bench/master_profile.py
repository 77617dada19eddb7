"""An in-process driver of the master's launch path (issue 8, target (c)): the core and what
its shell does with each command but send it (the envelope encoded; the state stream's
delta encoded by the publisher's core), without sockets, tracing or other processes, so the
CPU the master spends per task can be timed (min of N) and profiled without noise.

One framework, N agents; for each agent in turn, as bench.scale's emulators do it:
a LaunchRequest of T tasks (0.1 cpus / 32 MB) from the broker, the agent's STARTING updates
in one call, then its RUNNING updates in one call, and the framework's acknowledgement of
each batch in one call. Phases: `launch` (the whole round) or its parts alone
(`requests`: launch requests only).

`python -m bench.master_profile --agents 1000 --repeat 3 [--profile launch]` prints CPU
seconds per phase (min of the repeats) and per task. The code measured is the worktree's:
run it at two commits to compare them (alternately)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from bench import inprocess
from schemas import agent_pb2, common_pb2, internal_pb2, scheduler_pb2
from services.bus import codec
from services.bus.stream_core import PublisherCore
from services.master.commands import Publish, ToAgent, ToBroker, ToFramework
from services.master.core import MasterCore
from services.resources import Resources

AGENT_RESOURCES = "cpus:4;mem:4096;disk:10240;ports:[31000-32000]"  # as the emulator's
TASK = Resources.of(cpus=0.1, mem=32).to_proto()
T0 = 1_000.0
Internal = internal_pb2.InternalMessage
Call = scheduler_pb2.SchedulerCall


class Shell:
    """What the master's shell does with the core's commands, but the sends."""

    def __init__(self) -> None:
        self.publisher = PublisherCore(1, 8 << 20)
        self.sent = 0

    def __call__(self, cmds: list[Any]) -> list[Any]:
        for c in cmds:
            env = codec.Envelope(sender_id="m1", epoch=1)
            if isinstance(c, ToAgent):
                env.agent_event.CopyFrom(c.event)
            elif isinstance(c, ToFramework):
                env.scheduler_event.CopyFrom(c.event)
            elif isinstance(c, ToBroker):
                env.internal.CopyFrom(c.message)
            elif isinstance(c, Publish):
                self.publisher.publish_encoded(c.entries)
                continue
            else:
                continue
            codec.encode(env)
            self.sent += 1
        return cmds


def cluster(agents: int) -> tuple[MasterCore, list[str], str, Shell]:
    core = MasterCore("m1", 1, now=T0)
    shell = Shell()
    ids = []
    res = Resources.parse(AGENT_RESOURCES).to_proto()
    for i in range(agents):
        cmds = shell(core.agent_call(f"a{i}".encode(), agent_pb2.AgentCall(
            register=agent_pb2.AgentCall.Register(agent_info=common_pb2.AgentInfo(
                hostname=f"h{i}", resources=res))), T0))
        ids.append(next(c.event.registered.agent_id for c in cmds if isinstance(c, ToAgent)))
    info = common_pb2.FrameworkInfo(name="bench", role="*", failover_timeout_s=3600)
    cmds = shell(core.scheduler_call(b"f1", Call(subscribe=Call.Subscribe(
        framework_info=info)), "m-sub", T0))
    fid = next(c.event.subscribed.framework_id for c in cmds if isinstance(c, ToFramework)
               and c.event.WhichOneof("event") == "subscribed")
    return core, ids, fid, shell


def round_of(agents: int, per_agent: int, parts: tuple[str, ...]
             ) -> tuple[Callable[[], float], int]:
    core, ids, fid, shell = cluster(agents)

    def request(i: int) -> Any:
        tasks = []
        for n in range(per_agent):
            tid = f"t{i}-{n}"
            t = common_pb2.TaskInfo(task_id=tid, name=tid, agent_id=ids[i])
            t.resources.extend(TASK)
            t.command.value = "true"
            tasks.append(t)
        op = common_pb2.Operation(launch=common_pb2.Operation.Launch(tasks=tasks))
        return Internal(launch_request=Internal.LaunchRequest(
            request_id=f"r{i}", framework_id=fid, agent_id=ids[i], offer_ids=[f"o{i}"],
            operations=[op]))

    def updates(i: int, state: int) -> agent_pb2.AgentCall:
        batch = [agent_pb2.StatusUpdate(framework_id=fid, status=common_pb2.TaskStatus(
            task_id=f"t{i}-{n}", state=state, uuid=f"u{i}-{n}-{state}".encode(),  # type: ignore[arg-type]
            agent_id=ids[i], source=common_pb2.TaskStatus.SOURCE_EXECUTOR))
            for n in range(per_agent)]
        return agent_pb2.AgentCall(agent_id=ids[i], status_updates=agent_pb2.AgentCall
                                   .StatusUpdates(updates=batch))

    def acks(i: int, state: int) -> Any:
        return Call(framework_id=fid, acknowledge=Call.Acknowledge(acks=[
            Call.Acknowledge.Ack(agent_id=ids[i], task_id=f"t{i}-{n}",
                                 uuid=f"u{i}-{n}-{state}".encode())
            for n in range(per_agent)]))

    # The messages as they come off the wire: built before the clock starts.
    msgs = [(request(i), updates(i, common_pb2.TASK_STARTING), acks(i, common_pb2.TASK_STARTING),
             updates(i, common_pb2.TASK_RUNNING), acks(i, common_pb2.TASK_RUNNING))
            for i in range(agents)]

    def run() -> float:
        now = T0 + 1
        for i, (req, starting, ack_s, running, ack_r) in enumerate(msgs):
            peer = f"a{i}".encode()
            now += 0.0001
            shell(core.internal_message(b"broker", req, now, traceparent=""))
            if "requests" in parts:
                continue
            shell(core.agent_call(peer, starting, now))
            shell(core.scheduler_call(b"f1", ack_s, "m-a", now))
            shell(core.agent_call(peer, running, now))
            shell(core.scheduler_call(b"f1", ack_r, "m-a", now))
        want = agents * per_agent
        if "requests" not in parts:
            got = sum(1 for t in core.tasks.values() if t.state == common_pb2.TASK_RUNNING)
            assert got == want, f"{got} of {want} tasks RUNNING"
        return 0.0
    return run, agents * per_agent


PHASES: dict[str, inprocess.Phase] = {
    "launch": lambda agents, per_agent: round_of(agents, per_agent, ()),
    "requests": lambda agents, per_agent: round_of(agents, per_agent, ("requests",))}


def main() -> None:
    inprocess.main("master_profile", __doc__ or "", PHASES, agents=1000, item="task",
                   profile_lines=30)


if __name__ == "__main__":
    main()
