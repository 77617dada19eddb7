"""A cluster deployed across four namespaced hosts (issue 11): each host a network namespace
with its own address on eth0 (a veth on the fleet's bridge, chaos/netns.py); host-a runs
ZooKeeper, the master, the allocator, the offer-broker and the job runner, host-b and host-c
an agent each (Docker runtime), host-d is the operator's machine. Every service is started
inside its host's namespace as the systemd units start it (`python -m MODULE --config FILE`,
services/procs.py) from the offerbus.toml infra/inventory.py renders for that host, with
CURVE on: a key pair per service and for the client (`offerbus keys` code), the master and
the broker admit only the fleet's public keys, the master's ACL names the client's principal
(roles, and the submit_job/remove_job actions) and the job runner's (roles only). From
host-d, `offerbus job run` submits a 2-instance job constrained hostname-unique; the job
runner on host-a runs its framework (no framework process on host-d); both instances run on
agents of different hosts (the master's /state read from host-d, and Docker's containers
labelled with the cluster id); `offerbus job stop` removes them. A client on host-d without
the keys cannot submit a job. Everything (processes, executors,
containers, ZooKeeper, namespaces) is removed in a `finally` by chaos.fleet.clean, from the
fleet.json the test records (so `offerbus chaos clean RUN_DIR` finds a crashed run's too)."""

from __future__ import annotations

import json
import os
import secrets
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from chaos import fleet, netns
from infra import inventory
from infra.rollout import REPO
from services.cli.client import http_get
from services.cli.keys import generate
from services.executor.runtime import LABEL_CLUSTER
from services.master.records import JOB_LABEL
from services.procs import service_module
from tests.e2e import leader_of
from tests.waiting import wait_for

pytestmark = pytest.mark.integration

HOSTS = {"host-a": 11, "host-b": 101, "host-c": 102, "host-d": 201}  # host -> address number
AGENTS = ("host-b", "host-c")
CLIENT = "deployer"  # the client's key name, hence its principal in the master's ACL
RUNNER = "jobs-a"  # the job runner's key name: the principal its jobs' frameworks register as
ACL = f"""
[principals.{CLIENT}]
roles = ["*"]
operator = ["teardown_framework", "kill_task", "submit_job", "remove_job"]
[principals.{RUNNER}]
roles = ["*"]
"""


def _inventory(run: Path, net: netns.Network, keys: Path, allowed: Path, chroot: str) -> str:
    addr = {h: net.address(i) for h, i in HOSTS.items()}
    agents = "".join(f"""
[[host]]
name = "{h}"
address = "{addr[h]}"
roles = ["agent"]
[host.agent]
work_dir = "{run / 'agents' / h}"
curve_secret_key_file = "{keys / f'{h}.key_secret'}"
""" for h in AGENTS)
    return f"""
[cluster]
chroot = "{chroot}"
[services]
log_level = "DEBUG"
heartbeat = 0.5
curve_server_key_file = "{keys / 'server.key'}"
curve_allowed_dir = "{allowed}"
[services.agent]
runtime = "docker"
resources = "cpus:2;mem:1024;disk:1024;ports:[31000-31009]"
[[host]]
name = "host-a"
address = "{addr['host-a']}"
roles = ["zookeeper", "master", "allocator", "broker", "jobs"]
[host.master]
curve_secret_key_file = "{keys / 'server.key_secret'}"
acl_file = "{run / 'acl.toml'}"
[host.allocator]
curve_secret_key_file = "{keys / 'allocator.key_secret'}"
[host.broker]
curve_secret_key_file = "{keys / 'server.key_secret'}"
[host.jobs]
curve_secret_key_file = "{keys / f'{RUNNER}.key_secret'}"
{agents}"""


def _job(path: Path, name: str, instances: int) -> Path:
    path.write_text(f"""
name = "{name}"
image = "{fleet.IMAGE}"
command = ["sleep", "600"]
instances = {instances}
role = "*"
kill_grace = 1.0
[resources]
cpus = 0.1
mem = 16
[[constraints]]
attribute = "hostname"
op = "unique"
""")
    return path


def _containers(cluster_id: str) -> list[dict[str, Any]]:
    import docker

    client = docker.from_env(timeout=10)
    try:
        return list(client.api.containers(filters={"label": f"{LABEL_CLUSTER}={cluster_id}"}))
    finally:
        client.close()


