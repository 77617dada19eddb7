"""A framework that keeps N instances of a container (or process) running across the fleet:
placement constraints (`hostname:unique`, attribute match such as `rack:a`), restarts of
failed instances, scale up and down from its spec file, and a status file explaining what
is pending and why. `python -m frameworks.service --cluster URL --spec FILE`."""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import threading
import time
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import Any

from frameworks.rolling import to_replace
from frameworks.sdk.demand import demand
from frameworks.sdk.driver import SchedulerDriver
from frameworks.sdk.scheduler import MasterInfo, Scheduler
from frameworks.spec import (
    SPEC_LABEL,
    ServiceSpec,
    hold_service,
    instance_of,
    lock_path,
    parse_constraint,
    spec_digest,
    status_path,
)
from schemas import common_pb2
from services import tasks as task_states
from services.bus import log
from services.bus.curve import principal_from_env
from services.resources import Resources

logger = log.get_logger("framework.service")
DECLINE_WHEN_IDLE_S = 5.0
# An instance that fails again and again is restarted after a delay that doubles with each
# failure in a row (0.5 s, 1 s, 2 s, ... up to the cap); one that ran RESTART_STABLE_S or
# longer before it ended starts afresh.
RESTART_BACKOFF_S = 0.5
RESTART_BACKOFF_MAX_S = 60.0
RESTART_STABLE_S = 30.0


# -- planning (pure) ----------------------------------------------------------------------
@dataclass
class Instance:
    index: int
    task_id: str = ""
    agent_id: str = ""
    hostname: str = ""
    state: str = ""
    attempts: int = 0
    healthy: bool | None = None  # the latest health report of the current attempt
    kill_sent: bool = False  # this framework asked to kill the current attempt
    failures: int = 0  # attempts in a row that failed (see RESTART_*)
    not_before: float = 0.0  # no new attempt before this time (monotonic clock)
    running_since: float | None = None  # the current attempt's first RUNNING
    digest: str = ""  # the spec the current attempt was launched from (frameworks/spec.py)

    def ended(self, failed: bool, now: float, revoked: bool = False) -> None:
        """The current attempt ended: when may the next one start? A revoked one (killed
        for a framework below its fair share) leaves the failures in a row as they were:
        the next attempt starts when resources come."""
        stable = self.running_since is not None and now - self.running_since >= RESTART_STABLE_S
        if not revoked:
            self.failures = 0 if not failed else 1 if stable else self.failures + 1
        self.not_before = now + (min(RESTART_BACKOFF_MAX_S,
                                     RESTART_BACKOFF_S * 2 ** (self.failures - 1))
                                 if self.failures and not revoked else 0.0)
        self.running_since = None

    @property
    def live(self) -> bool:
        return task_states.is_active_name(self.state)


def _attribute(offer: common_pb2.Offer, name: str) -> str | None:
    if name == "hostname":
        return offer.hostname
    for attr in offer.attributes:
        if attr.name == name:
            return attr.text if attr.WhichOneof("value") == "text" else f"{attr.scalar:g}"
    return None


def take_ports(free: Resources, n: int) -> Resources | None:
    """The `n` lowest free ports of a bag (any role it holds ports under), or None."""
    picked: dict[tuple[str, str], list[tuple[int, int]]] = {}
    left = n
    for (name, role), ranges in sorted(free.ranges.items()):
        if name != "ports":
            continue
        for lo, hi in ranges:
            if left <= 0:
                break
            take = min(left, hi - lo + 1)
            picked.setdefault((name, role), []).append((lo, lo + take - 1))
            left -= take
    if left > 0:
        return None
    return Resources(ranges={k: tuple(v) for k, v in picked.items()})


def host_ports(res: Resources) -> list[int]:
    """The ports of a bag, lowest first."""
    return sorted(p for (name, _), ranges in res.ranges.items() if name == "ports"
                  for lo, hi in ranges for p in range(lo, hi + 1))


@dataclass
class Plan:
    """What to do with a batch of offers: offer_id -> instance indexes to launch there, the
    host ports each launched instance gets, offers to decline, and why anything missing
    could not be placed."""

    launches: dict[str, list[int]]
    declines: list[str]
    why: str
    ports: dict[int, list[int]] = field(default_factory=dict)


