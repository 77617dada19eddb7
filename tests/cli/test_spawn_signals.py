"""A stop signal that comes while a process is being spawned waits until its pid is
recorded (services/cli/cluster.py `exit_on_signal`): a bench terminated right after its
cluster came up left its agent emulator running, recorded nowhere, retrying its ZooKeeper
for good."""

from __future__ import annotations

import os
import signal
import subprocess
from pathlib import Path
from typing import Any

import pytest

from services.cli import cluster
from services.procs import pid_alive


def test_a_sigterm_during_a_spawn_exits_after_the_pid_is_recorded(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    started: list[subprocess.Popen[bytes]] = []
    real = subprocess.Popen

    def popen_then_signalled(*args: Any, **kw: Any) -> subprocess.Popen[bytes]:
        proc = real(*args, **kw)
        started.append(proc)
        os.kill(os.getpid(), signal.SIGTERM)  # handled before the next line runs
        return proc

    monkeypatch.setattr(cluster.subprocess, "Popen", popen_then_signalled)
    old = signal.signal(signal.SIGTERM, cluster.exit_on_signal)
    try:
        with pytest.raises(SystemExit) as stopped:
            cluster.spawn(tmp_path, "sleeper", ["-c", "import time; time.sleep(60)"])
        assert stopped.value.code == 128 + signal.SIGTERM
        assert started and pid_alive(started[0].pid)
        assert cluster.running(tmp_path) == {"sleeper": started[0].pid}  # a down finds it
    finally:
        signal.signal(signal.SIGTERM, old)
        for proc in started:
            proc.kill()
            proc.wait(10)
