"""Leader election and detection on ZooKeeper (kazoo): ephemeral sequential members under
`{base}/{role}/election`, the lowest leads, and its sequence number gives the epoch.

Threads: kazoo calls state listeners on its connection thread and watches on its callback
thread; neither may block. They only record facts, emit Suspended/Lost at once, and wake a
worker thread that makes every blocking ZooKeeper call. Events reach the service's reactor
through a Mailbox.
"""

from __future__ import annotations

import contextlib
import json
import os
import queue
import socket
import threading
import time
from typing import Any

from kazoo.client import KazooClient, KazooState
from kazoo.exceptions import KazooException, NoNodeError
from kazoo.protocol.states import EventType, WatchedEvent, ZnodeStat
from kazoo.retry import KazooRetry

from services.bus.election.port import (
    Elected,
    ElectionEvent,
    LeaderChanged,
    LeaderInfo,
    Lost,
    Suspended,
    check_role,
)
from services.bus.log import get_logger
from services.bus.mailbox import Mailbox

log = get_logger("bus.election.zk")

MEMBER_PREFIX = "member_"
RETRY_AFTER_ERROR = 0.1  # seconds before a failed reconcile is tried again while connected


def election_path(base_path: str, role: str) -> str:
    return f"{base_path.rstrip('/')}/{check_role(role)}/election"


def member_epoch(name: str) -> int:
    """ZooKeeper's 10-digit sequence suffix, plus one: the first member of a fresh election
    path gets sequence 0, and epoch 0 means "not elected" on the wire."""
    return int(name[-10:]) + 1


def sorted_members(children: list[str]) -> list[str]:
    members = [c for c in children if c.startswith(MEMBER_PREFIX) and c[-10:].isdigit()]
    return sorted(members, key=member_epoch)


def _key(leader: LeaderInfo | None) -> tuple[str, int] | None:
    return None if leader is None else leader.key()


class _ZkSession:
    """One KazooClient and a worker thread that reconciles with ZooKeeper whenever woken."""

    def __init__(self, hosts: str, session_timeout: float, name: str) -> None:
        self._client = KazooClient(
            hosts=hosts,
            timeout=session_timeout,
            # Reconnect fast and forever; the session timeout, not the retry policy,
            # decides when leadership is lost.
            connection_retry=KazooRetry(
                max_tries=-1, delay=0.02, backoff=2, max_jitter=0.2, max_delay=0.5
            ),
        )
        self._name = name
        self._lock = threading.Lock()
        self._closed = False
        self._started = False
        self._wake: queue.SimpleQueue[bool] = queue.SimpleQueue()
        self._worker = threading.Thread(target=self._run, name=name, daemon=True)

    # -- hooks -------------------------------------------------------------------------
    def _on_state(self, state: str) -> None:
        """Runs on kazoo's connection thread, under self._lock: record, never block."""

    def _reconcile(self) -> None:
        """Runs on the worker while connected: make our view match ZooKeeper's."""

    # -- machinery ---------------------------------------------------------------------
    def _start_session(self) -> None:
        with self._lock:
            if self._started or self._closed:
                return
            self._started = True
        self._client.add_listener(self._listener)
        self._worker.start()
        self._client.start_async()

    def _stop_session(self) -> None:
        with self._lock:
            if self._closed:
                return
            self._closed = True
            started = self._started
        self._wake.put(True)
        if started:
            # stop() closes the session, so our ephemeral member goes at once; it also
            # fails any call the worker is blocked in.
            try:
                self._client.stop()
                self._client.close()
            except Exception as exc:  # a dying connection must not break close()
                log.warning("zk_close_failed", name=self._name, error=repr(exc))
            self._client.remove_listener(self._listener)
            if self._worker.is_alive() and self._worker is not threading.current_thread():
                self._worker.join(timeout=2.0)

    def _listener(self, state: str) -> None:
        with self._lock:
            if self._closed:
                return
            self._on_state(state)
        log.info("zk_state", name=self._name, state=state, server=self.connected_server())
        self._wake.put(True)

    def _on_watch(self, event: WatchedEvent) -> None:
        # EventType.NONE is kazoo telling every watch that the connection dropped (it then
        # forgets them); the reconnect wakes the worker and re-arms what is needed.
        if event.type != EventType.NONE:
            self._wake.put(True)

    def _run(self) -> None:
        retry_at: float | None = None
        while True:
            timeout = None if retry_at is None else max(0.0, retry_at - time.monotonic())
            with contextlib.suppress(queue.Empty):
                self._wake.get(timeout=timeout)
            while not self._wake.empty():  # coalesce: one reconcile serves every wake-up
                self._wake.get_nowait()
            if self._closed:
                return
            retry_at = None
            if self._client.state != KazooState.CONNECTED:
                continue  # the next CONNECTED wakes us
            try:
                self._reconcile()
            except (KazooException, OSError, ValueError) as exc:
                if self._closed:
                    return
                log.warning("zk_reconcile_failed", name=self._name, error=repr(exc))
                retry_at = time.monotonic() + RETRY_AFTER_ERROR
            except Exception as exc:  # kazoo's own timeouts and the unexpected
                if self._closed:
                    return
                log.error("zk_reconcile_error", name=self._name, error=repr(exc))
                retry_at = time.monotonic() + RETRY_AFTER_ERROR

    def connected_server(self) -> str | None:
        """The "host:port" of the ZooKeeper server this client is connected to (kazoo does
        not expose it publicly; diagnostics and tests only)."""
        try:
            sock = self._client._connection._socket
            if sock is None or self._client.state != KazooState.CONNECTED:
                return None
            host, port = sock.getpeername()[:2]
            return f"{host}:{port}"
        except (AttributeError, OSError):
            return None


