"""The state stream's shells: a publisher (PUB of sequenced deltas + a ROUTER serving
snapshots, idle heartbeats) and a subscriber that keeps a converged copy, around the pure
cores in stream_core.py. The master publishes; allocator, broker and CLI subscribe."""

from __future__ import annotations

from collections.abc import Callable, Iterable

import zmq

from services.bus import codec
from services.bus.curve import CurveClient, CurveServer
from services.bus.epoch import EpochFence, Verdict
from services.bus.log import get_logger
from services.bus.peer import (
    DRAIN_BATCH,
    DRAIN_SECONDS,
    HWM,
    DealerClient,
    HeartbeatConfig,
    RouterServer,
    Sender,
    decode_counted,
)
from services.bus.reactor import Reactor, Timer
from services.bus.stats import Stats
from services.bus.stream_core import (
    Changed,
    Phase,
    PublisherCore,
    RequestSnapshot,
    StateEntry,
    StreamCopy,
    SubscriberCore,
    entry_size,
)

log = get_logger("bus.statestream")
SNAPSHOT_RETRY = 0.05  # seconds before asking again after a refused snapshot request
# A snapshot not answered within the subscriber's patience is asked again, and the
# patience doubles, up to this many times the configured timeout (a publisher busy
# building snapshots must not be sent more of them); it is reset once synced.
SNAPSHOT_PATIENCE_MAX = 16
# Envelope.state_delta on the wire: its tag (field number, length-delimited).
_STATE_DELTA_TAG = codec.varint(
    codec.Envelope.DESCRIPTOR.fields_by_name["state_delta"].number << 3 | 2)


