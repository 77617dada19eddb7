"""Containers without privileges and with limits (issue 11), on the REAL Docker engine: a
privileged request and a host path outside the agent's allowed list are refused (by the
runtime the executor uses, and, for privileged mode and a malformed path, by the broker's
ACCEPT check before anything runs); every container has a pids limit, no-new-privileges and
the dropped capabilities; an allowed host path is bound (read-only when asked)."""

from __future__ import annotations

import json
import urllib.request
import uuid
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from schemas import common_pb2
from services import container_policy as policy
from services.broker.validation import Invalid, check_task
from services.executor.docker_runtime import DockerRuntime
from services.executor.runtime import (
    LABEL_EXECUTOR,
    REASON_TASK_UNAUTHORIZED,
    ContainerSpec,
    LaunchError,
    Volume,
    spec_from_task,
)
from services.resources import Resources
from tests.waiting import wait_for

TEST_LABEL = "org.offerbus.test"
WAIT_S = 30.0


class Engine:
    def __init__(self, client: Any, image: str, allowed: tuple[str, ...]) -> None:
        self.run_id = uuid.uuid4().hex[:10]
        self.image = image
        self.runtime = DockerRuntime(client, allowed_host_paths=allowed)

    def spec(self, script: str, **kw: Any) -> ContainerSpec:
        executor_id = f"hard-{self.run_id}-{uuid.uuid4().hex[:6]}"
        return ContainerSpec(name=f"offerbus-{executor_id}", image=self.image,
                             entrypoint=("/bin/sh", "-c"), command=(script,),
                             labels={TEST_LABEL: self.run_id, LABEL_EXECUTOR: executor_id},
                             cpus=0.5, mem_mib=64, **kw)


@pytest.fixture
def allowed(tmp_path: Path) -> Path:
    path = tmp_path / "shared"
    path.mkdir()
    (path / "hello.txt").write_text("from the host\n")
    return path


@pytest.fixture
def engine(docker_client: Any, busybox_image: str, allowed: Path) -> Iterator[Engine]:
    e = Engine(docker_client, busybox_image, (str(allowed),))
    try:
        yield e
    finally:  # leave nothing behind, even when the test failed
        for handle in e.runtime.find({TEST_LABEL: e.run_id}):
            e.runtime.remove(handle)


def test_a_privileged_container_is_refused(engine: Engine) -> None:
    with pytest.raises(LaunchError) as refused:
        engine.runtime.start(engine.spec("true", privileged=True))
    assert refused.value.reason == REASON_TASK_UNAUTHORIZED
    assert "privileged" in refused.value.message
    assert engine.runtime.find({TEST_LABEL: engine.run_id}) == []  # nothing was created


def test_a_host_path_outside_the_allowed_list_is_refused(engine: Engine, allowed: Path,
                                                         tmp_path: Path) -> None:
    outside = tmp_path / "shared-not"  # a sibling sharing the prefix's spelling
    outside.mkdir()
    sneaky = allowed / "escape"
    sneaky.symlink_to("/etc")  # under the allowed prefix by name, /etc in fact
    for path in ("/etc", str(outside), str(sneaky), f"{allowed}/../shared-not"):
        with pytest.raises(LaunchError) as refused:
            engine.runtime.start(engine.spec("true", volumes=(Volume(path, "/data"),)))
        assert refused.value.reason == REASON_TASK_UNAUTHORIZED
        assert "allowed host paths" in refused.value.message and path in refused.value.message
    assert engine.runtime.find({TEST_LABEL: engine.run_id}) == []