class ZooKeeperContender(_ZkSession):
    """Stands for `role`; emits Elected/Suspended/Lost through its mailbox."""

    def __init__(
        self,
        hosts: str,
        role: str,
        member_id: str,
        endpoints: dict[str, str],
        *,
        session_timeout: float = 1.0,
        base_path: str = "/offerbus",
    ) -> None:
        super().__init__(hosts, session_timeout, f"zk-contender-{role}-{member_id}")
        self.role = role
        self.member_id = member_id
        self.endpoints = dict(endpoints)
        self._path = election_path(base_path, role)
        self._mailbox: Mailbox[ElectionEvent] = Mailbox()
        self._gen = 0  # bumped on every connection state change (under self._lock)
        self._leading: int | None = None
        # Worker-only state:
        self._node: str | None = None  # our member's name
        self._node_session: int | None = None  # the session that owns it
        self._created_in: int | None = None  # session of the last create whose reply we lost

    def start(self) -> None:
        self._start_session()

    def fileno(self) -> int:
        return self._mailbox.fileno()

    def events(self) -> list[ElectionEvent]:
        return [] if self._closed else self._mailbox.drain()

    @property
    def leading_epoch(self) -> int | None:
        return self._leading

    @property
    def member_path(self) -> str | None:
        """Our member znode (diagnostics and tests)."""
        node = self._node
        return None if node is None else f"{self._path}/{node}"

    def close(self) -> None:
        with self._lock:
            self._leading = None
        self._stop_session()
        self._mailbox.close()

    # -- kazoo's connection thread -------------------------------------------------------
    def _on_state(self, state: str) -> None:
        self._gen += 1
        if state == KazooState.SUSPENDED:
            self._leading = None
            self._mailbox.put(Suspended())
        elif state == KazooState.LOST:
            self._leading = None
            self._mailbox.put(Lost())

    # -- the worker ----------------------------------------------------------------------
    def _reconcile(self) -> None:
        with self._lock:
            gen = self._gen
        session = self._client.client_id[0]
        if self._node is not None and self._node_session != session:
            self._node = None  # it died with the old session
        while True:
            if self._node is None:
                self._join(session)
            assert self._node is not None
            members = sorted_members(self._client.get_children(self._path))
            if self._node not in members:
                # Gone while our session lives (deleted by hand?): stand again.
                log.warning("zk_member_vanished", role=self.role, node=self._node)
                self._node = None
                continue
            index = members.index(self._node)
            if index == 0:
                self._claim(gen, member_epoch(self._node))
                return
            # Watch only our predecessor (no herd effect); if it is already gone, look again.
            predecessor = f"{self._path}/{members[index - 1]}"
            if self._client.exists(predecessor, watch=self._on_watch) is not None:
                return

    def _claim(self, gen: int, epoch: int) -> None:
        with self._lock:
            if self._closed or gen != self._gen or self._leading is not None:
                return  # the connection changed meanwhile: the next reconcile decides
            self._leading = epoch
            self._mailbox.put(Elected(epoch))
        log.info("zk_elected", role=self.role, member=self.member_id, epoch=epoch)

    def _join(self, session: int) -> None:
        self._client.ensure_path(self._path)
        if self._created_in == session:
            # A create in this session lost its reply: it may have made a member that
            # would lead unseen. Adopt it (ephemeralOwner is our session) instead.
            own = self._own_members(session)
            if own:
                self._node, self._node_session = own[0], session
                for extra in own[1:]:
                    self._client.delete(f"{self._path}/{extra}")
                self._created_in = None
                return
        data = json.dumps(
            {
                "role": self.role,
                "member_id": self.member_id,
                "endpoints": self.endpoints,
                "pid": os.getpid(),
                "host": socket.gethostname(),
            }
        ).encode()
        self._created_in = session
        path = self._client.create(
            f"{self._path}/{MEMBER_PREFIX}", data, ephemeral=True, sequence=True
        )
        self._created_in = None
        self._node, self._node_session = path.rsplit("/", 1)[1], session
        log.info("zk_joined", role=self.role, member=self.member_id, node=self._node)

    def _own_members(self, session: int) -> list[str]:
        own = []
        for name in sorted_members(self._client.get_children(self._path)):
            stat: ZnodeStat | None = self._client.exists(f"{self._path}/{name}")
            if stat is not None and stat.ephemeralOwner == session:
                own.append(name)
        return own


