"""Hypothesis strategies for Offerbus protobuf messages, built generically from descriptors.

`messages(cls)` fills every kind of field a schema can declare, so a new message type or
field is covered without touching this file; `envelopes()` builds Envelopes the codec
accepts, with one payload chosen among all members of the `payload` oneof.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import Any, TypeVar

from google.protobuf import descriptor_pb2, message_factory
from google.protobuf.descriptor import Descriptor, FieldDescriptor
from google.protobuf.message import Message
from hypothesis import strategies as st

from schemas import envelope_pb2
from services.bus.codec import PROTOCOL_VERSION

M = TypeVar("M", bound=Message)

# Small collections keep examples fast; depth limits recursion (and nesting blow-up).
MAX_REPEATED = 2
MAX_TEXT = 12

_INT_RANGES: dict[int, tuple[int, int]] = {
    FieldDescriptor.TYPE_INT32: (-(2**31), 2**31 - 1),
    FieldDescriptor.TYPE_SINT32: (-(2**31), 2**31 - 1),
    FieldDescriptor.TYPE_SFIXED32: (-(2**31), 2**31 - 1),
    FieldDescriptor.TYPE_INT64: (-(2**63), 2**63 - 1),
    FieldDescriptor.TYPE_SINT64: (-(2**63), 2**63 - 1),
    FieldDescriptor.TYPE_SFIXED64: (-(2**63), 2**63 - 1),
    FieldDescriptor.TYPE_UINT32: (0, 2**32 - 1),
    FieldDescriptor.TYPE_FIXED32: (0, 2**32 - 1),
    FieldDescriptor.TYPE_UINT64: (0, 2**64 - 1),
    FieldDescriptor.TYPE_FIXED64: (0, 2**64 - 1),
}


def message_class(desc: Descriptor) -> type[Message]:
    return message_factory.GetMessageClass(desc)


def is_map_field(field: FieldDescriptor) -> bool:
    return field.message_type is not None and field.message_type.GetOptions().map_entry


@functools.cache
def _proto3_optional_names(desc: Descriptor) -> frozenset[str]:
    """Fields declared `optional` in proto3 (their oneofs are synthetic, not real ones)."""
    proto = descriptor_pb2.DescriptorProto()
    desc.CopyToProto(proto)
    return frozenset(f.name for f in proto.field if f.proto3_optional)


def _sub(field: FieldDescriptor) -> Descriptor:
    assert field.message_type is not None, field.full_name
    return field.message_type


def _scalar(field: FieldDescriptor) -> st.SearchStrategy[Any]:
    t = field.type
    if t in _INT_RANGES:
        lo, hi = _INT_RANGES[t]
        return st.integers(min_value=lo, max_value=hi)
    if t == FieldDescriptor.TYPE_DOUBLE:
        # NaN is never equal to itself, which would make round-trip equality meaningless.
        return st.floats(allow_nan=False)
    if t == FieldDescriptor.TYPE_FLOAT:
        return st.floats(width=32, allow_nan=False)
    if t == FieldDescriptor.TYPE_BOOL:
        return st.booleans()
    if t == FieldDescriptor.TYPE_STRING:
        return st.text(max_size=MAX_TEXT)  # valid UTF-8: hypothesis excludes surrogates
    if t == FieldDescriptor.TYPE_BYTES:
        return st.binary(max_size=MAX_TEXT)
    if t == FieldDescriptor.TYPE_ENUM and field.enum_type is not None:
        return st.sampled_from([v.number for v in field.enum_type.values])
    raise TypeError(f"no strategy for field {field.full_name} of type {t}")


def _single(field: FieldDescriptor, depth: int) -> st.SearchStrategy[Any] | None:
    """One value of a (non-map) field; None when a message field is beyond the depth."""
    if field.type == FieldDescriptor.TYPE_MESSAGE:
        return None if depth <= 0 else _message(_sub(field), depth - 1)
    return _scalar(field)


def _value(field: FieldDescriptor, depth: int) -> st.SearchStrategy[Any] | None:
    """The whole value of a field (list for repeated, dict for maps); None = leave unset."""
    if is_map_field(field):
        entry = _sub(field)
        key = _scalar(entry.fields_by_name["key"])
        value = _single(entry.fields_by_name["value"], depth)
        if value is None:
            return None
        return st.dictionaries(key, value, max_size=MAX_REPEATED)
    one = _single(field, depth)
    if one is None:
        return None
    if field.is_repeated:
        return st.lists(one, max_size=MAX_REPEATED)
    return one


def _oneof_member(field: FieldDescriptor, depth: int) -> st.SearchStrategy[tuple[str, Any]]:
    value = _single(field, depth)
    if value is None:  # a message member beyond the depth: set it, empty
        value = st.just(message_class(_sub(field))())
    return st.tuples(st.just(field.name), value)


@functools.cache
def _message(desc: Descriptor, depth: int) -> st.SearchStrategy[Message]:
    cls = message_class(desc)
    optional = _proto3_optional_names(desc)
    fields: dict[str, st.SearchStrategy[Any]] = {}
    oneofs: list[st.SearchStrategy[tuple[str, Any]]] = []
    for oneof in desc.oneofs:
        if all(f.name in optional for f in oneof.fields):
            continue  # synthetic oneof of a proto3 `optional` field
        # A real oneof: exactly one member set.
        oneofs.append(st.one_of([_oneof_member(f, depth) for f in oneof.fields]))
    for field in desc.fields:
        if field.containing_oneof is not None and field.name not in optional:
            continue
        value = _value(field, depth)
        if value is None:
            continue
        if field.name in optional or (
            field.type == FieldDescriptor.TYPE_MESSAGE and not field.is_repeated
        ):
            value = st.none() | value  # explicit presence: sometimes unset
        fields[field.name] = value

    def build(parts: tuple[dict[str, Any], list[tuple[str, Any]]]) -> Message:
        values, chosen = parts
        kwargs = {name: v for name, v in values.items() if v is not None}
        kwargs.update(chosen)
        return cls(**kwargs)

    return st.tuples(st.fixed_dictionaries(fields), st.tuples(*oneofs).map(list)).map(build)


def messages(cls: type[M], max_depth: int = 3) -> st.SearchStrategy[M]:
    """Any message of type `cls`, nested messages up to `max_depth` levels below it.

    Every field kind is drawn: integers over their full width, doubles/floats (no NaN),
    text, bytes, declared enum values, repeated fields, maps, nested messages (singular ones
    sometimes unset), proto3 `optional` fields (sometimes unset), and for each real oneof
    exactly one member.
    """
    return _message(cls.DESCRIPTOR, max_depth)  # type: ignore[return-value]


def envelope_payload_kinds() -> list[str]:
    """Names of the Envelope's payload oneof members, from its descriptor."""
    return [f.name for f in envelope_pb2.Envelope.DESCRIPTOR.oneofs_by_name["payload"].fields]


