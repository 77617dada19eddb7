"""What the offer-broker reads off the master's state stream: each agent's view (hostname,
total, attributes; None once it is not registered), the frameworks gone or disconnected,
and the tasks that appeared. Pure: decoded StateEntries in, one StreamChange out."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from schemas import common_pb2, state_pb2
from services.bus.stream_core import StateEntry
from services.resources import Resources

REGISTERED = state_pb2.AgentRecord.Status.AGENT_STATUS_REGISTERED
RECOVERING = state_pb2.AgentRecord.Status.AGENT_STATUS_RECOVERING


@dataclass(frozen=True)
class AgentView:
    """An agent as offers name it."""

    hostname: str = ""
    total: Resources | None = None  # None: unknown (or unreadable)
    attributes: tuple[common_pb2.Attribute, ...] = ()


@dataclass
class StreamChange:
    """One Changed of the state stream, as the broker needs it. On a reset (a fresh copy of
    the whole state), what the copy lacks is gone: `agents_present` and
    `frameworks_present` then list everything the copy has."""

    reset: bool = False
    agents: dict[str, AgentView | None] = field(default_factory=dict)  # None: gone
    # Of those gone, the ones a new master waits for (RECOVERING): the allocator keeps
    # them, so what was offered on them goes back to it (a Recovery), not with the agent.
    away: set[str] = field(default_factory=set)
    frameworks_gone: list[tuple[str, bool]] = field(default_factory=list)  # (id, deleted)
    tasks: list[tuple[str, str]] = field(default_factory=list)  # (framework id, task id)
    agents_present: set[str] = field(default_factory=set)
    frameworks_present: set[str] = field(default_factory=set)


def agent_view(value: state_pb2.StateValue | None) -> AgentView | None:
    """A registered agent's view; None for a deleted, unreachable or gone one."""
    rec = value.agent if value is not None and value.WhichOneof("kind") == "agent" else None
    if rec is None or rec.status != REGISTERED:
        return None
    info = rec.agent_info
    try:
        total: Resources | None = Resources.from_proto(info.resources) - Resources()
    except ValueError:
        total = None
    return AgentView(info.hostname, total, tuple(info.attributes))


def read(entries: Iterable[StateEntry], reset: bool = False) -> StreamChange:
    change = StreamChange(reset=reset)
    for e in entries:
        kind, _, name = e.key.partition("/")
        if kind == "agents":
            change.agents[name] = None if e.deleted else agent_view(e.value)
            if not e.deleted and e.value.agent.status == RECOVERING:
                change.away.add(name)
            if reset and not e.deleted:
                change.agents_present.add(name)
        elif kind == "frameworks":
            if e.deleted:
                change.frameworks_gone.append((name, True))
                continue
            if reset:
                change.frameworks_present.add(name)
            if not e.value.framework.connected:
                change.frameworks_gone.append((name, False))
        elif kind == "tasks" and not e.deleted:
            fid, _, tid = name.partition("/")
            change.tasks.append((fid, tid))
    return change
