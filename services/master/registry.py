"""The master's registry: the small persisted record of admitted, unreachable and gone agents
and of frameworks with their failover timeouts (DESIGN §4), and the worker that keeps its I/O
off the reactor.

Two backends (ZooKeeper: one znode; a file, for standalone): blocking `load` and `write`,
fenced by epoch (a deposed master's late write never overwrites a newer leader's registry),
and called only from `RegistryWriter`'s thread. The writer does one operation at a time, in
the order asked: the newest document wins over older ones still waiting, a failed write or
load is retried (and counted) until it succeeds or something newer replaces it, and a
document larger than the znode limit is refused with an error line, never sent."""

from __future__ import annotations

import json
import os
import threading
import zlib
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol
from urllib.parse import urlsplit

from services.bus.log import get_logger

log = get_logger("master.registry")

Document = dict[str, Any]

# ZooKeeper refuses a request over jute.maxbuffer (1 MiB - 1 by default) and drops the
# connection; the data must leave room for the request's own framing.
ZNODE_LIMIT = 1_000_000
RETRY_FIRST_S, RETRY_MAX_S = 0.05, 2.0


class StaleEpoch(Exception):
    """A newer leader has written the registry (at epoch `stored`); this writer must stop."""

    def __init__(self, message: str, stored: int = 0) -> None:
        super().__init__(message)
        self.stored = stored


class Backend(Protocol):
    """Blocking; called from one thread at a time (the writer's)."""

    def connect(self) -> None: ...  # ready the connection (a standby, long before it leads)
    def load(self) -> Document | None: ...
    def write(self, data: bytes, epoch: int) -> None: ...  # raises StaleEpoch
    def close(self) -> None: ...


def merge(document: Document, change: Document) -> None:
    """Apply a core's change (commands.PersistRegistry) to the whole document, in place:
    agents' entries set or (None) removed, other sections replaced whole. Entries are
    replaced, never edited, so a shallow copy of the document is a consistent snapshot."""
    for key, value in change.items():
        if key == "agents":
            agents = document.setdefault("agents", {})
            for agent_id, entry in value.items():
                if entry is None:
                    agents.pop(agent_id, None)
                else:
                    agents[agent_id] = entry
        else:
            document[key] = value


def fold(into: Document, change: Document) -> Document:
    """Fold a later change into an earlier one (both as `merge` takes them): agents'
    entries (removals too) accumulate, other sections are replaced. Returns `into`."""
    for key, value in change.items():
        if key == "agents":
            into.setdefault("agents", {}).update(value)
        else:
            into[key] = value
    return into


def encode(document: Document, epoch: int) -> bytes:
    return zlib.compress(json.dumps({"epoch": epoch, "registry": document},
                                    sort_keys=True).encode())


def _decode(data: bytes) -> tuple[int, Document]:
    doc = json.loads(zlib.decompress(data))
    return int(doc["epoch"]), doc["registry"]


class FileRegistry:
    """`path` holds the registry; written atomically (tmp + fsync + rename) under a lock."""

    def __init__(self, path: Path) -> None:
        self.path = path
        path.parent.mkdir(parents=True, exist_ok=True)
        self._lock = threading.Lock()

    def connect(self) -> None:
        pass

    def load(self) -> Document | None:
        try:
            return _decode(self.path.read_bytes())[1]
        except FileNotFoundError:
            return None

    def write(self, data: bytes, epoch: int) -> None:
        with self._lock:
            try:
                current, _ = _decode(self.path.read_bytes())
            except FileNotFoundError:
                current = 0
            if current > epoch:
                raise StaleEpoch(f"registry written at epoch {current}; ours is {epoch}",
                                 current)
            tmp = self.path.with_suffix(".tmp")
            with open(tmp, "wb") as f:
                f.write(data)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, self.path)

    def close(self) -> None:
        pass


