"""The skeleton every service process shares: reactor, ZeroMQ context, bus counters and
Prometheus metrics, the status HTTP server (/health, /metrics, /traces: this process's
spans, and the service's own routes), the core driver, and, for the elected services, the
leader lifecycle. A service's shell subclasses `ServiceKit` and adds its sockets and its
core; nothing here decides."""

from __future__ import annotations

import json
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import zmq

from services.bus.curve import (
    CurveAuthority,
    CurveClient,
    CurveServer,
    list_public_keys,
    load_public_key,
    load_secret,
)
from services.bus.log import get_logger
from services.bus.peer import HeartbeatConfig, Sender
from services.bus.reactor import Reactor
from services.bus.stats import Stats
from services.shell.config import DEFAULT_HOST
from services.shell.driver import CoreDriver
from services.shell.http import Direct, Response, Route, StatusServer
from services.shell.leader import LeaderLifecycle
from services.shell.metrics import CONTENT_TYPE, Metrics
from services.telemetry import query as trace_query
from services.telemetry import trace_file

TRACE_QUERIES = 2  # /traces scans at once per process (each reads files); more: a 503


@dataclass(kw_only=True)
class ServiceConfig:
    """What every service's configuration holds (the kit's COMMON options)."""

    host: str = DEFAULT_HOST  # address to bind (0.0.0.0: every interface)
    advertise_host: str = ""  # address others connect to; "" = host
    http_port: int = 0  # /health, /metrics; 0 = any free port
    http_token: str = ""  # a bearer token every HTTP path but /health wants ("": none)
    heartbeat_interval: float = 1.0
    max_missed: int = 5
    curve_secret_key_file: str = ""  # this service's CURVE cert; "" = no CURVE (dev cluster)
    curve_allowed_dir: str = ""  # public certs of the peers allowed to connect (servers)
    curve_server_key_file: str = ""  # public cert of the central services it connects to


class Curve:
    """A process's CURVE setup from its ServiceConfig: the ZAP handler of its context (the
    allowed client keys; refusals counted) and what its server and client sockets apply.
    Off (both None) without `curve_secret_key_file`. ValueError on a bad file or directory,
    and when a role asks for a side it was not given the file of."""

    def __init__(self, ctx: zmq.Context[zmq.Socket[bytes]], config: ServiceConfig) -> None:
        self.on = bool(config.curve_secret_key_file)
        self.authority: CurveAuthority | None = None
        self._server: CurveServer | None = None
        self._client: CurveClient | None = None
        if not self.on:
            if config.curve_allowed_dir or config.curve_server_key_file:
                raise ValueError("curve_allowed_dir and curve_server_key_file need "
                                 "curve_secret_key_file (this service's own key)")
            return
        keys = load_secret(Path(config.curve_secret_key_file))
        if config.curve_allowed_dir:
            allowed_dir = Path(config.curve_allowed_dir)
            if not allowed_dir.is_dir():
                raise ValueError(f"curve_allowed_dir {allowed_dir}: no such directory")
            named = list_public_keys(allowed_dir)  # NAME.key: the principal NAME
            self.authority = CurveAuthority(ctx, {key for _, key in named},
                                            {key: name for name, key in named})
            self._server = CurveServer(keys)
        if config.curve_server_key_file:
            self._client = CurveClient(keys,
                                       load_public_key(Path(config.curve_server_key_file)))

    @property
    def server(self) -> CurveServer | None:
        """What a bound socket applies (None: CURVE off)."""
        if self.on and self._server is None:
            raise ValueError("this service accepts connections: with curve_secret_key_file "
                             "it needs curve_allowed_dir (the peers it admits)")
        return self._server

    @property
    def client(self) -> CurveClient | None:
        """What a connecting socket applies (None: CURVE off)."""
        if self.on and self._client is None:
            raise ValueError("this service connects to the central services: with "
                             "curve_secret_key_file it needs curve_server_key_file")
        return self._client

    @property
    def refused(self) -> int:
        return self.authority.refused if self.authority is not None else 0

    def stop(self) -> None:
        if self.authority is not None:
            self.authority.stop()


