"""Counters every bus socket keeps (frames in/out, drops by reason, peers lost), as
`name` or `name{label=value}` keys; the service kit exports them as typed Prometheus
counters (services/shell/metrics.py). Plain ints: single-threaded reactor, no locks."""

from __future__ import annotations

from collections import Counter


class Stats:
    def __init__(self) -> None:
        self._counts: Counter[str] = Counter()

    def inc(self, name: str, n: int = 1) -> None:
        self._counts[name] += n

    def get(self, name: str) -> int:
        return self._counts[name]

    def snapshot(self) -> dict[str, int]:
        return dict(self._counts)