def _hex(n: int) -> st.SearchStrategy[str]:
    return st.text("0123456789abcdef", min_size=n, max_size=n)


def _envelope_meta() -> st.SearchStrategy[dict[str, Any]]:
    roles = [v.number for v in envelope_pb2.Role.DESCRIPTOR.values if v.number != 0]
    traceparent = st.builds(
        lambda t, s, f: f"00-{t}-{s}-{f}", _hex(32), _hex(16), st.sampled_from(["00", "01"])
    )
    return st.fixed_dictionaries(
        {
            "version": st.just(PROTOCOL_VERSION),
            "message_id": st.text(min_size=1, max_size=MAX_TEXT),
            "sender_id": st.text(max_size=MAX_TEXT),
            "sender_role": st.sampled_from(roles),
            "epoch": st.integers(min_value=0, max_value=2**64 - 1),
            "traceparent": st.just("") | traceparent,
            "tracestate": st.text(max_size=MAX_TEXT),
            "sent_at_us": st.integers(min_value=0, max_value=2**63 - 1),
            "in_reply_to": st.text(max_size=MAX_TEXT),
        }
    )


def envelopes(
    payloads: Sequence[str] | None = None, max_depth: int = 5
) -> st.SearchStrategy[envelope_pb2.Envelope]:
    """Valid Envelopes (version, message_id, sender_role set) with one payload.

    `payloads` restricts the payload kinds (names of the `payload` oneof members); by
    default every member is possible. `max_depth` bounds nesting below the payload.
    """
    members = envelope_pb2.Envelope.DESCRIPTOR.oneofs_by_name["payload"].fields
    chosen = [f for f in members if payloads is None or f.name in payloads]
    if payloads is not None and {f.name for f in chosen} != set(payloads):
        unknown = set(payloads) - {f.name for f in chosen}
        raise ValueError(f"not Envelope payloads: {sorted(unknown)}")
    payload = st.one_of(
        [st.tuples(st.just(f.name), _message(f.message_type, max_depth)) for f in chosen]
    )

    def build(parts: tuple[dict[str, Any], tuple[str, Message]]) -> envelope_pb2.Envelope:
        meta, (name, value) = parts
        env = envelope_pb2.Envelope(**meta)
        getattr(env, name).CopyFrom(value)
        return env

    return st.tuples(_envelope_meta(), payload).map(build)


__all__ = ["envelope_payload_kinds", "envelopes", "is_map_field", "message_class", "messages"]
