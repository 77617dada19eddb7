"""The agent emulator's shell: one leader detector and one DEALER to the leading master for
all virtual agents (each on its own bus channel, services/bus/peer.py), the AgentsCore's
commands carried out, one timer re-armed from its next deadline, and /health /state /metrics
like every service (services/shell/service.py)."""

from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass
from typing import Any

from schemas import common_pb2
from services.agent.status_updates import RETRY_INITIAL_S
from services.bus import codec
from services.bus.election import LeaderChanged, detector_from_url
from services.bus.epoch import EpochFence
from services.bus.log import get_logger
from services.bus.peer import DealerClient
from services.bus.reactor import Reactor
from services.emulator.agents import REGISTER_WINDOW, AgentsCore, Reg, ToMaster
from services.resources import Resources
from services.shell.http import Response, json_response
from services.shell.service import ServiceConfig, ServiceKit

log = get_logger("emulator")

MASTER = codec.Role.Value("ROLE_MASTER")
AGENT_RESOURCES = "cpus:{cpus};mem:{mem};disk:10240;ports:[31000-32000]"


@dataclass
class AgentsConfig(ServiceConfig):
    cluster_url: str
    count: int = 100
    cpus: float = 4.0
    mem: int = 8192
    task_run_s: float = math.inf  # a task's run time unless its label says; inf: until killed
    window: int = REGISTER_WINDOW
    update_retry_s: float = RETRY_INITIAL_S  # first resend of an unacknowledged update
    prefix: str = "emu"  # virtual agent i is named (and its channel is) f"{prefix}-{i:05d}"


def agent_names(prefix: str, count: int) -> list[str]:
    return [f"{prefix}-{i:05d}" for i in range(count)]


class AgentsShell(ServiceKit):
    def __init__(self, config: AgentsConfig, reactor: Reactor | None = None) -> None:
        super().__init__("emulator_agents", f"{config.prefix}-emulator",
                         codec.Role.Value("ROLE_AGENT"), config, reactor)
        self.config = config
        http = self.start_http({"/state": self._http_state})
        resources = Resources.parse(AGENT_RESOURCES.format(cpus=config.cpus, mem=config.mem))
        infos = []
        for name in agent_names(config.prefix, config.count):
            info = common_pb2.AgentInfo(hostname=name, address=config.host, endpoint=http.url,
                                        version="offerbus-emulator-0.1")
            info.resources.extend(resources.to_proto())
            infos.append(info)
        self.core = AgentsCore(infos, nonce=os.urandom(8), run_s=config.task_run_s,
                               window=config.window, update_retry_s=config.update_retry_s)
        self.fence = EpochFence(frozenset({MASTER}))
        self.master = DealerClient(
            self.reactor, self.ctx, self.sender, self._on_master,
            on_connected=self._master_connected, on_gone=self._master_gone,
            heartbeat=self.beat, stats=self.stats, fence=self.fence, name="master")
        self.detector = detector_from_url(config.cluster_url, "master")
        self.reactor.add_reader(self.detector, self._on_leader)
        self.driver.on(ToMaster, self._to_master)
        self._register_metrics()
        self.driver.attach(self.core)
        self.detector.start()
        log.info("agent emulator started", agents=config.count, cpus=config.cpus,
                 mem=config.mem, task_run_s=config.task_run_s, window=config.window,
                 http=http.url)

    # -- the master ------------------------------------------------------------------------
    def _on_leader(self) -> None:
        for event in self.detector.events():
            if not isinstance(event, LeaderChanged):
                continue
            leader = event.leader
            self.fence.follow(MASTER, leader)
            if leader is None or "front" not in leader.endpoints:
                log.warning("no leading master")
                self.master.disconnect()
                self.driver.step(self.core.master_lost)
                continue
            log.info("leading master", id=leader.member_id, epoch=leader.epoch,
                     endpoint=leader.endpoints["front"])
            self.master.connect(leader.endpoints["front"])

    def _master_connected(self) -> None:
        self.driver.step(self.core.master_detected)

    def _master_gone(self) -> None:
        self.driver.step(self.core.master_lost)

    def _on_master(self, env: codec.Envelope) -> None:
        kind = codec.payload_kind(env)
        if kind == "agent_event":
            self.driver.step(lambda now: self.core.master_event(env.channel, env.agent_event,
                                                                now))
        elif kind == "error":
            log.debug("master refused", channel=env.channel, code=env.error.code,
                      message=env.error.message)
            self.driver.step(lambda now: self.core.master_error(env.channel, env.error.code,
                                                                now))
        else:
            self.stats.inc("frames_dropped{reason=unexpected}")

    def _to_master(self, cmd: ToMaster) -> None:
        env = codec.Envelope()
        env.agent_call.CopyFrom(cmd.call)
        if not self.master.send(env, channel=cmd.channel):
            self.stats.inc("master_calls_unsent")

    # -- HTTP and metrics ----------------------------------------------------------------
    def health(self) -> dict[str, Any]:
        return {"agents": dict(self.core.by_state()), "tasks": self.core.tasks,
                "master_connected": self.master.connected}

    def _http_state(self, query: dict[str, list[str]]) -> Response:
        core = self.core
        state = {"agents": dict(core.by_state()), "tasks": core.tasks,
                 "running": core.running(), "counts": dict(core.counts),
                 "agent_ids": len(core.by_id)}
        return json_response(json.dumps(state, sort_keys=True).encode())

    def _register_metrics(self) -> None:
        m, core = self.metrics, self.core
        m.labelled_gauge("agents", "Virtual agents by registration state.", "state",
                         lambda: {r.value: float(core.by_state().get(r.value, 0))
                                  for r in Reg})
        m.gauge("agents_registered", "Virtual agents registered with the leading master.",
                value=lambda: float(core.by_state().get(Reg.REGISTERED.value, 0)))
        m.gauge("tasks", "Tasks the virtual agents know (running, or ended and not yet "
                "acknowledged).", value=lambda: float(core.tasks))
        m.gauge("tasks_running", "Tasks whose latest state is TASK_RUNNING.",
                value=lambda: float(core.running()))
        m.labelled_counter("events", "What the virtual agents did (registrations, updates "
                           "sent/acked/retried, tasks launched/finished/killed, ...).",
                           "event", lambda: {k: float(v) for k, v in core.counts.items()})

    def close(self, linger_ms: int = 0) -> None:
        self.reactor.remove_reader(self.detector)
        self.detector.close()
        self.master.close()
        super().close(linger_ms)


__all__ = ["AgentsConfig", "AgentsShell", "agent_names"]
