"""Heartbeat bookkeeping (ZeroMQ Guide "Paranoid Pirate") and reconnect backoff, as pure
state: the caller passes the time in, so tests fast-forward it."""

from __future__ import annotations

import random
from dataclasses import dataclass, field


@dataclass
class Liveness:
    """One peer: when we last heard from it and when we last sent to it."""

    interval: float
    max_missed: int
    last_heard: float
    last_sent: float

    def heard(self, now: float) -> None:
        self.last_heard = max(self.last_heard, now)

    def sent(self, now: float) -> None:
        self.last_sent = max(self.last_sent, now)

    def beat_due(self, now: float) -> bool:
        """True when nothing went to the peer for a whole interval (any traffic is a beat)."""
        return now - self.last_sent >= self.interval

    def expired(self, now: float) -> bool:
        """True once the peer missed `max_missed` beats."""
        return now - self.last_heard > self.interval * self.max_missed


@dataclass
class PeerTable:
    """Liveness of every peer of a ROUTER socket, keyed by routing id."""

    interval: float
    max_missed: int
    peers: dict[bytes, Liveness] = field(default_factory=dict)

    def heard(self, peer: bytes, now: float) -> bool:
        """Record a message from `peer`; returns True when the peer is new."""
        live = self.peers.get(peer)
        if live is None:
            self.peers[peer] = Liveness(self.interval, self.max_missed, now, float("-inf"))
            return True
        live.heard(now)
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
