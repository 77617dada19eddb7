"""The offer-broker's table of offers: each offer's state, the one transition table its
states follow (an illegal move raises), the indices by agent and framework, what is
outstanding per agent, the expiry heap, and a bounded history of ended offers (to say
"expired" rather than "unknown"). Pure; the core is its only writer."""

from __future__ import annotations

import enum
import heapq
import math
from collections import OrderedDict
from dataclasses import dataclass, field

from services.broker.commands import Offer
from services.broker.validation import overlap
from services.resources import Resources

HISTORY_SIZE = 65536  # ended offers remembered


class IllegalTransition(Exception):
    """A bug: the core asked to move an offer along an edge the lifecycle does not have."""


class OfferState(enum.Enum):
    OFFERED = "offered"  # outstanding at its framework
    LAUNCHING = "launching"  # used by a valid ACCEPT; its LaunchRequest awaits the master
    # Terminal: the offer has left the table.
    LAUNCHED = "launched"  # the master launched it
    LAUNCH_FAILED = "launch failed"  # the master refused the launch
    ACCEPTED = "accepted"  # used by a valid ACCEPT with no operations
    DECLINED = "declined"
    EXPIRED = "expired"
    RESCINDED = "rescinded"
    REJECTED = "used by a rejected accept"
    ABANDONED = "abandoned"  # launching when the table was dropped (rescind_all)


TRANSITIONS: dict[OfferState, frozenset[OfferState]] = {
    OfferState.OFFERED: frozenset({
        OfferState.LAUNCHING, OfferState.ACCEPTED, OfferState.DECLINED, OfferState.EXPIRED,
        OfferState.RESCINDED, OfferState.REJECTED,
    }),
    OfferState.LAUNCHING: frozenset({
        OfferState.LAUNCHED, OfferState.LAUNCH_FAILED, OfferState.ABANDONED,
    }),
}
LIVE_STATES = frozenset(TRANSITIONS)


