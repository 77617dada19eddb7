"""The allocator's stream feed: tasks seen before their agent or framework wait for it and
are counted as used when it appears, tasks without room are retried when resources come
back, and the waiting index forgets tasks that end (after a master failover 100,000 tasks
wait for their agents: each delta re-checks only the tasks it concerns)."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from schemas import bus_pb2, common_pb2, state_pb2
from services.allocator.core import AllocatorCore
from services.allocator.feed import StreamFeed
from services.master.commands import Command as MasterCommand
from services.master.commands import Publish
from services.master.core import MasterCore
from services.resources import Resources
from tests.master.helpers import T0, Call, Internal, register, subscribed, task_info


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


# -- reservations, as the master publishes them (issue 9) -------------------------------------


def _master_and_feed() -> tuple[MasterCore, AllocatorCore, StreamFeed]:
    master = MasterCore("m1", 7, now=T0)
    core = AllocatorCore()
    return master, core, StreamFeed(core)


def _publish(feed: StreamFeed, cmds: list[MasterCommand]) -> None:
    for p in cmds:
        if isinstance(p, Publish):
            feed.apply(p.entries)


def test_a_static_reservation_is_offered_only_to_its_role() -> None:
    """An agent started with --resources "cpus(web):2;cpus:2;mem:1024": the master
    publishes that total, and the allocator offers cpus(web) to role web alone."""
    master, core, feed = _master_and_feed()
    register(master, b"a1", res="cpus(web):2;cpus:2;mem:1024")
    subscribed(master, b"f-batch", role="batch")
    feed.apply(master.snapshot_entries())
    [(fid, batch)] = [(a.framework_id, a.resources) for a in core.allocate(0.0).allocations]
    assert batch == Resources.parse("cpus:2;mem:1024")  # not the reservation
    web = subscribed(master, b"f-web", role="web")
    feed.apply(master.snapshot_entries())
    cycle = core.allocate(1.0)
    assert [(a.framework_id, a.resources) for a in cycle.allocations] == [
        (web, Resources.parse("cpus(web):2"))]
    core.recover(cycle.allocations[0].agent_id, web, Resources.parse("cpus(web):2"), 0, 1.0)
    core.recover(cycle.allocations[0].agent_id, fid, batch, 0, 1.0)
    _publish(feed, master.scheduler_call(b"f-web", Call(framework_id=web,
                                                        teardown=Call.Teardown()), "m", T0))
    assert web not in core.frameworks
    # Without its role's framework, nobody is offered the reservation.
    assert [(a.framework_id, a.resources) for a in core.allocate(2.0).allocations] == [
        (fid, batch)]
    core.validate()


def test_a_dynamic_reservation_moves_the_allocators_agent_total() -> None:
    """ACCEPT of an offer of the whole agent: RESERVE cpus(web):2, LAUNCH t1 on cpus(web):1.
    The broker recovers the remainder (cpus(web):1;cpus:2;mem:4096) at once; then the state
    stream brings the agent's new total and the task."""
    master, core, feed = _master_and_feed()
    aid = register(master, b"a1")
    fid = subscribed(master, b"f1", role="web")
    feed.apply(master.snapshot_entries())
    [offer] = core.allocate(0.0).allocations
    assert offer.resources == Resources.parse("cpus:4;mem:4096")
    reserve = Resources.parse("cpus(web):2")
    ops = [common_pb2.Operation(reserve=common_pb2.Operation.Reserve(
               resources=reserve.to_proto())),
           common_pb2.Operation(launch=common_pb2.Operation.Launch(tasks=[
               task_info("t1", "cpus(web):1")]))]
    core.recover(aid, fid, Resources.parse("cpus(web):1;cpus:2;mem:4096"), 0, 1.0)
    _publish(feed, master.internal_message(b"broker", Internal(
        launch_request=Internal.LaunchRequest(request_id="r", framework_id=fid,
                                              agent_id=aid, offer_ids=["o"],
                                              operations=ops)), T0))
    assert not feed.waiting and not feed.notices
    agent = core.agents[aid]
    assert agent.total == Resources.parse("cpus(web):2;cpus:2;mem:4096")
    assert agent.used == {fid: Resources.parse("cpus(web):1")} and not agent.offered
    [again] = core.allocate(2.0).allocations
    assert again.resources == Resources.parse("cpus(web):1;cpus:2;mem:4096")
    core.validate()


def _index_holds(feed: StreamFeed) -> None:
    """The applied keys by agent and by framework are exactly those of `applied`."""
    by_agent: dict[str, set[str]] = {}
    by_framework: dict[str, set[str]] = {}
    for key, use in feed.applied.items():
        by_agent.setdefault(use.agent_id, set()).add(key)
        by_framework.setdefault(use.framework_id, set()).add(key)
    assert feed._on_agent == by_agent and feed._of_framework == by_framework


