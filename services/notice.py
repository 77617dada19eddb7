"""The one kind of output a pure core gives about what it decided or found odd (a decline
for an offer that is gone, a launch counted refused, a stale registration): the service
kit sends every Notice to the log, to a counter (`<service>_notices_total{kind}`) and to
the current span alike, so no shell reconstructs what happened from command lists."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

Level = Literal["info", "warning", "error"]
Fact = str | int | float | bool


@dataclass(frozen=True)
class Notice:
    kind: str  # a short, stable label: "decline_ignored", "launch_unanswered", ...
    message: str  # one sentence for a person
    level: Level = "info"
    facts: tuple[tuple[str, Fact], ...] = field(default=())

    @classmethod
    def of(cls, kind: str, message: str, level: Level = "info", **facts: Fact) -> Notice:
        return cls(kind, message, level, tuple(sorted(facts.items())))

    def fields(self) -> dict[str, Fact]:
        return dict(self.facts)
