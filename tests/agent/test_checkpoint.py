"""The agent's checkpoint on real files: the status update log (round trip, torn tails,
corruption, compaction, restart) and the atomically written agent id and state."""

from __future__ import annotations

import tempfile
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from schemas import agent_pb2, common_pb2
from services import tasks
from services.agent import checkpoint as cp
from services.agent import status_updates as su

FW = "fw-1"


def added(task: str, state: tasks.State, uuid: bytes) -> su.Added:
    update = agent_pb2.StatusUpdate(framework_id=FW)
    update.status.task_id = task
    update.status.state = state
    update.status.uuid = uuid
    update.status.source = common_pb2.TaskStatus.SOURCE_EXECUTOR
    update.status.message = "x" * 20
    return su.Added(update)


def sample_records() -> list[su.Record]:
    return [
        added("a", tasks.RUNNING, b"a1"),
        added("b", tasks.STARTING, b"b1"),
        su.Acked(FW, "a", b"a1"),
        added("a", tasks.FINISHED, b"a2"),
        added("b", tasks.RUNNING, b"b2"),
    ]


def enc(records: list[su.Record]) -> list[bytes]:
    return [cp.encode(r) for r in records]


def test_round_trip(tmp_path: Path) -> None:
    log = cp.StatusUpdateLog(tmp_path)
    assert log.load() == []
    records = sample_records()
    log.append(records[:2])
    log.append(records[2:])
    log.append([])
    log.close()
    again = cp.StatusUpdateLog(tmp_path)
    assert enc(again.load()) == enc(records)
    assert again.torn_tails == 0
    assert (tmp_path / cp.LOG_NAME).stat().st_size == sum(len(b) for b in enc(records))


def test_append_needs_load(tmp_path: Path) -> None:
    with pytest.raises(RuntimeError, match="load"):
        cp.StatusUpdateLog(tmp_path).append(sample_records())


def test_torn_tail_at_every_offset_loses_only_the_last_record(tmp_path: Path) -> None:
    records = sample_records()
    full = b"".join(enc(records))
    last_start = len(full) - len(cp.encode(records[-1]))
    path = tmp_path / cp.LOG_NAME
    for cut in range(last_start, len(full)):
        path.write_bytes(full[:cut])
        log = cp.StatusUpdateLog(tmp_path)
        assert enc(log.load()) == enc(records[:-1]), cut
        assert log.torn_tails == (1 if cut > last_start else 0)
        assert log.dropped_bytes == cut - last_start
        assert path.stat().st_size == last_start  # cut off, so appends stay readable
        log.append([records[-1]])
        log.close()
        assert enc(cp.StatusUpdateLog(tmp_path).load()) == enc(records)
    assert not (tmp_path / (cp.LOG_NAME + ".corrupt")).exists()


def test_zero_filled_tail_is_torn(tmp_path: Path) -> None:
    records = sample_records()
    (tmp_path / cp.LOG_NAME).write_bytes(b"".join(enc(records)) + b"\0" * 100)
    log = cp.StatusUpdateLog(tmp_path)
    assert enc(log.load()) == enc(records)
    assert (log.torn_tails, log.dropped_bytes) == (1, 100)


def test_damage_in_the_middle_keeps_the_good_prefix_and_a_copy(tmp_path: Path) -> None:
    records = sample_records()
    data = bytearray(b"".join(enc(records)))
    second = len(cp.encode(records[0]))
    data[second + 12] ^= 0xFF  # inside the second record's body: its crc fails
    (tmp_path / cp.LOG_NAME).write_bytes(bytes(data))
    log = cp.StatusUpdateLog(tmp_path)
    assert enc(log.load()) == enc(records[:1])
    assert log.torn_tails == 1
    assert (tmp_path / (cp.LOG_NAME + ".corrupt")).read_bytes() == bytes(data)


@settings(max_examples=60, deadline=None)
@given(st.binary(max_size=200), st.integers(0, 5))
def test_garbage_never_crashes_load(garbage: bytes, keep: int) -> None:
    records = sample_records()[:keep]
    with tempfile.TemporaryDirectory() as d:
        (Path(d) / cp.LOG_NAME).write_bytes(b"".join(enc(records)) + garbage)
        log = cp.StatusUpdateLog(d)
        loaded = log.load()
        assert enc(loaded[: len(records)]) == enc(records)
        log.append(sample_records()[:1])
        log.close()
        assert len(cp.StatusUpdateLog(d).load()) == len(loaded) + 1


class Agent:
    """The agent's status update path as its shell would run it, over a real work dir."""

    def __init__(self, work_dir: Path, **log_args: int) -> None:
        self.log = cp.StatusUpdateLog(work_dir, **log_args)
        self.mgr = su.StatusUpdateManager(retry_initial_s=0.5)  # the clock below reads it
        self.mgr.recover(self.log.load())
        self.mgr.master_changed(0.0)
        self.ended: list[str] = []

    def run(self, out: list[su.Output]) -> list[su.Output]:
        records = [c.record for c in out if isinstance(c, su.Checkpoint)]
        self.log.append(records)
        more = [o for r in records for o in self.mgr.checkpointed(r, 0.0)]
        self.ended += [o.task_id for o in more if isinstance(o, su.StreamEnded)]
        return [o for o in out if not isinstance(o, su.Checkpoint)] + more

    def add(self, task: str, state: tasks.State, uuid: bytes) -> None:
        self.run(self.mgr.update(FW, added(task, state, uuid).update.status))

    def ack_all_heads(self, now: float) -> int:
        """Forward what is due and acknowledge it, as a framework would."""
        acked = 0
        for fwd in self.mgr.tick(now):
            assert isinstance(fwd, su.Forward)
            for u in fwd.updates:
                self.run(self.mgr.acknowledge(FW, u.status.task_id, u.status.uuid))
                acked += 1
        return acked

    def pending(self) -> list[bytes]:
        return sorted(u.status.uuid for u in self.mgr.unacknowledged())