class ZooKeeperRegistry:
    """A znode (default /offerbus/master/registry), written with a compare-and-set on its
    version; refused when the stored epoch is newer than ours. Connects on first use (from
    the writer's thread), so a master starts while ZooKeeper is away; each request gives up
    after `op_timeout` s (kazoo would queue it until ZooKeeper is back) so the writer counts
    the failure and may move on to a newer document."""

    def __init__(self, hosts: str, path: str = "/offerbus/master/registry",
                 session_timeout: float = 2.0, op_timeout: float | None = None) -> None:
        self.hosts, self.path, self.session_timeout = hosts, path, session_timeout
        self.op_timeout = op_timeout if op_timeout is not None else max(1.0, 2 * session_timeout)
        self._client: Any = None

    def client(self) -> Any:
        if self._client is None:
            from kazoo.client import KazooClient
            from kazoo.retry import KazooRetry

            client = KazooClient(
                hosts=self.hosts, timeout=self.session_timeout,
                connection_retry=KazooRetry(max_tries=-1, delay=0.05, max_delay=0.5),
                command_retry=KazooRetry(max_tries=5, delay=0.05, max_delay=0.5))
            try:
                client.start(timeout=10)
                client.ensure_path(self.path)
            except Exception:
                client.stop()
                client.close()
                raise
            self._client = client
        return self._client

    def connect(self) -> None:
        self.client()

    def load(self) -> Document | None:
        data, _ = self.client().get_async(self.path).get(timeout=self.op_timeout)
        return _decode(data)[1] if data else None

    def write(self, data: bytes, epoch: int) -> None:
        from kazoo.exceptions import BadVersionError

        client = self.client()
        while True:
            stored, stat = client.get_async(self.path).get(timeout=self.op_timeout)
            current = _decode(stored)[0] if stored else 0
            if current > epoch:
                raise StaleEpoch(f"registry written at epoch {current}; ours is {epoch}",
                                 current)
            try:
                client.set_async(self.path, data, version=stat.version).get(
                    timeout=self.op_timeout)
                return
            except BadVersionError:
                continue  # someone wrote in between: re-read and decide again

    def close(self) -> None:
        if self._client is not None:
            self._client.stop()
            self._client.close()
            self._client = None


# -- the writer ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Loaded:
    """The registry as stored, loaded for the leadership at `epoch` (None: empty)."""

    epoch: int
    document: Document | None


@dataclass(frozen=True)
class Written:
    """The document stored at `epoch` is durable (`size`: bytes in the znode)."""

    epoch: int
    size: int


@dataclass(frozen=True)
class Fenced:
    """A write at `epoch` was refused: the registry is `stored_epoch`'s."""

    epoch: int
    stored_epoch: int


@dataclass(frozen=True)
class Refused:
    """A document too large for the znode was not written (the previous one stays)."""

    epoch: int
    size: int
    limit: int


RegistryEvent = Loaded | Written | Fenced | Refused


@dataclass
class _Op:
    kind: str  # "store" or "load"
    epoch: int
    change: Document | None = None  # a store's changes, folded


