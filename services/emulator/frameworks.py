"""The framework emulator: F frameworks in one process, each a real SchedulerDriver of the
SDK (frameworks/sdk) on its own thread, accepting a set fraction of its offers with set task
shapes and declining the rest with a filter, counting what its tasks did. `OfferPolicy` is
the pure decision (offers in, launches and declines out; the accept rate is kept exactly by
a running credit, no randomness); `EmulatedFramework` is the SDK's Scheduler around it.

One driver per framework (each with its own thread, reactor and connection) because that is
what the SDK offers and what a real framework is: the master, broker and allocator see F
independent frameworks. It scales to tens of frameworks per process; thousands would want
the SDK's pure SchedulerCore multiplexed on one reactor with bus channels (not done)."""

from __future__ import annotations

import json
import math
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from frameworks.sdk.driver import SchedulerDriver
from frameworks.sdk.scheduler import MasterInfo, Scheduler
from schemas import common_pb2
from services import tasks
from services.bus import codec
from services.bus.log import get_logger
from services.emulator.agents import RUN_LABEL
from services.resources import Resources
from services.shell.config import Option, common_fields
from services.shell.http import Response, json_response
from services.shell.process import main as run_service
from services.shell.service import ServiceConfig, ServiceKit

log = get_logger("emulator.frameworks")

REFUSE_S = 5.0  # a declined agent is not offered to the framework again for this long
RECONCILE_S = 5.0  # tasks launched before a re-subscription, unheard of since: asked this often
PROGRESS_S = 5.0  # progress logged this often


@dataclass(frozen=True)
class Shape:
    cpus: float = 0.1
    mem: float = 32.0
    run_s: float = math.inf  # inf: until killed

    def resources(self) -> Resources:
        return Resources.of(cpus=self.cpus, mem=self.mem)


@dataclass(frozen=True)
class Launch:
    offer_id: str
    tasks: tuple[common_pb2.TaskInfo, ...]


@dataclass(frozen=True)
class Decline:
    offer_ids: tuple[str, ...]
    refuse_s: float


class OfferPolicy:
    """Accepts `accept_rate` of the offers (a running credit: exactly that fraction over
    time), launching up to `tasks_per_offer` tasks of `shape` that fit, at most `max_tasks`
    in all (0: no limit; a task that ended without running, e.g. its accept voided by a
    disconnection, is replaced); declines the rest for `refuse_s`. It remembers the tasks
    it launched that nothing was heard of yet (`unseen`), and in which subscription
    (`generation`): after a master failover those of earlier ones are reconciled."""

    def __init__(self, name: str, shape: Shape, accept_rate: float, tasks_per_offer: int,
                 max_tasks: int = 0, refuse_s: float = REFUSE_S) -> None:
        if not 0 <= accept_rate <= 1:
            raise ValueError("the accept rate is a fraction in [0, 1]")
        self.name, self.shape, self.accept_rate = name, shape, accept_rate
        self.tasks_per_offer, self.max_tasks, self.refuse_s = tasks_per_offer, max_tasks, \
            refuse_s
        self._credit = 0.0
        self.launched = 0  # task ids handed out
        self.never_ran = 0  # of those, tasks that ended without running (replaced)
        self.generation = 0  # subscriptions after the first
        self.full = False  # offers were declined because every task is out: revive on a loss
        self.unseen: dict[str, tuple[str, int]] = {}  # task -> (agent, generation launched)

    def resubscribed(self) -> None:
        self.generation += 1

    def lost(self) -> bool:
        """A task ended without running: it is replaced. True when offers were declined
        (filtered for `refuse_s`) for want of room: the framework must revive them."""
        self.never_ran += 1
        revive, self.full = self.full, False
        return revive

    def stale(self) -> list[tuple[str, str]]:
        """(task, agent) of the tasks launched in an earlier subscription, unheard of since:
        their launch may have died with a master (the master answers what became of them)."""
        return sorted((t, a) for t, (a, g) in self.unseen.items() if g < self.generation)

    def offers(self, offers: Sequence[common_pb2.Offer]) -> list[Launch | Decline]:
        out: list[Launch | Decline] = []
        declined: list[str] = []
        need = self.shape.resources()
        for offer in offers:
            self._credit += self.accept_rate
            room = (self.max_tasks - self.launched + self.never_ran if self.max_tasks
                    else self.tasks_per_offer)
            if self._credit < 1 or room <= 0:
                self.full = self.full or room <= 0
                declined.append(offer.offer_id)
                continue
            self._credit -= 1
            free = Resources.from_proto(offer.resources)
            batch: list[common_pb2.TaskInfo] = []
            while len(batch) < min(room, self.tasks_per_offer) and free.contains(need):
                free = free - need
                batch.append(self._task(offer.agent_id))
            if batch:
                out.append(Launch(offer.offer_id, tuple(batch)))
            else:
                declined.append(offer.offer_id)  # too small for one task
        if declined:
            out.append(Decline(tuple(declined), self.refuse_s))
        return out

    def _task(self, agent_id: str) -> common_pb2.TaskInfo:
        self.launched += 1
        task_id = f"{self.name}-{self.launched}"
        self.unseen[task_id] = (agent_id, self.generation)
        t = common_pb2.TaskInfo(task_id=task_id, name=task_id, agent_id=agent_id)
        t.resources.extend(self.shape.resources().to_proto())
        t.command.value = "true"
        t.labels[RUN_LABEL] = str(self.shape.run_s) if math.isfinite(self.shape.run_s) \
            else "inf"
        return t


