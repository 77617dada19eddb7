"""The allocate span and the decision say why a framework got less than an agent had free
(issue 9 item 7): fair share kept part for frameworks of declared demand (the progressive
filling cut to its headroom), resources reserved for other roles were skipped, or its offers
were reclaimed (or tasks revoked) for a framework below its share. The shell runs with its
broker link faked; spans go to an in-memory exporter."""

from __future__ import annotations

from typing import Any

import pytest
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from services.allocator.core import AllocatorCore
from services.allocator.fill import Shape
from services.resources import Resources
from services.telemetry import spans as keys
from tests.allocator.test_shell_outbox import shell_with
from tests.telemetry.test_edge_spans import spans  # noqa: F401 (the fixture)

R = Resources.parse


@pytest.fixture
def exporter(spans: InMemorySpanExporter) -> InMemorySpanExporter:  # noqa: F811
    """The in-memory exporter of tests/telemetry's `spans` fixture."""
    return spans


def allocate_spans(core: AllocatorCore, exporter: InMemorySpanExporter
                   ) -> dict[str, list[dict[str, Any]]]:
    """One cycle through the shell: framework id -> its allocate spans' attributes."""
    exporter.clear()
    shell, _, _ = shell_with(core)
    shell._allocate()
    out: dict[str, list[dict[str, Any]]] = {}
    for s in exporter.get_finished_spans():
        if s.name == keys.ALLOCATE and s.attributes is not None:
            out.setdefault(str(s.attributes[keys.FRAMEWORK_ID]), []).append(dict(s.attributes))
    return out


def test_a_framework_cut_to_its_headroom_is_told_so(exporter: InMemorySpanExporter) -> None:
    core = AllocatorCore()
    core.agent_added("a1", "h1", R("cpus:4;mem:4096"))
    core.framework_added("d", "*")
    core.demand("d", [Shape.of(R("cpus:1;mem:512"), 2)])
    core.framework_added("u", "*")  # unknown demand: alone, it would take everything
    got = allocate_spans(core, exporter)
    [u] = got["u"]
    d = Resources.total(R(a[keys.RESOURCES]) for a in got["d"])
    cut = R(u[keys.FAIR_SHARE_CUT])
    assert cut and d.contains(cut)  # what d took after u took its part
    assert (R(u[keys.RESOURCES]) + d).same(R("cpus:4;mem:4096"))
    assert not any(keys.FAIR_SHARE_CUT in a for a in got["d"])  # it takes task by task
    assert keys.RESERVED_ELSEWHERE not in u
    assert "fair share kept part" in core.decisions["u"].reason


def test_alone_a_framework_is_cut_by_nothing(exporter: InMemorySpanExporter) -> None:
    core = AllocatorCore()
    core.agent_added("a1", "h1", R("cpus:4;mem:4096"))
    core.framework_added("u", "*")
    [[u]] = allocate_spans(core, exporter).values()
    assert R(u[keys.RESOURCES]) == R("cpus:4;mem:4096")
    assert not {keys.FAIR_SHARE_CUT, keys.RESERVED_ELSEWHERE,
                keys.FAIR_SHARE_RECLAIMED} & u.keys()
    assert "fair share" not in core.decisions["u"].reason


def test_resources_reserved_for_another_role_are_named(exporter: InMemorySpanExporter) -> None:
    core = AllocatorCore()
    core.agent_added("a1", "h1", R("cpus(db):1;cpus:2;mem:1024"))
    core.framework_added("web-fw", "web")
    [[web]] = allocate_spans(core, exporter).values()
    assert R(web[keys.RESOURCES]) == R("cpus:2;mem:1024")
    assert web[keys.RESERVED_ELSEWHERE] == "cpus(db):1"
    assert "reserved for other roles were skipped" in core.decisions["web-fw"].reason
    core.framework_added("db-fw", "db")
    [[db]] = allocate_spans(core, exporter).values()
    assert R(db[keys.RESOURCES]) == R("cpus(db):1")
    assert keys.RESERVED_ELSEWHERE not in db  # its own reservation


def test_a_framework_whose_offers_are_reclaimed_is_told_so(
        exporter: InMemorySpanExporter) -> None:
    """A sitter holds offers of three agents; a service of declared demand arrives, and a
    fourth agent too small for the service's task goes to the sitter in the cycle that
    reclaims the sitter's offer of agent-0 for the service."""
    core = AllocatorCore()
    for i in range(3):
        core.agent_added(f"agent-{i}", "h", R("cpus:4;mem:8192"))
    core.framework_added("sitter", "*")
    allocate_spans(core, exporter)
    core.framework_added("service", "*")
    core.demand("service", [Shape.of(R("cpus:0.5;mem:256"), 1)])
    core.agent_added("agent-3", "h", R("cpus:0.2;mem:100"))
    got = allocate_spans(core, exporter)
    assert got.keys() == {"sitter"}
    assert list(got["sitter"][0][keys.FAIR_SHARE_RECLAIMED]) == [
        "agent-0: offers reclaimed for service"]
