"""Kills in one process reach the REAL Docker engine one container exit at a time: Docker
20.10's libnetwork deadlocks when container exits overlap (moby/moby#46661, fixed in 20.10.27
and 23.0), and the whole engine stops answering. An `offerbus stop` of a 100-task service did
that here. The engine's own event stream is the witness: it logs `kill` when a signal is sent
and `die` once the exit (its network released) is handled."""

from __future__ import annotations

import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from services.executor.docker_runtime import DockerRuntime
from services.executor.runtime import LABEL_EXECUTOR, ContainerSpec

TEST_LABEL = "org.offerbus.test"
N = 8


def test_concurrent_kills_reach_the_engine_one_exit_at_a_time(docker_client: Any,
                                                              busybox_image: str) -> None:
    run_id = uuid.uuid4().hex[:10]
    runtime = DockerRuntime(docker_client)
    handles = []
    try:
        for i in range(N):
            eid = f"exits-{run_id}-{i}"
            handles.append(runtime.start(ContainerSpec(
                name=f"offerbus-{eid}", image=busybox_image, entrypoint=("/bin/sh", "-c"),
                command=("exec sleep 3600",), labels={TEST_LABEL: run_id, LABEL_EXECUTOR: eid},
                sandbox="")))
        since = time.time() - 1
        go = threading.Barrier(N)

        def kill(handle: Any) -> Any:
            go.wait()  # all at once, as a service's stop asks its tasks' executors
            return runtime.kill(handle, 10.0)

        with ThreadPoolExecutor(N) as pool:
            infos = list(pool.map(kill, handles))
        assert all(info is not None for info in infos)
        events = docker_client.api.events(
            since=since, until=time.time() + 1, decode=True,
            filters={"type": "container", "label": f"{TEST_LABEL}={run_id}"})
        actions = [e["Action"] for e in events if e.get("Action") in ("kill", "die")]
        assert actions.count("die") == N, actions
        exiting = most = 0
        for action in actions:
            exiting += 1 if action == "kill" else -1
            most = max(most, exiting)
        assert most == 1, f"{most} containers were exiting at once: {actions}"
    finally:
        for handle in runtime.find({TEST_LABEL: run_id}):
            runtime.remove(handle)