def test_a_reset_without_some_agents_forgets_only_their_tasks_and_they_come_back() -> None:
    """A new master's snapshot taken before some agents re-registered: their tasks wait
    (the others stay counted), and count again when the agents come back."""
    core = AllocatorCore()
    feed = StreamFeed(core)
    agents = [agent(f"a{i}") for i in range(4)]
    tasks = [task(f"f{j}", f"t{i}-{j}", f"a{i}") for i in range(4) for j in range(2)]
    store = {e.key: e for e in [*agents, framework("f0"), framework("f1"), *tasks]}
    feed.reset(store)
    assert not feed.waiting and len(feed.applied) == 8
    _index_holds(feed)
    late = {"agents/a1", "agents/a3"}
    feed.reset({k: e for k, e in store.items() if k not in late})
    assert feed.waiting == {t.key for t in tasks if t.value.task.agent_id in ("a1", "a3")}
    assert all(used(core, a) == 2 for a in ("a0", "a2")) and used(core, "a1") == 0
    _index_holds(feed)
    feed.apply([deleted("frameworks/f1")])  # its tasks go: on a0 and a2 alone they were held
    assert used(core, "a0") == 1 and "tasks/f1/t0-1" in feed.waiting
    _index_holds(feed)
    feed.apply([agents[1], agents[3], framework("f1")])
    assert not feed.waiting and all(used(core, f"a{i}") == 2 for i in range(4))
    _index_holds(feed)
    core.validate()


def test_a_recovering_agent_keeps_its_tasks_counted_and_is_offered_nothing() -> None:
    """A new master's stream has the agents it waits for as RECOVERING, their tasks as the
    old leader had them: the allocator keeps them (no task forgotten and replayed, shares
    unchanged) and offers nothing on them until they are REGISTERED again. Before, they
    were removed and their 100,000 tasks waited and were applied again."""
    core = AllocatorCore()
    feed = StreamFeed(core)
    entries = [agent("a1"), agent("a2"), framework("f1"), task("f1", "t1", "a1"),
               task("f1", "t2", "a2", cpus=2)]
    feed.reset({e.key: e for e in entries})
    assert core.allocate(T0).allocations
    core.recover_all_offers()
    recovering = _copy(entries[0])
    recovering.value.agent.status = state_pb2.AgentRecord.Status.AGENT_STATUS_RECOVERING
    feed.reset({e.key: e for e in [recovering, *map(_copy, entries[1:])]})
    assert not feed.waiting and used(core, "a1") == 1 and core.away == {"a1"}
    assert {a.agent_id for a in core.allocate(T0 + 1).allocations} == {"a2"}
    core.recover_all_offers()
    feed.apply([_copy(entries[0])])  # re-registered
    assert not core.away and used(core, "a1") == 1
    assert "a1" in {a.agent_id for a in core.allocate(T0 + 2).allocations}
    # An agent first seen recovering (a fresh allocator) is not offered; its tasks wait.
    feed.apply([deleted("agents/a2")])
    late = _copy(entries[1])
    late.value.agent.status = state_pb2.AgentRecord.Status.AGENT_STATUS_RECOVERING
    feed.apply([late])
    assert "a2" not in core.agents and feed.waiting == {"tasks/f1/t2"}
    _index_holds(feed)
    core.validate()


def _copy(e: bus_pb2.StateEntry) -> bus_pb2.StateEntry:
    return bus_pb2.StateEntry.FromString(e.SerializeToString())


