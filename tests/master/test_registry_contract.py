"""The registry and its writer, against both backends (real ZooKeeper, real files): round trip,
newest write wins, order kept between writes and loads, a deposed master's write refused (and
a later leadership at a higher epoch writes again), a document over the znode limit refused
with a clear error instead of retried forever, and a ZooKeeper outage that blocks nothing:
`store` returns at once, failed writes are retried and counted, the newest lands."""

from __future__ import annotations

import base64
import os
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from infra.zookeeper import ZooKeeperServer
from services.master.registry import (
    ZNODE_LIMIT,
    Backend,
    Fenced,
    FileRegistry,
    Loaded,
    Refused,
    RegistryEvent,
    RegistryWriter,
    StaleEpoch,
    Written,
    ZooKeeperRegistry,
    encode,
)
from tests.waiting import wait_for

DOC = {"agents": {"S1": {"status": "registered", "hostname": "vm-1"}},
       "frameworks": {"F1": {"name": "web", "failover_timeout_s": 60.0}}}


class Events:
    def __init__(self) -> None:
        self.items: list[RegistryEvent] = []
        self.lock = threading.Lock()

    def __call__(self, event: RegistryEvent) -> None:
        with self.lock:
            self.items.append(event)

    def of(self, kind: type) -> list[Any]:
        with self.lock:
            return [e for e in self.items if isinstance(e, kind)]


Make = Callable[..., tuple[RegistryWriter, Events]]


@pytest.fixture(params=["zookeeper", "file"])
def make(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Make]:
    """Writers over one registry (as two master processes would share it)."""
    made: list[RegistryWriter] = []
    hosts = request.getfixturevalue("zk_hosts") if request.param == "zookeeper" else ""

    def factory(**kw: Any) -> tuple[RegistryWriter, Events]:
        backend: Backend = (ZooKeeperRegistry(hosts) if hosts
                            else FileRegistry(tmp_path / "master.registry"))
        events = Events()
        writer = RegistryWriter(backend, events, **kw)
        made.append(writer)
        return writer, events

    yield factory
    for writer in made:
        writer.close()


def loaded(writer: RegistryWriter, events: Events, epoch: int = 1) -> Any:
    writer.load(epoch)
    wait_for(lambda: [e for e in events.of(Loaded) if e.epoch == epoch], 10,
             message="the registry never loaded")
    return [e for e in events.of(Loaded) if e.epoch == epoch][-1].document


def test_empty_then_round_trip(make: Make) -> None:
    writer, events = make()
    assert loaded(writer, events) is None
    writer.store(DOC, epoch=3)
    assert writer.flush(10)
    assert [(e.epoch, e.size) for e in events.of(Written)] == [(3, len(encode(DOC, 3)))]
    assert loaded(*make()) == DOC  # a new process (here: a new client) reads the same


def test_newest_document_wins_and_a_load_comes_after_the_stores_before_it(make: Make) -> None:
    writer, events = make()
    for i in range(20):
        writer.store({"agents": {f"S{i}": {"status": "registered"}}, "frameworks": {}}, epoch=3)
    writer.load(4)
    writer.store({"agents": {}, "frameworks": {"F": {}}}, epoch=4)
    assert writer.flush(10)
    (load,) = events.of(Loaded)
    every = {f"S{i}": {"status": "registered"} for i in range(20)}  # the changes, merged
    assert load.document == {"agents": every, "frameworks": {}}
    # A change after the load applies to what was loaded.
    assert loaded(*make()) == {"agents": every, "frameworks": {"F": {}}}
    assert writer.writes <= 20  # stores that waited behind a newer one were never written


def test_a_deposed_master_cannot_overwrite_but_may_lead_again_later(make: Make) -> None:
    old, old_events = make()
    new, _ = make()
    new.store(DOC, epoch=5)
    assert new.flush(10)
    old.store({"agents": {}, "frameworks": {}}, epoch=4)
    wait_for(lambda: old_events.of(Fenced), 10, message="old master never learned it was fenced")
    assert old_events.of(Fenced)[0] == Fenced(4, 5) and old.fenced == 1
    with pytest.raises(StaleEpoch):
        old.store({"agents": {}, "frameworks": {}}, epoch=4)
    assert loaded(*make()) == DOC
    # Elected again, at a higher epoch: its writes count again.
    old.store({"agents": {}, "frameworks": {"F9": {}}}, epoch=6)
    assert old.flush(10) and old_events.of(Written)
    assert loaded(*make()) == {"agents": {}, "frameworks": {"F9": {}}}


def _filler(approx_bytes: int) -> Any:
    """A document whose encoded size is close to `approx_bytes` (random, so incompressible)."""
    blob = base64.b64encode(os.urandom(approx_bytes)).decode()  # zlib takes back the 4/3
    return {"agents": {"S1": {"status": "registered", "hostname": blob}}, "frameworks": {}}


def test_a_document_over_the_znode_limit_is_refused_and_the_last_one_stays(make: Make) -> None:
    writer, events = make()
    writer.store(DOC, epoch=3)
    assert writer.flush(10)
    big = _filler(ZNODE_LIMIT + 50_000)
    writer.store(big, epoch=3)
    assert writer.flush(10), "the oversized document was retried instead of refused"
    (refused,) = events.of(Refused)
    assert refused.size > ZNODE_LIMIT == refused.limit and writer.refused == 1
    assert loaded(*make()) == DOC
    # One just under the limit is written (the limit is below what ZooKeeper takes).
    near = _filler(ZNODE_LIMIT - 30_000)
    assert ZNODE_LIMIT - 60_000 < len(encode(near, 3)) <= ZNODE_LIMIT
    writer.store(near, epoch=3)
    assert writer.flush(20) and writer.refused == 1
    assert loaded(*make()) == near


def test_a_zookeeper_outage_blocks_nothing_and_the_newest_document_lands(
    tmp_path: Path,
) -> None:
    server = ZooKeeperServer(tmp_path / "zk")
    server.start(timeout=30)
    events = Events()
    writer = RegistryWriter(ZooKeeperRegistry(server.hosts, session_timeout=1.0), events)
    try:
        writer.store(DOC, epoch=2)
        assert writer.flush(15)
        server.stop()
        started = time.monotonic()
        for i in range(50):
            writer.store({"agents": {}, "frameworks": {f"F{i}": {}}}, epoch=2)
        assert time.monotonic() - started < 0.1, "store() blocked while ZooKeeper was down"
        wait_for(lambda: writer.failures >= 2, 20, message="failed writes were not counted")
        assert writer.pending
        server.start(timeout=30)
        assert writer.flush(30), f"not written after ZooKeeper came back ({writer.failures})"
        assert writer.writes == 2  # the first, and the newest after the outage
    finally:
        writer.close()
        server.stop()
    reader_events = Events()
    server.start(timeout=30)
    reader = RegistryWriter(ZooKeeperRegistry(server.hosts), reader_events)
    try:
        # the agents of the first change stay; frameworks are replaced whole by the newest
        assert loaded(reader, reader_events) == {"agents": DOC["agents"], "frameworks": {"F49": {}}}
    finally:
        reader.close()
        server.stop()
