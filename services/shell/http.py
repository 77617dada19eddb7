"""A small HTTP endpoint (/state, /metrics, /health, ...) for a service. Requests are served
on a thread each. A route runs on the service's reactor thread (through a Mailbox), so it
reads the core's state without locks and sees it fresh; it may return a `Deferred` to finish
the work (say, the JSON encoding) back on the request's thread. A `Direct` route runs on the
request's thread only and never waits for the reactor: for views kept off the reactor
(issue 8: a scrape never delays heartbeats). A response with an ETag answers 304 to a
request whose If-None-Match names it; a `Direct` route that can tell changes (`changes`)
answers such a request with `Prefer: wait=N` (RFC 7240) once its document changed, or with
the 304 after N seconds (at most MAX_WAIT_S; at most MAX_WAITING requests wait at once,
others are answered at once): a client follows the document without polling. A `Stream`
route runs on the request's thread too and answers with chunks as it makes them (Server-Sent
Events), at most MAX_STREAMS at once.

With a `token` (issue 11), every path but the `open` ones (/health: liveness checks) wants
it, as `Authorization: Bearer TOKEN` or as the TOKEN_COOKIE cookie; a browser gets the
cookie by opening any path once with `?token=TOKEN` (answered by a redirect to the same path
without it, so the token leaves the address bar and the history). Anything else is a 401,
counted (`unauthorized`). Tokens are compared with hmac.compare_digest."""

from __future__ import annotations

import hmac
import math
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from functools import partial
from http.cookies import CookieError, SimpleCookie
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, TypeVar
from urllib.parse import parse_qs, urlencode, urlsplit

from services.bus.log import get_logger
from services.bus.mailbox import Mailbox
from services.bus.reactor import Reactor

log = get_logger("shell.http")

HANDLER_TIMEOUT = 5.0
MAX_WAIT_S = 30.0  # the longest `Prefer: wait=N` honoured
MAX_WAITING = 64  # requests waiting for a change at once (each holds a thread); more: at once
MAX_STREAMS = 16  # open Stream answers (each holds a thread); more are answered 503
TOKEN_COOKIE = "offerbus_token"  # the bearer token as a browser keeps it (HttpOnly, Strict)
OPEN_PATHS = frozenset({"/health"})  # answered without the token: liveness checks
UNAUTHORIZED_LOG_GAP_S = 60.0  # refused requests are logged at most once per gap (counted all)


Query = dict[str, list[str]]


@dataclass
class Response:
    status: int
    content_type: str
    body: bytes
    etag: str = ""  # a quoted entity tag, or "" for none
    headers: tuple[tuple[str, str], ...] = ()  # more headers (say, Content-Security-Policy)


Deferred = Callable[[], Response]  # the rest of a route's work, on the request's thread
Handler = Callable[[Query], Response | Deferred]  # a plain route, or a Direct one


@dataclass(frozen=True)
class Direct:
    """A route run on the request's thread, never on the reactor: it must read only what
    is safe to read from another thread. `changes(seen, timeout)`, if given, blocks until a
    change numbered after `seen` may have altered the route's answers (or `timeout` s) and
    returns the latest change's number (`changes(-1, 0)`: the current one at once): the
    route then honours `Prefer: wait=N`."""

    route: Callable[[Query], Response]
    changes: Callable[[int, float], int] | None = None

    def __call__(self, query: Query) -> Response:
        return self.route(query)


@dataclass(frozen=True)
class Stream:
    """A route run on the request's thread whose answer goes on: a Response (an error,
    say), or the chunks of a `content_type` body, written as they come until the client
    leaves, the iterator ends or the server closes. It must read only what is safe to read
    from another thread, and yield now and then (a keep-alive) even when idle."""

    route: Callable[[Query], Response | Iterator[bytes]]
    content_type: str = "text/event-stream; charset=utf-8"


Route = Handler | Stream


@dataclass
class _Pending:
    route: Handler
    query: Query
    done: threading.Event
    response: Response | Deferred | None = None


