"""The CLI loads what its commands use: importing it (every command pays for that) brings
neither the OpenTelemetry SDK nor the service framework's SDK, which `offerbus run` used to
pull in for a spec and the telemetry package for span names (~70 ms of every command's start).
Checked in a fresh interpreter: this test process has imported them already."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

HEAVY = ("opentelemetry.sdk.trace", "frameworks.service", "frameworks.sdk.driver",
         "services.allocator.decide", "rich.progress",
         # ZeroMQ (~20 ms): the CLI's settings (profiles) named the CURVE key variables
         # through services.bus.curve, which imported it with them
         "zmq")


def test_offerbus_run_up_to_its_cluster_lookup_loads_no_heavy_module(tmp_path: Path) -> None:
    """`offerbus run` as typed, against a cluster that is not there: it builds its spec
    and fails at the leader lookup (exit 1), having loaded none of HEAVY."""
    code = ("import json, sys; from services.cli.main import main; "
            f"code = main(['--run-dir', {str(tmp_path)!r}, '--cluster', "
            f"'file://{tmp_path}/none', '--timeout', '0.5', 'run', '--name', 'x', '--image', "
            "'i', '--', 'sleep', '1']); "
            f"print(json.dumps([code, [m for m in {HEAVY!r} if m in sys.modules]]))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, timeout=60)
    assert json.loads(out.stdout.splitlines()[-1]) == [1, []]


def test_the_telemetry_package_still_gives_its_functions_on_first_use() -> None:
    code = ("import sys; import services.telemetry as t; "
            "assert 'opentelemetry.sdk.trace' not in sys.modules; "
            "assert callable(t.setup) and callable(t.span_traceparent); "
            "assert 'opentelemetry.sdk.trace' in sys.modules; "
            "from services.telemetry import extract; print(extract.__module__)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, timeout=60)
    assert out.stdout.strip() == "services.telemetry.provider"
