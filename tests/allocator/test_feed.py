"""The allocator's stream feed: tasks seen before their agent or framework wait for it and
are counted as used when it appears, tasks without room are retried when resources come
back, and the waiting index forgets tasks that end (after a master failover 100,000 tasks
wait for their agents: each delta re-checks only the tasks it concerns)."""

from __future__ import annotations

from schemas import bus_pb2, common_pb2, state_pb2
from services.allocator.core import AllocatorCore
from services.allocator.feed import StreamFeed
from services.resources import Resources


def agent(aid: str, cpus: float = 4) -> bus_pb2.StateEntry:
    e = bus_pb2.StateEntry(key=f"agents/{aid}")
    rec = e.value.agent
    rec.status = state_pb2.AgentRecord.Status.AGENT_STATUS_REGISTERED
    rec.agent_info.agent_id, rec.agent_info.hostname = aid, f"host-{aid}"
    rec.agent_info.resources.extend(Resources.of(cpus=cpus, mem=4096).to_proto())
    return e


def framework(fid: str) -> bus_pb2.StateEntry:
    e = bus_pb2.StateEntry(key=f"frameworks/{fid}")
    e.value.framework.framework_info.framework_id = fid
    e.value.framework.framework_info.role = "*"
    e.value.framework.connected = True
    return e


def task(fid: str, tid: str, aid: str, cpus: float = 1) -> bus_pb2.StateEntry:
    e = bus_pb2.StateEntry(key=f"tasks/{fid}/{tid}")
    rec = e.value.task
    rec.framework_id, rec.agent_id = fid, aid
    rec.task_info.task_id = tid
    rec.task_info.resources.extend(Resources.of(cpus=cpus, mem=64).to_proto())
    rec.status.state = common_pb2.TASK_RUNNING
    return e


def deleted(key: str) -> bus_pb2.StateEntry:
    return bus_pb2.StateEntry(key=key, deleted=True)


def used(core: AllocatorCore, aid: str) -> float:
    return core.agents[aid].allocated().scalar("cpus") if aid in core.agents else 0.0


def test_tasks_wait_for_their_agent_and_framework_and_count_when_they_come() -> None:
    core = AllocatorCore()
    feed = StreamFeed(core)
    feed.apply([task("f1", "t1", "a1"), task("f1", "t2", "a2")])
    assert feed.waiting == {"tasks/f1/t1", "tasks/f1/t2"}
    feed.apply([agent("a1")])  # a1 known, f1 not yet: t1 now waits for its framework
    assert feed.waiting == {"tasks/f1/t1", "tasks/f1/t2"} and used(core, "a1") == 0
    feed.apply([framework("f1")])
    assert feed.waiting == {"tasks/f1/t2"} and used(core, "a1") == 1
    feed.apply([agent("a2")])
    assert not feed.waiting and used(core, "a2") == 1
    assert not feed._waiting_on and not feed._waits_for


def test_a_task_without_room_is_retried_when_resources_come_back() -> None:
    core = AllocatorCore()
    feed = StreamFeed(core)
    feed.apply([agent("a1", cpus=2), framework("f1"), task("f1", "t1", "a1", cpus=2)])
    feed.apply([task("f1", "t2", "a1", cpus=1)])  # no room: a1 is full
    assert feed.waiting == {"tasks/f1/t2"} and feed.notices
    feed.apply([deleted("tasks/f1/t1")])  # t1 ended: room for t2, in the same delta
    assert not feed.waiting and used(core, "a1") == 1


def test_tasks_that_end_while_waiting_leave_no_trace() -> None:
    core = AllocatorCore()
    feed = StreamFeed(core)
    feed.apply([task("f1", f"t{i}", "gone") for i in range(100)])
    assert len(feed.waiting) == 100 and len(feed._waits_for) == 100
    feed.apply([deleted(f"tasks/f1/t{i}") for i in range(100)])
    assert not feed.waiting and not feed._waiting_on and not feed._waits_for


def test_tasks_of_a_removed_agent_wait_for_it_to_come_back() -> None:
    core = AllocatorCore()
    feed = StreamFeed(core)
    feed.apply([agent("a1"), framework("f1"), task("f1", "t1", "a1")])
    assert used(core, "a1") == 1
    feed.apply([deleted("agents/a1")])
    assert feed.waiting == {"tasks/f1/t1"}
    feed.apply([agent("a1")])
    assert not feed.waiting and used(core, "a1") == 1