@dataclass
class EmulatedFramework(Scheduler):
    policy: OfferPolicy
    states: Counter[str] = field(default_factory=Counter)  # latest state -> tasks
    latest: dict[str, tasks.State] = field(default_factory=dict)  # live task -> its state
    lock: threading.Lock = field(default_factory=threading.Lock)
    clock: Callable[[], float] = time.monotonic
    reconciled_at: float = -math.inf
    subscriptions: int = 0

    def subscribed(self, driver: SchedulerDriver, framework_id: str,
                   master_info: MasterInfo) -> None:
        log.info("framework subscribed", name=self.policy.name, framework_id=framework_id,
                 master=master_info.master_id, epoch=master_info.epoch)
        with self.lock:
            self.subscriptions += 1
            if self.subscriptions > 1:
                self.policy.resubscribed()
                self.reconciled_at = -math.inf
        self._reconcile(driver)

    def offers(self, driver: SchedulerDriver, offers: list[common_pb2.Offer]) -> None:
        with self.lock:
            decisions = self.policy.offers(offers)
        for d in decisions:
            if isinstance(d, Launch):
                op = common_pb2.Operation()
                op.launch.tasks.extend(d.tasks)
                driver.accept([d.offer_id], [op])
            else:
                driver.decline(list(d.offer_ids), refuse_seconds=d.refuse_s)
        self._reconcile(driver)

    def accept_rejected(self, driver: SchedulerDriver, offer_ids: list[str],
                        task_ids: list[str], reason: int, message: str) -> None:
        """Whether those tasks run is the master's word (the broker may have given up on a
        launch a failed master never answered): ask it rather than launch them again."""
        with self.lock:
            ask = [(t, self.policy.unseen[t][0]) for t in task_ids if t in self.policy.unseen]
        if ask:
            driver.reconcile(ask)

    def _reconcile(self, driver: SchedulerDriver) -> None:
        """Tasks launched before the latest subscription and unheard of since, at most every
        RECONCILE_S (the master keeps silent on a task while its agent may re-register)."""
        now = self.clock()
        with self.lock:
            if now - self.reconciled_at < RECONCILE_S:
                return
            # Looked for at most every RECONCILE_S, found or not (a look walks every task
            # not yet heard of: thousands while a large launch is under way).
            self.reconciled_at = now
            stale = self.policy.stale()
        if stale:
            log.info("reconciling", name=self.policy.name, tasks=len(stale))
            driver.reconcile(stale)

    def update(self, driver: SchedulerDriver, status: common_pb2.TaskStatus) -> None:
        state = tasks.name(status.state)
        revive = False
        with self.lock:
            old = self.latest.pop(status.task_id, None)
            fresh = self.policy.unseen.pop(status.task_id, None) is not None
            if old is not None:
                self.states[tasks.name(old)] -= 1
            # TASK_UNKNOWN: the master's answer for a task it does not know: it is not running.
            if tasks.is_terminal(status.state) or status.state == tasks.UNKNOWN:
                if old is None and not fresh:
                    return  # an end already counted, told again (reconciliation)
                self.states["ended"] += 1
                self.states[f"ended_{state}"] += 1
                ran = old in (tasks.RUNNING, tasks.KILLING, tasks.UNREACHABLE)
                if not ran and status.state != tasks.FINISHED:
                    revive = self.policy.lost()
            else:
                self.latest[status.task_id] = status.state
                self.states[state] += 1
        if revive and driver is not None:
            driver.revive()

    def summary(self) -> dict[str, int]:
        with self.lock:
            return {"launched": self.policy.launched,
                    **{k: v for k, v in sorted(self.states.items()) if v}}


@dataclass
class FrameworksConfig(ServiceConfig):
    cluster_url: str
    count: int = 1
    shape: Shape = field(default_factory=Shape)
    accept_rate: float = 1.0
    tasks_per_offer: int = 1
    max_tasks: int = 0
    refuse_s: float = REFUSE_S
    role: str = "*"
    prefix: str = "emu-fw"


