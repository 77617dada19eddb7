"""The callback interface a framework implements (Mesos's `Scheduler`, every method a no-op
by default), and each callback as data: what the pure core asks the driver to invoke."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from schemas import common_pb2

if TYPE_CHECKING:
    from frameworks.sdk.driver import SchedulerDriver


@dataclass(frozen=True)
class MasterInfo:
    master_id: str
    epoch: int
    heartbeat_interval_ms: int


class Scheduler:
    """Subclass and override what you need. Callbacks may call the driver's methods
    (accept, decline, kill, ...): those are queued and run after the callback returns.
    A callback that raises is logged; for `update` the status is then NOT acknowledged, so
    the agent delivers it again."""

    def subscribed(
        self, driver: SchedulerDriver, framework_id: str, master_info: MasterInfo
    ) -> None:
        """Subscribed (or re-subscribed after a master failover or reconnect: same id)."""

    def offers(self, driver: SchedulerDriver, offers: list[common_pb2.Offer]) -> None:
        """New offers. Answer each with accept or decline; unanswered ones are rescinded."""

    def rescinded(self, driver: SchedulerDriver, offer_ids: list[str], reason: int) -> None:
        """These offers are gone (`reason` is a common_pb2.RescindReason)."""

    def update(self, driver: SchedulerDriver, status: common_pb2.TaskStatus) -> None:
        """A task status update. With implicit acknowledgements (the default) the driver
        acknowledges it after this returns; otherwise call driver.acknowledge(status)."""

    def failure(
        self, driver: SchedulerDriver, agent_id: str, executor_id: str, exit_status: int | None
    ) -> None:
        """An agent was lost (executor_id empty) or an executor exited (exit_status set)."""

    def accept_rejected(
        self, driver: SchedulerDriver, offer_ids: list[str], task_ids: list[str], reason: int,
        message: str,
    ) -> None:
        """An accept launched nothing (`reason` is a common_pb2.RejectReason); its tasks
        also get a terminal update. Refused by the master, or locally by the driver (e.g.
        an offer that is not outstanding)."""

    def refused(self, driver: SchedulerDriver, code: int, message: str) -> None:
        """The master refused one call (e.g. killing another framework's task, code
        UNAUTHORIZED). Not fatal: the driver stays subscribed."""

    def error(self, driver: SchedulerDriver, message: str) -> None:
        """Fatal for the framework (subscription refused, framework removed): the driver
        stops (without teardown) once this returns; calls made now are dropped."""

    def revoked(self, driver: SchedulerDriver, agent_id: str, task_ids: list[str],
                grace_s: float, message: str) -> None:
        """Revocation (fair sharing): this framework runs above its share and another one
        needs these tasks' resources on `agent_id`. The master kills them (TASK_KILLED,
        REASON_TASK_REVOKED) after `grace_s` unless the framework frees as much there first
        by killing tasks of its choice."""

    def disconnected(self, driver: SchedulerDriver) -> None:
        """Lost the master (or its subscription). Outstanding offers are void; the driver
        reconnects and re-subscribes by itself, then calls `subscribed` again."""


# -- callbacks as data (the core emits them; the driver invokes them in order) -------------


@dataclass(frozen=True)
class Subscribed:
    framework_id: str
    master_info: MasterInfo

    def invoke(self, scheduler: Scheduler, driver: SchedulerDriver) -> None:
        scheduler.subscribed(driver, self.framework_id, self.master_info)


@dataclass(frozen=True)
class Offers:
    offers: tuple[common_pb2.Offer, ...]

    def invoke(self, scheduler: Scheduler, driver: SchedulerDriver) -> None:
        scheduler.offers(driver, list(self.offers))


@dataclass(frozen=True)
class Rescinded:
    offer_ids: tuple[str, ...]
    reason: int

    def invoke(self, scheduler: Scheduler, driver: SchedulerDriver) -> None:
        scheduler.rescinded(driver, list(self.offer_ids), self.reason)


@dataclass(frozen=True)
class Update:
    status: common_pb2.TaskStatus
    auto_ack: bool  # acknowledge once the callback has returned normally

    def invoke(self, scheduler: Scheduler, driver: SchedulerDriver) -> None:
        scheduler.update(driver, self.status)


@dataclass(frozen=True)
class Failure:
    agent_id: str
    executor_id: str
    exit_status: int | None

    def invoke(self, scheduler: Scheduler, driver: SchedulerDriver) -> None:
        scheduler.failure(driver, self.agent_id, self.executor_id, self.exit_status)


@dataclass(frozen=True)
class AcceptRejected:
    offer_ids: tuple[str, ...]
    task_ids: tuple[str, ...]
    reason: int
    message: str

    def invoke(self, scheduler: Scheduler, driver: SchedulerDriver) -> None:
        scheduler.accept_rejected(driver, list(self.offer_ids), list(self.task_ids),
                                  self.reason, self.message)


@dataclass(frozen=True)
class Revoked:
    agent_id: str
    task_ids: tuple[str, ...]
    grace_s: float
    message: str

    def invoke(self, scheduler: Scheduler, driver: SchedulerDriver) -> None:
        scheduler.revoked(driver, self.agent_id, list(self.task_ids), self.grace_s,
                          self.message)


@dataclass(frozen=True)
class Refused:
    code: int
    message: str

    def invoke(self, scheduler: Scheduler, driver: SchedulerDriver) -> None:
        scheduler.refused(driver, self.code, self.message)


@dataclass(frozen=True)
class Error:
    message: str

    def invoke(self, scheduler: Scheduler, driver: SchedulerDriver) -> None:
        scheduler.error(driver, self.message)


@dataclass(frozen=True)
class Disconnected:
    def invoke(self, scheduler: Scheduler, driver: SchedulerDriver) -> None:
        scheduler.disconnected(driver)


Callback = (Subscribed | Offers | Rescinded | Update | Failure | AcceptRejected | Revoked
            | Refused | Error | Disconnected)
