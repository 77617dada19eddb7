"""An in-process driver of a master failover's re-registration storm (issue 8 d): the agent
emulator's core and a new master's core, without sockets or other processes, so the CPU
each side spends per agent can be timed (min of N) and profiled without noise.

Setup: N virtual agents with T RUNNING tasks each (acknowledged), registered with an old
master whose registry document a new master recovers (its agents, frameworks; no tasks).
Then, timed apart:

- emulator: `master_detected` and a `reregistered` reply per agent (as the window opens),
  each call serialised as its shell sends it (an Envelope's bytes);
- master: each call parsed from those bytes and handled by the new master's core
  (`agent_call`), the entries it publishes and its replies serialised (as its shell does).

`python -m bench.rereg_profile --agents 10000 --repeat 3 [--profile emulator|master]`. The
code measured is the worktree's: run it at two commits to compare them (alternately)."""

from __future__ import annotations

import argparse
import cProfile
import gc
import pstats
import time
from collections.abc import Callable
from functools import partial
from typing import Any, TypeVar

from schemas import agent_pb2, bus_pb2, common_pb2, scheduler_pb2
from services import tasks
from services.bus import codec
from services.emulator.agents import AgentsCore, ToMaster
from services.emulator.shell import AGENT_RESOURCES
from services.master.commands import Publish, ToAgent
from services.master.core import MasterCore
from services.master.followed import Followed
from services.resources import Resources
from services.shell.process import GC_YOUNG_THRESHOLD

T = TypeVar("T")
T0 = 1_700_000_000.0
TASK = Resources.parse("cpus:0.1;mem:32")


def setup(n: int, per_agent: int) -> tuple[AgentsCore, dict[str, Any], str]:
    """The emulator (its agents registered, tasks running) and the old master's registry."""
    res = Resources.parse(AGENT_RESOURCES.format(cpus=4, mem=8192)).to_proto()
    infos = [common_pb2.AgentInfo(hostname=f"emu-{i:05d}", address="127.0.0.1",
                                  endpoint="http://127.0.0.1:1", version="0.1", resources=res)
             for i in range(n)]
    emu = AgentsCore(infos, nonce=b"12345678")
    old = MasterCore("m1", 7, now=T0)
    sub = scheduler_pb2.SchedulerCall(subscribe=scheduler_pb2.SchedulerCall.Subscribe(
        framework_info=common_pb2.FrameworkInfo(name="bench", role="*", principal="bench",
                                                failover_timeout_s=3600)))
    old.scheduler_call(b"f1", sub, "sub", T0)
    fid = next(iter(old.frameworks))
    fw_info = common_pb2.FrameworkInfo()
    fw_info.CopyFrom(old.frameworks[fid].info)
    # Registered as the real emulator registers (its Register calls, the master's replies),
    # its tasks launched (RunTasks) and their updates acknowledged, as in bench.scale.
    pending = emu.master_detected(T0)
    while pending:
        cmd = pending.pop()
        if isinstance(cmd, ToMaster):
            for reply in old.agent_call(cmd.channel.encode(), cmd.call, T0):
                if isinstance(reply, ToAgent):
                    pending += emu.master_event(cmd.channel, reply.event, T0)
    Ev = agent_pb2.AgentEvent
    for a in emu.agents.values():
        run = Ev(run_tasks=Ev.RunTasks(frameworks=[fw_info], launches=[
            Ev.RunTasks.Launch(framework_id=fid, task=common_pb2.TaskInfo(
                task_id=f"{a.name}-t{j}", name=f"t{j}", agent_id=a.agent_id,
                resources=TASK.to_proto())) for j in range(per_agent)]))
        emu.master_event(a.name, run, T0)
        while any(t.pending for t in a.tasks.values()):
            acks = [Ev.Acknowledgements.Ack(framework_id=t.framework_id, task_id=t.info.task_id,
                                            uuid=t.pending[0].uuid)
                    for t in a.tasks.values() if t.pending]
            emu.master_event(a.name, Ev(acknowledgements=Ev.Acknowledgements(acks=acks)), T0)
    assert emu.running() == n * per_agent
    return emu, old.registry_document(), fid