class FrameworksShell(ServiceKit):
    """The process: F drivers on their threads; /state, /metrics and a progress log on the
    kit's reactor."""

    def __init__(self, config: FrameworksConfig) -> None:
        super().__init__("emulator_frameworks", config.prefix,
                         codec.Role.Value("ROLE_FRAMEWORK"), config)
        self.config = config
        self.frameworks: list[tuple[EmulatedFramework, SchedulerDriver]] = []
        for i in range(config.count):
            name = f"{config.prefix}-{i}"
            sched = EmulatedFramework(OfferPolicy(name, config.shape, config.accept_rate,
                                                  config.tasks_per_offer, config.max_tasks,
                                                  config.refuse_s))
            info = common_pb2.FrameworkInfo(name=name, role=config.role, principal=name,
                                            failover_timeout_s=60.0)
            info.capabilities.append(common_pb2.FrameworkInfo.CAPABILITY_PARTITION_AWARE)
            self.frameworks.append((sched, SchedulerDriver(sched, info, config.cluster_url)))
        http = self.start_http({"/state": self._http_state})
        self.metrics.labelled_gauge("tasks", "Tasks of the emulated frameworks by latest "
                                    "state (ended_* count those that ended).", "state",
                                    lambda: {k: float(v) for k, v in self.totals().items()})
        self.reactor.every(PROGRESS_S, self._progress)
        for _, driver in self.frameworks:
            driver.start()
        log.info("framework emulator started", frameworks=config.count,
                 accept_rate=config.accept_rate, tasks_per_offer=config.tasks_per_offer,
                 cpus=config.shape.cpus, mem=config.shape.mem, run_s=config.shape.run_s,
                 http=http.url)

    def totals(self) -> Counter[str]:
        total: Counter[str] = Counter()
        for sched, _ in self.frameworks:
            total.update(sched.summary())
        return total

    def _progress(self) -> None:
        log.info("frameworks progress", **dict(sorted(self.totals().items())))

    def health(self) -> dict[str, Any]:
        return {"frameworks": len(self.frameworks),
                "subscribed": sum(bool(d.framework_id) for _, d in self.frameworks)}

    def _http_state(self, query: dict[str, list[str]]) -> Response:
        body = {"totals": dict(self.totals()),
                "frameworks": {s.policy.name: {"framework_id": d.framework_id, **s.summary()}
                               for s, d in self.frameworks}}
        return json_response(json.dumps(body, sort_keys=True).encode())

    def close(self, linger_ms: int = 0) -> None:
        for _, driver in self.frameworks:
            driver.stop(failover=False)
        for _, driver in self.frameworks:
            driver.join(5)
        super().close(linger_ms)


OPTIONS = (
    Option("count", int, 1, "frameworks", minimum=1, maximum=1000),
    Option("task_cpus", float, 0.1, "cpus of each task", minimum=0.001),
    Option("task_mem", float, 32.0, "memory (MiB) of each task", minimum=1),
    Option("task_run_s", float, -1.0, "seconds each task runs (a label the agent emulator "
           "reads); negative: until killed"),
    Option("accept_rate", float, 1.0, "fraction of offers accepted", minimum=0, maximum=1),
    Option("tasks_per_offer", int, 1, "tasks launched on an accepted offer (as many as fit, "
           "up to this)", minimum=1, maximum=10_000),
    Option("max_tasks", int, 0, "tasks each framework launches in all (0: no limit)",
           minimum=0),
    Option("refuse_s", float, REFUSE_S, "seconds a declined agent is filtered", minimum=0),
    Option("role", default="*", help="the frameworks' role"),
    Option("prefix", default="emu-fw", help="frameworks are named PREFIX-0, PREFIX-1, ..."),
)


def build(v: dict[str, Any]) -> FrameworksShell:
    run_s = v["task_run_s"]
    return FrameworksShell(FrameworksConfig(
        cluster_url=v["cluster"], count=v["count"],
        shape=Shape(v["task_cpus"], v["task_mem"], run_s if run_s >= 0 else math.inf),
        accept_rate=v["accept_rate"], tasks_per_offer=v["tasks_per_offer"],
        max_tasks=v["max_tasks"], refuse_s=v["refuse_s"], role=v["role"],
        prefix=v["prefix"], **common_fields(v)))


def main(argv: Sequence[str] | None = None) -> int:
    return run_service("emulator_frameworks", OPTIONS, build,
                       list(sys.argv[1:] if argv is None else argv),
                       "The framework emulator: F frameworks accepting a set fraction of "
                       "their offers with set task shapes.",
                       lambda shell: {"id": shell.member_id})
