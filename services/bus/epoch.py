"""Epoch fencing: a receiver drops any message whose sender epoch is below the highest it
has seen for that sender's role, so a deposed leader (paused, partitioned) cannot act."""

from __future__ import annotations


class EpochFence:
    def __init__(self, fenced_roles: frozenset[int] | None = None) -> None:
        # Roles whose messages are fenced (the elected ones); None fences every role.
        self._fenced = fenced_roles
        self._highest: dict[int, int] = {}

    def observe(self, role: int, epoch: int) -> None:
        """Learn an epoch from elsewhere (e.g. the leader detector) before any message."""
        if epoch > self._highest.get(role, 0):
            self._highest[role] = epoch

    def admit(self, role: int, epoch: int) -> bool:
        """True if a message from `role` at `epoch` may be acted on; raises the bar if newer."""
        if self._fenced is not None and role not in self._fenced:
            return True
        highest = self._highest.get(role, 0)
        if epoch < highest:
            return False
        if epoch > highest:
            self._highest[role] = epoch
        return True

    def highest(self, role: int) -> int:
        return self._highest.get(role, 0)
