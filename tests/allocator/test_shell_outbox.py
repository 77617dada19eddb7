"""The allocator shell's batching, without sockets: the first event after a quiet spell is
allocated at the reactor's next turn, and later events within the batch window share one
cycle at its end, and a cycle's allocations reach the broker in messages that fit the frame
limit and hold at most 1,000 allocations each (none lost)."""

from __future__ import annotations

import math
from collections.abc import Callable
from types import SimpleNamespace
from typing import Any

from schemas import internal_pb2
from services.allocator.core import AllocatorCore
from services.allocator.shell import ALLOCATIONS_PER_MESSAGE, AllocatorShell
from services.bus import codec
from services.bus.stats import Stats
from services.resources import Resources

AGENT = Resources.parse("cpus:24;mem:65536;disk:409600;ports:[31000-32000]")


class FakeDealer:
    """Sends as DealerClient does: a frame over the limit is refused (False), not sent."""

    connected = True

    def __init__(self) -> None:
        self.sent: list[codec.Envelope] = []
        self.refused = 0

    def send(self, env: codec.Envelope) -> bool:
        try:
            codec.encode(env, codec.DEFAULT_FRAME_LIMIT)
        except codec.FrameTooLarge:
            self.refused += 1
            return False
        self.sent.append(env)
        return True

    def of(self, kind: str) -> list[Any]:
        return [getattr(e.internal, kind) for e in self.sent
                if e.internal.WhichOneof("kind") == kind]


class FakeReactor:
    def __init__(self) -> None:
        self.timers: list[tuple[float, Callable[[], None], SimpleNamespace]] = []
        self.now = 100.0

    def clock(self) -> float:
        return self.now

    def call_later(self, delay: float, fn: Callable[[], None]) -> SimpleNamespace:
        timer = SimpleNamespace(cancelled=False)
        timer.cancel = lambda: setattr(timer, "cancelled", True)
        self.timers.append((delay, fn, timer))
        return timer

    def fire(self) -> int:
        due, self.timers = self.timers, []
        n = 0
        for _, fn, timer in due:
            if not timer.cancelled:
                fn()
                n += 1
        return n


def shell_with(core: AllocatorCore) -> tuple[AllocatorShell, FakeDealer, FakeReactor]:
    """An AllocatorShell leading with `core`, its broker link and reactor faked."""
    shell = AllocatorShell.__new__(AllocatorShell)
    dealer, reactor = FakeDealer(), FakeReactor()
    shell.__dict__.update(
        core=core, dealer=dealer, reactor=reactor, subscriber=SimpleNamespace(synced=True),
        leader=None, config=SimpleNamespace(interval=1.0, batch=0.05), stats=Stats(),
        decisions={}, _told={}, _batch=None, _refilter=None, _sweep=None,
        last_cycle=(0, 0.0), _cycled_at=-math.inf,
        _cycle_seconds=SimpleNamespace(observe=lambda s: None))
    return shell, dealer, reactor


def cluster(agents: int, frameworks: int) -> AllocatorCore:
    core = AllocatorCore(id_prefix="a1-", max_offers_per_framework=0)  # every agent at once
    for i in range(agents):
        core.agent_added(f"agent-{i:05}", f"host-{i:05}", AGENT)
    for j in range(frameworks):
        core.framework_added(f"fw-{j}", "*")
    return core


def test_events_within_the_batch_window_share_one_cycle_and_one_message() -> None:
    core = cluster(50, 3)
    shell, dealer, reactor = shell_with(core)
    for _ in range(20):
        shell._schedule()
    assert len(reactor.timers) == 1
    assert reactor.fire() == 1
    [allocations] = dealer.of("allocations")
    assert len(allocations.allocations) == 50
    assert core.cycle == 1
    [decisions] = dealer.of("allocator_decisions")
    assert {d.framework_id for d in decisions.decisions} == {"fw-0", "fw-1", "fw-2"}