def plan(spec: ServiceSpec, instances: dict[int, Instance],
         offers: list[common_pb2.Offer], now: float = 0.0) -> Plan:
    """Which missing instances to launch on which offer, spreading them over hosts (each goes
    to the eligible offer whose host runs the fewest instances), each with its host ports
    taken from the offer's free "ports" (so no host port is given twice). An instance
    waiting out its restart delay (`not_before`, against `now`) is not launched yet."""
    down = [i for i in range(spec.instances) if i not in instances or not instances[i].live]
    waiting = [instances[i] for i in down if i in instances and instances[i].not_before > now]
    missing = sorted(set(down) - {w.index for w in waiting})
    hosts = Counter(inst.hostname for inst in instances.values() if inst.live)
    unique_host = any(parse_constraint(c) == ("hostname", "unique") for c in spec.constraints)
    matches = [parse_constraint(c) for c in spec.constraints
               if parse_constraint(c) != ("hostname", "unique")]
    need = spec.resources()
    reasons: Counter[str] = Counter()
    free: dict[str, Resources] = {}
    for offer in offers:
        mismatch = next(((a, v) for a, v in matches if _attribute(offer, a) != v), None)
        if mismatch is not None:
            attr, value = mismatch
            reasons[f"{offer.hostname}: {attr} is {_attribute(offer, attr)!r}, "
                    f"not {value!r}"] += 1
            continue
        free[offer.offer_id] = Resources.from_proto(offer.resources)
    by_id = {o.offer_id: o for o in offers}
    out = Plan({}, [], "")
    while missing:
        eligible = []
        for offer_id, res in free.items():
            host = by_id[offer_id].hostname
            ports = take_ports(res, len(spec.ports)) if spec.ports else Resources()
            if unique_host and hosts[host] > 0:
                reasons[f"{host} already runs an instance (hostname:unique)"] += 1
            elif not res.contains(need):
                reasons[f"no offer fits {need} (e.g. {host} offers {res})"] += 1
            elif ports is None:
                reasons[f"no offer has {len(spec.ports)} free port(s) (e.g. {host} "
                        f"offers {res})"] += 1
            else:
                eligible.append((hosts[host], offer_id, ports))
        if not eligible:
            break
        _, offer_id, ports = min(eligible, key=lambda e: (e[0], e[1]))
        free[offer_id] = free[offer_id] - need - ports
        hosts[by_id[offer_id].hostname] += 1
        index = missing.pop(0)
        out.launches.setdefault(offer_id, []).append(index)
        if spec.ports:
            out.ports[index] = host_ports(ports)
    out.declines = [o.offer_id for o in offers if o.offer_id not in out.launches]
    why = [f"{len(missing)} instance(s) not placed: "
           + "; ".join(r for r, _ in reasons.most_common(3))] if missing else []
    if waiting:
        first = min(waiting, key=lambda w: w.not_before)
        why.append(f"{len(waiting)} instance(s) failing in a row: instance {first.index} "
                   f"restarts in {first.not_before - now:.1f}s ({first.failures} failures)")
    out.why = "; ".join(why)
    return out


def task_info(spec: ServiceSpec, instance: Instance, offer: common_pb2.Offer,
              ports: list[int] | None = None, digest: str = "") -> common_pb2.TaskInfo:
    """The task of one instance's attempt; `ports` are its host ports, one per spec port in
    order: published as port mappings, in its resources, and in PORT0.. / PORT_<N>."""
    task = common_pb2.TaskInfo(task_id=f"{spec.name}-{instance.index}-{instance.attempts}",
                               name=f"{spec.name}-{instance.index}", agent_id=offer.agent_id,
                               kill_grace_period_s=spec.kill_grace_s)
    ports = list(ports or [])
    if len(ports) != len(spec.ports):
        raise ValueError(f"{len(spec.ports)} port(s) to publish, {len(ports)} host port(s)")
    task.resources.extend((spec.resources() + Resources.of(
        ports=[(p, p) for p in ports])).to_proto())
    task.labels["service"] = spec.name
    task.labels[SPEC_LABEL] = digest or spec_digest(spec)
    env = dict(spec.env)
    for i, (container_port, host_port) in enumerate(zip(spec.ports, ports, strict=True)):
        env[f"PORT{i}"] = env[f"PORT_{container_port}"] = str(host_port)
    if spec.command:
        task.command.shell = False
        task.command.value = spec.command[0]
        task.command.arguments.extend(spec.command[1:])
    task.command.env.update(env)
    if spec.runtime == "docker":
        task.container.type = common_pb2.ContainerInfo.CONTAINER_TYPE_DOCKER
        task.container.docker.image = spec.image
        for container_port, host_port in zip(spec.ports, ports, strict=True):
            task.container.docker.port_mappings.add(host_port=host_port,
                                                    container_port=container_port)
    else:
        task.container.type = common_pb2.ContainerInfo.CONTAINER_TYPE_PROCESS
    check = health_check(spec, ports)
    if check is not None:
        task.health_check.CopyFrom(check)
    return task


