"""The status update manager core: in-order delivery per task, retry schedule, stale acks,
durability before acknowledgement, master changes, and recovery from checkpoint records."""

from __future__ import annotations

import itertools
from collections import defaultdict

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from schemas import common_pb2
from services import tasks
from services.agent import status_updates as su

FW = "fw-1"
TaskStatus = common_pb2.TaskStatus

FAST = 0.5  # a first resend the tests' clocks read easily (the default is longer)


def status(task: str, state: tasks.State, uuid: bytes, source: int = TaskStatus.SOURCE_EXECUTOR
           ) -> common_pb2.TaskStatus:
    return TaskStatus(task_id=task, state=state, uuid=uuid, source=source,  # type: ignore[arg-type]
                      executor_id=f"e-{task}")


class Shell:
    """What the agent shell does with the commands: checkpoints are durable at once here."""

    def __init__(self, mgr: su.StatusUpdateManager) -> None:
        self.mgr = mgr
        self.now = 0.0
        self.disk: list[su.Record] = []
        self.forwarded: list[tuple[float, str, bytes]] = []
        self.executor_acks: list[bytes] = []
        self.ended: list[su.StreamEnded] = []
        self.rejected: list[su.Rejected] = []

    def run(self, out: list[su.Output]) -> list[su.Output]:
        seen = list(out)
        for cmd in out:
            if isinstance(cmd, su.Checkpoint):
                self.disk.append(cmd.record)
                seen += self.run(self.mgr.checkpointed(cmd.record, self.now))
            elif isinstance(cmd, su.Forward):
                assert len(cmd.updates) == len({u.status.task_id for u in cmd.updates})
                self.forwarded += [(self.now, u.status.task_id, u.status.uuid)
                                   for u in cmd.updates]
            elif isinstance(cmd, su.AckExecutor):
                self.executor_acks.append(cmd.uuid)
            elif isinstance(cmd, su.StreamEnded):
                self.ended.append(cmd)
            elif isinstance(cmd, su.Rejected):
                self.rejected.append(cmd)
        self.mgr.validate()
        return seen

    def add(self, task: str, state: tasks.State, uuid: bytes) -> list[su.Output]:
        return self.run(self.mgr.update(FW, status(task, state, uuid)))

    def ack(self, task: str, uuid: bytes, now: float | None = None) -> list[su.Output]:
        if now is not None:
            self.now = now
        return self.run(self.mgr.acknowledge(FW, task, uuid, self.now))

    def tick(self, now: float) -> list[tuple[str, bytes]]:
        self.now = now
        start = len(self.forwarded)
        self.run(self.mgr.tick(now))
        return [(t, u) for _, t, u in self.forwarded[start:]]


def started(mgr: su.StatusUpdateManager | None = None) -> Shell:
    shell = Shell(mgr or su.StatusUpdateManager(retry_initial_s=FAST))
    shell.run(shell.mgr.master_changed(0.0))
    return shell


def test_in_order_one_at_a_time_per_task() -> None:
    sh = started()
    sh.add("t", tasks.STARTING, b"u1")
    sh.add("t", tasks.RUNNING, b"u2")
    sh.add("t", tasks.FINISHED, b"u3")
    assert sh.executor_acks == [b"u1", b"u2", b"u3"]  # each after its checkpoint
    assert sh.tick(0.0) == [("t", b"u1")]
    assert sh.tick(0.4) == []
    assert sh.tick(0.5) == [("t", b"u1")]  # retried, never u2 before u1 is acknowledged
    sh.ack("t", b"u1")
    assert sh.tick(0.5) == [("t", b"u2")]
    sh.ack("t", b"u2")
    assert sh.tick(0.6) == [("t", b"u3")]
    assert sh.ended == []
    sh.ack("t", b"u3")
    assert sh.ended == [su.StreamEnded(FW, "t", tasks.FINISHED)]
    assert sh.mgr.streams == {}
    assert sh.mgr.next_deadline() is None
    assert sh.tick(100.0) == []


