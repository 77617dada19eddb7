"""The job runner's shell (issue 11: the long-running service framework runs inside the
cluster, as Marathon does on Mesos): a service-kit process, hot standbys under the "jobs"
election, that follows the master's state stream and runs, while it leads, one service
scheduler (frameworks/service.py) per job the master keeps. What to run is the core's
(frameworks/jobrunner/core.py); here are the sockets, the drivers and the timers."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from frameworks.jobrunner.core import JOB_LABEL, Command, JobRunnerCore, Start, Update
from frameworks.sdk.driver import SchedulerDriver
from frameworks.sdk.scheduler import MasterInfo
from frameworks.service import ServiceScheduler, framework_info
from frameworks.spec import ServiceSpec
from schemas import common_pb2
from services.bus import codec
from services.bus.election import LeaderChanged, LeaderInfo, detector_from_url
from services.bus.epoch import EpochFence
from services.bus.log import get_logger
from services.bus.mailbox import Mailbox
from services.bus.reactor import Reactor, Timer
from services.bus.statestream import Changed, StateSubscriber
from services.shell.http import Response
from services.shell.service import ServiceConfig, ServiceKit

log = get_logger("jobs")
Role = codec.Role
# A job's framework outlives its scheduler this long: a job runner failover, or every runner
# down for a while, leaves its tasks running.
FAILOVER_TIMEOUT_S = 7 * 24 * 3600.0


@dataclass
class JobRunnerConfig(ServiceConfig):
    runner_id: str
    election_url: str  # zk://hosts/chroot or file:///run_dir
    failover_timeout: float = FAILOVER_TIMEOUT_S


class JobScheduler(ServiceScheduler):
    """A service scheduler that tells the runner's reactor when it subscribed and when the
    master ended its framework."""

    def __init__(self, spec: ServiceSpec, events: Mailbox[tuple[str, str, str]]) -> None:
        super().__init__(spec)
        self._events = events

    def subscribed(self, driver: SchedulerDriver, framework_id: str,
                   master_info: MasterInfo) -> None:
        super().subscribed(driver, framework_id, master_info)
        self._events.put(("subscribed", self.spec.name, framework_id))

    def error(self, driver: SchedulerDriver, message: str) -> None:
        super().error(driver, message)
        self._events.put(("ended", self.spec.name, message))


class JobRunnerShell(ServiceKit):
    def __init__(self, config: JobRunnerConfig, reactor: Reactor | None = None) -> None:
        super().__init__("jobs", config.runner_id, Role.Value("ROLE_FRAMEWORK"), config,
                         reactor)
        self.config = config
        key = config.curve_secret_key_file
        self.principal = Path(key).name.removesuffix(".key_secret") if key else ""
        self.core = JobRunnerCore(principal=self.principal)
        self.schedulers: dict[str, tuple[JobScheduler, SchedulerDriver]] = {}
        self.stopping: list[SchedulerDriver] = []  # stopped drivers, joined on close
        self.events: Mailbox[tuple[str, str, str]] = Mailbox()
        self.reactor.add_reader(self.events, self._on_events)
        self.master: LeaderInfo | None = None
        self.master_fence = EpochFence(frozenset({Role.Value("ROLE_MASTER")}))
        self.masters = detector_from_url(config.election_url, "master")
        self.reactor.add_reader(self.masters, self._on_master)
        self.masters.start()
        self.subscriber: StateSubscriber | None = None
        self._timer: Timer | None = None
        self.metrics.gauge("jobs_running", "Job schedulers this process runs.",
                           value=lambda: float(len(self.schedulers)))
        self.start_http({"/jobs": self._http_jobs})
        self.join_election(config.election_url, lead=self._lead, pause=self._pause,
                           resume=self._resume, step_down=self._step_down)
        log.info("job runner started", id=config.runner_id, **self.endpoints)

    # -- leadership ----------------------------------------------------------------------
    def _lead(self, epoch: int) -> None:
        self.subscriber = StateSubscriber(
            self.reactor, self.ctx, self.sender, self._on_state,
            heartbeat_interval=self.config.heartbeat_interval, max_missed=self.config.max_missed,
            stats=self.stats, fence=self.master_fence, curve=self.curve.client)
        self._point_at_master()
        self._run(self.core.lead(self.reactor.now()))
        log.info("leading", epoch=epoch)

    def _pause(self, reason: str) -> None:
        """The schedulers talk to the master, not to ZooKeeper: they go on; nothing new
        starts until the reign resumes or ends."""
        self._run(self.core.pause())
        log.info("paused", reason=reason)

    def _resume(self, epoch: int) -> None:
        self._run(self.core.resume(self.reactor.now()))
        log.info("resumed", epoch=epoch)

    def _step_down(self, reason: str) -> None:
        if self.subscriber is not None:
            self.subscriber.close()
            self.subscriber = None
        self._run(self.core.step_down())
        log.info("stepped down", reason=reason)

    def _on_master(self) -> None:
        for event in self.masters.events():
            if isinstance(event, LeaderChanged):
                self.master = event.leader
                self.master_fence.follow(Role.Value("ROLE_MASTER"), event.leader)
                self._point_at_master()

    def _point_at_master(self) -> None:
        m = self.master
        if self.subscriber is None or m is None:
            return
        if "pub" in m.endpoints and "snapshot" in m.endpoints:
            self.subscriber.connect(m.endpoints["pub"], m.endpoints["snapshot"])

    # -- inbound -------------------------------------------------------------------------
    def _on_state(self, change: Changed) -> None:
        now = self.reactor.now()
        if change.reset:
            assert self.subscriber is not None
            self._run(self.core.stream(list(self.subscriber.store.values()), now, reset=True))
        else:
            self._run(self.core.stream(change.entries, now))

    def _on_events(self) -> None:
        now = self.reactor.now()
        for kind, name, detail in self.events.drain():
            if kind == "subscribed":
                self._run(self.core.subscribed(name, detail, now))
            else:
                log.warning("job framework ended", job=name, message=detail)
                self.stats.inc("job_frameworks_ended")
                self._run(self.core.ended(name, detail, now))

    # -- commands ------------------------------------------------------------------------
    def _run(self, commands: list[Command]) -> None:
        for cmd in commands:
            try:
                self._do(cmd)
            except Exception as exc:  # one job's bad spec never stops the others
                self.stats.inc("job_command_errors")
                log.error("job command failed", job=cmd.name, command=type(cmd).__name__,
                          error=repr(exc))
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        deadline = self.core.next_deadline()
        if deadline is not None:
            self._timer = self.reactor.call_at(deadline, self._tick)

    def _tick(self) -> None:
        self._timer = None
        self._run(self.core.tick(self.reactor.now()))

    def _do(self, cmd: Command) -> None:
        if isinstance(cmd, Start):
            self._stop(cmd.name, failover=True)
            scheduler = JobScheduler(cmd.spec, self.events)
            info = framework_info(cmd.spec, self.config.failover_timeout)
            info.principal = self.principal or cmd.spec.name
            info.labels[JOB_LABEL] = cmd.name
            info.capabilities.append(common_pb2.FrameworkInfo.CAPABILITY_PARTITION_AWARE)
            if cmd.framework_id:
                info.framework_id = scheduler.recover(cmd.recovered)
            # Taking a job over from a runner that died (or lost its lead): its connection
            # may still look alive to the master for a while; `force` takes the framework
            # over at once (only this runner's principal may: the master binds it).
            driver = SchedulerDriver(scheduler, info, self.config.election_url,
                                     context=self.ctx, curve=self.curve.client,
                                     force=bool(cmd.framework_id))
            self.schedulers[cmd.name] = (scheduler, driver)
            driver.start()
            log.info("job started", job=cmd.name, version=cmd.version,
                     framework=cmd.framework_id or "(new)",
                     instances=len(cmd.recovered.get("tasks", {})))
        elif isinstance(cmd, Update):
            running = self.schedulers.get(cmd.name)
            if running is not None:
                running[0].set_spec(running[1], cmd.spec)
                log.info("job updated", job=cmd.name, version=cmd.version,
                         instances=cmd.spec.instances)
        else:
            self._stop(cmd.name, failover=cmd.failover)

    def _stop(self, name: str, failover: bool) -> None:
        running = self.schedulers.pop(name, None)
        if running is None:
            return
        running[1].stop(failover=failover)  # a mailbox put: the driver thread ends itself
        self.stopping = [d for d in self.stopping if not d.join(0)] + [running[1]]
        log.info("job scheduler stopped", job=name, failover=failover)

    # -- status ----------------------------------------------------------------------------
    def health(self) -> dict[str, Any]:
        return {"jobs": len(self.core.jobs), "running": len(self.schedulers)}

    def _http_jobs(self, query: dict[str, list[str]]) -> Response:
        view = self.core.view()
        for name, entry in view.items():
            running = self.schedulers.get(name)
            if running is not None:
                status = running[0].status()
                entry.update(instances=status["instances"], states=status["states"],
                             pending_reason=status["pending_reason"],
                             restarts_of_instances=status["restarts"])
        return Response(200, "application/json", json.dumps(
            {"leading": self.leader.leading if self.leader else False, "jobs": view},
            sort_keys=True).encode())

    def close(self, linger_ms: int = 0) -> None:
        for name in list(self.schedulers):
            self._stop(name, failover=True)  # the tasks keep running: a standby takes over
        for driver in self.stopping:
            driver.join(2.0)
        if self.subscriber is not None:
            self.subscriber.close()
        self.masters.close()
        super().close(linger_ms)
