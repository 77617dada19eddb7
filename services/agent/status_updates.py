"""The agent's status update manager, a pure core (no disk, sockets or clock): per task a FIFO
stream of updates, forwarded head first and retried until acknowledged: after the retry timeout
(`RetryTimer`: 2 s, or more when acknowledgements take longer), doubling to 30 s.

How a shell drives it (the order is what makes "never lose, never reorder" hold):

1. Drain the executor socket; `update(framework_id, status)` for each. Each new update yields
   `Checkpoint(Added)`; a duplicate whose original is already durable yields `AckExecutor`.
2. Drain the master socket; `acknowledge(framework_id, task_id, uuid)` for each ack. The ack
   of the head yields `Checkpoint(Acked)`; any other uuid is stale and ignored (counted).
3. Append every `Checkpoint.record` to the log and fsync once (group commit), then hand each
   record back: `checkpointed(record, now)`. For an Added record this yields `AckExecutor`
   (the executor may now forget the update); for an Acked record it frees the task's next
   update to be sent, or, for a terminal update, yields `StreamEnded` (release resources).
4. `tick(now)` yields `Forward` batches of every head that is due (new or retried); sleep
   until `next_deadline()`.

An update is forwarded only once its Added record is durable, and a task's next update only
once the previous one's Acked record is durable: so after a crash the master never sees an
update the agent forgot, nor an older update after a newer one.
The manager starts paused (no master yet): `master_changed(now)` resumes it and resends every
head at once with its backoff reset; `pause()` stops forwarding while no master is known.
"""

from __future__ import annotations

import heapq
import math
from collections import Counter, OrderedDict, deque
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field

from schemas import agent_pb2, common_pb2
from services import tasks

StatusUpdate = agent_pb2.StatusUpdate
TaskStatus = common_pb2.TaskStatus
Key = tuple[str, str]  # (framework_id, task_id)

# The first resend of an unacknowledged update. A (re-)registration resends every head at
# once anyway; this is for an update lost on a live connection. At 0.5 s a loaded master
# (acknowledging in more than that) got every update 2.5-12 times instead of twice
# (bench.scale --update-retry); Mesos waits 10 s.
RETRY_INITIAL_S = 2.0
RETRY_MAX_S = 30.0
MAX_BATCH = 1000  # updates per Forward: keeps an envelope well under the frame limit
ACKED_MEMORY = 64  # acknowledged uuids remembered per live stream, to spot duplicates
ENDED_MEMORY = 10_000  # ended streams remembered, to spot late duplicates


@dataclass
class RetryTimer:
    """One agent's retry timeout for status updates, RFC 6298's retransmission timeout over
    the acknowledgement round trip: the smoothed round trip plus four times its variation,
    at least `initial`, doubling per resend of an update up to `cap`. A master (and
    framework) that acknowledges in 5 s under load is then not sent each update 3-4 times,
    which loads it further (bench.scale at 10,000 agents: 6-8 sends per update at a fixed
    2 s). Karn's rule: only an update sent once gives a sample (the ack of a resent one is
    ambiguous); and, as TCP, a timeout that fires backs the timeout off (doubles it, once
    per timeout period) until a sample comes: otherwise a round trip always longer than
    the timeout would never be learnt."""

    initial: float = RETRY_INITIAL_S
    cap: float = RETRY_MAX_S
    srtt: float | None = None
    rttvar: float = 0.0
    samples: int = 0
    rto: float = 0.0  # the current timeout (0: `initial`)
    held_until: float = -math.inf  # one back-off per timeout period

    def sample(self, rtt: float) -> None:
        if rtt < 0.0 or rtt != rtt:
            return
        self.samples += 1
        if self.srtt is None:
            self.srtt, self.rttvar = rtt, rtt / 2.0
        else:
            self.rttvar = 0.75 * self.rttvar + 0.25 * abs(self.srtt - rtt)
            self.srtt = 0.875 * self.srtt + 0.125 * rtt
        self.rto = min(max(self.initial, self.srtt + 4.0 * self.rttvar), self.cap)
        self.held_until = -math.inf

    def expired(self, now: float) -> None:
        """A resend is due: the timeout was too short (or the update was lost)."""
        if now >= self.held_until:
            self.rto = min(self.timeout * 2.0, max(self.cap, self.initial))
            self.held_until = now + self.rto

    @property
    def timeout(self) -> float:
        """The wait after a first send."""
        return self.rto or min(self.initial, self.cap)

    def wait(self, sends: int, last: float) -> float:
        """The wait after the `sends`-th send of an update whose previous wait was `last`:
        the timeout after a first send, then doubling (up to `cap`)."""
        return self.timeout if sends <= 1 else min(last * 2.0, max(self.cap, self.initial))