class ZooKeeperDetector(_ZkSession):
    """Follows who leads `role`; emits LeaderChanged when the (member, epoch) changes."""

    def __init__(
        self,
        hosts: str,
        role: str,
        *,
        session_timeout: float = 1.0,
        base_path: str = "/offerbus",
    ) -> None:
        super().__init__(hosts, session_timeout, f"zk-detector-{role}")
        self.role = role
        self._path = election_path(base_path, role)
        self._mailbox: Mailbox[LeaderChanged] = Mailbox()
        self._changed = threading.Condition(self._lock)
        self._leader: LeaderInfo | None = None

    def start(self) -> None:
        self._start_session()

    def fileno(self) -> int:
        return self._mailbox.fileno()

    def events(self) -> list[LeaderChanged]:
        return [] if self._closed else self._mailbox.drain()

    def leader(self) -> LeaderInfo | None:
        return self._leader

    def wait_for_leader(self, timeout: float) -> LeaderInfo | None:
        with self._changed:
            self._changed.wait_for(lambda: self._leader is not None or self._closed, timeout)
            return self._leader

    def close(self) -> None:
        self._stop_session()
        with self._changed:
            self._changed.notify_all()
        self._mailbox.close()

    def _reconcile(self) -> None:
        # The view survives SUSPENDED and LOST (the leader may well be fine); the
        # reconnect re-reads everything, since kazoo forgets watches on every drop.
        self._client.ensure_path(self._path)
        while True:
            members = sorted_members(self._client.get_children(self._path, watch=self._on_watch))
            if not members:
                self._set(None)
                return
            try:
                data, _ = self._client.get(f"{self._path}/{members[0]}")
            except NoNodeError:
                continue  # the leader left between the two reads
            self._set(self._parse(members[0], data))
            return

    def _parse(self, name: str, data: bytes) -> LeaderInfo:
        try:
            doc: dict[str, Any] = json.loads(data)
            endpoints = {str(k): str(v) for k, v in dict(doc.get("endpoints", {})).items()}
            member_id = str(doc["member_id"])
        except (ValueError, KeyError, TypeError):
            log.warning("zk_member_unreadable", role=self.role, node=name)
            endpoints, member_id = {}, name
        return LeaderInfo(self.role, member_id, member_epoch(name), endpoints)

    def _set(self, leader: LeaderInfo | None) -> None:
        with self._changed:
            if self._closed or _key(self._leader) == _key(leader):
                return
            self._leader = leader
            self._mailbox.put(LeaderChanged(leader))
            self._changed.notify_all()
        log.info(
            "zk_leader_changed",
            role=self.role,
            member=leader.member_id if leader else None,
            epoch=leader.epoch if leader else None,
        )
