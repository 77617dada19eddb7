"""The agent's work dir on disk: the fsynced append-only log of status update records (the thin
shell of status_updates.py), and the atomically replaced agent id, state (tasks, executors)
and total with reservations.

Log format (status_updates.log): a sequence of frames `>I length, >I crc32(body), body`, body =
one kind byte (1 Added, 2 Acked) + an agent_pb2.StatusUpdate (for Acked only framework_id,
task_id and uuid are set). A crash mid-append leaves a torn last frame: `load()` drops it,
counts and logs it, and truncates the file there so later appends stay readable.
"""

from __future__ import annotations

import contextlib
import os
import struct
import zlib
from collections.abc import Iterable
from pathlib import Path
from typing import BinaryIO

from google.protobuf.message import DecodeError

from schemas import agent_pb2, common_pb2
from services.agent import status_updates as su
from services.bus.log import get_logger

log = get_logger(__name__)

LOG_NAME = "status_updates.log"
AGENT_ID_NAME = "agent_id"
CLUSTER_ID_NAME = "cluster_id"
STATE_NAME = "agent_state.pb"
RESOURCES_NAME = "resources.pb"  # an AgentEvent.CheckpointResources, as the master sent it

_HEADER = struct.Struct(">II")
_ADDED, _ACKED = 1, 2
MAX_RECORD = 4 << 20  # a frame claiming more than this is garbage, not a record
COMPACT_MIN_BYTES = 1 << 20  # do not bother compacting a log smaller than this
COMPACT_FACTOR = 4  # compact when the log is this many times its last compacted size

AgentState = agent_pb2.AgentCall.Reregister


class CheckpointCorrupt(RuntimeError):
    """A checkpoint file the agent cannot read; it must not start as if it had none."""


def encode(record: su.Record) -> bytes:
    if isinstance(record, su.Added):
        body = bytes([_ADDED]) + record.update.SerializeToString()
    else:
        msg = agent_pb2.StatusUpdate(framework_id=record.framework_id)
        msg.status.task_id = record.task_id
        msg.status.uuid = record.uuid
        body = bytes([_ACKED]) + msg.SerializeToString()
    return _HEADER.pack(len(body), zlib.crc32(body)) + body


def decode(data: bytes) -> tuple[list[su.Record], int]:
    """Records of a log's bytes, and the length of its readable prefix (< len(data) when
    the tail is torn or corrupt)."""
    records: list[su.Record] = []
    pos, end = 0, len(data)
    while pos + _HEADER.size <= end:
        length, crc = _HEADER.unpack_from(data, pos)
        start = pos + _HEADER.size
        if length == 0 or length > MAX_RECORD or start + length > end:
            break
        body = data[start:start + length]
        if zlib.crc32(body) != crc or body[0] not in (_ADDED, _ACKED):
            break
        msg = agent_pb2.StatusUpdate()
        try:
            msg.ParseFromString(body[1:])
        except DecodeError:
            break
        if body[0] == _ADDED:
            records.append(su.Added(msg))
        else:
            records.append(su.Acked(msg.framework_id, msg.status.task_id, msg.status.uuid))
        pos = start + length
    return records, pos


def _is_torn_tail(tail: bytes) -> bool:
    """Whether a bad tail looks like an interrupted append (a cut or zero-filled last frame)
    rather than damage in the middle of the log (a bad frame with more data after it)."""
    if len(tail) < _HEADER.size or not tail.strip(b"\0"):
        return True
    length, _ = _HEADER.unpack_from(tail, 0)
    return _HEADER.size + length >= len(tail) or not tail[_HEADER.size + length:].strip(b"\0")


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def atomic_write(path: Path, data: bytes) -> None:
    """Replace `path` with `data` all at once: tmp file, fsync, rename, fsync the dir."""
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    _fsync_dir(path.parent)


