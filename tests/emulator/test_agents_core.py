"""The agent emulator's pure core (services/emulator/agents.py): a bounded registration
window, a task's STARTING -> RUNNING -> FINISHED stream sent head first and resent until
acknowledged, kills, reconciliation, shutdown, and re-registration with tasks and frameworks
after a master failover; a property test drives random event sequences and checks the
core's invariants and that it never sleeps past its work."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from schemas import agent_pb2, bus_pb2, common_pb2
from services import report_digest, tasks
from services.emulator.agents import RUN_LABEL, AgentsCore, Reg, ToMaster
from services.notice import Notice
from services.resources import Resources

Event = agent_pb2.AgentEvent
FW = common_pb2.FrameworkInfo(framework_id="F1", name="f")


def core(n: int = 3, window: int = 10, run_s: float = float("inf"),
         update_retry_s: float = 0.5) -> AgentsCore:
    infos = []
    for i in range(n):
        info = common_pb2.AgentInfo(hostname=f"v{i}")
        info.resources.extend(Resources.parse("cpus:4;mem:1024").to_proto())
        infos.append(info)
    return AgentsCore(infos, nonce=b"\0" * 8, run_s=run_s, window=window,
                      update_retry_s=update_retry_s)


def calls(cmds: list[object]) -> list[ToMaster]:
    return [c for c in cmds if isinstance(c, ToMaster)]


def answer_registrations(c: AgentsCore, cmds: list[object], now: float) -> list[object]:
    """Play the master: answer every (re-)registration in `cmds` (and those it frees)."""
    out: list[object] = []
    todo = calls(cmds)
    while todo:
        cmd = todo.pop(0)
        kind = cmd.call.WhichOneof("call")
        if kind not in ("register", "reregister"):
            out.append(cmd)
            continue
        ev = Event()
        body = ev.registered if kind == "register" else ev.reregistered
        body.agent_id = cmd.call.agent_id or f"S-{cmd.channel}"
        more = c.master_event(cmd.channel, ev, now)
        out += [m for m in more if not isinstance(m, ToMaster)]
        todo += calls(more)
    return out


def run(c: AgentsCore, agent: str, task_id: str, now: float,
        run_s: float | None = None) -> list[object]:
    ev = Event()
    ev.run_tasks.frameworks.append(FW)
    launch = ev.run_tasks.launches.add(framework_id="F1")
    launch.task.task_id = task_id
    launch.task.resources.extend(Resources.parse("cpus:1;mem:32").to_proto())
    if run_s is not None:
        launch.task.labels[RUN_LABEL] = str(run_s)
    return c.master_event(agent, ev, now)


def updates(cmds: list[object]) -> list[tuple[str, str, str]]:
    """(channel, task id, state name) of every status update sent."""
    return [(c.channel, u.status.task_id, tasks.name(u.status.state))
            for c in calls(cmds) if c.call.WhichOneof("call") == "status_updates"
            for u in c.call.status_updates.updates]


def ack(c: AgentsCore, agent: str, cmds: list[object], now: float) -> list[object]:
    """Acknowledge every update `cmds` sent to `agent`."""
    ev = Event()
    for cmd in calls(cmds):
        if cmd.channel == agent and cmd.call.WhichOneof("call") == "status_updates":
            for u in cmd.call.status_updates.updates:
                ev.acknowledgements.acks.add(framework_id=u.framework_id,
                                             task_id=u.status.task_id, uuid=u.status.uuid)
    return c.master_event(agent, ev, now)


def registered_core(n: int = 3, **kw: float) -> AgentsCore:
    c = core(n, **kw)  # type: ignore[arg-type]
    answer_registrations(c, c.master_detected(0.0), 0.0)
    assert c.by_state() == {"registered": n}
    return c


def test_registrations_go_out_a_window_at_a_time() -> None:
    c = core(5, window=2)
    first = calls(c.master_detected(0.0))
    assert [x.channel for x in first] == ["v0", "v1"]
    assert all(x.call.WhichOneof("call") == "register" for x in first)
    ev = Event()
    ev.registered.agent_id = "S-v0"
    nxt = c.master_event("v0", ev, 0.1)
    assert [x.channel for x in calls(nxt)] == ["v2"]  # one answered, one more sent
    # An unanswered registration is resent after its timeout, still in the window.
    assert c.tick(1.0) == []
    assert [x.channel for x in calls(c.tick(2.0))] == ["v1"]
    notices = answer_registrations(c, [*calls(c.tick(2.2)), *calls(nxt), first[1]], 3.0)
    assert c.by_state() == {"registered": 5}
    assert any(isinstance(n, Notice) and n.kind == "registration_progress"
               and n.fields()["registered"] == 5 for n in notices)
    c.validate()


def test_a_task_reports_starting_running_finished_each_after_the_previous_ack() -> None:
    c = registered_core(1)
    sent = run(c, "v0", "t1", 10.0, run_s=5)
    assert updates(sent) == [("v0", "t1", "TASK_STARTING")]
    sent = ack(c, "v0", sent, 10.1)
    assert updates(sent) == [("v0", "t1", "TASK_RUNNING")]
    assert updates(ack(c, "v0", sent, 10.2)) == []
    assert c.running() == 1
    assert c.next_deadline() == 15.0
    sent = c.tick(15.0)
    assert updates(sent) == [("v0", "t1", "TASK_FINISHED")]
    ack(c, "v0", sent, 15.1)
    assert c.tasks == 0 and c.frameworks == {}  # ended, acknowledged, forgotten
    c.validate()


def test_an_unacknowledged_update_is_resent_with_backoff() -> None:
    c = registered_core(1)
    first = run(c, "v0", "t1", 0.0)
    uuid = calls(first)[0].call.status_updates.updates[0].status.uuid
    assert c.tick(0.4) == []
    again = c.tick(0.5)
    assert updates(again) == [("v0", "t1", "TASK_STARTING")]
    assert calls(again)[0].call.status_updates.updates[0].status.uuid == uuid
    assert c.tick(1.4) == [] and updates(c.tick(1.5)) == [("v0", "t1", "TASK_STARTING")]
    stale = Event()
    stale.acknowledgements.acks.add(framework_id="F1", task_id="t1", uuid=b"x" * 16)
    assert c.master_event("v0", stale, 1.6) == []
    assert c.counts["acks_stale"] == 1


def test_the_first_resend_can_be_set() -> None:
    c = registered_core(1, update_retry_s=2.0)
    run(c, "v0", "t1", 0.0)
    assert c.tick(1.9) == [] and updates(c.tick(2.0)) == [("v0", "t1", "TASK_STARTING")]
    assert c.tick(5.9) == [] and updates(c.tick(6.0)) == [("v0", "t1", "TASK_STARTING")]


def test_a_slowly_acknowledged_agent_waits_longer_before_resending() -> None:
    # As the real agent (RetryTimer): STARTING acknowledged after 4 s sets v0's resend of
    # RUNNING to 4 + 4 x 2 = 12 s, not 2 s; v1, acknowledged at once, keeps 2 s.
    c = registered_core(2, update_retry_s=2.0)
    for agent in ("v0", "v1"):
        sent = run(c, agent, "t1", 0.0)
        assert updates(sent) == [(agent, "t1", "TASK_STARTING")]
        running = ack(c, agent, sent, 4.0 if agent == "v0" else 0.01)
        assert updates(running) == [(agent, "t1", "TASK_RUNNING")]
    assert c.agents["v0"].retry.srtt == 4.0
    assert updates(c.tick(2.01)) == [("v1", "t1", "TASK_RUNNING")]  # 0.01 + 2
    assert ("v0", "t1", "TASK_RUNNING") not in updates(c.tick(15.9))  # v1 resends meanwhile
    assert ("v0", "t1", "TASK_RUNNING") in updates(c.tick(16.0))


def test_updates_of_one_agent_go_in_one_batch() -> None:
    c = registered_core(2)
    ev = Event()
    ev.run_tasks.frameworks.append(FW)
    for tid in ("a", "b", "c"):
        ev.run_tasks.launches.add(framework_id="F1").task.task_id = tid
    sent = c.master_event("v1", ev, 0.0)
    assert len(calls(sent)) == 1 and len(updates(sent)) == 3


def test_kills_reconcile_and_shutdown() -> None:
    c = registered_core(2)
    sent = run(c, "v0", "t1", 0.0)
    sent = ack(c, "v0", sent, 0.1)
    ack(c, "v0", sent, 0.2)
    kill = Event(kill_task=Event.KillTask(framework_id="F1", task_id="t1"))
    assert updates(c.master_event("v0", kill, 1.0)) == [("v0", "t1", "TASK_KILLED")]
    unknown = Event(kill_task=Event.KillTask(framework_id="F1", task_id="nope"))
    assert updates(c.master_event("v1", unknown, 1.0)) == [("v1", "nope", "TASK_DROPPED")]
    rec = Event()
    rec.reconcile.tasks.add(framework_id="F1", task_id="lost", state=tasks.STAGING)
    assert updates(c.master_event("v1", rec, 1.0)) == [("v1", "lost", "TASK_DROPPED")]
    run(c, "v1", "t2", 2.0)
    c.master_event("v1", Event(shutdown=Event.Shutdown(reason="gone")), 2.0)
    assert c.agents["v1"].reg is Reg.STOPPED and not c.agents["v1"].tasks
    # A stopped agent stays stopped across a failover; the others re-register.
    again = calls(c.master_detected(3.0))
    assert [x.channel for x in again] == ["v0"]
    c.validate()


def test_after_a_failover_each_agent_reregisters_with_its_tasks_and_resends() -> None:
    c = registered_core(2)
    sent = run(c, "v0", "t1", 0.0)
    ack(c, "v0", sent, 0.1)  # STARTING acked, RUNNING sent, never acked
    c.master_lost(1.0)
    assert c.tick(5.0) == []  # no master: nothing resent
    regs = calls(c.master_detected(6.0))
    by = {x.channel: x.call for x in regs}
    assert by["v0"].WhichOneof("call") == "reregister"
    rr = by["v0"].reregister
    assert rr.agent_info.agent_id == "S-v0" == by["v0"].agent_id
    assert [(t.task_info.task_id, tasks.name(t.latest_status.state)) for t in rr.tasks] == [
        ("t1", "TASK_RUNNING")]
    assert [f.framework_id for f in rr.frameworks] == ["F1"]
    assert not by["v1"].reregister.tasks
    ev = Event()
    ev.reregistered.agent_id = "S-v0"
    assert updates(c.master_event("v0", ev, 6.1)) == [("v0", "t1", "TASK_RUNNING")]


def expected_reregister(c: AgentsCore, name: str) -> agent_pb2.AgentCall.Reregister:
    """The Reregister of agent `name` built field by field from what the core knows."""
    a = c.agents[name]
    rr = agent_pb2.AgentCall.Reregister()
    rr.agent_info.CopyFrom(a.info)
    rr.agent_info.agent_id = a.agent_id
    for t in a.tasks.values():
        if not t.reported:
            continue
        tid, ex_id = t.info.task_id, f"{t.info.task_id}.emu"
        rt = rr.tasks.add(framework_id=t.framework_id, executor_id=ex_id)
        rt.task_info.CopyFrom(t.info)
        rt.latest_status.task_id, rt.latest_status.state = tid, t.state
        rt.latest_status.agent_id, rt.latest_status.executor_id = a.agent_id, ex_id
        rr.executors.add(executor_id=ex_id, framework_id=t.framework_id, agent_id=a.agent_id,
                         task_ids=[tid])
    rr.frameworks.append(FW)
    rr.tasks_digest = report_digest.of_report(rr.tasks)
    return rr


def test_a_reregistration_reports_each_tasks_latest_state_and_the_agents_id() -> None:
    """A settled task's part of the Reregister is kept serialised (issue 8): what is sent is
    still each task's latest state under the agent's current id, after its state changed
    (a kill not yet acknowledged) and after the agent got another id."""
    c = registered_core(1)
    for tid in ("t1", "t2", "t3"):
        sent = run(c, "v0", tid, 0.0)
        sent = ack(c, "v0", sent, 0.1)  # STARTING acked, RUNNING sent
        ack(c, "v0", sent, 0.2)  # RUNNING acked: settled
    (first,) = calls(c.master_detected(1.0))
    assert first.call.reregister == expected_reregister(c, "v0")
    assert {tasks.name(t.latest_status.state) for t in first.call.reregister.tasks} == {
        "TASK_RUNNING"}
    ev = Event()
    ev.reregistered.agent_id = "S-v0"
    c.master_event("v0", ev, 1.1)
    ev = Event()
    ev.kill_task.framework_id, ev.kill_task.task_id = "F1", "t2"
    c.master_event("v0", ev, 1.2)  # KILLED, not acknowledged
    c.master_lost(2.0)
    (again,) = calls(c.master_detected(3.0))
    assert again.call.reregister == expected_reregister(c, "v0")
    assert [tasks.name(t.latest_status.state) for t in again.call.reregister.tasks] == [
        "TASK_RUNNING", "TASK_KILLED", "TASK_RUNNING"]
    ev = Event()
    ev.reregistered.agent_id = "S-other"  # the master gave it another id
    c.master_event("v0", ev, 3.1)
    c.master_lost(4.0)
    (third,) = calls(c.master_detected(5.0))
    assert third.call.agent_id == "S-other"
    assert third.call.reregister == expected_reregister(c, "v0")
    assert {t.latest_status.agent_id for t in third.call.reregister.tasks} == {"S-other"}
    assert {e.agent_id for e in third.call.reregister.executors} == {"S-other"}


def test_a_reregistration_reports_the_latest_framework_info() -> None:
    """The frameworks a re-registration reports are as the last RunTasks gave them (each
    kept serialised, made again when it changes), and only those of the agent's tasks."""
    c = registered_core(2)
    run(c, "v0", "t1", 0.0)
    ev = Event()
    ev.run_tasks.frameworks.add(framework_id="F1", name="renamed", role="web")
    ev.run_tasks.frameworks.add(framework_id="F2", name="other")
    ev.run_tasks.launches.add(framework_id="F1").task.task_id = "t2"
    ev.run_tasks.launches.add(framework_id="F2").task.task_id = "u1"
    c.master_event("v1", ev, 0.1)
    c.master_lost(1.0)
    by = {x.channel: x.call.reregister for x in calls(c.master_detected(2.0))}
    assert [(f.framework_id, f.name, f.role) for f in by["v0"].frameworks] == [
        ("F1", "renamed", "web")]
    assert [(f.framework_id, f.name) for f in by["v1"].frameworks] == [
        ("F1", "renamed"), ("F2", "other")]
    assert [t.task_info.task_id for t in by["v1"].tasks] == ["t2", "u1"]
    c.validate()