def test_a_reset_to_the_same_records_decodes_none_and_changes_nothing(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A new master re-announces what the allocator already follows (new messages, the
    same bytes): nothing is decoded again, nothing changes."""
    from services.allocator import feed as feed_module

    core = AllocatorCore()
    feed = StreamFeed(core)
    entries = [agent("a1"), agent("a2"), framework("f1"), task("f1", "t1", "a1"),
               task("f1", "t2", "a2", cpus=2)]
    assert feed.apply(entries)
    decoded: list[str] = []

    def counted(name: str) -> Callable[[state_pb2.StateValue | None], object]:
        real = getattr(feed_module, name)

        def decode(value: state_pb2.StateValue | None) -> object:
            decoded.append(name)
            return real(value)
        return decode

    for name in ("_agent", "_framework", "_task"):
        monkeypatch.setattr(feed_module, name, counted(name))
    assert not feed.apply([_copy(e) for e in entries])
    feed.reset({e.key: e for e in map(_copy, entries)})
    assert decoded == [] and used(core, "a1") == 1 and used(core, "a2") == 2
    # One record changed: it alone is decoded.
    changed = task("f1", "t2", "a2", cpus=2)
    changed.value.task.status.state = common_pb2.TASK_FINISHED
    feed.reset({e.key: e for e in map(_copy, [*entries[:4], changed])})
    assert decoded == ["_task"] and used(core, "a2") == 0
    core.validate()


def test_a_refused_record_is_tried_again_when_it_comes_again() -> None:
    """An agent's total that no longer holds what is allocated is refused (the old one
    kept); the same record again, once the task ended, is applied."""
    core = AllocatorCore()
    feed = StreamFeed(core)
    feed.apply([agent("a1", cpus=4), framework("f1"), task("f1", "t1", "a1", cpus=3)])
    smaller = agent("a1", cpus=2)
    feed.apply([smaller])
    assert core.agents["a1"].total.scalar("cpus") == 4 and feed.notices
    feed.apply([deleted("tasks/f1/t1")])
    feed.apply([_copy(smaller)])
    assert core.agents["a1"].total.scalar("cpus") == 2
    core.validate()


def test_tasks_forgotten_with_their_agent_count_again_from_the_same_records() -> None:
    """Tasks whose agent was removed wait; when the agent and the same task records come
    back (a reset), they are counted again (a waiting task's record is never skipped)."""
    core = AllocatorCore()
    feed = StreamFeed(core)
    entries = [agent("a1"), framework("f1"), task("f1", "t1", "a1")]
    feed.reset({e.key: e for e in entries})
    feed.apply([deleted("agents/a1")])
    assert feed.waiting == {"tasks/f1/t1"}
    feed.reset({e.key: e for e in map(_copy, entries)})
    assert not feed.waiting and used(core, "a1") == 1
    core.validate()


def test_an_agents_tasks_that_do_not_all_fit_are_applied_one_by_one() -> None:
    """An agent's tasks of one framework arriving together are taken as one sum (issue 8:
    an agent re-registering after a failover brings them all); when the sum does not fit,
    each is tried on its own, in key order, as before: those that fit count, the rest
    wait (one notice each) and are retried when room comes back."""
    core = AllocatorCore()
    feed = StreamFeed(core)
    feed.apply([agent("a1", cpus=3), framework("f1"), framework("f2")])
    feed.apply([task("f1", "t1", "a1"), task("f1", "t2", "a1"), task("f1", "t3", "a1"),
                task("f1", "t4", "a1"), task("f2", "u1", "a1", cpus=0.5)])
    assert used(core, "a1") == 3
    assert feed.waiting == {"tasks/f1/t4", "tasks/f2/u1"}, feed.waiting
    assert sorted(n.kind for n in feed.notices) == ["usage_waiting", "usage_waiting"]
    assert core.agents["a1"].used["f1"].scalar("cpus") == 3
    feed.apply([deleted("tasks/f1/t1")])  # room for one: t4 (f1) or u1 (f2) fit
    assert used(core, "a1") == 3
    feed.apply([deleted("tasks/f1/t2"), deleted("tasks/f1/t3")])
    assert not feed.waiting and used(core, "a1") == 1.5
    core.validate()


def test_an_agents_tasks_back_together_count_once_each() -> None:
    """Tasks of two frameworks on two agents, arriving in one delta, are each counted once
    on their own agent and framework."""
    core = AllocatorCore()
    feed = StreamFeed(core)
    feed.apply([agent("a1"), agent("a2"), framework("f1"), framework("f2"),
                *(task("f1", f"t{i}", "a1", cpus=0.5) for i in range(3)),
                *(task("f2", f"u{i}", "a1", cpus=0.25) for i in range(2)),
                *(task("f1", f"v{i}", "a2", cpus=1) for i in range(2))])
    assert not feed.waiting
    assert core.agents["a1"].used["f1"].scalar("cpus") == 1.5
    assert core.agents["a1"].used["f2"].scalar("cpus") == 0.5
    assert core.agents["a2"].used["f1"].scalar("cpus") == 2
    assert len(feed.applied) == 7
    core.validate()


def test_each_task_counts_its_own_shape_between_equal_ones() -> None:
    """Runs of equal shapes are decoded once (issue 8): a task of another shape between
    them, and a malformed one, still count as their own records say."""
    core = AllocatorCore()
    feed = StreamFeed(core)
    bad = task("f1", "bad", "a1", cpus=1)
    bad.value.task.task_info.resources[0].scalar = -1.0  # malformed: not counted
    feed.apply([agent("a1", cpus=8), framework("f1"),
                task("f1", "t1", "a1", cpus=1), task("f1", "t2", "a1", cpus=1),
                task("f1", "t3", "a1", cpus=2), bad, task("f1", "t4", "a1", cpus=1),
                task("f1", "t5", "a1", cpus=0.5)])
    assert used(core, "a1") == 5.5
    assert {k: u.resources.scalar("cpus") for k, u in feed.applied.items()} == {
        "tasks/f1/t1": 1, "tasks/f1/t2": 1, "tasks/f1/t3": 2, "tasks/f1/t4": 1,
        "tasks/f1/t5": 0.5}
    core.validate()
