"""The master shell's publication after a failover (issue 8 d): the entries the calls of one
reactor turn produced go out once per key, the latest, in one publication."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from pathlib import Path

import pytest

from schemas import bus_pb2, state_pb2
from services.master.commands import Publish
from services.master.shell import MasterShell
from tests.master.test_master_shell import lead, master_on


@pytest.fixture
def master(tmp_path: Path) -> Iterator[MasterShell]:
    shell = master_on(tmp_path, heartbeat_interval=0.05)
    try:
        lead(shell)
        yield shell
    finally:
        shell.close()


def fw_entry(name: str) -> bus_pb2.StateEntry:
    value = state_pb2.StateValue()
    value.framework.framework_info.framework_id = "F1"
    value.framework.framework_info.name = name
    return bus_pb2.StateEntry(key="frameworks/F1", value=value)


def test_a_key_changed_by_many_calls_of_one_turn_is_published_once(
        master: MasterShell) -> None:
    """Each agent re-registering changes its framework's record: 10,000 agents, 10,000
    copies of one record on the stream for every subscriber to apply. Once, the latest."""
    published: list[list[bus_pb2.StateEntry]] = []
    publish = master.publisher.publish

    def recorded(entries: Iterable[bus_pb2.StateEntry]) -> None:
        published.append(list(entries))
        publish(published[-1])

    master.publisher.publish = recorded  # type: ignore[method-assign]
    task = bus_pb2.StateEntry(key="tasks/F1/t1", deleted=True)
    master.driver.dispatch([Publish([fw_entry("a")]), Publish([task, fw_entry("b")]),
                            Publish([fw_entry("c")])])
    master._flush()
    assert [[e.key for e in batch] for batch in published] == [["frameworks/F1",
                                                                 "tasks/F1/t1"]]
    assert published[0][0].value.framework.framework_info.name == "c"
    assert master.publisher.store["frameworks/F1"].value.framework.framework_info.name == "c"
