"""CURVE on a live cluster (issue 11): every service started with keys (`offerbus keys`
certs, the kit's curve_* options from OFFERBUS_<SERVICE>_CURVE_* variables); the master and
the offer-broker admit only the keys in their allowed directory. An agent, a framework or an
operator whose key is not there never gets through the handshake: the agent never registers,
the framework gets no offers, the operator's kill is never acted on; each refusal is counted
(`curve_refused`), and the cluster goes on serving the peers it knows."""

from __future__ import annotations

import shutil
import subprocess
import sys
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from frameworks.sdk.driver import SchedulerDriver
from infra.zookeeper import ZooKeeperServer
from schemas import common_pb2
from services.bus.curve import CurveClient, KeyPair, load_public_key
from services.cli import cluster as local_cluster
from services.cli.keys import generate
from tests.e2e import Cluster, Recorder, framework, local_cluster_in, sleep_task
from tests.waiting import wait_for

# allowed; agent-2 is an agent's key that never registered an agent
KNOWN = ("server", "allocator", "agent", "agent-2", "framework", "operator", "viewer", "jobs")
# The master's ACL (services/master/acl.py): principals are the allowed keys' names.
ACL = """
agents = ["agent", "agent-2"]
[principals.framework]
roles = ["*", "web"]
[principals.operator]
operator = ["kill_task", "submit_job", "remove_job"]
roles = ["web"]
[principals.jobs]
roles = ["web"]
[principals.viewer]
operator = ["get_logs"]
"""
ROGUE = ("rogue-agent", "rogue-framework", "rogue-operator")  # generated, never allowed


@dataclass
class Keyed:
    cluster: Cluster
    keys: Path

    def client(self, name: str) -> CurveClient:
        return CurveClient(KeyPair.load(self.keys / f"{name}.key_secret"),
                           load_public_key(self.keys / "server.key"))

    def env(self, name: str) -> dict[str, str]:
        """What the CLI needs to call the master as `name`."""
        return {"OFFERBUS_CURVE_SECRET_KEY_FILE": str(self.keys / f"{name}.key_secret"),
                "OFFERBUS_CURVE_SERVER_KEY_FILE": str(self.keys / "server.key")}


def refused(cluster: Cluster, role: str = "master") -> float:
    url = cluster.leader(role).endpoints["http"] + "/metrics"
    with urllib.request.urlopen(url, timeout=5) as resp:
        for line in resp.read().decode().splitlines():
            if line.startswith(f"offerbus_{role}_curve_refused_total"):
                return float(line.split()[-1])
    raise AssertionError("no curve_refused counter in /metrics")


def notices(cluster: Cluster, kind: str) -> float:
    url = cluster.leader().endpoints["http"] + "/metrics"
    with urllib.request.urlopen(url, timeout=5) as resp:
        return sum(float(line.split()[-1]) for line in resp.read().decode().splitlines()
                   if line.startswith("offerbus_master_notices_total")
                   and f'kind="{kind}"' in line)


