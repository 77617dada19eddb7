"""CLI profiles (services/cli/profiles.py): where the CLI config file is, how it is checked
(each refusal names the file, the profile and the key), which profile is chosen, the
precedence flag > environment > profile > default, and that every command gets the chosen
profile's settings through the CLI's start (no per-command code); secrets never printed."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

from services.bus.curve import client_from_env
from services.cli import client, profiles
from services.cli import main as cli_main
from services.cli.keys import generate

TOKEN = "profile-token-5d1c9a7e3b"
ENV_TOKEN = "environment-token-0b9e2f4c"
NAMES = ("OFFERBUS_CLI_CONFIG", "OFFERBUS_PROFILE", "XDG_CONFIG_HOME", "OFFERBUS_RUN_DIR",
         *(s.env for s in profiles.SETTINGS))


@pytest.fixture
def env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> pytest.MonkeyPatch:
    """No OFFERBUS_* of the test run's; whatever the CLI's start sets is undone afterwards
    (set-then-delete makes monkeypatch restore each name)."""
    for name in NAMES:
        monkeypatch.setenv(name, "")
        monkeypatch.delenv(name)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    return monkeypatch


@pytest.fixture
def keys(tmp_path: Path) -> Path:
    directory = tmp_path / "cfg" / "keys"
    generate(directory, "ops")
    generate(directory, "server")
    return directory


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "cfg" / "cli.toml"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


GOOD = f"""
default = "prod"
[profiles.prod]
cluster = "zk://10.0.0.1:2181,10.0.0.2:2181/offerbus"
master = "10.0.0.1:5050"
key = "keys/ops.key_secret"
server_key = "keys/server.key"
token = "{TOKEN}"
run_dir = "runs/prod"
[profiles.lab]
cluster = "file:///srv/lab"
token_file = "lab.token"
"""


def test_the_file_is_found_by_variable_then_xdg_then_home(tmp_path: Path) -> None:
    home = tmp_path / "h"
    assert profiles.config_path({"HOME": str(home)}) == (
        home / ".config/offerbus/cli.toml", "default location")
    assert profiles.config_path({"HOME": str(home), "XDG_CONFIG_HOME": "/x"})[0] == \
        Path("/x/offerbus/cli.toml")
    assert profiles.config_path({"XDG_CONFIG_HOME": "/x", "OFFERBUS_CLI_CONFIG": "/y.toml"}) \
        == (Path("/y.toml"), "OFFERBUS_CLI_CONFIG")


def test_a_good_file_loads_with_paths_taken_from_its_directory(tmp_path: Path) -> None:
    path = write(tmp_path, GOOD)
    loaded = profiles.load(path)
    assert loaded.default == "prod"
    assert list(loaded.profiles) == ["prod", "lab"]
    prod = loaded.profiles["prod"]
    assert prod["key"] == str(path.parent / "keys/ops.key_secret")
    assert prod["run_dir"] == str(path.parent / "runs/prod")
    assert prod["master"] == "10.0.0.1:5050"
    assert loaded.profiles["lab"] == {"cluster": "file:///srv/lab",
                                      "token_file": str(path.parent / "lab.token")}


@pytest.mark.parametrize(("text", "says"), [
    ('colour = "red"', "unknown key(s) colour"),
    ('[profiles.p]\ncluster = "zk://h:2181/x"\nkee = "k"', "[profiles.p]: unknown key(s) kee"),
    ('[profiles.p]\ncluster = "http://h:2181"', "[profiles.p] cluster: expected zk://"),
    ('[profiles.p]\ncluster = "zk://h:99999/x"', "bad ZooKeeper server"),
    ('[profiles.p]\nmaster = "10.0.0.1"', "[profiles.p] master: expected host:port"),
    ('[profiles.p]\nmaster = "no host!:80"', "not an IPv4 address or host name"),
    ('[profiles.p]\nmaster = 5050', "[profiles.p] master: expected text, got 5050"),
    ('[profiles.p]\nrun_dir = ["a"]', "[profiles.p] run_dir: expected text"),
    ('[profiles.p]\ntoken = "short"', "[profiles.p] token: an HTTP token is 16 to 512"),
    ('[profiles.p]\ntoken = 1234567890123456789', "[profiles.p] token: expected text"),
    (f'[profiles.p]\ntoken = "{TOKEN}"\ntoken_file = "t"', "token or token_file, not both"),
    ('[profiles.p]\nkey = "a.key_secret"', "key and server_key go together"),
    ('[profiles.p]\nrun_dir = ""', "[profiles.p] run_dir: empty"),
    ('profiles = 3', "`profiles` must be a table"),
    ('[profiles]\np = 3', "[profiles.p] must be a table"),
    ('default = "q"\n[profiles.p]\nrun_dir = "r"', "default = 'q' names no profile"),
    ('default = 1', "default: expected a profile's name"),
    ('[profiles.p\n', "not valid TOML"),
])
def test_a_bad_file_is_refused_naming_where(tmp_path: Path, text: str, says: str) -> None:
    path = write(tmp_path, text)
    with pytest.raises(profiles.ProfileError) as err:
        profiles.load(path)
    assert says in str(err.value)
    assert str(path) in str(err.value)
    assert "short" not in str(err.value) and "123456789" not in str(err.value)  # a secret


def test_a_missing_or_wrong_key_file_of_the_chosen_profile_is_refused(
        env: pytest.MonkeyPatch, tmp_path: Path, keys: Path) -> None:
    path = write(tmp_path, GOOD.replace("keys/ops.key_secret", "keys/gone.key_secret"))
    environ = {"OFFERBUS_CLI_CONFIG": str(path)}
    with pytest.raises(profiles.ProfileError, match=r"profile prod .* key: .*gone.key_secret"):
        profiles.resolve(None, {}, environ)
    # A public cert is not a secret one.
    path = write(tmp_path, GOOD.replace("keys/ops.key_secret", "keys/ops.key"))
    with pytest.raises(profiles.ProfileError, match=r"key: .*no secret key"):
        profiles.resolve(None, {}, environ)
    # A file the profile names but the environment overrides is not used, so not checked.
    environ[profiles.SECRET_ENV] = str(keys / "ops.key_secret")
    assert profiles.resolve(None, {}, environ).values["key"] == (
        str(keys / "ops.key_secret"), profiles.SECRET_ENV)
    # Another profile's files are only checked when it is chosen.
    (path.parent / "lab.token").write_text(TOKEN + "\n")
    assert profiles.resolve("lab", {}, {"OFFERBUS_CLI_CONFIG": str(path)}).profile == "lab"


def test_a_token_file_is_read_and_checked_when_chosen(tmp_path: Path) -> None:
    path = write(tmp_path, GOOD)
    environ = {"OFFERBUS_CLI_CONFIG": str(path)}
    with pytest.raises(profiles.ProfileError, match=r"token_file: .*lab.token: cannot read"):
        profiles.resolve("lab", {}, environ)
    (path.parent / "lab.token").write_text("bad token\n")
    with pytest.raises(profiles.ProfileError, match="an HTTP token is"):
        profiles.resolve("lab", {}, environ)
    (path.parent / "lab.token").write_text(TOKEN + "\n")
    res = profiles.resolve("lab", {}, environ)
    assert res.exports() == {"OFFERBUS_CLUSTER": "file:///srv/lab",
                             "OFFERBUS_HTTP_TOKEN_FILE": str(path.parent / "lab.token")}


def test_which_profile(tmp_path: Path, keys: Path) -> None:
    path = write(tmp_path, GOOD)
    (path.parent / "lab.token").write_text(TOKEN)
    base = {"OFFERBUS_CLI_CONFIG": str(path)}
    assert profiles.resolve(None, {}, base).profile == "prod"  # the file's default
    chosen = profiles.resolve(None, {}, base | {"OFFERBUS_PROFILE": "lab"})
    assert (chosen.profile, chosen.chosen_by) == ("lab", "OFFERBUS_PROFILE")
    chosen = profiles.resolve("prod", {}, base | {"OFFERBUS_PROFILE": "lab"})
    assert (chosen.profile, chosen.chosen_by) == ("prod", "--profile")
    none = profiles.resolve("", {}, base)  # --profile '': none, not even the default
    assert none.profile is None and none.exports() == {}
    with pytest.raises(profiles.ProfileError, match=r"no profile 'qa' in .*profiles: prod, lab"):
        profiles.resolve(None, {}, base | {"OFFERBUS_PROFILE": "qa"})


def test_without_a_file_nothing_applies_unless_a_profile_is_asked_for(tmp_path: Path) -> None:
    home = {"HOME": str(tmp_path / "nobody")}
    res = profiles.resolve(None, {}, home)
    assert res.profile is None and res.exports() == {}
    assert res.values["run_dir"] == (client.RUN_DIR_DEFAULT, "default")
    with pytest.raises(profiles.ProfileError, match=r"no CLI config file at .*profile 'prod'"):
        profiles.resolve("prod", {}, home)
    with pytest.raises(profiles.ProfileError, match=r"no CLI config file at .*OFFERBUS_CLI_"):
        profiles.resolve(None, {}, {"OFFERBUS_CLI_CONFIG": str(tmp_path / "gone.toml")})


def test_flags_then_environment_then_profile_then_defaults(tmp_path: Path, keys: Path) -> None:
    path = write(tmp_path, GOOD)
    environ = {"OFFERBUS_CLI_CONFIG": str(path)}
    res = profiles.resolve(None, {}, environ)
    assert {name: source for name, (_, source) in res.values.items()} == {
        "cluster": "profile prod", "master": "profile prod", "key": "profile prod",
        "server_key": "profile prod", "token": "profile prod", "token_file": "default",
        "run_dir": "profile prod"}
    environ |= {"OFFERBUS_CLUSTER": "zk://env:2181/x", "OFFERBUS_RUN_DIR": "/env/run",
                "OFFERBUS_HTTP_TOKEN_FILE": "/env/token"}
    res = profiles.resolve(None, {}, environ)
    assert res.values["cluster"] == ("zk://env:2181/x", "OFFERBUS_CLUSTER")
    assert res.values["run_dir"] == ("/env/run", "OFFERBUS_RUN_DIR")
    # one token variable overrides the profile's token, whichever form each has
    assert res.values["token"] == (None, "default")
    assert res.values["token_file"] == ("/env/token", "OFFERBUS_HTTP_TOKEN_FILE")
    assert "OFFERBUS_HTTP_TOKEN" not in res.exports()
    res = profiles.resolve(None, {"cluster": "file:///flag", "run_dir": "/flag/run"}, environ)
    assert res.values["cluster"] == ("file:///flag", "--cluster")
    assert res.values["run_dir"] == ("/flag/run", "--run-dir")
    assert res.exports() == {"OFFERBUS_MASTER": "10.0.0.1:5050",
                             profiles.SECRET_ENV: str(keys / "ops.key_secret"),
                             profiles.SERVER_ENV: str(keys / "server.key")}


@pytest.mark.parametrize("argv", [
    ["status"], ["tasks", "--all"], ["agents"], ["roles"], ["kill", "t1"], ["logs", "t1"],
    ["why", "web"], ["trace", "task", "t1"], ["run", "--name", "web", "--image", "x"],
    ["job", "plan", "web.toml"], ["scale", "web", "2"], ["stop", "web"], ["down"],
])
def test_every_command_gets_the_profile_at_start(env: pytest.MonkeyPatch, tmp_path: Path,
                                                 keys: Path, argv: list[str]) -> None:
    env.setenv("OFFERBUS_CLI_CONFIG", str(write(tmp_path, GOOD)))
    args = cli_main.parser().parse_args(argv)
    profiles.start(args, os.environ)
    assert os.environ["OFFERBUS_CLUSTER"] == "zk://10.0.0.1:2181,10.0.0.2:2181/offerbus"
    assert os.environ["OFFERBUS_MASTER"] == "10.0.0.1:5050"
    assert os.environ["OFFERBUS_HTTP_TOKEN"] == TOKEN
    assert args.run_dir == tmp_path / "cfg" / "runs/prod"
    # what the commands read today sees the profile
    assert client.cluster_url(args.cluster, args.run_dir) == os.environ["OFFERBUS_CLUSTER"]
    assert client.http_headers() == {"Authorization": f"Bearer {TOKEN}"}
    curve = client_from_env()
    assert curve is not None and curve.keys.public == (keys / "ops.key").read_text().split(
        '"')[1].encode()


def test_local_commands_take_no_profile(env: pytest.MonkeyPatch, tmp_path: Path,
                                        keys: Path) -> None:
    env.setenv("OFFERBUS_CLI_CONFIG", str(write(tmp_path, GOOD)))
    args = cli_main.parser().parse_args(["up"])
    assert profiles.start(args, os.environ) is None
    assert "OFFERBUS_CLUSTER" not in os.environ and profiles.SECRET_ENV not in os.environ
    assert args.run_dir == Path(client.RUN_DIR_DEFAULT)
    with pytest.raises(profiles.ProfileError, match="`offerbus up` takes no --profile"):
        profiles.start(cli_main.parser().parse_args(["--profile", "prod", "up"]), os.environ)


def test_a_command_reaches_the_profiles_cluster_with_its_token(
        env: pytest.MonkeyPatch, tmp_path: Path, keys: Path, capsys: Any) -> None:
    """main() end to end, the master's answer faked at the seam every command uses."""
    env.setenv("OFFERBUS_CLI_CONFIG", str(write(tmp_path, GOOD)))
    seen: list[tuple[str, dict[str, str]]] = []

    def fake_state(url: str, timeout: float, query: str = "") -> Any:
        seen.append((url, client.http_headers()))
        return None, {"tasks": [], "frameworks": [], "agents": []}
    env.setattr(cli_main, "master_state", fake_state)
    assert cli_main.main(["tasks", "--json"]) == 0
    assert seen == [("zk://10.0.0.1:2181,10.0.0.2:2181/offerbus",
                     {"Authorization": f"Bearer {TOKEN}"})]
    # the flag wins over the profile
    assert cli_main.main(["--cluster", "file:///elsewhere", "tasks", "--json"]) == 0
    assert seen[-1][0] == "file:///elsewhere"
    # a bad profile stops every command with a clear message, before it reaches anything
    assert cli_main.main(["--profile", "qa", "tasks"]) == 1
    assert len(seen) == 2
    assert "no profile 'qa'" in capsys.readouterr().out