def test_no_host_path_is_allowed_by_default(engine: Engine, docker_client: Any, allowed: Path,
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(policy.ALLOWED_HOST_PATHS_ENV, raising=False)
    runtime = DockerRuntime(docker_client)  # the executor's: the agent's list, from its env
    with pytest.raises(LaunchError, match="allowed_host_paths is empty"):
        runtime.start(engine.spec("true", volumes=(Volume(str(allowed), "/data"),)))


def test_every_container_is_hardened_and_an_allowed_path_is_bound(
        engine: Engine, allowed: Path, docker_client: Any) -> None:
    spec = engine.spec("cat /data/hello.txt; touch /data/new 2>/dev/null && echo WROTE; true",
                       volumes=(Volume(str(allowed), "/data", read_only=True),))
    handle = engine.runtime.start(spec)
    info = engine.runtime.wait(handle, WAIT_S)
    assert info is not None and info.exit_code == 0
    out = engine.runtime.logs(handle, "stdout").data
    assert b"from the host" in out and b"WROTE" not in out  # bound, read-only
    host = docker_client.api.inspect_container(handle.container_id)["HostConfig"]
    assert host["Privileged"] is False
    assert host["PidsLimit"] == policy.DEFAULT_PIDS_LIMIT
    assert "no-new-privileges" in host["SecurityOpt"]
    assert set(policy.DROPPED_CAPABILITIES) <= set(host["CapDrop"])
    assert not host.get("CapAdd")
    assert host["Memory"] == 64 * 1024 * 1024 and host["NanoCpus"] == 500_000_000


def test_the_pids_limit_holds_inside_the_container(engine: Engine) -> None:
    """More processes than the limit cannot start: the shell's fork fails inside the
    container (without the limit it starts them all and says so)."""
    n = policy.DEFAULT_PIDS_LIMIT + 50
    script = (f"i=0; while [ $i -lt {n} ]; do sleep 60 & i=$((i+1)); done; "
              "echo STARTED=$i; kill $(jobs -p)")
    handle = engine.runtime.start(replace(engine.spec(script), mem_mib=512))
    info = engine.runtime.wait(handle, 120)
    assert info is not None and not info.oom_killed

    def said() -> bytes | None:
        out = engine.runtime.logs(handle, "stdout").data + \
            engine.runtime.logs(handle, "stderr").data
        return out or None

    out = wait_for(said, 10, message="the container said nothing")
    assert out is not None
    assert b"can't fork" in out and b"STARTED=" not in out, out[-300:]


def task_asking(**container: Any) -> common_pb2.TaskInfo:
    task = common_pb2.TaskInfo(task_id="t1", name="t1")
    task.resources.extend(Resources.of(cpus=0.1, mem=32).to_proto())
    task.container.type = common_pb2.ContainerInfo.CONTAINER_TYPE_DOCKER
    task.container.docker.image = "offerbus/busybox:latest"
    for v in container.pop("volumes", ()):
        task.container.volumes.add(host_path=v[0], container_path=v[1])
    task.container.privileged = container.pop("privileged", False)
    return task


def test_the_accept_check_refuses_privileged_and_malformed_volumes() -> None:
    with pytest.raises(Invalid, match="privileged containers are not allowed"):
        check_task(task_asking(privileged=True), "a1", set())
    for host, inside in (("data", "/data"), ("/srv/../etc", "/data"), ("/srv", "data")):
        with pytest.raises(Invalid, match="must be an absolute path"):
            check_task(task_asking(volumes=[(host, inside)]), "a1", set())
    check_task(task_asking(volumes=[("/srv/data", "/data")]), "a1", set())  # the agent decides


def test_the_executor_passes_the_request_on_to_the_runtime() -> None:
    task = task_asking(privileged=True, volumes=[("/srv/data", "/data")])
    spec = spec_from_task(task, framework_id="f", executor_id="e")
    assert spec.privileged and spec.volumes == (Volume("/srv/data", "/data"),)


# -- through a live cluster (Docker runtime) ---------------------------------------------------

@pytest.fixture(scope="module")
def cluster(zk: Any, zk_admin: Any, tmp_path_factory: pytest.TempPathFactory,
            ) -> Iterator[tuple[Any, Path]]:
    from tests.e2e import local_cluster_in

    run_dir = tmp_path_factory.mktemp("hard")
    shared = run_dir / "shared"
    shared.mkdir()
    (shared / "hello.txt").write_text("from the host\n")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv(policy.ALLOWED_HOST_PATHS_ENV, str(shared))  # the agent's option
        with local_cluster_in(zk, zk_admin, run_dir, "hard", agents=1,
                              agent_resources="cpus:2;mem:1024;disk:1024;ports:[46220-46239]"
                              ) as c:
            yield c, shared


def test_a_live_cluster_refuses_privileged_and_outside_paths_and_goes_on(
        cluster: tuple[Any, Path]) -> None:
    import threading

    from frameworks.sdk.driver import SchedulerDriver
    from tests.e2e import Recorder, framework, sleep_task

    c, shared = cluster
    S = common_pb2.TaskState
    wanted: dict[str, tuple[list[tuple[str, str, bool]], bool]] = {
        "priv": ([], True),  # privileged
        "etc": ([("/etc", "/data", True)], False),  # a host path outside the list
        "good": ([(str(shared), "/data", True)], False),  # allowed: runs
    }
    lock = threading.Lock()
    left = list(wanted)

    def on_offers(driver: SchedulerDriver, offers: list[common_pb2.Offer]) -> None:
        with lock:
            tid = left.pop(0) if left else None
        rest = offers
        if tid is not None:
            volumes, privileged = wanted[tid]
            task = sleep_task(tid, offers[0], cpus=0.1, mem=32,
                              command=["sh", "-c", "cat /data/hello.txt; sleep 600"])
            for host, inside, ro in volumes:
                task.container.volumes.add(host_path=host, container_path=inside, read_only=ro)
            task.container.privileged = privileged
            op = common_pb2.Operation()
            op.launch.tasks.append(task)
            driver.accept([offers[0].offer_id], [op])
            rest = offers[1:]
        if rest:
            driver.decline([o.offer_id for o in rest], refuse_seconds=0.2)

    rec = Recorder(on_offers=on_offers)
    driver = SchedulerDriver(rec, framework("hard"), c.url)
    driver.start()
    try:
        wait_for(lambda: rec.state_of("good") == S.TASK_RUNNING
                 and rec.state_of("etc") == S.TASK_FAILED and rec.rejected, 90,
                 message=lambda: f"updates: {dict(rec.updates)}; rejected: {rec.rejected}")
        # The broker refused the ACCEPT: the framework is told why; the task never ran.
        assert any("privileged containers are not allowed" in m for m in rec.rejected)
        assert rec.state_of("priv") in (None, S.TASK_ERROR)
        etc = rec.last("etc")
        assert etc is not None and "allowed host paths" in etc.message
        assert etc.reason == common_pb2.TaskStatus.REASON_TASK_UNAUTHORIZED
        # Counted: the broker's rejected ACCEPTs, the agent's refused launches (once each).
        def metrics(url: str) -> str:
            with urllib.request.urlopen(url + "/metrics", timeout=10) as resp:
                return str(resp.read().decode())

        with urllib.request.urlopen(c.leader().endpoints["http"] + "/state", timeout=10) as r:
            agent_http = json.loads(r.read())["agents"][0]["agent_info"]["endpoint"]
        assert 'offerbus_agent_tasks_refused_total{reason="unauthorized"} 1.0' \
            in metrics(agent_http)
        rejected = [line for line in metrics(c.leader("broker").endpoints["http"]).splitlines()
                    if line.startswith("offerbus_broker_accepts_rejected_total")]
        assert rejected and float(rejected[0].split()[-1]) >= 1, rejected
    finally:
        driver.stop(failover=False)
        driver.join(10)
