"""What the master's pure core asks its shell to do. The core builds protobuf payloads (pure
data) and names where they go; the shell stamps, encodes and sends them, writes the
registry and publishes state. Peers are the opaque routing ids the shell gave the core."""

from __future__ import annotations

from dataclasses import dataclass, field

from schemas import agent_pb2, bus_pb2, internal_pb2, operator_pb2, scheduler_pb2
from services.notice import Notice


@dataclass(frozen=True)
class ToAgent:
    """An event for one agent (over the front ROUTER, to the agent's current peer)."""

    peer: bytes
    agent_id: str
    event: agent_pb2.AgentEvent
    traceparent: str = ""


@dataclass(frozen=True)
class ToFramework:
    """An event for one framework scheduler (over the front ROUTER)."""

    peer: bytes
    framework_id: str
    event: scheduler_pb2.SchedulerEvent
    traceparent: str = ""


@dataclass(frozen=True)
class ToBroker:
    """An internal message for the offer-broker (over the internal ROUTER). The core keeps
    the broker's current peer; `peer` is empty when no broker is connected (the shell then
    drops it, counts it, and the broker resyncs when it connects)."""

    peer: bytes
    message: internal_pb2.InternalMessage
    traceparent: str = ""


@dataclass(frozen=True)
class ToOperator:
    """A reply to an operator/CLI peer (logs, kill results)."""

    peer: bytes
    event: operator_pb2.OperatorEvent
    in_reply_to: str = ""


@dataclass(frozen=True)
class Reject:
    """An error back to whoever sent a call we refuse (unauthorised, invalid, unknown)."""

    peer: bytes
    code: int  # bus_pb2.ErrorCode
    message: str
    in_reply_to: str = ""
    channel: str = "front"  # or "internal"


@dataclass(frozen=True)
class Publish:
    """Changes for the state stream (keys: agents/<id>, frameworks/<id>, tasks/<fid>/<tid>)."""

    entries: list[bus_pb2.StateEntry] = field(default_factory=list)


@dataclass(frozen=True)
class PersistRegistry:
    """The registry changed; `change` says what (registry.merge applies it): the entries of
    the agents that changed under "agents" (None: forgotten), and "cluster_id",
    "frameworks" and "roles" whole when any of them changed. The shell's writer keeps the
    whole document (the registry as loaded, plus every change since) and writes it to
    ZooKeeper (or the standalone file); the newest document wins. A change costs what
    changed, not the size of the fleet."""

    change: dict[str, object]


Command = (ToAgent | ToFramework | ToBroker | ToOperator | Reject | Publish | PersistRegistry
           | Notice)
