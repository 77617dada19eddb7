"""The test infrastructure itself, against the real things: ZooKeeper (one server and a
3-server ensemble), the Docker engine, the local busybox image and the scripts that make
them."""

from __future__ import annotations

import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kazoo.client import KazooClient
from kazoo.exceptions import KazooException

from infra.zookeeper import (
    ZooKeeperEnsemble,
    ZooKeeperError,
    ZooKeeperServer,
    four_letter,
    free_ports,
)
from tests.waiting import wait_for

REPO = Path(__file__).resolve().parents[2]


def _client(hosts: str, timeout: float = 2.0) -> KazooClient:
    client = KazooClient(hosts=hosts, timeout=timeout)
    client.start(timeout=15.0)
    return client


@pytest.fixture
def kazoo_factory() -> Iterator[Any]:
    clients: list[KazooClient] = []

    def make(hosts: str, timeout: float = 2.0) -> KazooClient:
        client = _client(hosts, timeout)
        clients.append(client)
        return client

    yield make
    for client in clients:
        client.stop()
        client.close()


# -- one ZooKeeper server ------------------------------------------------------------------


def test_zookeeper_serves_reads_and_writes_in_a_chroot(
    zk: ZooKeeperServer, zk_hosts: str, kazoo_factory: Any
) -> None:
    assert zk.alive()
    assert four_letter(zk.client_port, "ruok") == "imok"
    assert zk.mode() == "standalone"

    client = kazoo_factory(zk_hosts)
    client.create("/offerbus/registry", b"agent-1", makepath=True)
    data, stat = client.get("/offerbus/registry")
    assert data == b"agent-1"
    assert stat.version == 0
    client.set("/offerbus/registry", b"agent-2")
    assert client.get("/offerbus/registry")[0] == b"agent-2"

    # The chroot really is a subtree of the shared server: the write is inside it only.
    chroot = zk_hosts.split("/", 1)[1]
    root = kazoo_factory(zk.hosts)
    assert root.get(f"/{chroot}/offerbus/registry")[0] == b"agent-2"
    assert root.exists("/offerbus") is None


def test_zookeeper_config_allows_short_sessions(zk: ZooKeeperServer, kazoo_factory: Any) -> None:
    conf = four_letter(zk.client_port, "conf")
    assert "tickTime=200" in conf
    assert "minSessionTimeout=400" in conf
    assert "maxSessionTimeout=20000" in conf
    # A 1 s session (Offerbus's ZooKeeper session timeout) is granted as asked.
    client = kazoo_factory(zk.hosts, timeout=1.0)
    assert client._session_timeout == 1000


def test_ephemeral_node_goes_when_its_session_dies(zk_hosts: str, kazoo_factory: Any) -> None:
    watcher = kazoo_factory(zk_hosts)
    owner = _client(zk_hosts, timeout=0.5)
    owner.create("/leader", b"me", ephemeral=True)
    assert watcher.exists("/leader") is not None
    # Drop the session without closing it: the server must expire it (0.5 s) by itself.
    owner.stop()
    started = time.monotonic()
    wait_for(lambda: watcher.exists("/leader") is None, 10.0, message="ephemeral node stayed")
    owner.close()
    assert time.monotonic() - started < 5.0


def test_start_fails_clearly_when_the_port_is_taken(tmp_path: Path) -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        server = ZooKeeperServer(tmp_path, port)
        with pytest.raises(ZooKeeperError, match=f"port {port}.*in use"):
            server.start(timeout=10.0)
    assert not server.alive()


