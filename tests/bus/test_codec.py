"""Envelope codec: round trips, and every kind of bad frame gives its typed error."""

from __future__ import annotations

import pytest
from google.protobuf.internal import encoder
from hypothesis import given
from hypothesis import strategies as st

from services.bus import codec


def valid(**fields: object) -> codec.Envelope:
    env = codec.Envelope(version=codec.PROTOCOL_VERSION, message_id="m-1",
                         sender_role=codec.Role.Value("ROLE_AGENT"), **fields)  # type: ignore[arg-type]
    if not env.WhichOneof("payload"):
        env.heartbeat.interval_ms = 1000
    return env


def test_round_trip_keeps_every_metadata_field() -> None:
    env = valid(sender_id="agent-7", epoch=42, traceparent="00-" + "a" * 32 + "-" + "b" * 16 +
                "-01", sent_at_us=1_700_000_000_000_000, in_reply_to="x-9")
    assert codec.decode(codec.encode(env)) == env


@pytest.mark.parametrize(
    ("frame", "error"),
    [
        (b"", codec.MalformedFrame),
        (b"\xff\xff\xff", codec.MalformedFrame),
        (b"\x0a\x05ab", codec.MalformedFrame),  # truncated length-delimited field
    ],
)
def test_garbage_is_malformed(frame: bytes, error: type[codec.FrameError]) -> None:
    with pytest.raises(error) as info:
        codec.decode(frame)
    assert info.value.code == codec.ErrorCode.Value("MALFORMED_FRAME")


def test_truncated_valid_frame_is_refused() -> None:
    frame = codec.encode(valid(sender_id="agent-7", traceparent="x" * 40))
    for cut in range(1, len(frame)):
        with pytest.raises(codec.FrameError):
            codec.decode(frame[:cut])


def test_oversized_frame_is_refused_both_ways() -> None:
    env = valid(sender_id="x" * 2000)
    frame = env.SerializeToString()
    with pytest.raises(codec.FrameTooLarge):
        codec.decode(frame, limit=len(frame) - 1)
    with pytest.raises(codec.FrameTooLarge):
        codec.encode(env, limit=len(frame) - 1)
    assert codec.decode(frame, limit=len(frame)) == env


@given(st.lists(st.text(max_size=20), max_size=30), st.integers(0, 2**40), st.booleans())
def test_a_payload_tail_is_merged_into_the_payload(keys: list[str], seq: int,
                                                   last: bool) -> None:
    """encode's `tail` (more of the payload's fields as wire bytes, as the state stream's
    publisher sends its stored entries) decodes as the payload holding them."""
    from schemas import bus_pb2
    entries = [bus_pb2.StateEntry(key=k, deleted=i % 2 == 0) for i, k in enumerate(keys)]
    whole = valid(in_reply_to="r-1")
    whole.snapshot_chunk.epoch, whole.snapshot_chunk.seq, whole.snapshot_chunk.last = 3, seq, last
    head = codec.Envelope()
    head.CopyFrom(whole)
    whole.snapshot_chunk.entries.extend(entries)
    tail = bus_pb2.SnapshotChunk(entries=entries).SerializeToString()
    assert codec.decode(codec.encode(head, tail=tail)) == whole


def test_a_frame_over_the_limit_with_its_tail_is_refused() -> None:
    head = valid()
    head.snapshot_chunk.epoch = 1
    tail = bytes([3 << 3 | 2, 100]) + b"x" * 100  # one entry field of 100 bytes
    size = len(codec.encode(head, tail=tail))
    assert size > len(head.SerializeToString()) + len(tail)
    with pytest.raises(codec.FrameTooLarge):
        codec.encode(head, limit=size - 1, tail=tail)


def test_wrong_version_is_refused_but_names_the_message() -> None:
    env = valid()
    env.version = codec.PROTOCOL_VERSION + 1
    with pytest.raises(codec.UnsupportedVersion) as info:
        codec.decode(env.SerializeToString())
    assert info.value.envelope is not None and info.value.envelope.message_id == "m-1"


def test_missing_metadata_is_malformed() -> None:
    env = valid()
    env.message_id = ""
    with pytest.raises(codec.MalformedFrame):
        codec.decode(env.SerializeToString())
    env = valid()
    env.sender_role = codec.Role.Value("ROLE_UNSPECIFIED")
    with pytest.raises(codec.MalformedFrame):
        codec.decode(env.SerializeToString())


def test_payload_from_a_newer_schema_is_unknown() -> None:
    env = valid()
    env.ClearField("payload")
    # Field 999, length-delimited: what a newer sender's new payload looks like to us.
    unknown = encoder.TagBytes(999, 2) + bytes([3]) + b"new"
    with pytest.raises(codec.UnknownPayload):
        codec.decode(env.SerializeToString() + unknown)
    with pytest.raises(codec.UnknownPayload):
        codec.encode(env)


def test_invalid_utf8_in_a_string_is_malformed() -> None:
    frame = valid().SerializeToString() + encoder.TagBytes(3, 2) + b"\x02\xff\xfe"
    with pytest.raises(codec.MalformedFrame):
        codec.decode(frame)


@given(st.binary(max_size=512))
def test_arbitrary_bytes_never_raise_anything_but_frame_errors(frame: bytes) -> None:
    try:
        env = codec.decode(frame)
    except codec.FrameError:
        return
    # Whatever parses must satisfy the receiver's contract.
    assert env.version == codec.PROTOCOL_VERSION and env.message_id and env.WhichOneof("payload")


def test_message_ids_are_unique() -> None:
    a, b = codec.MessageIds(), codec.MessageIds()
    ids = [a.next() for _ in range(1000)] + [b.next() for _ in range(1000)]
    assert len(set(ids)) == len(ids)
