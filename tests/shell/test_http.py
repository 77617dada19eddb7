"""The status server: routes run on the reactor, a Deferred finishes on the request's thread,
a Direct route never touches the reactor, an ETag saves sending an unchanged document, and a
broken route answers 500 without harming the reactor."""

from __future__ import annotations

import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator

import pytest

from services.bus.reactor import Reactor
from services.shell import http as http_module
from services.shell.http import Deferred, Direct, Query, Response, StatusServer, prefer_wait


def get(url: str, etag: str = "") -> tuple[int, bytes, str]:
    req = urllib.request.Request(url, headers={"If-None-Match": etag} if etag else {})
    try:
        with urllib.request.urlopen(req, timeout=10) as resp:
            return resp.status, resp.read(), resp.headers.get("ETag", "")
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read(), exc.headers.get("ETag", "")


class Fetch:
    """A GET on its own thread (the test's thread runs the reactor)."""

    def __init__(self, url: str) -> None:
        self.result: tuple[int, bytes, str] | None = None
        self._thread = threading.Thread(target=self._run, args=(url,), daemon=True)
        self._thread.start()

    def _run(self, url: str) -> None:
        self.result = get(url)


@pytest.fixture
def reactor() -> Iterator[Reactor]:
    yield Reactor()


def serve(reactor: Reactor, routes: dict[str, object]) -> StatusServer:
    return StatusServer(reactor, "127.0.0.1", 0, routes)  # type: ignore[arg-type]


def test_direct_and_deferred_work_runs_while_the_reactor_runs_on(reactor: Reactor) -> None:
    """Each waits for a reactor timer to fire: on the reactor's thread it would wait in vain
    (the timer cannot fire while the reactor is held)."""
    fired = threading.Event()
    on_reactor: list[bool] = []
    reactor_thread = threading.get_ident()

    def direct(query: Query) -> Response:
        on_reactor.append(threading.get_ident() == reactor_thread)
        assert fired.wait(5)
        return Response(200, "text/plain", b"direct")

    def deferred(query: Query) -> Deferred:
        on_reactor.append(threading.get_ident() == reactor_thread)  # this part: on it

        def rest() -> Response:
            on_reactor.append(threading.get_ident() == reactor_thread)
            assert fired.wait(5)
            return Response(200, "text/plain", b"deferred")
        return rest

    server = serve(reactor, {"/direct": Direct(direct), "/deferred": deferred})
    try:
        fetches = [Fetch(server.url + "/direct"), Fetch(server.url + "/deferred")]
        assert reactor.run(until=lambda: len(on_reactor) == 3, timeout=10)
        reactor.call_later(0.05, fired.set)
        assert reactor.run(until=lambda: all(f.result for f in fetches), timeout=10)
        assert [f.result[:2] for f in fetches if f.result] == [(200, b"direct"),
                                                                (200, b"deferred")]
        assert sorted(on_reactor) == [False, False, True]
    finally:
        server.close()


def test_an_unchanged_document_is_not_sent_again(reactor: Reactor) -> None:
    version = ["1"]
    server = serve(reactor, {"/doc": Direct(lambda q: Response(
        200, "application/json", b'{"v": %s}' % version[0].encode(), f'"v{version[0]}"'))})
    try:
        status, body, etag = get(server.url + "/doc")
        assert (status, body, etag) == (200, b'{"v": 1}', '"v1"')
        assert get(server.url + "/doc", etag) == (304, b"", '"v1"')
        version[0] = "2"
        assert get(server.url + "/doc", etag) == (200, b'{"v": 2}', '"v2"')
    finally:
        server.close()


def test_a_broken_route_answers_500_and_the_server_goes_on(reactor: Reactor) -> None:
    def broken(query: Query) -> Response:
        raise KeyError("bug")

    server = serve(reactor, {"/direct": Direct(broken), "/deferred": lambda q: lambda: broken(q),
                             "/ok": lambda q: Response(200, "text/plain", b"ok")})
    try:
        assert get(server.url + "/direct")[0] == 500
        late = Fetch(server.url + "/deferred")
        assert reactor.run(until=lambda: late.result is not None, timeout=10)
        assert late.result is not None and late.result[0] == 500
        ok = Fetch(server.url + "/ok")
        assert reactor.run(until=lambda: ok.result is not None, timeout=10)
        assert ok.result is not None and ok.result[:2] == (200, b"ok")
    finally:
        server.close()


