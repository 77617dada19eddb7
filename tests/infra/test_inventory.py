"""The inventory: the example fleet renders configurations the services' own loader accepts,
one zoo.cfg whose servers are the inventory's ZooKeeper hosts and a myid each, units under
the prefix; bad inventories are refused with a clear error; the rollout's --dry-run prints
every command and file and runs nothing (no host is contacted in these tests). CURVE is on by
default: every service keyed, the ACL rendered from the principals, each host given only its
keys, generated once and never overwritten, and no secret ever printed."""

from __future__ import annotations

import contextlib
import io
import re
import shlex
import subprocess
import tomllib
from pathlib import Path

import pytest

from infra import inventory, rollout
from services.bus.curve import KeyPair
from services.cli import config_cmd
from services.master.acl import ACTIONS, Acl

EXAMPLE = Path(inventory.__file__).with_name("inventory.example.toml")

SMALL = """
[cluster]
ssh_user = "admin"
[services.master]
http_port = 8080
{hosts}
"""
HOSTS = [("zk-1", "10.9.0.1", ["zookeeper", "master", "allocator", "broker"]),
         ("agent-1", "10.9.0.2", ["agent"])]


def small(hosts: list[tuple[str, str, list[str]]] = HOSTS, extra: str = "") -> str:
    text = "".join(f'\n[[host]]\nname = "{n}"\naddress = "{a}"\nroles = {r!r}\n'.replace(
        "'", '"') for n, a, r in hosts)
    return SMALL.format(hosts=text) + extra


def test_the_example_fleet_has_the_documented_layout() -> None:
    inv = inventory.load(str(EXAMPLE))
    counts = {role: len(inv.with_role(role)) for role in inventory.ROLES}
    assert counts == {"zookeeper": 3, "master": 3, "allocator": 2, "broker": 2, "jobs": 2,
                      "agent": 4}


def test_every_rendered_config_loads_with_the_services_loader(tmp_path: Path) -> None:
    inv = inventory.load(str(EXAMPLE))
    assert inventory.check_configs(inv) == []
    for host in inv.hosts:
        roles = [r for r in host.roles if r in inventory.SERVICE_ROLES]
        if not roles:
            continue
        path = tmp_path / f"{host.name}.toml"
        path.write_text(inventory.service_config(inv, host))
        lines, errors = config_cmd.check(str(path), roles, {})
        assert errors == []
        text = "\n".join(lines)
        assert f'host = "{host.address}"' in text
        assert f'cluster = "{inv.cluster_url()}"' in text
        assert [line[1:-1] for line in lines if line.startswith("[")] == roles
    agent = inv.with_role("agent")[2]
    doc = tomllib.loads(inventory.service_config(inv, agent))
    assert doc["agent"]["resources"].startswith("cpus:16")  # the host's own options
    assert doc["agent"]["http_port"] == 8083  # and [services.agent]


def test_a_config_the_loader_refuses_is_reported_per_host() -> None:
    inv = inventory.parse(small(extra='\n[services.broker]\noffer_timeout = -1\n'
                                      'no_such_option = 3\n'))
    errors = inventory.check_configs(inv)
    assert len(errors) == 1 and errors[0].startswith("host zk-1: [broker]")
    assert "no_such_option" in errors[0] and inventory.CONFIG_PATH in errors[0]


def test_zoo_cfg_lists_the_inventorys_zookeeper_hosts_and_each_has_its_myid() -> None:
    inv = inventory.load(str(EXAMPLE))
    zk = inv.with_role("zookeeper")
    cfg = inventory.zoo_cfg(inv)
    servers = dict(re.findall(r"^server\.(\d+)=(\S+)$", cfg, re.MULTILINE))
    assert servers == {str(i): f"{h.address}:2888:3888" for i, h in enumerate(zk, start=1)}
    assert "clientPort=2181" in cfg.splitlines()
    assert inv.cluster_url() == f"zk://{','.join(h.address + ':2181' for h in zk)}/offerbus"
    for myid, host in enumerate(zk, start=1):
        files = {f.path: f.content for f in inventory.files_for(inv, host)}
        assert files[f"{inventory.ZK_DATA_DIR}/myid"] == f"{myid}\n"
        assert files[f"{inventory.ZK_CONF_DIR}/zoo.cfg"] == cfg
        assert inventory.CONFIG_PATH not in files  # ZooKeeper only: no services config


