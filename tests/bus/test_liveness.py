"""Heartbeat liveness and reconnect backoff: pure, with time passed in (fencing: test_fence.py)."""

from __future__ import annotations

import random

import pytest
from hypothesis import given
from hypothesis import strategies as st

from services.bus.liveness import MAX_PEER_INTERVAL_S, Backoff, Liveness, PeerTable


def test_peer_is_gone_only_after_max_missed_intervals() -> None:
    live = Liveness(interval=1.0, max_missed=5, last_heard=0.0, last_sent=0.0)
    assert not live.expired(5.0)
    assert live.expired(5.01)
    live.heard(4.0)
    assert not live.expired(8.9)


def test_any_traffic_counts_as_a_beat() -> None:
    live = Liveness(interval=1.0, max_missed=3, last_heard=0.0, last_sent=0.0)
    assert not live.beat_due(0.5)
    live.sent(0.9)
    assert not live.beat_due(1.5)
    assert live.beat_due(1.95)


def test_a_peer_is_judged_by_the_longer_of_its_advertised_interval_and_ours() -> None:
    """A peer whose heartbeats say it beats every 1 s is not gone after 5 x our 0.2 s: it
    was, and a service configured with a shorter interval than its peers dropped and
    re-made their connections every second (seen with the broker at --heartbeat 0.2)."""
    table = PeerTable(interval=0.2, max_missed=5)
    table.heard(b"slow", 0.0, interval=1.0)
    table.heard(b"fast", 0.0)
    _, gone = table.tick(1.5)
    assert gone == [b"fast"]
    _, gone = table.tick(4.9)
    assert gone == []
    table.heard(b"slow", 4.9)  # a message without an interval keeps the advertised one
    _, gone = table.tick(9.8)
    assert gone == []
    _, gone = table.tick(9.95)
    assert gone == [b"slow"]
    # Our interval stays the floor: a faster peer is given our patience.
    table.heard(b"eager", 10.0, interval=0.05)
    assert table.tick(10.9)[1] == [] and table.tick(11.05)[1] == [b"eager"]


def test_an_advertised_interval_that_is_nonsense_or_huge_is_not_believed() -> None:
    live = Liveness(interval=0.2, max_missed=5, last_heard=0.0, last_sent=0.0)
    for bad in (0.0, -1.0, float("nan")):
        live.advertised(bad)
    assert live.expired(1.01)
    live.advertised(1e9)  # capped: a peer cannot keep its entry for ever
    assert not live.expired(MAX_PEER_INTERVAL_S * 5) and live.expired(MAX_PEER_INTERVAL_S * 5.01)


def test_peer_table_beats_idle_peers_and_drops_silent_ones() -> None:
    table = PeerTable(interval=1.0, max_missed=2)
    assert table.heard(b"a", 0.0) is True
    assert table.heard(b"a", 0.1) is False
    table.heard(b"b", 1.5)
    due, gone = table.tick(1.2)
    assert due == [b"a", b"b"] and gone == []  # never sent to either yet
    table.sent(b"a", 1.2)
    table.sent(b"b", 1.2)
    due, gone = table.tick(2.15)
    assert gone == [b"a"] and due == []
    assert b"a" not in table.peers and b"b" in table.peers
    due, gone = table.tick(3.6)
    assert gone == [b"b"] and not table.peers


@given(st.integers(min_value=0, max_value=2**32))
def test_backoff_grows_to_its_cap_and_resets(seed: int) -> None:
    backoff = Backoff(initial=0.1, cap=2.0, rng=random.Random(seed))
    delays = [backoff.next_delay() for _ in range(12)]
    assert all(0.05 <= d <= 2.0 for d in delays)
    assert delays[0] <= 0.1
    assert min(delays[6:]) >= 1.0  # capped: between cap/2 and cap
    backoff.reset()
    assert backoff.next_delay() <= 0.1


def test_backoff_rejects_nonsense() -> None:
    with pytest.raises(ValueError):
        Backoff(initial=3.0, cap=1.0)


def test_stats_are_exported_as_typed_prometheus_counters() -> None:
    from prometheus_client.parser import text_string_to_metric_families

    from services.bus.stats import Stats
    from services.shell.metrics import Metrics

    stats = Stats()
    stats.inc("frames_received", 3)
    stats.inc("frames_dropped{reason=malformed}")
    stats.inc("frames_dropped{reason=too_large}", 2)
    text = Metrics("x", stats).exposition().decode()
    families = {fam.name: fam for fam in text_string_to_metric_families(text)}
    assert families["offerbus_x_frames_dropped"].type == "counter"
    assert families["offerbus_x_frames_dropped"].documentation.startswith("Frames refused")
    samples = {(s.name, tuple(sorted(s.labels.items()))): s.value
               for fam in families.values() for s in fam.samples}
    assert samples[("offerbus_x_frames_received_total", ())] == 3
    assert samples[("offerbus_x_frames_dropped_total", (("reason", "too_large"),))] == 2