def emulator_side(emu: AgentsCore, n: int) -> list[tuple[str, bytes]]:
    """Every agent's Reregister, serialised, with a reply to each as the window opens."""
    out: list[tuple[str, bytes]] = []
    pending = emu.master_detected(T0 + 2)
    while pending:
        cmd = pending.pop()
        if not isinstance(cmd, ToMaster):
            continue
        env = codec.Envelope()
        env.agent_call.CopyFrom(cmd.call)
        out.append((cmd.channel, env.SerializeToString()))
        a = emu.agents[cmd.channel]
        if cmd.call.WhichOneof("call") == "reregister":
            pending += emu.master_event(cmd.channel, agent_pb2.AgentEvent(
                reregistered=agent_pb2.AgentEvent.Reregistered(agent_id=a.agent_id)), T0 + 2)
    assert len(out) == n, (len(out), n)
    return out


def master_side(registry: dict[str, Any], followed: Followed | list[bus_pb2.StateEntry],
                calls: list[tuple[str, bytes]]) -> MasterCore:
    new = MasterCore("m2", 8, recovered_registry=registry, followed=followed,
                     now=T0 + 1)
    for channel, frame in calls:
        env = codec.Envelope()
        env.ParseFromString(frame)
        for cmd in new.agent_call(channel.encode(), env.agent_call, T0 + 2):
            if isinstance(cmd, Publish):  # each entry serialised once, as the shell does
                for e in cmd.entries:
                    e.SerializeToString()
            elif isinstance(cmd, ToAgent):
                out = codec.Envelope()
                out.agent_event.CopyFrom(cmd.event)
                out.SerializeToString()
    return new


def main() -> None:
    ap = argparse.ArgumentParser(prog="python -m bench.rereg_profile", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--agents", type=int, default=10_000)
    ap.add_argument("--tasks-per-agent", type=int, default=10)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--profile", choices=("emulator", "master"), default="")
    ap.add_argument("--followed", action="store_true",
                    help="the new master holds the old one's task records, as a standby that "
                         "followed its stream does (master/follow.py)")
    ap.add_argument("--gc", choices=("master", "default", "off"), default="master",
                    help="the collector's thresholds: the master's (its __main__), Python's "
                         "defaults, or no collection (the setup's heap is frozen either way)")
    args = ap.parse_args()
    if args.gc == "master":
        gc.set_threshold(GC_YOUNG_THRESHOLD, *gc.get_threshold()[1:])
    n, t = args.agents, args.tasks_per_agent
    best: dict[str, float] = {}
    for _ in range(args.repeat):
        emu, registry, _fid = setup(n, t)
        gc.collect()
        gc.freeze()  # the setup's heap: not scanned by the collections measured
        if args.gc == "off":
            gc.disable()
        calls = _timed(best, "emulator", args.profile, partial(emulator_side, emu, n))
        # The old leader's task records, as a standby following its stream holds them: as
        # a master rebuilds them from these re-registrations (the setup's old master
        # registered the agents only).
        # Indexed as the standby indexes them while following (not on the failover's path).
        followed = Followed.of(e for e in master_side(registry, [], calls).snapshot_entries()
                               if e.key.startswith(("agents/", "tasks/"))) \
            if args.followed else Followed()
        gc.collect()
        new = _timed(best, "master", args.profile, partial(master_side, registry, followed, calls))
        running = sum(1 for x in new.tasks.values() if x.state == tasks.RUNNING)
        assert running == n * t, (running, n * t)
        assert all(a.status == 1 for a in new.agents.values())
        if args.followed:
            assert new.tasks_held_back == n * t, new.tasks_held_back
        del emu, calls, new, followed
        gc.enable()
        gc.unfreeze()
        gc.collect()
    print(f"{n} agents x {t} tasks, min of {args.repeat} (CPU seconds; us per agent):")
    for side, s in best.items():
        print(f"  {side:<9} {s:6.2f} s  {s / n * 1e6:7.0f} us/agent")


def _timed(best: dict[str, float], side: str, profiled: str, fn: Callable[[], T]) -> T:
    """`fn()`, its CPU seconds kept in `best[side]` (the least so far); profiled (cProfile,
    printed) when `profiled` names this side."""
    prof = cProfile.Profile() if profiled == side else None
    started = time.process_time()
    if prof:
        prof.enable()
    out = fn()
    if prof:
        prof.disable()
    best[side] = min(best.get(side, 1e9), time.process_time() - started)
    if prof:
        pstats.Stats(prof).sort_stats("tottime").print_stats(30)
    return out


if __name__ == "__main__":
    main()