class RegistryWriter:
    """The registry's I/O on a worker thread. `store` and `load` return at once; results
    (`RegistryEvent`) go to `on_event`, called on the worker thread (the shell hands them to
    its reactor through a Mailbox). Counters: writes, failures (each failed attempt), refused
    (too large), fenced."""

    def __init__(self, backend: Backend, on_event: Callable[[RegistryEvent], None] | None = None,
                 *, max_bytes: int = ZNODE_LIMIT) -> None:
        self.backend = backend
        self.on_event = on_event or (lambda event: None)
        self.max_bytes = max_bytes
        self.writes = self.failures = self.refused = self.fenced = 0
        self.fenced_by = 0  # the newest epoch seen in the registry that was not ours
        self._queue: deque[_Op] = deque()
        self._loaded: Loaded | None = None  # the latest load's result
        self._document: Document = {}  # as last loaded, plus every change stored since
        self._busy = False
        self._closed = False
        self._cond = threading.Condition()
        self._thread = threading.Thread(target=self._run, name="registry-writer", daemon=True)
        self._thread.start()

    # -- the reactor's side ------------------------------------------------------------------
    def store(self, change: Document, epoch: int) -> None:
        """Queue `change` (see `merge`): the worker applies it, in order with loads, to the
        document it keeps (the registry as last loaded, plus every change since) and writes
        that. Changes waiting in a row are folded into one (the newest document wins).
        O(change) on the caller's thread. Raises StaleEpoch when a newer leader's write was
        already seen."""
        if epoch < self.fenced_by:
            raise StaleEpoch(f"the registry is epoch {self.fenced_by}'s; ours is {epoch}",
                             self.fenced_by)
        with self._cond:
            last = self._queue[-1] if self._queue else None
            if last is not None and last.kind == "store" and last.epoch == epoch:
                assert last.change is not None
                fold(last.change, change)
            else:
                self._queue.append(_Op("store", epoch, fold({}, change)))
            self._cond.notify_all()

    def document(self) -> Document:
        """A consistent copy of the document kept (tests, diagnostics)."""
        with self._cond:
            return self._snapshot()

    def _snapshot(self) -> Document:  # under the lock
        return _copy(self._document)

    def load(self, epoch: int) -> None:
        """Queue a load for the leadership at `epoch`, after every store asked before it (a
        master leading again reads what it wrote last). Replaces a load still waiting."""
        with self._cond:
            self._queue = deque(op for op in self._queue if op.kind != "load")
            self._queue.append(_Op("load", epoch))
            self._cond.notify_all()

    def wait_loaded(self, epoch: int, timeout: float) -> Loaded | None:
        """The load for `epoch`, if it completes within `timeout` s (the result also goes to
        `on_event`)."""
        with self._cond:
            self._cond.wait_for(lambda: self._loaded is not None
                                and self._loaded.epoch == epoch, timeout)
            loaded = self._loaded
        return loaded if loaded is not None and loaded.epoch == epoch else None

    @property
    def pending(self) -> int:
        with self._cond:
            return len(self._queue) + self._busy

    def flush(self, timeout: float = 5.0) -> bool:
        """Wait until nothing is waiting or in flight (tests, clean shutdown)."""
        with self._cond:
            return self._cond.wait_for(lambda: not self._queue and not self._busy, timeout)

    def close(self, timeout: float = 2.0) -> None:
        """Give what is waiting `timeout` s to be written, then stop."""
        self.flush(timeout)
        with self._cond:
            self._closed = True
            self._cond.notify_all()
        self._thread.join(timeout=5)
        self.backend.close()

    # -- the worker --------------------------------------------------------------------------
    def _run(self) -> None:
        try:
            self.backend.connect()
        except Exception as exc:  # the first operation retries it
            log.warning("registry not reachable yet", error=repr(exc))
        while True:
            with self._cond:
                self._cond.wait_for(lambda: bool(self._queue) or self._closed)
                if self._closed:
                    return
                op = self._queue.popleft()
                self._busy = True
            try:
                self._do(op)
            finally:
                with self._cond:
                    self._busy = False
                    self._cond.notify_all()

    def _do(self, op: _Op) -> None:
        data = b""
        if op.kind == "store":
            with self._cond:
                assert op.change is not None
                merge(self._document, op.change)
                document = self._snapshot()  # shallow: O(agents) of C, not the encoding
            data = encode(document, op.epoch)
            if len(data) > self.max_bytes:
                self.refused += 1
                log.error("registry document too large: not written", bytes=len(data),
                          limit=self.max_bytes, agents=len(document.get("agents", {})),
                          frameworks=len(document.get("frameworks", {})), epoch=op.epoch)
                self.on_event(Refused(op.epoch, len(data), self.max_bytes))
                return
        delay = RETRY_FIRST_S
        while True:
            try:
                if op.kind == "load":
                    loaded = Loaded(op.epoch, self.backend.load())
                    with self._cond:
                        self._loaded = loaded
                        # changes of the leadership that follows apply to what it loaded
                        self._document = _copy(loaded.document or {})
                        self._cond.notify_all()
                    self.on_event(loaded)
                else:
                    self.backend.write(data, op.epoch)
                    self.writes += 1
                    self.on_event(Written(op.epoch, len(data)))
                return
            except StaleEpoch as exc:
                self.fenced += 1
                stored = max(exc.stored, op.epoch + 1)
                self.fenced_by = max(self.fenced_by, stored)
                log.error("registry fenced: a newer master wrote it", ours=op.epoch,
                          stored=stored)
                self.on_event(Fenced(op.epoch, stored))
                return
            except Exception as exc:  # ZooKeeper away, a timeout, a disk error...
                self.failures += 1
                log.warning("registry I/O failed; retrying", op=op.kind, error=repr(exc),
                            retry_in_s=round(delay, 3), failures=self.failures)
            with self._cond:
                if self._cond.wait_for(lambda: self._closed or self._superseded(op), delay):
                    return  # closing, or a newer store replaces this one
            delay = min(delay * 2, RETRY_MAX_S)

    def _superseded(self, op: _Op) -> bool:
        """A newer operation of the same kind waits at the head of the queue (never past a
        different kind: order is kept)."""
        return bool(self._queue) and self._queue[0].kind == op.kind


def _copy(document: Document) -> Document:
    return {k: dict(v) if isinstance(v, dict) else v for k, v in document.items()}


def registry_from_url(url: str) -> Backend:
    """zk://hosts/chroot (the registry znode lives under it) or file:///dir."""
    parts = urlsplit(url)
    if parts.scheme == "zk":
        return ZooKeeperRegistry(parts.netloc + (parts.path.rstrip("/") or ""))
    if parts.scheme == "file":
        return FileRegistry(Path(parts.path) / "master.registry")
    raise ValueError(f"unsupported registry URL {url!r}: use zk://hosts[/chroot] or file:///dir")
