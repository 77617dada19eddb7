"""One contract for every Runtime, run on the REAL Docker engine and on real processes: exit
codes, logs, missing images, kill with grace (and SIGKILL after it), limits, labels + find()
after a "restart" (a fresh runtime object), remove."""

from __future__ import annotations

import os
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from services.executor.docker_runtime import DockerRuntime
from services.executor.process_runtime import ProcessRuntime
from services.executor.runtime import (
    LABEL_EXECUTOR,
    REASON_CONTAINER_LAUNCH_FAILED,
    REASON_IMAGE_NOT_FOUND,
    ContainerSpec,
    LaunchError,
    Runtime,
)
from services.procs import cmdline
from tests.waiting import wait_for

TEST_LABEL = "org.offerbus.test"
WAIT_S = 20.0


class Harness:
    """Makes specs for one runtime kind, and a fresh runtime object (an agent restart)."""

    def __init__(self, kind: str, root: Path, image: str, docker_client: Any) -> None:
        self.kind, self.root, self.image, self.docker_client = kind, root, image, docker_client
        self.run_id = uuid.uuid4().hex[:10]
        self.runtime = self.fresh()

    def fresh(self) -> Runtime:
        if self.kind == "docker":
            return DockerRuntime(self.docker_client)
        return ProcessRuntime(self.root)

    def spec(self, script: str, **kw: Any) -> ContainerSpec:
        executor_id = f"ct-{self.run_id}-{uuid.uuid4().hex[:6]}"
        labels = {TEST_LABEL: self.run_id, LABEL_EXECUTOR: executor_id}
        return ContainerSpec(
            name=f"offerbus-{executor_id}", image=self.image if self.kind == "docker" else "",
            entrypoint=("/bin/sh", "-c"), command=(script,), labels=labels,
            sandbox=str(self.root / executor_id), **kw)


@pytest.fixture(params=["docker", "process"])
def rt(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Harness]:
    if request.param == "docker":
        client = request.getfixturevalue("docker_client")
        image = request.getfixturevalue("busybox_image")
    else:
        client, image = None, ""
    harness = Harness(request.param, tmp_path, image, client)
    try:
        yield harness
    finally:  # leave nothing behind, even when the test failed
        for handle in harness.runtime.find({TEST_LABEL: harness.run_id}):
            harness.runtime.remove(handle)


def test_echo_exits_zero_and_logs(rt: Harness) -> None:
    handle = rt.runtime.start(rt.spec("echo hi; echo oops >&2"))
    info = rt.runtime.wait(handle, WAIT_S)
    assert info is not None and info.exit_code == 0 and not info.oom_killed
    assert b"hi" in wait_for(lambda: rt.runtime.logs(handle, "stdout").data, 5.0)
    assert b"oops" in rt.runtime.logs(handle, "stderr").data
    assert b"oops" not in rt.runtime.logs(handle, "stdout").data


def test_logs_tail_and_byte_cap(rt: Harness) -> None:
    handle = rt.runtime.start(rt.spec("for i in 1 2 3 4 5; do echo line$i; done"))
    assert rt.runtime.wait(handle, WAIT_S) is not None
    tail = wait_for(lambda: rt.runtime.logs(handle, "stdout", tail_lines=2), 5.0,
                    message="no logs").data
    assert tail == b"line4\nline5\n"
    assert rt.runtime.logs(handle, "stdout", tail_lines=2).truncated
    capped = rt.runtime.logs(handle, "stdout", max_bytes=6)
    assert capped.data == b"line5\n" and capped.truncated
    whole = rt.runtime.logs(handle, "stdout")
    assert whole.data.count(b"\n") == 5 and not whole.truncated


