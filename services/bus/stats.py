"""Counters every bus socket keeps (frames in/out, drops by reason, peers lost), exported
later as Prometheus text by each service. Plain ints: single-threaded reactor, no locks."""

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

    def prometheus(self, prefix: str = "offerbus_bus_") -> str:
        """Prometheus text exposition; `name{label=value}` keys keep their labels."""
        lines = []
        for key in sorted(self._counts):
            name, _, labels = key.partition("{")
            metric = prefix + name + "_total"
            if labels:
                pairs = (p.partition("=") for p in labels.rstrip("}").split(","))
                quoted = ",".join(f'{k}="{v}"' for k, _, v in pairs)
                metric += "{" + quoted + "}"
            lines.append(f"{metric} {self._counts[key]}")
        return "\n".join(lines) + ("\n" if lines else "")
