"""The executor core on its own (no sockets, no clock): state sequences, kill -> KILLED, OOM,
launch failures, the retry schedule, acknowledgements, exit after the terminal ack, the agent
recovery timeout; and hypothesis: random event orders never make an illegal transition."""

from __future__ import annotations

import itertools
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from schemas import common_pb2
from services import tasks
from services.executor.core import (
    EXIT_AGENT_GONE,
    EXIT_OK,
    Command,
    ExecutorCore,
    Exit,
    KillContainer,
    SendUpdate,
    StartContainer,
    retry_interval,
)
from services.executor.runtime import ContainerSpec, spec_from_task

TaskStatus = common_pb2.TaskStatus
T0 = 1_700_000_000.0


def make_task(task_id: str = "t1", grace: float | None = None) -> common_pb2.TaskInfo:
    task = common_pb2.TaskInfo(task_id=task_id, agent_id="a1")
    task.command.shell = True
    task.command.value = "echo hello"
    task.container.type = common_pb2.ContainerInfo.CONTAINER_TYPE_DOCKER
    task.container.docker.image = "offerbus/busybox:latest"
    if grace is not None:
        task.kill_grace_period_s = grace
    return task


def core(**kw: float) -> ExecutorCore:
    c = ExecutorCore("e1", "f1", T0, **kw)  # type: ignore[arg-type]
    c.subscribed("a1", T0)
    return c


def updates(cmds: list[Command]) -> list[TaskStatus]:
    return [c.status for c in cmds if isinstance(c, SendUpdate)]


def states(cmds: list[Command]) -> list[int]:
    return [s.state for s in updates(cmds)]


def ack_all(c: ExecutorCore, now: float = T0) -> list[Command]:
    out: list[Command] = []
    for u in list(c.unacked):
        out += c.acknowledged(u, now)
    return out


def test_happy_path_and_exit_after_terminal_ack() -> None:
    c = core()
    out = c.launch(make_task(), "f1", T0)
    assert states(out) == [tasks.STARTING]
    assert [type(x) for x in out if not isinstance(x, SendUpdate)] == [StartContainer]
    assert states(c.container_started("cid", T0 + 0.1)) == [tasks.RUNNING]
    out = c.container_exited(0, False, "", T0 + 1)
    [fin] = updates(out)
    assert fin.state == tasks.FINISHED and fin.exit_code == 0 and fin.container_id == "cid"
    assert not any(isinstance(x, Exit) for x in out), "waits for the ack"
    for s in updates(out):
        assert s.source == TaskStatus.SOURCE_EXECUTOR and s.executor_id == "e1"
        assert len(s.uuid) == 16 and s.timestamp_us == int((T0 + 1) * 1e6)
    first_two = list(c.unacked)[:2]
    assert [x for u in first_two for x in c.acknowledged(u, T0 + 1)] == []
    [done] = c.acknowledged(fin.uuid, T0 + 1)
    assert isinstance(done, Exit) and done.code == EXIT_OK
    c.validate()


def test_every_update_has_a_fresh_uuid() -> None:
    c = core()
    out = c.launch(make_task(), "f1", T0) + c.container_started("cid", T0)
    out += c.kill(None, T0) + c.container_exited(137, False, "", T0)
    uuids = [s.uuid for s in updates(out)]
    assert len(uuids) == 4 and len(set(uuids)) == 4


def test_nonzero_exit_fails_with_code() -> None:
    c = core()
    c.launch(make_task(), "f1", T0)
    c.container_started("cid", T0)
    [s] = updates(c.container_exited(3, False, "", T0))
    assert s.state == tasks.FAILED and s.exit_code == 3 and s.message == "exited with 3"
    assert s.reason == TaskStatus.REASON_COMMAND_EXECUTOR_FAILED


def test_oom_reason() -> None:
    c = core()
    c.launch(make_task(), "f1", T0)
    c.container_started("cid", T0)
    [s] = updates(c.container_exited(137, True, "", T0))
    assert s.state == tasks.FAILED and s.reason == TaskStatus.REASON_CONTAINER_LIMITATION_MEMORY


def test_kill_gives_killed_not_failed() -> None:
    c = core()
    c.launch(make_task(grace=1.5), "f1", T0)
    c.container_started("cid", T0)
    out = c.kill(None, T0 + 1)
    assert states(out) == [tasks.KILLING] and KillContainer(1.5) in out
    assert c.kill(0.1, T0 + 1) == [], "a second kill changes nothing"
    [s] = updates(c.container_exited(143, False, "", T0 + 2))
    assert s.state == tasks.KILLED and s.exit_code == 143


def test_kill_grace_override_and_default() -> None:
    c = core()
    c.launch(make_task(), "f1", T0)
    c.container_started("cid", T0)
    assert KillContainer(0.2) in c.kill(0.2, T0)
    d = core()
    d.launch(make_task(), "f1", T0)
    d.container_started("cid", T0)
    assert KillContainer(3.0) in d.kill(None, T0)


