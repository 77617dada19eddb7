"""The executors' Docker client (docker_runtime.make_client) on the local engine: the engine's
API version learnt once is used without asking again, and one keep-alive connection serves
calls on different paths (docker-py's own adapter opened a pool, hence a connection, per URL
path: per container and call)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from services.executor import docker_runtime


@pytest.fixture
def learnt(docker_client: Any) -> Iterator[str]:
    before = docker_runtime._api_version
    version = docker_runtime.learn_api_version()
    assert version, "the engine did not tell its API version"
    try:
        yield version
    finally:
        docker_runtime._api_version = before


def test_a_client_uses_the_learnt_api_version_without_asking(learnt: str,
                                                             monkeypatch: Any) -> None:
    import docker.api.client

    def no_version_call(self: Any) -> str:
        raise AssertionError("the client asked the engine its version again")

    monkeypatch.setattr(docker.api.client.APIClient, "_retrieve_server_version", no_version_call)
    client = docker_runtime.make_client()
    try:
        assert client.api.api_version == learnt
    finally:
        client.close()


def test_calls_on_different_paths_share_one_connection(learnt: str, busybox_image: str,
                                                       monkeypatch: Any) -> None:
    from docker.transport.unixconn import UnixHTTPConnectionPool

    opened: list[object] = []
    new_conn = UnixHTTPConnectionPool._new_conn

    def counting(self: Any) -> Any:
        opened.append(self)
        return new_conn(self)

    monkeypatch.setattr(UnixHTTPConnectionPool, "_new_conn", counting)
    client = docker_runtime.make_client()
    api = client.api
    try:
        api.containers(all=True, limit=1)
        api.inspect_image(busybox_image)
        api.version()
        api.info()
        assert len(api._custom_adapter.pools) == 1, "a connection pool per path"
        assert len(opened) == 1, f"{len(opened)} connections for 4 calls: no keep-alive"
    finally:
        client.close()


def test_a_task_without_an_image_on_a_docker_agent_is_told_what_to_do() -> None:
    """`offerbus run` without --image makes a plain-process task; on an agent that runs Docker
    containers (`make run`'s) it failed, instance after instance, with "a Docker task needs
    an image", which names neither the cause nor the fix. The refusal names both (before
    any call to the engine: the client is never used)."""
    from types import SimpleNamespace

    from services.executor.runtime import ContainerSpec, LaunchError

    runtime = docker_runtime.DockerRuntime(client=SimpleNamespace(api=None))
    with pytest.raises(LaunchError) as refused:
        runtime.start(ContainerSpec(name="t", command=("sleep", "60")))
    message = str(refused.value)
    assert "runs Docker containers" in message and "--image" in message
    assert "--runtime process" in message