class StatusServer:
    def __init__(self, reactor: Reactor, host: str, port: int, routes: dict[str, Route], *,
                 token: str = "", open_paths: frozenset[str] = OPEN_PATHS) -> None:
        self.routes = routes
        self._token = token.encode()
        self._open_paths = open_paths
        self.unauthorized = 0  # requests refused for a missing or wrong token
        self._unauthorized_lock = threading.Lock()
        self._unauthorized_logged = -UNAUTHORIZED_LOG_GAP_S
        self._mailbox: Mailbox[_Pending] = Mailbox()
        self._streams = threading.BoundedSemaphore(MAX_STREAMS)
        self._waiting = threading.BoundedSemaphore(MAX_WAITING)
        self._closed = threading.Event()
        reactor.add_reader(self._mailbox, self._serve_pending)
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                url = urlsplit(self.path)
                query = parse_qs(url.query)
                if outer._token and url.path not in outer._open_paths \
                        and not self._authorized(url.path, query):
                    return  # (before the 404: its list of paths is for the authorised)
                route = outer.routes.get(url.path)
                if route is None:
                    known = ", ".join(sorted(outer.routes))
                    body = f"no such path; try {known}\n".encode()
                    self._reply(Response(404, "text/plain", body))
                    return
                if isinstance(route, Stream):
                    self._stream(route, query)
                    return
                if isinstance(route, Direct):
                    self._reply(self._direct(route, query))
                    return
                pending = _Pending(route, query, threading.Event())
                outer._mailbox.put(pending)
                if not pending.done.wait(HANDLER_TIMEOUT) or pending.response is None:
                    self._reply(Response(503, "text/plain", b"service busy; try again\n"))
                    return
                resp = pending.response
                self._reply(resp if isinstance(resp, Response) else _guarded(resp))

            def _direct(self, route: Direct, query: Query) -> Response:
                """The route's answer; with `Prefer: wait=N` and an If-None-Match that
                names it, the first answer with another ETag (or that one after N s)."""
                tags = self.headers.get("If-None-Match", "")
                wait = prefer_wait(self.headers.get("Prefer", ""))
                if route.changes is None or not tags or not wait:
                    return _guarded(partial(route, query))
                if not outer._waiting.acquire(blocking=False):
                    return _guarded(partial(route, query))  # too many wait: answered now
                try:
                    deadline = time.monotonic() + wait
                    seen = route.changes(-1, 0.0)  # before the answer: no change is missed
                    while True:
                        resp = _guarded(partial(route, query))
                        left = deadline - time.monotonic()
                        if resp.status != 200 or not resp.etag or resp.etag not in tags \
                                or left <= 0 or outer._closed.is_set():
                            return resp
                        seen = route.changes(seen, min(left, 1.0))  # (1 s: sees a close)
                finally:
                    outer._waiting.release()

            def _authorized(self, path: str, query: Query) -> bool:
                """True to serve the request; otherwise it has been answered (a 401, or
                the redirect that sets the cookie)."""
                given = query.pop("token", None)
                if given is not None:
                    if not outer.token_matches(given[-1]):
                        outer.refused(path, self.client_address[0], "wrong ?token=")
                        self._reply(_unauthorized("the token given in ?token= is wrong"))
                        return False
                    rest = urlencode(query, doseq=True)
                    cookie = (f"{TOKEN_COOKIE}={given[-1]}; Path=/; HttpOnly; "
                              "SameSite=Strict")
                    self._reply(Response(303, "text/plain", b"token accepted\n", headers=(
                        ("Location", path + (f"?{rest}" if rest else "")),
                        ("Set-Cookie", cookie), ("Cache-Control", "no-store"))))
                    return False
                header = self.headers.get("Authorization", "")
                scheme, _, bearer = header.partition(" ")
                if header and scheme.lower() == "bearer":
                    if outer.token_matches(bearer.strip()):
                        return True
                    why = "wrong bearer token"
                else:
                    kept = _cookie(self.headers.get("Cookie", ""))
                    if kept is not None and outer.token_matches(kept):
                        return True
                    why = "wrong token cookie" if kept is not None else "no token"
                outer.refused(path, self.client_address[0], why)
                self._reply(_unauthorized(
                    "this server wants a token: send `Authorization: Bearer TOKEN` (the "
                    "CLI: set OFFERBUS_HTTP_TOKEN), or open this path once with "
                    f"?token=TOKEN in a browser ({why})"))
                return False

            def _reply(self, resp: Response) -> None:
                if resp.etag and resp.status == 200 and resp.etag in self.headers.get(
                        "If-None-Match", ""):
                    self.send_response(304)
                    self.send_header("ETag", resp.etag)
                    self.end_headers()
                    return
                self.send_response(resp.status)
                self.send_header("Content-Type", resp.content_type)
                self.send_header("Content-Length", str(len(resp.body)))
                if resp.etag:
                    self.send_header("ETag", resp.etag)
                for name, value in resp.headers:
                    self.send_header(name, value)
                self.end_headers()
                self.wfile.write(resp.body)

            def _stream(self, route: Stream, query: Query) -> None:
                if not outer._streams.acquire(blocking=False):
                    self._reply(Response(503, "text/plain", b"too many streams open\n"))
                    return
                try:
                    answer = route.route(query)
                except Exception as exc:  # a broken view must not take the service down
                    log.error("http handler failed", error=repr(exc))
                    answer = Response(500, "text/plain", f"error: {exc}\n".encode())
                if isinstance(answer, Response):  # no stream: the place is free before
                    outer._streams.release()      # the client can read the answer
                    self._reply(answer)
                    return
                try:
                    self.send_response(200)
                    self.send_header("Content-Type", route.content_type)
                    self.send_header("Cache-Control", "no-cache")
                    self.end_headers()
                    for chunk in answer:
                        if outer._closed.is_set():
                            break
                        self.wfile.write(chunk)
                        self.wfile.flush()
                except (BrokenPipeError, ConnectionResetError):
                    pass  # the client left
                except Exception as exc:  # a broken stream must not take the service down
                    log.error("http stream failed", error=repr(exc))
                finally:
                    outer._streams.release()
                    self.close_connection = True

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

    def token_matches(self, given: str) -> bool:
        return hmac.compare_digest(given.encode(), self._token)

    def refused(self, path: str, peer: str, why: str) -> None:
        """Count a request refused for its token; log it (at most once per gap)."""
        now = time.monotonic()
        with self._unauthorized_lock:
            self.unauthorized += 1
            count = self.unauthorized
            quiet = now - self._unauthorized_logged < UNAUTHORIZED_LOG_GAP_S
            if not quiet:
                self._unauthorized_logged = now
        if not quiet:
            log.warning("http request refused: no valid token", path=path, peer=peer,
                        why=why, refused_so_far=count)

    def _serve_pending(self) -> None:
        for pending in self._mailbox.drain():
            pending.response = _guarded(partial(pending.route, pending.query))
            pending.done.set()

    def close(self) -> None:
        self._closed.set()
        self._server.shutdown()
        self._server.server_close()
        self._reactor.remove_reader(self._mailbox)
        self._mailbox.close()


