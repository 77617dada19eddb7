"""The chaos campaign's workload: one framework (on frameworks/sdk) keeping M long-running
containers ("svc-<slot>-<generation>", relaunched when one ends) and launching a stream of
short tasks ("short-<n>-x<code>") whose command exits with a code the task id names, so what
the framework received can be checked against what the executor must have reported
(exit 0 -> TASK_FINISHED "exited with 0"; exit k -> TASK_FAILED "exited with k").

Everything is recorded with time.monotonic() (the campaign's one clock)."""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field

from frameworks.sdk.driver import SchedulerDriver
from frameworks.sdk.scheduler import MasterInfo, Scheduler
from schemas import common_pb2
from services import tasks as ts
from services.resources import Resources

IMAGE = "offerbus/busybox:latest"
SHORT_CODES = (0, 1, 2)  # short task n exits with SHORT_CODES[n % 3]
SHORT_SECONDS = 0.5  # how long a short task sleeps before exiting
SHORT_CONCURRENT = 4  # short tasks in flight at most
UNREACHABLE_GRACE_S = 20.0  # an unreachable service task is replaced after this long
RECONCILE_S = 3.0  # a task staging this long is reconciled (an accept lost in a failover)
REFUSE_S = 0.3  # unused offers are declined for this long, so offers keep flowing
MAX_SHORT = 100_000  # short tasks a campaign launches at most (its records stay bounded)


@dataclass
class Workload:
    """The framework's record of what it launched and heard (guarded by `lock`)."""

    instances: int = 3
    short_interval: float = 1.0  # seconds between short-task launches (0: none)
    lock: threading.Lock = field(default_factory=threading.Lock)
    slots: dict[int, str] = field(default_factory=dict)  # slot -> its current task id
    generation: dict[int, int] = field(default_factory=dict)
    states: dict[str, int] = field(default_factory=dict)  # task id -> latest state
    # task id -> (time, state, message, from reconciliation, reason and source names)
    history: dict[str, list[tuple[float, int, str, bool, str]]] = field(default_factory=dict)
    launched_at: dict[str, float] = field(default_factory=dict)
    where: dict[str, str] = field(default_factory=dict)  # task id -> agent hostname
    agent_of: dict[str, str] = field(default_factory=dict)  # task id -> agent id
    executor_of: dict[str, str] = field(default_factory=dict)  # task id -> executor id
    # Tasks whose executor a fault killed: they end, and must be told so (any terminal state)
    excused: set[str] = field(default_factory=set)
    last_reconcile: float = 0.0
    unreachable_since: dict[str, float] = field(default_factory=dict)
    offers_at: dict[str, float] = field(default_factory=dict)  # hostname -> last offer
    offer_times: list[float] = field(default_factory=list)
    subscriptions: list[tuple[float, int]] = field(default_factory=list)
    killed_by_us: set[str] = field(default_factory=set)
    short_next: int = 0
    last_short: float = 0.0
    running: bool = True  # False: launch nothing more (the campaign drains)
    totals: dict[str, Resources] = field(default_factory=dict)  # agent hostname -> total
    violations: list[dict[str, object]] = field(default_factory=list)

    def running_service(self) -> int:
        with self.lock:
            return sum(1 for t in self.slots.values() if self.states.get(t) == ts.RUNNING)

    def offered_since(self, host: str, t: float) -> bool:
        with self.lock:
            return self.offers_at.get(host, -1.0) > t

    def any_offer_since(self, t: float) -> bool:
        with self.lock:
            return bool(self.offer_times) and self.offer_times[-1] > t


def expected_exit(task_id: str) -> int:
    return int(task_id.rsplit("-x", 1)[1])


def _task(task_id: str, offer: common_pb2.Offer, argv: list[str]) -> common_pb2.TaskInfo:
    task = common_pb2.TaskInfo(task_id=task_id, name=task_id, agent_id=offer.agent_id,
                               kill_grace_period_s=0.5)
    task.resources.extend(Resources.of(cpus=0.1, mem=16).to_proto())
    task.container.type = common_pb2.ContainerInfo.CONTAINER_TYPE_DOCKER
    task.container.docker.image = IMAGE
    task.command.shell = False
    task.command.value = argv[0]
    task.command.arguments.extend(argv[1:])
    return task