# -- checkpoint records ---------------------------------------------------------------------


@dataclass(frozen=True)
class Added:
    """Record: the agent took this update into its task's stream."""

    update: StatusUpdate

    @property
    def key(self) -> Key:
        return (self.update.framework_id, self.update.status.task_id)

    @property
    def uuid(self) -> bytes:
        return self.update.status.uuid


@dataclass(frozen=True)
class Acked:
    """Record: the framework acknowledged the head of this task's stream."""

    framework_id: str
    task_id: str
    uuid: bytes

    @property
    def key(self) -> Key:
        return (self.framework_id, self.task_id)


Record = Added | Acked


# -- commands for the shell ---------------------------------------------------------------


@dataclass(frozen=True)
class Checkpoint:
    """Append `record` to the log and fsync; then call `checkpointed(record, now)`."""

    record: Record


@dataclass(frozen=True)
class AckExecutor:
    """Send ExecutorEvent.Acknowledged: the update is durable; the executor may forget it."""

    framework_id: str
    task_id: str
    executor_id: str
    uuid: bytes


@dataclass(frozen=True)
class Forward:
    """Send AgentCall.StatusUpdates with these updates (one per task at most)."""

    updates: tuple[StatusUpdate, ...]


@dataclass(frozen=True)
class StreamEnded:
    """The terminal update of this task is acknowledged (and durably so): the agent may
    release the task's resources and forget it."""

    framework_id: str
    task_id: str
    state: tasks.State


@dataclass(frozen=True)
class Rejected:
    """The update was refused (log it); an executor is still acknowledged so it stops
    resending something that will never be accepted."""

    framework_id: str
    task_id: str
    uuid: bytes
    reason: str


Output = Checkpoint | AckExecutor | Forward | StreamEnded | Rejected


# -- the core -------------------------------------------------------------------------------


@dataclass
class _Pending:
    update: StatusUpdate
    durable: bool = False


@dataclass
class _Stream:
    framework_id: str
    task_id: str
    pending: deque[_Pending] = field(default_factory=deque)
    index: dict[bytes, _Pending] = field(default_factory=dict)
    # State of the newest update taken (pending or acknowledged): the next must follow it.
    last_state: tasks.State = tasks.STAGING
    last_acked: StatusUpdate | None = None
    acked: OrderedDict[bytes, None] = field(default_factory=OrderedDict)
    # uuid of an acknowledgement whose Acked record is not yet durable: holds the next send.
    gate: bytes | None = None
    sends: int = 0  # times the current head was forwarded
    sent_at: float | None = None  # when the head was first forwarded (an RTT sample's start)
    wait: float = 0.0  # the head's current wait between sends
    due: float | None = None  # when the head is (re)sent; None: nothing sendable
    token: int = -1  # heap entry that is current for this stream

    def sendable(self) -> bool:
        return bool(self.pending) and self.pending[0].durable and self.gate is None


def _from_executor(status: TaskStatus) -> bool:
    return status.source not in (TaskStatus.SOURCE_AGENT, TaskStatus.SOURCE_MASTER)


