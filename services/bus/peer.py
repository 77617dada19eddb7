"""ROUTER/DEALER endpoints with heartbeats both ways (Guide "Paranoid Pirate"), capped
reconnect backoff, epoch fencing against the elected leaders (services/bus/epoch.py: a
message not vouched for yet is held briefly, bounded), error replies and drop counters.
Services talk through these and never touch framing themselves."""

from __future__ import annotations

import os
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

import zmq

from schemas import bus_pb2
from services.bus import codec
from services.bus.curve import CurveClient, CurveServer
from services.bus.epoch import EpochFence, Verdict
from services.bus.liveness import (
    CHANNEL_SEP,
    MAX_CHANNELS,
    Backoff,
    ChannelTable,
    Liveness,
    PeerTable,
    valid_channel,
)
from services.bus.log import get_logger
from services.bus.reactor import Reactor, Timer
from services.bus.stats import Stats

log = get_logger("bus.peer")

DRAIN_BATCH = 1000  # messages read per wake-up before yielding to other sockets and timers
# ... and for at most this long: the reactor's idle flushes (state deltas, batched updates)
# and its timers wait for the end of a wake-up, so a backlog of costly messages (a thousand
# launches of ten tasks: a second) would hold back everything this service tells others.
DRAIN_SECONDS = 0.02
HWM = 100_000
HARD_SIZE_FACTOR = 4  # zmq drops a connection beyond this many frame limits (memory guard)
# A message from an elected role that the detector cannot vouch for yet (no leader known, or
# a newer epoch: a failover it has not seen) waits this long, then is refused; at most
# FENCE_HOLD_MAX wait per socket (beyond: refused at once).
FENCE_HOLD_S = 3.0
FENCE_HOLD_MAX = 1000


@dataclass
class Sender:
    """Who this process is on the bus; stamped on every outgoing envelope."""

    sender_id: str
    role: int
    epoch: int = 0  # current leader epoch for elected roles; services update it on election
    ids: codec.MessageIds = field(default_factory=codec.MessageIds)

    def stamp(self, env: codec.Envelope, now_us: int | None = None) -> codec.Envelope:
        env.version = codec.PROTOCOL_VERSION
        if not env.message_id:
            env.message_id = self.ids.next()
        env.sender_id = self.sender_id
        env.sender_role = self.role  # type: ignore[assignment]
        env.epoch = self.epoch
        env.sent_at_us = codec.now_us() if now_us is None else now_us
        return env


@dataclass
class HeartbeatConfig:
    interval: float = 1.0
    max_missed: int = 5


MessageHandler = Callable[[bytes, codec.Envelope], None]


def decode_counted(frames: list[bytes], limit: int, stats: Stats, socket: str,
                   peer: bytes = b"") -> codec.Envelope:
    """Decode one received message (a list of frames); a refused one is counted by reason,
    logged, and re-raised as its FrameError so the caller can answer it."""
    stats.inc("frames_received")
    try:
        if len(frames) != 1:
            raise codec.MalformedFrame(f"expected 1 frame, got {len(frames)}")
        return codec.decode(frames[0], limit)
    except codec.FrameError as exc:
        stats.inc(f"frames_dropped{{reason={exc.reason}}}")
        log.warning("dropped frame", socket=socket, peer=peer or "-",
                    reason=exc.reason, error=str(exc))
        raise


@dataclass
class _Held:
    peer: bytes
    env: codec.Envelope
    until: float


