"""A standby master's following of the leading master's state stream: the leader's agent
and task records, kept so that once elected this master's core holds them (`followed`, see
`held` in state.py): its stream starts with them, and a re-registered task comes back as
the leader had it. The copy followed is also its stream's base: a subscriber that holds the
same copy resyncs with only what differs (PublisherCore.successor)."""

from __future__ import annotations

from collections.abc import Callable

import zmq

from services.bus import codec
from services.bus.curve import CurveClient
from services.bus.election import LeaderChanged, LeaderInfo, detector_from_url
from services.bus.epoch import EpochFence
from services.bus.log import get_logger
from services.bus.peer import Sender
from services.bus.reactor import Reactor
from services.bus.statestream import StateSubscriber
from services.bus.stats import Stats
from services.bus.stream_core import Changed, StreamCopy
from services.master.followed import KINDS, Followed

log = get_logger("master")
MASTER = codec.Role.Value("ROLE_MASTER")


class Follower:
    """Follows whoever leads the master role, unless it is this master (`member_id`) or
    `leading()` says this master leads; `take()` ends the following with what it holds."""

    def __init__(self, reactor: Reactor, ctx: zmq.Context[zmq.Socket[bytes]],
                 sender: Sender, election_url: str, member_id: str,
                 leading: Callable[[], bool], *, heartbeat_interval: float, max_missed: int,
                 stats: Stats, curve: CurveClient | None, off: str = "") -> None:
        """`off`: why this master cannot follow (it then leads a failover as before: from
        the agents' re-registrations alone), logged once."""
        self.reactor, self.ctx, self.sender = reactor, ctx, sender
        self.member_id = member_id
        self.leading = leading
        self.heartbeat_interval, self.max_missed = heartbeat_interval, max_missed
        self.stats, self.curve = stats, curve
        self.off = off
        if off:
            log.warning("this master will not follow the leading master's stream", why=off)
        self.fence = EpochFence(frozenset({MASTER}))
        self.leader: LeaderInfo | None = None
        self.subscriber: StateSubscriber | None = None
        self.index = Followed()  # the agent and task entries of `subscriber`'s store
        self.detector = detector_from_url(election_url, "master")
        reactor.add_reader(self.detector, self._on_detector)
        self.detector.start()

    @property
    def held(self) -> int:
        """Entries held now (read from an HTTP thread: a dict's len)."""
        sub = self.subscriber
        return len(sub.store) if sub is not None else 0

    def _on_detector(self) -> None:
        for event in self.detector.events():
            if isinstance(event, LeaderChanged):
                self.leader = event.leader
                self.fence.follow(MASTER, event.leader)
                self.follow()

    def follow(self) -> None:
        """Follow the leading master's task records, if another master leads."""
        leader = self.leader
        if self.off or self.leading() or leader is None or leader.member_id == self.member_id:
            return
        pub, snapshot = leader.endpoints.get("pub"), leader.endpoints.get("snapshot")
        if not pub or not snapshot:
            log.warning("the leading master advertises no state stream",
                        leader=leader.member_id, endpoints=leader.endpoints)
            return
        if self.subscriber is None:
            self.subscriber = StateSubscriber(
                self.reactor, self.ctx, self.sender, self._changed,
                heartbeat_interval=self.heartbeat_interval, max_missed=self.max_missed,
                stats=self.stats, fence=self.fence, curve=self.curve, keep_recent=True)
        self.subscriber.connect(pub, snapshot)
        log.info("following the leading master", leader=leader.member_id, epoch=leader.epoch)

    def _changed(self, change: Changed) -> None:
        """Index the agent and task entries as they change (the store is the copy's)."""
        sub = self.subscriber
        if change.reset and sub is not None:
            self.index.reset(e for k, e in sub.store.items() if k.startswith(KINDS))
        else:
            self.index.apply(e for e in change.entries if e.key.startswith(KINDS))

    def take(self) -> tuple[Followed, StreamCopy | None]:
        """The agent and task entries followed (indexed: the caller owns them now), and the
        copy of the stream they are part of (none if no whole snapshot came); no more
        following until `follow()`."""
        sub, self.subscriber = self.subscriber, None
        index, self.index = self.index, Followed()
        if sub is None:
            return Followed(), None
        sub.close()
        copy = sub.core.copy()  # as of its position (even while resyncing)
        if copy is None:  # never had a whole snapshot: a part could mislead
            return Followed(), None
        return index, copy

    def close(self) -> None:
        self.reactor.remove_reader(self.detector)
        self.detector.close()
        self.take()
