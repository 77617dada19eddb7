"""The sentences of the allocator's decisions that `offerbus why` reads back, written once:
decide.py writes them and services/cli/why.py recognises them (a light module: the CLI
imports it without the allocator's policy)."""

from __future__ import annotations

import re
from collections.abc import Iterable

# FAIR_SHARE: the free pool is kept for roles below their quota guarantee.
GUARANTEE_REASON = "the free resources are set aside for the quota guarantee"
# FAIR_SHARE: DRF gave what was free to others (nothing more to say than the shares).
LOWER_SHARES_REASON = "frameworks with a lower weighted share took the free resources"

_FILTERED = re.compile(r"(\d+) agent\(s\) filtered by its declines, e\.g\. (\S+) until "
                       r"t=([\d.]+)")


def filtered_reason(agents: int, agent_id: str, until: float) -> str:
    """FILTERED: its decline filters are in force on `agents` agents; `agent_id`'s until
    `until` (seconds since the epoch)."""
    return f"{agents} agent(s) filtered by its declines, e.g. {agent_id} until t={until:.3f}"


def quota_limit_reason(role: str, limits: Iterable[tuple[str, str]], declared: bool) -> str:
    """QUOTA_LIMIT: `role` is held by these limits ((limited role, limit), its own or its
    ancestors')."""
    held = ", ".join(f"{limited} limit {limit}" for limited, limit in limits)
    return (f"its role {role} is at its quota limit ({held}): what its frameworks hold "
            f"(offered and used) leaves "
            f"{'no room for its next declared task' if declared else 'nothing'}")


_LIMITS = re.compile(r"is at its quota limit \((.*?)\): what its frameworks hold")
_LIMITED_ROLE = re.compile(r"(?:^|, )(\S+) limit ")


def limited_roles(reason: str) -> list[str]:
    """The roles whose limits a `quota_limit_reason` names (an operator raises those)."""
    m = _LIMITS.search(reason)
    return [] if m is None else _LIMITED_ROLE.findall(m.group(1))


_HOLDING = re.compile(r"; it holds (\d+) offer\(s\) not answered yet, e\.g\. on (\S+)$")


def holding_note(offers: int, agent_id: str) -> str:
    """Added to a decision's reason: the framework holds offers it has not answered (their
    resources are offered to nobody else until it answers or the broker's timeout ends
    them). What `offerbus why` says when one of its agents seems missing."""
    return f"; it holds {offers} offer(s) not answered yet, e.g. on {agent_id}"


def parse_holding(reason: str) -> tuple[int, str] | None:
    """(offers, an agent) from a `holding_note` ending `reason`, or None."""
    m = _HOLDING.search(reason)
    return None if m is None else (int(m.group(1)), m.group(2))


def parse_filtered(reason: str) -> tuple[str, float] | None:
    """(the first agent, until when) from a `filtered_reason`, or None."""
    m = _FILTERED.search(reason)
    return None if m is None else (m.group(2), float(m.group(3)))
