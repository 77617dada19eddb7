"""The leader lifecycle (issue 10, defect 4): Suspended pauses a reign and keeps its state,
Elected again at the same epoch resumes it (the session survived: nobody else led), Lost
or another epoch ends it, and no epoch is ever led twice. The pure transition table, then
the shell on a real reactor with a fake contender."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from services.bus.election import Elected, ElectionEvent, Lost, Suspended
from services.bus.mailbox import Mailbox
from services.bus.reactor import Reactor
from services.bus.stats import Stats
from services.shell import leader as leader_module
from services.shell.leader import (
    Lead,
    LeaderLifecycle,
    LeadershipCore,
    Pause,
    Phase,
    Rejoin,
    Resume,
    StepDown,
)


class FakeContender:
    """A contender whose events the test pushes (the port's contract, no ZooKeeper)."""

    def __init__(self) -> None:
        self.box: Mailbox[ElectionEvent] = Mailbox()
        self.started = self.closed = False

    def push(self, *events: ElectionEvent) -> None:
        for e in events:
            self.box.put(e)

    def start(self) -> None:
        self.started = True

    def fileno(self) -> int:
        return self.box.fileno()

    def events(self) -> list[ElectionEvent]:
        return self.box.drain()

    @property
    def leading_epoch(self) -> int | None:
        return None

    def close(self) -> None:
        self.closed = True
        self.box.close()


class Service:
    """Records the lifecycle's callbacks in order."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, Any]] = []

    def lead(self, epoch: int) -> None:
        self.calls.append(("lead", epoch))

    def pause(self, reason: str) -> None:
        self.calls.append(("pause", reason))

    def resume(self, epoch: int) -> None:
        self.calls.append(("resume", epoch))

    def step_down(self, reason: str) -> None:
        self.calls.append(("step_down", reason))


@pytest.fixture
def rig(monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[Reactor, list[FakeContender],
                                                            Service, LeaderLifecycle]]:
    contenders: list[FakeContender] = []

    def make(url: str, role: str, member_id: str, endpoints: dict[str, str]) -> FakeContender:
        contenders.append(FakeContender())
        return contenders[-1]

    monkeypatch.setattr(leader_module, "contender_from_url", make)
    reactor = Reactor()
    svc = Service()
    life = LeaderLifecycle(reactor, "zk://127.0.0.1:1/x", "master", "m1", {},
                           lead=svc.lead, pause=svc.pause, resume=svc.resume,
                           step_down=svc.step_down, stats=Stats(), max_held=3)
    yield reactor, contenders, svc, life
    life.close()


def pump(reactor: Reactor) -> None:
    for _ in range(5):
        reactor.run_once(0.01)


def names(svc: Service) -> list[str]:
    return [c[0] for c in svc.calls]


def test_a_blip_pauses_then_resumes_the_same_reign(rig: Any) -> None:
    reactor, contenders, svc, life = rig
    contenders[-1].push(Elected(5))
    pump(reactor)
    assert svc.calls == [("lead", 5)] and life.leading and life.epoch == 5
    contenders[-1].push(Suspended())
    pump(reactor)
    assert names(svc) == ["lead", "pause"]
    assert life.paused and not life.leading and life.epoch == 5
    # Requests arriving meanwhile are held, and run in order once the reign resumes.
    ran: list[int] = []
    assert life.hold(lambda: ran.append(1)) and life.hold(lambda: ran.append(2))
    contenders[-1].push(Elected(5))
    pump(reactor)
    assert svc.calls[2:] == [("resume", 5)], "the same epoch must resume, not lead afresh"
    assert ran == [1, 2] and life.leading and not life.paused
    assert life.stats.get("held_calls{outcome=replayed}") == 2


def test_lost_ends_a_paused_reign_and_drops_what_was_held(rig: Any) -> None:
    reactor, contenders, svc, life = rig
    contenders[-1].push(Elected(5), Suspended())
    pump(reactor)
    ran: list[int] = []
    life.hold(lambda: ran.append(1))
    contenders[-1].push(Lost())
    pump(reactor)
    assert names(svc) == ["lead", "pause", "step_down"]
    assert not life.leading and not life.paused and life.epoch is None
    contenders[-1].push(Elected(9))  # re-joined after the expiry: a new, higher epoch
    pump(reactor)
    assert svc.calls[-1] == ("lead", 9)
    assert ran == [] and life.stats.get("held_calls{outcome=dropped}") == 1


def test_elected_at_another_epoch_while_paused_leads_afresh(rig: Any) -> None:
    reactor, contenders, svc, life = rig
    contenders[-1].push(Elected(5), Suspended(), Elected(7))
    pump(reactor)
    assert names(svc) == ["lead", "pause", "step_down", "lead"]
    assert svc.calls[-1] == ("lead", 7) and life.epoch == 7


def test_the_hold_is_bounded(rig: Any) -> None:
    reactor, contenders, _svc, life = rig
    assert not life.hold(lambda: None), "only a paused reign holds"
    contenders[-1].push(Elected(5), Suspended())
    pump(reactor)
    assert all(life.hold(lambda: None) for _ in range(3))
    assert not life.hold(lambda: None)  # full: the caller refuses (NOT_LEADER)
    assert life.stats.get("held_calls{outcome=refused}") == 1


def test_a_held_call_that_raises_does_not_stop_the_others(rig: Any) -> None:
    reactor, contenders, _svc, life = rig
    contenders[-1].push(Elected(5), Suspended())
    pump(reactor)
    ran: list[int] = []
    life.hold(lambda: 1 / 0)  # type: ignore[func-returns-value]
    life.hold(lambda: ran.append(2))
    contenders[-1].push(Elected(5))
    pump(reactor)
    assert ran == [2] and life.stats.get("held_calls{outcome=failed}") == 1


def test_abdicating_rejoins_so_the_next_reign_has_a_new_epoch(rig: Any) -> None:
    reactor, contenders, svc, life = rig
    contenders[-1].push(Elected(5))
    pump(reactor)
    life.abdicate("registry fenced")
    assert names(svc) == ["lead", "step_down"] and not life.leading
    assert len(contenders) == 2 and contenders[0].closed and contenders[1].started
    contenders[1].push(Elected(6))
    pump(reactor)
    assert svc.calls[-1] == ("lead", 6)


def test_an_epoch_already_led_is_never_led_again(rig: Any) -> None:
    reactor, contenders, svc, _life = rig
    contenders[-1].push(Elected(5), Lost(), Elected(5))  # a broken contender
    pump(reactor)
    assert names(svc) == ["lead", "step_down"], "never two reigns at one epoch"
    assert len(contenders) == 2, "it re-joins to get a new epoch"


# -- the pure table -------------------------------------------------------------------

EVENTS = st.one_of(st.builds(Elected, st.integers(min_value=1, max_value=6)),
                   st.just(Suspended()), st.just(Lost()), st.just("abdicate"))


@given(st.lists(EVENTS, max_size=40))
def test_reigns_are_well_bracketed_and_never_share_an_epoch(events: list[Any]) -> None:
    core = LeadershipCore()
    led: list[int] = []
    reign: int | None = None  # the epoch of the open reign
    paused = False
    for event in events:
        actions = core.abdicate("test") if event == "abdicate" else core.on(event)
        for a in actions:
            if isinstance(a, Lead):
                assert reign is None and a.epoch not in led and (not led or a.epoch > led[-1])
                led.append(a.epoch)
                reign, paused = a.epoch, False
            elif isinstance(a, Pause):
                assert reign is not None and not paused
                paused = True
            elif isinstance(a, Resume):
                assert paused and a.epoch == reign and event == Elected(reign)
                paused = False
            elif isinstance(a, StepDown):
                assert reign is not None
                reign, paused = None, False
            else:
                assert isinstance(a, Rejoin)
        core.validate()
        assert core.epoch == reign
        assert core.phase is (Phase.STANDBY if reign is None else
                               Phase.PAUSED if paused else Phase.LEADING)
