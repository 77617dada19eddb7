"""The status server's bearer token (issue 11): with a token, every path but /health wants
it (header or cookie), a browser trades `?token=` for a cookie once, and each refusal is a
401 with a clear message, counted. Without a token nothing changes."""

from __future__ import annotations

import http.client
from collections.abc import Iterator
from pathlib import Path

import pytest

from services.bus.reactor import Reactor
from services.shell import config
from services.shell.http import TOKEN_COOKIE, Direct, Query, Response, StatusServer

TOKEN = "s3cret-token-0123456789"


def ok(query: Query) -> Response:
    return Response(200, "text/plain", b"state:" + ",".join(sorted(query)).encode())


@pytest.fixture
def server() -> Iterator[StatusServer]:
    srv = StatusServer(Reactor(), "127.0.0.1", 0, {"/health": Direct(ok), "/state": Direct(ok)},
                       token=TOKEN)
    yield srv
    srv.close()


def get(srv: StatusServer, path: str, **headers: str) -> http.client.HTTPResponse:
    conn = http.client.HTTPConnection("127.0.0.1", srv.port, timeout=10)
    conn.request("GET", path, headers=headers)
    resp = conn.getresponse()
    resp.read()
    conn.close()
    return resp


def body(srv: StatusServer, path: str, **headers: str) -> tuple[int, bytes]:
    conn = http.client.HTTPConnection("127.0.0.1", srv.port, timeout=10)
    conn.request("GET", path, headers=headers)
    resp = conn.getresponse()
    out = resp.status, resp.read()
    conn.close()
    return out


def test_without_the_token_a_request_is_refused_with_a_clear_401_and_counted(
        server: StatusServer) -> None:
    status, text = body(server, "/state")
    assert status == 401 and b"Authorization: Bearer" in text and b"no token" in text
    status, text = body(server, "/state", Authorization="Bearer wrong-token-0123456789")
    assert status == 401 and b"wrong bearer token" in text
    status, text = body(server, "/state", Cookie=f"{TOKEN_COOKIE}=nope")
    assert status == 401 and b"wrong token cookie" in text
    status, text = body(server, "/state", Authorization=f"Basic {TOKEN}")
    assert status == 401
    status, text = body(server, "/nope")  # not even which paths there are
    assert status == 401 and b"/state" not in text
    assert body(server, "/nope", Authorization=f"Bearer {TOKEN}")[0] == 404
    assert server.unauthorized == 5


def test_the_right_token_as_a_header_or_a_cookie_is_served(server: StatusServer) -> None:
    assert body(server, "/state", Authorization=f"Bearer {TOKEN}") == (200, b"state:")
    assert body(server, "/state", Cookie=f"a=b; {TOKEN_COOKIE}={TOKEN}") == (200, b"state:")
    assert server.unauthorized == 0


def test_health_stays_open_for_liveness_checks(server: StatusServer) -> None:
    assert body(server, "/health") == (200, b"state:")
    assert server.unauthorized == 0


def test_a_browser_trades_the_token_in_the_address_for_a_cookie(server: StatusServer) -> None:
    resp = get(server, f"/state?decisions=1&token={TOKEN}")
    assert resp.status == 303
    assert resp.getheader("Location") == "/state?decisions=1"  # the token leaves the URL
    cookie = resp.getheader("Set-Cookie") or ""
    assert cookie.startswith(f"{TOKEN_COOKIE}={TOKEN};")
    assert "HttpOnly" in cookie and "SameSite=Strict" in cookie
    status, text = body(server, "/state?token=wrong-token-0123456789")
    assert status == 401 and b"?token=" in text
    assert server.unauthorized == 1


def test_without_a_token_configured_everything_is_served() -> None:
    srv = StatusServer(Reactor(), "127.0.0.1", 0, {"/state": Direct(ok)})
    try:
        assert body(srv, "/state") == (200, b"state:")
    finally:
        srv.close()


def test_the_token_comes_from_the_environment_or_a_file_and_is_checked(
        tmp_path: Path) -> None:
    opts = config.COMMON
    v = config.load("master", opts, ["--cluster", "file:///x"],
                    environ={"OFFERBUS_HTTP_TOKEN": TOKEN})
    assert config.common_fields(v)["http_token"] == TOKEN
    v = config.load("master", opts, ["--cluster", "file:///x"], environ={})
    assert config.common_fields(v)["http_token"] == ""
    with pytest.raises(config.ConfigError, match="16 to 512"):
        config.load("master", opts, ["--cluster", "file:///x"],
                    environ={"OFFERBUS_HTTP_TOKEN": "short"})
    path = tmp_path / "token"
    path.write_text(TOKEN + "\n")
    v = config.load("master", opts, ["--cluster", "file:///x", "--http-token-file", str(path)],
                    environ={})
    assert config.common_fields(v)["http_token"] == TOKEN
    path.write_text("")
    with pytest.raises(config.ConfigError, match="empty"):
        config.common_fields(v)
