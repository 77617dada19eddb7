"""The master's registry port: the small persisted record of admitted, unreachable and gone
agents and of frameworks with their failover timeouts (DESIGN §4). Two implementations:
ZooKeeper (a znode) and a file (standalone, one machine). Writes are fenced by epoch: a
deposed master's late write never overwrites a newer leader's registry."""

from __future__ import annotations

import json
import os
import threading
import zlib
from pathlib import Path
from typing import Any, Protocol
from urllib.parse import urlsplit

from services.bus.log import get_logger

log = get_logger("master.registry")

Document = dict[str, Any]


class StaleEpoch(Exception):
    """A newer leader has written the registry; this writer must stop."""


class Registry(Protocol):
    def load(self) -> Document | None: ...
    def store(self, document: Document, epoch: int) -> None: ...
    def close(self) -> None: ...


def _encode(document: Document, epoch: int) -> bytes:
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

    def load(self) -> Document | None:
        try:
            return _decode(self.path.read_bytes())[1]
        except FileNotFoundError:
            return None

    def store(self, document: Document, epoch: int) -> None:
        with self._lock:
            try:
                current, _ = _decode(self.path.read_bytes())
            except FileNotFoundError:
                current = 0
            if current > epoch:
                raise StaleEpoch(f"registry written at epoch {current}; ours is {epoch}")
            tmp = self.path.with_suffix(".tmp")
            with open(tmp, "wb") as f:
                f.write(_encode(document, epoch))
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, self.path)

    def close(self) -> None:
        pass


class ZooKeeperRegistry:
    """A znode (default /offerbus/master/registry). `store` returns at once; a writer thread
    writes the newest document with a compare-and-set on the znode version, refusing when
    the stored epoch is newer than ours (then `fenced` is set and the master steps down)."""

    def __init__(self, hosts: str, path: str = "/offerbus/master/registry",
                 session_timeout: float = 2.0) -> None:
        from kazoo.client import KazooClient
        from kazoo.retry import KazooRetry

        self.path = path
        self.client = KazooClient(
            hosts=hosts, timeout=session_timeout,
            connection_retry=KazooRetry(max_tries=-1, delay=0.05, max_delay=0.5),
            command_retry=KazooRetry(max_tries=5, delay=0.05, max_delay=0.5),
        )
        self.client.start(timeout=15)
        self.client.ensure_path(path)
        self.fenced = threading.Event()
        self.writes = 0
        self._pending: tuple[Document, int] | None = None
        self._cond = threading.Condition()
        self._closed = False
        self._thread = threading.Thread(target=self._writer, name="registry-writer",
                                        daemon=True)
        self._thread.start()

    def load(self) -> Document | None:
        data, _ = self.client.get(self.path)
        return _decode(data)[1] if data else None

    def store(self, document: Document, epoch: int) -> None:
        if self.fenced.is_set():
            raise StaleEpoch("a newer master owns the registry")
        with self._cond:
            self._pending = (document, epoch)  # the newest document wins; older ones coalesce
            self._cond.notify()

    def flush(self, timeout: float = 5.0) -> bool:
        """Wait until every stored document is written (for tests and clean shutdown)."""
        with self._cond:
            return self._cond.wait_for(lambda: self._pending is None, timeout)

    def _writer(self) -> None:
        from kazoo.exceptions import BadVersionError, KazooException

        while True:
            with self._cond:
                self._cond.wait_for(lambda: self._pending is not None or self._closed)
                if self._closed:
                    return
                assert self._pending is not None
                document, epoch = self._pending
            try:
                data, stat = self.client.get(self.path)
                current = _decode(data)[0] if data else 0
                if current > epoch:
                    self.fenced.set()
                    log.error("registry fenced", ours=epoch, stored=current)
                    with self._cond:
                        self._pending = None
                        self._cond.notify_all()
                    continue
                self.client.set(self.path, _encode(document, epoch), version=stat.version)
                self.writes += 1
                with self._cond:
                    if self._pending == (document, epoch):
                        self._pending = None
                    self._cond.notify_all()
            except BadVersionError:
                continue  # someone wrote in between: re-read and decide again
            except KazooException as exc:
                log.warning("registry write failed; retrying", error=repr(exc))
                with self._cond:
                    self._cond.wait(0.2)

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify_all()
        self._thread.join(timeout=5)
        self.client.stop()
        self.client.close()


def registry_from_url(url: str) -> Registry:
    """zk://hosts/chroot (the registry znode lives under it) or file:///dir."""
    parts = urlsplit(url)
    if parts.scheme == "zk":
        return ZooKeeperRegistry(parts.netloc + (parts.path.rstrip("/") or ""))
    if parts.scheme == "file":
        return FileRegistry(Path(parts.path) / "master.registry")
    raise ValueError(f"unsupported registry URL {url!r}: use zk://hosts[/chroot] or file:///dir")
