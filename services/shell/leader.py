"""The leader lifecycle of a central service (master, allocator, offer-broker): join the
election with the endpoints already bound; lead on Elected; on Suspended stop acting at once
but keep the reign's state; resume that same reign when Elected again at its epoch (the
session survived, so nobody else can have led meanwhile); end it on Lost or another epoch
(the next reign rebuilds its soft state). No epoch is ever led twice.

The rule is one table (`TRANSITIONS`) in a pure core; the shell runs its actions as the
service's callbacks, and holds (bounded) the calls that arrive while a reign is paused, to
run them in order when it resumes."""

from __future__ import annotations

import enum
from collections.abc import Callable
from dataclasses import dataclass

from services.bus.election import (
    Contender,
    Elected,
    ElectionEvent,
    Lost,
    Suspended,
    contender_from_url,
)
from services.bus.log import get_logger
from services.bus.reactor import Reactor
from services.bus.stats import Stats

log = get_logger("shell.leader")

MAX_HELD = 10_000  # calls held while paused; beyond it they are refused (NOT_LEADER)


class Phase(enum.Enum):
    STANDBY = "standby"
    LEADING = "leading"
    PAUSED = "paused"  # a reign whose coordinator connection is in doubt: it does nothing


# -- actions: what the service is told to do -------------------------------------------


@dataclass(frozen=True)
class Lead:
    """Lead afresh at `epoch`: a new reign, its soft state rebuilt."""

    epoch: int


@dataclass(frozen=True)
class Pause:
    """Stop acting at once (send nothing, answer nothing as leader) but keep the state."""

    epoch: int
    reason: str


@dataclass(frozen=True)
class Resume:
    """The paused reign at `epoch` goes on, with the state it kept."""

    epoch: int


@dataclass(frozen=True)
class StepDown:
    """The reign at `epoch` is over: drop its state."""

    epoch: int
    reason: str


@dataclass(frozen=True)
class Rejoin:
    """Withdraw from the election and stand again (for a new epoch)."""

    reason: str


Action = Lead | Pause | Resume | StepDown | Rejoin


class Event(enum.Enum):
    ELECTED_NEW = "elected at an epoch above any led"
    ELECTED_SAME = "elected at the current reign's epoch"
    ELECTED_STALE = "elected at an epoch already led (or below)"
    SUSPENDED = "coordinator connection suspended"
    LOST = "leadership lost (session expired)"
    ABDICATE = "abdicated"


_LEAD, _PAUSE, _RESUME, _STEP_DOWN, _REJOIN = "lead", "pause", "resume", "step_down", "rejoin"
S, L, P = Phase.STANDBY, Phase.LEADING, Phase.PAUSED

# (phase, event) -> (next phase, actions in order). A pair missing here is illegal.
TRANSITIONS: dict[tuple[Phase, Event], tuple[Phase, tuple[str, ...]]] = {
    (S, Event.ELECTED_NEW): (L, (_LEAD,)),
    (S, Event.ELECTED_STALE): (S, (_REJOIN,)),  # a broken contender: ask a new epoch
    (S, Event.SUSPENDED): (S, ()),
    (S, Event.LOST): (S, ()),
    (S, Event.ABDICATE): (S, ()),
    (L, Event.ELECTED_SAME): (L, ()),
    (L, Event.ELECTED_NEW): (L, (_STEP_DOWN, _LEAD)),
    (L, Event.ELECTED_STALE): (S, (_STEP_DOWN, _REJOIN)),
    (L, Event.SUSPENDED): (P, (_PAUSE,)),
    (L, Event.LOST): (S, (_STEP_DOWN,)),
    (L, Event.ABDICATE): (S, (_STEP_DOWN, _REJOIN)),
    (P, Event.ELECTED_SAME): (L, (_RESUME,)),  # the session survived: nobody else led
    (P, Event.ELECTED_NEW): (L, (_STEP_DOWN, _LEAD)),
    (P, Event.ELECTED_STALE): (S, (_STEP_DOWN, _REJOIN)),
    (P, Event.SUSPENDED): (P, ()),
    (P, Event.LOST): (S, (_STEP_DOWN,)),
    (P, Event.ABDICATE): (S, (_STEP_DOWN, _REJOIN)),
}


class LeadershipCore:
    """The pure rule: election events in, actions out."""

    def __init__(self) -> None:
        self.phase = Phase.STANDBY
        self.epoch: int | None = None  # the current reign's (LEADING or PAUSED)
        self.last_led = 0  # the highest epoch ever led: never led again

    def on(self, event: ElectionEvent) -> list[Action]:
        if isinstance(event, Elected):
            if self.epoch is not None and event.epoch == self.epoch:
                kind = Event.ELECTED_SAME
            elif event.epoch > self.last_led:
                kind = Event.ELECTED_NEW
            else:
                kind = Event.ELECTED_STALE
            return self._step(kind, event.epoch)
        if isinstance(event, Suspended):
            return self._step(Event.SUSPENDED, None)
        if isinstance(event, Lost):
            return self._step(Event.LOST, None)
        raise TypeError(f"not an election event: {event!r}")

    def abdicate(self, reason: str) -> list[Action]:
        """The service found it must not lead (e.g. its registry writes are fenced)."""
        return self._step(Event.ABDICATE, None, reason)

    def _step(self, event: Event, elected: int | None, reason: str = "") -> list[Action]:
        try:
            phase, names = TRANSITIONS[(self.phase, event)]
        except KeyError:
            raise ValueError(f"illegal leadership transition: {event.name} while "
                             f"{self.phase.value}") from None
        why = reason or (f"{event.value}: {elected}" if elected is not None else event.value)
        out: list[Action] = []
        for name in names:
            if name == _LEAD:
                assert elected is not None
                self.epoch = self.last_led = elected
                out.append(Lead(elected))
            elif name == _PAUSE:
                assert self.epoch is not None
                out.append(Pause(self.epoch, why))
            elif name == _RESUME:
                assert self.epoch is not None
                out.append(Resume(self.epoch))
            elif name == _STEP_DOWN:
                assert self.epoch is not None
                out.append(StepDown(self.epoch, why))
                self.epoch = None
            else:
                out.append(Rejoin(why))
        self.phase = phase
        if phase is Phase.STANDBY:
            self.epoch = None
        return out

    def validate(self) -> None:
        assert (self.epoch is None) == (self.phase is Phase.STANDBY)
        assert self.epoch is None or 0 < self.epoch <= self.last_led


