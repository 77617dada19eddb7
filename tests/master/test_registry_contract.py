"""The registry port's contract, run against both implementations (real ZooKeeper, real
files): round trip, newest write wins, and a deposed master's write is refused."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from services.master.registry import (
    FileRegistry,
    Registry,
    StaleEpoch,
    ZooKeeperRegistry,
)
from tests.waiting import wait_for


def flush(reg: Registry) -> None:
    if isinstance(reg, ZooKeeperRegistry):
        assert reg.flush(5.0)


@pytest.fixture(params=["zookeeper", "file"])
def make(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Callable[[], Registry]]:
    made: list[Registry] = []

    def factory() -> Registry:
        if request.param == "zookeeper":
            hosts = request.getfixturevalue("zk_hosts")
            reg: Registry = ZooKeeperRegistry(hosts)
        else:
            reg = FileRegistry(tmp_path / "master.registry")
        made.append(reg)
        return reg

    yield factory
    for reg in made:
        reg.close()


DOC = {"agents": {"S1": {"status": "registered", "hostname": "vm-1"}},
       "frameworks": {"F1": {"name": "web", "failover_timeout_s": 60.0}}}


def test_empty_then_round_trip(make: Callable[[], Registry]) -> None:
    reg = make()
    assert reg.load() is None
    reg.store(DOC, epoch=3)
    flush(reg)
    assert make().load() == DOC  # a new process (here: a new client) reads the same


def test_newest_document_wins(make: Callable[[], Registry]) -> None:
    reg = make()
    for i in range(20):
        reg.store({"agents": {f"S{i}": {"status": "registered"}}, "frameworks": {}}, epoch=3)
    flush(reg)
    assert make().load() == {"agents": {"S19": {"status": "registered"}}, "frameworks": {}}


def test_a_deposed_master_cannot_overwrite(make: Callable[[], Registry]) -> None:
    old, new = make(), make()
    new.store(DOC, epoch=5)
    flush(new)
    if isinstance(old, ZooKeeperRegistry):
        old.store({"agents": {}, "frameworks": {}}, epoch=4)
        wait_for(old.fenced.is_set, 5, message="old master never learned it was fenced")
        with pytest.raises(StaleEpoch):
            old.store({"agents": {}, "frameworks": {}}, epoch=4)
    else:
        with pytest.raises(StaleEpoch):
            old.store({"agents": {}, "frameworks": {}}, epoch=4)
    assert make().load() == DOC