R = TypeVar("R", Response, Response | Deferred)


def prefer_wait(header: str) -> float:
    """Seconds of a `Prefer: wait=N` header (RFC 7240), at most MAX_WAIT_S; 0 for none or a
    malformed one (answered at once, as if not asked)."""
    for pref in header.split(","):
        name, _, value = pref.partition("=")
        if name.strip().lower() == "wait":
            try:
                seconds = float(value.strip().split(";")[0])
            except ValueError:
                return 0.0
            return min(seconds, MAX_WAIT_S) if math.isfinite(seconds) and seconds > 0 else 0.0
    return 0.0


def _guarded(fn: Callable[[], R]) -> R | Response:
    try:
        return fn()
    except Exception as exc:  # a broken view must not take the service down
        log.error("http handler failed", error=repr(exc))
        return Response(500, "text/plain", f"error: {exc}\n".encode())


def _unauthorized(message: str) -> Response:
    return Response(401, "text/plain; charset=utf-8", f"401 unauthorized: {message}\n".encode(),
                    headers=(("WWW-Authenticate", 'Bearer realm="offerbus"'),))


def _cookie(header: str) -> str | None:
    """The token cookie's value in a Cookie header, or None."""
    try:
        jar = SimpleCookie(header)
    except CookieError:
        return None
    morsel = jar.get(TOKEN_COOKIE)
    return None if morsel is None else morsel.value


REDACTED = "<redacted>"  # an environment variable's value as /state shows it


def redacted(doc: Any) -> Any:
    """`doc` (a record as MessageToDict makes it) with the value of every environment
    variable (a CommandInfo's `env`: the task's, its health check's) replaced by REDACTED."""
    if isinstance(doc, dict):
        return {k: {name: REDACTED for name in v} if k == "env" and isinstance(v, dict)
                else redacted(v) for k, v in doc.items()}
    if isinstance(doc, list):
        return [redacted(v) for v in doc]
    return doc


def json_response(body: bytes) -> Response:
    return Response(200, "application/json", body)


def text_response(body: str, content_type: str = "text/plain; version=0.0.4") -> Response:
    return Response(200, content_type, body.encode())