class StatusUpdateLog:
    """The append-only log of status update records in a work dir. `load()` first (it also
    repairs a torn tail), then `append()` each batch of Checkpoint records (one fsync)."""

    def __init__(
        self,
        work_dir: Path | str,
        *,
        compact_min_bytes: int = COMPACT_MIN_BYTES,
        compact_factor: int = COMPACT_FACTOR,
    ) -> None:
        self.work_dir = Path(work_dir)
        self.path = self.work_dir / LOG_NAME
        self.compact_min_bytes = compact_min_bytes
        self.compact_factor = compact_factor
        self.torn_tails = 0  # loads that found a torn or corrupt tail
        self.dropped_bytes = 0
        self.compactions = 0
        self.size = 0
        self._compacted_size = 0
        self._file: BinaryIO | None = None

    def load(self) -> list[su.Record]:
        """Every readable record. A torn or corrupt tail is dropped, counted, logged, and cut
        off the file (a copy of a corrupt file is kept as *.corrupt); this never raises for
        bad content."""
        self.close()
        self.work_dir.mkdir(parents=True, exist_ok=True)
        data = self.path.read_bytes() if self.path.exists() else b""
        records, good = decode(data)
        if good < len(data):
            dropped = len(data) - good
            self.torn_tails += 1
            self.dropped_bytes += dropped
            if not _is_torn_tail(data[good:]):
                (self.path.with_name(LOG_NAME + ".corrupt")).write_bytes(data)
                log.error("status_update_log_corrupt", path=self.path, offset=good,
                          dropped_bytes=dropped, kept_records=len(records))
            else:
                log.warning("status_update_log_torn_tail", path=self.path, offset=good,
                            dropped_bytes=dropped, kept_records=len(records))
            with open(self.path, "r+b") as f:
                f.truncate(good)
                f.flush()
                os.fsync(f.fileno())
        self.size, self._compacted_size = good, 0  # a big log is compacted on load
        self._file = open(self.path, "ab")  # noqa: SIM115 -- held open until close()
        if self.size > self._threshold():
            self.compact(records)
            records, _ = decode(self.path.read_bytes())
        return records

    def append(self, records: list[su.Record]) -> None:
        """Write these records and fsync; compacts afterwards if the log has grown enough."""
        if self._file is None:
            raise RuntimeError("StatusUpdateLog.load() must run before append()")
        if not records:
            return
        data = b"".join(encode(r) for r in records)
        self._file.write(data)
        self._file.flush()
        os.fsync(self._file.fileno())
        self.size += len(data)
        if self.size > self._threshold():
            self.compact()

    def compact(self, records: list[su.Record] | None = None) -> None:
        """Rewrite the log with only what recovery needs (status_updates.compact)."""
        if records is None:
            records, _ = decode(self.path.read_bytes())
        data = b"".join(encode(r) for r in su.compact(records))
        self.close()
        atomic_write(self.path, data)
        self._file = open(self.path, "ab")  # noqa: SIM115
        self.size = self._compacted_size = len(data)
        self.compactions += 1
        log.info("status_update_log_compacted", path=self.path, records=len(records),
                 bytes=len(data))

    def close(self) -> None:
        if self._file is not None:
            with contextlib.suppress(OSError):
                self._file.close()
            self._file = None

    def _threshold(self) -> int:
        return max(self.compact_min_bytes, self.compact_factor * self._compacted_size)


class AgentCheckpoint:
    """The agent's id, its cluster's id, its state (tasks, executors, frameworks, as a
    Reregister message) and its total with reservations (the master's last
    CheckpointResources), each file replaced atomically, so a crash leaves the old version or
    the new one."""

    def __init__(self, work_dir: Path | str) -> None:
        self.work_dir = Path(work_dir)
        self.agent_id_path = self.work_dir / AGENT_ID_NAME
        self.cluster_id_path = self.work_dir / CLUSTER_ID_NAME
        self.state_path = self.work_dir / STATE_NAME
        self.resources_path = self.work_dir / RESOURCES_NAME

    def save_agent_id(self, agent_id: str) -> None:
        self._save_id(self.agent_id_path, agent_id)

    def load_agent_id(self) -> str | None:
        """None for a fresh work dir (the agent registers as new)."""
        return self._load_id(self.agent_id_path)

    def save_cluster_id(self, cluster_id: str) -> None:
        self._save_id(self.cluster_id_path, cluster_id)

    def load_cluster_id(self) -> str | None:
        """None until a master named the cluster (or for a work dir from before cluster ids)."""
        return self._load_id(self.cluster_id_path)

    def _save_id(self, path: Path, value: str) -> None:
        if not value or "\n" in value:
            raise ValueError(f"bad {path.name} {value!r}")
        self.work_dir.mkdir(parents=True, exist_ok=True)
        atomic_write(path, value.encode() + b"\n")

    def _load_id(self, path: Path) -> str | None:
        try:
            text = path.read_bytes().decode()
        except FileNotFoundError:
            return None
        except UnicodeDecodeError as e:
            raise CheckpointCorrupt(f"{path}: not text: {e}") from e
        value = text.strip()
        if not value:
            raise CheckpointCorrupt(f"{path}: empty")
        return value

    def save_state(self, state: AgentState) -> None:
        self.work_dir.mkdir(parents=True, exist_ok=True)
        atomic_write(self.state_path, state.SerializeToString())

    def load_state(self) -> AgentState | None:
        """None when never saved."""
        try:
            data = self.state_path.read_bytes()
        except FileNotFoundError:
            return None
        state = AgentState()
        try:
            state.ParseFromString(data)
        except DecodeError as e:
            raise CheckpointCorrupt(f"{self.state_path}: {e}") from e
        return state

    def save_resources(self, resources: Iterable[common_pb2.Resource]) -> None:
        self.work_dir.mkdir(parents=True, exist_ok=True)
        msg = agent_pb2.AgentEvent.CheckpointResources(resources=resources)
        atomic_write(self.resources_path, msg.SerializeToString())

    def load_resources(self) -> list[common_pb2.Resource] | None:
        """None when the master never sent any (the agent's flags are its total)."""
        try:
            data = self.resources_path.read_bytes()
        except FileNotFoundError:
            return None
        msg = agent_pb2.AgentEvent.CheckpointResources()
        try:
            msg.ParseFromString(data)
        except DecodeError as e:
            raise CheckpointCorrupt(f"{self.resources_path}: {e}") from e
        return list(msg.resources)