class LeaderLifecycle:
    """Runs the LeadershipCore's actions as the service's callbacks, on the reactor thread:
    `lead(epoch)`, `pause(reason)`, `resume(epoch)`, `step_down(reason)`."""

    def __init__(
        self, reactor: Reactor, url: str, role: str, member_id: str, endpoints: dict[str, str],
        *, lead: Callable[[int], None], pause: Callable[[str], None],
        resume: Callable[[int], None], step_down: Callable[[str], None],
        stats: Stats | None = None, max_held: int = MAX_HELD,
    ) -> None:
        self.reactor = reactor
        self.url, self.role, self.member_id = url, role, member_id
        self.endpoints = endpoints  # the service's dict: read again on a re-join
        self._lead, self._pause, self._resume, self._step_down = lead, pause, resume, step_down
        self.stats = stats or Stats()
        self.max_held = max_held
        self.core = LeadershipCore()
        self._held: list[Callable[[], None]] = []
        self.contender: Contender = self._join()
        log.info("joined election", role=role, member=member_id, url=url)

    # -- the service's view --------------------------------------------------------------
    @property
    def leading(self) -> bool:
        """Acting as the leader now (not while paused)."""
        return self.core.phase is Phase.LEADING

    @property
    def paused(self) -> bool:
        return self.core.phase is Phase.PAUSED

    @property
    def epoch(self) -> int | None:
        """The current reign's epoch, leading or paused."""
        return self.core.epoch

    def hold(self, call: Callable[[], None]) -> bool:
        """While paused: keep `call` to run, in arrival order, when the reign resumes (it is
        dropped if the reign ends instead). False when not paused or the hold is full: the
        caller then refuses the request (NOT_LEADER) itself."""
        if not self.paused:
            return False
        if len(self._held) >= self.max_held:
            self.stats.inc("held_calls{outcome=refused}")
            return False
        self._held.append(call)
        self.stats.inc("held_calls{outcome=held}")
        return True

    def abdicate(self, reason: str) -> None:
        """Step down and stand again for a new epoch (this reign must not go on)."""
        self._run(self.core.abdicate(reason))

    # -- events --------------------------------------------------------------------------
    def _join(self) -> Contender:
        contender = contender_from_url(self.url, self.role, self.member_id, self.endpoints)
        self.reactor.add_reader(contender, self._on_events)
        contender.start()
        return contender

    def _on_events(self) -> None:
        contender = self.contender
        for event in contender.events():
            if contender is not self.contender:
                return  # re-joined meanwhile: the old contender's events mean nothing
            self._run(self.core.on(event))

    def _run(self, actions: list[Action]) -> None:
        for action in actions:
            if isinstance(action, Lead):
                log.info("leading", role=self.role, member=self.member_id, epoch=action.epoch)
                self._lead(action.epoch)
            elif isinstance(action, Pause):
                self.stats.inc("leader_pauses")
                log.warning("pausing: acting on nothing until the coordinator answers",
                            role=self.role, member=self.member_id, epoch=action.epoch,
                            reason=action.reason)
                self._pause(action.reason)
            elif isinstance(action, Resume):
                self.stats.inc("leader_resumes")
                log.info("resuming the same reign", role=self.role, member=self.member_id,
                         epoch=action.epoch, held=len(self._held))
                self._resume(action.epoch)
                self._replay()
            elif isinstance(action, StepDown):
                if self._held:
                    self.stats.inc("held_calls{outcome=dropped}", len(self._held))
                    self._held.clear()
                log.warning("stepping down", role=self.role, member=self.member_id,
                            epoch=action.epoch, reason=action.reason)
                self._step_down(action.reason)
            else:
                log.warning("re-joining the election", role=self.role, member=self.member_id,
                            reason=action.reason)
                self._close_contender()
                self.contender = self._join()

    def _replay(self) -> None:
        held, self._held = self._held, []
        for i, call in enumerate(held):
            if not self.leading:  # paused or deposed again by a call: keep or drop the rest
                rest = held[i:]
                if self.paused:
                    self._held = rest + self._held
                else:
                    self.stats.inc("held_calls{outcome=dropped}", len(rest))
                return
            try:
                call()
                self.stats.inc("held_calls{outcome=replayed}")
            except Exception as exc:  # one bad call never stops the others (or the reactor)
                self.stats.inc("held_calls{outcome=failed}")
                log.error("held call failed", role=self.role, error=repr(exc), exc_info=True)

    def _close_contender(self) -> None:
        self.reactor.remove_reader(self.contender)
        self.contender.close()

    def close(self) -> None:
        self._held.clear()
        self._close_contender()