def test_units_are_rendered_under_the_inventorys_prefix() -> None:
    inv = inventory.parse(small(extra="").replace("[cluster]", '[cluster]\nprefix = "/srv/ob"'))
    files = {f.path: f.content for f in inventory.files_for(inv, inv.hosts[1])}
    unit = files["/etc/systemd/system/offerbus-agent.service"]
    assert "ExecStart=/srv/ob/venv/bin/python -m services.agent" in unit
    assert "/opt/offerbus/" not in unit


@pytest.mark.parametrize(("text", "message"), [
    (small([("a", "10.9.0.1", ["zookeeper", "master", "allocator", "broker"]),
            ("b", "10.9.0.1", ["agent"])]), "duplicate address '10.9.0.1'"),
    (small([("a", "10.9.0.1", ["zookeeper", "master", "allocator", "broker"]),
            ("a", "10.9.0.2", ["agent"])]), "duplicate name 'a'"),
    (small([*HOSTS, ("zk-2", "10.9.0.3", ["zookeeper"])]),
     "2 ZooKeeper hosts: an ensemble needs an odd number"),
    (small([("zk-1", "10.9.0.1", ["zookeeper", "master", "allocator"]),
            ("agent-1", "10.9.0.2", ["agent"])]), "no host has the role(s) broker"),
    (small([("zk-1", "10.9.0.1", ["zookeeper", "master", "allocator", "broker", "cook"])]),
     "each must be one of"),
    (small(extra="\n[cluster2]\nx = 1\n"), "unknown key(s) cluster2"),
    (small().replace("[cluster]", "[cluster]\nssh_usr = \"x\""), "unknown key(s) ssh_usr"),
    (small().replace('name = "agent-1"', 'name = "agent-1"\nport = 3'),
     "host 'agent-1': unknown key(s) port"),
    (small().replace('"10.9.0.2"', '"0.0.0.0"'), "is not an address others can reach"),
    (small(extra="\n[services.frontend]\nx = 1\n"), "[services.frontend]: not a service"),
    (small().replace('roles = ["agent"]', 'roles = ["agent"]\n[host.master]\nport = 1'),
     "options for master but it has no master role"),
    ("[cluster]\n", "no [[host]] entries"),
    ("[cluster\n", "not valid TOML"),
])
def test_bad_inventories_are_refused(text: str, message: str) -> None:
    with pytest.raises(inventory.InventoryError) as caught:
        inventory.parse(text, "fleet.toml")
    assert message in str(caught.value) and str(caught.value).startswith("fleet.toml")


def _run(argv: list[str]) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = rollout.main(argv)
    return code, out.getvalue(), err.getvalue()


