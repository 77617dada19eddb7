"""The master's web dashboard: a static page (services/master/static/: HTML, CSS and script,
nothing fetched from anywhere else) served from the status server, and /state/events: the
/state document (same query) as Server-Sent Events, one each time it changed, fed by the
StateView's handovers (nothing per client on the reactor). The page follows the events and
falls back to polling /state with its ETag every POLL_MS. The page's routes are `Direct`:
bytes read once."""

from __future__ import annotations

import hashlib
import time
from collections.abc import Iterator
from functools import cache
from pathlib import Path

from services.master.view import BadQuery, StateView
from services.shell.http import Direct, Query, Response, Route, Stream

STATIC = Path(__file__).parent / "static"
POLL_MS = 1000  # how often the page asks /state without events (a 304 when unchanged)
KEEPALIVE_S = 15.0  # an idle event stream sends a comment this often (proxies, dead peers)
MIN_EVENT_GAP_S = 0.25  # a stream sends at most one document per gap (changes coalesce)
# The page runs only its own script and style and talks only to this master; a string that
# slipped through as markup still could not run anything.
CSP = ("default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; "
       "img-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'")
FILES = {"/": ("dashboard.html", "text/html; charset=utf-8"),
         "/dashboard": ("dashboard.html", "text/html; charset=utf-8"),
         "/dashboard.js": ("dashboard.js", "text/javascript; charset=utf-8"),
         "/dashboard.css": ("dashboard.css", "text/css; charset=utf-8")}


@cache
def _file(name: str) -> tuple[bytes, str]:
    """(body, ETag) of one static file, read once."""
    body = (STATIC / name).read_bytes().replace(b"@POLL_MS@", str(POLL_MS).encode())
    return body, f'"{hashlib.sha256(body).hexdigest()[:16]}"'


def _route(name: str, content_type: str) -> Route:
    def serve(query: Query) -> Response:
        body, etag = _file(name)
        return Response(200, content_type, body, etag, headers=(
            ("Content-Security-Policy", CSP), ("X-Content-Type-Options", "nosniff"),
            ("Cache-Control", "no-cache")))
    return Direct(serve)


ROUTES: dict[str, Route] = {path: _route(name, kind) for path, (name, kind) in FILES.items()}


def state_events(view: StateView) -> Stream:
    """/state/events?QUERY: an `event: state` with the /state document of QUERY whenever it
    changed (the first at once), `event: idle` with {"leading": false, ...} while this
    master does not lead; a bad QUERY is a 400 before any event."""

    def stream(query: Query) -> Response | Iterator[bytes]:
        try:
            view.document(query)
        except BadQuery as exc:
            return Response(400, "text/plain", f"{exc}\n".encode())
        return _events(view, query)

    return Stream(stream)


def _events(view: StateView, query: Query) -> Iterator[bytes]:
    seen, sent = -1, ""
    yield b"retry: 2000\n\n"
    while True:
        handed = view.wait_handover(seen, KEEPALIVE_S)
        if handed == seen:
            yield b": idle\n\n"
            continue
        seen = handed
        status, body, etag = view.document(query)
        tag = etag if status == 200 else f"{status}:{body!r}"
        if tag == sent:
            continue
        sent = tag
        kind = b"state" if status == 200 else b"idle"
        yield b"event: %s\ndata: %s\n\n" % (kind, body)  # JSON on one line
        time.sleep(MIN_EVENT_GAP_S)  # the next changes wait and go as one document