class StatePublisher:
    def __init__(
        self, reactor: Reactor, ctx: zmq.Context[zmq.Socket[bytes]], sender: Sender, *,
        pub_bind: str, snapshot_bind: str, epoch: int, heartbeat_interval: float = 1.0,
        frame_limit: int = codec.DEFAULT_FRAME_LIMIT, curve: CurveServer | None = None,
        stats: Stats | None = None,
    ) -> None:
        self.reactor = reactor
        self.sender = sender
        self.stats = stats or Stats()
        self.frame_limit = frame_limit
        self.heartbeat_interval = heartbeat_interval
        self.core = PublisherCore(epoch, frame_limit)
        self.active = True  # a standby binds its sockets early but neither beats nor serves
        self.pub = ctx.socket(zmq.PUB)
        self.pub.setsockopt(zmq.LINGER, 0)
        self.pub.setsockopt(zmq.SNDHWM, HWM)
        if curve is not None:
            curve.apply(self.pub)
        self.pub.bind(pub_bind)
        self.pub_endpoint: str = self.pub.getsockopt_string(zmq.LAST_ENDPOINT)
        self.snapshots = RouterServer(
            reactor, ctx, snapshot_bind, sender, self._on_request,
            heartbeat=HeartbeatConfig(heartbeat_interval), stats=self.stats,
            frame_limit=frame_limit, curve=curve, name="snapshot",
        )
        self.snapshot_endpoint = self.snapshots.endpoint
        self._last_sent = reactor.now()
        self._beat = reactor.every(heartbeat_interval / 2, self._tick)

    @property
    def store(self) -> dict[str, StateEntry]:
        return self.core.store

    def restart(self, epoch: int, entries: Iterable[StateEntry],
                base: StreamCopy | None = None) -> None:
        """Lead afresh at `epoch` with this state. Subscribers see the new epoch on the next
        delta or heartbeat and re-snapshot; at the same epoch (a reign that was not resumed)
        the sequence jumps ahead instead of restarting, with the same effect. `base`: the
        previous leader's stream as this one's standby followed it (PublisherCore.successor):
        a subscriber holding that copy is sent only what differs."""
        self.core = self.core.successor(epoch, entries, base)
        self.active = True
        self._tick_now()

    def deactivate(self) -> None:
        """Stop publishing, beating and serving snapshots (stepped down, or paused: the
        store and the sequence are kept, and `resume` goes on from them)."""
        self.active = False

    pause = deactivate

    def resume(self) -> None:
        """The paused reign goes on: beat at once, so subscribers know it is alive."""
        self.active = True
        self._tick_now()

    def publish(self, entries: Iterable[StateEntry]) -> None:
        if not self.active:
            raise RuntimeError("publish on an inactive (stepped-down) publisher")
        deltas, too_large = self.core.publish_encoded(entries)
        for entry in too_large:
            # Refused here, where it is produced, and the stream goes on without it.
            self.stats.inc("state_entries_refused{reason=too_large}")
            log.error("state entry too large for a frame: not published", key=entry.key,
                      bytes=entry_size(entry), limit=self.core.max_bytes)
        for delta in deltas:
            # The stamped envelope, then its payload as the delta's bytes (a message's
            # fields may come in any order on the wire): the delta is not copied again.
            head = self.sender.stamp(codec.Envelope()).SerializeToString()
            self._send_frame(b"".join((head, _STATE_DELTA_TAG, codec.varint(len(delta.payload)),
                                       delta.payload)))
            self.stats.inc("state_deltas_published")

    def _send(self, env: codec.Envelope) -> None:
        self.sender.stamp(env)
        try:
            frame = codec.encode(env, self.frame_limit)
        except codec.FrameTooLarge as exc:  # never raised into the leader's reactor
            # Subscribers see the gap in the sequence and re-snapshot.
            self.stats.inc("frames_unsent{reason=too_large}")
            log.error("state delta too large to send", error=str(exc))
            return
        self._send_frame(frame)

    def _send_frame(self, frame: bytes) -> None:
        if len(frame) > self.frame_limit:  # never raised into the leader's reactor
            # Subscribers see the gap in the sequence and re-snapshot.
            self.stats.inc("frames_unsent{reason=too_large}")
            log.error("state delta too large to send", bytes=len(frame),
                      limit=self.frame_limit)
            return
        self.pub.send(frame, copy=False)
        self._last_sent = self.reactor.now()

    def _tick(self) -> None:
        if self.active and self.reactor.now() - self._last_sent >= self.heartbeat_interval:
            self._tick_now()

    def _tick_now(self) -> None:
        env = codec.Envelope()
        env.state_delta.CopyFrom(self.core.heartbeat())
        self._send(env)

    def _on_request(self, peer: bytes, env: codec.Envelope) -> None:
        if not self.active:
            self.snapshots.send(peer, codec.error_envelope(
                codec.ErrorCode.Value("NOT_LEADER"), "this publisher is not leading"))
            return
        if env.WhichOneof("payload") != "snapshot_request":
            self.snapshots.send(peer, codec.error_envelope(
                codec.ErrorCode.Value("UNEXPECTED"),
                f"the snapshot endpoint takes snapshot_request, not {codec.payload_kind(env)}"))
            return
        request = env.snapshot_request
        have = (request.have.epoch, request.have.seq) if request.HasField("have") else None
        base, tails = self.core.snapshot_tails(request.prefix, have)
        for i, (_, tail) in enumerate(tails):  # its entries as the store encoded them
            reply = codec.Envelope(in_reply_to=env.message_id)
            reply.snapshot_chunk.SetInParent()  # its fields all come in the tail
            self.snapshots.send(peer, reply,
                                self.core.chunk_head(i == len(tails) - 1, base) + tail)
        self.stats.inc(f"snapshots_served{{kind={'whole' if base is None else 'incremental'}}}")
        log.info("served snapshot", peer=peer, seq=self.core.seq,
                 chunks=len(tails), keys=sum(n for n, _ in tails),
                 since=f"{base[0]}/{base[1]}" if base else "")

    def close(self) -> None:
        self._beat.cancel()
        self.snapshots.close()
        self.pub.close(linger=0)


ChangeHandler = Callable[[Changed], None]