class _Endpoint:
    """What ROUTER and DEALER ends share: decode, count, fence, answer errors."""

    def __init__(
        self, reactor: Reactor, sender: Sender, stats: Stats | None, fence: EpochFence | None,
        frame_limit: int, name: str, fence_hold_s: float = FENCE_HOLD_S,
        fence_hold_max: int = FENCE_HOLD_MAX,
    ) -> None:
        self.reactor = reactor
        self.sender = sender
        self.stats = stats or Stats()
        self.fence = fence
        self.frame_limit = frame_limit
        self.name = name
        self.fence_hold_s, self.fence_hold_max = fence_hold_s, fence_hold_max
        self._held: deque[_Held] = deque()
        self._releasing = self._release_again = False
        self._unlisten = fence.listen(self._release) if fence is not None else None

    def _configure(self, sock: zmq.Socket[bytes]) -> None:
        sock.setsockopt(zmq.LINGER, 0)
        sock.setsockopt(zmq.SNDHWM, HWM)
        sock.setsockopt(zmq.RCVHWM, HWM)
        sock.setsockopt(zmq.MAXMSGSIZE, self.frame_limit * HARD_SIZE_FACTOR)

    def _accept(self, peer: bytes, frames: list[bytes]) -> codec.Envelope | None:
        """Decode one received message; on refusal count it, log it, answer it if we can."""
        try:
            env = decode_counted(frames, self.frame_limit, self.stats, self.name, peer)
        except codec.FrameError as exc:
            self._reply_error(peer, exc.code, str(exc), exc.envelope)
            return None
        if self.fence is None:
            return env
        verdict = self.fence.check(env.sender_role, env.epoch, env.sender_id)
        if verdict is Verdict.ADMIT:
            return env
        if verdict.holdable and len(self._held) < self.fence_hold_max:
            self._held.append(_Held(peer, env, self.reactor.now() + self.fence_hold_s))
            self.stats.inc(f"frames_held{{reason={verdict.value}}}")
            return None
        self._refuse(peer, env, verdict)
        return None

    def _refuse(self, peer: bytes, env: codec.Envelope, verdict: Verdict) -> None:
        assert self.fence is not None
        message = self.fence.explain(verdict, env.sender_role, env.epoch, env.sender_id)
        self.stats.inc(f"frames_dropped{{reason={verdict.value}}}")
        log.warning("fenced message refused", socket=self.name, verdict=verdict.value,
                    sender=env.sender_id, epoch=env.epoch, kind=codec.payload_kind(env),
                    detail=message)
        self._reply_error(peer, verdict.code, message, env)

    def _release(self) -> None:
        """Act on the held messages the fence now admits; refuse those it refuses, or that
        waited too long. Runs when a followed leader changes, and on every tick."""
        if self._releasing:  # a delivered message's handler changed the fence again
            self._release_again = True
            return
        self._releasing = True
        try:
            self._release_again = True
            while self._release_again:
                self._release_again = False
                self._release_once()
        finally:
            self._releasing = False

    def _release_once(self) -> None:
        if not self._held or self.fence is None:
            return
        now = self.reactor.now()
        held, self._held = self._held, deque()
        keep: deque[_Held] = deque()
        for h in held:
            verdict = self.fence.check(h.env.sender_role, h.env.epoch, h.env.sender_id)
            if verdict is Verdict.ADMIT:
                self.stats.inc("frames_released")
                try:
                    self._deliver(h.peer, h.env)
                except Exception as exc:  # one handler's bug never loses the others
                    self.stats.inc("handler_errors{handler=held}")
                    log.error("handler failed on a released message", socket=self.name,
                              error=repr(exc), exc_info=True)
            elif verdict.holdable and now < h.until:
                keep.append(h)
            else:
                self._refuse(h.peer, h.env, verdict)
        keep.extend(self._held)  # held meanwhile (by a handler's reads), after the older
        self._held = keep

    def _drop_held(self, reason: str) -> None:
        if self._held:
            self.stats.inc(f"frames_dropped{{reason={reason}}}", len(self._held))
            self._held.clear()

    def _deliver(self, peer: bytes, env: codec.Envelope) -> None:
        """An admitted message, to the socket's own handling."""
        raise NotImplementedError

    def _stop_fencing(self) -> None:
        if self._unlisten is not None:
            self._unlisten()
            self._unlisten = None
        self._held.clear()

    def _reply_error(self, peer: bytes, code: int, message: str,
                     about: codec.Envelope | None) -> None:
        if about is not None and about.WhichOneof("payload") == "error":
            return  # never answer an error with an error (no ping-pong between two peers)
        env = codec.error_envelope(code, message)
        if about is not None:
            env.in_reply_to = about.message_id
            env.channel = about.channel  # the endpoint inside the peer that sent it
        self._send_raw(peer, env)

    def _send_raw(self, peer: bytes, env: codec.Envelope, tail: bytes = b"") -> bool:
        raise NotImplementedError

    def _encode(self, env: codec.Envelope, tail: bytes = b"") -> bytes | None:
        """The frame, or None (counted, logged) when it is over the frame limit: a message
        too large to send is refused here, never raised into the caller. `tail`: as
        codec.encode's."""
        try:
            return codec.encode(env, self.frame_limit, tail)
        except codec.FrameTooLarge as exc:
            self.stats.inc("frames_unsent{reason=too_large}")
            log.warning("message too large to send", socket=self.name,
                        kind=codec.payload_kind(env), error=str(exc))
            return None


