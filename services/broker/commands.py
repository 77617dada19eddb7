"""The offer-broker's records and commands: an Offer, what the core asks its shell to send
(SendOffers, Rescind, AcceptRejected, LaunchRequest, RecoverResources), the Verdict of an
ACCEPT/DECLINE for the shell's span, and `coalesce`, which batches one drain's commands.

Commands are small frozen dataclasses, each with `to_proto()` giving the InternalMessage to
send. A core also returns `services.notice.Notice`s among its commands: they are not sent,
the shell logs, counts and traces them.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass

from schemas import common_pb2, internal_pb2, scheduler_pb2
from services.notice import Notice
from services.resources import Resources

Recover = internal_pb2.InternalMessage.RecoverResources


@dataclass(frozen=True)
class Offer:
    offer_id: str
    framework_id: str
    agent_id: str
    hostname: str
    resources: Resources
    role: str
    created_at: float
    expires_at: float  # math.inf = never
    allocation_id: str = ""
    traceparent: str = ""  # the allocation's trace context (the shell sends its offer span's)
    attributes: tuple[common_pb2.Attribute, ...] = ()
    master_epoch: int | None = None  # the master that relays it (None: none led)
    revocable: bool = False  # beyond its framework's guaranteed share (revocable.py)

    def to_proto(self) -> common_pb2.Offer:
        return common_pb2.Offer(
            offer_id=self.offer_id, framework_id=self.framework_id, agent_id=self.agent_id,
            hostname=self.hostname, resources=self.resources.to_proto(),
            attributes=self.attributes,
            expires_at_us=0 if math.isinf(self.expires_at) else int(self.expires_at * 1e6),
            allocation_id=self.allocation_id, traceparent=self.traceparent,
            revocable=self.revocable)



def _framework_event(framework_id: str, event: scheduler_pb2.SchedulerEvent,
                     end_tasks: bool = False) -> internal_pb2.InternalMessage:
    return internal_pb2.InternalMessage(
        framework_event=internal_pb2.InternalMessage.FrameworkEvent(
            framework_id=framework_id, event=event, end_tasks=end_tasks))


@dataclass(frozen=True)
class SendOffers:
    """To the framework through the master: new offers (one command per framework)."""

    framework_id: str
    offers: tuple[Offer, ...]

    def to_proto(self) -> internal_pb2.InternalMessage:
        ev = scheduler_pb2.SchedulerEvent(offers=scheduler_pb2.SchedulerEvent.Offers(
            offers=[o.to_proto() for o in self.offers]))
        return _framework_event(self.framework_id, ev)

    def to_protos(self, max_bytes: int) -> list[internal_pb2.InternalMessage]:
        """The offers, in order, in as few messages as stay within `max_bytes` each (one
        unless they are more than a frame holds: 10,000 agents offered to one framework)."""
        out: list[internal_pb2.InternalMessage] = []
        batch: list[common_pb2.Offer] = []
        size = 0
        for offer in self.offers:
            proto = offer.to_proto()
            n = proto.ByteSize() + 8  # the field's tag and length
            if batch and size + n > max_bytes - 256:  # (the message around them)
                out.append(self._message(batch))
                batch, size = [], 0
            batch.append(proto)
            size += n
        if batch:
            out.append(self._message(batch))
        return out

    def _message(self, offers: list[common_pb2.Offer]) -> internal_pb2.InternalMessage:
        return _framework_event(self.framework_id, scheduler_pb2.SchedulerEvent(
            offers=scheduler_pb2.SchedulerEvent.Offers(offers=offers)))


@dataclass(frozen=True)
class Rescind:
    """To the framework through the master: these offers are gone."""

    framework_id: str
    offer_ids: tuple[str, ...]
    reason: int  # RescindReason
    message: str = ""

    def to_proto(self) -> internal_pb2.InternalMessage:
        ev = scheduler_pb2.SchedulerEvent(rescind=scheduler_pb2.SchedulerEvent.Rescind(
            offer_ids=self.offer_ids, reason=self.reason, message=self.message))  # type: ignore[arg-type]
        return _framework_event(self.framework_id, ev)


@dataclass(frozen=True)
class AcceptRejected:
    """To the framework through the master: its ACCEPT launched nothing, and why.
    `refused_here`: the broker refused it (nothing left it), so the master ends its tasks."""

    framework_id: str
    offer_ids: tuple[str, ...]
    task_ids: tuple[str, ...]
    reason: int  # RejectReason
    message: str
    refused_here: bool = False

    def to_proto(self) -> internal_pb2.InternalMessage:
        ev = scheduler_pb2.SchedulerEvent(
            accept_rejected=scheduler_pb2.SchedulerEvent.AcceptRejected(
                offer_ids=self.offer_ids, task_ids=self.task_ids,
                reason=self.reason, message=self.message))  # type: ignore[arg-type]
        return _framework_event(self.framework_id, ev, self.refused_here)


@dataclass(frozen=True)
class LaunchRequest:
    """To the master: a validated ACCEPT. `traceparents` are its offers' (their allocations'
    trace contexts), for span links; the envelope carries the validate span's."""

    request_id: str
    framework_id: str
    agent_id: str
    offer_ids: tuple[str, ...]
    operations: tuple[common_pb2.Operation, ...]
    traceparents: tuple[str, ...] = ()

    def to_proto(self) -> internal_pb2.InternalMessage:
        return internal_pb2.InternalMessage(
            launch_request=internal_pb2.InternalMessage.LaunchRequest(
                request_id=self.request_id, framework_id=self.framework_id,
                agent_id=self.agent_id, offer_ids=self.offer_ids, operations=self.operations))


