"""Shared fixtures: REAL ZooKeeper servers and the REAL local Docker engine (no fakes).

- ``zk``            session: one standalone ZooKeeperServer (infra.zookeeper)
- ``zk_hosts``      function: ``"127.0.0.1:PORT/t-<uuid>"``, a fresh chroot on ``zk`` (created)
- ``zk_ensemble``   session: a 3-server ZooKeeperEnsemble with its quorum formed
- ``docker_client`` session: ``docker.from_env()``, after a ping (fails: run `make engine`)
- ``busybox_image`` session: ``"offerbus/busybox:latest"`` once it exists (`make image`)

Tests under tests/integration/, and any test using one of these fixtures, get the
``integration`` marker, so ``make test-fast`` (``-m "not integration"``) leaves them out.
To wait for something use ``tests.waiting.wait_for``; never sleep as synchronisation.
"""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from infra.zookeeper import ZooKeeperEnsemble, ZooKeeperServer

BUSYBOX_IMAGE = "offerbus/busybox:latest"

_INTEGRATION_DIR = Path(__file__).parent / "integration"
_REAL_FIXTURES = frozenset(
    {"zk", "zk_hosts", "zk_ensemble", "zk_admin", "docker_client", "busybox_image"}
)


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    # tryfirst: mark before pytest's own hook deselects by `-m`.
    for item in items:
        under_integration = _INTEGRATION_DIR in item.path.parents
        uses_real = not _REAL_FIXTURES.isdisjoint(getattr(item, "fixturenames", ()))
        if (under_integration or uses_real) and item.get_closest_marker("integration") is None:
            item.add_marker(pytest.mark.integration)


# -- ZooKeeper ----------------------------------------------------------------------------


@pytest.fixture(scope="session")
def zk(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ZooKeeperServer]:
    """One real standalone ZooKeeper (tickTime 200 ms: sessions from 0.4 s) for the session."""
    server = ZooKeeperServer(tmp_path_factory.mktemp("zk"))
    server.start(timeout=30.0)
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="session")
def zk_admin(zk: ZooKeeperServer) -> Iterator[Any]:
    """A kazoo client on ``zk`` without chroot, for creating and removing test chroots."""
    from kazoo.client import KazooClient

    client = KazooClient(hosts=zk.hosts, timeout=5.0)
    client.start(timeout=15.0)
    try:
        yield client
    finally:
        client.stop()
        client.close()


@pytest.fixture
def zk_hosts(zk_admin: Any, zk: ZooKeeperServer) -> Iterator[str]:
    """A connection string with a unique chroot, so tests never see each other's znodes.

    The chroot node exists already (kazoo does not create it: a client whose chroot is
    missing only warns, then fails on its first write). It is removed after the test.
    """
    chroot = f"/t-{uuid.uuid4().hex[:12]}"
    zk_admin.create(chroot, b"")
    yield f"{zk.hosts}{chroot}"
    # Best effort: a session the test left open may still own ephemeral nodes here.
    with contextlib.suppress(Exception):
        zk_admin.delete(chroot, recursive=True)


@pytest.fixture(scope="session")
def zk_ensemble(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ZooKeeperEnsemble]:
    """A real 3-server ZooKeeper ensemble with its quorum formed.

    Shared by the session: a test that kills a member must start it again (``start()``)
    before it ends.
    """
    ensemble = ZooKeeperEnsemble(tmp_path_factory.mktemp("zk-ensemble"), size=3)
    ensemble.start(timeout=60.0)
    try:
        yield ensemble
    finally:
        ensemble.stop()


# -- Docker -------------------------------------------------------------------------------


@pytest.fixture(scope="session")
def docker_client() -> Iterator[Any]:
    """A docker SDK client on the local engine. Fails (never skips) when the engine is down:
    ``make test`` starts it, and ``make engine`` does by hand."""
    import docker
    from docker.errors import DockerException

    try:
        client = docker.from_env(timeout=30)
        client.ping()
    except DockerException as exc:
        pytest.fail(
            f"the Docker engine does not answer ({exc}); start it with `make engine` "
            "(infra/docker-engine.sh)",
            pytrace=False,
        )
    try:
        yield client
    finally:
        client.close()


@pytest.fixture(scope="session")
def busybox_image(docker_client: Any) -> str:
    """The name of the local busybox test image, once it is known to exist."""
    from docker.errors import ImageNotFound

    try:
        docker_client.images.get(BUSYBOX_IMAGE)
    except ImageNotFound:
        pytest.fail(
            f"image {BUSYBOX_IMAGE} is missing; build it with `make image` (infra/build-image.sh)",
            pytrace=False,
        )
    return BUSYBOX_IMAGE