def test_kill_while_starting_kills_once_up() -> None:
    c = core()
    c.launch(make_task(), "f1", T0)
    out = c.kill(None, T0)
    assert states(out) == [tasks.KILLING] and not any(isinstance(x, KillContainer) for x in out)
    assert c.container_started("cid", T0) == [KillContainer(3.0)]
    assert states(c.container_exited(137, False, "", T0)) == [tasks.KILLED]


def test_kill_while_starting_then_launch_fails() -> None:
    c = core()
    c.launch(make_task(), "f1", T0)
    c.kill(None, T0)
    [s] = updates(c.launch_failed(TaskStatus.REASON_IMAGE_NOT_FOUND, "no image", T0))
    assert s.state == tasks.KILLED
    assert s.reason == TaskStatus.REASON_TASK_KILLED_DURING_LAUNCH


def test_launch_failed_reports_reason_and_exits_after_ack() -> None:
    c = core()
    c.launch(make_task(), "f1", T0)
    [s] = updates(c.launch_failed(TaskStatus.REASON_IMAGE_NOT_FOUND, "image x missing", T0))
    assert s.state == tasks.FAILED and s.reason == TaskStatus.REASON_IMAGE_NOT_FOUND
    assert s.message == "image x missing"
    assert any(isinstance(x, Exit) for x in ack_all(c))


def test_second_task_is_refused_without_touching_the_first() -> None:
    c = core()
    c.launch(make_task(), "f1", T0)
    [s] = updates(c.launch(make_task("other"), "f1", T0))
    assert s.task_id == "other" and s.state == tasks.ERROR
    assert c.launch(make_task(), "f1", T0) == [], "a resent Launch is ignored"
    assert c.state == tasks.STARTING


def test_retry_schedule_doubles_to_cap_and_stops_on_ack() -> None:
    assert [retry_interval(n) for n in range(1, 7)] == [0.5, 1.0, 2.0, 4.0, 5.0, 5.0]
    c = core()
    [starting] = updates(c.launch(make_task(), "f1", T0))
    sent_at = []
    now = T0
    for _ in range(7):
        deadline = c.next_deadline()
        assert deadline is not None
        now = deadline
        out = c.tick(now)
        assert updates(out) == [starting]
        sent_at.append(round(now - T0, 3))
    assert sent_at == [0.5, 1.5, 3.5, 7.5, 12.5, 17.5, 22.5]
    c.acknowledged(starting.uuid, now)
    assert c.tick(now + 100) == []


def test_no_resend_while_disconnected_and_subscribe_carries_unacked() -> None:
    c = core()
    c.launch(make_task(), "f1", T0)
    c.container_started("cid", T0)
    c.disconnected(T0 + 0.1)
    assert c.tick(T0 + 10) == []
    statuses, pending_tasks = c.subscribe_payload()
    assert [s.state for s in statuses] == [tasks.STARTING, tasks.RUNNING]
    assert [t.task_id for t in pending_tasks] == ["t1"]
    c.subscribed("a1", T0 + 11)
    assert c.tick(T0 + 11.2) == []
    assert len(updates(c.tick(T0 + 11.5))) == 2
    ack_all(c, T0 + 12)
    assert c.subscribe_payload() == ([], [])


def test_agent_gone_past_recovery_timeout_kills_and_exits() -> None:
    c = core(recovery_timeout_s=60.0)
    c.launch(make_task(), "f1", T0)
    c.container_started("cid", T0)
    c.disconnected(T0 + 1)
    assert c.next_deadline() == T0 + 61
    assert c.tick(T0 + 60) == []
    out = c.tick(T0 + 61)
    assert states(out) == [tasks.KILLING] and KillContainer(3.0) in out
    out = c.container_exited(137, False, "", T0 + 64)
    assert states(out) == [tasks.KILLED]
    assert out[-1] == Exit(EXIT_AGENT_GONE, "the agent did not come back; task killed")
    c.validate()


def test_agent_back_in_time_keeps_the_task() -> None:
    c = core(recovery_timeout_s=60.0)
    c.launch(make_task(), "f1", T0)
    c.container_started("cid", T0)
    c.disconnected(T0 + 1)
    c.subscribed("a1", T0 + 50)
    assert not any(isinstance(x, KillContainer) for x in c.tick(T0 + 200))


def test_never_subscribed_times_out() -> None:
    c = ExecutorCore("e1", "f1", T0, recovery_timeout_s=5.0)
    assert c.tick(T0 + 5) == [Exit(EXIT_AGENT_GONE, "the agent did not come back; task killed")]


def test_shutdown_without_task_exits_at_once() -> None:
    c = core()
    assert c.shutdown(None, T0) == [Exit(EXIT_OK, "shut down before any task")]