class ChaosFramework(Scheduler):
    """Keeps the service at `instances` and feeds the short-task stream from its offers."""

    def __init__(self, work: Workload) -> None:
        self.w = work

    def subscribed(self, driver: SchedulerDriver, framework_id: str,
                   master_info: MasterInfo) -> None:
        with self.w.lock:
            self.w.subscriptions.append((time.monotonic(), master_info.epoch))
            pending = [(t, self.w.agent_of.get(t, "")) for t, s in self.w.states.items()
                       if s not in ts.TERMINAL]
        if pending:  # what a new master may not know (a launch it never saw): ask
            driver.reconcile(pending)

    def offers(self, driver: SchedulerDriver, offers: list[common_pb2.Offer]) -> None:
        now = time.monotonic()
        w = self.w
        self._check_offers(offers, now)
        with w.lock:
            stale = []
            if now - w.last_reconcile > RECONCILE_S:
                w.last_reconcile = now
                stale = [(t, w.agent_of.get(t, "")) for t, s in w.states.items()
                         if s == ts.STAGING and now - w.launched_at.get(t, now) > RECONCILE_S]
        if stale:
            driver.reconcile(stale)
        for offer in offers:
            with w.lock:
                w.offers_at[offer.hostname] = now
                w.offer_times.append(now)
                del w.offer_times[:-1000]
                tasks = self._plan(offer, now) if w.running else []
            if tasks:
                op = common_pb2.Operation()
                op.launch.tasks.extend(tasks)
                driver.accept([offer.offer_id], [op], common_pb2.Filters(refuse_seconds=REFUSE_S))
            else:
                driver.decline([offer.offer_id], REFUSE_S)

    def _check_offers(self, offers: list[common_pb2.Offer], now: float) -> None:
        """Offers outstanding together (this framework answers each batch at once, so a
        batch) never give out more of an agent than it has: else a resource was offered
        twice at once."""
        held: dict[str, Resources] = {}
        for o in offers:
            held[o.hostname] = held.get(o.hostname, Resources()) + Resources.from_proto(
                o.resources).with_role("*")
        with self.w.lock:
            for host, acc in held.items():
                total = self.w.totals.get(host)
                if total is not None and not total.contains(acc.quantities()) \
                        and len(self.w.violations) < 1000:
                    self.w.violations.append({"kind": "offered twice at once", "at": now,
                                              "detail": f"{host}: {acc} > {total}"})

    def _plan(self, offer: common_pb2.Offer, now: float) -> list[common_pb2.TaskInfo]:
        """What to launch on this offer (under the lock): one missing service instance per
        offer (spreads them), and a short task when one is due."""
        w = self.w
        out = []
        cpus = next((r.scalar for r in offer.resources if r.name == "cpus"), 0.0)
        for slot in range(w.instances):
            current = w.slots.get(slot)
            if current is None or self._replaceable(current, now):
                gen = w.generation[slot] = w.generation.get(slot, 0) + 1
                task_id = f"svc-{slot}-{gen}"
                out.append(_task(task_id, offer, ["sleep", "86400"]))
                w.slots[slot] = task_id
                break
        in_flight = len([t for t, s in w.states.items() if t.startswith("short-")
                         and s not in ts.TERMINAL])
        if (w.short_interval > 0 and w.short_next < MAX_SHORT
                and now - w.last_short >= w.short_interval
                and in_flight < SHORT_CONCURRENT and cpus >= 0.1 * (len(out) + 1)):
            n = w.short_next
            w.short_next += 1
            w.last_short = now
            code = SHORT_CODES[n % len(SHORT_CODES)]
            out.append(_task(f"short-{n}-x{code}", offer,
                             ["sh", "-c", f"sleep {SHORT_SECONDS}; exit {code}"]))
        for task in out:
            w.launched_at[task.task_id] = now
            w.where[task.task_id] = offer.hostname
            w.agent_of[task.task_id] = offer.agent_id
            w.states[task.task_id] = ts.STAGING
        return out

    def _replaceable(self, task_id: str, now: float) -> bool:
        state = self.w.states.get(task_id)
        if state is None:
            return False
        if ts.is_terminal(state):  # type: ignore[arg-type]
            return True
        since = self.w.unreachable_since.get(task_id)
        return state == ts.UNREACHABLE and since is not None \
            and now - since > UNREACHABLE_GRACE_S

    def update(self, driver: SchedulerDriver, status: common_pb2.TaskStatus) -> None:
        now = time.monotonic()
        w = self.w
        stale = False
        with w.lock:
            w.states[status.task_id] = status.state
            if status.executor_id:
                w.executor_of[status.task_id] = status.executor_id
            hist = w.history.setdefault(status.task_id, [])
            if len(hist) < 50:
                hist.append((now, status.state, status.message,
                             status.reason == common_pb2.TaskStatus.REASON_RECONCILIATION,
                             f"{common_pb2.TaskStatus.Reason.Name(status.reason)} "
                             f"{common_pb2.TaskStatus.Source.Name(status.source)}"))
            if status.state == ts.UNREACHABLE:
                w.unreachable_since.setdefault(status.task_id, now)
            else:
                w.unreachable_since.pop(status.task_id, None)
            if (status.task_id.startswith("svc-") and status.state == ts.RUNNING
                    and status.task_id not in w.slots.values()):
                stale = True  # a replaced instance came back: keep one per slot
                w.killed_by_us.add(status.task_id)
        if stale:
            driver.kill(status.task_id, status.agent_id)