def health_check(spec: ServiceSpec, ports: list[int]) -> common_pb2.HealthCheck | None:
    """The spec's health check, if any (HTTP on the first published host port)."""
    if not spec.health_cmd and not spec.health_http:
        return None
    check = common_pb2.HealthCheck(interval_s=spec.health_interval_s,
                                   timeout_s=min(spec.health_interval_s, 5.0),
                                   consecutive_failures=spec.health_failures)
    if spec.health_cmd:
        check.command.command.shell = True
        check.command.command.value = spec.health_cmd
    else:
        check.http.port = ports[0]
        check.http.path = spec.health_http if spec.health_http.startswith("/") else \
            f"/{spec.health_http}"
    return check


# -- the scheduler ------------------------------------------------------------------------
class ServiceScheduler(Scheduler):
    def __init__(self, spec: ServiceSpec, status_path: Path | None = None) -> None:
        self.spec = spec
        self.status_path = status_path
        self.instances: dict[int, Instance] = {}
        self.by_task: dict[str, int] = {}
        self.pending_reason = ""
        self.suppressed = False
        self.restarts = 0
        self.health_kills = 0
        self.replaced = 0  # instances killed by rolling updates
        self.digest = spec_digest(spec)  # of the spec new attempts launch from
        self.revoked_tasks = 0  # killed by the master for fair sharing (REASON_TASK_REVOKED)
        # The last attempt that failed (not asked to stop, not finished): what `offerbus run`
        # shows while instances keep failing.
        self.last_failure: dict[str, str] | None = None
        self.declared: common_pb2.Demand | None = None  # the demand last requested
        self.removed = ""  # the master's final Error (e.g. removed by the operator)
        self.framework_id = ""  # kept in the status file: a restarted process fails over
        self.finished = threading.Event()
        self.lock = threading.Lock()

    def recover(self, doc: dict[str, Any]) -> str:
        """Take over from an earlier process of this service (its status file `doc`): its
        framework id (returned), and its instances as it last saw them, each to be
        reconciled. They count as placed meanwhile, so nothing is launched twice."""
        for key, t in dict(doc.get("tasks", {})).items():
            index, attempt = instance_of(self.spec.name, str(t.get("task_id", "")))
            if index is None or index != int(key):
                continue
            self.instances[index] = Instance(index, task_id=t["task_id"],
                                             hostname=str(t.get("host", "")),
                                             agent_id=str(t.get("agent_id", "")),
                                             state=str(t.get("state", "")), attempts=attempt,
                                             digest=str(t.get("digest", "")),
                                             healthy=t.get("healthy") if isinstance(
                                                 t.get("healthy"), bool) else None)
            self.by_task[t["task_id"]] = index
        self.framework_id = str(doc.get("framework_id", ""))
        return self.framework_id

    def subscribed(self, driver: SchedulerDriver, framework_id: str,
                   master_info: MasterInfo) -> None:
        logger.info("subscribed", framework=framework_id, master=master_info.master_id)
        with self.lock:
            self.framework_id = framework_id
            known = [(i.task_id, i.agent_id) for i in self.instances.values()
                     if i.task_id and i.live]
        # Learn the state of the instances we had (after a failover, or a restart of this
        # process): each one we know by name, then every task the master knows of us.
        if known:
            driver.reconcile(known)
        driver.reconcile()
        self._want_offers(driver)
        self._write_status()

    def offers(self, driver: SchedulerDriver, offers: list[common_pb2.Offer],
               now: float | None = None) -> None:
        with self.lock:
            p = plan(self.spec, self.instances, offers,
                     time.monotonic() if now is None else now)
            why = p.why
            by_id = {o.offer_id: o for o in offers}
            for offer_id, indexes in p.launches.items():
                offer = by_id[offer_id]
                op = common_pb2.Operation()
                for index in indexes:
                    inst = self.instances.setdefault(index, Instance(index))
                    inst.attempts += 1
                    task = task_info(self.spec, inst, offer, p.ports.get(index), self.digest)
                    inst.task_id, inst.agent_id, inst.hostname = (task.task_id, offer.agent_id,
                                                                  offer.hostname)
                    inst.state = "TASK_STAGING"
                    inst.healthy, inst.kill_sent = None, False
                    inst.digest = task.labels[SPEC_LABEL]
                    self.by_task[task.task_id] = index
                    op.launch.tasks.append(task)
                driver.accept([offer_id], [op], common_pb2.Filters(refuse_seconds=1.0),
                              traceparent=offer.traceparent)
            # One decline per offer, each under its own offer's trace: the `decide` span of
            # every offer then carries the reason (`offerbus why`).
            reason = why or (f"nothing to place: all {self.spec.instances} instance(s) "
                             "running or being placed")
            for offer_id in p.declines:
                driver.decline([offer_id], DECLINE_WHEN_IDLE_S if not why else 1.0,
                               reason=reason, traceparent=by_id[offer_id].traceparent)
            self.pending_reason = why
            self._want_offers(driver)
        self._write_status()

    def update(self, driver: SchedulerDriver, status: common_pb2.TaskStatus,
               now: float | None = None) -> None:
        now = time.monotonic() if now is None else now
        state = common_pb2.TaskState.Name(status.state)
        with self.lock:
            index = self.by_task.get(status.task_id)
            if index is None:
                index, attempt = instance_of(self.spec.name, status.task_id)
                if index is None:
                    return
                inst = self.instances.setdefault(index, Instance(index))
                if attempt < inst.attempts:
                    return  # an update of an older attempt
                inst.task_id, inst.agent_id = status.task_id, status.agent_id
                inst.attempts = attempt  # the next attempt gets a new task id
                self.by_task[status.task_id] = index
            inst = self.instances[index]
            if inst.task_id != status.task_id:
                return  # an update of an older attempt
            if status.agent_id:
                inst.agent_id = status.agent_id
            inst.state = state
            if status.HasField("healthy"):
                inst.healthy = status.healthy  # the executor kills after N failed checks
            if status.state == common_pb2.TASK_RUNNING and inst.running_since is None:
                inst.running_since = now
            if task_states.is_terminal(status.state):
                logger.info("instance ended", task=status.task_id, state=state,
                            reason=common_pb2.TaskStatus.Reason.Name(status.reason),
                            message=status.message)
                revoked = status.reason == common_pb2.TaskStatus.REASON_TASK_REVOKED
                failed = status.state != common_pb2.TASK_FINISHED and not inst.kill_sent
                if failed:
                    self.last_failure = {
                        "task_id": status.task_id, "state": state,
                        "reason": common_pb2.TaskStatus.Reason.Name(status.reason),
                        "message": status.message}
                inst.ended(failed=failed, now=now, revoked=revoked)
                self.revoked_tasks += int(revoked)
                if status.reason == common_pb2.TaskStatus.REASON_HEALTH_CHECK_FAILED:
                    self.health_kills += 1
                if index < self.spec.instances:
                    self.restarts += 1
                self._want_offers(driver)
            self._scale_down(driver)
            self._roll(driver)
        self._write_status()

    def accept_rejected(self, driver: SchedulerDriver, offer_ids: list[str],
                        task_ids: list[str], reason: int, message: str) -> None:
        """A refused launch's tasks end by the master's update, but for a launch a failed
        master never answered, whose tasks may yet run: each instance still counted placed
        is asked about (a reconciliation; an update still on its way answers it too)."""
        with self.lock:
            ask = [(t, inst.agent_id) for t in task_ids
                   if (i := self.by_task.get(t)) is not None
                   and (inst := self.instances[i]).task_id == t and inst.live]
        if ask:
            logger.info("launch refused; reconciling", tasks=len(ask), message=message)
            driver.reconcile(ask)

    def rescinded(self, driver: SchedulerDriver, offer_ids: list[str], reason: int) -> None:
        pass

    def revoked(self, driver: SchedulerDriver, agent_id: str, task_ids: list[str],
                grace_s: float, message: str) -> None:
        """Another framework below its fair share needs these instances' resources: the
        master kills them after the grace period (TASK_KILLED, REASON_TASK_REVOKED) and
        they are relaunched, without a restart delay, when resources come."""
        logger.info("instances revoked", agent=agent_id, tasks=",".join(task_ids),
                    grace_s=grace_s, message=message)

    def error(self, driver: SchedulerDriver, message: str) -> None:
        """The master's final word (this framework was removed by the operator, or refused):
        the driver stops and does not re-subscribe; main() ends the process."""
        logger.info("framework ended by the master", name=self.spec.name, message=message)
        self.removed = message or "error without a message"
        if "subscribe without an id" in message:
            # Removed while no process of this service ran (its failover timeout passed,
            # its tasks were killed): forget it, so the next start subscribes afresh.
            with self.lock:
                self.framework_id = ""
                self.instances.clear()
                self.by_task.clear()
            self._write_status()
        self.finished.set()

    def set_instances(self, driver: SchedulerDriver, n: int) -> None:
        with self.lock:
            self.spec.instances = n
        self.set_spec(driver, self.spec)

    def set_spec(self, driver: SchedulerDriver, spec: ServiceSpec) -> None:
        """A new spec (of the same name and role): its instances at once; when more than
        its instances changed, a rolling update (frameworks/rolling.py) replaces the running
        instances, at most `max_unavailable` down at a time."""
        with self.lock:
            self.spec = spec
            self.digest = spec_digest(spec)
            self._scale_down(driver)
            self._roll(driver)
            self._want_offers(driver)
        self._write_status()

    def _scale_down(self, driver: SchedulerDriver) -> None:
        for inst in self.instances.values():
            if inst.index >= self.spec.instances and inst.live and not inst.kill_sent:
                self._kill(driver, inst)

    def _roll(self, driver: SchedulerDriver) -> None:
        """A rolling update: replace instances of an older spec, a few at a time."""
        checked = bool(self.spec.health_cmd or self.spec.health_http)
        for index in to_replace(self.instances, self.spec.instances, self.digest,
                                self.spec.max_unavailable, checked):
            logger.info("rolling update: replacing", instance=index,
                        task=self.instances[index].task_id)
            self.replaced += 1
            self._kill(driver, self.instances[index])

    @staticmethod
    def _kill(driver: SchedulerDriver, inst: Instance) -> None:
        driver.kill(inst.task_id, inst.agent_id)
        inst.state, inst.kill_sent = "TASK_KILLING", True

    def demand(self) -> common_pb2.Demand:
        """What this service wants: all its instances (running ones included), each of
        the spec's shape and host ports."""
        return demand(self.spec.resources(), self.spec.instances, ports=len(self.spec.ports))

    def _want_offers(self, driver: SchedulerDriver) -> None:
        want = self.demand()
        if want != self.declared:  # (the driver restates it after a re-subscription)
            driver.request([want])
            self.declared = want
        missing = sum(1 for i in range(self.spec.instances)
                      if i not in self.instances or not self.instances[i].live)
        if missing and self.suppressed:
            driver.revive()
            self.suppressed = False
        elif not missing and not self.suppressed:
            driver.suppress()
            self.suppressed = True

    def _write_status(self) -> None:
        if self.status_path is None:
            return
        doc = self.status()
        tmp = self.status_path.with_suffix(".tmp")
        tmp.write_text(json.dumps(doc, indent=2, sort_keys=True))
        os.replace(tmp, self.status_path)

    def status(self) -> dict[str, Any]:
        """What the status file holds (and the job runner's /jobs shows): the framework id,
        each instance's task, state and host, what is pending and why."""
        with self.lock:
            return {"name": self.spec.name, "instances": self.spec.instances,
                    "framework_id": self.framework_id,
                    "states": Counter(i.state for i in self.instances.values()),
                    "pending_reason": self.pending_reason, "restarts": self.restarts,
                    "health_kills": self.health_kills, "removed": self.removed,
                    "revoked": self.revoked_tasks, "replaced": self.replaced,
                    "last_failure": self.last_failure,
                    "tasks": {i.index: {"task_id": i.task_id, "state": i.state,
                                        "host": i.hostname, "agent_id": i.agent_id,
                                        "healthy": i.healthy, "digest": i.digest}
                              for i in self.instances.values()}}


