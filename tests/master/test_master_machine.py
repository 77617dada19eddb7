"""The master core under random sequences (hypothesis): agents registering, going silent
(and the master declaring them unreachable, then gone, then pruning them), coming back on their
old connection or a new one, being declared gone; the master stalling; frameworks subscribing,
failing over, timing out; launches, status updates, kills, acks, reconciliation, requests
(demands), revocations, ticks, and master failovers. `validate()` holds after every step,
commands only go to current connections, an agent that keeps beating is never declared
unreachable (not even after the master stalled), and a master failover never kills or loses
a task. Plus: random (malformed) protobuf input never raises."""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from typing import Any

from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule

from schemas import (
    agent_pb2,
    bus_pb2,
    common_pb2,
    internal_pb2,
    operator_pb2,
    scheduler_pb2,
)
from services import report_digest, tasks
from services.master.commands import (
    Command,
    PersistRegistry,
    Publish,
    Reject,
    ToAgent,
    ToFramework,
)
from services.master.core import MasterCore
from services.master.records import REGISTERED
from services.master.registry import merge
from services.notice import Notice
from tests.master.helpers import (
    PA,
    T0,
    TS,
    Call,
    Internal,
    agent_info,
    launch_msg,
    register,
    subscribe,
    subscribed,
    task_info,
)
from tests.strategies import messages

Key = tuple[str, str]
# What an executor may report next, from the agent's point of view.
NEXT = {TS.TASK_STAGING: [TS.TASK_STARTING, TS.TASK_RUNNING, TS.TASK_FAILED],
        TS.TASK_STARTING: [TS.TASK_RUNNING, TS.TASK_FAILED],
        TS.TASK_RUNNING: [TS.TASK_RUNNING, TS.TASK_FINISHED, TS.TASK_FAILED],
        TS.TASK_KILLING: [TS.TASK_KILLED]}


@dataclass
class Machine:
    """A VM with its agent; `tasks` is the agent's checkpointed truth."""

    agent_id: str = ""
    peer: bytes | None = None
    gone: bool = False
    silent: bool = False  # stopped (SIGSTOP) or cut off: sends nothing, keeps its connection
    tasks: dict[Key, tasks.State] = field(default_factory=dict)
    frameworks: dict[str, common_pb2.FrameworkInfo] = field(default_factory=dict)
    infos: dict[Key, common_pb2.TaskInfo] = field(default_factory=dict)


@dataclass
class Scheduler:
    fid: str = ""
    peer: bytes | None = None
    pa: bool = False


class MasterMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.now = T0
        self.epoch = 1
        self.core = self._core("m1", 1)
        # The agent and task entries a subscriber of the stream holds: the leader's
        # snapshot, then every publication (a standby following it holds the same).
        self.stream = self._followed(self.core.snapshot_entries())
        self.written: dict[str, Any] = {}  # the registry as the shell's writer keeps it
        self.machines = [Machine() for _ in range(3)]
        self.scheds = [Scheduler() for _ in range(3)]
        self.gen = 0
        self.uuid = 0
        self.task_seq = 0

    # -- plumbing ----------------------------------------------------------------------
    def _core(self, master_id: str, epoch: int, doc: Any = None,
              followed: list[bus_pb2.StateEntry] | None = None) -> MasterCore:
        return MasterCore(master_id, epoch, agent_reregister_window_s=30, agent_timeout_s=4.0,
                          agent_gone_timeout_s=60.0, max_gone_agents=1,
                          recovered_registry=doc, followed=followed or (), now=self.now)

    @staticmethod
    def _followed(entries: list[bus_pb2.StateEntry], kinds: tuple[str, ...] = (
            "agents/", "tasks/")) -> dict[str, bus_pb2.StateEntry]:
        return {e.key: e for e in entries if e.key.startswith(kinds)}

    def _peer(self, kind: str) -> bytes:
        self.gen += 1
        return f"{kind}{self.gen}".encode()

    def _machine_of(self, peer: bytes) -> Machine:
        (m,) = [m for m in self.machines if m.peer == peer]
        return m

    def run(self, cmds: list[Command]) -> None:
        """Check where commands go, and play the agents' reactions."""
        replies: list[tuple[Machine, str, str, tasks.State]] = []
        asked: list[Machine] = []
        for c in cmds:
            if isinstance(c, Publish):
                for e in c.entries:
                    if not e.key.startswith(("agents/", "tasks/")):
                        continue
                    if e.deleted:
                        self.stream.pop(e.key, None)
                    else:
                        self.stream[e.key] = e
            if isinstance(c, Notice) and c.kind in ("master_stalled", "gone_agents_pruned"):
                event(c.kind)
            elif isinstance(c, Notice) and c.kind == "revocation_ignored":
                event(f"revocation ignored: {c.fields()['why'].split(' ')[0]}")
            elif isinstance(c, Reject) and c.code == bus_pb2.NOT_REGISTERED:
                event("asked to re-register")
            elif isinstance(c, PersistRegistry):
                merge(self.written, c.change)
                for entry in c.change["agents"].values():  # type: ignore[attr-defined]
                    if entry is not None:
                        event(f"registry has an agent {entry['status']}")
            if isinstance(c, ToAgent) and c.event.WhichOneof("event") == "shutdown":
                m = self._machine_of(c.peer)  # the answer to a refused re-registration
                m.gone, m.tasks, m.peer, m.silent = True, {}, None, False
            elif isinstance(c, Reject) and c.code == bus_pb2.NOT_REGISTERED and any(
                    m.peer == c.peer for m in self.machines):
                m = self._machine_of(c.peer)  # asked to re-register: it does, on that peer
                assert not m.silent, "a silent agent was heard"
                asked.append(m)
            elif isinstance(c, ToAgent):
                agent = self.core.agents[c.agent_id]
                assert c.peer and c.peer == agent.peer, f"{c.event} to a stale connection"
                m = self._machine_of(c.peer)
                ev = c.event
                kind = ev.WhichOneof("event")
                if kind == "run_tasks":
                    for f in ev.run_tasks.frameworks:
                        m.frameworks[f.framework_id] = f
                    for lt in ev.run_tasks.launches:
                        key = (lt.framework_id, lt.task.task_id)
                        assert key not in m.tasks or tasks.is_terminal(m.tasks[key])
                        m.tasks[key] = TS.TASK_STAGING
                        m.infos[key] = lt.task
                elif kind == "kill_task":
                    key = (ev.kill_task.framework_id, ev.kill_task.task_id)
                    if ev.kill_task.reason == common_pb2.TaskStatus.REASON_TASK_REVOKED:
                        event("task revoked")
                    if key in m.tasks and not tasks.is_terminal(m.tasks[key]):
                        m.tasks[key] = TS.TASK_KILLED
                        replies.append((m, *key, TS.TASK_KILLED))
                elif kind == "shutdown_framework":
                    fid = ev.shutdown_framework.framework_id
                    m.tasks = {k: s for k, s in m.tasks.items() if k[0] != fid}
                elif kind == "reconcile":
                    for t in ev.reconcile.tasks:
                        key = (t.framework_id, t.task_id)
                        state = m.tasks.get(key, TS.TASK_DROPPED)
                        if state != t.state:
                            replies.append((m, *key, state))
            elif isinstance(c, ToFramework):
                what = c.event.WhichOneof("event")
                if what != "error":
                    fw = self.core.frameworks[c.framework_id]
                    assert c.peer == fw.peer, f"{what} to a stale scheduler connection"
                if what == "revoke":
                    event("revocation told")
                    for tid in c.event.revoke.task_ids:
                        task = self.core.tasks[(c.framework_id, tid)]
                        assert task.agent_id == c.event.revoke.agent_id
                        assert not tasks.is_terminal(task.state)
                if what == "update":
                    for s in c.event.update.statuses:
                        if not fw.partition_aware:
                            assert s.state not in tasks.PARTITION_AWARE_ONLY, s
        for m, fid, tid, state in replies:
            if m.peer is not None and not m.silent:
                self.send_update(m, fid, tid, state)
        for m in asked:
            if m.peer is not None and not m.gone:
                self.reregister(m, m.peer)

    def send_update(self, m: Machine, fid: str, tid: str, state: tasks.State) -> None:
        assert m.peer is not None
        self.uuid += 1
        su = agent_pb2.StatusUpdate(framework_id=fid, status=common_pb2.TaskStatus(
            task_id=tid, state=state, uuid=str(self.uuid).encode(),
            agent_id=m.agent_id))
        self.run(self.core.agent_call(m.peer, agent_pb2.AgentCall(
            agent_id=m.agent_id, status_updates=agent_pb2.AgentCall.StatusUpdates(
                updates=[su])), self.now))

    def reregister(self, m: Machine, peer: bytes | None = None, digest: bool = False,
                   ) -> list[Command]:
        m.peer = peer or self._peer("a")
        m.silent = False
        report = [agent_pb2.AgentCall.Reregister.Task(
            framework_id=fid, task_info=m.infos[(fid, tid)],
            latest_status=common_pb2.TaskStatus(task_id=tid, state=s))
            for (fid, tid), s in sorted(m.tasks.items())]
        call = agent_pb2.AgentCall(agent_id=m.agent_id, reregister=agent_pb2.AgentCall.Reregister(
            agent_info=agent_info(m.agent_id, "h", "cpus:4;mem:4096"), tasks=report,
            frameworks=[m.frameworks[f] for f in sorted({k[0] for k in m.tasks})
                        if f in m.frameworks]))
        if digest:  # as agents send it (report_digest.py)
            call.reregister.tasks_digest = report_digest.of_report(report)
        cmds = self.core.agent_call(m.peer, call, self.now)
        self.run(cmds)
        if any(isinstance(c, Reject) for c in cmds):
            m.peer = None
        return cmds

    def report(self) -> None:
        """The shell's liveness report: every agent that is not silent was just heard."""
        heard = {m.peer: self.now - 0.05 for m in self.machines
                 if m.peer is not None and not m.silent}
        self.run(self.core.agents_heard(heard, self.now))

    @initialize(pas=st.lists(st.booleans(), min_size=2, max_size=2))
    def a_small_cluster(self, pas: list[bool]) -> None:
        for i in range(2):
            self.agent_registers(i)
            self.framework_subscribes(i, pas[i], 20.0 * (i + 1))

    # -- agents ------------------------------------------------------------------------
    @rule(i=st.integers(0, 2))
    def agent_registers(self, i: int) -> None:
        m = self.machines[i]
        if m.agent_id and not m.gone:
            return
        m.gone, m.silent, m.tasks, m.peer = False, False, {}, self._peer("a")
        cmds = self.core.agent_call(m.peer, agent_pb2.AgentCall(
            register=agent_pb2.AgentCall.Register(agent_info=agent_info("", "h"))), self.now)
        self.run(cmds)
        m.agent_id = next(c.event.registered.agent_id for c in cmds if isinstance(c, ToAgent)
                          and c.event.WhichOneof("event") == "registered")

    @rule(i=st.integers(0, 2), bus_notices=st.booleans())
    def agent_goes_silent(self, i: int, bus_notices: bool) -> None:
        m = self.machines[i]
        if m.peer is not None and not m.silent:
            m.silent = True
            if bus_notices:  # the bus's own peer expiry: no verdict on the agent
                self.run(self.core.peer_gone(m.peer, self.now))

    @rule(i=st.integers(0, 2), same_connection=st.booleans())
    def agent_comes_back(self, i: int, same_connection: bool) -> None:
        m = self.machines[i]
        if not m.agent_id or m.gone or not (m.silent or m.peer is None):
            return
        if same_connection and m.peer is not None:  # SIGCONT: heartbeats resume
            m.silent = False
            self.report()
        else:  # restarted, or reconnected: re-registers on a new connection
            self.reregister(m)

    @rule(i=st.integers(0, 2), choices=st.lists(st.sampled_from([0, 1, 2]), min_size=1,
                                                 max_size=4))
    def executors_report(self, i: int, choices: list[int]) -> None:
        """Every live task of the machine moves one step (choices cycled)."""
        m = self.machines[i]
        live = sorted(k for k, s in m.tasks.items() if s in NEXT)
        for n, key in enumerate(live):
            options = NEXT[m.tasks[key]]
            m.tasks[key] = options[choices[n % len(choices)] % len(options)]
            if m.peer is not None and not m.silent:  # else reported when it re-registers
                self.send_update(m, *key, m.tasks[key])

    @rule(i=st.integers(0, 2))
    def operator_marks_gone(self, i: int) -> None:
        m = self.machines[i]
        if m.agent_id:
            self.run(self.core.operator_call(b"op", operator_pb2.OperatorCall(
                mark_agent_gone=operator_pb2.OperatorCall.MarkAgentGone(agent_id=m.agent_id)),
                "op", self.now))  # the machine learns it when it comes back (Shutdown)

    # -- frameworks --------------------------------------------------------------------
    @rule(i=st.integers(0, 2), pa=st.booleans(), failover=st.sampled_from([0.0, 20.0, 1e6]))
    def framework_subscribes(self, i: int, pa: bool, failover: float) -> None:
        s = self.scheds[i]
        if s.fid and s.fid in self.core.frameworks:
            return
        s.peer, s.pa = self._peer("f"), pa
        cmds = subscribe(self.core, s.peer, now=self.now, pa=pa, failover=failover)
        self.run(cmds)
        s.fid = next(c.event.subscribed.framework_id for c in cmds if isinstance(c, ToFramework)
                     and c.event.WhichOneof("event") == "subscribed")

    @rule(i=st.integers(0, 2))
    def scheduler_goes_silent(self, i: int) -> None:
        s = self.scheds[i]
        if s.peer is not None and s.fid in self.core.frameworks:
            self.run(self.core.peer_gone(s.peer, self.now))
        s.peer = None

    @rule(i=st.integers(0, 2), force=st.booleans())
    def scheduler_fails_over(self, i: int, force: bool) -> None:
        s = self.scheds[i]
        if not s.fid or s.fid not in self.core.frameworks:
            return
        peer = self._peer("f")
        info = common_pb2.FrameworkInfo()
        info.CopyFrom(self.core.frameworks[s.fid].info)
        cmds = self.core.scheduler_call(peer, Call(subscribe=Call.Subscribe(
            framework_info=info, force=force)), "sub", self.now)
        self.run(cmds)
        if any(isinstance(c, ToFramework) and c.peer == peer
               and c.event.WhichOneof("event") == "subscribed" for c in cmds):
            s.peer = peer

    def _call(self, s: Scheduler, **kw: Any) -> None:
        if s.peer is not None and s.fid:
            self.run(self.core.scheduler_call(s.peer, Call(framework_id=s.fid, **kw), "m",
                                              self.now))

    @rule(f=st.integers(0, 2), a=st.integers(0, 2), n=st.integers(1, 3),
          cpus=st.sampled_from([0.5, 1.0, 2.0]))
    def broker_launches(self, f: int, a: int, n: int, cpus: float) -> None:
        s, m = self.scheds[f], self.machines[a]
        if not s.fid or not m.agent_id:
            return
        tids = []
        for _ in range(n):
            self.task_seq += 1
            tids.append(f"t{self.task_seq}")
        msg = launch_msg(s.fid, m.agent_id, *(task_info(t, f"cpus:{cpus};mem:64")
                                              for t in tids), rid=f"r{self.task_seq}")
        self.run(self.core.internal_message(b"broker", msg, self.now, "tp"))

    @rule(f=st.integers(0, 2), pick=st.integers(0, 50), foreign=st.booleans())
    def framework_kills(self, f: int, pick: int, foreign: bool) -> None:
        s = self.scheds[f]
        keys = sorted(k for k in self.core.tasks if (k[0] != s.fid) == foreign)
        if keys:
            self._call(s, kill=Call.Kill(task_id=keys[pick % len(keys)][1]))

    @rule(f=st.integers(0, 2), pick=st.integers(0, 50))
    def framework_acks(self, f: int, pick: int) -> None:
        s = self.scheds[f]
        keys = sorted(self.core.tasks)
        if keys:
            t = self.core.tasks[keys[pick % len(keys)]]
            self._call(s, acknowledge=Call.Acknowledge(acks=[Call.Acknowledge.Ack(
                agent_id=t.agent_id, task_id=t.info.task_id, uuid=t.status.uuid or b"x")]))

    @rule(f=st.integers(0, 2), explicit=st.booleans())
    def framework_reconciles(self, f: int, explicit: bool) -> None:
        wanted = [Call.Reconcile.Task(task_id=t) for _, t in sorted(self.core.tasks)][:3]
        self._call(self.scheds[f], reconcile=Call.Reconcile(tasks=wanted if explicit else []))

    @rule(f=st.integers(0, 2))
    def framework_tears_down(self, f: int) -> None:
        self._call(self.scheds[f], teardown=Call.Teardown())

    @rule(f=st.integers(0, 2), n=st.integers(1, 3))
    def broker_offers(self, f: int, n: int) -> None:
        s = self.scheds[f]
        if not s.fid:
            return
        self.gen += 1
        offers = [common_pb2.Offer(offer_id=f"o{self.gen}-{k}", framework_id=s.fid)
                  for k in range(n)]
        self.run(self.core.internal_message(b"broker", Internal(
            framework_event=Internal.FrameworkEvent(framework_id=s.fid, event=scheduler_pb2
            .SchedulerEvent(offers=scheduler_pb2.SchedulerEvent.Offers(offers=offers)))),
            self.now))

    @rule(f=st.integers(0, 2), n=st.integers(0, 3), count=st.integers(0, 4),
          cpus=st.sampled_from([0.5, 1.0, -1.0]))
    def framework_requests(self, f: int, n: int, count: int, cpus: float) -> None:
        """A REQUEST, good or bad (count 0, negative cpus): a bad one changes nothing."""
        s = self.scheds[f]
        fw = self.core.frameworks.get(s.fid)
        if s.peer is None or fw is None or fw.peer != s.peer:
            return
        before = fw.demands
        demands = [common_pb2.Demand(count=count, resources=[
            common_pb2.Resource(name="cpus", scalar=cpus)]) for _ in range(n)]
        self._call(s, request=Call.Request(demands=demands))
        if n and (count == 0 or cpus < 0):
            assert fw.demands == before
        else:
            assert [d.count for d in fw.demands] == [count] * n

    @rule(pick=st.integers(0, 50), cpus=st.sampled_from([0.5, 1.5, 4.0]),
          grace=st.sampled_from([0.0, 3.0, 30.0]))
    def allocator_revokes(self, pick: int, cpus: float, grace: float) -> None:
        """Aimed at a framework and agent with a live task (else at nobody: ignored)."""
        live = sorted(k for k, t in self.core.tasks.items() if not tasks.is_terminal(t.state))
        fid, aid = ("F?", "S?")
        if live:
            fid, aid = live[pick % len(live)][0], self.core.tasks[live[pick % len(live)]].agent_id
        self.run(self.core.internal_message(b"broker", Internal(
            revoke_resources=Internal.RevokeResources(
                framework_id=fid, agent_id=aid, grace_s=grace,
                resources=[common_pb2.Resource(name="cpus", scalar=cpus)],
                for_framework_id="other", reason="below its share")), self.now))

    # -- time and the master itself ----------------------------------------------------
    @rule(dt=st.sampled_from([0.5, 5.0, 25.0, 40.0]))
    def time_passes(self, dt: float) -> None:
        """Liveness reports every second (the shell's come faster), then the timers."""
        end = self.now + dt
        while self.now < end:
            self.now = min(self.now + 1.0, end)
            self.report()
        self.run(self.core.tick(self.now))

    @rule(dt=st.sampled_from([6.0, 30.0, 90.0]))
    def master_stalls(self, dt: float) -> None:
        """The master's reactor was stuck: its timer fires first, then the heartbeats queued
        meanwhile are read. No agent that kept beating may be declared unreachable."""
        self.now += dt
        self.run(self.core.tick(self.now))
        self.report()

    @rule(followed=st.booleans(), digest=st.booleans())
    def master_fails_over(self, followed: bool, digest: bool) -> None:
        """`followed`: the standby followed the leader's stream (master/follow.py);
        `digest`: the agents' reports carry their digest (taken whole when it matches)."""
        doc = self.core.registry_document()
        self.written = copy.deepcopy(doc)  # what the new leader's writer loads
        self.epoch += 1
        held = list(self.stream.values()) if followed else None
        self.core = self._core(f"m{self.epoch}", self.epoch, doc, held)
        self.stream = self._followed(self.core.snapshot_entries())  # subscribers resync
        for s in self.scheds:
            s.peer = None
        for m in self.machines:
            m.peer = None  # a silent one reconnects to the new leader when it resumes
        for m in self.machines:
            if not m.agent_id or m.gone or m.silent:
                continue
            before = dict(m.tasks)
            cmds = self.reregister(m, digest=digest)
            assert not any(isinstance(c, ToAgent) and c.event.WhichOneof("event") in (
                "kill_task", "shutdown_framework", "shutdown") for c in cmds), cmds
            assert m.peer is not None, f"agent {m.agent_id} refused after failover: {cmds}"
            for key, state in before.items():
                assert m.tasks.get(key) == state, f"task {key} changed at failover"
                if not tasks.is_terminal(state):
                    rec = self.core.tasks[key]
                    assert rec.state == state and rec.agent_id == m.agent_id
            if followed and self.core.tasks_held_back:
                event("failover: records held back")
            if self.core.reports_taken_whole:
                event("failover: a report taken whole by its digest")
        for i, s in enumerate(self.scheds):
            if s.fid and s.fid in self.core.frameworks:
                self.scheduler_fails_over(i, True)

    @invariant()
    def consistent(self) -> None:
        self.core.validate()
        # What the stream said, entry by entry, is the state: a subscriber is never left
        # with a task record the master no longer has (or an old one).
        tasks_of = ("tasks/",)  # (an agent's last_seen is refreshed without publishing)
        assert self._followed(list(self.stream.values()), tasks_of) == self._followed(
            self.core.snapshot_entries(), tasks_of)
        assert {k for k in self.stream if k.startswith("agents/")} == {
            e.key for e in self.core.snapshot_entries() if e.key.startswith("agents/")}
        # The changes written, applied one after another, make the whole registry.
        doc = self.core.registry_document()
        for section in ("agents", "frameworks", "roles", "cluster_id"):
            if section in self.written:
                assert self.written[section] == doc[section], section
        self.now += 0.1

    @invariant()
    def no_false_positives(self) -> None:
        """Every agent that is not silent is registered, on its connection."""
        for m in self.machines:
            if m.agent_id and not m.gone and not m.silent and m.peer is not None:
                agent = self.core.agents.get(m.agent_id)
                assert agent is not None and agent.status == REGISTERED, (
                    m.agent_id, agent and agent.status)
                assert agent.peer == m.peer


