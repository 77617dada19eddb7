"""The kit's CURVE options (issue 11): off by default; a service that accepts connections
needs its allowed directory, one that connects needs the servers' public key; bad files and
half configurations stop the service with a clear error; the options come from the
environment like any other."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import zmq

from services.cli.keys import generate
from services.shell.config import COMMON, common_fields, load
from services.shell.service import Curve, ServiceConfig


@pytest.fixture
def ctx() -> Iterator[zmq.Context[zmq.Socket[bytes]]]:
    c: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
    yield c
    c.destroy(linger=0)


@pytest.fixture
def keys(tmp_path: Path) -> Path:
    for name in ("server", "agent"):
        generate(tmp_path / "keys", name)
    (tmp_path / "allowed").mkdir()
    (tmp_path / "allowed" / "agent.key").write_text((tmp_path / "keys" / "agent.key").read_text())
    return tmp_path


def test_off_by_default(ctx: zmq.Context[zmq.Socket[bytes]]) -> None:
    curve = Curve(ctx, ServiceConfig())
    assert curve.server is None and curve.client is None and curve.refused == 0


def test_the_options_come_from_the_environment_per_service(keys: Path) -> None:
    values = load("agent", COMMON, [], {
        "OFFERBUS_CLUSTER": "zk://127.0.0.1:2181/x",
        "OFFERBUS_CURVE_SECRET_KEY_FILE": "/nope",
        "OFFERBUS_AGENT_CURVE_SECRET_KEY_FILE": str(keys / "keys" / "agent.key_secret"),
        "OFFERBUS_CURVE_SERVER_KEY_FILE": str(keys / "keys" / "server.key")})
    fields = common_fields(values)
    assert fields["curve_secret_key_file"] == str(keys / "keys" / "agent.key_secret")
    assert fields["curve_server_key_file"] == str(keys / "keys" / "server.key")
    assert fields["curve_allowed_dir"] == ""


def test_a_server_admits_the_allowed_dir_and_a_client_knows_the_server(
        ctx: zmq.Context[zmq.Socket[bytes]], keys: Path) -> None:
    server = Curve(ctx, ServiceConfig(
        curve_secret_key_file=str(keys / "keys" / "server.key_secret"),
        curve_allowed_dir=str(keys / "allowed")))
    try:
        assert server.server is not None and server.authority is not None
        assert server.authority.refused == 0
        with pytest.raises(ValueError, match="curve_server_key_file"):
            server.client  # noqa: B018 -- the master connects to nobody
    finally:
        server.stop()
    client = Curve(ctx, ServiceConfig(
        curve_secret_key_file=str(keys / "keys" / "agent.key_secret"),
        curve_server_key_file=str(keys / "keys" / "server.key")))
    assert client.client is not None and client.authority is None
    assert client.client.server_public == (keys / "keys" / "server.key").read_text().split(
        '"')[1].encode()
    with pytest.raises(ValueError, match="curve_allowed_dir"):
        client.server  # noqa: B018


@pytest.mark.parametrize("config, error", [
    (ServiceConfig(curve_allowed_dir="/tmp"), "need curve_secret_key_file"),
    (ServiceConfig(curve_secret_key_file="/no/such.key_secret"), "not a readable"),
    (ServiceConfig(curve_secret_key_file="KEYS/server.key"), "not a readable"),  # no secret
    (ServiceConfig(curve_secret_key_file="KEYS/server.key_secret",
                   curve_allowed_dir="/no/such/dir"), "no such directory"),
    (ServiceConfig(curve_secret_key_file="KEYS/server.key_secret",
                   curve_server_key_file="/no/such.key"), "not a readable"),
])
def test_bad_configurations_are_refused_with_a_clear_error(
        ctx: zmq.Context[zmq.Socket[bytes]], keys: Path, config: ServiceConfig,
        error: str) -> None:
    for name in ("curve_secret_key_file", "curve_allowed_dir", "curve_server_key_file"):
        setattr(config, name, getattr(config, name).replace("KEYS", str(keys / "keys")))
    with pytest.raises(ValueError, match=error):
        Curve(ctx, config)


def test_clients_take_their_keys_from_the_environment(keys: Path,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    from frameworks.sdk.driver import SchedulerDriver
    from frameworks.sdk.scheduler import Scheduler
    from schemas import common_pb2
    from services.bus.curve import SECRET_ENV, SERVER_ENV, client_from_env

    assert client_from_env({}) is None
    with pytest.raises(ValueError, match="needs both"):
        client_from_env({SECRET_ENV: str(keys / "keys" / "agent.key_secret")})
    env = {SECRET_ENV: str(keys / "keys" / "agent.key_secret"),
           SERVER_ENV: str(keys / "keys" / "server.key")}
    client = client_from_env(env)
    assert client is not None
    assert client.server_public == (keys / "keys" / "server.key").read_text().split('"')[1].encode()
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    driver = SchedulerDriver(Scheduler(), common_pb2.FrameworkInfo(name="x"), "file:///tmp/x")
    assert driver._curve is not None and driver._curve.keys.public == client.keys.public
    monkeypatch.setenv(SERVER_ENV, "/no/such.key")
    with pytest.raises(ValueError, match="not a readable"):
        SchedulerDriver(Scheduler(), common_pb2.FrameworkInfo(name="x"), "file:///tmp/x")
