"""Leader election on one machine without ZooKeeper: the leader of a role holds an exclusive
flock on `run_dir/{role}.lock` (the kernel releases it when the process dies), bumps the
epoch in `{role}.epoch` and publishes `{role}.leader.json`. Never Suspended nor Lost."""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import threading
from pathlib import Path
from typing import Any

from services.bus.election.port import (
    Elected,
    ElectionEvent,
    LeaderChanged,
    LeaderInfo,
    check_role,
)
from services.bus.log import get_logger
from services.bus.mailbox import Mailbox
from services.procs import pid_alive, start_time

log = get_logger("bus.election.standalone")


def _write_atomic(path: Path, data: bytes) -> None:
    """tmp + fsync + rename + fsync(dir): a reader sees the old or the new file, whole."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{threading.get_ident()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        os.write(fd, data)
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, path)
    dir_fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)


def read_leader_file(path: Path) -> dict[str, Any] | None:
    try:
        doc = json.loads(path.read_bytes())
    except (OSError, ValueError):
        return None
    return doc if isinstance(doc, dict) else None


class StandaloneContender:
    def __init__(
        self, run_dir: Path | str, role: str, member_id: str, endpoints: dict[str, str]
    ) -> None:
        self.run_dir = Path(run_dir)
        self.role = check_role(role)
        self.member_id = member_id
        self.endpoints = dict(endpoints)
        self._lock_path = self.run_dir / f"{role}.lock"
        self._epoch_path = self.run_dir / f"{role}.epoch"
        self._leader_path = self.run_dir / f"{role}.leader.json"
        self._mailbox: Mailbox[ElectionEvent] = Mailbox()
        self._lock = threading.Lock()  # orders the waiter's take-over against close()
        self._closed = False
        self._fd: int | None = None  # the open lock file while we hold the flock
        self._leading: int | None = None
        self._waiter: threading.Thread | None = None

    def start(self) -> None:
        with self._lock:
            if self._waiter is not None or self._closed:
                return
            self.run_dir.mkdir(parents=True, exist_ok=True)
            self._waiter = threading.Thread(
                target=self._wait, name=f"flock-{self.role}-{self.member_id}", daemon=True
            )
            self._waiter.start()

    def fileno(self) -> int:
        return self._mailbox.fileno()

    def events(self) -> list[ElectionEvent]:
        return [] if self._closed else self._mailbox.drain()

    @property
    def leading_epoch(self) -> int | None:
        return self._leading

    def close(self) -> None:
        with self._lock:
            if self._closed:
                return
            self._closed = True
            self._leading = None
            if self._fd is not None:
                # Remove our leader file before releasing the lock, so we never remove a
                # successor's.
                doc = read_leader_file(self._leader_path)
                if doc and doc.get("member_id") == self.member_id and doc.get("pid") == os.getpid():
                    with contextlib.suppress(FileNotFoundError):
                        self._leader_path.unlink()
                os.close(self._fd)  # releases the flock
                self._fd = None
        # A waiter still blocked in flock() cannot be interrupted; when it gets the lock
        # it sees _closed and hands the lock straight on.
        self._mailbox.close()

    def _wait(self) -> None:
        try:
            fd = os.open(self._lock_path, os.O_RDWR | os.O_CREAT, 0o644)
        except OSError as exc:
            log.error("standalone_lock_open_failed", path=str(self._lock_path), error=repr(exc))
            return
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)  # blocks until the current leader is gone
        except OSError as exc:
            os.close(fd)
            log.error("standalone_flock_failed", path=str(self._lock_path), error=repr(exc))
            return
        with self._lock:
            if self._closed:
                os.close(fd)
                return
            try:
                epoch = self._next_epoch()
                info = {
                    "role": self.role,
                    "member_id": self.member_id,
                    "epoch": epoch,
                    "endpoints": self.endpoints,
                    "pid": os.getpid(),
                    "pid_start": start_time(os.getpid()),
                }
                _write_atomic(self._leader_path, json.dumps(info).encode())
            except OSError as exc:
                os.close(fd)
                log.error("standalone_takeover_failed", role=self.role, error=repr(exc))
                return
            self._fd = fd
            self._leading = epoch
            self._mailbox.put(Elected(epoch))
        log.info("standalone_elected", role=self.role, member=self.member_id, epoch=epoch)

    def _next_epoch(self) -> int:
        """One more than any epoch seen: the counter, or a leader file left by a crash."""
        try:
            last = int(self._epoch_path.read_text().strip() or 0)
        except FileNotFoundError:
            last = 0
        doc = read_leader_file(self._leader_path)
        if doc is not None and isinstance(doc.get("epoch"), int):
            last = max(last, doc["epoch"])
        epoch = last + 1
        _write_atomic(self._epoch_path, f"{epoch}\n".encode())
        return epoch


class StandaloneDetector:
    def __init__(self, run_dir: Path | str, role: str, poll_interval: float = 0.05) -> None:
        self.run_dir = Path(run_dir)
        self.role = check_role(role)
        self.poll_interval = poll_interval
        self._leader_path = self.run_dir / f"{role}.leader.json"
        self._mailbox: Mailbox[LeaderChanged] = Mailbox()
        self._changed = threading.Condition()
        self._stop = threading.Event()
        self._leader: LeaderInfo | None = None
        self._seen: tuple[int, int, int] | None = None  # (inode, mtime_ns, size) last parsed
        self._doc: dict[str, Any] | None = None
        self._poller: threading.Thread | None = None

    def start(self) -> None:
        if self._poller is not None:
            return
        self._poll()
        self._poller = threading.Thread(target=self._run, name=f"detect-{self.role}", daemon=True)
        self._poller.start()

    def fileno(self) -> int:
        return self._mailbox.fileno()

    def events(self) -> list[LeaderChanged]:
        return [] if self._stop.is_set() else self._mailbox.drain()

    def leader(self) -> LeaderInfo | None:
        return self._leader

    def wait_for_leader(self, timeout: float) -> LeaderInfo | None:
        with self._changed:
            self._changed.wait_for(
                lambda: self._leader is not None or self._stop.is_set(), timeout
            )
            return self._leader

    def close(self) -> None:
        self._stop.set()
        if self._poller is not None and self._poller is not threading.current_thread():
            self._poller.join(timeout=2.0)
        with self._changed:
            self._changed.notify_all()
        self._mailbox.close()

    def _run(self) -> None:
        while not self._stop.wait(self.poll_interval):
            try:
                self._poll()
            except Exception as exc:  # a poller must outlive odd files
                log.warning("standalone_poll_failed", role=self.role, error=repr(exc))

    def _poll(self) -> None:
        try:
            st = os.stat(self._leader_path)
            seen: tuple[int, int, int] | None = (st.st_ino, st.st_mtime_ns, st.st_size)
        except FileNotFoundError:
            seen = None
        if seen != self._seen:
            self._seen = seen
            self._doc = None if seen is None else read_leader_file(self._leader_path)
        self._set(self._current())

    def _current(self) -> LeaderInfo | None:
        doc = self._doc
        if doc is None:
            return None
        try:
            pid, epoch = int(doc["pid"]), int(doc["epoch"])
            start = doc.get("pid_start")
            if not pid_alive(pid, int(start) if start is not None else None):
                return None
            endpoints = {str(k): str(v) for k, v in dict(doc.get("endpoints", {})).items()}
            return LeaderInfo(self.role, str(doc["member_id"]), epoch, endpoints)
        except (KeyError, TypeError, ValueError):
            return None

    def _set(self, leader: LeaderInfo | None) -> None:
        new = None if leader is None else leader.key()
        with self._changed:
            old = None if self._leader is None else self._leader.key()
            if new == old or self._stop.is_set():
                return
            self._leader = leader
            self._mailbox.put(LeaderChanged(leader))
            self._changed.notify_all()