class StatusUpdateManager:
    """See the module docstring for the protocol. `counts` holds: added, duplicates,
    rejected, forwarded, retries, stale_acks, acked, ended."""

    def __init__(
        self,
        *,
        paused: bool = True,
        retry_initial_s: float = RETRY_INITIAL_S,
        retry_max_s: float = RETRY_MAX_S,
        max_batch: int = MAX_BATCH,
    ) -> None:
        self.paused = paused
        self.retry = RetryTimer(retry_initial_s, retry_max_s)
        self.max_batch = max_batch
        self.streams: dict[Key, _Stream] = {}
        self.counts: Counter[str] = Counter()
        self._ended: OrderedDict[Key, frozenset[bytes]] = OrderedDict()
        self._heap: list[tuple[float, int, Key]] = []
        self._seq = 0

    # -- events ---------------------------------------------------------------------------
    def update(self, framework_id: str, status: TaskStatus) -> list[Output]:
        """An update from an executor (or made by the agent itself, source AGENT)."""
        key = (framework_id, status.task_id)
        uuid = status.uuid
        if not status.task_id or not framework_id:
            return self._reject(key, status, "update without a framework id or task id")
        if not uuid:
            return self._reject(key, status, "update without a uuid")
        stream = self.streams.get(key)
        if stream is None and key in self._ended:
            if uuid in self._ended[key]:
                return self._duplicate(framework_id, status, durable=True)
            return self._reject(key, status, "the task's terminal update was acknowledged")
        if stream is not None:
            known = stream.index.get(uuid)
            if known is not None:
                return self._duplicate(framework_id, status, durable=known.durable)
            if uuid in stream.acked:
                return self._duplicate(framework_id, status, durable=True)
        previous = stream.last_state if stream is not None else tasks.STAGING
        try:
            tasks.transition(previous, status.state)
        except tasks.IllegalTransition as e:
            return self._reject(key, status, str(e))
        if stream is None:
            stream = self.streams[key] = _Stream(framework_id, status.task_id)
        copy = StatusUpdate(framework_id=framework_id)
        copy.status.CopyFrom(status)
        pending = _Pending(copy)
        stream.pending.append(pending)
        stream.index[uuid] = pending
        stream.last_state = status.state
        self.counts["added"] += 1
        return [Checkpoint(Added(copy))]

    def checkpointed(self, record: Record, now: float) -> list[Output]:
        """`record` (from a Checkpoint command) is on disk, fsynced."""
        stream = self.streams.get(record.key)
        if stream is None:
            return []
        if isinstance(record, Added):
            pending = stream.index.get(record.uuid)
            if pending is None or pending.durable:
                return []
            pending.durable = True
            out: list[Output] = []
            status = pending.update.status
            if _from_executor(status):
                out.append(AckExecutor(record.update.framework_id, status.task_id,
                                       status.executor_id, status.uuid))
            if stream.pending[0] is pending and stream.sendable():
                self._schedule(stream, now)
            return out
        if stream.gate != record.uuid:
            return []
        stream.gate = None
        if stream.pending or not tasks.is_terminal(stream.last_state):
            if stream.sendable():
                self._schedule(stream, now)
            return []
        return [self._end(stream)]

    def acknowledge(self, framework_id: str, task_id: str, uuid: bytes,
                    now: float | None = None) -> list[Output]:
        """The framework acknowledged an update (AgentEvent.Acknowledgements), at `now` (None:
        no round-trip sample, as when replaying a log)."""
        stream = self.streams.get((framework_id, task_id))
        if stream is None or not stream.pending or stream.pending[0].update.status.uuid != uuid:
            self.counts["stale_acks"] += 1
            return []
        head = stream.pending.popleft()
        del stream.index[uuid]
        stream.last_acked = head.update
        stream.acked[uuid] = None
        while len(stream.acked) > ACKED_MEMORY:
            stream.acked.popitem(last=False)
        stream.gate = uuid
        if now is not None and stream.sends == 1 and stream.sent_at is not None:
            self.retry.sample(now - stream.sent_at)
        stream.sends, stream.sent_at = 0, None
        self._unschedule(stream)
        self.counts["acked"] += 1
        return [Checkpoint(Acked(framework_id, task_id, uuid))]

    def tick(self, now: float) -> list[Output]:
        """Forward every head that is due: new heads, and retries whose backoff ran out."""
        if self.paused:
            return []
        batch: list[StatusUpdate] = []
        heap = self._heap
        while heap and heap[0][0] <= now:
            _, token, key = heapq.heappop(heap)
            stream = self.streams.get(key)
            if stream is None or stream.token != token:
                continue
            batch.append(stream.pending[0].update)
            stream.sends += 1
            if stream.sends > 1:
                self.counts["retries"] += 1
                self.retry.expired(now)
            else:
                stream.sent_at = now
            stream.wait = self.retry.wait(stream.sends, stream.wait)
            self._schedule(stream, now + stream.wait)
        self.counts["forwarded"] += len(batch)
        if len(heap) > 2 * len(self.streams) + 64:
            self._rebuild_heap()
        return [Forward(tuple(batch[i:i + self.max_batch]))
                for i in range(0, len(batch), self.max_batch)]

    def next_deadline(self) -> float | None:
        """When `tick` has something to do (may be in the past); None: nothing pending."""
        if self.paused:
            return None
        heap = self._heap
        while heap:
            _, token, key = heap[0]
            stream = self.streams.get(key)
            if stream is not None and stream.token == token:
                return heap[0][0]
            heapq.heappop(heap)
        return None

    def forget_framework(self, framework_id: str) -> list[Output]:
        """The framework was removed: nobody will acknowledge its updates. Every stream of
        it whose task has ended (terminal update durable) ends now, unacknowledged; a live
        task's stream ends the same way once its terminal update is in (the master repeats
        the removal in answer to each retry). Counted in `forgotten`."""
        out: list[Output] = []
        for key, stream in list(self.streams.items()):
            if (key[0] == framework_id and tasks.is_terminal(stream.last_state)
                    and all(p.durable for p in stream.pending)):
                self.counts["forgotten"] += 1
                out.append(self._end(stream))
        return out

    def pause(self) -> None:
        """No master to talk to: stop forwarding (backoff does not grow meanwhile)."""
        self.paused = True

    def master_changed(self, now: float) -> list[Output]:
        """(Re-)registered with a master: resend every head now, backoff reset (and what
        was learnt of the round trip: it was another master's)."""
        self.paused = False
        self.retry = RetryTimer(self.retry.initial, self.retry.cap)
        for stream in self.streams.values():
            stream.sends, stream.sent_at = 0, None
            stream.due = None
            if stream.sendable():
                stream.due = now
                stream.token = self._next_token()
        self._rebuild_heap()
        return self.tick(now)

    def recover(self, records: Iterable[Record], now: float = 0.0) -> None:
        """Rebuild the streams from checkpoint records (after an agent restart), on a fresh
        manager. Records that do not fit (duplicates, acks of non-heads) are skipped and
        counted in `recovery_skipped`; heads are due at `now`."""
        if self.streams or self._ended:
            raise RuntimeError("recover() needs a fresh StatusUpdateManager")
        for record in records:
            if isinstance(record, Added):
                out = self.update(record.update.framework_id, record.update.status)
                if out and isinstance(out[0], Checkpoint):
                    self.streams[record.key].index[record.uuid].durable = True
                else:
                    self.counts["recovery_skipped"] += 1
            else:
                if self.acknowledge(record.framework_id, record.task_id, record.uuid):
                    self.checkpointed(record, now)
                else:
                    self.counts["recovery_skipped"] += 1
        for stream in self.streams.values():
            if stream.sendable():
                self._schedule(stream, now)
        self.counts["recovered"] = sum(len(s.pending) for s in self.streams.values())

    # -- queries --------------------------------------------------------------------------
    def records(self) -> list[Record]:
        """The fewest records that rebuild this state (what a compacted log holds): per live
        task its last acknowledged update (so the next one is checked against it) and every
        unacknowledged one. Ended streams are left out."""
        out: list[Record] = []
        for (fid, tid), stream in self.streams.items():
            last = stream.last_acked
            if last is not None:
                out += [Added(last), Acked(fid, tid, last.status.uuid)]
            out += [Added(p.update) for p in stream.pending]
        return out

    def unacknowledged(self) -> Iterator[StatusUpdate]:
        """Every update not yet acknowledged by its framework, in order per task."""
        for stream in self.streams.values():
            for pending in stream.pending:
                yield pending.update

    def latest_state(self, framework_id: str, task_id: str) -> tasks.State | None:
        """State of the newest update taken for a live task (acknowledged or not)."""
        stream = self.streams.get((framework_id, task_id))
        return stream.last_state if stream is not None else None

    def ended(self, framework_id: str, task_id: str) -> bool:
        """The task's terminal update was acknowledged (among the last ENDED_MEMORY)."""
        return (framework_id, task_id) in self._ended

    # -- internals ------------------------------------------------------------------------
    def _reject(self, key: Key, status: TaskStatus, reason: str) -> list[Output]:
        self.counts["rejected"] += 1
        out: list[Output] = [Rejected(key[0], key[1], status.uuid, reason)]
        if status.uuid and _from_executor(status):
            out.append(AckExecutor(key[0], key[1], status.executor_id, status.uuid))
        return out

    def _duplicate(self, framework_id: str, status: TaskStatus, durable: bool) -> list[Output]:
        self.counts["duplicates"] += 1
        if durable and _from_executor(status):
            return [AckExecutor(framework_id, status.task_id, status.executor_id, status.uuid)]
        return []  # acknowledged to the executor once its first copy is durable

    def _end(self, stream: _Stream) -> StreamEnded:
        key = (stream.framework_id, stream.task_id)
        self._unschedule(stream)
        del self.streams[key]
        self._ended[key] = frozenset(stream.acked)
        while len(self._ended) > ENDED_MEMORY:
            self._ended.popitem(last=False)
        self.counts["ended"] += 1
        return StreamEnded(stream.framework_id, stream.task_id, stream.last_state)

    def _next_token(self) -> int:
        self._seq += 1
        return self._seq

    def _schedule(self, stream: _Stream, at: float) -> None:
        stream.due = at
        stream.token = self._next_token()
        heapq.heappush(self._heap, (at, stream.token, (stream.framework_id, stream.task_id)))

    def _unschedule(self, stream: _Stream) -> None:
        stream.due = None
        stream.token = -1  # its heap entry, if any, is now stale

    def _rebuild_heap(self) -> None:
        self._heap = [(s.due, s.token, k) for k, s in self.streams.items() if s.due is not None]
        heapq.heapify(self._heap)

    def validate(self) -> None:
        """Invariants, checked after every step in tests."""
        live = {(t, k) for _, t, k in self._heap}
        for key, s in self.streams.items():
            assert key == (s.framework_id, s.task_id)
            assert key not in self._ended
            uuids = [p.update.status.uuid for p in s.pending]
            assert len(set(uuids)) == len(uuids) == len(s.index)
            assert all(s.index[u] is p for u, p in zip(uuids, s.pending, strict=True))
            assert not set(uuids) & set(s.acked)
            assert all(p.update.framework_id == s.framework_id
                       and p.update.status.task_id == s.task_id for p in s.pending)
            # Only the last update may be terminal; nothing follows a terminal update.
            assert not any(tasks.is_terminal(p.update.status.state) for p in list(s.pending)[:-1])
            if s.pending:
                assert s.last_state == s.pending[-1].update.status.state
            elif s.last_acked is not None:
                assert s.last_state == s.last_acked.status.state
            # A head is scheduled exactly when it may be sent.
            assert (s.due is not None) == s.sendable(), key
            if s.due is not None:
                assert (s.token, key) in live
            else:
                assert s.sends == 0
            assert (s.sent_at is not None) == (s.sends > 0), key
        assert self.retry.initial <= self.retry.timeout <= max(self.retry.cap, self.retry.initial)
        assert not any(k in self.streams for k in self._ended)
        assert len(self._ended) <= ENDED_MEMORY
        assert all(v >= 0 for v in self.counts.values())


def compact(records: Iterable[Record]) -> list[Record]:
    """The records of a log with finished streams and acknowledged updates dropped: replaying
    the result rebuilds the same pending updates as replaying `records`."""
    manager = StatusUpdateManager()
    manager.recover(records)
    return manager.records()