def test_cli_start_status_stop(tmp_path: Path) -> None:
    port = free_ports(1)[0]
    directory = tmp_path / "zk"

    def cli(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "infra.zookeeper", *args, "--dir", str(directory)],
            cwd=REPO,
            capture_output=True,
            text=True,
            timeout=90,
        )

    started = cli("start", "--port", str(port))
    try:
        assert started.returncode == 0, started.stderr
        assert f"127.0.0.1:{port}" in started.stdout
        # The server outlived the CLI process that started it.
        assert four_letter(port, "ruok") == "imok"
        assert (directory / "hosts").read_text().strip() == f"127.0.0.1:{port}"
        status = cli("status")
        assert status.returncode == 0 and "standalone" in status.stdout
        again = cli("start", "--port", str(port))
        assert again.returncode == 0 and "already running" in again.stdout
    finally:
        stopped = cli("stop")
    assert stopped.returncode == 0, stopped.stderr
    assert not (directory / "zookeeper.pid").exists()
    with pytest.raises(OSError):
        four_letter(port, "ruok", timeout=0.5)
    assert cli("status").returncode == 3


# -- the 3-server ensemble -----------------------------------------------------------------


def test_ensemble_keeps_serving_when_the_leader_is_killed(
    zk_ensemble: ZooKeeperEnsemble, kazoo_factory: Any
) -> None:
    assert len(zk_ensemble.servers) == 3
    assert len({s.client_port for s in zk_ensemble.servers}) == 3
    modes = sorted(s.mode() or "none" for s in zk_ensemble.servers)
    assert modes == ["follower", "follower", "leader"]

    chroot = f"/t-{uuid.uuid4().hex[:12]}"
    kazoo_factory(zk_ensemble.hosts).create(chroot, b"")
    client = kazoo_factory(zk_ensemble.hosts + chroot)
    client.create("/counter", b"0")

    leader = zk_ensemble.leader()
    assert leader is not None
    leader.kill()
    try:
        assert not leader.alive()

        def write_and_read() -> bool:
            client.set("/counter", b"1")
            return bool(client.get("/counter")[0] == b"1")

        wait_for(
            write_and_read, 15.0, message="no write after the leader died", ignore=(KazooException,)
        )
        new_leader = wait_for(zk_ensemble.leader, 10.0, message="no new leader")
        assert new_leader is not leader
        # A client of a survivor alone sees the write: it is committed by the new quorum.
        survivor = next(s for s in zk_ensemble.servers if s is not leader)
        assert kazoo_factory(survivor.hosts + chroot).get("/counter")[0] == b"1"
    finally:
        # The ensemble is shared by the session: bring the member back, whole again.
        leader.start(timeout=30.0)
    wait_for(lambda: len(zk_ensemble.serving()) == 3, 30.0, message="ensemble not whole")


# -- Docker ---------------------------------------------------------------------------------


def test_busybox_container_runs_and_is_removed(docker_client: Any, busybox_image: str) -> None:
    from docker.errors import NotFound

    container = docker_client.containers.run(
        busybox_image,
        ["sh", "-c", "echo hello from $(cat /etc/offerbus-release | cut -d, -f1); exit 3"],
        detach=True,
        labels={"org.offerbus.test": "test_infra"},
    )
    try:
        result = container.wait(timeout=30)
        assert result["StatusCode"] == 3
        assert container.logs().decode() == "hello from offerbus busybox image\n"
    finally:
        container.remove(force=True)
    with pytest.raises(NotFound):
        docker_client.containers.get(container.id)


def test_busybox_image_defaults(docker_client: Any, busybox_image: str) -> None:
    image = docker_client.images.get(busybox_image)
    assert image.attrs["Config"]["Cmd"] == ["sh"]
    assert image.labels.get("org.offerbus.recipe")
    out = docker_client.containers.run(
        busybox_image,
        ["sh", "-c", "which sleep env && readlink /bin/sh && id -u && test -w /tmp"],
        remove=True,
    )
    assert out.decode().split() == ["/bin/sleep", "/usr/bin/env", "/bin/busybox", "0"]


def test_build_image_is_idempotent(docker_client: Any, busybox_image: str) -> None:
    before = docker_client.images.get(busybox_image).id
    started = time.monotonic()
    run = subprocess.run(
        ["bash", str(REPO / "infra" / "build-image.sh")],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    elapsed = time.monotonic() - started
    assert run.returncode == 0, run.stderr
    assert "nothing to do" in run.stdout
    assert docker_client.images.get(busybox_image).id == before
    assert elapsed < 10.0