class Changing:
    """A document whose version another thread bumps; `changes` as StateView's handovers."""

    def __init__(self) -> None:
        self.version = 1
        self.cond = threading.Condition()
        self.waiting = threading.Event()  # a request is held, waiting for a change

    def route(self, query: Query) -> Response:
        with self.cond:
            v = self.version
        return Response(200, "application/json", b'{"v": %d}' % v, f'"v{v}"')

    def changes(self, seen: int, timeout: float) -> int:
        with self.cond:
            if seen >= 0:
                self.waiting.set()
            self.cond.wait_for(lambda: self.version != seen, timeout)
            return self.version

    def bump(self) -> None:
        with self.cond:
            self.version += 1
            self.cond.notify_all()


def get_waiting(url: str, etag: str, prefer: str) -> tuple[int, bytes, str]:
    req = urllib.request.Request(url, headers={"If-None-Match": etag, "Prefer": prefer})
    try:
        with urllib.request.urlopen(req, timeout=30) as resp:
            return resp.status, resp.read(), resp.headers.get("ETag", "")
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read(), exc.headers.get("ETag", "")


def hold_v1(url: str, doc: Changing) -> tuple[threading.Thread, list[tuple[int, bytes, str]]]:
    """A GET of `url` asking to wait while it is still "v1", once the server holds it."""
    result: list[tuple[int, bytes, str]] = []
    held = threading.Thread(target=lambda: result.append(get_waiting(url, '"v1"', "wait=20")),
                            daemon=True)
    held.start()
    assert doc.waiting.wait(10), "the request was not held"
    return held, result


def test_prefer_wait_holds_an_unchanged_answer_until_the_document_changes(
        reactor: Reactor) -> None:
    """A follower (`offerbus run` waiting for its instances) saw a change up to a poll
    interval late. With `Prefer: wait=N` and an If-None-Match naming the current ETag, the
    answer is held until the document changes: the new one comes as soon as it exists."""
    doc = Changing()
    server = serve(reactor, {"/doc": Direct(doc.route, doc.changes)})
    try:
        held, result = hold_v1(server.url + "/doc", doc)
        assert not result  # still held: unchanged
        doc.bump()
        held.join(10)
        assert result == [(200, b'{"v": 2}', '"v2"')]
        # Unchanged for the whole wait: the 304, after it (not at once).
        asked = time.monotonic()
        assert get_waiting(server.url + "/doc", '"v2"', "wait=0.3") == (304, b"", '"v2"')
        assert time.monotonic() - asked >= 0.3
        # An ETag that is not the current one: the document at once, as without Prefer.
        assert get_waiting(server.url + "/doc", '"v1"', "wait=20")[0] == 200
    finally:
        server.close()


def test_a_bad_or_unsupported_prefer_wait_is_answered_at_once(reactor: Reactor) -> None:
    doc = Changing()
    server = serve(reactor, {"/doc": Direct(doc.route, doc.changes),
                             "/plain": Direct(doc.route)})
    try:
        for prefer in ("wait=abc", "wait=-1", "wait=nan", "respond-async", ""):
            assert get_waiting(server.url + "/doc", '"v1"', prefer) == (304, b"", '"v1"')
        # A route that cannot tell changes answers at once, whatever is asked.
        assert get_waiting(server.url + "/plain", '"v1"', "wait=20") == (304, b"", '"v1"')
        assert not doc.waiting.is_set()
    finally:
        server.close()


def test_requests_beyond_max_waiting_are_answered_at_once(
        reactor: Reactor, monkeypatch: pytest.MonkeyPatch) -> None:
    """Each held request holds a thread: at most MAX_WAITING are held, the rest answered."""
    monkeypatch.setattr(http_module, "MAX_WAITING", 1)
    doc = Changing()
    server = serve(reactor, {"/doc": Direct(doc.route, doc.changes)})
    try:
        held, result = hold_v1(server.url + "/doc", doc)
        assert get_waiting(server.url + "/doc", '"v1"', "wait=20") == (304, b"", '"v1"')
        doc.bump()
        held.join(10)
        assert result == [(200, b'{"v": 2}', '"v2"')]
    finally:
        server.close()


def test_prefer_wait_is_read_as_rfc_7240_spells_it() -> None:
    assert prefer_wait("wait=5") == 5.0
    assert prefer_wait("respond-async, wait=2.5") == 2.5
    assert prefer_wait("Wait = 1 ; foo") == 1.0
    assert prefer_wait("wait=1e9") == http_module.MAX_WAIT_S
    assert prefer_wait("wait=") == prefer_wait("wait=0") == prefer_wait("handling=lenient") == 0
