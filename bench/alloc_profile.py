"""An in-process driver of the allocator's feed and core (issue 8): the two phases where the
leading allocator is busiest in `bench.scale` at 10,000 agents, without sockets or other
processes, so their CPU cost can be timed (min of N) and profiled without noise.

- failover_reset: the allocator knows N agents and N x T running tasks; a new master's
  snapshot brings the same records again (fresh messages, the same bytes): `feed.reset`.
- failover_deltas: the same records re-announced as deltas, one agent and its T tasks
  each (agents re-registering), with new registration times in the agent records.
- failover_partial: as failover_reset, but a tenth of the agents re-register after the
  snapshot: they and their tasks are deleted by the reset and come back as deltas.
- failover_rejoin: as failover_reset, but the snapshot has no agent nor task (a new master
  leads before its agents re-register): every agent and its tasks come back as deltas.
- launch: one framework (the scale bench's), N agents; cycles of `core.allocate`, each
  allocation accepted with T tasks of 0.1 cpus / 32 MB; the remainder recovered as the
  shell does; the master's records as it publishes them, in deltas of CHUNK agents' tasks
  (tasks STAGING with the agent's and the framework's records, then the tasks RUNNING).

`python -m bench.alloc_profile --agents 10000 --repeat 3 [--profile launch]` prints CPU
seconds per phase (min of the repeats) and per record or task. The code measured is the
worktree's: run it at two commits to compare them (alternately)."""

from __future__ import annotations

import time
from collections.abc import Callable

from bench import inprocess
from schemas import bus_pb2, common_pb2, state_pb2
from services.allocator.core import AllocatorCore
from services.allocator.feed import StreamFeed, norm
from services.resources import Resources

AGENT_RESOURCES = "cpus:4;mem:4096;disk:10240;ports:[31000-32000]"  # as the emulator's
TASK = Resources.of(cpus=0.1, mem=32)
FID = "fw-F1"
REGISTERED = state_pb2.AgentRecord.Status.AGENT_STATUS_REGISTERED
US = 1_700_000_000_000_000
CHUNK = 100  # agents launched on per delta: deltas of ~1,000 task records, as in bench.scale


def times(r: Resources, n: int) -> Resources:
    return Resources.total([r] * n)


def agent_entry(i: int, used: Resources, t_us: int) -> bus_pb2.StateEntry:
    aid = f"ag-S{i}"
    e = bus_pb2.StateEntry(key=f"agents/{aid}")
    rec = e.value.agent
    info = rec.agent_info
    info.agent_id, info.hostname, info.address = aid, f"emu-{i}", "127.0.0.1"
    info.endpoint, info.version = f"127.0.0.1:{20000 + i % 40000}", "0.1"
    info.resources.extend(Resources.parse(AGENT_RESOURCES).to_proto())
    rec.status = REGISTERED
    rec.used_resources.extend(used.to_proto())
    rec.registered_at_us, rec.last_seen_us = t_us, t_us
    return e


def framework_entry(offered: Resources, used: Resources) -> bus_pb2.StateEntry:
    e = bus_pb2.StateEntry(key=f"frameworks/{FID}")
    rec = e.value.framework
    rec.framework_info.framework_id, rec.framework_info.name = FID, "load"
    rec.framework_info.role, rec.framework_info.principal = "*", "load"
    rec.framework_info.failover_timeout_s = 3600
    rec.connected, rec.registered_at_us = True, US
    rec.offered_resources.extend(offered.to_proto())
    rec.used_resources.extend(used.to_proto())
    return e


def task_entry(agent: int, n: int, state: common_pb2.TaskState.ValueType
               ) -> bus_pb2.StateEntry:
    tid = f"load-{agent * 1000 + n}"
    e = bus_pb2.StateEntry(key=f"tasks/{FID}/{tid}")
    rec = e.value.task
    rec.framework_id, rec.agent_id = FID, f"ag-S{agent}"
    info = rec.task_info
    info.task_id, info.name, info.agent_id = tid, tid, f"ag-S{agent}"
    info.resources.extend(TASK.to_proto())
    info.command.value = "true"
    info.labels["offerbus.emulator/run_s"] = "inf"
    rec.status.task_id, rec.status.agent_id, rec.status.state = tid, f"ag-S{agent}", state
    rec.status.timestamp_us, rec.status.uuid = US, b"%016d" % (agent * 1000 + n)
    rec.status.source = common_pb2.TaskStatus.Source.SOURCE_EXECUTOR
    rec.launched_at_us = US
    rec.traceparent = f"00-{agent:032x}-{n:016x}-01"
    rec.offer_ids.append(f"o-{agent}")
    return e


def copy(e: bus_pb2.StateEntry) -> bus_pb2.StateEntry:
    """The same record as a new snapshot brings it: a new message, the same bytes."""
    return bus_pb2.StateEntry.FromString(e.SerializeToString())


def running_feed(agents: int, per_agent: int) -> tuple[StreamFeed, list[bus_pb2.StateEntry]]:
    used = times(TASK, per_agent)
    entries = [agent_entry(i, used, US) for i in range(agents)]
    entries.append(framework_entry(Resources(), times(TASK, agents * per_agent)))
    entries += [task_entry(i, n, common_pb2.TASK_RUNNING)
                for i in range(agents) for n in range(per_agent)]
    feed = StreamFeed(AllocatorCore(id_prefix="a1-"))
    feed.reset({e.key: e for e in entries})
    assert not feed.waiting, "every task counted"
    return feed, entries


