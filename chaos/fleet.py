"""A real fleet on one machine for chaos campaigns and multi-host tests: a 3-node ZooKeeper
ensemble, masters, allocators, offer-brokers and job runners (each an OS process bound to its
own address on the fleet's bridge) and N agents, each in its own network namespace (a "VM"
with a veth link to the bridge), Docker containers as tasks. `Fleet` starts, signals, restarts,
partitions and tears all of it down; `clean(run_dir)` removes a crashed run's leftovers.

Addresses on the fleet's /24: .1 the root namespace, .11+ masters, .21+ allocators, .31+ brokers,
.41+ ZooKeeper servers, .51+ job runners, .101+ agents (their namespaces)."""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from chaos import netns
from chaos.proxy import Degradation, Impairment
from infra.zookeeper.server import ZooKeeperServer
from services.procs import service_module

ROLES = ("master", "allocator", "broker", "jobs")  # elected roles ("jobs": job runners)
BASE = {"master": 10, "allocator": 20, "broker": 30, "zk": 40, "jobs": 50, "agent": 100}
ZK_PORTS = (2181, 2888, 3888)  # each server has its own address, so the usual ports
IMAGE = "offerbus/busybox:latest"


@dataclass
class FleetSpec:
    agents: int = 5
    masters: int = 3
    allocators: int = 2
    brokers: int = 2
    jobs: int = 2  # job runners (python -m frameworks.jobrunner): a leader and hot standbys
    zookeepers: int = 3
    tick_ms: int = 200
    heartbeat: float = 1.0
    session_timeout: float = 1.0  # the services' ZooKeeper session (the cluster URL's)
    agent_resources: str = "cpus:2;mem:2048;disk:10240;ports:[31000-31099]"
    agent_timeout: float | None = None  # master --agent-timeout (None: its default)
    # Masters, allocators and brokers each in a namespace of its own too (else they share
    # the root namespace, each on its own address): then they can be partitioned.
    central_namespaces: bool = False
    agent_env: dict[str, str] = field(default_factory=dict)  # e.g. a test-only switch
    master_env: dict[str, str] = field(default_factory=dict)

    def counts(self) -> dict[str, int]:
        return {"master": self.masters, "allocator": self.allocators, "broker": self.brokers,
                "jobs": self.jobs}

    def elected(self) -> list[str]:
        """The roles the fleet runs (each must be led)."""
        return [r for r in ROLES if self.counts()[r] > 0]


class FleetError(RuntimeError):
    pass


class FleetZooKeeper(ZooKeeperServer):
    """A ZooKeeper ensemble member listening on its own fleet address."""

    def __init__(self, root: Path, address: str, myid: int,
                 peers: list[tuple[int, str]], tick_ms: int,
                 namespace: str | None = None) -> None:
        super().__init__(root, ZK_PORTS[0], tick_ms, myid=myid,
                         peers=[(sid, ZK_PORTS[1], ZK_PORTS[2]) for sid, _ in peers])
        self.address = address
        self.namespace = namespace  # run inside this network namespace (None: the root's)
        self.peer_addresses = dict(peers)
        self.hosts = f"{address}:{ZK_PORTS[0]}"

    def config_text(self) -> str:
        lines = []
        for line in super().config_text().splitlines():
            if line.startswith("clientPortAddress="):
                line = f"clientPortAddress={self.address}"
            elif line.startswith("server."):
                sid = int(line.split("=")[0].split(".")[1])
                line = (f"server.{sid}={self.peer_addresses[sid]}:{ZK_PORTS[1]}:{ZK_PORTS[2]}")
            lines.append(line)
        return "\n".join(lines) + "\n"

    def command(self) -> list[str]:
        argv = super().command()
        return argv if self.namespace is None else ["ip", "netns", "exec", self.namespace,
                                                    *argv]

    def _ask(self, cmd: str) -> str:
        import socket

        with socket.create_connection((self.address, ZK_PORTS[0]), timeout=1.0) as sock:
            sock.sendall(cmd.encode())
            sock.shutdown(socket.SHUT_WR)
            chunks = []
            while data := sock.recv(65536):
                chunks.append(data)
        return b"".join(chunks).decode("utf-8", "replace")

    def _safe_four_letter(self, cmd: str) -> str:
        try:
            return self._ask(cmd)
        except OSError as exc:
            return f"<{exc.__class__.__name__}: {exc}>"

    def mode(self) -> str | None:
        answer = self._safe_four_letter("srvr")
        for line in answer.splitlines():
            if line.startswith("Mode:"):
                return line.split(":", 1)[1].strip()
        return None


