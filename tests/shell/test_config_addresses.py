"""Configuration for a fleet (issue 11): what a service binds and what it advertises, each
defaulting to `host`; addresses, cluster URLs and the file's tables checked at start with
errors naming the value and its source; a ZooKeeper that does not answer stops the service
with one line; and every value's source is known (what `offerbus config check` prints)."""

from __future__ import annotations

import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from services.shell import config
from services.shell.config import COMMON, ConfigError, load, resolve
from services.shell.process import reach_cluster
from services.shell.service import ServiceConfig, ServiceKit


def test_listen_and_advertise_default_to_host_and_each_can_be_set() -> None:
    base = ["--cluster", "file:///x"]
    v = load("broker", COMMON, base, environ={})
    assert config.addresses(v) == ("127.0.0.1", "127.0.0.1")
    v = load("broker", COMMON, [*base, "--host", "10.1.2.3"], environ={})
    assert config.addresses(v) == ("10.1.2.3", "10.1.2.3")
    v = load("broker", COMMON, [*base, "--host", "10.1.2.3", "--listen-host", "0.0.0.0"],
             environ={})
    assert config.addresses(v) == ("0.0.0.0", "10.1.2.3")
    v = load("broker", COMMON, [*base, "--listen-host", "*"],
             environ={"OFFERBUS_ADVERTISE_HOST": "node-7.example"})
    assert config.addresses(v) == ("0.0.0.0", "node-7.example")
    assert config.common_fields(v)["advertise_host"] == "node-7.example"


@pytest.mark.parametrize(("argv", "message"), [
    (["--host", "0.0.0.0"], "--host: 0.0.0.0 is not an address others can reach"),
    (["--advertise-host", "*"], "--advertise-host: not an IPv4 address or host name"),
    (["--listen-host", "300.1.1.1"], "--listen-host: not an IPv4 address or host name"),
    (["--host", "::1"], "IPv6 addresses are not supported yet"),
    (["--host", "web_1"], "not an IPv4 address or host name: 'web_1'"),
])
def test_bad_addresses_are_refused_with_their_source(argv: list[str], message: str) -> None:
    with pytest.raises(ConfigError, match=message.replace("*", r"\*")):
        load("broker", COMMON, ["--cluster", "file:///x", *argv], environ={})


@pytest.mark.parametrize(("url", "message"), [
    ("zk://", "zk URL without hosts"),
    ("zk://h:2181,h2/x", "bad ZooKeeper server 'h2'"),
    ("zk://h:0/x", "bad ZooKeeper server 'h:0'"),
    ("zk://a b:2181/x", "not an IPv4 address or host name"),
    ("http://h:2181/x", "expected zk://host:port"),
    ("file://relative", "file URL without an absolute path"),
])
def test_bad_cluster_urls_are_refused(url: str, message: str) -> None:
    with pytest.raises(ConfigError, match=f"OFFERBUS_CLUSTER: .*{message}"):
        load("broker", COMMON, [], environ={"OFFERBUS_CLUSTER": url})


def test_tables_not_named_after_a_service_are_refused(tmp_path: Path) -> None:
    typo = tmp_path / "typo.toml"
    typo.write_text('cluster = "file:///x"\n[brokr]\noffer_timeout = 3\n')
    with pytest.raises(ConfigError, match=r"unknown table\(s\) brokr; .*master, allocator"):
        load("broker", COMMON, ["--config", str(typo)], environ={})
    unknown = tmp_path / "unknown.toml"
    unknown.write_text('cluster = "file:///x"\n[broker]\nlisten = "0.0.0.0"\n')
    with pytest.raises(ConfigError, match=r"unknown option\(s\) listen in \[broker\]"):
        load("broker", COMMON, ["--config", str(unknown)], environ={})


def test_each_value_says_where_it_came_from(tmp_path: Path) -> None:
    """flag > environment (the service's own variable first) > file > default."""
    f = tmp_path / "c.toml"
    f.write_text('cluster = "file:///x"\nheartbeat = 2.0\nhttp_port = 1\n'
                 '[broker]\nmax_missed = 9\n')
    env = {"OFFERBUS_HTTP_PORT": "2", "OFFERBUS_BROKER_HTTP_PORT": "3",
           "OFFERBUS_HEARTBEAT": "0.5"}
    v, src = resolve("broker", COMMON, ["--config", str(f), "--heartbeat", "0.25"], env)
    assert (v["cluster"], src["cluster"]) == ("file:///x", str(f))
    assert (v["heartbeat"], src["heartbeat"]) == (0.25, "--heartbeat")
    assert (v["http_port"], src["http_port"]) == (3, "OFFERBUS_BROKER_HTTP_PORT")
    assert (v["max_missed"], src["max_missed"]) == (9, str(f))
    assert (v["log_level"], src["log_level"]) == ("INFO", "default")


def test_endpoints_are_advertised_with_the_advertised_host() -> None:
    kit = ServiceKit("broker", "b1", 0, ServiceConfig(host="0.0.0.0",
                                                      advertise_host="10.0.0.5"))
    try:
        assert kit.advertised("tcp://0.0.0.0:5050") == "tcp://10.0.0.5:5050"
        assert kit.advertised("http://0.0.0.0:80") == "http://10.0.0.5:80"
        assert kit.advertised("ipc:///tmp/x") == "ipc:///tmp/x"
    finally:
        kit.close()


def test_a_zookeeper_that_does_not_answer_stops_the_start_with_one_line() -> None:
    with socket.socket() as s:  # a port nobody listens on: bound, never listening
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
        began = time.monotonic()
        with pytest.raises(ConfigError, match=rf"cannot reach ZooKeeper at 127.0.0.1:{port} "
                           r"\(--cluster zk://127.0.0.1:\d+/x\) within 0.5 s"):
            reach_cluster(f"zk://127.0.0.1:{port}/x", 0.5)
        assert time.monotonic() - began < 5
    reach_cluster("file:///nowhere", 5.0)  # nothing to reach
    reach_cluster(f"zk://127.0.0.1:{port}/x", 0)  # not checked


def run_master(*argv: str) -> subprocess.CompletedProcess[str]:
    """A master process (its own logging: a test's captured stream is never configured)."""
    return subprocess.run([sys.executable, "-m", "services.master", *argv],
                          capture_output=True, text=True, timeout=60)


def test_a_service_with_an_unreachable_zookeeper_exits_2_with_one_line() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        url = f"zk://127.0.0.1:{s.getsockname()[1]}/x"
        out = run_master("--cluster", url, "--zk-wait", "0.3")
    assert out.returncode == 2
    assert out.stderr.splitlines() == [f"offerbus-master: cannot reach ZooKeeper at "
                                       f"{url[5:].split('/')[0]} (--cluster {url}) within "
                                       f"0.3 s (--zk-wait)"], out.stderr


def test_a_listen_address_not_of_this_machine_exits_2_with_one_line(tmp_path: Path) -> None:
    out = run_master("--cluster", f"file://{tmp_path}", "--listen-host", "192.0.2.1")
    assert out.returncode == 2
    assert out.stderr.splitlines() == [
        "offerbus-master: cannot start: Cannot assign requested address "
        "(addr='tcp://192.0.2.1:*') (listening on 192.0.2.1, advertising 127.0.0.1)"], out.stderr
