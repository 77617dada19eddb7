"""The offer-broker's pure core as a hypothesis state machine: a random allocator (with
failovers and a state stream that loses sync), frameworks, a master that answers launches,
changes, or goes silent, and tasks showing up on the stream. It checks, with `validate()`
after every step, that every allocated resource is always in exactly one place (held for
the stream, offered, launching, returned to the allocator, or forgotten with its
agent/allocator/broker), and that no launch outlives its deadline or stays pending once a
silent master's tasks are all on the stream."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from schemas import common_pb2, internal_pb2, state_pb2
from services.broker.commands import (
    AcceptRejected,
    Command,
    LaunchRequest,
    Offer,
    RecoverResources,
    Rescind,
    SendOffers,
)
from services.broker.validation import refuse_seconds
from services.notice import Notice
from services.resources import Resources
from tests.broker.harness import (
    RC,
    RJ,
    RR,
    T0,
    Out,
    agent_entry,
    alloc,
    broker,
    commands,
    deleted,
    filters,
    framework_entry,
    launch,
    only,
    recoveries,
    rejected,
    reserve,
    task,
    task_entry,
)

AGENTS = ("a0", "a1", "a2")
ROLES = {"f0": "*", "f1": "web", "f2": "web"}
FRAMEWORKS = tuple(ROLES)
TOTAL = Resources.of(cpus=8, mem=4096, ports=[(31000, 31007)])
TIMEOUT = 10.0
LAUNCH_TIMEOUT = 25.0
MASTERS = (None, 1, 2, 3)
Reclaim = internal_pb2.InternalMessage.ReclaimOffers.Reclaim
UNREACHABLE = state_pb2.AgentRecord.Status.AGENT_STATUS_UNREACHABLE


@dataclass
class Launch:
    """A LaunchRequest as the model saw it leave."""

    framework_id: str
    agent_id: str
    resources: Resources
    tasks: set[str]
    master: int | None
    deadline: float
    seen: set[str] = field(default_factory=set)


def ledger(r: Resources) -> Counter[Any]:
    """Role-blind quantities, ports counted one by one, so a double count shows."""
    c: Counter[Any] = Counter()
    for (name, _), v in r.scalars.items():
        c[name] += v
    for (name, _), rs in r.ranges.items():
        for lo, hi in rs:
            c.update((name, p) for p in range(lo, hi + 1))
    return c


def tasks_of(ops: tuple[common_pb2.Operation, ...]) -> Resources:
    total = Resources()
    for op in ops:
        for t in op.launch.tasks:
            total += Resources.from_proto(t.resources)
    return total


FLAWS = {
    "foreign": RJ.REJECT_REASON_OFFER_UNKNOWN,
    "dead_offer": RJ.REJECT_REASON_OFFER_UNKNOWN,
    "twice": RJ.REJECT_REASON_OFFER_UNKNOWN,
    "mixed_agents": RJ.REJECT_REASON_OFFERS_MIXED_AGENTS,
    "too_big": RJ.REJECT_REASON_RESOURCES_EXCEEDED,
    "dup_task": RJ.REJECT_REASON_TASK_INVALID,
    "empty_task": RJ.REJECT_REASON_TASK_INVALID,
}


class BrokerMachine(RuleBasedStateMachine):
    """The broker between a random allocator, frameworks and master. The model is built
    only from the commands the core emits, then compared with the core."""

    def __init__(self) -> None:
        super().__init__()
        self.core = broker(prefix="e1", offer_timeout=TIMEOUT,
                               launch_timeout=LAUNCH_TIMEOUT)
        self.now = T0
        self.n = 0
        self.agents: set[str] = set()
        self.live: dict[str, Offer] = {}  # offers the frameworks hold
        self.pending: dict[str, Launch] = {}
        self.master: int | None = 1
        self.allocator = 0  # the newest allocator epoch told the core
        self.synced = True  # the shell's word on the state stream
        # (framework, agent, res) waiting for the stream
        self.held: list[tuple[str, str, Resources]] = []
        self.on_stream: set[tuple[str, str]] = set()  # tasks published so far
        self.seen: set[str] = set()  # every offer id ever sent
        self.relayed_by: dict[str, int | None] = {}  # offer id -> the master when it was sent
        self.launched_offers: set[str] = set()  # offers named by any LaunchRequest
        self.allocated: Counter[Any] = Counter()
        self.returned: Counter[Any] = Counter()  # Recovery, any reason (LAUNCHED included)
        self.forgotten: Counter[Any] = Counter()  # agent removed, rescind_all
        self.run(self.core.master_changed(self.master, self.now))
        self.run(self.core.stream_changed([self.agent(a) for a in AGENTS], self.now, reset=True))
        self.agents.update(AGENTS)

    @staticmethod
    def agent(agent_id: str) -> Any:
        return agent_entry(agent_id, f"host-{agent_id}", cpus=8, mem=4096)

    # -- the model, driven by the core's commands --------------------------------------
    def run(self, out: Out) -> list[Command]:
        cmds = commands(out)
        recovered_ids = {r.offer_id for r in recoveries(cmds)}
        for c in cmds:
            if isinstance(c, LaunchRequest):
                for oid in c.offer_ids:
                    o = self.live.pop(oid)
                    assert (o.framework_id, o.agent_id) == (c.framework_id, c.agent_id)
                    assert oid not in self.launched_offers, f"offer {oid} used twice"
                    self.launched_offers.add(oid)
                assert c.request_id not in self.pending
                self.pending[c.request_id] = Launch(
                    c.framework_id, c.agent_id, tasks_of(c.operations),
                    {t.task_id for op in c.operations for t in op.launch.tasks},
                    self.master, self.now + LAUNCH_TIMEOUT)
            elif isinstance(c, Rescind):
                for oid in c.offer_ids:
                    o = self.live.pop(oid)
                    assert o.framework_id == c.framework_id
                    if oid not in recovered_ids:
                        self.forgotten += ledger(o.resources)
            elif isinstance(c, RecoverResources):
                for r in c.recoveries:
                    self.returned += ledger(r.resources)
                    if r.reason not in (RC.RECOVER_REASON_DECLINED, RC.RECOVER_REASON_UNUSED):
                        assert r.refuse_seconds == 0, r
                    if r.reason in (RC.RECOVER_REASON_DECLINED, RC.RECOVER_REASON_UNUSED,
                                    RC.RECOVER_REASON_LAUNCH_REJECTED):
                        self.live.pop(r.offer_id, None)  # used up by a decline or accept
            elif isinstance(c, SendOffers):
                for o in c.offers:
                    assert o.offer_id not in self.seen and o.framework_id == c.framework_id
                    self.seen.add(o.offer_id)
                    self.live[o.offer_id] = o
                    self.relayed_by[o.offer_id] = self.master
            elif isinstance(c, Notice) and c.kind.startswith("launch_") and \
                    c.kind != "launch_result_ignored":
                self.settled(c, cmds)
        self.core.validate()
        return cmds

    def settled(self, notice: Notice, cmds: list[Command]) -> None:
        """The core answered a launch the master did not: it must have been its due."""
        rid = str(notice.fields()["request_id"])
        la = self.pending.pop(rid)
        all_seen = la.seen == la.tasks
        if notice.kind == "launch_seen_launched":
            assert all_seen and (la.master != self.master or la.deadline <= self.now)
        else:
            assert notice.kind == "launch_unanswered", notice
            assert la.deadline <= self.now and not all_seen
            assert any(r.task_ids and rid for r in only(cmds, AcceptRejected))
        if la.resources:
            assert any(r.reason in (RC.RECOVER_REASON_LAUNCHED, RC.RECOVER_REASON_LAUNCH_REJECTED)
                       for r in recoveries(cmds))

    # -- rules -------------------------------------------------------------------------
    @precondition(lambda self: self.agents)  # an allocator offers only agents it knows
    @rule(data=st.data(), n=st.integers(1, 4))
    def allocate(self, data: st.DataObject, n: int) -> None:
        batch = []
        for _ in range(n):
            self.n += 1
            lo = data.draw(st.integers(31000, 31007))
            ports = [(lo, min(31007, lo + data.draw(st.integers(0, 2))))] if data.draw(
                st.booleans()) else None
            a = alloc(f"al{self.n}", data.draw(st.sampled_from(FRAMEWORKS)),
                      data.draw(st.sampled_from(sorted(self.agents))),
                      ports=ports, cpus=data.draw(st.integers(1, 4)),
                      mem=data.draw(st.sampled_from([128, 512, 1024])))
            a.role = ROLES[a.framework_id]
            self.allocated += ledger(Resources.from_proto(a.resources))
            batch.append(a)
        cmds = self.run(self.core.allocations(batch, self.now, self.synced))
        assert len(only(cmds, SendOffers)) == len({o.framework_id for c in only(
            cmds, SendOffers) for o in c.offers})  # one per framework
        if not self.synced:
            assert not only(cmds, SendOffers) and not recoveries(cmds)
            self.held += [(a.framework_id, a.agent_id, Resources.from_proto(a.resources))
                          for a in batch]

    @precondition(lambda self: self.live)
    @rule(data=st.data())
    def accept_valid(self, data: st.DataObject) -> None:
        first = self.live[data.draw(st.sampled_from(sorted(self.live)))]
        same = sorted(i for i, o in self.live.items() if o.framework_id == first.framework_id
                      and o.agent_id == first.agent_id)
        ids = data.draw(st.lists(st.sampled_from(same), min_size=1, unique=True))
        if first.offer_id not in ids:
            ids.append(first.offer_id)
        pool = Resources()
        for i in ids:
            pool += self.live[i].resources
        role = ROLES[first.framework_id]
        ops: list[common_pb2.Operation] = []
        cpus, mem = int(pool.scalar("cpus")), pool.scalar("mem")
        if role != "*" and data.draw(st.booleans()):
            ops.append(reserve(role, cpus=1))
            ops.append(launch(task(f"r{self.n}", role=role, cpus=1)))
            cpus -= 1
        tasks: list[common_pb2.TaskInfo] = []
        while cpus > 0 and (not tasks or data.draw(st.booleans())):
            c = data.draw(st.integers(1, cpus))
            cpus -= c
            tasks.append(task(f"t{len(tasks)}-{self.n}", cpus=c, mem=mem / 32))
        if tasks:
            ops.append(launch(*tasks))
        expired = any(self.live[i].expires_at <= self.now for i in ids)
        refuse = data.draw(st.sampled_from([None, 0.0, 3.0]))
        cmds = self.run(self.core.accept(first.framework_id, ids, ops, filters(refuse),
                                         self.now))
        if expired:
            assert only(cmds, AcceptRejected)
        else:
            assert not only(cmds, AcceptRejected), only(cmds, AcceptRejected)
            assert len(only(cmds, LaunchRequest)) == (1 if ops else 0)
            assert all(r.refuse_seconds == refuse_seconds(filters(refuse))
                       for r in recoveries(cmds))

    @precondition(lambda self: self.live)
    @rule(data=st.data(), flaw=st.sampled_from(sorted(FLAWS)))
    def accept_flawed(self, data: st.DataObject, flaw: str) -> None:
        """A plausible ACCEPT with one flaw: it must be refused for that reason, use up
        exactly the framework's live offers it names, and launch nothing."""
        first = self.live[data.draw(st.sampled_from(sorted(self.live)))]
        fw, agent = first.framework_id, first.agent_id
        ids = [first.offer_id]
        cpus = first.resources.scalar("cpus")
        tasks = [task("t", cpus=cpus / 2), task("u", cpus=cpus / 4)]
        expected = FLAWS[flaw]
        if flaw == "foreign":
            fw = data.draw(st.sampled_from([f for f in FRAMEWORKS if f != fw]))
        elif flaw == "dead_offer":
            ids.append(data.draw(st.sampled_from(sorted(self.seen - set(self.live))
                                                 or ["bogus"])))
        elif flaw == "twice":
            ids.append(first.offer_id)
        elif flaw == "too_big":
            tasks.append(task("v", cpus=cpus))
        elif flaw == "dup_task":
            tasks.append(task("u", cpus=0.001))
        elif flaw == "empty_task":
            tasks.append(task("v"))
        elif flaw == "mixed_agents":
            other = sorted(i for i, o in self.live.items()
                           if o.framework_id == fw and o.agent_id != agent)
            if not other:
                return
            ids.append(data.draw(st.sampled_from(other)))
        expired = any(self.live[i].expires_at <= self.now for i in ids if i in self.live)
        mine = {i for i in ids if i in self.live and self.live[i].framework_id == fw}
        cmds = self.run(self.core.accept(fw, ids, [launch(*tasks)], None, self.now))
        rej = rejected(cmds)
        if not expired:
            assert rej.reason == expected, (flaw, rej)
        used = {r.offer_id for r in recoveries(cmds)
                if r.reason == RC.RECOVER_REASON_LAUNCH_REJECTED}
        assert used == (set() if expired else mine) or expired
        assert all(r.refuse_seconds == 0 for r in recoveries(cmds))

    @rule(data=st.data(), fw=st.sampled_from(FRAMEWORKS),
          cpus=st.lists(st.integers(0, 9), max_size=3), names=st.lists(
              st.sampled_from(["t", "u"]), max_size=3))
    def accept_any(self, data: st.DataObject, fw: str, cpus: list[int],
                   names: list[str]) -> None:
        ids = data.draw(st.lists(st.sampled_from(sorted(self.live) or ["bogus"])
                                 | st.sampled_from(sorted(self.seen | {"e0-o1", "bogus"})),
                                 max_size=3))
        if ids and ids[0] in self.live and data.draw(st.booleans()):
            fw = self.live[ids[0]].framework_id  # the owner: fails later checks, if any
        tasks = [task(n, cpus=c, mem=64) for n, c in zip(names, cpus, strict=False)]
        ops = [launch(*tasks)] if tasks else []
        before = dict(self.live)
        cmds = self.run(self.core.accept(fw, ids, ops, None, self.now))
        reqs, rejs = only(cmds, LaunchRequest), only(cmds, AcceptRejected)
        assert len(reqs) + len(rejs) <= 1
        if reqs or (not rejs and ids):
            assert all(before[i].framework_id == fw for i in ids)
        for rec in recoveries(cmds):  # never uses up another framework's offer
            if rec.offer_id in before and rec.reason != RC.RECOVER_REASON_EXPIRED:
                assert before[rec.offer_id].framework_id == fw

    @rule(data=st.data(), fw=st.sampled_from(FRAMEWORKS),
          refuse=st.sampled_from([None, 0.0, 5.0, 30.0, -1.0]))
    def decline(self, data: st.DataObject, fw: str, refuse: float | None) -> None:
        mine = sorted(i for i, o in self.live.items() if o.framework_id == fw)
        ids = data.draw(st.lists(st.sampled_from(sorted(self.seen | {"bogus"})), max_size=2)
                        | st.lists(st.sampled_from(mine or ["bogus"]), max_size=3))
        cmds = self.run(self.core.decline(fw, ids, filters(refuse), self.now))
        for r in recoveries(cmds):
            if r.reason == RC.RECOVER_REASON_DECLINED:
                assert r.framework_id == fw and r.refuse_seconds == refuse_seconds(
                    filters(refuse))

    @rule(dt=st.sampled_from([0.0, 0.5, 3.0, 9.999, 10.0, 15.0, 25.0]))
    def advance(self, dt: float) -> None:
        self.now += dt
        self.run(self.core.tick(self.now))
        assert all(o.expires_at > self.now for o in self.live.values())

    @precondition(lambda self: self.pending)
    @rule(data=st.data(), accepted=st.booleans())
    def master_answers(self, data: st.DataObject, accepted: bool) -> None:
        rid = data.draw(st.sampled_from(sorted(self.pending)))
        res = self.pending.pop(rid).resources
        cmds = self.run(self.core.launch_result(
            rid, accepted, RJ.REJECT_REASON_AGENT_UNAVAILABLE, "gone"))
        assert ledger(res) == sum((ledger(r.resources) for r in recoveries(cmds)), Counter())
        assert len(only(cmds, AcceptRejected)) == (0 if accepted else 1)
        assert not any(r.refused_here for r in only(cmds, AcceptRejected))  # master told

    @rule(agent=st.sampled_from(AGENTS), how=st.sampled_from(["deleted", "unreachable"]))
    def agent_removed(self, agent: str, how: str) -> None:
        """The stream says the agent is gone (deleted) or unreachable."""
        self.agents.discard(agent)
        entry = deleted(f"agents/{agent}") if how == "deleted" else agent_entry(
            agent, status=UNREACHABLE)
        self.run(self.core.stream_changed([entry], self.now))
        assert all(o.agent_id != agent for o in self.live.values())
        self.released()

    @rule(agent=st.sampled_from(AGENTS))
    def agent_back(self, agent: str) -> None:
        self.agents.add(agent)
        self.run(self.core.stream_changed([self.agent(agent)], self.now))
        self.released()

    @rule(fw=st.sampled_from(FRAMEWORKS), deleted_=st.booleans())
    def framework_removed(self, fw: str, deleted_: bool) -> None:
        entry = deleted(f"frameworks/{fw}") if deleted_ else framework_entry(fw, False)
        self.run(self.core.stream_changed([entry], self.now))
        assert all(o.framework_id != fw for o in self.live.values())
        self.released()

    @rule()
    def rescind_all(self) -> None:
        self.run(self.core.rescind_all())
        for la in self.pending.values():
            self.forgotten += ledger(la.resources)
        self.pending.clear()
        self.forget_held()
        assert not self.live

    @rule(data=st.data())
    def reclaim(self, data: st.DataObject) -> None:
        """The allocator reclaims offers of some (framework, agent) pairs (fair sharing):
        exactly their outstanding offers are rescinded and recovered unfiltered, and what
        was held for the stream for them goes back; other pairs are ignored."""
        pairs = data.draw(st.lists(st.tuples(st.sampled_from(FRAMEWORKS),
                                             st.sampled_from(AGENTS)), max_size=3))
        want = {i for i, o in self.live.items() if (o.framework_id, o.agent_id) in pairs}
        cmds = self.run(self.core.reclaim_offers(
            [Reclaim(framework_id=f, agent_id=a, reason="r") for f, a in pairs], self.now))
        rescinded = {i for c in only(cmds, Rescind) for i in c.offer_ids
                     if c.reason == RR.RESCIND_REASON_RECLAIMED}
        assert rescinded == want - {i for c in only(cmds, Rescind) for i in c.offer_ids
                                    if c.reason == RR.RESCIND_REASON_EXPIRED}
        assert all(r.refuse_seconds == 0 for r in recoveries(cmds))
        held = sum((ledger(r) for f, a, r in self.held if (f, a) in pairs), Counter())
        back = [r for r in recoveries(cmds) if r.reason == RC.RECOVER_REASON_RESCINDED]
        assert {r.offer_id for r in back if r.offer_id} == rescinded
        assert sum((ledger(r.resources) for r in back if not r.offer_id), Counter()) == held
        assert all(o.framework_id != f or o.agent_id != a
                   for o in self.live.values() for f, a in pairs)
        self.held = [h for h in self.held if (h[0], h[1]) not in pairs]

    # -- rules: the master, the allocator, the stream ---------------------------------
    @rule(epoch=st.sampled_from(MASTERS))
    def master_changes(self, epoch: int | None) -> None:
        if epoch != self.master:
            for la in self.pending.values():
                la.deadline = max(la.deadline, self.now + LAUNCH_TIMEOUT)
        self.master = epoch
        cmds = self.run(self.core.master_changed(epoch, self.now))
        if epoch is not None:  # what another master relayed is void, and handed back
            assert all(self.relayed_by[oid] == epoch for oid in self.live)
            assert all(r.reason == RC.RECOVER_REASON_RESCINDED for r in recoveries(cmds)
                       if r.offer_id in {i for c in only(cmds, Rescind) for i in c.offer_ids})

    @precondition(lambda self: self.pending)
    @rule(data=st.data())
    def tasks_on_stream(self, data: st.DataObject) -> None:
        """Some tasks of a launch (or of several sharing task ids) appear on the stream."""
        la = self.pending[data.draw(st.sampled_from(sorted(self.pending)))]
        tids = data.draw(st.lists(st.sampled_from(sorted(la.tasks)), min_size=1, unique=True))
        self.publish_tasks({(la.framework_id, t) for t in tids})
        self.run(self.core.stream_changed(
            [task_entry(la.framework_id, t) for t in tids], self.now))
        self.released()

    @rule()
    def stream_loses_sync(self) -> None:
        self.synced = False

    @rule(drop=st.sets(st.sampled_from(AGENTS), max_size=1),
          gone=st.sets(st.sampled_from(FRAMEWORKS), max_size=1))
    def stream_resyncs(self, drop: set[str], gone: set[str]) -> None:
        """A fresh copy of the whole state: agents and frameworks it lacks are gone."""
        self.agents -= drop
        entries = [self.agent(a) for a in sorted(self.agents)]
        entries += [framework_entry(f) for f in FRAMEWORKS if f not in gone]
        entries += [task_entry(f, t) for f, t in sorted(self.on_stream)]
        self.publish_tasks(set(self.on_stream))
        self.run(self.core.stream_changed(entries, self.now, reset=True))
        assert not {o.agent_id for o in self.live.values()} & drop
        assert not {o.framework_id for o in self.live.values()} & gone
        self.released()

    @rule(epoch=st.integers(1, 5))
    def allocator_epoch(self, epoch: int) -> None:
        cmds = self.run(self.core.allocator_seen(epoch, self.now))
        if epoch > self.allocator:
            assert not self.live and not recoveries(cmds)
            self.forget_held()
        else:
            assert cmds == []
        self.allocator = max(self.allocator, epoch)

    # -- model helpers -----------------------------------------------------------------
    def publish_tasks(self, keys: set[tuple[str, str]]) -> None:
        self.on_stream |= keys
        for la in self.pending.values():
            la.seen |= {t for f, t in keys if f == la.framework_id and t in la.tasks}

    def released(self) -> None:
        """A stream change releases what was held: offered, or returned (a Recovery, which
        `run` counted), also what was held for an agent now gone."""
        self.synced = True
        self.held.clear()

    def forget_held(self) -> None:
        for _, _, res in self.held:
            self.forgotten += ledger(res)
        self.held.clear()

    # -- invariants --------------------------------------------------------------------
    @invariant()
    def every_resource_is_in_exactly_one_place(self) -> None:
        held: Counter[Any] = Counter()
        for o in self.live.values():
            held += ledger(o.resources)
        for la in self.pending.values():
            held += ledger(la.resources)
        for _, _, res in self.held:
            held += ledger(res)
        assert self.allocated == held + self.returned + self.forgotten

    @invariant()
    def model_matches_core(self) -> None:
        assert set(self.live) == {o.offer_id for o in self.core.outstanding_offers()}
        assert set(self.pending) == set(self.core.pending_launches)
        assert self.core.held == len(self.held)
        assert self.core.allocator_epoch == self.allocator

    @invariant()
    def no_launch_outlives_its_due(self) -> None:
        for rid, la in self.pending.items():
            assert self.core.launch_deadline(rid) == la.deadline
            assert la.deadline > self.now, f"{rid} past its deadline"
            assert la.master == self.master or la.seen != la.tasks, f"{rid} seen, unanswered"

    @invariant()
    def no_agent_offered_beyond_its_total(self) -> None:
        for agent in self.agents:
            held = ledger(Resources())
            for o in self.live.values():
                if o.agent_id == agent:
                    held += ledger(o.resources)
            for la in self.pending.values():
                if la.agent_id == agent:
                    held += ledger(la.resources)
            assert all(v <= 1 for k, v in held.items() if isinstance(k, tuple)), held
            assert held["cpus"] <= 8000 and held["mem"] <= 4096000


BrokerMachine.TestCase.settings = settings(
    max_examples=150, stateful_step_count=50, deadline=None,
    suppress_health_check=[HealthCheck.too_slow])
TestBrokerMachine = BrokerMachine.TestCase