def test_retry_schedule_doubles_to_cap() -> None:
    sh = started()
    sh.add("t", tasks.RUNNING, b"u1")
    times = []
    for _ in range(12):
        deadline = sh.mgr.next_deadline()
        assert deadline is not None
        assert sh.tick(deadline) == [("t", b"u1")]
        times.append(deadline)
    gaps = [b - a for a, b in itertools.pairwise(times)]
    assert gaps == [0.5, 1, 2, 4, 8, 16, 30, 30, 30, 30, 30]
    assert sh.mgr.counts["retries"] == 11
    timer = su.RetryTimer()
    waits = [timer.timeout]
    for n in range(2, 7):
        waits.append(timer.wait(n, waits[-1]))
    assert waits == [2, 4, 8, 16, 30, 30]
    assert su.StatusUpdateManager().retry.timeout == su.RETRY_INITIAL_S == 2.0


def test_slow_acknowledgements_stretch_the_retry_timeout() -> None:
    # A master that acknowledges in 5 s is not sent the next update again after 0.5 s:
    # the wait follows the round trip (RFC 6298), so a loaded master is not loaded further.
    sh = started()
    sh.add("t", tasks.STARTING, b"u1")
    sh.add("t", tasks.RUNNING, b"u2")
    assert sh.tick(0.0) == [("t", b"u1")]
    sh.ack("t", b"u1", now=5.0)
    assert sh.tick(5.0) == [("t", b"u2")]
    assert sh.mgr.retry.srtt == 5.0
    assert sh.mgr.next_deadline() == 5.0 + 5.0 + 4 * 2.5  # srtt + 4 rttvar
    assert sh.tick(19.9) == []
    assert sh.tick(20.0) == [("t", b"u2")]
    assert sh.mgr.counts["retries"] == 1


def test_fast_acknowledgements_keep_the_floor_and_resent_ones_give_no_sample() -> None:
    sh = started()
    for i in range(20):  # acknowledged at once: the timeout stays at its floor
        sh.add(f"t{i}", tasks.RUNNING, b"u%d" % i)
        assert sh.tick(float(i)) == [(f"t{i}", b"u%d" % i)]
        sh.ack(f"t{i}", b"u%d" % i, now=i + 0.01)
    assert sh.mgr.retry.samples == 20 and sh.mgr.retry.timeout == FAST
    sh.add("late", tasks.RUNNING, b"x")
    sh.tick(100.0)
    sh.tick(100.0 + FAST)  # resent once: the timeout backs off, for later updates too
    assert sh.mgr.retry.timeout == 2 * FAST
    sh.ack("late", b"x", now=130.0)  # which send does this answer? Karn: no sample
    assert sh.mgr.retry.samples == 20 and sh.mgr.retry.timeout == 2 * FAST
    sh.ack("gone", b"y", now=140.0)  # stale: nothing learned
    assert sh.mgr.retry.samples == 20
    sh.add("next", tasks.RUNNING, b"n")
    assert sh.tick(150.0) == [("next", b"n")]
    assert sh.mgr.next_deadline() == 150.0 + 2 * FAST
    sh.ack("next", b"n", now=150.1)  # a clean sample ends the back-off
    assert sh.mgr.retry.timeout == FAST


def test_a_timeout_always_too_short_is_backed_off_until_acks_come_in_time() -> None:
    # Every ack takes 3 s, longer than the first timeout: without backing off, each update
    # is resent, no ack ever gives a sample (Karn), and the timeout never grows.
    sh = started()
    t, sends = 0.0, 0
    for i in range(12):
        sh.add(f"t{i}", tasks.RUNNING, b"u%d" % i)
        sent_at = t
        while t < sent_at + 3.0:  # the master acknowledges 3 s after the first send
            deadline = sh.mgr.next_deadline()
            assert deadline is not None
            t = min(max(deadline, t), sent_at + 3.0)
            sends += len(sh.tick(t))
        sh.ack(f"t{i}", b"u%d" % i, now=t)
    assert sh.mgr.retry.samples > 0 and sh.mgr.retry.timeout > 3.0
    assert sends < 12 * 2  # about one send each once the timeout has grown


def test_retry_timer_caps_and_ignores_nonsense() -> None:
    timer = su.RetryTimer(initial=2.0, cap=30.0)
    assert [timer.timeout, timer.wait(2, 2.0), timer.wait(3, 4.0)] == [2.0, 4.0, 8.0]
    for now in (0.0, 0.1, 4.0, 12.0, 28.0, 100.0):  # once per period, up to the cap
        timer.expired(now)
    assert timer.timeout == 30.0
    timer.sample(100.0)
    assert timer.timeout == 30.0 and timer.wait(3, 30.0) == 30.0
    for bad in (-1.0, float("nan")):
        timer.sample(bad)
    assert timer.samples == 1


