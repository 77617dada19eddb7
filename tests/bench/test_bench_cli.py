"""The benchmarks' command lines: options given to a module are read (not ignored)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_bench_scale_reads_its_command_line() -> None:
    # --help must print the usage and exit; a main() that ignores argv runs the whole
    # benchmark (minutes) instead.
    out = subprocess.run([sys.executable, "-m", "bench.scale", "--help"], cwd=ROOT,
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert "--agents" in out.stdout and "bench scale:" not in out.stdout


def test_bench_scale_refuses_an_unknown_option() -> None:
    out = subprocess.run([sys.executable, "-m", "bench.scale", "--no-such-option"], cwd=ROOT,
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 2 and "unrecognized arguments" in out.stderr


def test_bench_scale_refuses_a_missing_sampler_before_starting_a_cluster() -> None:
    out = subprocess.run([sys.executable, "-m", "bench.scale", "--spy", "/nonexistent/py-spy"],
                         cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert out.returncode == 2 and "no py-spy" in out.stderr and "cluster up" not in out.stdout
