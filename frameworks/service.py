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
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path
from types import FrameType
from typing import Any

from frameworks.sdk.driver import SchedulerDriver
from frameworks.sdk.scheduler import MasterInfo, Scheduler
from schemas import common_pb2
from services import tasks as task_states
from services.bus import log
from services.resources import Resources

logger = log.get_logger("framework.service")
DECLINE_WHEN_IDLE_S = 5.0


@dataclass
class ServiceSpec:
    name: str
    image: str
    instances: int
    cpus: float
    mem: float
    command: list[str] = field(default_factory=list)
    constraints: list[str] = field(default_factory=list)
    runtime: str = "docker"
    kill_grace_s: float = 3.0

    def resources(self) -> Resources:
        return Resources.of(cpus=self.cpus, mem=self.mem)

    def check(self) -> None:
        if not self.name or "/" in self.name:
            raise ValueError(f"bad service name {self.name!r}")
        if self.instances < 0 or self.cpus <= 0 or self.mem <= 0:
            raise ValueError("instances must be >= 0, cpus and mem > 0")
        for c in self.constraints:
            parse_constraint(c)


def parse_constraint(text: str) -> tuple[str, str]:
    name, sep, value = text.partition(":")
    if not sep or not name or not value:
        raise ValueError(f"bad constraint {text!r}: use hostname:unique or ATTRIBUTE:VALUE")
    return name, value


def spec_path(run_dir: Path, name: str) -> Path:
    return run_dir / "frameworks" / f"{name}.json"


def write_spec(run_dir: Path, spec: ServiceSpec) -> Path:
    spec.check()
    path = spec_path(run_dir, spec.name)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(asdict(spec), indent=2))
    os.replace(tmp, path)
    return path


def read_spec(run_dir: Path, name: str) -> ServiceSpec:
    path = spec_path(run_dir, name)
    if not path.exists():
        raise ValueError(f"no service {name!r} ({path} not found)")
    return ServiceSpec(**json.loads(path.read_text()))


def instance_states(state: dict[str, Any], name: str) -> Counter[str]:
    """Task states of a service's instances, from the master's /state."""
    ids = {f["framework_info"].get("framework_id") for f in state.get("frameworks", [])
           if f["framework_info"].get("name") == name}
    return Counter(t.get("status", {}).get("state", "").removeprefix("TASK_")
                   for t in state.get("tasks", []) if t.get("framework_id") in ids)


# -- planning (pure) ----------------------------------------------------------------------
@dataclass
class Instance:
    index: int
    task_id: str = ""
    agent_id: str = ""
    hostname: str = ""
    state: str = ""
    attempts: int = 0

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


def plan(spec: ServiceSpec, instances: dict[int, Instance],
         offers: list[common_pb2.Offer]) -> tuple[dict[str, list[int]], list[str], str]:
    """Which missing instances to launch on which offer, spreading them over hosts (each goes
    to the eligible offer whose host runs the fewest instances). Returns (offer_id ->
    instance indexes, offer ids to decline, why anything missing could not be placed)."""
    missing = sorted(i for i in range(spec.instances)
                     if i not in instances or not instances[i].live)
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
    launches: dict[str, list[int]] = {}
    while missing:
        eligible = []
        for offer_id, res in free.items():
            host = by_id[offer_id].hostname
            if unique_host and hosts[host] > 0:
                reasons[f"{host} already runs an instance (hostname:unique)"] += 1
            elif not res.contains(need):
                reasons[f"no offer fits {need} (e.g. {host} offers {res})"] += 1
            else:
                eligible.append((hosts[host], offer_id))
        if not eligible:
            break
        _, offer_id = min(eligible)
        free[offer_id] = free[offer_id] - need
        hosts[by_id[offer_id].hostname] += 1
        launches.setdefault(offer_id, []).append(missing.pop(0))
    declines = [o.offer_id for o in offers if o.offer_id not in launches]
    why = "" if not missing else (f"{len(missing)} instance(s) not placed: "
                                  + "; ".join(r for r, _ in reasons.most_common(3)))
    return launches, declines, why