@dataclass(frozen=True)
class Recovery:
    framework_id: str
    agent_id: str
    resources: Resources
    reason: int  # RecoverResources.Reason
    refuse_seconds: float = 0.0  # resolved: 0 = no filter
    offer_id: str = ""
    allocation_id: str = ""
    task_ids: tuple[str, ...] = ()

    def to_proto(self) -> Recover.Recovery:
        return Recover.Recovery(
            framework_id=self.framework_id, agent_id=self.agent_id,
            resources=self.resources.to_proto(), reason=self.reason,  # type: ignore[arg-type]
            filters=common_pb2.Filters(refuse_seconds=self.refuse_seconds),
            offer_id=self.offer_id, allocation_id=self.allocation_id, task_ids=self.task_ids)


@dataclass(frozen=True)
class RecoverResources:
    """To the allocator: resources no longer offered (one command per step)."""

    recoveries: tuple[Recovery, ...]

    def to_proto(self) -> internal_pb2.InternalMessage:
        return internal_pb2.InternalMessage(
            recover_resources=Recover(recoveries=[r.to_proto() for r in self.recoveries]))


@dataclass(frozen=True)
class Verdict:
    """What the core made of one ACCEPT or DECLINE: the facts the shell copies onto its
    validate span, the LaunchRequest it became (if any), and the offers it used up."""

    valid: bool
    failed_check: str = ""  # "offer_unknown", "resources_exceeded", "offer_not_outstanding", ...
    reason: str = ""  # what failed; for a valid DECLINE, the framework's own reason
    request_id: str = ""
    used: tuple[str, ...] = ()
    task_ids: tuple[str, ...] = ()  # an ACCEPT's tasks
    refuse_seconds: float | None = None  # the filter a DECLINE installs


Command = SendOffers | Rescind | AcceptRejected | LaunchRequest | RecoverResources | Notice


@dataclass(frozen=True)
class Decision:
    """An ACCEPT's or DECLINE's commands, and its verdict."""

    commands: list[Command]
    verdict: Verdict


def coalesce(commands: Iterable[Command]) -> list[Command]:
    """Batch the commands of several steps (a shell's drain): one SendOffers per framework,
    one Rescind per (framework, reason), one RecoverResources. An offer both sent and
    rescinded within the batch is never shown to its framework (its Recovery stays)."""
    cmds = list(commands)
    sent = {o.offer_id for c in cmds if isinstance(c, SendOffers) for o in c.offers}
    rescinded = {i for c in cmds if isinstance(c, Rescind) for i in c.offer_ids}
    unseen = sent & rescinded
    offers: dict[str, list[Offer]] = {}
    rescinds: dict[tuple[str, int], tuple[list[str], str]] = {}
    recoveries: list[Recovery] = []
    launches: list[Command] = []
    rejects: list[Command] = []
    notices: list[Command] = []
    for c in cmds:
        if isinstance(c, SendOffers):
            offers.setdefault(c.framework_id, []).extend(
                o for o in c.offers if o.offer_id not in unseen)
        elif isinstance(c, Rescind):
            ids, _msg = rescinds.setdefault((c.framework_id, c.reason), ([], c.message))
            ids.extend(i for i in c.offer_ids if i not in unseen)
        elif isinstance(c, RecoverResources):
            recoveries.extend(c.recoveries)
        elif isinstance(c, LaunchRequest):
            launches.append(c)
        elif isinstance(c, AcceptRejected):
            rejects.append(c)
        else:
            notices.append(c)
    out: list[Command] = [*launches]
    out += [Rescind(fw, tuple(ids), reason, msg)
            for (fw, reason), (ids, msg) in rescinds.items() if ids]
    out += rejects
    out += [SendOffers(fw, tuple(os)) for fw, os in offers.items() if os]
    if recoveries:
        out.append(RecoverResources(tuple(recoveries)))
    return out + notices