def test_a_job_from_another_host_runs_on_agents_of_different_hosts_with_curve(
        tmp_path: Path, busybox_image: str) -> None:
    if os.geteuid() != 0 or shutil.which("ip") is None:
        pytest.skip("network namespaces need root and iproute2")
    run = tmp_path
    fleet_id = secrets.token_hex(3)
    net = netns.Network(fleet_id, netns.pick_subnet(fleet_id))
    pids: dict[str, int] = {}
    zookeepers: list[fleet.FleetZooKeeper] = []
    procs: list[subprocess.Popen[bytes]] = []
    cluster_id = ""

    def record() -> None:
        fleet.write_record(run, fleet_id, str(net.subnet), pids, zookeepers, cluster_id)

    def logs() -> str:
        return "\n".join(f"== {p.name}\n{p.read_text()[-2000:]}"
                         for p in sorted((run / "logs").glob("*.log")))

    env = {k: v for k, v in os.environ.items() if not k.startswith("OFFERBUS_")}
    client_env = {**env, "COLUMNS": "250"}

    def client(*args: str, keyed: bool = True,
               timeout: float = 120) -> subprocess.CompletedProcess[str]:
        """The CLI run on host-d, reaching the cluster by its URL (and its key)."""
        extra = {"OFFERBUS_CLUSTER": url}
        if keyed:
            extra |= {"OFFERBUS_CURVE_SECRET_KEY_FILE": str(keys / f"{CLIENT}.key_secret"),
                      "OFFERBUS_CURVE_SERVER_KEY_FILE": str(keys / "server.key")}
        out = subprocess.run(net.wrap("host-d", [
            sys.executable, "-m", "services.cli", "--run-dir", str(run / "client"),
            "--timeout", "5", *args]), capture_output=True, text=True, timeout=timeout,
            cwd=REPO, env={**client_env, **extra})
        (run / "logs").mkdir(exist_ok=True)
        with open(run / "logs" / "client.log", "a") as log:
            log.write(f"$ {' '.join(args)} (keyed={keyed}) -> {out.returncode}\n"
                      f"{out.stdout}{out.stderr}\n")
        return out

    record()
    try:
        net.create_bridge([])
        for host, index in HOSTS.items():
            net.add_host(host, index)
        # Keys: one pair per service (master and broker share the server's) and the client;
        # the servers admit only the public keys in `allowed`.
        keys, allowed = run / "keys", run / "keys" / "allowed"
        allowed.mkdir(parents=True)
        for name in ("server", "allocator", RUNNER, *AGENTS, CLIENT):
            generate(keys, name)
            shutil.copy(keys / f"{name}.key", allowed)
        (run / "acl.toml").write_text(ACL)
        chroot = f"/fleet-{fleet_id}"
        inv = inventory.parse(_inventory(run, net, keys, allowed, chroot), "fleet.toml")
        assert inventory.check_configs(inv) == []
        url = inv.cluster_url()

        [zk_host] = inv.with_role("zookeeper")
        zk = fleet.FleetZooKeeper(run / "zk", zk_host.address, 1, [(1, zk_host.address)],
                                  200, namespace=net.namespaces[zk_host.name])
        zookeepers.append(zk)
        record()
        zk.launch()
        zk.wait_serving(time.monotonic() + 60)
        from kazoo.client import KazooClient

        kz = KazooClient(hosts=zk.hosts, timeout=5.0)
        kz.start(timeout=30)
        try:
            kz.ensure_path(chroot)
        finally:
            kz.stop()
            kz.close()

        (run / "logs").mkdir(exist_ok=True)
        for node in inv.hosts:
            config = run / f"{node.name}.toml"
            config.write_text(inventory.service_config(inv, node))
            for role in (r for r in node.roles if r in inventory.SERVICE_ROLES):
                with open(run / "logs" / f"{node.name}-{role}.log", "wb") as log:
                    proc = subprocess.Popen(
                        net.wrap(node.name, [sys.executable, "-m", service_module(role),
                                             "--config", str(config)]),
                        cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT,
                        stdin=subprocess.DEVNULL, start_new_session=True)
                procs.append(proc)
                pids[f"{node.name}-{role}"] = proc.pid
        record()

        def cluster_up() -> bool:
            dead = [n for n, p in zip(pids, procs, strict=True) if p.poll() is not None]
            assert not dead, f"{dead} exited\n{logs()}"
            for role in ("master", "allocator", "broker", "jobs"):
                leader_of(url, role, timeout=1.0)
            out = client("agents", "--json")
            assert out.returncode == 0, out.stdout + out.stderr
            rows = json.loads(out.stdout)
            return {r.get("hostname") for r in rows
                    if "REGISTERED" in str(r.get("status", ""))} == set(AGENTS)
        wait_for(cluster_up, 60, interval=0.5, ignore=(AssertionError,),
                 message=lambda: f"the fleet did not come up\n{logs()}")
        out = client("status", "--json")
        assert out.returncode == 0, out.stderr
        status = json.loads(out.stdout)
        cluster_id = str(status["cluster_id"])
        assert cluster_id
        record()
        master = leader_of(url, "master")
        assert f"//{zk_host.address}:" in master.endpoints["http"], master.endpoints

        runner = leader_of(url, "jobs")
        assert runner.member_id == "jobs-host-a", runner
        assert f"//{zk_host.address}:" in runner.endpoints["http"], runner.endpoints

        # The job, from host-d: both instances RUNNING, on agents of two different hosts,
        # its framework run by the job runner on host-a (its principal the runner's key),
        # none on host-d.
        name = f"fleet-{fleet_id}"
        out = client("job", "run", str(_job(run / "job.toml", name, 2)), "--timeout", "90")
        assert out.returncode == 0, out.stdout + out.stderr + logs()
        assert _client_pids(run / "client") == []
        state = http_get(master.endpoints["http"] + "/state", 5.0)
        [framework] = [f["framework_info"] for f in state["frameworks"]
                       if f["framework_info"].get("name") == name]
        assert framework.get("principal") == RUNNER, framework
        assert framework.get("labels", {}).get(JOB_LABEL) == name, framework
        def job_list() -> dict[str, Any]:
            out = client("job", "list", "--json")
            assert out.returncode == 0, out.stderr
            return dict(json.loads(out.stdout))

        # `running` is the job runner's count, learnt from the state stream after the master.
        listed = wait_for(lambda: (d := job_list())["jobs"] and d["jobs"][0]["running"] == 2
                          and d, 20, message=lambda: f"`job list`: {job_list()}")
        assert listed["job_runner"] is True
        assert [(j["name"], j["principal"], j["running"]) for j in listed["jobs"]] == [
            (name, CLIENT, 2)], listed
        out = client("tasks", "--json")
        assert out.returncode == 0, out.stderr
        tasks = [t for t in json.loads(out.stdout) if t["framework"] == name]
        assert [t["state"] for t in tasks] == ["RUNNING", "RUNNING"], tasks
        assert sorted(t["host"] for t in tasks) == sorted(AGENTS), tasks
        containers = _containers(cluster_id)
        assert len(containers) == 2, containers
        assert {c["Labels"]["org.offerbus.task_id"] for c in containers} == {
            t["id"] for t in tasks}

        # A client on host-d without the keys cannot submit a job (the master admits only the
        # fleet's keys): the cluster keeps no such job and runs no such framework.
        rogue = f"rogue-{fleet_id}"
        out = client("job", "run", str(_job(run / "rogue.toml", rogue, 1)), "--stall", "8",
                     keyed=False)
        assert out.returncode != 0, out.stdout + out.stderr
        out = client("frameworks", "--json")
        names = {f.get("name") for f in json.loads(out.stdout)}
        assert name in names and rogue not in names, names
        out = client("job", "list", "--json")
        assert [j["name"] for j in json.loads(out.stdout)["jobs"]] == [name]
        assert _client_pids(run / "client") == []

        out = client("job", "stop", name, "--timeout", "60")
        assert out.returncode == 0, out.stdout + out.stderr
        assert _containers(cluster_id) == []
        out = client("tasks", "--json")
        assert [t for t in json.loads(out.stdout) if t["framework"] == name] == []
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
        for proc in procs:
            proc.wait(timeout=20)
        for pid in _client_pids(run / "client"):
            pids[f"client-{pid}"] = pid
        record()
        fleet.clean(run, quiet=True)
    assert not [n for n in _links() if fleet_id in n]  # the namespaces and links are gone


def _client_pids(run_dir: Path) -> list[int]:
    """The processes the CLI started on host-d (none: jobs run in the cluster's job runner)."""
    from services.cli import cluster

    return list(cluster.running(run_dir).values()) if run_dir.exists() else []


def _links() -> list[str]:
    return [*netns.run("ip", "netns", "list").split(), *netns.run("ip", "-o", "link").split()]
