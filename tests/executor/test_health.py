"""Health checks in the pure executor core (no clock, no container): when a check is due (delay,
interval, one at a time, from next_deadline), health reported on every change (the first result
included) as RUNNING + healthy + REASON_TASK_HEALTH_CHECK_STATUS_UPDATED, failures inside the
grace period ignored, the kill after `consecutive_failures` in a row (KILLED with
REASON_HEALTH_CHECK_FAILED naming the check and its output); hypothesis drives random results
and times against a model of the rules. And the shell's HTTP and TCP checks on real sockets."""

from __future__ import annotations

import http.server
import socket
import threading
from collections.abc import Iterator

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from schemas import common_pb2
from services import tasks
from services.executor import health as hc
from services.executor.checks import command_argv, http_check, tcp_check
from services.executor.core import (
    Command,
    ExecutorCore,
    KillContainer,
    RunCheck,
    SendUpdate,
)

TaskStatus = common_pb2.TaskStatus
T0 = 1_700_000_000.0
UPDATED = TaskStatus.REASON_TASK_HEALTH_CHECK_STATUS_UPDATED


def check(*, delay: float = 1.0, interval: float = 2.0, timeout: float = 1.0,
          failures: int = 3, grace: float = 0.0) -> common_pb2.HealthCheck:
    hcheck = common_pb2.HealthCheck(delay_s=delay, interval_s=interval, timeout_s=timeout,
                                    consecutive_failures=failures, grace_period_s=grace)
    hcheck.command.command.shell = True
    hcheck.command.command.value = "test -f /tmp/ready"
    return hcheck


def running(hcheck: common_pb2.HealthCheck) -> ExecutorCore:
    c = ExecutorCore("e1", "f1", T0)
    c.subscribed("a1", T0)
    task = common_pb2.TaskInfo(task_id="t1", agent_id="a1")
    task.command.value = "sleep"
    task.health_check.CopyFrom(hcheck)
    c.launch(task, "f1", T0)
    c.container_started("cid", T0)
    ack_all(c)
    c.validate()
    return c


def ack_all(c: ExecutorCore) -> None:
    """Play the agent: acknowledge every update (their retries leave the deadlines)."""
    for u in list(c.unacked):
        c.acknowledged(u, T0)


def updates(cmds: list[Command]) -> list[TaskStatus]:
    return [c.status for c in cmds if isinstance(c, SendUpdate)]


def run_due_check(c: ExecutorCore) -> RunCheck:
    """Advance to the core's next deadline and take the RunCheck it gives."""
    ack_all(c)
    deadline = c.next_deadline()
    assert deadline is not None
    [cmd] = [x for x in c.tick(deadline) if isinstance(x, RunCheck)]
    c.validate()
    return cmd


def test_first_check_after_the_delay_then_every_interval_one_at_a_time() -> None:
    c = running(check(delay=1.5, interval=2.0, timeout=0.7))
    assert c.next_deadline() == T0 + 1.5
    assert not [x for x in c.tick(T0 + 1.4) if isinstance(x, RunCheck)]
    cmd = run_due_check(c)
    assert cmd.timeout_s == 0.7 and cmd.check.command.command.value == "test -f /tmp/ready"
    assert not [x for x in c.tick(T0 + 100) if isinstance(x, RunCheck)], "one in flight"
    c.check_result(True, "", T0 + 2.0)
    ack_all(c)
    assert c.next_deadline() == T0 + 4.0


def test_health_reported_on_each_change_only() -> None:
    c = running(check(failures=0))
    reports = []
    for ok in (True, True, False, False, True):
        run_due_check(c)
        now = c.next_deadline() or T0  # the result arrives any time; use the check's time
        reports += updates(c.check_result(ok, "out", now))
        c.validate()
    assert [(u.state, u.healthy, u.reason) for u in reports] == [
        (tasks.RUNNING, True, UPDATED), (tasks.RUNNING, False, UPDATED),
        (tasks.RUNNING, True, UPDATED)]
    assert "unhealthy" in reports[1].message and "out" in reports[1].message
    assert not c.kill_requested, "consecutive_failures 0 never kills"


def test_killed_after_consecutive_failures_with_the_check_and_its_output() -> None:
    c = running(check(failures=2))
    run_due_check(c)
    [unhealthy] = updates(c.check_result(False, "exited with 1: no such file", T0 + 1))
    assert unhealthy.state == tasks.RUNNING and not unhealthy.healthy
    run_due_check(c)
    out = c.check_result(False, "exited with 1: still no file", T0 + 3)
    [killing] = updates(out)
    assert killing.state == tasks.KILLING
    assert killing.reason == TaskStatus.REASON_HEALTH_CHECK_FAILED
    assert [x for x in out if isinstance(x, KillContainer)]
    assert c.next_deadline() is None or not [x for x in c.tick(T0 + 99)
                                             if isinstance(x, RunCheck)]
    [killed] = updates(c.container_exited(137, False, "", T0 + 4))
    assert killed.state == tasks.KILLED and killed.reason == TaskStatus.REASON_HEALTH_CHECK_FAILED
    assert "test -f /tmp/ready" in killed.message and "still no file" in killed.message
    assert killed.healthy is False
    c.validate()