def cli(keyed: Keyed, *args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    c = keyed.cluster
    return subprocess.run([sys.executable, "-m", "services.cli", "--cluster", c.url,
                           "--run-dir", str(c.run_dir), "--timeout", "3", *args],
                          capture_output=True, text=True, timeout=60,
                          env={"COLUMNS": "250", "PATH": "/usr/bin:/bin", **env})


@pytest.fixture(scope="module")
def keyed(zk: ZooKeeperServer, zk_admin: Any,
          tmp_path_factory: pytest.TempPathFactory) -> Iterator[Keyed]:
    root = tmp_path_factory.mktemp("curve")
    keys, allowed = root / "keys", root / "allowed"
    allowed.mkdir()
    for name in KNOWN + ROGUE:
        generate(keys, name)
    for name in KNOWN:
        shutil.copy(keys / f"{name}.key", allowed)
    (root / "acl.toml").write_text(ACL)
    env = {"OFFERBUS_CURVE_SERVER_KEY_FILE": str(keys / "server.key"),
           "OFFERBUS_MASTER_ACL_FILE": str(root / "acl.toml")}
    for service, key in (("master", "server"), ("broker", "server"),
                         ("allocator", "allocator"), ("agent", "agent"), ("jobs", "jobs")):
        env[f"OFFERBUS_{service.upper()}_CURVE_SECRET_KEY_FILE"] = str(keys / f"{key}.key_secret")
        env[f"OFFERBUS_{service.upper()}_CURVE_ALLOWED_DIR"] = str(allowed)
    with pytest.MonkeyPatch.context() as mp:
        for name, value in env.items():
            mp.setenv(name, value)  # the services `up` starts inherit them
        with local_cluster_in(zk, zk_admin, root / "run", "curve", agents=1,
                              runtime="process",
                              agent_resources="cpus:2;mem:1024;disk:1024;ports:[46300-46319]"
                              ) as c:
            yield Keyed(c, keys)


def test_an_agent_with_a_known_key_registers(keyed: Keyed) -> None:
    [agent] = keyed.cluster.state()["agents"]
    assert agent["status"] == "AGENT_STATUS_REGISTERED"
    assert agent["agent_info"]["hostname"] == "agent-1"


def test_an_agent_with_an_unknown_key_never_registers_and_is_counted(keyed: Keyed) -> None:
    c = keyed.cluster
    before = refused(c)
    local_cluster.spawn(c.run_dir, "agent-rogue", [
        "-m", "services.agent", "--cluster", c.url, "--work-dir",
        str(c.run_dir / "agents" / "agent-rogue"), "--hostname", "agent-rogue",
        "--resources", "cpus:1;mem:512;disk:512", "--runtime", "process"],
        env={"OFFERBUS_AGENT_CURVE_SECRET_KEY_FILE": str(keyed.keys / "rogue-agent.key_secret")})
    # It keeps trying (a fresh connection after each silent spell): each try is refused.
    wait_for(lambda: refused(c) >= before + 2, 60,
             message=lambda: f"the rogue agent was not refused twice: {refused(c)} vs {before}")
    assert "agent-rogue" in local_cluster.running(c.run_dir)
    hostnames = [a["agent_info"]["hostname"] for a in c.state()["agents"]]
    assert hostnames == ["agent-1"]


def test_a_framework_with_an_unknown_key_gets_nothing_and_the_cluster_goes_on(
        keyed: Keyed) -> None:
    c = keyed.cluster
    before = refused(c)
    rogue = Recorder()
    rogue_driver = SchedulerDriver(rogue, framework("rogue"), c.url,
                                   curve=keyed.client("rogue-framework"))
    rogue_driver.start()
    placed: list[str] = []

    def on_offers(driver: SchedulerDriver, offers: list[common_pb2.Offer]) -> None:
        if placed:
            driver.decline([o.offer_id for o in offers], refuse_seconds=5.0)
            return
        placed.append("curve-1")
        op = common_pb2.Operation()
        op.launch.tasks.append(sleep_task("curve-1", offers[0], command=["sleep", "600"]))
        driver.accept([offers[0].offer_id], [op])

    good = Recorder(on_offers=on_offers)
    driver = SchedulerDriver(good, framework("framework"), c.url,
                             curve=keyed.client("framework"))
    driver.start()
    try:
        wait_for(lambda: refused(c) > before, 30, message="the rogue framework not refused")
        # The known framework is served meanwhile: subscribed, offered, its task runs.
        wait_for(lambda: good.state_of("curve-1") == common_pb2.TASK_RUNNING, 60,
                 message=lambda: f"the known framework's task never ran: {dict(good.updates)}")
        assert rogue.framework_id == "" and rogue.offers_seen == []
        names = {f["framework_info"]["name"] for f in c.state()["frameworks"]}
        assert "framework" in names and "rogue" not in names

        # An operator without a key, or with an unknown one, is never heard; with the
        # operator's key the kill is done.
        for name in (None, "rogue-operator"):
            before = refused(c)
            out = cli(keyed, "kill", "curve-1", env=keyed.env(name) if name else {})
            said = out.stdout + out.stderr
            assert out.returncode == 1 and "no answer from the master" in said, said
            assert ("OFFERBUS_CURVE_SECRET_KEY_FILE" in said), said
            if name is not None:
                assert refused(c) > before
            assert good.state_of("curve-1") == common_pb2.TASK_RUNNING
        out = cli(keyed, "kill", "curve-1", env=keyed.env("operator"))
        assert out.returncode == 0, out.stdout + out.stderr
        wait_for(lambda: good.state_of("curve-1") == common_pb2.TASK_KILLED, 30,
                 message=lambda: f"the operator's kill was not done: {dict(good.updates)}")
    finally:
        for d in (rogue_driver, driver):
            d.stop(failover=False)
            d.join(10)


def test_the_acl_refuses_a_role_and_an_operator_action_not_given_and_counts_them(
        keyed: Keyed) -> None:
    c = keyed.cluster

    def acl_refused() -> float:
        return notices(c, "acl_refused")

    before = acl_refused()
    rec = Recorder()
    driver = SchedulerDriver(rec, framework("framework", role="eng"), c.url,
                             curve=keyed.client("framework"))
    driver.start()
    try:
        wait_for(lambda: rec.errors, 30, message="the subscription with role eng not refused")
        assert "principal 'framework' may not use role 'eng'" in rec.errors[0]
        assert rec.framework_id == "" and rec.offers_seen == []
    finally:
        driver.stop(failover=False)
        driver.join(10)
    out = cli(keyed, "kill", "no-such-task", "--framework", "f", env=keyed.env("viewer"))
    said = out.stdout + out.stderr
    assert out.returncode == 1 and "principal 'viewer' may not kill_task" in said, said
    out = cli(keyed, "kill", "no-such-task", "--framework", "f", env=keyed.env("operator"))
    said = out.stdout + out.stderr
    assert out.returncode == 1 and "unknown" in said and "may not" not in said, said
    assert acl_refused() >= before + 2
    [agent] = c.state()["agents"]  # the cluster goes on
    assert agent["status"] == "AGENT_STATUS_REGISTERED"


def test_jobs_follow_the_submitters_acl_and_run_under_the_runners_key(keyed: Keyed,
                                                                      tmp_path: Path) -> None:
    """The operator may submit jobs in role web (its ACL), which the job runner (its own
    key, principal `jobs`) runs; a role not given, or a principal without submit_job, is
    refused and counted; only the submitter removes its job."""
    c = keyed.cluster
    job = tmp_path / "job.toml"

    def write(role: str) -> str:
        job.write_text(f'name = "keyed"\nimage = "-"\ncommand = ["sleep", "600"]\n'
                       f'role = "{role}"\ninstances = 1\n[resources]\ncpus = 0.1\n'
                       f'mem = 16\n')
        return str(job)

    before = notices(c, "acl_refused")
    for name, role, why in (("operator", "ops", "principal 'operator' may not use role 'ops'"),
                            ("viewer", "web", "principal 'viewer' may not submit_job")):
        out = cli(keyed, "job", "run", write(role), "--no-wait", env=keyed.env(name))
        said = out.stdout + out.stderr
        assert out.returncode == 1 and why in said, said
    assert notices(c, "acl_refused") >= before + 1  # (the role check is the job's own)
    assert c.state()["jobs"] == []
    out = cli(keyed, "job", "run", write("web"), "--no-wait", env=keyed.env("operator"))
    assert out.returncode == 0, out.stdout + out.stderr
    [record] = c.state()["jobs"]
    assert (record["name"], record["principal"], record["role"]) == ("keyed", "operator", "web")

    def running() -> bool:
        fws = [f for f in c.state()["frameworks"]
               if f["framework_info"].get("labels", {}).get("offerbus.job") == "keyed"]
        return bool(fws) and fws[0]["framework_info"]["principal"] == "jobs" and any(
            t["status"]["state"] == "TASK_RUNNING" for t in c.state()["tasks"]
            if t["framework_id"] == fws[0]["framework_info"]["framework_id"])
    wait_for(running, 60, message="the job never ran under the runner's key")
    out = cli(keyed, "job", "stop", "keyed", env=keyed.env("viewer"))
    assert out.returncode == 1 and "may not remove_job" in out.stdout + out.stderr
    out = cli(keyed, "job", "stop", "keyed", env=keyed.env("operator"))
    assert out.returncode == 0, out.stdout + out.stderr
    assert c.state()["jobs"] == []


def test_an_agent_with_another_allowed_key_cannot_take_over_an_agent_id(keyed: Keyed) -> None:
    """agent-2's key is allowed, but agent-1's id was registered by the `agent` key: an
    agent started with agent-2's key and agent-1's id (its work dir's agent_id) is refused,
    counted, and agent-1 stays as it was."""
    c = keyed.cluster
    [agent] = c.state()["agents"]
    aid = agent["agent_info"]["agent_id"]
    work_dir = c.run_dir / "agents" / "agent-impostor"
    work_dir.mkdir(parents=True)
    for name in ("agent_id", "cluster_id"):  # what agent-1's work dir says it is
        if (c.run_dir / "agents" / "agent-1" / name).exists():
            shutil.copy(c.run_dir / "agents" / "agent-1" / name, work_dir)
    assert (work_dir / "agent_id").read_text().strip() == aid
    before = notices(c, "acl_refused")
    local_cluster.spawn(c.run_dir, "agent-impostor", [
        "-m", "services.agent", "--cluster", c.url, "--work-dir", str(work_dir),
        "--hostname", "agent-impostor", "--resources", "cpus:1;mem:512;disk:512",
        "--runtime", "process"],
        env={"OFFERBUS_AGENT_CURVE_SECRET_KEY_FILE": str(keyed.keys / "agent-2.key_secret")})
    try:
        wait_for(lambda: notices(c, "acl_refused") >= before + 1, 60,
                 message="the impostor's registration with agent-1's id was not refused")
        [after] = c.state()["agents"]
        assert after["agent_info"]["agent_id"] == aid
        assert after["agent_info"]["hostname"] == "agent-1"
        assert after["status"] == "AGENT_STATUS_REGISTERED"
    finally:
        local_cluster.stop_process(c.run_dir, "agent-impostor")


def test_offerbus_up_with_curve_runs_a_keyed_cluster(
        tmp_path_factory: pytest.TempPathFactory) -> None:
    run_dir = tmp_path_factory.mktemp("upcurve")
    url = local_cluster.up(local_cluster.UpOptions(
        run_dir=run_dir, agents=1, standalone=True, runtime="process", curve=True,
        timeout=60, agent_resources="cpus:1;mem:512;disk:512;ports:[46320-46329]"))
    try:
        keyed = Keyed(Cluster(url, run_dir), run_dir / "keys")
        [agent] = keyed.cluster.state()["agents"]  # the agent got in with its key
        assert agent["status"] == "AGENT_STATUS_REGISTERED"
        assert sorted(p.name for p in (run_dir / "keys" / "allowed").iterdir()) == [
            "agent.key", "allocator.key", "jobs.key", "operator.key", "server.key"]
        out = cli(keyed, "kill", "t", "--framework", "f", env={})
        assert "no answer from the master" in out.stdout + out.stderr
        out = cli(keyed, "kill", "t", "--framework", "f", env=keyed.env("operator"))
        said = out.stdout + out.stderr
        assert "the master refused" in said and "unknown" in said, said  # it answered
    finally:
        local_cluster.down(run_dir)