def test_stale_and_duplicate_acks_are_ignored_and_counted() -> None:
    sh = started()
    sh.add("t", tasks.RUNNING, b"u1")
    sh.add("t", tasks.RUNNING, b"u2")
    sh.tick(0.0)
    assert sh.ack("t", b"u2") == []  # not the head
    assert sh.ack("t", b"zz") == []
    assert sh.ack("other", b"u1") == []
    assert sh.mgr.counts["stale_acks"] == 3
    assert len(sh.ack("t", b"u1")) == 1
    assert sh.ack("t", b"u1") == []  # a duplicate of an acknowledged one
    assert sh.mgr.counts["stale_acks"] == 4
    assert sh.tick(0.0) == [("t", b"u2")]


def test_not_forwarded_before_durable_nor_next_before_ack_durable() -> None:
    mgr = su.StatusUpdateManager(retry_initial_s=FAST)
    mgr.master_changed(0.0)
    out = mgr.update(FW, status("t", tasks.RUNNING, b"u1"))
    assert out == [su.Checkpoint(su.Added(out[0].record.update))]  # type: ignore[union-attr]
    assert mgr.tick(10.0) == [] and mgr.next_deadline() is None
    added = out[0].record  # type: ignore[union-attr]
    assert mgr.checkpointed(added, 10.0) == [su.AckExecutor(FW, "t", "e-t", b"u1")]
    assert mgr.next_deadline() == 10.0
    [fwd] = mgr.tick(10.0)
    assert isinstance(fwd, su.Forward) and fwd.updates[0].status.uuid == b"u1"
    [cp2] = mgr.update(FW, status("t", tasks.FINISHED, b"u2"))
    [ack] = mgr.acknowledge(FW, "t", b"u1")
    assert isinstance(ack, su.Checkpoint) and ack.record == su.Acked(FW, "t", b"u1")
    mgr.validate()
    # u2 is durable too, but waits until the ack of u1 is on disk.
    assert isinstance(cp2, su.Checkpoint)
    assert mgr.checkpointed(cp2.record, 10.0) == [su.AckExecutor(FW, "t", "e-t", b"u2")]
    assert mgr.tick(11.0) == []
    assert mgr.checkpointed(ack.record, 11.0) == []
    [fwd] = mgr.tick(11.0)
    assert isinstance(fwd, su.Forward) and fwd.updates[0].status.uuid == b"u2"
    [ack2] = mgr.acknowledge(FW, "t", b"u2")
    assert isinstance(ack2, su.Checkpoint)
    assert "t" in {k[1] for k in mgr.streams}  # ended only once the ack is durable
    assert mgr.checkpointed(ack2.record, 12.0) == [su.StreamEnded(FW, "t", tasks.FINISHED)]
    mgr.validate()


def test_duplicate_updates_from_executor() -> None:
    mgr = su.StatusUpdateManager(retry_initial_s=FAST)
    out = mgr.update(FW, status("t", tasks.RUNNING, b"u1"))
    assert mgr.update(FW, status("t", tasks.RUNNING, b"u1")) == []  # not durable yet
    mgr.checkpointed(out[0].record, 0.0)  # type: ignore[union-attr]
    assert mgr.update(FW, status("t", tasks.RUNNING, b"u1")) == [
        su.AckExecutor(FW, "t", "e-t", b"u1")]
    assert mgr.counts["duplicates"] == 2
    assert len(list(mgr.unacknowledged())) == 1