def task_info(spec: ServiceSpec, instance: Instance,
              offer: common_pb2.Offer) -> common_pb2.TaskInfo:
    task = common_pb2.TaskInfo(task_id=f"{spec.name}-{instance.index}-{instance.attempts}",
                               name=f"{spec.name}-{instance.index}", agent_id=offer.agent_id,
                               kill_grace_period_s=spec.kill_grace_s)
    task.resources.extend(spec.resources().to_proto())
    task.labels["service"] = spec.name
    if spec.command:
        task.command.shell = False
        task.command.value = spec.command[0]
        task.command.arguments.extend(spec.command[1:])
    if spec.runtime == "docker":
        task.container.type = common_pb2.ContainerInfo.CONTAINER_TYPE_DOCKER
        task.container.docker.image = spec.image
    else:
        task.container.type = common_pb2.ContainerInfo.CONTAINER_TYPE_PROCESS
    return task


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
        self.lock = threading.Lock()

    def subscribed(self, driver: SchedulerDriver, framework_id: str,
                   master_info: MasterInfo) -> None:
        logger.info("subscribed", framework=framework_id, master=master_info.master_id)
        driver.reconcile()  # learn the state of the instances we had (after a failover)
        self._want_offers(driver)

    def offers(self, driver: SchedulerDriver, offers: list[common_pb2.Offer]) -> None:
        with self.lock:
            launches, declines, why = plan(self.spec, self.instances, offers)
            by_id = {o.offer_id: o for o in offers}
            for offer_id, indexes in launches.items():
                offer = by_id[offer_id]
                op = common_pb2.Operation()
                for index in indexes:
                    inst = self.instances.setdefault(index, Instance(index))
                    inst.attempts += 1
                    task = task_info(self.spec, inst, offer)
                    inst.task_id, inst.agent_id, inst.hostname = (task.task_id, offer.agent_id,
                                                                  offer.hostname)
                    inst.state = "TASK_STAGING"
                    self.by_task[task.task_id] = index
                    op.launch.tasks.append(task)
                driver.accept([offer_id], [op], common_pb2.Filters(refuse_seconds=1.0),
                              traceparent=offer.traceparent)
            # One decline per offer, each under its own offer's trace: the `decide` span of
            # every offer then carries the reason (`offerbus why`).
            reason = why or (f"nothing to place: all {self.spec.instances} instance(s) "
                             "running or being placed")
            for offer_id in declines:
                driver.decline([offer_id], DECLINE_WHEN_IDLE_S if not why else 1.0,
                               reason=reason, traceparent=by_id[offer_id].traceparent)
            self.pending_reason = why
            self._want_offers(driver)
        self._write_status()

    def update(self, driver: SchedulerDriver, status: common_pb2.TaskStatus) -> None:
        state = common_pb2.TaskState.Name(status.state)
        with self.lock:
            index = self.by_task.get(status.task_id)
            if index is None:
                index = _index_of(self.spec.name, status.task_id)
                if index is None:
                    return
                inst = self.instances.setdefault(index, Instance(index))
                inst.task_id, inst.agent_id = status.task_id, status.agent_id
                self.by_task[status.task_id] = index
            inst = self.instances[index]
            if inst.task_id != status.task_id:
                return  # an update of an older attempt
            inst.state = state
            if task_states.is_terminal(status.state):
                logger.info("instance ended", task=status.task_id, state=state,
                            reason=common_pb2.TaskStatus.Reason.Name(status.reason),
                            message=status.message)
                if index < self.spec.instances:
                    self.restarts += 1
                self._want_offers(driver)
            self._scale_down(driver)
        self._write_status()

    def rescinded(self, driver: SchedulerDriver, offer_ids: list[str], reason: int) -> None:
        pass

    def set_instances(self, driver: SchedulerDriver, n: int) -> None:
        with self.lock:
            self.spec.instances = n
            self._scale_down(driver)
            self._want_offers(driver)
        self._write_status()

    def _scale_down(self, driver: SchedulerDriver) -> None:
        for inst in self.instances.values():
            if inst.index >= self.spec.instances and inst.live and inst.state != "TASK_KILLING":
                driver.kill(inst.task_id, inst.agent_id)
                inst.state = "TASK_KILLING"

    def _want_offers(self, driver: SchedulerDriver) -> None:
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
        with self.lock:
            doc = {"name": self.spec.name, "instances": self.spec.instances,
                   "states": Counter(i.state for i in self.instances.values()),
                   "pending_reason": self.pending_reason, "restarts": self.restarts,
                   "tasks": {i.index: {"task_id": i.task_id, "state": i.state,
                                       "host": i.hostname} for i in self.instances.values()}}
        tmp = self.status_path.with_suffix(".tmp")
        tmp.write_text(json.dumps(doc, indent=2, sort_keys=True))
        os.replace(tmp, self.status_path)


def _index_of(name: str, task_id: str) -> int | None:
    parts = task_id.rsplit("-", 2)
    if len(parts) == 3 and parts[0] == name and parts[1].isdigit():
        return int(parts[1])
    return None


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="offerbus-service", description=__doc__)
    ap.add_argument("--cluster", required=True)
    ap.add_argument("--spec", type=Path, required=True, help="the service's JSON spec")
    ap.add_argument("--failover-timeout", type=float, default=300.0)
    args = ap.parse_args(argv)
    log.configure("framework")
    spec = ServiceSpec(**json.loads(args.spec.read_text()))
    spec.check()
    scheduler = ServiceScheduler(spec, args.spec.with_suffix(".status.json"))
    info = common_pb2.FrameworkInfo(name=spec.name, role="*", principal=spec.name,
                                    failover_timeout_s=args.failover_timeout)
    info.capabilities.append(common_pb2.FrameworkInfo.CAPABILITY_PARTITION_AWARE)
    driver = SchedulerDriver(scheduler, info, args.cluster)
    stop = threading.Event()

    def on_signal(signum: int, frame: FrameType | None) -> None:
        stop.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    driver.start()
    mtime = args.spec.stat().st_mtime
    while not stop.wait(0.5):  # watch the spec file for scaling
        try:
            now_mtime = args.spec.stat().st_mtime
        except FileNotFoundError:
            break
        if now_mtime != mtime:
            mtime = now_mtime
            new = ServiceSpec(**json.loads(args.spec.read_text()))
            logger.info("scaling", name=spec.name, instances=new.instances)
            scheduler.set_instances(driver, new.instances)
    driver.stop(failover=True)  # the tasks keep running until the failover timeout
    driver.join(10)
    return 0


if __name__ == "__main__":
    sys.exit(main())
