"""The status server: routes run on the reactor, a Deferred finishes on the request's thread,
a Direct route never touches the reactor, an ETag saves sending an unchanged document, and a
broken route answers 500 without harming the reactor."""

from __future__ import annotations

import threading
import urllib.error
import urllib.request
from collections.abc import Iterator

import pytest

from services.bus.reactor import Reactor
from services.shell.http import Deferred, Direct, Query, Response, StatusServer


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