def test_compaction_keeps_unacknowledged_updates(tmp_path: Path) -> None:
    agent = Agent(tmp_path, compact_min_bytes=2000, compact_factor=2)
    for i in range(200):  # tasks that run, finish and are acknowledged: garbage for the log
        agent.add(f"done{i}", tasks.RUNNING, b"r%d" % i)
        agent.add(f"done{i}", tasks.FINISHED, b"f%d" % i)
        agent.add("live", tasks.RUNNING, b"live%d" % i)
        while agent.ack_all_heads(float(i)):
            pass
    for i in range(5):
        agent.add("waiting", tasks.RUNNING, b"w%d" % i)
    assert len(agent.ended) == 200
    assert agent.log.compactions > 0
    size = (tmp_path / cp.LOG_NAME).stat().st_size
    assert size < 4000, size
    agent.log.compact()
    restarted = Agent(tmp_path)
    assert restarted.pending() == agent.pending() == [b"w%d" % i for i in range(5)]
    assert restarted.mgr.latest_state(FW, "live") == tasks.RUNNING
    assert restarted.mgr.latest_state(FW, "done3") is None


def test_restart_recovers_exactly_the_unacknowledged(tmp_path: Path) -> None:
    agent = Agent(tmp_path)
    agent.add("a", tasks.STARTING, b"a1")
    agent.add("a", tasks.RUNNING, b"a2")
    agent.add("b", tasks.RUNNING, b"b1")
    agent.add("b", tasks.FAILED, b"b2")
    agent.add("c", tasks.FINISHED, b"c1")
    agent.ack_all_heads(0.0)  # a1, b1, c1 acknowledged
    agent.add("d", tasks.RUNNING, b"d1")
    expected = agent.pending()
    assert expected == [b"a2", b"b2", b"d1"]
    # Crash: nothing is closed or flushed beyond what append() already fsynced.
    restarted = Agent(tmp_path)
    assert restarted.pending() == expected
    assert restarted.mgr.counts["recovered"] == 3
    # The recovered heads are forwarded at once, in order, and the streams finish normally.
    while restarted.ack_all_heads(1.0):
        pass
    assert restarted.pending() == []
    assert sorted(restarted.ended) == ["b"]
    assert Agent(tmp_path).pending() == []


def test_agent_id_and_state(tmp_path: Path) -> None:
    store = cp.AgentCheckpoint(tmp_path / "work")
    assert store.load_agent_id() is None
    assert store.load_state() is None
    store.save_agent_id("agent-7")
    assert cp.AgentCheckpoint(tmp_path / "work").load_agent_id() == "agent-7"
    with pytest.raises(ValueError):
        store.save_agent_id("")

    state = cp.AgentState()
    state.agent_info.agent_id = "agent-7"
    task = state.tasks.add(framework_id=FW, executor_id="e-1")
    task.task_info.task_id = "t1"
    task.latest_status.state = tasks.RUNNING
    state.executors.add(executor_id="e-1", framework_id=FW, pid=4242)
    state.frameworks.add(framework_id=FW, checkpoint=True)
    store.save_state(state)
    assert store.load_state() == state
    # A crash mid-write leaves only a stale tmp file; the checkpoint is the old version.
    (tmp_path / "work" / (cp.STATE_NAME + ".tmp")).write_bytes(b"\x01half")
    assert store.load_state() == state
    state.tasks[0].latest_status.state = tasks.FINISHED
    store.save_state(state)
    assert cp.AgentCheckpoint(tmp_path / "work").load_state() == state
    assert not (tmp_path / "work" / (cp.STATE_NAME + ".tmp")).exists()


def test_corrupt_state_is_an_error_not_a_fresh_start(tmp_path: Path) -> None:
    store = cp.AgentCheckpoint(tmp_path)
    (tmp_path / cp.STATE_NAME).write_bytes(b"\xff\xff\xff")
    with pytest.raises(cp.CheckpointCorrupt):
        store.load_state()
    (tmp_path / cp.AGENT_ID_NAME).write_bytes(b"\n")
    with pytest.raises(cp.CheckpointCorrupt):
        store.load_agent_id()


def test_cluster_id_is_kept_apart_from_the_agent_id(tmp_path: Path) -> None:
    store = cp.AgentCheckpoint(tmp_path / "work")
    assert store.load_cluster_id() is None  # a fresh work dir, or one from before cluster ids
    store.save_agent_id("agent-7")
    store.save_cluster_id("cluster-a")
    again = cp.AgentCheckpoint(tmp_path / "work")
    assert (again.load_cluster_id(), again.load_agent_id()) == ("cluster-a", "agent-7")
    for bad in ("", "two\nlines"):
        with pytest.raises(ValueError):
            store.save_cluster_id(bad)
    (tmp_path / "work" / cp.CLUSTER_ID_NAME).write_bytes(b"\xff\xfe")
    with pytest.raises(cp.CheckpointCorrupt):
        store.load_cluster_id()
