"""Running one health check (the executor shell's side, called on a worker thread, never on the
reactor): a command inside the task's container through the runtime port (`docker exec` for
Docker tasks), an HTTP GET to 127.0.0.1:<port><path> (200-399 is healthy), or a TCP connect to
127.0.0.1:<port>. Output is bounded. Nothing here decides health: health.py does."""

from __future__ import annotations

import http.client
import socket
import ssl
from dataclasses import dataclass

from schemas import common_pb2
from services.executor.runtime import Handle, Runtime

CHECK_OUTPUT_BYTES = 1024  # of a command's output, or of an HTTP body, kept per check
CHECK_HOST = "127.0.0.1"  # checks only ever reach loopback


@dataclass(frozen=True)
class CheckResult:
    ok: bool
    output: str


def command_argv(cmd: common_pb2.CommandInfo) -> list[str]:
    if cmd.shell:
        return ["/bin/sh", "-c", cmd.value]
    return [a for a in (cmd.value, *cmd.arguments) if a]


def run_check(check: common_pb2.HealthCheck, timeout_s: float, runtime: Runtime,
              handle: Handle | None) -> CheckResult:
    """One check; any failure to run it is an unhealthy result (never an exception)."""
    kind = check.WhichOneof("check")
    try:
        if kind == "command":
            if handle is None:
                return CheckResult(False, "no container to run the check in")
            return command_check(runtime, handle, command_argv(check.command.command), timeout_s)
        if kind == "http":
            return http_check(check.http.port, check.http.path, check.http.scheme, timeout_s)
        if kind == "tcp":
            return tcp_check(check.tcp.port, timeout_s)
        return CheckResult(False, "the health check names no command, http or tcp check")
    except Exception as exc:  # a check that cannot run fails; the executor goes on
        return CheckResult(False, f"the check could not run: {exc!r}")


def command_check(runtime: Runtime, handle: Handle, argv: list[str],
                  timeout_s: float) -> CheckResult:
    if not argv:
        return CheckResult(False, "the command check has no command")
    res = runtime.exec(handle, argv, timeout_s, CHECK_OUTPUT_BYTES)
    text = res.output.decode("utf-8", "replace")
    if res.timed_out:
        return CheckResult(False, f"timed out after {timeout_s:g}s; output: {text}".strip())
    if res.exit_code != 0:
        return CheckResult(False, f"exited with {res.exit_code}: {text}".strip())
    return CheckResult(True, text)


def http_check(port: int, path: str, scheme: str, timeout_s: float) -> CheckResult:
    if not 0 < port < 65536:
        return CheckResult(False, f"bad port {port}")
    conn: http.client.HTTPConnection
    if scheme == "https":  # the task's own certificate: reachability, not identity
        conn = http.client.HTTPSConnection(CHECK_HOST, port, timeout=timeout_s,
                                           context=ssl._create_unverified_context())
    else:
        conn = http.client.HTTPConnection(CHECK_HOST, port, timeout=timeout_s)
    try:
        conn.request("GET", path or "/", headers={"User-Agent": "offerbus-health-check"})
        resp = conn.getresponse()
        body = resp.read(CHECK_OUTPUT_BYTES).decode("utf-8", "replace")
    except (OSError, http.client.HTTPException) as exc:
        return CheckResult(False, f"GET {path or '/'}: {exc!r}")
    finally:
        conn.close()
    text = f"HTTP {resp.status} {resp.reason}: {body}".strip()
    return CheckResult(200 <= resp.status < 400, text)


def tcp_check(port: int, timeout_s: float) -> CheckResult:
    if not 0 < port < 65536:
        return CheckResult(False, f"bad port {port}")
    try:
        with socket.create_connection((CHECK_HOST, port), timeout=timeout_s):
            return CheckResult(True, f"connected to port {port}")
    except OSError as exc:
        return CheckResult(False, f"cannot connect to port {port}: {exc}")
