"""A process of the run dir stopped for good (`offerbus stop` stops its service's framework
process) leaves nothing in pids/: its .argv went on piling up, one per service ever run and
stopped (a run dir the bench had used held dozens)."""

from __future__ import annotations

from pathlib import Path

from services.cli import cluster
from services.procs import pid_alive


def test_a_stopped_process_leaves_neither_its_pid_nor_its_argv(tmp_path: Path) -> None:
    pid = cluster.spawn(tmp_path, "framework-gone", ["-c", "import signal; signal.pause()"])
    assert {p.name for p in (tmp_path / "pids").iterdir()} == {"framework-gone.pid",
                                                               "framework-gone.argv"}
    assert cluster.stop_process(tmp_path, "framework-gone", timeout=10)
    assert not pid_alive(pid)
    assert list((tmp_path / "pids").iterdir()) == []
