"""Stream routes of the status server (Server-Sent Events): chunks reach the client as they
are made, on the request's thread (the reactor is never run here); an error before the
stream is an ordinary answer; at most MAX_STREAMS are open at once, and a client that
leaves frees its place."""

from __future__ import annotations

import http.client
import queue
import threading
import time
from collections.abc import Iterator

import pytest

from services.bus.reactor import Reactor
from services.shell import http as status_http
from services.shell.http import Query, Response, StatusServer, Stream
from tests.waiting import wait_for


def open_stream(server: StatusServer, path: str) -> http.client.HTTPResponse:
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=10)
    conn.request("GET", path)
    return conn.getresponse()


def test_chunks_flow_as_they_are_made_and_the_streams_are_bounded(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(status_http, "MAX_STREAMS", 2)
    feeds: list[queue.SimpleQueue[bytes]] = []  # one per stream, in the order opened

    def events(query: Query) -> Response | Iterator[bytes]:
        if "bad" in query:
            return Response(400, "text/plain", b"bad query\n")
        feed: queue.SimpleQueue[bytes] = queue.SimpleQueue()
        feeds.append(feed)
        return iter(feed.get, b"")  # ends on b""

    server = StatusServer(Reactor(), "127.0.0.1", 0, {"/events": Stream(events)})
    try:
        first = open_stream(server, "/events")
        assert first.status == 200
        assert first.getheader("Content-Type") == "text/event-stream; charset=utf-8"
        feeds[0].put(b"data: 1\n\n")
        assert first.fp.readline() == b"data: 1\n"  # before the stream's end
        assert first.fp.readline() == b"\n"
        bad = open_stream(server, "/events?bad=1")
        assert (bad.status, bad.read()) == (400, b"bad query\n")  # no place taken
        second = open_stream(server, "/events")
        assert second.status == 200
        third = open_stream(server, "/events")
        assert (third.status, third.read()) == (503, b"too many streams open\n")

        first.close()  # the client leaves: a write to it fails and frees its place

        def reopened() -> http.client.HTTPResponse | None:
            feeds[0].put(b": ping\n\n")
            again = open_stream(server, "/events")
            if again.status == 200:
                return again
            again.read()
            return None

        fourth = wait_for(reopened, 10, interval=0.05, message="the place was never freed")
        assert fourth is not None and len(feeds) == 3
        for feed in feeds[1:]:
            feed.put(b"")  # end the streams still open
        assert second.read() == b"" and fourth.read() == b""
    finally:
        server.close()



class SlowToRelease:
    """The server's stream places, where giving one back takes 0.1 s: the thread that
    answered is descheduled right there, as it may be on a loaded machine."""

    def __init__(self, places: threading.BoundedSemaphore) -> None:
        self._places = places

    def acquire(self, blocking: bool = True) -> bool:
        return self._places.acquire(blocking)

    def release(self) -> None:
        time.sleep(0.1)  # (the injected delay, not a wait for anything)
        self._places.release()


def test_an_answer_instead_of_a_stream_frees_its_place_before_the_client_has_it(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A client that reads a refusal (400) and asks again at once finds the place free: the
    place is given back before the answer is sent, not after (it raced in CI)."""
    monkeypatch.setattr(status_http, "MAX_STREAMS", 1)

    def events(query: Query) -> Response | Iterator[bytes]:
        return Response(400, "text/plain", b"bad query\n")

    server = StatusServer(Reactor(), "127.0.0.1", 0, {"/events": Stream(events)})
    server._streams = SlowToRelease(server._streams)  # type: ignore[assignment]
    try:
        answers = []
        for _ in range(3):
            resp = open_stream(server, "/events?bad=1")
            answers.append((resp.status, resp.read()))
        assert answers == [(400, b"bad query\n")] * 3
    finally:
        server.close()
