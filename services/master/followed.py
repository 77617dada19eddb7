"""The leading master's agent and task records as a standby follows them, indexed by agent as
each change comes (a few microseconds a record, spread over the leader's reign), so that a
standby elected takes them whole: indexing 110,000 entries at the start of its reign was
0.2 s of the failover's critical path (issue 8 d). Pure: no sockets, no clock."""

from __future__ import annotations

from collections.abc import Iterable

from schemas import bus_pb2, state_pb2
from services.master.records import Task, parse_resources
from services.report_digest import MASK, item
from services.tasks import RUNNING

TaskKey = tuple[str, str]  # (framework id, task id), as records.TaskKey
KINDS = ("agents/", "tasks/")  # what a new leader holds of its predecessor's stream


class Followed:
    """`tasks`: agent id -> task key -> its entry; `agents`: agent id -> its entry;
    `task_agent`: task key -> agent id (the same facts, by task); `digests`: agent id -> the
    report digest of its records (report_digest.py), kept as they change; `made`: task key ->
    the master's record of it, made from its entry as it comes once RUNNING (a task taken
    back whole after a failover is not made on its path: 100,000 at 10k agents; one in
    another state is made there). Entries are the stream's own objects, never copied;
    deleted keys are forgotten."""

    def __init__(self) -> None:
        self.tasks: dict[str, dict[TaskKey, bus_pb2.StateEntry]] = {}
        self.task_agent: dict[TaskKey, str] = {}
        self.agents: dict[str, bus_pb2.StateEntry] = {}
        self.digests: dict[str, int] = {}
        self.items: dict[TaskKey, int] = {}  # each record's part of its agent's digest
        self.made: dict[TaskKey, Task] = {}

    @classmethod
    def of(cls, entries: Iterable[bus_pb2.StateEntry]) -> Followed:
        index = cls()
        index.apply(entries)
        return index

    def __len__(self) -> int:
        return len(self.task_agent) + len(self.agents)

    def reset(self, entries: Iterable[bus_pb2.StateEntry]) -> None:
        """The whole store was replaced (a snapshot): index it afresh."""
        self.tasks, self.task_agent, self.agents, self.digests = {}, {}, {}, {}
        self.items, self.made = {}, {}
        self.apply(entries)

    def apply(self, entries: Iterable[bus_pb2.StateEntry]) -> None:
        """These entries changed (in stream order); other kinds of keys are ignored."""
        tasks, task_agent, agents, digests = self.tasks, self.task_agent, self.agents, \
            self.digests
        made, items = self.made, self.items
        for entry in entries:
            kind, _, name = entry.key.partition("/")
            if kind == "tasks":
                fid, _, tid = name.partition("/")
                key = (fid, tid)
                was = task_agent.pop(key, None)
                if was is not None:
                    records = tasks[was]
                    del records[key]
                    digests[was] = (digests[was] - items.pop(key)) & MASK
                    if not records:
                        del tasks[was], digests[was]
                made.pop(key, None)
                if not entry.deleted:
                    record = entry.value.task
                    aid = record.agent_id
                    status = record.status
                    part = items[key] = item(fid, tid, status.state, status.executor_id)
                    if status.state == RUNNING:  # settled: most tasks at a failover
                        task = made_record(key, aid, record)
                        if task is not None:
                            made[key] = task
                    held = tasks.get(aid)
                    if held is None:
                        tasks[aid] = {key: entry}
                        digests[aid] = part
                    else:
                        held[key] = entry
                        digests[aid] = (digests[aid] + part) & MASK
                    task_agent[key] = aid
            elif kind == "agents":
                if entry.deleted:
                    agents.pop(name, None)
                else:
                    agents[name] = entry

    def validate(self) -> None:
        assert self.task_agent == {k: aid for aid, recs in self.tasks.items() for k in recs}
        assert all(self.tasks.values()), "an agent indexed without tasks"
        assert self.items == {k: record_item(k, e) for recs in self.tasks.values()
                              for k, e in recs.items()}
        assert self.digests == {aid: sum(self.items[k] for k in recs) & MASK
                                for aid, recs in self.tasks.items()}
        assert self.made.keys() <= self.task_agent.keys()
        for key, task in self.made.items():
            record = self.tasks[self.task_agent[key]][key].value.task
            assert (task.key, task.agent_id, task.status, task.launched_at) == (
                key, record.agent_id, record.status, record.launched_at_us / 1e6)


def record_item(key: TaskKey, entry: bus_pb2.StateEntry) -> int:
    """A followed task record's part of its agent's report digest."""
    status = entry.value.task.status
    return item(key[0], key[1], status.state, status.executor_id)


def made_record(key: TaskKey, aid: str, record: state_pb2.TaskRecord) -> Task | None:
    """The master's record of a followed task, its parts the entry's (taken, not copied); None
    when its resources do not parse or its key is not its task's (the agent's report is
    read instead)."""
    info = record.task_info
    if info.task_id != key[1]:
        return None
    try:
        resources = parse_resources(info.resources)
    except ValueError:
        return None
    return Task(key[0], aid, info, record.status, resources, record.launched_at_us / 1e6,
                record.traceparent, tuple(record.offer_ids))