def test_the_tail_of_a_huge_log_is_read_in_bounded_memory(rt: Harness) -> None:
    """A task that wrote 16 MiB: asking for its last 4 KiB never holds the whole log in
    memory (issue 10, defect 3: docker logs were read whole, on every request)."""
    import tracemalloc

    handle = rt.runtime.start(rt.spec(
        "dd if=/dev/zero bs=65536 count=256 2>/dev/null | tr '\\0' a; echo; echo last-line"))
    assert rt.runtime.wait(handle, WAIT_S) is not None
    wait_for(lambda: rt.runtime.logs(handle, "stdout", max_bytes=64).data.endswith(
        b"last-line\n"), 10.0, message="the log never ended with its last line")
    tracemalloc.start()
    try:
        logs = rt.runtime.logs(handle, "stdout", max_bytes=4096)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert len(logs.data) == 4096 and logs.truncated
    assert logs.data.endswith(b"a\nlast-line\n")
    assert peak < 4 << 20, f"reading a 4 KiB tail of a 16 MiB log peaked at {peak >> 20} MiB"


def test_exit_code(rt: Harness) -> None:
    handle = rt.runtime.start(rt.spec("exit 3"))
    info = rt.runtime.wait(handle, WAIT_S)
    assert info is not None and info.exit_code == 3


def test_wait_times_out_while_running(rt: Harness) -> None:
    handle = rt.runtime.start(rt.spec("sleep 3600"))
    assert rt.runtime.wait(handle, 0) is None
    started = time.monotonic()
    assert rt.runtime.wait(handle, 0.3) is None
    assert time.monotonic() - started < 5.0


def test_missing_image_fails_fast(rt: Harness) -> None:
    if rt.kind != "docker":
        pytest.skip("images are a Docker notion")
    spec = rt.spec("true")
    missing = ContainerSpec(**{**spec.__dict__, "image": "offerbus/no-such-image:never"})
    started = time.monotonic()
    with pytest.raises(LaunchError) as err:
        rt.runtime.start(missing)
    assert err.value.reason == REASON_IMAGE_NOT_FOUND
    assert "no-such-image" in err.value.message
    assert time.monotonic() - started < 2.0, "must not try a registry"
    assert rt.runtime.find({TEST_LABEL: rt.run_id}) == []


def test_bad_command_fails(rt: Harness) -> None:
    """A command that cannot be exec'd: LaunchError, or (Docker, where docker-init is PID 1
    and execs it) exit 127 as from a shell. Either way the task fails, clearly."""
    spec = rt.spec("x")
    bad = ContainerSpec(**{**spec.__dict__, "entrypoint": ("/no/such/binary",), "command": None})
    try:
        handle = rt.runtime.start(bad)
    except LaunchError as err:
        assert err.reason == REASON_CONTAINER_LAUNCH_FAILED
        assert "/no/such/binary" in err.message
        assert rt.runtime.find({TEST_LABEL: rt.run_id}) == []
        return
    assert rt.kind == "docker"
    info = rt.runtime.wait(handle, WAIT_S)
    assert info is not None and info.exit_code == 127


def test_kill_with_grace_ends_a_sleeper(rt: Harness) -> None:
    handle = rt.runtime.start(rt.spec("sleep 3600"))
    started = time.monotonic()
    info = rt.runtime.kill(handle, 0.5)
    assert info is not None and info.exit_code != 0
    assert time.monotonic() - started < 5.0
    assert rt.runtime.wait(handle, 0) is not None


def test_kill_escalates_to_sigkill_after_grace(rt: Harness) -> None:
    handle = rt.runtime.start(rt.spec("trap '' TERM; echo ready; while :; do sleep 0.05; done"))
    wait_for(lambda: b"ready" in rt.runtime.logs(handle, "stdout").data, 10.0,
             message="the TERM trap never got set")
    started = time.monotonic()
    info = rt.runtime.kill(handle, 0.5)
    elapsed = time.monotonic() - started
    assert info is not None and info.exit_code == 128 + 9
    assert 0.5 <= elapsed < 5.0, elapsed


def test_memory_limit_applied(rt: Harness) -> None:
    handle = rt.runtime.start(rt.spec("sleep 3600", mem_mib=64, cpus=0.5))
    if rt.kind == "docker":
        host = rt.docker_client.api.inspect_container(handle.container_id)["HostConfig"]
        assert host["Memory"] == 64 * 1024 * 1024
        assert host["NanoCpus"] == 500_000_000
    else:
        assert handle.pid is not None
        limits = Path(f"/proc/{handle.pid}/limits").read_text()
        line = next(ln for ln in limits.splitlines() if ln.startswith("Max address space"))
        assert str(64 * 1024 * 1024) in line


