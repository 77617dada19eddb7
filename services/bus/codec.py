"""Envelope framing: one protobuf Envelope per ZeroMQ frame, with a size limit and typed errors.

Every service encodes and decodes through here; nothing else parses frames.
"""

from __future__ import annotations

import itertools
import os
import time

from google.protobuf.message import DecodeError

from schemas import bus_pb2, envelope_pb2

PROTOCOL_VERSION = 1
DEFAULT_FRAME_LIMIT = 4 * 1024 * 1024  # bytes; a snapshot larger than this is chunked
# Room in a frame for the envelope around a message: a sender splitting a batch to fit a
# frame fills each message up to DEFAULT_FRAME_LIMIT - FRAME_MARGIN.
FRAME_MARGIN = 64 * 1024

Envelope = envelope_pb2.Envelope
Role = envelope_pb2.Role
ErrorCode = bus_pb2.ErrorCode


class FrameError(Exception):
    """A frame that cannot be accepted. `code` is the ErrorCode sent back where possible."""

    code: int = bus_pb2.MALFORMED_FRAME
    reason: str = "malformed"  # a short label for counters and logs

    def __init__(self, message: str, envelope: Envelope | None = None) -> None:
        super().__init__(message)
        # The decoded envelope when the frame parsed but was refused (lets a reply name it).
        self.envelope = envelope


class MalformedFrame(FrameError):
    code = bus_pb2.MALFORMED_FRAME
    reason = "malformed"


class FrameTooLarge(FrameError):
    code = bus_pb2.FRAME_TOO_LARGE
    reason = "too_large"


class UnsupportedVersion(FrameError):
    code = bus_pb2.UNSUPPORTED_VERSION
    reason = "unsupported_version"


class UnknownPayload(FrameError):
    code = bus_pb2.UNKNOWN_PAYLOAD
    reason = "unknown_payload"


def payload_kind(env: Envelope) -> str:
    """The name of the envelope's payload field, e.g. "heartbeat" or "scheduler_call"."""
    return env.WhichOneof("payload") or ""


class MessageIds:
    """Unique message ids for one sender: a random prefix and a counter (cheap, sortable)."""

    def __init__(self) -> None:
        self._prefix = os.urandom(4).hex()
        self._counter = itertools.count(1)

    def next(self) -> str:
        return f"{self._prefix}-{next(self._counter)}"


def varint(n: int) -> bytes:
    """`n` (>= 0) as a protobuf varint."""
    out = bytearray()
    while n > 0x7F:
        out.append(n & 0x7F | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def encode(env: Envelope, limit: int = DEFAULT_FRAME_LIMIT, tail: bytes = b"") -> bytes:
    """Serialise an envelope; refuses to produce a frame the receiver would refuse. `tail`:
    more fields of its payload message, as wire bytes, appended after it (protobuf merges
    a message field that comes twice): a large payload serialised once by its maker, never
    copied into the envelope."""
    field = env.WhichOneof("payload")
    if not field:
        raise UnknownPayload("envelope has no payload")
    frame = env.SerializeToString()
    if tail:
        number = env.DESCRIPTOR.fields_by_name[field].number
        frame = b"".join((frame, varint(number << 3 | 2), varint(len(tail)), tail))
    if len(frame) > limit:
        raise FrameTooLarge(f"frame of {len(frame)} bytes exceeds the limit of {limit}")
    return frame


def decode(frame: bytes, limit: int = DEFAULT_FRAME_LIMIT) -> Envelope:
    """Parse and check a frame. Raises a FrameError subclass for anything not acceptable."""
    if len(frame) > limit:
        raise FrameTooLarge(f"frame of {len(frame)} bytes exceeds the limit of {limit}")
    if not frame:
        raise MalformedFrame("empty frame")
    env = Envelope()
    try:
        env.ParseFromString(frame)
    except (DecodeError, ValueError) as exc:  # ValueError: e.g. invalid UTF-8 in a string
        raise MalformedFrame(f"undecodable envelope: {exc}") from exc
    if env.version != PROTOCOL_VERSION:
        raise UnsupportedVersion(
            f"protocol version {env.version} not supported (this side speaks {PROTOCOL_VERSION})",
            env,
        )
    if not env.message_id or env.sender_role == envelope_pb2.ROLE_UNSPECIFIED:
        raise MalformedFrame("envelope lacks message_id or sender_role", env)
    kind = env.WhichOneof("payload")
    if kind is None:
        # Either no payload, or one from a newer schema that this side does not know.
        raise UnknownPayload("envelope carries no payload this side knows", env)
    return env


def now_us() -> int:
    return time.time_ns() // 1000


def error_envelope(code: int, message: str) -> Envelope:
    """An Error payload (metadata is filled in by the sending socket)."""
    env = Envelope()
    env.error.code = code  # type: ignore[assignment]
    env.error.message = message
    return env


__all__ = [
    "DEFAULT_FRAME_LIMIT",
    "PROTOCOL_VERSION",
    "Envelope",
    "ErrorCode",
    "FrameError",
    "FrameTooLarge",
    "MalformedFrame",
    "MessageIds",
    "Role",
    "UnknownPayload",
    "UnsupportedVersion",
    "decode",
    "encode",
    "error_envelope",
    "now_us",
    "payload_kind",
]
