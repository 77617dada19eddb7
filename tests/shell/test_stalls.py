"""The stall watch every service process runs (services/shell/stalls.py): a stall of the
whole process (here a C call that holds the GIL for over a second, as a huge message's parse
would) is counted and logged when it ends. Before it, such a stall showed only as a lost
ZooKeeper session: a leader stepped down mid-launch at 10k agents, its log silent."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from services.shell.metrics import Metrics
from services.shell.stalls import StallWatch

PROBE = """
import sys, threading, time
from services.bus.reactor import Reactor
from services.shell import process
from services.shell.metrics import Metrics
from tests.waiting import wait_for


def hog(seconds):
    # sum() over a range runs in C and never gives up the GIL: the whole process stalls.
    t = time.perf_counter()
    sum(range(2_000_000))
    n = int(2_000_000 * seconds / max(time.perf_counter() - t, 1e-6))
    sum(range(n))


class Shell:
    reactor = Reactor()
    metrics = Metrics("probe")

    def stalls(self):
        return self.metrics.registry.get_sample_value("offerbus_probe_stall_seconds_count")

    def run(self):
        wait_for(lambda: any(t.name == "stall-watch" for t in threading.enumerate()), 10,
                 interval=0.01, message="the stall watch's thread never ran")
        before = self.stalls()
        hog(2.5)  # aimed well past 1 s: on a loaded box the calibration runs slow (1.6 gave 0.97)
        wait_for(lambda: self.stalls() != before, 10, message="no stall counted")
        print(f"stalls {before} -> {self.stalls()}", flush=True)

    def close(self):
        pass


sys.exit(process.main("probe", [], lambda values: Shell(), argv=["--cluster", sys.argv[1]],
                      trace_attributes=lambda shell: {"id": "probe"}))
"""


def test_a_process_stall_is_counted_and_logged(tmp_path: Path) -> None:
    out = subprocess.run([sys.executable, "-c", PROBE, f"file://{tmp_path}"],
                         capture_output=True, text=True, timeout=60, cwd=Path.cwd())
    text = out.stdout + out.stderr
    assert out.returncode == 0, text[-3000:]
    assert "stalls 0.0 -> 1.0" in out.stdout, text[-3000:]
    line = next((ln for ln in text.splitlines() if "process stalled" in ln), "")
    seconds = float(line.split("seconds=", 1)[1].split()[0]) if line else 0.0
    assert seconds >= 1.0 and "main_thread_in=" in line, text[-3000:]


def test_a_watch_with_thresholds_out_of_order_is_refused() -> None:
    with pytest.raises(ValueError):
        StallWatch(Metrics("probe"), None, period_s=0.5, report_s=0.25)  # type: ignore[arg-type]