def test_oom_is_reported(rt: Harness) -> None:
    if rt.kind != "docker":
        pytest.skip("the process runtime has an address-space rlimit, not an OOM killer")
    handle = rt.runtime.start(
        rt.spec("x=$(head -c 200000000 /dev/zero | tr '\\0' a); echo survived", mem_mib=16))
    info = rt.runtime.wait(handle, 60.0)
    assert info is not None and info.oom_killed and info.exit_code != 0


def test_labels_and_find_after_restart(rt: Harness) -> None:
    spec = rt.spec("sleep 3600")
    handle = rt.runtime.start(spec)
    if rt.kind == "docker":
        labels = rt.docker_client.api.inspect_container(handle.container_id)["Config"]["Labels"]
        assert labels[LABEL_EXECUTOR] == spec.labels[LABEL_EXECUTOR]
    restarted = rt.fresh()  # a new agent process knows nothing but the labels
    found = restarted.find({LABEL_EXECUTOR: spec.labels[LABEL_EXECUTOR]})
    assert [h.container_id for h in found] == [handle.container_id]
    assert found[0].name == spec.name and found[0].labels[TEST_LABEL] == rt.run_id
    assert restarted.wait(found[0], 0) is None, "still running"
    info = restarted.kill(found[0], 0.5)
    assert info is not None
    assert rt.runtime.wait(handle, WAIT_S) is not None


def test_remove_cleans_up(rt: Harness) -> None:
    spec = rt.spec("sleep 3600")
    handle = rt.runtime.start(spec)
    rt.runtime.remove(handle)
    assert rt.runtime.find({LABEL_EXECUTOR: spec.labels[LABEL_EXECUTOR]}) == []
    assert rt.runtime.wait(handle, WAIT_S) is not None, "remove kills a running container"
    rt.runtime.remove(handle)  # twice is fine


def test_exec_runs_inside_and_reports_the_exit_code(rt: Harness) -> None:
    handle = rt.runtime.start(rt.spec("sleep 3600"))
    ok = rt.runtime.exec(handle, ["/bin/sh", "-c", "echo inside; echo err >&2"], 10.0)
    assert ok.exit_code == 0 and not ok.timed_out
    assert b"inside" in ok.output and b"err" in ok.output
    failed = rt.runtime.exec(handle, ["/bin/sh", "-c", "exit 3"], 10.0)
    assert failed.exit_code == 3 and not failed.timed_out
    assert rt.runtime.wait(handle, 0) is None, "the task runs on"


def test_exec_output_is_bounded(rt: Harness) -> None:
    handle = rt.runtime.start(rt.spec("sleep 3600"))
    script = "i=0; while [ $i -lt 500 ]; do echo line-$i; i=$((i+1)); done"
    res = rt.runtime.exec(handle, ["/bin/sh", "-c", script], 10.0, max_bytes=100)
    assert res.exit_code == 0 and res.truncated and len(res.output) <= 100
    assert res.output.endswith(b"line-499\n"), "the last bytes are kept"


def test_exec_times_out_and_kills_the_command(rt: Harness) -> None:
    handle = rt.runtime.start(rt.spec("sleep 3600"))
    started = time.monotonic()
    marker = f"sleep {30 + int(uuid.uuid4().int % 9000)}"  # names this test's child
    res = rt.runtime.exec(handle, ["/bin/sh", "-c", f"echo begun; {marker}; echo never"], 0.5)
    took = time.monotonic() - started
    assert res.timed_out and res.exit_code is None and took < 5.0
    assert rt.runtime.wait(handle, 0) is None, "a timed-out check does not end the task"

    def left() -> list[int]:  # what the command started is killed too (nothing piles up)
        return [int(p) for p in os.listdir("/proc") if p.isdigit()
                and " ".join(cmdline(int(p))) == marker]
    wait_for(lambda: not left(), 5.0, message=lambda: f"{marker} still runs: {left()}")