MasterMachine.TestCase.settings = settings(
    max_examples=150, stateful_step_count=50, deadline=None,
    suppress_health_check=[HealthCheck.too_slow])
TestMasterMachine = MasterMachine.TestCase


# -- malformed input -----------------------------------------------------------------------

def _cluster() -> tuple[MasterCore, str, str]:
    core = MasterCore("m1", 1, now=T0)
    aid = register(core, b"a1")
    fid = subscribed(core, b"f1", pa=True)
    core.internal_message(b"broker", launch_msg(fid, aid, task_info("t1")), T0)
    return core, aid, fid


_INPUTS = st.one_of(
    st.tuples(st.just("agent"), messages(agent_pb2.AgentCall)),
    st.tuples(st.just("scheduler"), messages(scheduler_pb2.SchedulerCall)),
    st.tuples(st.just("internal"), messages(internal_pb2.InternalMessage)),
    st.tuples(st.just("operator"), messages(operator_pb2.OperatorCall)),
)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(inputs=st.lists(st.tuples(_INPUTS, st.sampled_from([b"a1", b"f1", b"x"]),
                                 st.booleans()), max_size=6))
def test_random_input_never_raises_and_keeps_invariants(inputs: list[Any]) -> None:
    core, aid, fid = _cluster()
    for (kind, msg), peer, own_ids in inputs:
        if own_ids:  # aim at the real agent and framework, so calls get past the door
            if kind == "agent":
                msg.agent_id = aid
            elif kind == "scheduler":
                msg.framework_id = fid
        if kind == "agent":
            core.agent_call(peer, msg, T0 + 1)
        elif kind == "scheduler":
            core.scheduler_call(peer, msg, "m", T0 + 1)
        elif kind == "internal":
            core.internal_message(peer, msg, T0 + 1)
        else:
            core.operator_call(peer, msg, "m", T0 + 1)
        core.validate()
    core.tick(T0 + 1e7)
    core.validate()


def test_pa_constant_is_the_capability() -> None:
    assert PA == common_pb2.FrameworkInfo.Capability.CAPABILITY_PARTITION_AWARE