class RouterServer(_Endpoint):
    """A bound ROUTER: delivers (peer, envelope) to `on_message`, beats every known peer
    while idle, and reports a peer gone after `max_missed` silent intervals.

    Channels: a connection may carry many endpoints (Envelope.channel, e.g. the virtual
    agents of the agent emulator). Such a message is delivered with the composite peer
    `routing id + CHANNEL_SEP + channel` (services/bus/liveness.py), which `send` and
    `last_heard` take like any peer; liveness stays per connection, and a connection gone is
    reported for itself and then for each of its channels (at most `max_channels` in all)."""

    def __init__(
        self, reactor: Reactor, ctx: zmq.Context[zmq.Socket[bytes]], bind: str, sender: Sender,
        on_message: MessageHandler, *, on_peer_gone: Callable[[bytes], None] | None = None,
        heartbeat: HeartbeatConfig | None = None, stats: Stats | None = None,
        fence: EpochFence | None = None, frame_limit: int = codec.DEFAULT_FRAME_LIMIT,
        curve: CurveServer | None = None, name: str = "router",
        fence_hold_s: float = FENCE_HOLD_S, fence_hold_max: int = FENCE_HOLD_MAX,
        max_channels: int = MAX_CHANNELS,
    ) -> None:
        super().__init__(reactor, sender, stats, fence, frame_limit, name, fence_hold_s,
                         fence_hold_max)
        self.heartbeat = heartbeat or HeartbeatConfig()
        self.on_message = on_message
        self.on_peer_gone = on_peer_gone
        self.peers = PeerTable(self.heartbeat.interval, self.heartbeat.max_missed)
        self.channels = ChannelTable(max_channels)
        # With CURVE: each connection's ZAP User-Id (its key's principal), by routing id;
        # forgotten when the connection is gone.
        self._user_ids: dict[bytes, str] | None = {} if curve is not None else None
        self.sock = ctx.socket(zmq.ROUTER)
        self._configure(self.sock)
        self.sock.setsockopt(zmq.ROUTER_MANDATORY, 1)  # unknown peer raises, is not dropped
        if curve is not None:
            curve.apply(self.sock)
        self.sock.bind(bind)
        self.endpoint: str = self.sock.getsockopt_string(zmq.LAST_ENDPOINT)
        reactor.add_reader(self.sock, self._on_readable)
        self._beat = reactor.every(self.heartbeat.interval / 2, self._tick)

    def send(self, peer: bytes, env: codec.Envelope, tail: bytes = b"") -> bool:
        """Stamp and send; False (and counted) if the peer is unknown or its queue is full.
        A composite peer's message goes to its connection, with its channel set. `tail`:
        more of the payload, as wire bytes (codec.encode)."""
        channel = self.channels.channel(peer)
        if channel:
            env.channel = channel
            peer = self.channels.routing_id(peer)
        return self._send_raw(peer, env, tail)

    def last_heard(self, peer: bytes) -> float | None:
        """When `peer`'s connection (a composite peer's too) was last heard from (reactor
        clock), or None when it is not known (never heard, or gone)."""
        live = self.peers.peers.get(self.channels.routing_id(peer))
        return None if live is None else live.last_heard

    def last_heard_of(self, peers: Iterable[bytes]) -> dict[bytes, float]:
        """`last_heard` of each of `peers` that is known, each connection looked up once
        (the master asks it of all its agents: 10,000 channels of one emulator)."""
        conns = self.peers.peers
        at_of: dict[bytes, float | None] = {}
        out: dict[bytes, float] = {}
        for peer, rid in self.channels.routing_ids(peers):
            if rid in at_of:
                at = at_of[rid]
            else:
                live = conns.get(rid)
                at = at_of[rid] = None if live is None else live.last_heard
            if at is not None:
                out[peer] = at
        return out

    def principal(self, peer: bytes) -> str | None:
        """The ZAP User-Id of `peer`'s connection (a composite peer's too): the principal
        its CURVE key was admitted as; None without CURVE or for a peer not heard."""
        if self._user_ids is None:
            return None
        return self._user_ids.get(self.channels.routing_id(peer))

    def _send_raw(self, peer: bytes, env: codec.Envelope, tail: bytes = b"") -> bool:
        self.sender.stamp(env)
        frame = self._encode(env, tail)
        if frame is None:
            return False
        try:
            self.sock.send_multipart([peer, frame], flags=zmq.NOBLOCK, copy=False)
        except zmq.Again:
            self.stats.inc("frames_unsent{reason=queue_full}")
            return False
        except zmq.ZMQError as exc:
            if exc.errno != zmq.EHOSTUNREACH:
                raise
            self.stats.inc("frames_unsent{reason=unknown_peer}")
            return False
        self.stats.inc("frames_sent")
        self.peers.sent(peer, self.reactor.now())
        return True

    def _on_readable(self) -> None:
        clock = self.reactor.clock
        until = clock() + DRAIN_SECONDS
        for _ in range(DRAIN_BATCH):
            try:
                msg = self._recv()
            except zmq.Again:
                return
            peer, frames = msg[0], msg[1:]
            env = self._accept(peer, frames)
            if env is not None:  # refused (or held) frames prove nothing of a peer's liveness
                self._deliver(peer, env)
            if clock() >= until:
                return  # the rest at the next wake-up (the socket stays readable)

    def _recv(self) -> list[bytes]:
        if self._user_ids is None:
            return self.sock.recv_multipart(flags=zmq.NOBLOCK)
        parts = self.sock.recv_multipart(flags=zmq.NOBLOCK, copy=False)
        peer = parts[0].bytes
        if len(parts) > 1:
            user = parts[-1].get("User-Id")
            if user and self._user_ids.get(peer) != user:
                self._user_ids[peer] = str(user)
        return [p.bytes for p in parts]

    def _deliver(self, peer: bytes, env: codec.Envelope) -> None:
        beat = env.WhichOneof("payload") == "heartbeat"
        new = self.peers.heard(peer, self.reactor.now(),
                               env.heartbeat.interval_ms / 1000 if beat else None)
        if beat:
            if new:  # answer at once so a (re)connecting client learns we are alive
                self._send_heartbeat(peer)
            return
        if env.channel:
            composite = self._channel_peer(peer, env)
            if composite is None:
                return
            peer = composite
        self.on_message(peer, env)

    def _channel_peer(self, peer: bytes, env: codec.Envelope) -> bytes | None:
        """The composite peer of a message with a channel; None (counted, answered) when the
        channel is malformed or the channel table is full."""
        if not valid_channel(peer, env.channel):
            self.stats.inc("frames_dropped{reason=bad_channel}")
            self._reply_error(peer, bus_pb2.INVALID, f"a channel (and the routing id of a "
                              f"connection with channels) may not hold {CHANNEL_SEP!r}", env)
            return None
        composite = self.channels.add(peer, env.channel)
        if composite is None:
            self.stats.inc("frames_dropped{reason=channels_full}")
            log.warning("channel refused: table full", socket=self.name,
                        peer=peer, limit=self.channels.limit)
            self._reply_error(peer, bus_pb2.INTERNAL, f"{self.name} tracks "
                              f"{self.channels.limit} channels already", env)
        return composite

    def _send_heartbeat(self, peer: bytes) -> None:
        env = codec.Envelope()
        env.heartbeat.interval_ms = int(self.heartbeat.interval * 1000)
        self._send_raw(peer, env)

    def _tick(self) -> None:
        if self._held:
            self._release()  # refuses what waited too long
        due, gone = self.peers.tick(self.reactor.now())
        for peer in gone:
            self.stats.inc("peers_lost")
            channels = self.channels.drop(peer)
            if self._user_ids is not None:
                self._user_ids.pop(peer, None)
            log.info("peer gone", socket=self.name, peer=peer,
                     channels=len(channels))
            if self.on_peer_gone is not None:
                for p in [peer, *channels]:
                    self._peer_gone(p)
        for peer in due:
            self._send_heartbeat(peer)

    def _peer_gone(self, peer: bytes) -> None:
        assert self.on_peer_gone is not None
        try:
            self.on_peer_gone(peer)
        except Exception as exc:  # one handler's bug never hides the other channels' loss
            self.stats.inc("handler_errors{handler=peer_gone}")
            log.error("peer-gone handler failed", socket=self.name,
                      peer=peer, error=repr(exc), exc_info=True)

    def close(self) -> None:
        self._stop_fencing()
        self._beat.cancel()
        self.reactor.remove_reader(self.sock)
        self.sock.close(linger=0)