@dataclass
class Proc:
    name: str
    role: str  # master, allocator, broker, jobs, agent
    argv: list[str]
    host: str | None  # its namespace's host name (None: the root namespace)
    address: str
    env: dict[str, str]
    popen: subprocess.Popen[bytes] | None = None
    stopped: bool = False  # SIGSTOPped and not yet continued

    @property
    def pid(self) -> int | None:
        return self.popen.pid if self.popen is not None else None

    def alive(self) -> bool:
        return self.popen is not None and self.popen.poll() is None


class Fleet:
    """One fleet under `run_dir` (logs, ZooKeeper data, agents' work dirs, fleet.json)."""

    def __init__(self, run_dir: Path, spec: FleetSpec | None = None,
                 fleet_id: str | None = None) -> None:
        self.run_dir = Path(run_dir).resolve()
        self.spec = spec or FleetSpec()
        self.fleet_id = fleet_id or secrets.token_hex(3)
        self.net: netns.Network | None = None
        self.zookeepers: list[FleetZooKeeper] = []
        self.procs: dict[str, Proc] = {}
        self.url = ""
        self.cluster_id = ""
        self.degraded: dict[str, Degradation] = {}  # process name -> its proxy, while on

    # -- bring-up -------------------------------------------------------------------------------
    def __enter__(self) -> Fleet:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _record(self) -> None:
        write_record(self.run_dir, self.fleet_id, str(self.net.subnet) if self.net else "",
                     {**{n: p.pid for n, p in self.procs.items() if p.pid},
                      **{f"proxy:{n}": d.popen.pid for n, d in self.degraded.items()
                         if d.popen is not None}},
                     self.zookeepers, self.cluster_id, self.url, asdict(self.spec))

    def start(self, timeout: float = 90.0, progress: Any = None) -> None:
        if os.geteuid() != 0:
            raise FleetError("a fleet needs root (network namespaces)")
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self._fresh()
        self._record()
        try:
            self._start(timeout, progress or (lambda _msg: None))
        except BaseException:
            self.stop()
            raise

    def _fresh(self) -> None:
        """Nothing of an earlier fleet in this run dir: its leftovers removed (by its record),
        its agents' checkpoints and its ZooKeeper data gone. Else the new agents recover
        the old run's executors and tasks (same task ids, other frameworks) into the new
        cluster, and the ensemble its registry."""
        import shutil

        clean(self.run_dir, quiet=True)
        for stale in ("agents", "zk"):
            shutil.rmtree(self.run_dir / stale, ignore_errors=True)

    def _start(self, timeout: float, progress: Any) -> None:
        spec = self.spec
        net = self.net = netns.Network(self.fleet_id, netns.pick_subnet(self.fleet_id))
        root = [] if spec.central_namespaces else [
            BASE[r] + i for r, n in spec.counts().items() for i in range(1, n + 1)]
        root += [BASE["zk"] + i for i in range(1, spec.zookeepers + 1)]
        progress(f"network {net.subnet} on bridge {net.bridge}")
        net.create_bridge(root)
        peers = [(i, net.address(BASE["zk"] + i)) for i in range(1, spec.zookeepers + 1)]
        self.zookeepers = [FleetZooKeeper(self.run_dir / "zk" / f"zk{sid}", addr, sid, peers,
                                          spec.tick_ms) for sid, addr in peers]
        self._record()
        progress(f"ZooKeeper x{spec.zookeepers}")
        deadline = time.monotonic() + timeout
        for zk in self.zookeepers:
            zk.launch()
        for zk in self.zookeepers:
            zk.wait_serving(deadline)
        hosts = ",".join(z.hosts for z in self.zookeepers)
        self._ensure_chroot(hosts)
        self.url = f"zk://{hosts}/offerbus?session_timeout={spec.session_timeout:g}"
        progress("masters, allocators, brokers, job runners")
        for role, count in spec.counts().items():
            for i in range(1, count + 1):
                name = f"{role}-{i}"
                host = name if spec.central_namespaces else None
                addr = net.add_host(name, BASE[role] + i) if host else \
                    net.address(BASE[role] + i)
                argv = ["-m", service_module(role), "--cluster", self.url, "--id", name,
                        "--host", addr]
                if role == "master":
                    argv += ["--heartbeat", str(spec.heartbeat)]
                    if spec.agent_timeout is not None:
                        argv += ["--agent-timeout", str(spec.agent_timeout)]
                self._add(Proc(name, role, argv, host, addr,
                               spec.master_env if role == "master" else {}))
        progress(f"{spec.agents} agents in their namespaces")
        from services.cli.cluster import agent_resources

        for i in range(1, spec.agents + 1):
            name = f"agent-{i}"
            addr = net.add_host(name, BASE["agent"] + i)
            argv = ["-m", service_module("agent"), "--cluster", self.url, "--host", addr,
                    "--work-dir", str(self.run_dir / "agents" / name), "--hostname", name,
                    "--resources", agent_resources(spec.agent_resources, i - 1),
                    "--attributes", f"rack:{'abc'[(i - 1) % 3]}", "--runtime", "docker",
                    "--heartbeat", str(spec.heartbeat)]
            self._add(Proc(name, "agent", argv, name, addr, spec.agent_env))
        progress("waiting for leaders and agents")
        self.wait_ready(deadline)
        state = self.state()
        self.cluster_id = str(state.get("cluster_id") or "")
        (self.run_dir / "cluster.id").write_text(self.cluster_id + "\n")
        self._record()

    def _ensure_chroot(self, hosts: str) -> None:
        from kazoo.client import KazooClient

        client = KazooClient(hosts=hosts, timeout=5.0)
        client.start(timeout=30)
        try:
            client.ensure_path("/offerbus")
        finally:
            client.stop()
            client.close()

    def _add(self, proc: Proc) -> None:
        self.procs[proc.name] = proc
        self.spawn(proc.name)

    def spawn(self, name: str) -> int:
        """Start process `name` (again), as first started: same argv, namespace, work dir."""
        proc = self.procs[name]
        assert self.net is not None
        logs = self.run_dir / "logs"
        logs.mkdir(parents=True, exist_ok=True)
        env = {k: v for k, v in os.environ.items() if k != "OFFERBUS_TRACES_FILE"}
        env.update({"OFFERBUS_TRACES_DIR": str(self.run_dir / "traces"), **proc.env})
        with open(logs / f"{name}.log", "ab") as log:
            proc.popen = subprocess.Popen(
                self.net.wrap(proc.host, [sys.executable, *proc.argv]), stdout=log,
                stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True,
                cwd=Path.cwd(), env=env)
        proc.stopped = False
        self._record()
        return proc.popen.pid

    # -- what is running ----------------------------------------------------------------------
    def members(self, role: str) -> list[str]:
        return [n for n, p in self.procs.items() if p.role == role]

    def leader(self, role: str = "master", timeout: float = 2.0) -> tuple[str, int] | None:
        """(process name, epoch) of whoever leads `role` by the election, or None."""
        from services.cli.client import CliError, find_leader

        try:
            info = find_leader(self.url, timeout=timeout, role=role)
        except (CliError, OSError):
            return None
        return (info.member_id, info.epoch) if info.member_id in self.procs else None

    def leader_http(self, timeout: float = 2.0) -> str | None:
        from services.cli.client import CliError, find_leader

        try:
            return str(find_leader(self.url, timeout=timeout).endpoints["http"])
        except (CliError, OSError, KeyError):
            return None

    def state(self, query: str = "", timeout: float = 3.0) -> dict[str, Any]:
        http = self.leader_http()
        if http is None:
            raise FleetError("no leading master")
        with urllib.request.urlopen(f"{http}/state{query}", timeout=timeout) as r:
            return dict(json.loads(r.read()))

    def registered_agents(self, state: dict[str, Any]) -> set[str]:
        return {a["agent_info"]["hostname"] for a in state.get("agents", [])
                if a.get("status") == "AGENT_STATUS_REGISTERED"}

    def wait_ready(self, deadline: float) -> None:
        """Every role led, every live agent registered; FleetError naming what is missing."""
        last = ""
        while time.monotonic() < deadline:
            dead = [n for n, p in self.procs.items() if not p.alive() and not p.stopped]
            if dead:
                raise FleetError(f"{', '.join(dead)} exited; see {self.run_dir / 'logs'}")
            leaders = {r: self.leader(r, 1.0) for r in self.spec.elected()}
            missing = [r for r, v in leaders.items() if v is None]
            if not missing:
                try:
                    have = self.registered_agents(self.state())
                    want = set(self.members("agent"))
                    if want <= have:
                        return
                    last = f"agents not registered: {sorted(want - have)}"
                except (FleetError, OSError, ValueError) as exc:
                    last = str(exc)
            else:
                last = f"no leader for {missing}"
            time.sleep(0.2)  # polling a condition with a deadline
        raise FleetError(f"fleet not ready: {last}; see {self.run_dir / 'logs'}")

    # -- faults ---------------------------------------------------------------------------------
    def signal(self, name: str, sig: int) -> None:
        """Send `sig` to process `name`'s group (a ZooKeeper server is "zk-N")."""
        if name.startswith("zk-"):
            zk = self.zookeepers[int(name[3:]) - 1]
            if zk.pid is not None:
                os.killpg(zk.pid, sig)
            return
        proc = self.procs[name]
        if proc.pid is None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, sig)
        if sig == signal.SIGSTOP:
            proc.stopped = True
        elif sig == signal.SIGCONT:
            proc.stopped = False
        elif sig in (signal.SIGKILL, signal.SIGTERM) and proc.popen is not None:
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.popen.wait(timeout=15)

    def restart(self, name: str) -> None:
        if name.startswith("zk-"):
            zk = self.zookeepers[int(name[3:]) - 1]
            zk.kill()
            zk.launch()
            return
        proc = self.procs[name]
        if proc.alive():
            self.signal(name, signal.SIGKILL)
        self.spawn(name)

    def executors(self) -> dict[int, tuple[str, list[str]]]:
        """Live executor processes of the fleet's agents (from their checkpoints): pid ->
        (agent hostname, the executor ids it serves: a host serves a framework's)."""
        from services.agent.checkpoint import AgentCheckpoint
        from services.procs import pid_alive

        out: dict[int, tuple[str, list[str]]] = {}
        for agent in self.members("agent"):
            with contextlib.suppress(Exception):
                state = AgentCheckpoint(self.run_dir / "agents" / agent).load_state()
                for ex in state.executors if state is not None else []:
                    if ex.pid and pid_alive(ex.pid):
                        out.setdefault(ex.pid, (agent, []))[1].append(ex.executor_id)
        return out

    def zk_alive(self, name: str) -> bool:
        return self.zookeepers[int(name[3:]) - 1].alive()

    def zk_leader(self) -> str | None:
        for i, zk in enumerate(self.zookeepers, 1):
            if zk.mode() == "leader":
                return f"zk-{i}"
        return None

    def addresses(self, role: str) -> list[str]:
        if role == "zk":
            return [z.address for z in self.zookeepers]
        return [p.address for p in self.procs.values() if p.role == role]

    def partition(self, name: str, role: str = "master", one_way: bool = False) -> None:
        """Cut process `name` (an agent, or a central service with central_namespaces) from
        every process of `role` (master, allocator, broker, agent or zk)."""
        assert self.net is not None
        if self.procs[name].host is None:
            raise FleetError(f"{name} shares the root namespace: start the fleet with "
                             f"central_namespaces to partition it")
        self.net.cut(name, self.addresses(role), one_way)

    def heal(self, name: str) -> None:
        assert self.net is not None
        self.net.heal(name)

    def degrade(self, name: str, role: str, imp: Impairment, seed: int) -> None:
        """Latency / stalls / resets on every TCP connection process `name` opens to a
        process of `role` (chaos/proxy.py in its namespace), until `restore(name)`."""
        assert self.net is not None
        proc = self.procs[name]
        if proc.host is None:
            raise FleetError(f"{name} shares the root namespace: start the fleet with "
                             f"central_namespaces to degrade its links")
        self.restore(name)
        logs = self.run_dir / "logs"
        with open(logs / f"proxy-{name}.log", "ab") as log:
            deg = Degradation(self.net.namespaces[proc.host], proc.address,
                              self.addresses(role), imp, seed, log)
            self.degraded[name] = deg
            try:
                deg.start()
            except BaseException:
                del self.degraded[name]
                raise
        self._record()

    def restore(self, name: str) -> None:
        deg = self.degraded.pop(name, None)
        if deg is not None:
            deg.stop()
            self._record()

    # -- tear-down ------------------------------------------------------------------------------
    def stop(self) -> None:
        """Everything this fleet made: processes, executors, containers, ZooKeeper, network."""
        for name in list(self.degraded):
            with contextlib.suppress(Exception):
                self.restore(name)
        for proc in self.procs.values():
            if proc.alive():
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid or 0, signal.SIGCONT)
                    os.killpg(proc.pid or 0, signal.SIGKILL)
        for proc in self.procs.values():
            if proc.popen is not None:
                with contextlib.suppress(subprocess.TimeoutExpired):
                    proc.popen.wait(timeout=10)
        for zk in self.zookeepers:
            with contextlib.suppress(Exception):
                zk.kill()
        clean(self.run_dir, quiet=True)


