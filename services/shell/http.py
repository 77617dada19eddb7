"""A small HTTP endpoint (/state, /metrics, /health, ...) for a service. Requests are served
on a thread, but every handler runs on the service's reactor thread (through a Mailbox), so
handlers read the core's state without locks and see it fresh."""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlsplit

from services.bus.log import get_logger
from services.bus.mailbox import Mailbox
from services.bus.reactor import Reactor

log = get_logger("shell.http")

HANDLER_TIMEOUT = 5.0


@dataclass
class Response:
    status: int
    content_type: str
    body: bytes


Route = Callable[[dict[str, list[str]]], Response]


@dataclass
class _Pending:
    route: Route
    query: dict[str, list[str]]
    done: threading.Event
    response: Response | None = None


class StatusServer:
    def __init__(self, reactor: Reactor, host: str, port: int, routes: dict[str, Route]) -> None:
        self.routes = routes
        self._mailbox: Mailbox[_Pending] = Mailbox()
        reactor.add_reader(self._mailbox, self._serve_pending)
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                url = urlsplit(self.path)
                route = outer.routes.get(url.path)
                if route is None:
                    known = ", ".join(sorted(outer.routes))
                    body = f"no such path; try {known}\n".encode()
                    self._reply(Response(404, "text/plain", body))
                    return
                pending = _Pending(route, parse_qs(url.query), threading.Event())
                outer._mailbox.put(pending)
                if not pending.done.wait(HANDLER_TIMEOUT) or pending.response is None:
                    self._reply(Response(503, "text/plain", b"service busy; try again\n"))
                    return
                self._reply(pending.response)

            def _reply(self, resp: Response) -> None:
                self.send_response(resp.status)
                self.send_header("Content-Type", resp.content_type)
                self.send_header("Content-Length", str(len(resp.body)))
                self.end_headers()
                self.wfile.write(resp.body)

            def log_message(self, format: str, *args: object) -> None:
                pass  # access logs would drown the service's own lines

        self._server = ThreadingHTTPServer((host, port), Handler)
        self._server.daemon_threads = True
        self.port: int = self._server.server_address[1]
        self.url = f"http://{host}:{self.port}"
        self._thread = threading.Thread(target=self._server.serve_forever, name="http",
                                        daemon=True)
        self._thread.start()
        self._reactor = reactor

    def _serve_pending(self) -> None:
        for pending in self._mailbox.drain():
            try:
                pending.response = pending.route(pending.query)
            except Exception as exc:  # a broken view must not take the service down
                log.error("http handler failed", error=repr(exc))
                pending.response = Response(500, "text/plain", f"error: {exc}\n".encode())
            pending.done.set()

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._reactor.remove_reader(self._mailbox)
        self._mailbox.close()


def json_response(body: bytes) -> Response:
    return Response(200, "application/json", body)


def text_response(body: str, content_type: str = "text/plain; version=0.0.4") -> Response:
    return Response(200, content_type, body.encode())
