"""Epoch fencing: a receiver acts on a message from an elected role (master, allocator,
offer-broker) only when its epoch is the epoch of that role's elected leader, as the
receiver's own detector knows it, and its sender is that leader's member. What a sender
claims never moves the bar (a forged huge epoch once fenced the real leader out for good):
only the detector does, through `follow`.

The fence decides; the sockets (services/bus/peer.py) hold a message the detector cannot
vouch for *yet* (no leader known, or an epoch above the known leader's: the detector may
lag a failover by a few milliseconds) briefly, and refuse everything else with the
verdict's error code, counted by its reason."""

from __future__ import annotations

import enum
from collections.abc import Callable

from schemas import bus_pb2
from services.bus import codec
from services.bus.election.port import LeaderInfo


class Verdict(enum.Enum):
    ADMIT = "admit"
    UNKNOWN_LEADER = "unknown_leader"  # the detector names no leader of the role (yet)
    NEWER_EPOCH = "newer_epoch"  # above the known leader's: not vouched for (yet)
    STALE_EPOCH = "stale_epoch"  # below it: a deposed leader
    WRONG_MEMBER = "wrong_member"  # the leader's epoch, from someone else

    @property
    def holdable(self) -> bool:
        """The detector may still vouch for it: worth holding briefly."""
        return self in (Verdict.UNKNOWN_LEADER, Verdict.NEWER_EPOCH)

    @property
    def code(self) -> int:
        """The error code of the refusal (a deposed leader's is STALE_EPOCH; whoever else
        is not the elected leader of its role is told NOT_LEADER)."""
        return bus_pb2.STALE_EPOCH if self is Verdict.STALE_EPOCH else bus_pb2.NOT_LEADER


class EpochFence:
    """For each fenced role (envelope Role values), the leader its detector reports."""

    def __init__(self, fenced_roles: frozenset[int]) -> None:
        self.fenced = fenced_roles
        self._leaders: dict[int, LeaderInfo] = {}
        self._listeners: list[Callable[[], None]] = []

    def follow(self, role: int, leader: LeaderInfo | None) -> None:
        """What the detector of `role` reports (LeaderChanged.leader): the only way the
        admitted epoch changes, up or down."""
        if role not in self.fenced:
            raise ValueError(f"role {role} is not fenced here")
        old = self._leaders.get(role)
        if leader is None:
            self._leaders.pop(role, None)
        else:
            self._leaders[role] = leader
        if (old.key() if old else None) != (leader.key() if leader else None):
            for listener in list(self._listeners):
                listener()

    def leader(self, role: int) -> LeaderInfo | None:
        return self._leaders.get(role)

    def check(self, role: int, epoch: int, sender_id: str = "") -> Verdict:
        """May a message from `role` at `epoch`, sent by `sender_id` (checked when given),
        be acted on? Never changes the fence."""
        if role not in self.fenced:
            return Verdict.ADMIT
        leader = self._leaders.get(role)
        if leader is None:
            return Verdict.UNKNOWN_LEADER
        if epoch > leader.epoch:
            return Verdict.NEWER_EPOCH
        if epoch < leader.epoch:
            return Verdict.STALE_EPOCH
        if sender_id and sender_id != leader.member_id:
            return Verdict.WRONG_MEMBER
        return Verdict.ADMIT

    def explain(self, verdict: Verdict, role: int, epoch: int, sender_id: str) -> str:
        """The refusal's message, for the sender and the log."""
        name = _role_name(role)
        leader = self._leaders.get(role)
        known = (f"the elected {name} is {leader.member_id} at epoch {leader.epoch}"
                 if leader is not None else f"no elected {name} is known here")
        return (f"fenced ({verdict.value}): {name} {sender_id or '?'} at epoch {epoch}; "
                f"{known}")

    def listen(self, listener: Callable[[], None]) -> Callable[[], None]:
        """Call `listener` whenever a followed leader changes; returns the unsubscriber."""
        self._listeners.append(listener)

        def stop() -> None:
            if listener in self._listeners:
                self._listeners.remove(listener)
        return stop


def _role_name(role: int) -> str:
    try:
        return codec.Role.Name(role).removeprefix("ROLE_").lower()  # type: ignore[arg-type]
    except ValueError:
        return f"role {role}"
