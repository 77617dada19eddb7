"""Heartbeat bookkeeping (ZeroMQ Guide "Paranoid Pirate") and reconnect backoff, as pure
state: the caller passes the time in, so tests fast-forward it."""

from __future__ import annotations

import random
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field

MAX_PEER_INTERVAL_S = 60.0  # the most a peer's advertised heartbeat interval is believed


@dataclass
class Liveness:
    """One peer: when we last heard from it and when we last sent to it. It is judged by
    the longer of our interval and the one it advertises in its heartbeats (a peer beating
    every 1 s is not gone after 5 x our 0.2 s)."""

    interval: float
    max_missed: int
    last_heard: float
    last_sent: float
    peer_interval: float = 0.0  # as the peer's heartbeats advertise it (0: not yet known)

    def heard(self, now: float, interval: float | None = None) -> None:
        """A message at `now`; `interval`: the one a heartbeat advertises (seconds)."""
        self.last_heard = max(self.last_heard, now)
        if interval is not None:
            self.advertised(interval)

    def advertised(self, interval: float) -> None:
        """The peer's heartbeat interval, as it says (nonsense ignored; capped)."""
        if interval > 0:  # not NaN, not <= 0
            self.peer_interval = min(interval, MAX_PEER_INTERVAL_S)

    def sent(self, now: float) -> None:
        self.last_sent = max(self.last_sent, now)

    def beat_due(self, now: float) -> bool:
        """True when nothing went to the peer for a whole interval (any traffic is a beat)."""
        return now - self.last_sent >= self.interval

    def expired(self, now: float) -> bool:
        """True once the peer missed `max_missed` beats."""
        return now - self.last_heard > max(self.interval, self.peer_interval) * self.max_missed


@dataclass
class PeerTable:
    """Liveness of every peer of a ROUTER socket, keyed by routing id."""

    interval: float
    max_missed: int
    peers: dict[bytes, Liveness] = field(default_factory=dict)

    def heard(self, peer: bytes, now: float, interval: float | None = None) -> bool:
        """Record a message from `peer` (`interval`: the one its heartbeat advertises);
        returns True when the peer is new."""
        live = self.peers.get(peer)
        if live is None:
            live = self.peers[peer] = Liveness(self.interval, self.max_missed, now,
                                               float("-inf"))
            if interval is not None:
                live.advertised(interval)
            return True
        live.heard(now, interval)
        return False

    def sent(self, peer: bytes, now: float) -> None:
        live = self.peers.get(peer)
        if live is not None:
            live.sent(now)

    def forget(self, peer: bytes) -> None:
        self.peers.pop(peer, None)

    def tick(self, now: float) -> tuple[list[bytes], list[bytes]]:
        """(peers owed a heartbeat, peers gone). Gone peers are removed from the table."""
        gone = [p for p, live in self.peers.items() if live.expired(now)]
        for p in gone:
            del self.peers[p]
        due = [p for p, live in self.peers.items() if live.beat_due(now)]
        return due, gone


class Backoff:
    """Capped exponential backoff with full jitter on the upper half (avoids herds)."""

    def __init__(
        self, initial: float = 0.05, cap: float = 2.0, factor: float = 2.0,
        rng: random.Random | None = None,
    ) -> None:
        if not 0 < initial <= cap or factor < 1:
            raise ValueError("backoff needs 0 < initial <= cap and factor >= 1")
        self.initial, self.cap, self.factor = initial, cap, factor
        self._rng = rng or random.Random()
        self._next = initial

    def next_delay(self) -> float:
        base = self._next
        self._next = min(self.cap, self._next * self.factor)
        return base / 2 + self._rng.random() * base / 2

    def reset(self) -> None:
        self._next = self.initial


# A composite peer is `routing id + CHANNEL_SEP + channel`: one endpoint (Envelope.channel)
# inside a connection. Neither part may hold the separator (a channel never does: refused;
# a routing id we set never does: DealerClient; ZeroMQ's own ids may, and carry no channel).
CHANNEL_SEP = b"\x1f"
MAX_CHANNELS = 200_000  # composite peers one ROUTER tracks; beyond: a channel is refused


def join_peer(routing_id: bytes, channel: str) -> bytes:
    return routing_id + CHANNEL_SEP + channel.encode() if channel else routing_id


def valid_channel(routing_id: bytes, channel: str) -> bool:
    return CHANNEL_SEP not in routing_id and CHANNEL_SEP.decode() not in channel


class ChannelTable:
    """The channels seen under each routing id of a ROUTER, so that a composite peer maps
    back to its connection (sends, liveness) and a connection gone fans out to its channels.
    At most `limit` composite peers in all; pruned when their connection is gone."""

    def __init__(self, limit: int = MAX_CHANNELS) -> None:
        self.limit = limit
        self._of: dict[bytes, bytes] = {}  # composite peer -> routing id
        self._under: dict[bytes, set[bytes]] = {}  # routing id -> its composite peers

    def __len__(self) -> int:
        return len(self._of)

    def add(self, routing_id: bytes, channel: str) -> bytes | None:
        """The composite peer of `channel` on `routing_id`; None when the table is full."""
        peer = join_peer(routing_id, channel)
        if peer in self._of:
            return peer
        if len(self._of) >= self.limit:
            return None
        self._of[peer] = routing_id
        self._under.setdefault(routing_id, set()).add(peer)
        return peer

    def routing_id(self, peer: bytes) -> bytes:
        """The connection of `peer` (a composite peer seen, else `peer` itself)."""
        return self._of.get(peer, peer)

    def routing_ids(self, peers: Iterable[bytes]) -> Iterator[tuple[bytes, bytes]]:
        """(peer, its connection) for each of `peers`, as `routing_id` says."""
        of = self._of.get
        return ((p, of(p, p)) for p in peers)

    def channel(self, peer: bytes) -> str:
        rid = self._of.get(peer)
        return "" if rid is None else peer[len(rid) + len(CHANNEL_SEP):].decode()

    def drop(self, routing_id: bytes) -> list[bytes]:
        """Forget a connection's channels; returns their composite peers."""
        peers = self._under.pop(routing_id, set())
        for p in peers:
            del self._of[p]
        return sorted(peers)
