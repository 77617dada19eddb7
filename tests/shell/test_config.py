"""The service kit's configuration: flags over OFFERBUS_* over the TOML file over defaults,
every value checked, and errors that name the bad value's source."""

from __future__ import annotations

from pathlib import Path

import pytest

from services.shell.config import COMMON, ConfigError, Option, load

OPTIONS = (*COMMON, Option("offer_timeout", float, 30.0, "s", minimum=0),
           Option("id", default="b-1"), Option("verbose", bool, False))


def test_defaults_then_file_then_environment_then_flags(tmp_path: Path) -> None:
    cfg = tmp_path / "offerbus.toml"
    cfg.write_text('cluster = "zk://h:1/x"\nheartbeat = 2.0\n[broker]\noffer_timeout = 10\n'
                   '[master]\nreregister_window = 5\n')
    v = load("broker", OPTIONS, ["--config", str(cfg)], environ={})
    assert (v["cluster"], v["heartbeat"], v["offer_timeout"], v["id"]) == (
        "zk://h:1/x", 2.0, 10.0, "b-1")
    env = {"OFFERBUS_OFFER_TIMEOUT": "7", "OFFERBUS_BROKER_ID": "b-env",
           "OFFERBUS_ID": "generic", "OFFERBUS_VERBOSE": "yes"}
    v = load("broker", OPTIONS, ["--config", str(cfg)], environ=env)
    assert (v["offer_timeout"], v["id"], v["verbose"]) == (7.0, "b-env", True)
    v = load("broker", OPTIONS, ["--config", str(cfg), "--offer-timeout", "3"], environ=env)
    assert v["offer_timeout"] == 3.0


@pytest.mark.parametrize(("argv", "env", "message"), [
    ([], {}, "--cluster is required"),
    (["--cluster", "file:///x", "--heartbeat", "fast"], {}, "--heartbeat: expected a number"),
    (["--cluster", "file:///x", "--max-missed", "2.5"], {}, "--max-missed: "),
    (["--cluster", "file:///x"], {"OFFERBUS_OFFER_TIMEOUT": "-1"},
     "OFFERBUS_OFFER_TIMEOUT: must be >= 0"),
    (["--cluster", "file:///x"], {"OFFERBUS_HEARTBEAT": "nan"}, "must be a finite number"),
    (["--cluster", "file:///x", "--log-level", "LOUD"], {}, "must be one of DEBUG"),
    (["--cluster", "file:///x", "--http-port", "70000"], {}, "must be <= 65535"),
])
def test_bad_values_name_their_source(argv: list[str], env: dict[str, str],
                                      message: str) -> None:
    with pytest.raises(ConfigError, match=message.replace("(", r"\(")):
        load("broker", OPTIONS, argv, environ=env)


def test_choices_are_case_insensitive() -> None:
    """OFFERBUS_LOG_LEVEL=debug is what bus/log.py and the executors always took."""
    v = load("broker", OPTIONS, ["--cluster", "file:///x"], environ={"OFFERBUS_LOG_LEVEL": "debug"})
    assert v["log_level"] == "DEBUG"


def test_bad_files_are_refused_with_the_reason(tmp_path: Path) -> None:
    missing = tmp_path / "nope.toml"
    with pytest.raises(ConfigError, match="cannot read it"):
        load("broker", OPTIONS, ["--config", str(missing)], environ={})
    broken = tmp_path / "broken.toml"
    broken.write_text("cluster = \n")
    with pytest.raises(ConfigError, match="not valid TOML"):
        load("broker", OPTIONS, ["--config", str(broken)], environ={})
    typo = tmp_path / "typo.toml"
    typo.write_text('cluster = "file:///x"\n[broker]\noffer_timout = 3\n')
    with pytest.raises(ConfigError, match=r"unknown option.*offer_timout"):
        load("broker", OPTIONS, ["--config", str(typo)], environ={})
    wrong = tmp_path / "wrong.toml"
    wrong.write_text('cluster = "file:///x"\nheartbeat = "soon"\n')
    with pytest.raises(ConfigError, match="heartbeat: expected a number"):
        load("broker", OPTIONS, [], environ={"OFFERBUS_CONFIG": str(wrong)})


def test_a_service_exits_2_with_one_clear_line_on_bad_config(
        capsys: pytest.CaptureFixture[str]) -> None:
    from services.master.__main__ import main

    assert main(["--cluster", "file:///nonexistent", "--heartbeat", "-3"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["offerbus-master: --heartbeat: must be >= 0.01 (got -3.0)"]