def framework_info(spec: ServiceSpec, failover_timeout: float,
                   environ: Mapping[str, str] | None = None) -> common_pb2.FrameworkInfo:
    """The service's FrameworkInfo. Its principal is its CURVE key's name when it has one
    (the master binds each key to that principal and refuses any other), else its name."""
    return common_pb2.FrameworkInfo(
        name=spec.name, role=spec.role or "*",
        principal=principal_from_env(environ) or spec.name,
        failover_timeout_s=failover_timeout)


def main(argv: list[str] | None = None) -> int:
    """Exit 0 on SIGTERM/SIGINT (the tasks keep running: failover), on SIGUSR1 (tear the
    framework down: its tasks are killed), when the spec file is removed, or when the master
    removed the framework (`offerbus stop`); 1 when the master refused it otherwise."""
    ap = argparse.ArgumentParser(prog="offerbus-service", description=__doc__)
    ap.add_argument("--cluster", required=True)
    ap.add_argument("--spec", type=Path, required=True, help="the service's JSON spec")
    ap.add_argument("--failover-timeout", type=float, default=300.0)
    args = ap.parse_args(argv)
    log.configure("framework")
    spec = ServiceSpec(**json.loads(args.spec.read_text()))
    spec.check()
    held = hold_service(args.spec)  # kept open, held, until this process ends
    if held is None:
        logger.error("another process runs this service: exiting", name=spec.name,
                     lock=str(lock_path(args.spec)))
        return 1
    status_file = status_path(args.spec)
    scheduler = ServiceScheduler(spec, status_file)
    info = framework_info(spec, args.failover_timeout)
    try:  # an earlier process of this service: fail over to its framework, keep its tasks
        info.framework_id = scheduler.recover(json.loads(status_file.read_text()))
    except FileNotFoundError:
        pass
    except (OSError, ValueError, TypeError, KeyError) as exc:
        logger.warning("status file unreadable: subscribing as a new framework",
                       path=str(status_file), error=repr(exc))
    if info.framework_id:
        logger.info("failing over", framework=info.framework_id,
                    instances=len(scheduler.instances))
    info.capabilities.append(common_pb2.FrameworkInfo.CAPABILITY_PARTITION_AWARE)
    driver = SchedulerDriver(scheduler, info, args.cluster)
    failing_over = bool(info.framework_id)
    stop = threading.Event()
    teardown = threading.Event()

    def on_signal(signum: int, frame: FrameType | None) -> None:
        if signum == signal.SIGUSR1:
            teardown.set()
        stop.set()

    for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGUSR1):
        signal.signal(signum, on_signal)
    driver.start()
    mtime = args.spec.stat().st_mtime
    while not stop.wait(0.5):  # spec file: scaling
        if scheduler.finished.is_set():
            if not (failing_over and not scheduler.framework_id):
                break
            # It failed over to a framework the master removed while no process of this
            # service ran (its failover timeout passed): the service goes on as a new one.
            failing_over = False
            driver.join(10)
            logger.info("registering anew", name=spec.name)
            scheduler.finished.clear()
            scheduler.removed = ""
            info.ClearField("framework_id")
            driver = SchedulerDriver(scheduler, info, args.cluster)
            driver.start()
        try:
            now_mtime = args.spec.stat().st_mtime
        except FileNotFoundError:
            break
        if now_mtime != mtime:
            mtime = now_mtime
            try:
                new = ServiceSpec(**json.loads(args.spec.read_text()))
            except (OSError, ValueError, TypeError) as exc:
                logger.warning("spec unreadable: kept the last one", error=repr(exc))
                continue
            logger.info("scaling", name=spec.name, instances=new.instances)
            scheduler.set_instances(driver, new.instances)
    if scheduler.finished.is_set():
        driver.join(10)
        return 0 if "removed" in scheduler.removed else 1
    # Without teardown the tasks keep running until the failover timeout.
    driver.stop(failover=not teardown.is_set())
    driver.join(10)
    return 0


if __name__ == "__main__":
    sys.exit(main())
