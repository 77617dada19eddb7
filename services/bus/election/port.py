"""The election port: who leads each central role ("master", "allocator", "broker"), at
which epoch, and where to reach it. Implementations: zookeeper.py and standalone.py."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable

ROLE_PATTERN = re.compile(r"^[a-z][a-z0-9_-]{0,63}$")


def check_role(role: str) -> str:
    """Roles name ZooKeeper paths and files, so they are kept to a safe alphabet."""
    if not ROLE_PATTERN.match(role):
        raise ValueError(f"invalid role {role!r}: expected {ROLE_PATTERN.pattern}")
    return role


@dataclass(frozen=True)
class LeaderInfo:
    role: str
    member_id: str
    # Strictly increasing across successive leaders of a role, and never 0 (the envelope
    # uses 0 for senders whose role is not elected).
    epoch: int
    endpoints: dict[str, str] = field(hash=False)

    def key(self) -> tuple[str, int]:
        """What identifies one reign: detectors report a change only when this changes."""
        return (self.member_id, self.epoch)


# -- what a contender tells its service (drained by the service's reactor) ---------------


@dataclass(frozen=True)
class Elected:
    """Act as leader now; stamp this epoch on every message sent."""

    epoch: int


@dataclass(frozen=True)
class Suspended:
    """The connection to the coordinator is in doubt: stop acting as leader at once. A
    leader then gets Elected again (same epoch: the session survived) or Lost; a standby
    gets it too and simply goes on standing by."""


@dataclass(frozen=True)
class Lost:
    """The session expired: any leadership is gone for good. The contender re-joins by
    itself and may be Elected again later, always with a new, higher epoch."""


ElectionEvent = Elected | Suspended | Lost


@runtime_checkable
class Contender(Protocol):
    def start(self) -> None:
        """Join the election; never blocks."""

    def fileno(self) -> int:
        """Readable while events are waiting (register it with the reactor)."""

    def events(self) -> list[ElectionEvent]:
        """Every waiting event, oldest first; never blocks."""

    @property
    def leading_epoch(self) -> int | None:
        """The epoch while this contender currently leads, else None."""

    def close(self) -> None:
        """Withdraw; a leader's withdrawal lets a standby lead promptly. Unregister
        fileno() from the reactor first: the descriptor is closed."""


# -- what everyone else sees -------------------------------------------------------------


@dataclass(frozen=True)
class LeaderChanged:
    leader: LeaderInfo | None


@runtime_checkable
class Detector(Protocol):
    def start(self) -> None:
        """Begin watching; never blocks."""

    def fileno(self) -> int:
        """Readable while LeaderChanged events are waiting."""

    def events(self) -> list[LeaderChanged]:
        """Every waiting event, oldest first; never blocks."""

    def leader(self) -> LeaderInfo | None:
        """The current view (None while no leader is known)."""

    def wait_for_leader(self, timeout: float) -> LeaderInfo | None:
        """Block up to `timeout` seconds for a leader to be known (CLIs, tests)."""

    def close(self) -> None:
        """Stop watching and release the descriptor."""
