"""The framework fork server (frameworks/forkserver.py), a real process on a real unix socket:
a service framework forked by it runs as `spawn` would start it (its own session and group, the
caller's environment, directory and log, the pid recorded); bad requests are refused and the
server goes on; with no server, a dead one or a late answer, `spawn` starts the interpreter
itself and one request never starts two processes; and one service never has two framework
processes (the service's lock)."""

from __future__ import annotations

import contextlib
import os
import select
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from frameworks import forkserver as fs
from frameworks.spec import ServiceSpec, write_spec
from services.cli import cluster
from services.procs import pid_alive
from tests.waiting import wait_for


@pytest.fixture
def run_dir(tmp_path: Path) -> Iterator[Path]:
    (tmp_path / "election").mkdir()  # a standalone election with no master: frameworks wait
    yield tmp_path
    for pid in cluster.running(tmp_path).values():
        with contextlib.suppress(OSError):
            os.killpg(pid, signal.SIGKILL)


def start_server(run_dir: Path) -> subprocess.Popen[bytes]:
    """The fork server, with none of the frameworks' environment (OFFERBUS_TRACES_DIR)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("OFFERBUS_TRACES")}
    (run_dir / "logs").mkdir(exist_ok=True)
    ready = server_log(run_dir).count(" ready ") + 1  # an earlier server's line is there
    log = open(run_dir / "logs" / "forkserver.log", "ab")  # noqa: SIM115
    proc = subprocess.Popen([sys.executable, "-m", "frameworks.forkserver", "--run-dir",
                             str(run_dir)], stdout=log, stderr=subprocess.STDOUT, env=env,
                            start_new_session=True)
    log.close()
    wait_for(lambda: server_log(run_dir).count(" ready ") == ready or proc.poll() is not None,
             60,
             message=lambda: f"fork server not ready: {server_log(run_dir)}")
    assert proc.poll() is None, server_log(run_dir)
    return proc


def stop_server(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        proc.terminate()
    proc.wait(10)


def server_log(run_dir: Path) -> str:
    path = run_dir / "logs" / "forkserver.log"
    return path.read_text() if path.exists() else ""


def framework_argv(run_dir: Path, name: str) -> list[str]:
    spec = write_spec(run_dir, ServiceSpec(name=name, image="i", instances=1, cpus=0.1,
                                           mem=32, command=["sleep", "1"], runtime="docker"))
    return ["-m", "frameworks.service", "--cluster", f"file://{run_dir / 'election'}",
            "--spec", str(spec)]


def log_of(run_dir: Path, name: str) -> str:
    path = run_dir / "logs" / f"framework-{name}.log"
    return path.read_text() if path.exists() else ""


def test_a_forked_framework_runs_as_spawn_starts_one(
        run_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    server = start_server(run_dir)
    try:
        work = run_dir / "work"
        work.mkdir()
        monkeypatch.chdir(work)
        pid = cluster.spawn(run_dir, "framework-web", framework_argv(run_dir, "web"))
        assert f"forked name=framework-web pid={pid} " in server_log(run_dir)
        assert ("framework-web", pid) in cluster.running(run_dir).items()  # pid file
        assert (run_dir, "framework-web") not in cluster._children  # not a child of ours
        wait_for(lambda: "driver started framework=web" in log_of(run_dir, "web"), 30,
                 message=lambda: log_of(run_dir, "web"))
        # spawn's environment (OFFERBUS_TRACES_DIR), not the server's: its spans file
        wait_for(lambda: (run_dir / "traces" / f"offerbus-framework-{pid}.jsonl").exists(), 10)
        assert os.getsid(pid) == pid and os.getpgid(pid) == pid  # own session and group
        assert os.readlink(f"/proc/{pid}/cwd") == str(work)
        assert Path(f"/proc/{pid}/comm").read_text().strip() == fs.COMM.decode()  # for top
        stat = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        assert int(stat[1]) not in (server.pid, os.getpid())  # re-parented, as a daemon
        # `offerbus stop`'s way: SIGTERM to its group; it exits and the server goes on
        assert cluster.stop_process(run_dir, "framework-web")
        assert not pid_alive(pid)
        assert server.poll() is None
    finally:
        stop_server(server)
    assert not fs.socket_path(run_dir).exists()  # removed by the server at its stop


def send_raw(run_dir: Path, data: bytes) -> bytes:
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(30)
        sock.connect(str(fs.socket_path(run_dir)))
        try:
            sock.sendall(data)
            sock.shutdown(socket.SHUT_WR)
        except OSError:  # the server hung up first (an oversized request): its answer is read
            pass
        try:
            return b"".join(iter(lambda: sock.recv(65536), b""))
        except ConnectionResetError:  # it hung up with our bytes unread: its log says why
            return b""


def test_bad_requests_are_refused_and_counted_and_the_server_goes_on(run_dir: Path) -> None:
    server = start_server(run_dir)
    try:
        assert b"not a JSON request" in send_raw(run_dir, b"{nonsense\n")
        assert b"runs `-m frameworks.service` only" in send_raw(
            run_dir, b'{"name": "x", "argv": ["-c", "1"], "python": "%s", "root": "%s"}\n' % (
                sys.executable.encode(), str(Path(fs.__file__).resolve().parents[1]).encode()))
        send_raw(run_dir, b"x" * (fs.MAX_REQUEST_BYTES + 70_000))
        assert f"a line of more than {fs.MAX_REQUEST_BYTES} bytes" in server_log(run_dir)
        assert b"closed before a whole line" in send_raw(run_dir, b"no newline")
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as idle:  # says nothing
            idle.connect(str(fs.socket_path(run_dir)))
            idle.settimeout(30)
            assert b"timed out" in idle.recv(4096)  # dropped after READ_TIMEOUT_S
        pid = cluster.spawn(run_dir, "framework-after", framework_argv(run_dir, "after"))
        assert f"forked name=framework-after pid={pid} " in server_log(run_dir)
        assert "refused=5" in server_log(run_dir)
        assert server.poll() is None
    finally:
        stop_server(server)


def test_without_a_server_or_with_a_dead_one_spawn_starts_the_interpreter(
        run_dir: Path) -> None:
    first = cluster.spawn(run_dir, "framework-a", framework_argv(run_dir, "a"))
    assert cluster._children[(run_dir, "framework-a")].pid == first  # no server: Popen
    server = start_server(run_dir)
    server.kill()  # SIGKILL: its socket file stays behind, nobody listens
    server.wait(10)
    assert fs.socket_path(run_dir).is_socket()
    with pytest.raises(fs.Unavailable, match="no fork server"):
        fs.fork(run_dir, "framework-b", framework_argv(run_dir, "b"), {}, run_dir)
    second = cluster.spawn(run_dir, "framework-b", framework_argv(run_dir, "b"))
    assert cluster._children[(run_dir, "framework-b")].pid == second
    wait_for(lambda: "driver started framework=b" in log_of(run_dir, "b"), 30)
    again = start_server(run_dir)  # a new server replaces the stale socket
    try:
        third = cluster.spawn(run_dir, "framework-c", framework_argv(run_dir, "c"))
        assert f"forked name=framework-c pid={third} " in server_log(run_dir)
    finally:
        stop_server(again)


def test_an_answer_that_comes_too_late_forks_nothing(run_dir: Path) -> None:
    """The client gives up past the request's deadline (and its grace); the server, resumed,
    refuses the request it reads after the deadline: the interpreter `spawn` started
    instead is the service's only process."""
    server = start_server(run_dir)
    try:
        os.kill(server.pid, signal.SIGSTOP)
        t = time.monotonic()
        with pytest.raises(fs.Unavailable, match="did not answer"):
            fs.fork(run_dir, "framework-late", framework_argv(run_dir, "late"), {}, run_dir,
                    answer_within=0.2)
        assert time.monotonic() - t >= 0.2 + fs.GRACE_S - 0.05
        os.kill(server.pid, signal.SIGCONT)
        wait_for(lambda: "after its deadline" in server_log(run_dir), 10,
                 message=lambda: server_log(run_dir))
        assert "forked name=framework-late" not in server_log(run_dir)
    finally:
        with contextlib.suppress(OSError):
            os.kill(server.pid, signal.SIGCONT)
        stop_server(server)


