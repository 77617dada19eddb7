"""`offerbus keys generate|list` (issue 11): ZeroMQ certs the services load, the secret
kept private, never an overwrite."""

from __future__ import annotations

import stat
from pathlib import Path

import pytest
import zmq

from services.bus.curve import KeyPair, load_public_key
from services.cli.main import main


def test_generate_writes_a_loadable_pair_with_a_private_secret(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["keys", "generate", "agent-1", "--dir", str(tmp_path)]) == 0
    pair = KeyPair.load(tmp_path / "agent-1.key_secret")
    assert load_public_key(tmp_path / "agent-1.key") == pair.public
    assert zmq.curve_public(pair.secret) == pair.public  # a real pair
    assert stat.S_IMODE((tmp_path / "agent-1.key_secret").stat().st_mode) == 0o600
    assert pair.public.decode() in capsys.readouterr().out


def test_list_shows_each_key_and_whether_its_secret_is_here(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    for name in ("b", "a"):
        assert main(["keys", "generate", name, "--dir", str(tmp_path)]) == 0
    (tmp_path / "b.key_secret").unlink()
    capsys.readouterr()
    assert main(["keys", "list", "--dir", str(tmp_path)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert [line.split("\t")[0] for line in lines] == ["a", "b"]
    assert lines[0].split("\t")[1] == load_public_key(tmp_path / "a.key").decode()
    assert lines[0].endswith("secret") and lines[1].endswith("public only")


def test_an_existing_key_is_never_overwritten(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["keys", "generate", "m", "--dir", str(tmp_path)]) == 0
    before = (tmp_path / "m.key_secret").read_text()
    assert main(["keys", "generate", "m", "--dir", str(tmp_path)]) == 1
    assert "exists" in capsys.readouterr().out
    assert (tmp_path / "m.key_secret").read_text() == before


def test_bad_names_and_missing_directories_are_refused(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["keys", "generate", "../evil", "--dir", str(tmp_path)]) == 1
    assert "bad key name" in capsys.readouterr().out
    assert not list(tmp_path.iterdir()) and not (tmp_path.parent / "evil.key").exists()
    assert main(["keys", "list", "--dir", str(tmp_path / "nope")]) == 1
    # (The console wraps at 80 columns, and a long tmp_path puts the break inside.)
    assert "no such directory" in " ".join(capsys.readouterr().out.split())