def write_record(run_dir: Path, fleet_id: str, subnet: str, pids: dict[str, int],
                 zookeepers: Sequence[ZooKeeperServer], cluster_id: str = "", url: str = "",
                 spec: dict[str, Any] | None = None) -> None:
    """`run_dir`/fleet.json: what `clean` (and `offerbus chaos clean`) removes after a
    crash; also written by tests that build a fleet of their own from netns.Network."""
    (Path(run_dir) / "fleet.json").write_text(json.dumps({
        "fleet_id": fleet_id, "cluster_id": cluster_id, "url": url, "subnet": subnet,
        "spec": spec or {}, "pids": pids, "zookeepers": [str(z.root) for z in zookeepers]},
        indent=1))


def clean(run_dir: Path, quiet: bool = False) -> dict[str, int]:
    """Remove what the fleet recorded in `run_dir`/fleet.json: its processes (by recorded
    pid), its agents' executors, its containers (by cluster id or executor), its ZooKeeper
    servers and its namespaces, veths and bridge (by fleet id). Nothing of any other fleet."""
    from services.cli import cluster as local_cluster

    run_dir = Path(run_dir).resolve()
    try:
        record = json.loads((run_dir / "fleet.json").read_text())
    except (OSError, ValueError):
        return {}
    out = {"processes": 0, "containers": 0, "links": 0}
    pids = list(record.get("pids", {}).values())
    pids += local_cluster.executor_pids(run_dir).values()
    executors = local_cluster.executor_ids(run_dir)
    for pid in pids:
        if pid and _ours(pid, run_dir, str(record.get("subnet") or "")):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(pid, signal.SIGKILL)
                out["processes"] += 1
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
    for root in record.get("zookeepers", []):
        with contextlib.suppress(Exception):
            server = ZooKeeperServer.from_dir(Path(root))
            if server.alive():
                server.kill()
                out["processes"] += 1
    out["containers"] = local_cluster.remove_task_containers(
        str(record.get("cluster_id") or ""), executors)
    out["links"] = len(netns.remove_all(str(record["fleet_id"])))
    if not quiet:
        print(f"fleet {record['fleet_id']}: {out}")
    return out


def _ours(pid: int, run_dir: Path, subnet: str) -> bool:
    """`pid` still runs one of this run dir's processes (pids get reused): its command line
    names the run dir or the fleet's own addresses (the cluster URL)."""
    from services.procs import cmdline

    cmd = " ".join(cmdline(pid))
    prefix = subnet.rsplit(".", 1)[0] + "." if subnet else ""
    return str(run_dir) in cmd or bool(prefix and prefix in cmd)
