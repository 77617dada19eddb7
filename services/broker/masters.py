"""What the leading master's comings and goings mean for the broker's offers (a mixin of
BrokerCore, services/broker/core.py): another master leads, the link to it broke and is
back, offers the shell could not send to it. Launches in flight are launches.py's."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING

from schemas import common_pb2
from services.broker.commands import Command, coalesce
from services.broker.table import OfferState
from services.notice import Notice

if TYPE_CHECKING:
    from services.broker.launches import LaunchTracker
    from services.broker.table import OfferTable

RescindReason = common_pb2.RescindReason


class MasterEvents:
    if TYPE_CHECKING:  # BrokerCore's
        table: OfferTable
        _launches: LaunchTracker

        def _due(self, now: float) -> list[Command]: ...

        def _resolve_launches(self, now: float) -> list[Command]: ...

        def _rescind(self, offer_ids: Sequence[str], reason: int, message: str,
                     recover: bool, to: OfferState = OfferState.RESCINDED,
                     tell: bool = True) -> list[Command]: ...

    def master_changed(self, epoch: int | None, now: float) -> list[Command]:
        """Another master leads (None: none is known). Launches sent to the old one will
        not be answered: they wait for the new master's stream (see launches.py). Offers
        another master relayed are void (see the module comment): rescinded, recovered.
        While none leads they stay: the same master may come back, connections intact."""
        out = self._due(now)
        if epoch is not None:
            out += self._void([oid for oid in self.table.offered_ids()
                               if self.table.offers[oid].master_epoch != epoch],
                              f"relayed by another master than epoch {epoch}", epoch)
        orphaned = self._launches.master_changed(epoch, now)
        if orphaned:
            out.append(Notice.of(
                "launches_orphaned", f"the master changed with {orphaned} launches "
                "unanswered: they count as launched once their tasks are on the stream",
                launches=orphaned, master_epoch=epoch or 0))
        out += self._resolve_launches(now)
        return coalesce(out)

    def master_link_reset(self, now: float) -> list[Command]:
        """The connection to the leading master broke and is made again: offers queued on
        it or in flight were lost, and which reached their frameworks nobody can tell. Every
        outstanding offer is rescinded and recovered, unfiltered, as for a new master."""
        return coalesce(self._due(now) + self._void(
            self.table.offered_ids(), "relayed over a link to the master that broke",
            self._launches.master_epoch or 0))

    def offers_undelivered(self, offer_ids: Iterable[str], now: float) -> list[Command]:
        """The shell could not hand these offers to the master (no connection, its queue
        full): no framework saw them. Back to the allocator at once, with no Rescind."""
        out = self._due(now)
        ids = [oid for oid in offer_ids if self.table.states.get(oid) is OfferState.OFFERED]
        if ids:
            out += self._rescind(ids, 0, "", recover=True, tell=False)
            out.append(Notice.of("offers_undelivered", f"{len(ids)} offers could not be sent "
                                 "to the master: recovered", offers=len(ids)))
        return coalesce(out)

    def _void(self, offer_ids: Iterable[str], why: str, epoch: int) -> list[Command]:
        ids = sorted(offer_ids)
        if not ids:
            return []
        return [*self._rescind(ids, RescindReason.RESCIND_REASON_FRAMEWORK_INACTIVE,
                               f"offer {why}", recover=True),
                Notice.of("offers_voided", f"{len(ids)} offers {why}: rescinded and recovered",
                          offers=len(ids), master_epoch=epoch)]