def test_not_registered_makes_only_that_agent_register_again() -> None:
    c = registered_core(3)
    again = calls(c.master_error("v1", bus_pb2.NOT_REGISTERED, 1.0))
    assert [(x.channel, x.call.WhichOneof("call")) for x in again] == [("v1", "reregister")]
    assert c.master_error("nobody", bus_pb2.NOT_REGISTERED, 1.0) == []
    assert c.by_state() == {"registered": 2, "registering": 1}


def test_logs_requests_get_a_clear_error() -> None:
    c = registered_core(1)
    ev = Event(logs_request=Event.LogsRequest(request_id="r1", task_id="t"))
    reply = calls(c.master_event("v0", ev, 0.0))[0].call.logs_reply
    assert reply.request_id == "r1" and reply.eof and "keeps no task logs" in reply.error


ops = st.one_of(
    st.tuples(st.just("run"), st.integers(0, 2), st.integers(0, 5),
              st.sampled_from([None, 0.0, 1.0, 3.0])),
    st.tuples(st.just("kill"), st.integers(0, 2), st.integers(0, 6)),
    st.tuples(st.just("ack"), st.integers(0, 2)),
    st.tuples(st.just("time"), st.floats(0.0, 4.0)),
    st.tuples(st.just("failover"),),
    st.tuples(st.just("error"), st.integers(0, 2)),
    st.tuples(st.just("shutdown_framework"), st.integers(0, 2)),
)