def test_rejects_bad_updates_but_acks_the_executor() -> None:
    sh = started()
    sh.add("t", tasks.RUNNING, b"u1")
    out = sh.add("t", tasks.STARTING, b"u2")  # RUNNING -> STARTING
    assert [type(c) for c in out] == [su.Rejected, su.AckExecutor]
    assert "may go only to" in sh.rejected[-1].reason
    sh.add("t", tasks.FAILED, b"u3")
    assert isinstance(sh.add("t", tasks.RUNNING, b"u4")[0], su.Rejected)  # after terminal
    assert isinstance(sh.add("t", tasks.UNKNOWN, b"u5")[0], su.Rejected)
    assert isinstance(sh.add("", tasks.RUNNING, b"u6")[0], su.Rejected)
    assert sh.mgr.update(FW, status("t", tasks.RUNNING, b"")) == [
        su.Rejected(FW, "t", b"", "update without a uuid")]
    for uuid in (b"u1", b"u3"):
        sh.tick(sh.mgr.next_deadline() or 0.0)
        sh.ack("t", uuid)
    assert [e.state for e in sh.ended] == [tasks.FAILED]
    # A late update for the ended task: a duplicate is re-acknowledged, a new one refused.
    assert sh.add("t", tasks.FAILED, b"u3") == [su.AckExecutor(FW, "t", "e-t", b"u3")]
    assert isinstance(sh.add("t", tasks.RUNNING, b"u7")[0], su.Rejected)


def test_agent_generated_updates_ack_no_executor() -> None:
    mgr = su.StatusUpdateManager(retry_initial_s=FAST)
    out = mgr.update(FW, status("t", tasks.FAILED, b"u1", TaskStatus.SOURCE_AGENT))
    assert mgr.checkpointed(out[0].record, 0.0) == []  # type: ignore[union-attr]


def test_paused_until_master_and_master_change_resends_with_reset_backoff() -> None:
    sh = Shell(su.StatusUpdateManager(retry_initial_s=FAST))
    sh.add("a", tasks.RUNNING, b"a1")
    sh.add("b", tasks.RUNNING, b"b1")
    assert sh.tick(5.0) == [] and sh.mgr.next_deadline() is None
    sh.run(sh.mgr.master_changed(5.0))
    assert sorted(t for _, t, _ in sh.forwarded) == ["a", "b"]
    for t in (5.5, 6.5, 8.5, 12.5):  # backoff grows to 8 s
        assert len(sh.tick(t)) == 2
    sh.mgr.pause()
    assert sh.tick(100.0) == [] and sh.mgr.next_deadline() is None
    sh.now = 101.0
    sh.forwarded.clear()
    sh.run(sh.mgr.master_changed(101.0))
    assert sorted(t for _, t, _ in sh.forwarded) == ["a", "b"]  # at once
    assert sh.mgr.next_deadline() == 101.5  # backoff reset


def test_batches_many_tasks_per_tick() -> None:
    mgr = su.StatusUpdateManager(max_batch=1000, retry_initial_s=FAST)
    mgr.master_changed(0.0)
    for i in range(2500):
        [cp] = mgr.update(FW, status(f"t{i}", tasks.RUNNING, b"u%d" % i))
        mgr.checkpointed(cp.record, 0.0)  # type: ignore[union-attr]
    def sizes(out: list[su.Output]) -> list[int]:
        return [len(f.updates) for f in out if isinstance(f, su.Forward)]

    assert sizes(mgr.tick(0.0)) == [1000, 1000, 500]
    assert mgr.tick(0.1) == []
    assert sizes(mgr.tick(0.5)) == [1000, 1000, 500]  # the first retry, all at once
    mgr.validate()


def test_recover_rebuilds_exactly_the_unacknowledged() -> None:
    sh = started()
    sh.add("a", tasks.RUNNING, b"a1")
    sh.add("a", tasks.FINISHED, b"a2")
    sh.add("b", tasks.STARTING, b"b1")
    sh.add("b", tasks.RUNNING, b"b2")
    sh.add("c", tasks.FAILED, b"c1")
    sh.tick(0.0)
    for t, u in (("a", b"a1"), ("b", b"b1"), ("c", b"c1")):
        sh.ack(t, u)
    for records in (sh.disk, su.compact(sh.disk)):
        mgr = su.StatusUpdateManager(retry_initial_s=FAST)
        mgr.recover(records, now=50.0)
        mgr.validate()
        assert [u.status.uuid for u in mgr.unacknowledged()] == [b"a2", b"b2"]
        assert mgr.latest_state(FW, "b") == tasks.RUNNING
        assert mgr.latest_state(FW, "c") is None
        assert mgr.next_deadline() is None  # paused until a master
        out = mgr.master_changed(50.0)
        assert {u.status.uuid for f in out for u in f.updates} == {b"a2", b"b2"}  # type: ignore
        # A late duplicate of c's acknowledged terminal update (log not compacted) is re-acked.
        if records is sh.disk:
            assert mgr.update(FW, status("c", tasks.FAILED, b"c1")) == [
                su.AckExecutor(FW, "c", "e-c", b"c1")]
        with pytest.raises(RuntimeError):
            mgr.recover(records)
    # Compaction keeps each live task's last acknowledged update, so checks still hold.
    assert [type(r).__name__ for r in su.compact(sh.disk)] == [
        "Added", "Acked", "Added", "Added", "Acked", "Added"]