def test_a_second_framework_process_of_one_service_exits_and_leaves_the_first(
        run_dir: Path) -> None:
    argv = framework_argv(run_dir, "one")
    first = cluster.spawn(run_dir, "framework-one", argv)
    wait_for(lambda: "driver started framework=one" in log_of(run_dir, "one"), 30)
    second = subprocess.run([sys.executable, *argv], capture_output=True, text=True,
                            timeout=60)
    assert second.returncode == 1
    assert "another process runs this service" in second.stderr
    assert pid_alive(first)
    assert cluster.stop_process(run_dir, "framework-one")  # its lock goes with it
    third = cluster.spawn(run_dir, "framework-one", argv)
    wait_for(lambda: log_of(run_dir, "one").count("driver started framework=one") == 2, 30)
    assert pid_alive(third)


def test_a_client_sending_a_byte_at_a_time_is_dropped_after_the_read_timeout_in_all(
        run_dir: Path) -> None:
    server = start_server(run_dir)
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as drip:
            drip.connect(str(fs.socket_path(run_dir)))
            t = time.monotonic()
            answer = b""
            for _ in range(60):  # the input under test: a byte, then up to 0.2 s for an answer
                try:
                    drip.send(b"x")
                except OSError:
                    break
                if select.select([drip], [], [], 0.2)[0]:
                    answer = drip.recv(4096)
                    break
            dropped_after = time.monotonic() - t
        assert b"timed out" in answer
        assert dropped_after < fs.READ_TIMEOUT_S + 1.5
        assert server.poll() is None
    finally:
        stop_server(server)


def test_a_dead_fork_server_that_up_started_is_started_again_by_the_next_spawn(
        run_dir: Path) -> None:
    """`up` records how it started the server (pids/forkserver.argv); when a spawn finds it
    gone, that spawn starts the interpreter and the server again, for the next one."""
    first = cluster.spawn(run_dir, fs.PROCESS, ["-m", "frameworks.forkserver", "--run-dir",
                                                str(run_dir)])
    wait_for(lambda: " ready " in server_log(run_dir), 60, message=lambda: server_log(run_dir))
    os.kill(first, signal.SIGKILL)
    wait_for(lambda: fs.PROCESS not in cluster.running(run_dir), 10)
    fallback = cluster.spawn(run_dir, "framework-x", framework_argv(run_dir, "x"))
    assert cluster._children[(run_dir, "framework-x")].pid == fallback  # an interpreter
    second = cluster.running(run_dir)[fs.PROCESS]
    assert second != first
    wait_for(lambda: server_log(run_dir).count(" ready ") == 2, 60,
             message=lambda: server_log(run_dir))
    forked = cluster.spawn(run_dir, "framework-y", framework_argv(run_dir, "y"))
    assert f"forked name=framework-y pid={forked} " in server_log(run_dir)