def failover_reset(agents: int, per_agent: int) -> tuple[Callable[[], float], int]:
    feed, entries = running_feed(agents, per_agent)
    store = {e.key: e for e in map(copy, entries)}

    def run() -> float:
        feed.reset(store)
        return 0.0
    return run, len(store)


def failover_deltas(agents: int, per_agent: int) -> tuple[Callable[[], float], int]:
    feed, _ = running_feed(agents, per_agent)
    used = times(TASK, per_agent)
    deltas = [[agent_entry(i, used, US + 1_000_000),
               *(task_entry(i, n, common_pb2.TASK_RUNNING) for n in range(per_agent))]
              for i in range(agents)]

    def run() -> float:
        for d in deltas:
            feed.apply(d)
        return 0.0
    return run, sum(map(len, deltas))


def failover_partial(agents: int, per_agent: int) -> tuple[Callable[[], float], int]:
    """A new master's snapshot taken while a tenth of the agents had not re-registered yet:
    they and their tasks are deleted, then come back as deltas (one agent and its tasks)."""
    feed, entries = running_feed(agents, per_agent)
    late = {f"ag-S{i}" for i in range(0, agents, 10)}
    store = {e.key: e for e in map(copy, entries)
             if e.key.removeprefix("agents/") not in late
             and not (e.key.startswith("tasks/") and e.value.task.agent_id in late)}
    back_of: dict[str, list[bus_pb2.StateEntry]] = {a: [] for a in sorted(late)}
    for e in entries:
        a = e.key.removeprefix("agents/") if e.key.startswith("agents/") else \
            e.value.task.agent_id if e.key.startswith("tasks/") else ""
        if a in back_of:
            back_of[a].append(copy(e))
    return _rejoin(feed, store, list(back_of.values()), agents * per_agent)


def _rejoin(feed: StreamFeed, store: dict[str, bus_pb2.StateEntry],
            back: list[list[bus_pb2.StateEntry]], tasks: int
            ) -> tuple[Callable[[], float], int]:
    """A run: the new master's snapshot `store`, then the agents coming `back` as deltas."""
    def run() -> float:
        feed.reset(store)
        for d in back:
            feed.apply(d)
        assert not feed.waiting and len(feed.applied) == tasks
        return 0.0
    return run, len(store) + sum(map(len, back))


def failover_rejoin(agents: int, per_agent: int) -> tuple[Callable[[], float], int]:
    """A new master's first snapshot: the framework (from its registry) and no agent or task
    (its agents re-register after it leads); then every agent comes back as a delta (its
    record and its tasks', as the master publishes a re-registration)."""
    feed, entries = running_feed(agents, per_agent)
    store = {e.key: e for e in map(copy, entries) if e.key.startswith("frameworks/")}
    back_of: dict[str, list[bus_pb2.StateEntry]] = {}
    for e in entries:
        a = e.key.removeprefix("agents/") if e.key.startswith("agents/") else \
            e.value.task.agent_id if e.key.startswith("tasks/") else ""
        if a:
            back_of.setdefault(a, []).append(copy(e))
    return _rejoin(feed, store, list(back_of.values()), agents * per_agent)


def launch(agents: int, per_agent: int) -> tuple[Callable[[], float], int]:
    feed = StreamFeed(AllocatorCore(id_prefix="a1-"))
    feed.reset({e.key: e for e in [*(agent_entry(i, Resources(), US) for i in range(agents)),
                                   framework_entry(Resources(), Resources())]})
    core = feed.core
    index = {f"ag-S{i}": i for i in range(agents)}
    take = times(TASK, per_agent)
    staging = [[task_entry(i, n, common_pb2.TASK_STAGING) for n in range(per_agent)]
               for i in range(agents)]
    running = [[task_entry(i, n, common_pb2.TASK_RUNNING) for n in range(per_agent)]
               for i in range(agents)]
    loaded = [agent_entry(i, take, US) for i in range(agents)]

    def run() -> float:
        """Returns the CPU seconds spent making the framework's records (not the feed's)."""
        now, launched, making = 1.0, 0, 0.0
        offered, used = Resources(), Resources()
        while launched < agents * per_agent:
            cycle = core.allocate(now)
            assert cycle.allocations, "each cycle offers"
            t0 = time.process_time()
            for a in cycle.allocations:
                offered += a.resources.quantities()
            fw = framework_entry(offered, used)
            making += time.process_time() - t0
            feed.apply([fw])  # the master relayed the offers
            allocs = list(cycle.allocations)
            for at in range(0, len(allocs), CHUNK):  # the master publishes in batches
                launched_now, ran = [], []
                for a in allocs[at:at + CHUNK]:
                    i = index[a.agent_id]
                    t0 = time.process_time()
                    offered -= a.resources.quantities()
                    used += take
                    rest = (a.resources - take).to_proto()
                    making += time.process_time() - t0
                    core.recover(a.agent_id, FID, norm(rest), 3600, now)  # the remainder
                    launched_now += [*staging[i], loaded[i]]
                    ran += running[i]
                t0 = time.process_time()
                fw = framework_entry(offered, used)
                making += time.process_time() - t0
                feed.apply([*launched_now, fw])
                feed.retry()
                feed.apply(ran)
                launched += len(ran)
            now += 0.05
        assert not feed.waiting
        return making
    return run, agents * per_agent


PHASES = {"failover_reset": failover_reset, "failover_deltas": failover_deltas,
          "failover_partial": failover_partial, "failover_rejoin": failover_rejoin,
          "launch": launch}


def main() -> None:
    inprocess.main("alloc_profile", __doc__ or "", PHASES, agents=10000, item="item")


if __name__ == "__main__":
    main()
