"""The CLI from another machine through a profile (issue 11): a cluster up with CURVE and an
HTTP token; the CLI runs with no OFFERBUS_* variable at all, in a directory of its own (no
run dir of the cluster's), its CURVE cert, the master's public one and the token copied into
its own config directory; `offerbus --profile p status`, `tasks` and an operator call
(`roles weight`, over CURVE) work from the profile file alone; without the profile, or with
a profile missing the token or the keys, the same commands fail with a clear message."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from infra.zookeeper import ZooKeeperServer
from tests.e2e import Cluster, local_cluster_in

TOKEN = "profile-itest-token-8c4e1a2f"
REPO = Path(__file__).resolve().parents[2]


@dataclass
class Remote:
    cluster: Cluster
    home: Path  # the other machine's home: its config in .config/offerbus/cli.toml

    def cli(self, *args: str) -> subprocess.CompletedProcess[str]:
        """`offerbus ARGS` with no OFFERBUS_* variable, from the remote home."""
        return subprocess.run([sys.executable, "-m", "services.cli", "--timeout", "5", *args],
                              capture_output=True, text=True, timeout=90, cwd=self.home,
                              env={"PATH": "/usr/bin:/bin", "COLUMNS": "250",
                                   "HOME": str(self.home), "PYTHONPATH": str(REPO)})


@pytest.fixture(scope="module")
def remote(zk: ZooKeeperServer, zk_admin: Any,
           tmp_path_factory: pytest.TempPathFactory) -> Iterator[Remote]:
    root = tmp_path_factory.mktemp("profile")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("OFFERBUS_HTTP_TOKEN", TOKEN)  # the services `up` starts inherit it
        with local_cluster_in(zk, zk_admin, root / "cluster", "profile", agents=1,
                              runtime="process", curve=True,
                              agent_resources="cpus:2;mem:1024;disk:1024;ports:[46440-46449]"
                              ) as c:
            home = root / "laptop"
            conf = home / ".config" / "offerbus"
            (conf / "keys").mkdir(parents=True)
            for name in ("operator.key_secret", "server.key"):  # what an operator is handed
                shutil.copy(c.run_dir / "keys" / name, conf / "keys" / name)
            (conf / "prod.token").write_text(TOKEN + "\n")
            (conf / "cli.toml").write_text(f"""
[profiles.p]
cluster = "{c.url}"
key = "keys/operator.key_secret"
server_key = "keys/server.key"
token_file = "prod.token"
run_dir = "{home / 'run'}"

[profiles.notoken]
cluster = "{c.url}"
key = "keys/operator.key_secret"
server_key = "keys/server.key"

[profiles.nokey]
cluster = "{c.url}"
token_file = "prod.token"
""")
            yield Remote(c, home)


def test_status_tasks_and_an_operator_call_from_the_profile_alone(remote: Remote) -> None:
    out = remote.cli("--profile", "p", "status", "--json")
    assert out.returncode == 0, out.stdout + out.stderr
    doc = json.loads(out.stdout)
    assert doc["cluster"] == remote.cluster.url
    assert doc["agents"] == {"registered": 1}
    out = remote.cli("--profile", "p", "tasks", "--all", "--json")
    assert out.returncode == 0, out.stdout + out.stderr
    assert json.loads(out.stdout) == []
    # an operator call over CURVE: the profile's key gets through the master's handshake
    out = remote.cli("--profile", "p", "roles", "weight", "eng", "2")
    assert out.returncode == 0, out.stdout + out.stderr
    shown = remote.cli("--profile", "p", "config", "profiles")
    assert shown.returncode == 0 and TOKEN not in shown.stdout
    assert "token_file  " in shown.stdout and "[profile p]" in shown.stdout


def test_without_the_profile_the_same_commands_fail_clearly(remote: Remote) -> None:
    out = remote.cli("status")
    assert out.returncode == 1 and "no cluster given" in out.stdout, out.stdout + out.stderr
    out = remote.cli("--profile", "notoken", "tasks")
    said = out.stdout + out.stderr
    assert out.returncode == 1 and "HTTP 401" in said, said
    out = remote.cli("--profile", "nokey", "roles", "weight", "eng", "3")
    said = " ".join((out.stdout + out.stderr).split())
    assert out.returncode == 1 and "no answer from the master" in said, said
    assert "OFFERBUS_CURVE_SECRET_KEY_FILE" in said
    out = remote.cli("--profile", "qa", "status")
    said = out.stdout + out.stderr
    assert out.returncode == 1 and "no profile 'qa'" in said, said
