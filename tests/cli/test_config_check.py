"""`offerbus config check FILE`: a good file prints each configured service's effective
values and where each came from (exit 0); a bad one exits 2 with the reason."""

from __future__ import annotations

import os
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from services.cli.config_cmd import check

GOOD = '''cluster = "zk://10.0.0.1:2181,10.0.0.2:2181/offerbus"
listen_host = "0.0.0.0"
advertise_host = "10.0.0.5"
heartbeat = 0.5
[master]
port = 5050
[broker]
offer_timeout = 20
'''


def config_check(path: Path, *more: str, env: dict[str, str] | None = None,
                 ) -> subprocess.CompletedProcess[str]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("OFFERBUS_")}
    return subprocess.run([sys.executable, "-m", "services.cli", "config", "check", str(path),
                           *more], capture_output=True, text=True, timeout=60,
                          env={**clean, **(env or {})})


def test_a_good_file_prints_the_effective_configuration(tmp_path: Path) -> None:
    f = tmp_path / "fleet.toml"
    f.write_text(GOOD)
    out = config_check(f, env={"OFFERBUS_MASTER_HTTP_PORT": "8080"})
    assert out.returncode == 0, out.stderr
    assert out.stderr == ""
    doc = tomllib.loads(out.stdout)  # the output is TOML itself
    assert set(doc) == {"master", "broker"}  # the tables the file has
    assert doc["master"]["port"] == 5050 and doc["broker"]["offer_timeout"] == 20.0
    assert doc["master"]["http_port"] == 8080 and doc["broker"]["http_port"] == 0
    assert doc["master"]["max_missed"] == 5  # a default, shown
    lines = out.stdout.splitlines()
    assert f"port = 5050  # {f}" in lines
    assert "http_port = 8080  # OFFERBUS_MASTER_HTTP_PORT" in lines
    assert "max_missed = 5  # default" in lines
    assert lines.count("# binds 0.0.0.0, advertises 10.0.0.5") == 2
    only = config_check(f, "--service", "allocator")
    assert only.returncode == 0 and set(tomllib.loads(only.stdout)) == {"allocator"}


@pytest.mark.parametrize(("text", "reason"), [
    ('cluster = "file:///x"\n[broker]\noffer_timout = 3\n',
     "[broker] --config {f}: unknown option(s) offer_timout in [broker]; known: "),
    ('cluster = "file:///x"\nheartbeat = "soon"\n',
     "--config {f}: heartbeat: expected a number, got 'soon'"),
    ('cluster = "file:///x"\n[master]\nadvertise_host = "0.0.0.0"\n',
     "[master] --config {f}: advertise_host: 0.0.0.0 is not an address others can reach"),
    ('cluster = "zk://zk1:2181,zk2/offerbus"\n[master]\n',
     "[master] --config {f}: cluster: bad ZooKeeper server 'zk2'"),
    ('cluster = "file:///x"\n[mastr]\nport = 1\n',
     "--config {f}: unknown table(s) mastr; a table is named after a service: master, "),
    ('cluster = "file:///x"\n[agent]\nruntime = "docker"\n',
     "[agent] --work-dir is required"),
    ('cluster = \n', "--config {f}: not valid TOML"),
])
def test_a_bad_file_exits_2_with_the_reason(tmp_path: Path, text: str, reason: str) -> None:
    f = tmp_path / "bad.toml"
    f.write_text(text)
    out = config_check(f)
    assert out.returncode == 2, out.stdout
    assert out.stdout == ""
    assert reason.format(f=f) in out.stderr, out.stderr
    assert out.stderr.startswith("offerbus config check: ") and "Traceback" not in out.stderr


def test_a_missing_file_exits_2(tmp_path: Path) -> None:
    out = config_check(tmp_path / "nope.toml")
    assert out.returncode == 2 and "cannot read it" in out.stderr


def test_the_environment_counts_as_it_would_for_the_service(tmp_path: Path) -> None:
    f = tmp_path / "c.toml"
    f.write_text('cluster = "file:///x"\n[broker]\n')
    lines, errors = check(str(f), environ={"OFFERBUS_HEARTBEAT": "-1"})
    assert errors == ["[broker] OFFERBUS_HEARTBEAT: must be >= 0.01 (got -1.0)"] and not lines


def test_every_service_with_a_configuration_can_be_checked(tmp_path: Path) -> None:
    """Each table name the loader admits names options the check can find."""
    from services.shell import config

    f = tmp_path / "all.toml"
    f.write_text('cluster = "file:///x"\n' + "".join(
        f"[{s}]\n" + ('work_dir = "/w"\n' if s == "agent" else "") for s in config.SERVICES))
    lines, errors = check(str(f), environ={})
    assert errors == []
    assert [ln for ln in lines if ln.startswith("[")] == [f"[{s}]" for s in config.SERVICES]
