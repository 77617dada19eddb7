"""The core driver: commands by type, Notices to log/counter/span, one timer re-armed from
the core's next deadline (a real reactor and a clock the test moves)."""

from __future__ import annotations

from dataclasses import dataclass

from services.bus.log import get_logger
from services.bus.reactor import Reactor
from services.notice import Notice
from services.shell.driver import CoreDriver
from services.shell.metrics import Metrics


@dataclass
class Say:
    text: str


class Loud(Say):
    pass


class Core:
    """Due at the times in `deadlines`; each tick pops those due and says so."""

    def __init__(self, deadlines: list[float]) -> None:
        self.deadlines = sorted(deadlines)

    def tick(self, now: float) -> list[object]:
        due = [d for d in self.deadlines if d <= now]
        self.deadlines = [d for d in self.deadlines if d > now]
        return [Say(f"due {d}") for d in due] + [Notice.of("ticked", "a tick", n=len(due))]

    def next_deadline(self) -> float | None:
        return self.deadlines[0] if self.deadlines else None


def make() -> tuple[CoreDriver, list[object], list[float], Metrics]:
    clock = [100.0]
    reactor = Reactor(clock=lambda: clock[0])
    metrics = Metrics("test")
    driver = CoreDriver(reactor, metrics, get_logger("test"), clock=lambda: clock[0])
    seen: list[object] = []
    driver.on(Say, seen.append)
    return driver, seen, clock, metrics


def test_commands_go_to_the_handler_of_their_type_or_a_base() -> None:
    driver, seen, _, _ = make()
    driver.dispatch([Say("a"), Loud("b")])
    assert seen == [Say("a"), Loud("b")]
    driver.dispatch([3])  # no handler: a bug, logged and counted, never raised
    assert "offerbus_test_command_errors_total 1.0" in driver.metrics.exposition().decode()


def test_notices_are_counted_by_kind_and_level() -> None:
    driver, _, _, metrics = make()
    driver.dispatch([Notice.of("decline_ignored", "x", "warning"),
                     Notice.of("decline_ignored", "y", "warning")])
    text = metrics.exposition().decode()
    assert 'offerbus_test_notices_total{kind="decline_ignored",level="warning"} 2.0' in text


def test_one_timer_follows_the_core_deadline() -> None:
    driver, seen, clock, _ = make()
    core = Core([105.0, 103.0])
    driver.attach(core)
    reactor = driver.reactor
    reactor.run_once(0)
    assert seen == []  # nothing due yet
    clock[0] = 103.5
    reactor.run_once(0)
    assert seen == [Say("due 103.0")]
    # A step that moves the deadline earlier re-arms the timer at once.
    core.deadlines.insert(0, 104.0)
    driver.step(lambda now: [])
    clock[0] = 104.0
    reactor.run_once(0)
    assert seen[-1] == Say("due 104.0")
    clock[0] = 200.0
    reactor.run_once(0)
    assert seen[-1] == Say("due 105.0") and core.next_deadline() is None
    driver.detach()
    core.deadlines = [201.0]
    clock[0] = 300.0
    reactor.run_once(0)
    assert seen[-1] == Say("due 105.0")  # detached: no timer fires


def test_a_failing_handler_does_not_drop_the_steps_other_commands() -> None:
    """The core has already changed its state: every later command of the step (a publish,
    a registry write) must still be carried out."""
    driver, seen, _, metrics = make()

    def boom(cmd: object) -> None:
        raise RuntimeError("a bug in one handler")

    driver.on(Loud, boom)
    driver.dispatch([Say("before"), Loud("x"), Say("after")])
    assert seen == [Say("before"), Say("after")]
    assert "offerbus_test_command_errors_total 1.0" in metrics.exposition().decode()


def test_a_step_stops_dispatching_once_the_core_is_detached() -> None:
    """A handler that steps the service down (a fenced registry write) ends the step: a
    deposed leader sends nothing more."""
    driver, seen, _, _ = make()
    core = Core([])
    driver.attach(core)
    driver.on(Loud, lambda c: driver.detach())
    driver.step(lambda now: [Say("a"), Loud("step down"), Say("not sent")])
    assert seen == [Say("a")]


def test_context_set_for_a_step_is_cleared_after_it() -> None:
    """What a shell sets for one step (its traceparent) must not leak into the next, e.g.
    the timer's tick."""
    driver, _, _, _ = make()
    driver.step(lambda now: [], context="00-aa-bb-01")
    assert driver.context == ""
    inside: list[str] = []
    driver.on(Loud, lambda c: inside.append(driver.context))
    driver.step(lambda now: [Loud("x")], context="00-cc-dd-01")
    assert inside == ["00-cc-dd-01"] and driver.context == ""