def framework_info(name: str = "chaos") -> common_pb2.FrameworkInfo:
    info = common_pb2.FrameworkInfo(name=name, role="*", principal=name,
                                    failover_timeout_s=300.0)
    info.capabilities.append(common_pb2.FrameworkInfo.CAPABILITY_PARTITION_AWARE)
    return info


def start(url: str, work: Workload) -> SchedulerDriver:
    driver = SchedulerDriver(ChaosFramework(work), framework_info(), url)
    driver.start()
    return driver


def check_short_tasks(work: Workload, settled_before: float) -> dict[str, list[str]]:
    """Short tasks launched before `settled_before` whose final update is missing ("lost")
    or contradicts the exit code their command had to report ("wrong"); those whose launch
    never reached an executor ("not_started"); those whose end the framework heard only as a
    reconciliation answer, never as the executor's update ("reconciled_only")."""
    lost: list[str] = []
    wrong: list[str] = []
    not_started: list[str] = []
    reconciled: list[str] = []
    with work.lock:
        for task_id, at in work.launched_at.items():
            if not task_id.startswith("short-") or at > settled_before:
                continue
            state = work.states.get(task_id)
            hist = work.history.get(task_id, [])
            never_ran = not any(h[1] in (ts.STARTING, ts.RUNNING) for h in hist)
            last = f"{task_id}: {ts.name(state)} {hist[-1][2]!r}" if hist else task_id  # type: ignore[arg-type]
            if never_ran and state == ts.UNKNOWN:
                not_started.append(last)  # the master never got the launch
                continue
            if state is None or not ts.is_terminal(state):  # type: ignore[arg-type]
                lost.append(task_id)
                continue
            if never_ran and state in (ts.DROPPED, ts.LOST, ts.ERROR, ts.GONE):
                not_started.append(last)  # the launch never reached an executor
                continue
            if task_id in work.excused:
                continue  # its executor was killed: any end it was told is right
            code = expected_exit(task_id)
            want = ts.FINISHED if code == 0 else ts.FAILED
            # The executor's own update (a reconciliation answer repeats the state only).
            ends = [h for h in hist if h[1] in ts.TERMINAL]
            first = next((h for h in ends if not h[3]), None)
            if first is None:
                reconciled.append(task_id)  # the framework learned the end by asking only
                first = ends[0] if ends else (0.0, state, "", True, "")
            if first[1] != want or (not first[3] and f"exited with {code}" not in first[2]):
                wrong.append(f"{task_id}: {ts.name(first[1])} {first[2]!r} {first[4]}")  # type: ignore[arg-type]
    return {"lost": sorted(lost), "wrong": sorted(wrong), "not_started": sorted(not_started),
            "reconciled_only": sorted(reconciled)}