def test_dry_run_prints_every_command_and_file_and_runs_nothing(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    def refuse(*args: object, **kwargs: object) -> None:
        raise AssertionError(f"a dry run ran {args}")
    monkeypatch.setattr(rollout.subprocess, "run", refuse)
    keys = tmp_path / "keys"
    code, out, _ = _run([str(EXAMPLE), "--dry-run", "--keys", str(keys)])
    assert code == 0
    assert not keys.exists()  # a dry run generates nothing either
    inv = inventory.load(str(EXAMPLE))
    assert f"# [local] generate the key pairs {', '.join(inventory.key_names(inv))} in " \
        f"{keys}\n" in out
    for host in inv.hosts:
        for f in inventory.files_for(inv, host):
            if f.key:
                assert re.search(rf"{re.escape(f.path)}\S* < {re.escape(str(keys / f.key))}$",
                                 out, re.MULTILINE), f.path
            else:
                assert f.content in out
        assert out.count(f"# [{host.name}] write ") == len(inventory.files_for(inv, host))
        assert f"# [{host.name}] the source tree\nrsync " in out
    starts = re.findall(r"^# \[(\S+)\] start \(or restart\) (\w+)$", out, re.MULTILINE)
    assert [role for _, role in starts] == [r for r in inventory.ROLES
                                            for _ in inv.with_role(r)]  # ZooKeeper first
    assert "systemctl enable offerbus-agent.service" in out
    # the services run the tree itself, data files included (a wheel lacks master/static/)
    assert "/opt/offerbus/venv/bin/pip install --quiet --editable /opt/offerbus/src" in out
    assert "ops@10.0.3.4" in out and "admin@10.0.3.3" in out


def test_only_one_role(tmp_path: Path) -> None:
    code, out, _ = _run([str(EXAMPLE), "--dry-run", "--only", "agent", "--keys", str(tmp_path)])
    assert code == 0
    hosts = set(re.findall(r"^# \[(\S+)\]", out, re.MULTILINE))
    assert hosts == {"local", *(f"agent-{i}" for i in range(1, 5))}  # local: keys generated
    assert "start (or restart) master" not in out


def test_only_some_hosts(tmp_path: Path) -> None:
    code, out, _ = _run([str(EXAMPLE), "--dry-run", "--only", "master", "--host", "master-2",
                         "--host", "master-3", "--keys", str(tmp_path)])
    assert code == 0
    assert set(re.findall(r"^# \[(\S+)\]", out, re.MULTILINE)) == {"local", "master-2", "master-3"}
    code, out, err = _run([str(EXAMPLE), "--dry-run", "--host", "master-9", "--keys",
                           str(tmp_path)])
    assert code == 2 and out == "" and "--host master-9: not in" in err


def test_rollout_runs_the_plan_in_order_and_stops_at_a_failure(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """The shell around the plan (ssh and rsync replaced: no host is contacted)."""
    ran: list[tuple[str, ...]] = []

    class Done:
        def __init__(self, code: int) -> None:
            self.returncode = code

    def fake(argv: tuple[str, ...], **kwargs: object) -> Done:
        ran.append(argv)
        return Done(1 if len(ran) == 3 else 0)
    monkeypatch.setattr(rollout.subprocess, "run", fake)
    fleet = tmp_path / "fleet.toml"
    fleet.write_text(small())
    code, _, err = _run([str(fleet), "--keys", str(tmp_path / "keys")])
    plan = inventory.plan(inventory.load(str(fleet)), str(rollout.REPO))
    assert code == 1 and ran == [s.argv for s in plan[:3]]
    assert "step 3 failed on zk-1" in err


def test_a_bad_inventory_stops_the_rollout_before_any_command(tmp_path: Path) -> None:
    fleet = tmp_path / "fleet.toml"
    fleet.write_text(small([*HOSTS, ("zk-2", "10.9.0.3", ["zookeeper"])]))
    code, out, err = _run([str(fleet), "--dry-run"])
    assert code == 2 and out == "" and "odd number" in err


def test_every_remote_script_is_valid_sh() -> None:
    """The commands each ssh step runs on a host parse as POSIX sh (quoting survives)."""
    inv = inventory.load(str(EXAMPLE))
    scripts = 0
    for step in inventory.plan(inv, str(rollout.REPO)):
        if step.argv[0] != "ssh":
            assert step.argv[0] == "rsync" and step.argv[-1].startswith(
                f"{'ops' if step.host == 'agent-4' else 'admin'}@")
            continue
        words = shlex.split(step.argv[-1])
        assert words[:3] == ["sudo", "sh", "-euc"] and len(words) == 4
        done = subprocess.run(["sh", "-n", "-c", words[3]], capture_output=True, text=True,
                              check=False)
        assert done.returncode == 0, (words[3], done.stderr)
        scripts += 1
    assert scripts > 2 * len(inv.hosts)


KEYED_OPTIONS = {"curve_secret_key_file", "curve_server_key_file"}


def test_every_service_is_keyed_by_default_and_its_config_checks() -> None:
    inv = inventory.load(str(EXAMPLE))
    assert inv.curve and inventory.check_configs(inv) == []
    keys = inventory.KEYS_DIR
    for host in inv.hosts:
        doc = tomllib.loads(inventory.service_config(inv, host)) if any(
            r in inventory.SERVICE_ROLES for r in host.roles) else {}
        for role in (r for r in host.roles if r in inventory.SERVICE_ROLES):
            table = doc[role]
            server = role in ("master", "broker")
            assert table["curve_secret_key_file"] == (
                f"{keys}/server.key_secret" if server else f"{keys}/{host.name}.key_secret")
            assert table["curve_server_key_file"] == f"{keys}/server.key"
            assert table.get("curve_allowed_dir") == (f"{keys}/allowed" if server else None)
            assert table.get("acl_file") == (
                inventory.ACL_PATH if role == "master" else None)


def test_each_host_gets_only_the_keys_it_needs() -> None:
    inv = inventory.load(str(EXAMPLE))
    by_name = {h.name: h for h in inv.hosts}

    def keys(name: str) -> dict[str, tuple[str, str, str]]:
        return {f.key: (f.path, f.mode, f.owner) for f in inventory.files_for(inv, by_name[name])
                if f.key}
    assert keys("zk-1") == {}
    k = inventory.KEYS_DIR
    assert keys("agent-1") == {"server.key": (f"{k}/server.key", "0644", "root"),
                               "agent-1.key_secret": (f"{k}/agent-1.key_secret", "0600",
                                                      inventory.USER)}
    master = keys("master-1")
    assert {n for n in master if n.endswith("_secret")} == {"server.key_secret"}
    allowed = {n for n, (path, _, _) in master.items() if "/allowed/" in path}
    assert allowed == {f"{n}.key" for n in ("server", "sched-1", "sched-2", "agent-1",
                                            "agent-2", "agent-3", "agent-4", "ops",
                                            "analytics")}
    sched = keys("sched-1")  # a broker (server key, allowed keys) and an allocator (its own)
    assert {n for n in sched if n.endswith("_secret")} == {"server.key_secret",
                                                            "sched-1.key_secret"}


def test_the_acl_file_renders_the_principals() -> None:
    inv = inventory.load(str(EXAMPLE))
    files = {f.path: f for f in inventory.files_for(inv, inv.with_role("master")[0])}
    acl_file = files[inventory.ACL_PATH]
    assert (acl_file.mode, acl_file.group) == ("0640", inventory.USER)
    acl = Acl.parse(tomllib.loads(acl_file.content))
    assert acl.may("ops", "kill_task") and acl.may_use_role("ops", "*")
    assert acl.may_use_role("analytics", "eng/batch") and not acl.may("analytics", "kill_task")
    assert not acl.may_use_role("analytics", "web")
    assert acl.may_act_as_agent("agent-3") and not acl.may_act_as_agent("sched-1")
    assert not acl.may_act_as_agent("ops")
    assert inventory.ACL_PATH not in {f.path for h in inv.with_role("broker")
                                      for f in inventory.files_for(inv, h)}


@pytest.mark.parametrize(("extra", "message"), [
    ('\n[[principal]]\nname = "agent-1"\nroles = ["*"]\n', "principal 'agent-1': the name"),
    ('\n[[principal]]\nname = "server"\n', "principal 'server': the name"),
    ('\n[[principal]]\nname = "ops"\nactions = ["launch_rockets"]\n',
     "unknown action(s) launch_rockets"),
    ('\n[[principal]]\nname = "ops"\nroles = ["/bad"]\n', "principals.ops.roles"),
    ('\n[[principal]]\nname = "ops"\nsudo = true\n', "unknown key(s) sudo"),
    ('\n[[principal]]\nname = "../ops"\n', "key name '../ops'"),
])
def test_bad_principals_are_refused(extra: str, message: str) -> None:
    with pytest.raises(inventory.InventoryError) as caught:
        inventory.parse(small(extra=extra), "fleet.toml")
    assert message in str(caught.value)


def test_an_inventory_may_opt_out_of_curve_with_a_warning(tmp_path: Path) -> None:
    fleet = tmp_path / "fleet.toml"
    fleet.write_text("curve = false\n" + small())
    inv = inventory.load(str(fleet))
    assert inventory.check_configs(inv) == [] and inventory.key_names(inv) == []
    for host in inv.hosts:
        for f in inventory.files_for(inv, host):
            assert not f.key and "curve_" not in f.content and "acl_file" not in f.content
            assert f.path != inventory.ACL_PATH
    code, out, _ = _run([str(fleet), "--dry-run"])  # no --keys needed
    assert code == 0 and "WARNING: " in out and "curve = false" in out
    assert "/etc/offerbus/keys" not in out
    with pytest.raises(inventory.InventoryError, match="need CURVE"):
        inventory.parse("curve = false\n" + small(extra='\n[[principal]]\nname = "ops"\n'))


def test_a_keyed_inventory_needs_the_keys_dir(tmp_path: Path) -> None:
    fleet = tmp_path / "fleet.toml"
    fleet.write_text(small())
    code, out, err = _run([str(fleet), "--dry-run"])
    assert code == 2 and out == "" and "give --keys DIR" in err


def test_the_inventorys_own_curve_options_win() -> None:
    text = small().replace("[services.master]", '[services]\ncurve_server_key_file = '
                           '"/srv/k/server.key"\n[services.master]')
    inv = inventory.parse(text.replace('roles = ["agent"]', 'roles = ["agent"]\n[host.agent]\n'
                                       'curve_secret_key_file = "/srv/k/a.key_secret"'))
    doc = tomllib.loads(inventory.service_config(inv, inv.hosts[1]))
    assert doc["curve_server_key_file"] == "/srv/k/server.key"
    assert "curve_server_key_file" not in doc["agent"]
    assert doc["agent"]["curve_secret_key_file"] == "/srv/k/a.key_secret"


def _secrets(keys: Path) -> dict[str, bytes]:
    return {p.name: KeyPair.load(p).secret for p in sorted(keys.glob("*.key_secret"))}


def test_the_dry_run_never_prints_a_secret_key(tmp_path: Path) -> None:
    keys = tmp_path / "keys"
    inv = inventory.load(str(EXAMPLE))
    rollout.generate_keys(keys, inventory.key_names(inv))
    code, out, _ = _run([str(EXAMPLE), "--dry-run", "--keys", str(keys)])
    secrets = _secrets(keys)
    assert code == 0 and len(secrets) == len(inventory.key_names(inv))
    for secret in secrets.values():
        assert secret.decode() not in out
    assert "secret-key" not in out and "generate the key pairs" not in out


def test_keys_are_generated_once_never_overwritten_and_sent_to_their_hosts(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    sent: list[tuple[tuple[str, ...], str | None]] = []

    class Done:
        returncode = 0

    def fake(argv: tuple[str, ...], input: str | None = None, **kwargs: object) -> Done:
        sent.append((argv, input))
        return Done()
    monkeypatch.setattr(rollout.subprocess, "run", fake)
    fleet, keys = tmp_path / "fleet.toml", tmp_path / "keys"
    fleet.write_text(small(extra='\n[[principal]]\nname = "ops"\nroles = ["*"]\n'))
    code, out, _ = _run([str(fleet), "--keys", str(keys)])
    assert code == 0 and "generate the key pairs server, zk-1, agent-1, ops in" in out
    first = _secrets(keys)
    assert set(first) == {f"{n}.key_secret" for n in ("server", "zk-1", "agent-1", "ops")}
    assert all((keys / n).stat().st_mode & 0o077 == 0 for n in first)
    # the agent host gets its own secret, installed 0600 for the services' user, and no other
    installs = {argv[-1].split()[-1].rstrip("'"): text for argv, text in sent
                if argv[-2].endswith("10.9.0.2") and "key_secret" in argv[-1]}
    assert list(installs) == [f"{inventory.KEYS_DIR}/agent-1.key_secret"]
    assert installs[f"{inventory.KEYS_DIR}/agent-1.key_secret"] == (
        keys / "agent-1.key_secret").read_text()
    sent.clear()
    code, out, _ = _run([str(fleet), "--keys", str(keys)])
    assert code == 0 and "generate" not in out and _secrets(keys) == first  # kept as they were
    (keys / "ops.key").unlink()  # half a pair is refused, not replaced
    code, _, err = _run([str(fleet), "--keys", str(keys)])
    assert code == 2 and "ops.key and ops.key_secret must both be there" in err
    assert _secrets(keys) == first


def _jobs_fleet(extra: str = "") -> inventory.Inventory:
    """The small fleet with a job runner on its own host and on the agent host."""
    return inventory.parse(small([*HOSTS[:1], ("agent-1", "10.9.0.2", ["agent", "jobs"]),
                                  ("runner-1", "10.9.0.3", ["jobs"])], extra), "fleet.toml")


def test_the_job_runner_is_rendered_like_the_other_services(tmp_path: Path) -> None:
    inv = _jobs_fleet(extra="\n[services.jobs]\nhttp_port = 8084\nfailover_timeout = 60.0\n")
    assert inventory.check_configs(inv) == []
    by_name = {h.name: h for h in inv.hosts}
    assert by_name["agent-1"].roles == ("jobs", "agent")  # the start order
    for name, ident in (("agent-1", "jobs-agent-1"), ("runner-1", "jobs-runner-1")):
        doc = tomllib.loads(inventory.service_config(inv, by_name[name]))
        assert doc["jobs"] == {
            "id": ident, "curve_secret_key_file": f"{inventory.KEYS_DIR}/{name}.key_secret",
            "curve_server_key_file": f"{inventory.KEYS_DIR}/server.key",
            "http_port": 8084, "failover_timeout": 60.0}
        path = tmp_path / f"{name}.toml"
        path.write_text(inventory.service_config(inv, by_name[name]))
        lines, errors = config_cmd.check(str(path), ["jobs"], {})  # the runner's own options
        assert errors == [] and f'id = "{ident}"' in "\n".join(lines)
    bad = _jobs_fleet(extra="\n[services.jobs]\nfailover_timeout = -1\n")
    errors = inventory.check_configs(bad)
    assert len(errors) == 2 and all("failover_timeout" in e for e in errors)


def test_a_job_runner_host_gets_its_host_key_and_the_masters_admit_it() -> None:
    inv = _jobs_fleet()
    assert inventory.key_names(inv) == ["server", "zk-1", "agent-1", "runner-1"]
    runner = inv.hosts[2]
    keys = {f.key: (f.path, f.mode, f.owner) for f in inventory.files_for(inv, runner) if f.key}
    k = inventory.KEYS_DIR
    assert keys == {"server.key": (f"{k}/server.key", "0644", "root"),
                    "runner-1.key_secret": (f"{k}/runner-1.key_secret", "0600", inventory.USER)}
    allowed = {f.key for f in inventory.files_for(inv, inv.hosts[0]) if "/allowed/" in f.path}
    assert "runner-1.key" in allowed
    files = {f.path: f.content for f in inventory.files_for(inv, runner)}
    assert "/etc/systemd/system/offerbus-jobs.service" in files
    assert "-m frameworks.jobrunner --config" in files["/etc/systemd/system/offerbus-jobs.service"]
    assert inventory.CONFIG_PATH in files and inventory.ACL_PATH not in files


def test_the_acl_lets_each_job_runner_use_every_role_and_no_operator_action() -> None:
    """Every role a job can be submitted in (a role of a principal with submit_job): "*" is
    the default role in the ACL, not "any", so the runner is given each such role."""
    inv = _jobs_fleet(extra='\n[[principal]]\nname = "dev"\nroles = ["eng"]\n'
                            'actions = ["submit_job", "remove_job"]\n'
                            '\n[[principal]]\nname = "ops"\nroles = ["*", "web"]\n'
                            'actions = ["submit_job", "kill_task"]\n'
                            '\n[[principal]]\nname = "viewer"\nroles = ["secret"]\n')
    text = inventory.acl_file(inv)
    acl = Acl.parse(tomllib.loads(text))
    for runner in ("agent-1", "runner-1"):
        for role in ("*", "web", "eng", "eng/batch"):
            assert acl.may_use_role(runner, role), (runner, role)
        assert not acl.may_use_role(runner, "secret")  # nobody may submit a job there
        assert not any(acl.may(runner, action) for action in sorted(ACTIONS))
    assert not acl.may_act_as_agent("runner-1") and acl.may_act_as_agent("agent-1")
    assert acl.may("dev", "submit_job") and not acl.may_use_role("dev", "web")
    assert not acl.may_use_role("zk-1", "*")  # the allocator's key alone: no role
    assert "job runner" in text  # the rendered file says why
    # a fleet without job runners renders no such entry
    plain = inventory.parse(small(extra='\n[[principal]]\nname = "ops"\nroles = ["*"]\n'
                                        'actions = ["submit_job"]\n'))
    assert inventory.jobs_principals(plain) == []
    assert not Acl.parse(tomllib.loads(inventory.acl_file(plain))).may_use_role("agent-1", "*")


def test_a_runner_key_named_like_a_principal_is_refused() -> None:
    with pytest.raises(inventory.InventoryError, match="principal 'runner-1': the name"):
        _jobs_fleet(extra='\n[[principal]]\nname = "runner-1"\nroles = ["*"]\n')


def test_a_fleet_without_a_job_runner_is_valid_and_the_rollout_starts_the_runners(
        tmp_path: Path) -> None:
    inv = inventory.parse(small())
    assert inv.with_role("jobs") == [] and inventory.check_configs(inv) == []
    assert all("offerbus-jobs" not in s.what + " ".join(s.argv)
               for s in inventory.plan(inv, str(rollout.REPO)))
    with pytest.raises(inventory.InventoryError, match=r"no host has the role\(s\) master"):
        inventory.parse(small([("zk-1", "10.9.0.1", ["zookeeper", "allocator", "broker",
                                                       "jobs"]),
                               ("agent-1", "10.9.0.2", ["agent"])]))
    code, out, _ = _run([str(EXAMPLE), "--dry-run", "--only", "jobs", "--keys", str(tmp_path)])
    assert code == 0
    starts = re.findall(r"^# \[(\S+)\] start \(or restart\) (\w+)$", out, re.MULTILINE)
    assert starts == [("sched-1", "jobs"), ("sched-2", "jobs")]
    assert "systemctl restart offerbus-jobs.service" in out
    assert "config check --service allocator --service broker --service jobs " in out