def test_failures_in_the_grace_period_are_ignored_until_a_success() -> None:
    c = running(check(delay=0.0, interval=1.0, failures=1, grace=5.0))
    run_due_check(c)
    assert updates(c.check_result(False, "booting", T0 + 0.5)) == []
    assert not c.kill_requested
    run_due_check(c)
    assert [u.healthy for u in updates(c.check_result(True, "", T0 + 1.6))] == [True]
    run_due_check(c)  # a success ended the grace period: the next failure counts (and kills)
    out = c.check_result(False, "down", T0 + 2.7)
    assert [u.state for u in updates(out)] == [tasks.RUNNING, tasks.KILLING]


def test_a_result_after_an_outside_kill_changes_nothing() -> None:
    c = running(check(failures=1))
    run_due_check(c)
    c.kill(None, T0 + 1.1)
    assert c.check_result(False, "x", T0 + 1.2) == []
    c.validate()


def test_no_check_without_a_health_check() -> None:
    c = ExecutorCore("e1", "f1", T0)
    c.subscribed("a1", T0)
    c.launch(common_pb2.TaskInfo(task_id="t1"), "f1", T0)
    c.container_started("cid", T0)
    assert c.health is None and c.next_deadline() is not None  # only the update retries
    c.validate()


def test_zero_interval_and_timeout_take_the_defaults() -> None:
    h = hc.Health(check(interval=0.0, timeout=0.0), T0)
    assert h.interval_s == hc.DEFAULT_INTERVAL_S and h.timeout_s == hc.DEFAULT_TIMEOUT_S
    with pytest.raises(ValueError):
        hc.Health(common_pb2.HealthCheck(), T0)


@settings(max_examples=200, deadline=None)
@given(limit=st.integers(0, 4), grace=st.sampled_from([0.0, 3.0]),
       steps=st.lists(st.tuples(st.booleans(), st.floats(0.0, 2.0)), max_size=25))
def test_random_results_follow_the_rules(limit: int, grace: float,
                                         steps: list[tuple[bool, float]]) -> None:
    """Model: a counted failure is one outside the grace period (or after any success);
    health is reported exactly when it changes; the kill comes with the limit-th counted
    failure in a row and no check runs after it."""
    c = running(check(delay=0.5, interval=1.0, failures=limit, grace=grace))
    healthy: bool | None = None
    streak, passed = 0, False
    for ok, lag in steps:
        if ok and lag > 1.5:
            ack_all(c)  # sometimes the agent acknowledges; sometimes updates are retried
        deadline = c.next_deadline()
        assert deadline is not None
        ticked = c.tick(deadline)
        c.validate()
        if c.kill_requested:
            assert not [x for x in ticked if isinstance(x, RunCheck)]
            break
        if not [x for x in ticked if isinstance(x, RunCheck)]:
            continue  # the deadline was an update retry
        now = deadline + lag
        out = c.check_result(ok, "o", now)
        c.validate()
        counted = ok or passed or now >= T0 + grace
        reports = [u for u in updates(out) if u.reason == UPDATED]
        if not counted:
            assert out == []
            continue
        passed = passed or ok
        streak = 0 if ok else streak + 1
        assert len(reports) == (1 if healthy is not ok else 0)
        assert all(u.healthy is ok for u in reports)
        healthy = ok
        should_kill = limit > 0 and streak >= limit
        assert c.kill_requested == should_kill
        if should_kill:
            [killing] = [u for u in updates(out) if u.state == tasks.KILLING]
            assert killing.reason == TaskStatus.REASON_HEALTH_CHECK_FAILED
            break


# -- the shell's network checks, on real loopback sockets -----------------------------------


class _Handler(http.server.BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        code = {"/ok": 200, "/moved": 302, "/broken": 503}.get(self.path, 404)
        self.send_response(code)
        if code == 302:
            self.send_header("Location", "/broken")  # not followed: 3xx is healthy
        self.end_headers()
        self.wfile.write(b"x" * 5000 if code == 503 else b"fine")

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def http_port() -> Iterator[int]:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server.server_address[1]
    finally:
        server.shutdown()
        server.server_close()


def test_http_check_codes_and_bounded_body(http_port: int) -> None:
    assert http_check(http_port, "/ok", "", 2.0).ok
    assert http_check(http_port, "/moved", "http", 2.0).ok
    broken = http_check(http_port, "/broken", "", 2.0)
    assert not broken.ok and "503" in broken.output and len(broken.output) < 1200
    assert not http_check(http_port, "/nothing", "", 2.0).ok


def test_tcp_check_open_and_closed_ports(http_port: int) -> None:
    assert tcp_check(http_port, 2.0).ok
    with socket.socket() as s:  # a port nobody listens on: bound, never listening
        s.bind(("127.0.0.1", 0))
        closed = s.getsockname()[1]
        result = tcp_check(closed, 2.0)
    assert not result.ok and str(closed) in result.output


def test_command_argv() -> None:
    shell = common_pb2.CommandInfo(shell=True, value="exit 3")
    assert command_argv(shell) == ["/bin/sh", "-c", "exit 3"]
    plain = common_pb2.CommandInfo(value="test", arguments=["-f", "/x"])
    assert command_argv(plain) == ["test", "-f", "/x"]