class DealerClient(_Endpoint):
    """A DEALER to one server endpoint (which may change: a new leader). Beats while idle;
    when the server misses `max_missed` beats it reports the server gone, drops the socket
    and reconnects after a capped backoff, as Paranoid Pirate does."""

    def __init__(
        self, reactor: Reactor, ctx: zmq.Context[zmq.Socket[bytes]], sender: Sender,
        on_message: Callable[[codec.Envelope], None], *,
        on_connected: Callable[[], None] | None = None,
        on_gone: Callable[[], None] | None = None,
        heartbeat: HeartbeatConfig | None = None, backoff: Backoff | None = None,
        stats: Stats | None = None, fence: EpochFence | None = None,
        frame_limit: int = codec.DEFAULT_FRAME_LIMIT, curve: CurveClient | None = None,
        name: str = "dealer", fence_hold_s: float = FENCE_HOLD_S,
        fence_hold_max: int = FENCE_HOLD_MAX,
    ) -> None:
        super().__init__(reactor, sender, stats, fence, frame_limit, name, fence_hold_s,
                         fence_hold_max)
        self.ctx = ctx
        self.heartbeat = heartbeat or HeartbeatConfig()
        self.backoff = backoff or Backoff(cap=min(2.0, self.heartbeat.interval * 2))
        self.on_message = on_message
        self.on_connected = on_connected
        self.on_gone = on_gone
        self.curve = curve
        self.endpoint: str | None = None
        self.sock: zmq.Socket[bytes] | None = None
        self.live: Liveness | None = None
        self.connected = False  # True once the server has been heard from on this socket
        self._reconnect: Timer | None = None
        self._beat = reactor.every(self.heartbeat.interval / 2, self._tick)

    def connect(self, endpoint: str) -> None:
        """(Re)connect to `endpoint` with a fresh socket; messages queued on the old one are
        dropped (callers retry what must arrive: status updates, registrations)."""
        self.endpoint = endpoint
        self._cancel_reconnect()
        self._open()

    def disconnect(self) -> None:
        self._cancel_reconnect()
        self.endpoint = None
        self._close_socket()

    def send(self, env: codec.Envelope, channel: str = "") -> bool:
        """Stamp and send; `channel`: the endpoint of this process that sends (the server
        answers it on the same channel; received envelopes keep theirs)."""
        if channel:
            env.channel = channel
        if self.sock is None:
            self.stats.inc("frames_unsent{reason=not_connected}")
            return False
        return self._send_raw(b"", env)

    def _send_raw(self, peer: bytes, env: codec.Envelope, tail: bytes = b"") -> bool:
        if self.sock is None:
            return False
        self.sender.stamp(env)
        frame = self._encode(env, tail)
        if frame is None:
            return False
        try:
            self.sock.send(frame, flags=zmq.NOBLOCK, copy=False)
        except zmq.Again:
            self.stats.inc("frames_unsent{reason=queue_full}")
            return False
        self.stats.inc("frames_sent")
        if self.live is not None:
            self.live.sent(self.reactor.now())
        return True

    def _open(self) -> None:
        self._close_socket()
        assert self.endpoint is not None
        sock = self.ctx.socket(zmq.DEALER)
        self._configure(sock)
        # A readable routing id helps when reading a server's logs (never a channel
        # separator in it: services/bus/liveness.py).
        rid = f"{self.sender.sender_id}/{os.urandom(3).hex()}".encode()
        sock.setsockopt(zmq.ROUTING_ID, rid.replace(CHANNEL_SEP, b"")[:255])
        if self.curve is not None:
            self.curve.apply(sock)
        sock.connect(self.endpoint)
        self.sock = sock
        now = self.reactor.now()
        self.live = Liveness(self.heartbeat.interval, self.heartbeat.max_missed, now, now)
        self.reactor.add_reader(sock, self._on_readable)
        self._send_heartbeat()  # announce ourselves; the server answers at once

    def _close_socket(self) -> None:
        self._drop_held("reconnected")  # held from the connection being closed
        if self.sock is not None:
            self.reactor.remove_reader(self.sock)
            self.sock.close(linger=0)
            self.sock = None
        self.live = None
        self.connected = False

    def _cancel_reconnect(self) -> None:
        if self._reconnect is not None:
            self._reconnect.cancel()
            self._reconnect = None

    def _send_heartbeat(self) -> None:
        env = codec.Envelope()
        env.heartbeat.interval_ms = int(self.heartbeat.interval * 1000)
        self._send_raw(b"", env)

    def _on_readable(self) -> None:
        sock = self.sock
        clock = self.reactor.clock
        until = clock() + DRAIN_SECONDS
        for _ in range(DRAIN_BATCH):
            if sock is None or sock is not self.sock or clock() > until:
                return  # a handler reconnected or closed us mid-batch, or the time is up
            try:
                frames = sock.recv_multipart(flags=zmq.NOBLOCK)
            except zmq.Again:
                return
            if self.live is not None:
                self.live.heard(self.reactor.now())
            if not self.connected:
                self.connected = True
                self.backoff.reset()
                log.info("server reachable", socket=self.name, endpoint=self.endpoint)
                if self.on_connected is not None:
                    self.on_connected()
            env = self._accept(b"", frames)
            if env is not None:
                self._deliver(b"", env)

    def _deliver(self, peer: bytes, env: codec.Envelope) -> None:
        if env.WhichOneof("payload") != "heartbeat":
            self.on_message(env)
        elif self.live is not None:  # judged by its interval too (liveness.py)
            self.live.advertised(env.heartbeat.interval_ms / 1000)

    def _tick(self) -> None:
        if self._held:
            self._release()  # refuses what waited too long
        if self.live is None:
            return
        now = self.reactor.now()
        if self.live.expired(now):
            self.stats.inc("peers_lost")
            was_connected = self.connected
            self._close_socket()
            delay = self.backoff.next_delay()
            log.info("server gone; reconnecting", socket=self.name, endpoint=self.endpoint,
                     after_s=round(delay, 3), was_connected=was_connected)
            self._reconnect = self.reactor.call_later(delay, self._open)
            if self.on_gone is not None:
                self.on_gone()
        elif self.live.beat_due(now):
            self._send_heartbeat()

    def close(self) -> None:
        self._stop_fencing()
        self._beat.cancel()
        self.disconnect()