# -- the stateful model ------------------------------------------------------------------------

AGENT_STATES = frozenset({tasks.STARTING, tasks.RUNNING, tasks.KILLING, tasks.FINISHED,
                          tasks.FAILED, tasks.KILLED, tasks.ERROR, tasks.DROPPED})
TASKS = ["t0", "t1", "t2"]


class StatusUpdateMachine(RuleBasedStateMachine):
    """Random updates, fsyncs, acks, ticks, master changes, compactions and crash-restarts.
    The executor model keeps every update until the agent acknowledges it and resends those
    after a restart, as the real executor does (ExecutorCall.Subscribe)."""

    def __init__(self) -> None:
        super().__init__()
        self.mgr = su.StatusUpdateManager(retry_initial_s=FAST)
        self.mgr.master_changed(0.0)
        self.now = 0.0
        self.disk: list[su.Record] = []  # fsynced
        self.unsynced: list[su.Record] = []  # written, not yet fsynced: lost in a crash
        self.sent: dict[str, list[common_pb2.TaskStatus]] = defaultdict(list)
        self.exec_unacked: dict[str, list[bytes]] = defaultdict(list)
        self.delivered: dict[str, list[bytes]] = defaultdict(list)
        self.fw_acked: set[bytes] = set()
        self.ended: set[str] = set()
        self.forgotten: set[str] = set()  # ended unacknowledged: their framework was removed
        self.n = 0

    # -- plumbing -----------------------------------------------------------------------
    def index(self, task: str, uuid: bytes) -> int:
        return [s.uuid for s in self.sent[task]].index(uuid)

    def durable(self, task: str, uuid: bytes) -> bool:
        return any(isinstance(r, su.Added) and r.key == (FW, task) and r.uuid == uuid
                   for r in self.disk)

    def handle(self, out: list[su.Output]) -> None:
        for cmd in out:
            if isinstance(cmd, su.Checkpoint):
                self.unsynced.append(cmd.record)
            elif isinstance(cmd, su.AckExecutor):
                assert self.durable(cmd.task_id, cmd.uuid), "executor acked before fsync"
                if cmd.uuid in self.exec_unacked[cmd.task_id]:
                    self.exec_unacked[cmd.task_id].remove(cmd.uuid)
            elif isinstance(cmd, su.Forward):
                for update in cmd.updates:
                    task, uuid = update.status.task_id, update.status.uuid
                    assert self.durable(task, uuid), "forwarded before fsync"
                    i = self.index(task, uuid)
                    before = [self.index(task, u) for u in self.delivered[task]]
                    assert all(j <= i for j in before), f"{task}: {before} then {i}"
                    assert i == 0 or self.sent[task][i - 1].uuid in self.fw_acked, (
                        "sent before the previous update was acknowledged")
                    self.delivered[task].append(uuid)
            elif isinstance(cmd, su.StreamEnded):
                last = self.sent[cmd.task_id][-1]
                assert tasks.is_terminal(last.state) and last.uuid in self.fw_acked
                self.ended.add(cmd.task_id)
            else:
                raise AssertionError(f"unexpected {cmd}")

    def last_state(self, task: str) -> tasks.State:
        return self.sent[task][-1].state if self.sent[task] else tasks.STAGING

    # -- rules --------------------------------------------------------------------------
    @rule(task=st.sampled_from(TASKS), pick=st.integers(0, 100), end=st.integers(0, 5))
    def executor_update(self, task: str, pick: int, end: int) -> None:
        """A new update; one in six is terminal, so streams live long enough to matter."""
        if tasks.is_terminal(self.last_state(task)):
            return
        nexts = sorted(s for s in tasks.TRANSITIONS[self.last_state(task)] & AGENT_STATES
                       if tasks.is_terminal(s) == (end == 0))
        self.n += 1
        s = status(task, nexts[pick % len(nexts)], b"u%d" % self.n)
        self.sent[task].append(s)
        self.exec_unacked[task].append(s.uuid)
        self.handle(self.mgr.update(FW, s))

    @rule(task=st.sampled_from(TASKS))
    def executor_resends(self, task: str) -> None:
        if self.exec_unacked[task]:
            uuid = self.exec_unacked[task][0]
            self.handle(self.mgr.update(FW, self.sent[task][self.index(task, uuid)]))

    @rule()
    def fsync(self) -> None:
        records, self.unsynced = self.unsynced, []
        self.disk += records
        for r in records:
            self.handle(self.mgr.checkpointed(r, self.now))

    @rule(dt=st.sampled_from([0.0, 0.1, 0.5, 3.0, 40.0]))
    def tick(self, dt: float) -> None:
        self.now += dt
        self.handle(self.mgr.tick(self.now))

    @rule(task=st.sampled_from(TASKS))
    def framework_acks_latest(self, task: str) -> None:
        if not self.delivered[task]:
            return
        uuid = self.delivered[task][-1]
        out = self.mgr.acknowledge(FW, task, uuid)
        if out:
            self.fw_acked.add(uuid)
        self.handle(out)

    @rule(task=st.sampled_from(TASKS), junk=st.binary(min_size=1, max_size=3))
    def stale_ack(self, task: str, junk: bytes) -> None:
        stale = self.mgr.counts["stale_acks"]
        assert self.mgr.acknowledge(FW, task, b"x" + junk) == []
        assert self.mgr.counts["stale_acks"] == stale + 1

    @rule()
    def framework_removed(self) -> None:
        """The master says the framework is gone: ended tasks' streams end unacknowledged."""
        for cmd in self.mgr.forget_framework(FW):
            assert isinstance(cmd, su.StreamEnded)
            last = self.sent[cmd.task_id][-1]
            assert tasks.is_terminal(last.state) and self.durable(cmd.task_id, last.uuid)
            self.forgotten.add(cmd.task_id)
            self.ended.add(cmd.task_id)

    @rule()
    def master_changes(self) -> None:
        self.handle(self.mgr.master_changed(self.now))

    @rule()
    def master_lost(self) -> None:
        self.mgr.pause()

    @rule()
    def compact_log(self) -> None:
        self.disk = su.compact(self.disk)

    @precondition(lambda self: self.n > 0)
    @rule(reconnect=st.booleans())
    def crash_and_restart(self, reconnect: bool) -> None:
        self.unsynced = []  # never reached the disk
        self.mgr = su.StatusUpdateManager(retry_initial_s=FAST)
        self.mgr.recover(self.disk, self.now)
        # The executors re-subscribe and hand back what the agent never acknowledged.
        for task in TASKS:
            for uuid in list(self.exec_unacked[task]):
                self.handle(self.mgr.update(FW, self.sent[task][self.index(task, uuid)]))
        if reconnect:
            self.handle(self.mgr.master_changed(self.now))

    @invariant()
    def valid(self) -> None:
        self.mgr.validate()

    def teardown(self) -> None:
        """Keep fsyncing, ticking and acknowledging: every update sent gets delivered, and
        every stream with a terminal update ends."""
        self.handle(self.mgr.master_changed(self.now))
        for _ in range(100):
            self.fsync()
            self.tick(40.0)
            for task in TASKS:
                self.framework_acks_latest(task)
            self.fsync()
            if not list(self.mgr.unacknowledged()) and not self.unsynced:
                break
        for task in TASKS:
            missing = [s.uuid for s in self.sent[task] if s.uuid not in self.delivered[task]]
            assert not missing or task in self.forgotten, f"{task}: lost {missing}"
            assert not self.exec_unacked[task]
            if self.sent[task] and tasks.is_terminal(self.sent[task][-1].state):
                assert task in self.ended


TestStatusUpdateMachine = StatusUpdateMachine.TestCase
TestStatusUpdateMachine.settings = settings(
    max_examples=150, stateful_step_count=40, deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