def test_the_first_event_after_a_quiet_spell_is_not_kept_waiting_for_the_window() -> None:
    """A framework subscribing to a quiet cluster waited the whole batch window (50 ms)
    for its first offer. The window bounds how often events make cycles; it need not delay
    the first: it is allocated at the reactor's next turn, after what it has read."""
    core = cluster(2, 1)
    shell, _, reactor = shell_with(core)
    shell._schedule()
    shell._schedule()
    assert [delay for delay, _, _ in reactor.timers] == [0.0]
    assert reactor.fire() == 1 and core.cycle == 1
    # Within the window after that cycle, events wait for the window's end, together.
    reactor.now += 0.02
    core.framework_added("fw-late", "*")
    shell._schedule()
    shell._schedule()
    [(delay, _, _)] = reactor.timers
    assert math.isclose(delay, 0.03)
    assert reactor.fire() == 1 and core.cycle == 2
    # After a quiet spell as long as the window: at once again.
    reactor.now += 0.05
    shell._schedule()
    assert [delay for delay, _, _ in reactor.timers] == [0.0]


def test_a_cycle_too_large_for_one_frame_reaches_the_broker_in_several() -> None:
    """~145 bytes an allocation: 40,000 of them are over the 4 MiB frame limit. They were
    sent as one message, which the dealer refused: every one of them was lost while the
    core counted its resources as offered."""
    core = cluster(40_000, 2)
    shell, dealer, _ = shell_with(core)
    shell._allocate()
    assert dealer.refused == 0
    sent = [a for msg in dealer.of("allocations") for a in msg.allocations]
    assert len(sent) == 40_000
    assert {a.agent_id for a in sent} == set(core.agents)
    # Batched, in pieces the broker can start on: at most ALLOCATIONS_PER_MESSAGE each.
    sizes = [len(m.allocations) for m in dealer.of("allocations")]
    assert max(sizes) <= ALLOCATIONS_PER_MESSAGE
    assert len(sizes) == math.ceil(40_000 / ALLOCATIONS_PER_MESSAGE)
    assert all(isinstance(m, internal_pb2.InternalMessage.Allocations)
               for m in dealer.of("allocations"))


def test_only_changed_decisions_are_told_again() -> None:
    core = cluster(4, 2)
    shell, dealer, _ = shell_with(core)
    shell._allocate()
    assert len(dealer.of("allocator_decisions")) == 1
    shell._allocate()  # nothing changed: no cycle work, nothing to tell
    assert len(dealer.of("allocator_decisions")) == 1
    assert set(shell.decisions) == {"fw-0", "fw-1"}


def test_a_new_broker_link_is_told_every_standing_decision_again() -> None:
    """Decisions are told when re-made; after the link to the broker (and so the master)
    is new, the standing ones are told again, though a steady cycle re-makes none."""
    core = cluster(4, 2)
    shell, dealer, reactor = shell_with(core)
    shell._allocate()
    assert len(dealer.of("allocator_decisions")) == 1
    shell._on_broker_connected()  # a hello, then a cycle within the batch window
    assert reactor.fire() == 1
    told = dealer.of("allocator_decisions")
    assert len(told) == 2
    assert {d.framework_id for d in told[1].decisions} == {"fw-0", "fw-1"}


def agent_entry(i: int) -> Any:
    from schemas import bus_pb2, state_pb2

    rec = state_pb2.AgentRecord(status=state_pb2.AgentRecord.AGENT_STATUS_REGISTERED)
    rec.agent_info.agent_id = rec.agent_info.hostname = f"agent-{i}"
    rec.agent_info.resources.extend(AGENT.to_proto())
    return bus_pb2.StateEntry(key=f"agents/agent-{i}", value=state_pb2.StateValue(agent=rec))


def test_many_stream_deltas_in_one_window_make_one_cycle() -> None:
    from services.allocator.feed import StreamFeed
    from services.bus.stream_core import Changed

    core = cluster(0, 2)
    shell, dealer, reactor = shell_with(core)
    shell.feed = StreamFeed(core)
    for i in range(30):  # thirty deltas, one agent each, before the reactor's next turn
        shell._on_state(Changed([agent_entry(i)]))
    assert len(core.agents) == 30 and core.cycle == 0
    assert reactor.fire() == 1 and core.cycle == 1
    [allocations] = dealer.of("allocations")
    assert len(allocations.allocations) == 30