class StateSubscriber:
    """Keeps `store` converged with a publisher's; calls `on_change` for every change."""

    def __init__(
        self, reactor: Reactor, ctx: zmq.Context[zmq.Socket[bytes]], sender: Sender,
        on_change: ChangeHandler, *, prefix: str = "", heartbeat_interval: float = 1.0,
        max_missed: int = 5, snapshot_timeout: float = 2.0,
        frame_limit: int = codec.DEFAULT_FRAME_LIMIT, curve: CurveClient | None = None,
        stats: Stats | None = None, fence: EpochFence | None = None,
        keep_recent: bool = False,
    ) -> None:
        """`keep_recent`: log the keys of recent deltas (a standby master's following: its
        copy becomes its stream's base, SubscriberCore.recent)."""
        self.reactor = reactor
        self.ctx = ctx
        self.on_change = on_change
        # Deltas and snapshot chunks are taken only from the elected publisher, at its
        # epoch (services/bus/epoch.py); others are dropped, counted: the stream heals by
        # resyncing once the detector names the leader and the shell reconnects.
        self.fence = fence
        self.stats = stats or Stats()
        self.frame_limit = frame_limit
        self.curve = curve
        self.silence_limit = heartbeat_interval * max_missed
        self.snapshot_timeout = snapshot_timeout
        self._patience = snapshot_timeout  # doubles after each timeout (SNAPSHOT_PATIENCE_MAX)
        self.core = SubscriberCore(prefix=prefix, keep_recent=keep_recent)
        self.sub: zmq.Socket[bytes] | None = None
        self.snapshots = DealerClient(
            reactor, ctx, sender, self._on_reply,
            on_connected=self._on_snapshot_server, on_gone=self._on_snapshot_server_gone,
            heartbeat=HeartbeatConfig(heartbeat_interval, max_missed), stats=self.stats,
            frame_limit=frame_limit, curve=curve, name="snapshot-client",
        )
        self._last_heard = reactor.now()
        self._snapshot_due: Timer | None = None
        self._asked = ("", 0)  # (message id, core's request number) of the last request
        # The last request may be lost: not sent (no socket), or sent on a socket dropped
        # since (the server missed its beats). Sent again once the server is reachable.
        self._maybe_lost = False
        self._retry = SNAPSHOT_RETRY  # after a refused snapshot request
        self._watch = reactor.every(heartbeat_interval / 2, self._tick)

    @property
    def store(self) -> dict[str, StateEntry]:
        return self.core.store

    @property
    def synced(self) -> bool:
        return self.core.phase is Phase.SYNCED

    def connect(self, pub_endpoint: str, snapshot_endpoint: str) -> None:
        """Subscribe to a (new) publisher, then fetch its snapshot."""
        self._close_sub()
        sub = self.ctx.socket(zmq.SUB)
        sub.setsockopt(zmq.LINGER, 0)
        sub.setsockopt(zmq.RCVHWM, HWM)
        sub.setsockopt(zmq.MAXMSGSIZE, self.frame_limit * 4)
        if self.curve is not None:
            self.curve.apply(sub)
        sub.setsockopt(zmq.SUBSCRIBE, b"")
        sub.connect(pub_endpoint)
        self.sub = sub
        self.reactor.add_reader(sub, self._on_readable)
        self.snapshots.connect(snapshot_endpoint)
        self._last_heard = self.reactor.now()
        self._retry = SNAPSHOT_RETRY
        self._patience = self.snapshot_timeout
        self._run(self.core.start())

    def _run(self, outputs: list[Changed | RequestSnapshot]) -> None:
        for out in outputs:
            if isinstance(out, RequestSnapshot):
                self._request_snapshot(out)
            else:
                self.on_change(out)

    def _request_snapshot(self, out: RequestSnapshot) -> None:
        self.stats.inc("state_resyncs")
        have = out.have
        log.info("requesting snapshot", reason=out.reason, prefix=self.core.prefix,
                 have=f"{have[0]}/{have[1]}" if have else "")
        self._send_request(out.request)

    def _send_request(self, request: int) -> None:
        env = codec.Envelope()
        env.snapshot_request.prefix = self.core.prefix
        have = self.core.have()  # the store is untouched while syncing: still this
        if have is not None:
            env.snapshot_request.have.epoch, env.snapshot_request.have.seq = have
        self._maybe_lost = not self.snapshots.send(env)
        self._asked = (env.message_id, request)  # replies name it in `in_reply_to`
        self._expect_progress()

    def _on_snapshot_server_gone(self) -> None:
        if not self.synced:
            self._maybe_lost = True  # went with the dropped socket, or its answer will

    def _on_snapshot_server(self) -> None:
        """The snapshot server is reachable (again): a request that may have been lost is
        asked again now, not after the whole patience."""
        if self._maybe_lost and not self.synced:
            self.stats.inc("snapshot_requests_resent")
            log.info("asking for the snapshot again: the request may have been lost",
                     prefix=self.core.prefix)
            self._send_request(self.core.request)

    def _expect_progress(self) -> None:
        """The snapshot is late if no chunk of it comes within the patience: a large one
        still arriving is not asked again from the start (which a slow link never ends)."""
        if self._snapshot_due is not None:
            self._snapshot_due.cancel()
        self._snapshot_due = self.reactor.call_later(self._patience, self._snapshot_late)

    def _snapshot_late(self) -> None:
        self._snapshot_due = None
        if not self.synced:
            self.stats.inc("snapshots_late")
            self._patience = min(2 * self._patience,
                                 SNAPSHOT_PATIENCE_MAX * self.snapshot_timeout)
            self._run(self.core.resync(f"snapshot timed out; next patience "
                                       f"{self._patience:g}s"))

    def _on_readable(self) -> None:
        sub = self.sub
        clock = self.reactor.clock
        until = clock() + DRAIN_SECONDS
        for _ in range(DRAIN_BATCH):
            if sub is None or sub is not self.sub or clock() > until:
                return
            try:
                frames = sub.recv_multipart(flags=zmq.NOBLOCK)
            except zmq.Again:
                return
            try:
                env = decode_counted(frames, self.frame_limit, self.stats, "sub")
            except codec.FrameError:
                continue
            if env.WhichOneof("payload") != "state_delta":
                self.stats.inc("frames_dropped{reason=unexpected}")
                continue
            if not self._admitted(env):
                continue
            self._last_heard = self.reactor.now()
            self._run(self.core.on_delta(env.state_delta))

    def _admitted(self, env: codec.Envelope) -> bool:
        if self.fence is None:
            return True
        verdict = self.fence.check(env.sender_role, env.epoch, env.sender_id)
        if verdict is Verdict.ADMIT:
            return True
        self.stats.inc(f"frames_dropped{{reason={verdict.value}}}")
        log.warning("state stream message fenced", kind=codec.payload_kind(env),
                    detail=self.fence.explain(verdict, env.sender_role, env.epoch,
                                              env.sender_id))
        return False

    def _on_reply(self, env: codec.Envelope) -> None:
        kind = env.WhichOneof("payload")
        if kind == "snapshot_chunk" and not self._admitted(env):
            return
        if kind == "snapshot_chunk":
            message_id, request = self._asked
            request = request if env.in_reply_to == message_id else 0
            if not self.core.expects(request):
                self.stats.inc("snapshot_chunks_stale")  # answers an earlier request
                return
            self._run(self.core.on_snapshot_chunk(env.snapshot_chunk, request))
            if not self.synced:
                if self.core.request == request:  # still this request's: it progresses
                    self._expect_progress()
            elif self._snapshot_due is not None:
                self._snapshot_due.cancel()
                self._snapshot_due = None
                self._retry = SNAPSHOT_RETRY
                self._patience = self.snapshot_timeout
        elif kind == "error":
            log.warning("snapshot endpoint error", message=env.error.message)
            if not self.synced and self._snapshot_due is not None:
                # Refused (a new leader a moment before it leads): ask again soon, not
                # after the whole snapshot timeout; backing off up to that timeout.
                self._snapshot_due.cancel()
                self._snapshot_due = self.reactor.call_later(self._retry, self._snapshot_late)
                self._retry = min(2 * self._retry, self.snapshot_timeout)
        else:
            self.stats.inc("frames_dropped{reason=unexpected}")

    def _tick(self) -> None:
        if self.sub is None:
            return
        if self.reactor.now() - self._last_heard > self.silence_limit:
            self._last_heard = self.reactor.now()
            self._run(self.core.on_publisher_silent())

    def _close_sub(self) -> None:
        if self.sub is not None:
            self.reactor.remove_reader(self.sub)
            self.sub.close(linger=0)
            self.sub = None

    def close(self) -> None:
        self._watch.cancel()
        if self._snapshot_due is not None:
            self._snapshot_due.cancel()
        self.snapshots.close()
        self._close_sub()