@dataclass
class OfferTable:
    history_size: int = HISTORY_SIZE
    offers: dict[str, Offer] = field(default_factory=dict)  # live: OFFERED or LAUNCHING
    states: dict[str, OfferState] = field(default_factory=dict)
    history: OrderedDict[str, OfferState] = field(default_factory=OrderedDict)
    by_agent: dict[str, set[str]] = field(default_factory=dict)  # OFFERED only
    by_framework: dict[str, set[str]] = field(default_factory=dict)  # OFFERED only
    _outstanding: dict[str, Resources] = field(default_factory=dict)  # per agent, OFFERED
    live_allocations: set[str] = field(default_factory=set)  # of OFFERED offers
    _expiry: list[tuple[float, str]] = field(default_factory=list)  # heap, lazy deletion

    # -- views -------------------------------------------------------------------------
    def state(self, offer_id: str) -> OfferState | None:
        return self.states.get(offer_id) or self.history.get(offer_id)

    def offered_to(self, offer_id: str, framework_id: str) -> bool:
        return (self.states.get(offer_id) is OfferState.OFFERED
                and self.offers[offer_id].framework_id == framework_id)

    def offered_ids(self) -> list[str]:
        return [i for ids in self.by_framework.values() for i in ids]

    def outstanding_offers(self) -> list[Offer]:
        return [self.offers[i] for i, s in self.states.items() if s is OfferState.OFFERED]

    def outstanding(self, agent_id: str) -> Resources:
        return self._outstanding.get(agent_id, Resources())

    def next_expiry(self) -> float | None:
        while self._expiry and self.states.get(self._expiry[0][1]) is not OfferState.OFFERED:
            heapq.heappop(self._expiry)
        return self._expiry[0][0] if self._expiry else None

    def expired(self, now: float) -> list[str]:
        """The outstanding offers whose time is up by `now` (expires_at <= now)."""
        due = []
        while self._expiry and self._expiry[0][0] <= now:
            _, oid = heapq.heappop(self._expiry)
            if self.states.get(oid) is OfferState.OFFERED:
                due.append(oid)
        return due

    def why_not_live(self, offer_id: str, framework_id: str) -> str:
        st = self.state(offer_id)
        if st is None:
            return "is unknown (never made by this broker, or long gone)"
        if st in LIVE_STATES and self.offers[offer_id].framework_id != framework_id:
            return "is not an offer of this framework"
        if st is OfferState.LAUNCHING:
            return "was already used by another accept"
        return f"is no longer outstanding ({st.value})"

    # -- the one place offers change state ---------------------------------------------
    def create(self, offer: Offer) -> None:
        if offer.offer_id in self.states or offer.offer_id in self.history:
            raise IllegalTransition(f"offer {offer.offer_id} created twice")
        self.offers[offer.offer_id] = offer
        self.states[offer.offer_id] = OfferState.OFFERED
        self.by_agent.setdefault(offer.agent_id, set()).add(offer.offer_id)
        self.by_framework.setdefault(offer.framework_id, set()).add(offer.offer_id)
        self._outstanding[offer.agent_id] = self.outstanding(offer.agent_id) + offer.resources
        if offer.allocation_id:
            self.live_allocations.add(offer.allocation_id)
        if not math.isinf(offer.expires_at):
            heapq.heappush(self._expiry, (offer.expires_at, offer.offer_id))

    def move(self, offer_id: str, to: OfferState) -> Offer:
        cur = self.state(offer_id)
        if cur is None or to not in TRANSITIONS.get(cur, frozenset()):
            raise IllegalTransition(f"offer {offer_id}: {cur} -> {to}")
        offer = self.offers[offer_id]
        if cur is OfferState.OFFERED:
            for index, key in ((self.by_agent, offer.agent_id),
                               (self.by_framework, offer.framework_id)):
                index[key].discard(offer_id)
                if not index[key]:
                    del index[key]
            left = self._outstanding[offer.agent_id] - offer.resources
            if left:
                self._outstanding[offer.agent_id] = left
            else:
                del self._outstanding[offer.agent_id]
            self.live_allocations.discard(offer.allocation_id)
        if to in LIVE_STATES:
            self.states[offer_id] = to
        else:
            del self.offers[offer_id], self.states[offer_id]
            self.history[offer_id] = to
            while len(self.history) > self.history_size:
                self.history.popitem(last=False)
        return offer

    def forget_expiry(self) -> None:
        self._expiry.clear()

    # -- invariants --------------------------------------------------------------------
    def validate(self) -> None:
        assert self.offers.keys() == self.states.keys()
        assert not self.offers.keys() & self.history.keys(), "an offer in two states"
        assert all(s in LIVE_STATES for s in self.states.values())
        assert all(s not in LIVE_STATES for s in self.history.values())
        assert len(self.history) <= self.history_size
        offered = {i for i, s in self.states.items() if s is OfferState.OFFERED}
        assert offered == {i for ids in self.by_agent.values() for i in ids}
        assert offered == set(self.offered_ids())
        for agent_id, ids in self.by_agent.items():
            assert all(self.offers[i].agent_id == agent_id for i in ids)
            total = Resources.total(self.offers[i].resources for i in ids)
            have = self._outstanding[agent_id]
            assert total.contains(have) and have.contains(total), (agent_id, total, have)
            seen = Resources()
            for i in sorted(ids):
                assert not overlap(seen, self.offers[i].resources), f"{i}: port offered twice"
                seen += self.offers[i].resources
        assert self._outstanding.keys() == self.by_agent.keys()
        for fw, ids in self.by_framework.items():
            assert all(self.offers[i].framework_id == fw for i in ids)
        assert self.live_allocations == {
            self.offers[i].allocation_id for i in offered if self.offers[i].allocation_id}
        expiring = {i for _, i in self._expiry}
        assert all(i in expiring for i in offered if not math.isinf(self.offers[i].expires_at))
