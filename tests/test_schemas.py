"""Contract tests of the wire schemas: every message type round-trips, envelopes go through
the codec unchanged, and the schema conventions (enum naming, task states) hold."""

from __future__ import annotations

import importlib
import pkgutil
from collections.abc import Iterator
from types import ModuleType

import pytest
from google.protobuf.descriptor import Descriptor, EnumDescriptor
from google.protobuf.message import Message
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import schemas
from schemas import common_pb2, envelope_pb2
from services.bus import codec
from tests.strategies import envelope_payload_kinds, envelopes, message_class, messages

# The whole file runs in a few seconds: many types, few examples each.
ROUND_TRIP = settings(
    max_examples=15,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)


def _schema_modules() -> list[ModuleType]:
    return [
        importlib.import_module(f"schemas.{info.name}")
        for info in pkgutil.iter_modules(schemas.__path__)
        if info.name.endswith("_pb2")
    ]


def _walk(desc: Descriptor) -> Iterator[Descriptor]:
    if desc.GetOptions().map_entry:
        return  # synthetic map entry types are covered through their map fields
    yield desc
    for nested in desc.nested_types:
        yield from _walk(nested)


def _message_types() -> list[Descriptor]:
    found: dict[str, Descriptor] = {}
    for module in _schema_modules():
        for desc in module.DESCRIPTOR.message_types_by_name.values():
            for d in _walk(desc):
                found[d.full_name] = d
    return [found[name] for name in sorted(found)]


def _enum_types() -> list[EnumDescriptor]:
    enums: dict[str, EnumDescriptor] = {}
    for module in _schema_modules():
        for enum in module.DESCRIPTOR.enum_types_by_name.values():
            enums[enum.full_name] = enum
    for desc in _message_types():
        for enum in desc.enum_types:
            enums[enum.full_name] = enum
    return [enums[name] for name in sorted(enums)]


MESSAGE_TYPES = _message_types()


def test_discovery_finds_every_schema() -> None:
    modules = {m.__name__ for m in _schema_modules()}
    for name in ("common", "scheduler", "agent", "executor", "internal", "state", "bus"):
        assert f"schemas.{name}_pb2" in modules
    assert len(MESSAGE_TYPES) > 60, [d.full_name for d in MESSAGE_TYPES]


@pytest.mark.parametrize("desc", MESSAGE_TYPES, ids=lambda d: d.full_name)
@ROUND_TRIP
@given(data=st.data())
def test_every_message_round_trips(desc: Descriptor, data: st.DataObject) -> None:
    cls = message_class(desc)
    msg = data.draw(messages(cls))
    wire = msg.SerializeToString()
    parsed = cls.FromString(wire)
    assert parsed == msg
    assert parsed.SerializeToString(deterministic=True) == msg.SerializeToString(deterministic=True)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(env=envelopes())
def test_envelopes_round_trip_through_the_codec(env: envelope_pb2.Envelope) -> None:
    frame = codec.encode(env)
    decoded = codec.decode(frame)
    assert decoded == env
    assert codec.payload_kind(decoded) == env.WhichOneof("payload")


def test_envelope_strategy_covers_every_payload() -> None:
    members = {f.name for f in envelope_pb2.Envelope.DESCRIPTOR.oneofs_by_name["payload"].fields}
    assert set(envelope_payload_kinds()) == members
    assert {"scheduler_call", "agent_event", "internal", "state_delta"} <= members


@pytest.mark.parametrize("kind", envelope_payload_kinds())
@settings(max_examples=5, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_envelope_strategy_draws_each_payload(kind: str, data: st.DataObject) -> None:
    env = data.draw(envelopes(payloads=[kind]))
    assert env.WhichOneof("payload") == kind
    assert codec.decode(codec.encode(env)) == env


@pytest.mark.parametrize("desc", MESSAGE_TYPES, ids=lambda d: d.full_name)
def test_strategy_sets_every_oneof(desc: Descriptor) -> None:
    """Call/Event wrappers are meaningless without a member; the strategy always picks one."""
    real = [o for o in desc.oneofs if not o.name.startswith("_")]
    if not real:
        return

    @settings(max_examples=5, deadline=None, suppress_health_check=[HealthCheck.too_slow])
    @given(msg=messages(message_class(desc)))
    def check(msg: Message) -> None:
        for oneof in real:
            assert msg.WhichOneof(oneof.name) is not None

    check()


MESOS_TASK_STATES = [
    "TASK_STAGING",
    "TASK_STARTING",
    "TASK_RUNNING",
    "TASK_KILLING",
    "TASK_FINISHED",
    "TASK_FAILED",
    "TASK_KILLED",
    "TASK_ERROR",
    "TASK_LOST",
    "TASK_DROPPED",
    "TASK_UNREACHABLE",
    "TASK_GONE",
    "TASK_GONE_BY_OPERATOR",
    "TASK_UNKNOWN",
]


def test_every_task_state_exists() -> None:
    names = set(common_pb2.TaskState.keys())
    assert set(MESOS_TASK_STATES) <= names
    assert common_pb2.TaskState.Value("TASK_STATE_UNSPECIFIED") == 0
    assert len(names) == len(MESOS_TASK_STATES) + 1


def test_call_and_event_wrappers_are_oneofs() -> None:
    by_name = {d.full_name: d for d in MESSAGE_TYPES}
    wrappers = [
        "SchedulerCall",
        "SchedulerEvent",
        "AgentCall",
        "AgentEvent",
        "ExecutorCall",
        "ExecutorEvent",
        "InternalMessage",
        "StateValue",
    ]
    for name in wrappers:
        desc = by_name[f"offerbus.v1.{name}"]
        real = [o for o in desc.oneofs if not o.name.startswith("_")]
        assert len(real) == 1, name
        assert len(real[0].fields) >= 2, name
        assert all(f.message_type is not None for f in real[0].fields), name


def test_enums_follow_the_package_conventions() -> None:
    """First value is *_UNSPECIFIED = 0; every value name is unique in the package, even in
    nested enums, so moving an enum never collides."""
    seen: dict[str, str] = {}
    for enum in _enum_types():
        first = enum.values[0]
        assert first.number == 0 and first.name.endswith("_UNSPECIFIED"), enum.full_name
        for value in enum.values:
            where = f"{value.name} in {enum.full_name} and {seen.get(value.name)}"
            assert value.name not in seen, where
            seen[value.name] = enum.full_name