def test_config_profiles_shows_sources_and_never_a_secret(
        env: pytest.MonkeyPatch, tmp_path: Path, keys: Path, capsys: Any) -> None:
    path = write(tmp_path, GOOD)
    (path.parent / "lab.token").write_text(TOKEN)
    env.setenv("OFFERBUS_CLI_CONFIG", str(path))
    env.setenv("OFFERBUS_CLUSTER", "zk://env:2181/x")
    assert cli_main.main(["--run-dir", "/flag/run", "config", "profiles"]) == 0
    out = capsys.readouterr().out
    assert TOKEN not in out
    assert " * prod  (default)" in out and "   lab" in out
    assert "active profile: prod (chosen by default in" in out
    lines = {line.split()[0]: line for line in out.splitlines() if line.startswith("  ")}
    assert lines["cluster"].endswith("zk://env:2181/x  [OFFERBUS_CLUSTER]")
    assert lines["token"].endswith("(set, not shown)  [profile prod]")
    assert lines["run_dir"].endswith("/flag/run  [--run-dir]")
    assert lines["token_file"].endswith("unset  [default]")
    env.setenv("OFFERBUS_HTTP_TOKEN", ENV_TOKEN)
    assert cli_main.main(["--profile", "lab", "config", "profiles", "--json"]) == 0
    text = capsys.readouterr().out
    assert TOKEN not in text and ENV_TOKEN not in text
    doc = json.loads(text)
    assert doc["active"] == "lab" and doc["chosen_by"] == "--profile"
    assert doc["settings"]["token"] == {"value": "(set, not shown)",
                                        "from": "OFFERBUS_HTTP_TOKEN"}
    assert doc["settings"]["token_file"] == {"value": None, "from": "default"}
    assert doc["profiles"]["prod"]["token"] == "(set, not shown)"
    # config profiles itself never changes the environment
    assert "OFFERBUS_MASTER" not in os.environ
