"""The standby's index of the leader's agent and task records (master/followed.py), kept as
each change comes: through any run of changes, deletions, tasks moving between agents and
whole snapshots, it is the index of the store as it stands; and a new reign holds from it
exactly what it held from the store's entries."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from schemas import bus_pb2
from services.master.core import MasterCore
from services.master.followed import KINDS, Followed
from services.tasks import RUNNING
from tests.master.helpers import T0, cluster, launch, running

AGENTS = ("a1", "a2", "a3")


def _task(fid: str, tid: str, aid: str, state: int = 0) -> bus_pb2.StateEntry:
    e = bus_pb2.StateEntry(key=f"tasks/{fid}/{tid}")
    e.value.task.agent_id = aid
    e.value.task.status.state = state  # type: ignore[assignment]
    e.value.task.task_info.task_id = tid
    e.value.task.task_info.resources.add(name="cpus", scalar=0.5)
    if tid == "w":  # not a quantity: no record is made (its agent's report is read)
        del e.value.task.task_info.resources[:]
        e.value.task.task_info.resources.add(name="cpus")
    return e


def _agent(aid: str) -> bus_pb2.StateEntry:
    e = bus_pb2.StateEntry(key=f"agents/{aid}")
    e.value.agent.agent_info.agent_id = aid
    return e


def _deleted(key: str) -> bus_pb2.StateEntry:
    return bus_pb2.StateEntry(key=key, deleted=True)


change = st.one_of(
    st.tuples(st.just("task"), st.sampled_from(("f1", "f2")), st.sampled_from("tuvw"),
              st.sampled_from(AGENTS), st.sampled_from((1, 3, 5))),
    st.tuples(st.just("agent"), st.sampled_from(AGENTS)),
    st.tuples(st.just("delete"), st.sampled_from(
        [f"tasks/{f}/{t}" for f in ("f1", "f2") for t in "tuvw"]
        + [f"agents/{a}" for a in AGENTS] + ["frameworks/f1"])),
    st.tuples(st.just("framework"), st.sampled_from(("f1", "f2"))),
)


def _entry(c: tuple[str, ...]) -> bus_pb2.StateEntry:
    if c[0] == "task":
        return _task(c[1], c[2], c[3], int(c[4]))
    if c[0] == "agent":
        return _agent(c[1])
    if c[0] == "framework":
        return bus_pb2.StateEntry(key=f"frameworks/{c[1]}")
    return _deleted(c[1])


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(st.booleans(), st.lists(change, max_size=6)), max_size=12))
def test_the_index_kept_as_changes_come_is_the_index_of_the_store(
        steps: list[tuple[bool, list[tuple[str, ...]]]]) -> None:
    store: dict[str, bus_pb2.StateEntry] = {}
    index = Followed()
    for reset, changes in steps:
        entries = [_entry(c) for c in changes]
        for e in entries:
            if e.deleted:
                store.pop(e.key, None)
            else:
                store[e.key] = e
        if reset:  # a whole snapshot replaced the store
            index.reset(e for k, e in store.items() if k.startswith(KINDS))
        else:
            index.apply(entries)
        index.validate()
        fresh = Followed.of(store.values())
        assert (index.tasks, index.task_agent, index.agents, index.digests, index.made) == (
            fresh.tasks, fresh.task_agent, fresh.agents, fresh.digests, fresh.made)
        assert index.made.keys() == {  # the records of RUNNING tasks, made as they come
            k for k, aid in index.task_agent.items() if k[1] != "w"
            and index.tasks[aid][k].value.task.status.state == RUNNING}


def test_a_reign_holds_the_same_from_the_index_as_from_the_entries() -> None:
    """Including an agent that is not recovering (its records are not held)."""
    old, aid, fid = cluster()
    running(old, aid, fid, "t1", "t2")
    launch(old, fid, aid, "t3", rid="r3")
    entries = [e for e in old.snapshot_entries() if e.key.startswith(KINDS)]
    entries += [_agent("elsewhere"), _task(fid, "t9", "elsewhere")]
    doc = old.registry_document()
    from_list = MasterCore("m2", 8, recovered_registry=doc, followed=entries, now=T0 + 1)
    from_index = MasterCore("m2", 8, recovered_registry=doc, followed=Followed.of(entries),
                            now=T0 + 1)
    for core in (from_list, from_index):
        core.validate()
        assert core.held.keys() == {aid} and len(core.held[aid]) == 3
        assert core.held_agents.keys() == {aid}
    assert from_index.held == from_list.held and from_index.held_keys == from_list.held_keys
    assert from_index.snapshot_entries() == from_list.snapshot_entries()
    assert len(from_index.held_keys) == 3
