"""The leader lifecycle of a central service (master, allocator, offer-broker): join the
election with the endpoints already bound, lead on Elected, stop acting at once on
Suspended or Lost, and lead afresh (rebuilding soft state) when elected again."""

from __future__ import annotations

from collections.abc import Callable

from services.bus.election import Contender, Elected, Lost, Suspended, contender_from_url
from services.bus.log import get_logger
from services.bus.reactor import Reactor

log = get_logger("shell.leader")


class LeaderLifecycle:
    def __init__(
        self, reactor: Reactor, url: str, role: str, member_id: str, endpoints: dict[str, str],
        *, lead: Callable[[int], None], step_down: Callable[[str], None],
    ) -> None:
        self.reactor = reactor
        self.role = role
        self.member_id = member_id
        self._lead = lead
        self._step_down = step_down
        self.epoch: int | None = None  # while leading
        self.contender: Contender = contender_from_url(url, role, member_id, endpoints)
        reactor.add_reader(self.contender, self._on_events)
        self.contender.start()
        log.info("joined election", role=role, member=member_id, url=url)

    @property
    def leading(self) -> bool:
        return self.epoch is not None

    def _on_events(self) -> None:
        for event in self.contender.events():
            if isinstance(event, Elected):
                if self.epoch == event.epoch:
                    continue
                if self.epoch is not None:
                    self._stop(f"re-elected at epoch {event.epoch}")
                self.epoch = event.epoch
                log.info("leading", role=self.role, member=self.member_id, epoch=event.epoch)
                self._lead(event.epoch)
            elif isinstance(event, Suspended | Lost) and self.epoch is not None:
                self._stop("coordinator connection suspended" if isinstance(event, Suspended)
                           else "leadership lost (session expired)")

    def _stop(self, reason: str) -> None:
        log.warning("stepping down", role=self.role, member=self.member_id, epoch=self.epoch,
                    reason=reason)
        self.epoch = None
        self._step_down(reason)

    def close(self) -> None:
        self.reactor.remove_reader(self.contender)
        self.contender.close()
