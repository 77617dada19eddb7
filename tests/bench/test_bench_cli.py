"""The benchmarks' command lines: options given to a module are read (not ignored)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

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


def test_bench_scale_refuses_a_sampling_ratio_out_of_range() -> None:
    out = subprocess.run([sys.executable, "-m", "bench.scale", "--trace-sample", "2"],
                         cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert out.returncode == 2 and "--trace-sample" in out.stderr
    assert "cluster up" not in out.stdout


def test_scale_sampling_reaches_the_processes_started_after_it(monkeypatch: Any) -> None:
    from bench import scale

    for name in ("OTEL_TRACES_SAMPLER", "OTEL_TRACES_SAMPLER_ARG"):
        # Set, then removed, through monkeypatch: it restores both as they were after the
        # test (sampling() writes os.environ, which would leak a 1% sampler into the
        # tracing tests that follow; a delenv of an absent name records nothing to undo).
        monkeypatch.setenv(name, "")
        monkeypatch.delenv(name)
    assert "every offer" in scale.sampling(1.0)
    assert "OTEL_TRACES_SAMPLER" not in os.environ
    assert "0.01" in scale.sampling(0.01)
    assert os.environ["OTEL_TRACES_SAMPLER"] == "parentbased_traceidratio"
    assert float(os.environ["OTEL_TRACES_SAMPLER_ARG"]) == 0.01


def test_scale_trials_of_each_kind_are_reported_as_that_kind(monkeypatch: Any) -> None:
    # The two kinds take turns going first; a trial's figure must land in its own column
    # (the plain column held a declared-demand trial, and the other way round).
    from bench import scale

    run = scale.Run.__new__(scale.Run)
    run.row = {"cpu_s": {}}
    monkeypatch.setattr(scale.Run, "pids", lambda self: {})
    kinds: list[bool] = []

    def one_task(self: Any, i: int, samples: list[float], offers: list[float],
                 declare: bool = False) -> None:
        kinds.append(declare)
        samples.append(2.0 if declare else 1.0)
        if not declare:
            offers.append(0.5)

    monkeypatch.setattr(scale.Run, "_one_task", one_task)
    run.subscribe_to_running()
    assert kinds == [False, True, True, False, False, True]
    assert run.row["subscribe_to_running_s"] == [1.0] * scale.SUBSCRIBE_TRIALS
    assert run.row["subscribe_to_running_declared_s"] == [2.0] * scale.SUBSCRIBE_TRIALS


def test_scale_report_without_failover_with_the_smallest_size_last(monkeypatch: Any) -> None:
    from bench import scale

    written: list[Any] = []
    monkeypatch.setattr(scale, "write", lambda name, doc: written.append(doc) or "x.json")
    rows = [{"agents": n, "tasks": n, "registration_s": 1.0, "launch_rate": 100.0,
             "subscribe_to_running_s": [0.3], "cpu_s": {}} for n in (10_000, 1000)]
    scale.report(rows, {"seconds_total": 1.0})
    assert written and [r["agents"] for r in written[0]["rows"]] == [10_000, 1000]


def test_a_terminated_scale_bench_takes_its_cluster_down() -> None:
    # SIGTERM (a CI timeout, `kill`) ended the bench without its finally: the cluster it
    # started (ZooKeeper, six services, the emulator) ran on.
    import re
    import signal

    from services.cli import cluster as local_cluster
    from tests.waiting import wait_for

    proc = subprocess.Popen([sys.executable, "-m", "bench.scale", "--agents", "20",
                             "--tasks-per-agent", "1", "--skip-subscribe", "--no-failover"],
                            cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    run_dir = None
    try:
        assert proc.stdout is not None
        for line in proc.stdout:
            m = re.search(r"cluster up in (\S+):", line)
            if m:
                run_dir = Path(m.group(1))
                break
        assert run_dir is not None, "the bench never brought its cluster up"
        assert local_cluster.running(run_dir)
        proc.send_signal(signal.SIGTERM)
        proc.communicate(timeout=60)
        assert wait_for(lambda: not local_cluster.running(run_dir), 30,
                        message="the cluster outlived its bench")
        # ... nor any process it started and did not record (its emulator once ran on).
        assert wait_for(lambda: not _processes_of(run_dir), 30,
                        message=lambda: f"left running: {_processes_of(run_dir)}")
    finally:
        if proc.poll() is None:
            proc.kill()
        if run_dir is not None:
            if local_cluster.running(run_dir):
                local_cluster.down(run_dir)
            # The interrupted bench keeps its logs for a person; this test's are its own.
            shutil.rmtree(run_dir, ignore_errors=True)


def _processes_of(run_dir: Path) -> list[int]:
    """Live processes started for `run_dir` (the traces folder in their environment)."""
    mark = f"OFFERBUS_TRACES_DIR={run_dir / 'traces'}".encode()
    found = []
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit():
            try:
                if mark in (proc / "environ").read_bytes().split(b"\0"):
                    found.append(int(proc.name))
            except OSError:
                continue
    return found


def test_timeline_counts_the_cli_runs_cpu_under_the_cli() -> None:
    """bench.timeline's CPU groups: a child this process ran and waited for (as it runs the
    CLI) is counted under "the CLI", the time it spent on a core (not the wall clock)."""
    from bench.timeline import GROUPS, cpu_by_group, cpu_by_process

    before = cpu_by_process()
    subprocess.run([sys.executable, "-c",
                    "import time\nt = time.process_time()\n"
                    "while time.process_time() - t < 0.4: pass"], check=True, timeout=60)
    used = cpu_by_group(before)
    assert set(GROUPS) <= set(used) and all(v >= 0 for v in used.values())
    assert used["the CLI"] >= 0.3


@pytest.mark.integration  # the bench reaches the container engine before the CLI
def test_timeline_says_why_the_cli_failed_not_a_traceback(tmp_path: Path) -> None:
    """A run dir with no cluster: the bench stops with the CLI's own words (they were hidden
    in a CalledProcessError's traceback, the CLI's output captured and dropped)."""
    out = subprocess.run([sys.executable, "-m", "bench.timeline", "--instances", "1",
                          "--rounds", "1", "--run-dir", str(tmp_path / "none")], cwd=ROOT,
                         capture_output=True, text=True, timeout=60)
    assert out.returncode != 0
    assert "no cluster given" in out.stderr and "Traceback" not in out.stderr, out.stderr
