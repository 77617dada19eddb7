"""A decline's filter duration, one fact for the offer-broker (which reads it from a
framework's Filters) and the allocator (which installs the filter): its default, its cap,
and what a missing or invalid one means (DESIGN §4, as Mesos)."""

from __future__ import annotations

import math

DEFAULT_REFUSE_SECONDS = 5.0  # a decline without filters
MAX_REFUSE_SECONDS = 365 * 24 * 3600.0  # an absurd filter is capped at a year, as Mesos does


def refuse_seconds_of(seconds: float | None) -> float:
    """A decline's filter duration: a missing (None) or invalid (NaN, negative) one is the
    default; 0 is none; the rest is capped."""
    if seconds is None or math.isnan(seconds) or seconds < 0:
        return DEFAULT_REFUSE_SECONDS
    return min(seconds, MAX_REFUSE_SECONDS)