@settings(max_examples=150, deadline=None)
@given(st.lists(ops, max_size=40), st.integers(1, 3))
def test_random_sequences_keep_the_invariants(script: list[tuple], window: int) -> None:
    c = core(3, window=window, run_s=2.0)
    now = 0.0
    last: dict[str, list[object]] = {}
    answer_registrations(c, c.master_detected(now), now)
    for op in script:
        kind, *args = op
        out: list[object] = []
        if kind == "run":
            out = run(c, f"v{args[0]}", f"t{args[1]}", now, args[2])
        elif kind == "kill":
            out = c.master_event(f"v{args[0]}", Event(kill_task=Event.KillTask(
                framework_id="F1", task_id=f"t{args[1]}")), now)
        elif kind == "ack":
            name = f"v{args[0]}"
            out = ack(c, name, last.get(name, []), now)
        elif kind == "time":
            deadline = c.next_deadline()
            before = now + args[0]
            if deadline is not None and before < deadline:
                assert calls(c.tick(before)) == []  # nothing due before its deadline
            now = max(now, before)
            out = c.tick(now)
        elif kind == "failover":
            c.master_lost(now)
            out = answer_registrations(c, c.master_detected(now), now)
        elif kind == "error":
            out = answer_registrations(
                c, c.master_error(f"v{args[0]}", bus_pb2.NOT_REGISTERED, now), now)
        else:
            out = c.master_event(f"v{args[0]}", Event(
                shutdown_framework=Event.ShutdownFramework(framework_id="F1")), now)
        for cmd in calls(out):
            last[cmd.channel] = [cmd]
            assert c.agents[cmd.channel].reg is not Reg.STOPPED
            if cmd.call.WhichOneof("call") == "status_updates":
                assert c.agents[cmd.channel].reg is Reg.REGISTERED
                keys = [u.status.task_id for u in cmd.call.status_updates.updates]
                assert len(keys) == len(set(keys)), "one update per task per batch"
        c.validate()
    assert c.tasks <= 3 * 7
