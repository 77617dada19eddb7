"""The health of one running task (pure): when its check is due (delay, then every interval),
how results count (failures inside the grace period are ignored until a check passes; failures
in a row are counted), when health changes, and when the task must be killed. No clock, I/O or
threads: the executor core feeds it the time and each result (health checks run in the shell)."""

from __future__ import annotations

from dataclasses import dataclass

from schemas import common_pb2

HealthCheck = common_pb2.HealthCheck

# Defaults when a field is 0 (proto3 cannot tell unset from 0); Mesos's are 10 s and 20 s.
DEFAULT_INTERVAL_S = 10.0
DEFAULT_TIMEOUT_S = 20.0
MIN_INTERVAL_S = 0.05  # a check never runs back to back
OUTPUT_CHARS = 512  # of a check's output kept for status messages (its last characters)


class HealthError(AssertionError):
    """validate() found the health state in a state it must never reach."""


@dataclass(frozen=True)
class Verdict:
    """What one counted result means: report `healthy` when `changed`; kill when `kill`."""

    healthy: bool
    changed: bool
    kill: bool
    failures: int  # failures in a row, this one included (0 after a success)


def has_check(check: HealthCheck) -> bool:
    return check.WhichOneof("check") is not None


def describe(check: HealthCheck) -> str:
    """The check, for a person: `command check "curl -f localhost"`, `HTTP check GET :80/`."""
    kind = check.WhichOneof("check")
    if kind == "command":
        cmd = check.command.command
        text = cmd.value if cmd.shell else " ".join([cmd.value, *cmd.arguments]).strip()
        return f"command check {text!r}"
    if kind == "http":
        scheme = check.http.scheme or "http"
        return f"{scheme.upper()} check GET :{check.http.port}{check.http.path or '/'}"
    if kind == "tcp":
        return f"TCP check :{check.tcp.port}"
    return "no check"


def interval_of(check: HealthCheck) -> float:
    return max(check.interval_s, MIN_INTERVAL_S) if check.interval_s > 0 else DEFAULT_INTERVAL_S


def timeout_of(check: HealthCheck) -> float:
    return check.timeout_s if check.timeout_s > 0 else DEFAULT_TIMEOUT_S


def clip_output(text: str) -> str:
    text = text.strip()
    return text if len(text) <= OUTPUT_CHARS else "..." + text[-OUTPUT_CHARS:]


class Health:
    """One task's health checks, from the moment it runs (`started_at`)."""

    def __init__(self, check: HealthCheck, started_at: float) -> None:
        if not has_check(check):
            raise ValueError("a HealthCheck needs a command, http or tcp check")
        self.check = check
        self.interval_s = interval_of(check)
        self.timeout_s = timeout_of(check)
        self.limit = check.consecutive_failures  # 0: never kill, only report
        self.grace_until = started_at + max(check.grace_period_s, 0.0)
        self.due_at: float | None = started_at + max(check.delay_s, 0.0)
        self.in_flight = False
        self.stopped = False  # the task is being killed or has ended: no more checks
        self.healthy: bool | None = None  # None until the first counted result
        self.passed_once = False  # a success ends the grace period early
        self.failures = 0  # counted failures in a row
        self.results = 0
        self.ignored = 0  # failures inside the grace period
        self.last_output = ""

    def due(self, now: float) -> bool:
        return (not self.stopped and not self.in_flight and self.due_at is not None
                and now >= self.due_at)

    def start(self) -> None:
        """The shell runs the check now; no other starts until its result comes back."""
        if self.due_at is None or self.in_flight or self.stopped:
            raise HealthError("a check started while none was due")
        self.in_flight = True
        self.due_at = None

    def result(self, ok: bool, output: str, now: float) -> Verdict | None:
        """Count a result (None: not counted, inside the grace period or after stop())."""
        if not self.in_flight:
            return None  # not one we asked for
        self.in_flight = False
        if self.stopped:
            return None
        self.due_at = now + self.interval_s
        self.results += 1
        self.last_output = clip_output(output)
        if ok:
            self.passed_once = True
            self.failures = 0
            changed = self.healthy is not True
            self.healthy = True
            return Verdict(True, changed, False, 0)
        if not self.passed_once and now < self.grace_until:
            self.ignored += 1
            return None
        self.failures += 1
        changed = self.healthy is not False
        self.healthy = False
        kill = 0 < self.limit <= self.failures
        if kill:
            self.stop()
        return Verdict(False, changed, kill, self.failures)

    def stop(self) -> None:
        self.stopped = True
        self.due_at = None

    def next_deadline(self) -> float | None:
        return None if self.stopped or self.in_flight else self.due_at

    def validate(self) -> None:
        def need(cond: bool, what: str) -> None:
            if not cond:
                raise HealthError(what)

        need(not (self.in_flight and self.due_at is not None), "in flight xor due")
        need(not self.stopped or self.due_at is None, "stopped: nothing due")
        need(self.failures == 0 or self.healthy is False, "failures only while unhealthy")
        need(self.limit == 0 or self.failures <= self.limit, "no failure after the kill")
        need(self.healthy is not True or self.failures == 0, "healthy: no failures in a row")
        need(self.healthy is None or self.results > 0, "health only after a result")