class ServiceKit:
    """`service`: the role's name ("master", "broker", ...); `member_id`: this instance's id.
    Subclasses call `start_http(routes)` once their sockets are bound, then `join_election`
    (elected roles) with the endpoints to advertise."""

    # Files beside this process's trace file that /traces serves too (globs): the agent's
    # executors write theirs into its folder.
    trace_neighbours: tuple[str, ...] = ()

    def __init__(self, service: str, member_id: str, role: int, config: ServiceConfig,
                 reactor: Reactor | None = None) -> None:
        self.service, self.member_id = service, member_id
        self.log = get_logger(service)
        self.reactor = reactor or Reactor()
        self.ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
        self.stats = Stats()
        self.metrics = Metrics(service, self.stats)
        try:
            self.curve = Curve(self.ctx, config)
        except ValueError:
            self.ctx.destroy(linger=0)
            raise
        self.metrics.counter_function(
            "curve_refused", "Connections refused by CURVE authentication: a client key not "
            "in curve_allowed_dir (each logged with the key).",
            lambda: float(self.curve.refused))
        self.driver = CoreDriver(self.reactor, self.metrics, self.log)
        self.metrics.counter_function(
            "handler_errors", "Exceptions raised by this process's handlers and timers (each "
            "logged with its traceback; the loop went on).",
            lambda: float(self.reactor.handler_errors))
        self.sender = Sender(member_id, role)
        self.beat = HeartbeatConfig(config.heartbeat_interval, config.max_missed)
        self.host, self._http_port = config.host, config.http_port
        self._http_token = config.http_token
        self.advertise_host = config.advertise_host or config.host
        self.http: StatusServer | None = None
        self.leader: LeaderLifecycle | None = None
        self.endpoints: dict[str, str] = {}
        self._closers: list[Callable[[], None]] = []

    # -- status server -----------------------------------------------------------------------
    def start_http(self, routes: dict[str, Route] | None = None) -> StatusServer:
        self._trace_bad = self.metrics.counter(
            "traces_bad_requests", "/traces requests answered 400 (no span set, or more "
            "than one, named).")
        self._trace_slots = threading.BoundedSemaphore(TRACE_QUERIES)
        self.http = StatusServer(self.reactor, self.host, self._http_port, {
            "/health": self._http_health, "/metrics": self._http_metrics,
            "/traces": Direct(self._http_traces), **(routes or {})},
            token=self._http_token)
        http = self.http
        self.metrics.counter_function(
            "http_unauthorized", "HTTP requests refused for a missing or wrong bearer token "
            "(a 401; the first of each minute is logged).", lambda: float(http.unauthorized))
        self.endpoints["http"] = self.advertised(self.http.url)
        return self.http

    def advertised(self, endpoint: str) -> str:
        """`endpoint` (tcp://H:P or http://H:P, as bound) with the host others connect to."""
        scheme, sep, rest = endpoint.partition("://")
        _, colon, port = rest.rpartition(":")
        return f"{scheme}{sep}{self.advertise_host}{colon}{port}" if sep and colon \
            else endpoint

    def health(self) -> dict[str, Any]:
        """This service's facts for /health (subclasses add theirs)."""
        return {}

    def healthy(self) -> bool:
        """/health answers 200 when true, 503 otherwise (elected roles: while leading, not
        while paused)."""
        return self.leader is None or self.leader.leading

    def _http_health(self, query: dict[str, list[str]]) -> Response:
        body = {"service": self.service, "id": self.member_id,
                "leading": self.leader.leading if self.leader else None,
                "paused": self.leader.paused if self.leader else None,
                "epoch": self.leader.epoch if self.leader else None,
                "endpoints": self.endpoints, **self.health()}
        return Response(200 if self.healthy() else 503, "application/json",
                        json.dumps(body, sort_keys=True).encode())

    def _http_traces(self, query: dict[str, list[str]]) -> Response:
        """This process's spans a query selects (services/telemetry/query.py), read on the
        request's thread (a Direct route: never on the reactor)."""
        if not self._trace_slots.acquire(blocking=False):
            return Response(503, "text/plain", b"too many /traces queries; try again\n")
        try:
            status, body = trace_query.answer(
                trace_query.own_files(trace_file(), self.trace_neighbours), query)
        finally:
            self._trace_slots.release()
        if status == 400:
            self._trace_bad.inc()
        return Response(status, "application/json" if status == 200 else
                        "text/plain; charset=utf-8", body)

    def _http_metrics(self, query: dict[str, list[str]]) -> Response:
        return Response(200, CONTENT_TYPE, self.metrics.exposition())

    # -- leadership ----------------------------------------------------------------------------
    def join_election(self, url: str, *, lead: Callable[[int], None],
                      pause: Callable[[str], None], resume: Callable[[int], None],
                      step_down: Callable[[str], None]) -> LeaderLifecycle:
        """Contend for this role's leadership, advertising `self.endpoints`. The callbacks
        follow services/shell/leader.py: `lead` a new reign, `pause` it (act on nothing,
        keep the state), `resume` it, `step_down` (drop the state)."""
        leaderships = self.metrics.leadership(
            elected=lambda: self.leader is not None and self.leader.leading,
            epoch=lambda: (self.leader.epoch or 0) if self.leader else 0)
        self.metrics.gauge("paused", "1 while this instance's reign is paused (its "
                           "coordinator connection in doubt), else 0.",
                           value=lambda: float(self.leader is not None and self.leader.paused))

        def on_lead(epoch: int) -> None:
            self.sender.epoch = epoch
            leaderships.inc()
            lead(epoch)

        # As others reach them: the host part is the advertised address, not the bound one.
        self.endpoints.update({name: self.advertised(e) for name, e in self.endpoints.items()})
        self.leader = LeaderLifecycle(self.reactor, url, self.service, self.member_id,
                                      self.endpoints, lead=on_lead, pause=pause,
                                      resume=resume, step_down=step_down, stats=self.stats)
        return self.leader

    def held_while_paused(self, call: Callable[[], None]) -> bool:
        """True when this service's reign is paused and `call` was held to run when it
        resumes; False when not paused, or (counted) when the hold is full: the caller
        then answers the request itself (NOT_LEADER)."""
        return self.leader is not None and self.leader.hold(call)

    @property
    def paused(self) -> bool:
        return self.leader is not None and self.leader.paused

    # -- lifecycle ---------------------------------------------------------------------------
    def on_close(self, fn: Callable[[], None]) -> None:
        """Run `fn` on close(), after the leader lifecycle and before the HTTP server; the
        last registered runs first."""
        self._closers.append(fn)

    def run(self) -> None:
        self.reactor.run()

    def close(self, linger_ms: int = 0) -> None:
        if self.leader is not None:
            self.leader.close()
        for fn in reversed(self._closers):
            fn()
        if self.http is not None:
            self.http.close()
        self.driver.detach()
        self.curve.stop()
        self.ctx.destroy(linger=linger_ms)