def test_shutdown_kills_then_exits_after_ack() -> None:
    c = core()
    c.launch(make_task(), "f1", T0)
    c.container_started("cid", T0)
    out = c.shutdown(1.0, T0)
    assert KillContainer(1.0) in out
    assert states(c.container_exited(143, False, "", T0)) == [tasks.KILLED]
    assert any(isinstance(x, Exit) for x in ack_all(c))


def test_spec_from_task() -> None:
    task = make_task()
    task.resources.add(name="cpus", scalar=0.5)
    task.resources.add(name="mem", scalar=64)
    task.command.env["A"] = "1"
    pm = task.container.docker.port_mappings.add(host_port=31000, container_port=80)
    assert pm.protocol == ""
    spec = spec_from_task(task, framework_id="f1", executor_id="e1", sandbox="/sb")
    assert spec == ContainerSpec(
        name="offerbus-e1", image="offerbus/busybox:latest", entrypoint=("/bin/sh", "-c"),
        command=("echo hello",), env={"A": "1"}, cpus=0.5, mem_mib=64.0,
        ports=spec.ports, labels={"org.offerbus.agent_id": "a1",
                                  "org.offerbus.framework_id": "f1",
                                  "org.offerbus.task_id": "t1",
                                  "org.offerbus.executor_id": "e1"}, sandbox="/sb")
    assert spec.nano_cpus == 500_000_000 and spec.mem_bytes == 64 << 20
    assert spec.ports[0].host_port == 31000 and spec.ports[0].protocol == "tcp"
    argv = make_task()
    argv.command.shell = False
    argv.command.value = ""
    argv.command.arguments.extend(["-x"])
    s2 = spec_from_task(argv, framework_id="f1", executor_id="e1")
    assert s2.entrypoint is None and s2.command == ("-x",), "empty value keeps the entrypoint"


# -- hypothesis: any event order ------------------------------------------------------------

EVENTS = st.lists(st.one_of(
    st.just(("launch",)), st.just(("launch_other",)), st.just(("started",)),
    st.tuples(st.just("launch_failed"), st.sampled_from([2, 3])),
    st.tuples(st.just("exited"), st.sampled_from([0, 1, 137, None]), st.booleans()),
    st.tuples(st.just("kill"), st.one_of(st.none(), st.floats(0, 5))),
    st.tuples(st.just("shutdown"), st.one_of(st.none(), st.floats(0, 5))),
    st.tuples(st.just("ack"), st.integers(0, 5)), st.just(("ack_unknown",)),
    st.just(("subscribed",)), st.just(("disconnected",)),
    st.tuples(st.just("tick"), st.floats(0, 100)),
), max_size=40)


@settings(max_examples=400, deadline=None)
@given(EVENTS)
def test_random_event_orders_never_break_the_state_machine(events: list[tuple[Any, ...]]) -> None:
    counter = itertools.count()
    c = ExecutorCore("e1", "f1", T0, recovery_timeout_s=30.0,
                     new_uuid=lambda: next(counter).to_bytes(16, "big"))
    now = T0
    seen: list[tasks.State] = []
    sent: set[bytes] = set()
    exited = False
    for ev in events:
        kind = ev[0]
        if kind == "launch":
            out = c.launch(make_task(), "f1", now)
        elif kind == "launch_other":
            out = c.launch(make_task("other"), "f1", now)
        elif kind == "started":
            out = c.container_started("cid", now)
        elif kind == "launch_failed":
            out = c.launch_failed(ev[1], "failed", now)
        elif kind == "exited":
            out = c.container_exited(ev[1], ev[2], "", now)
        elif kind == "kill":
            out = c.kill(ev[1], now)
        elif kind == "shutdown":
            out = c.shutdown(ev[1], now)
        elif kind == "ack":
            keys = list(c.unacked)
            out = c.acknowledged(keys[ev[1] % len(keys)], now) if keys else []
        elif kind == "ack_unknown":
            out = c.acknowledged(b"\xff" * 16, now)
        elif kind == "subscribed":
            out = c.subscribed("a1", now)
        elif kind == "disconnected":
            out = c.disconnected(now)
        else:
            now += ev[1]
            out = c.tick(now)
        c.validate()
        if exited:
            assert out == [], f"{kind} after Exit produced {out}"
        for cmd in out:
            if isinstance(cmd, Exit):
                exited = True
            ours = c.task.task_id if c.task is not None else None
            if (isinstance(cmd, SendUpdate) and cmd.status.task_id == ours
                    and cmd.status.uuid not in sent):  # a new update, not a retry
                sent.add(cmd.status.uuid)
                state = tasks.transition(seen[-1] if seen else tasks.STAGING, cmd.status.state)
                seen.append(state)
        assert sum(tasks.is_terminal(s) for s in seen) <= 1, seen
        if seen and tasks.is_terminal(seen[-1]) and not c.unacked and not c.abandoned:
            assert exited, "exit once the terminal update is acknowledged"
