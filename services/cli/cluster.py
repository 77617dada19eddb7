"""`offerbus up` / `offerbus down`: a local cluster of separate background processes —
ZooKeeper (or standalone election), master, allocator, offer-broker (each optionally with
hot standbys under the election) and N agents, each agent with its own work dir, resources
and hostname — with pids and logs under one run dir, and the cluster's id
(<run-dir>/cluster.id) naming what `down` may remove."""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rich.console import Console

from frameworks import forkserver
from services.cli.client import CliError, ElectionView, find_leader, http_get, state_path
from services.procs import pid_alive, service_module

console = Console()
RACKS = ("a", "b", "c")
STATE_PARTS = ("zk", "election", "agents", "frameworks", "traces", "pids")
CENTRAL = ("master", "allocator", "broker")  # the elected roles, each `python -m services.<role>`
# Processes this process started, by (run dir, name): a cluster's own are checked and reaped.
_children: dict[tuple[Path, str], subprocess.Popen[bytes]] = {}
_spawning = 0  # spawns under way: a stop signal waits for them (`exit_on_signal`)
_signalled: list[int] = []  # a stop signal that came during one


def exit_on_signal(signum: int, _frame: Any = None) -> None:
    """A SIGTERM/SIGINT handler for a process that starts a cluster (bench.scale): exit
    (so `finally` takes the cluster down), but not in the middle of a `spawn`, whose child
    would then run on unrecorded, where no `down` finds it (a bench terminated right
    after its cluster came up left its agent emulator running); it exits once the pid is
    written."""
    if _spawning:
        _signalled.append(signum)
        return
    sys.exit(128 + signum)


@dataclass
class UpOptions:
    run_dir: Path
    agents: int = 3
    agent_resources: str = "cpus:4;mem:4096;disk:10240;ports:[31000-31999]"
    standalone: bool = False
    runtime: str = "docker"
    timeout: float = 90.0
    cluster_url: str = ""  # use this ZooKeeper (zk://hosts/chroot) instead of starting one
    offer_timeout: float = 30.0
    heartbeat: float = 1.0
    masters: int = 1  # more are hot standbys (ZooKeeper election)
    # Hot standbys of EVERY central service (master, allocator, offer-broker): N+1 of each,
    # named "<role>", "<role>-2", ... with ids "<role>-1", "<role>-2", ... Masters are
    # max(masters, standbys + 1).
    standbys: int = 0
    curve: bool = False  # CURVE on the bus: keys in <run-dir>/keys (curve_env)
    jobs: bool = True  # a job runner (and its standbys): `offerbus job run` jobs run

    def instances(self) -> dict[str, int]:
        """How many processes of each central role `up` starts."""
        return {"master": max(self.masters, self.standbys + 1),
                "allocator": self.standbys + 1, "broker": self.standbys + 1}

    def elected(self) -> dict[str, int]:
        """How many processes of each elected role `up` starts: the central roles and the
        job runner (frameworks/jobrunner), which has standbys as they do."""
        return {**self.instances(), **({"jobs": self.standbys + 1} if self.jobs else {})}


KEYED = {"master": "server", "broker": "server", "allocator": "allocator", "agent": "agent",
         "jobs": "jobs"}
CLIENT_KEYS = ("operator",)  # the CLI's (and frameworks') key in a keyed local cluster


def curve_env(run_dir: Path) -> dict[str, str]:
    """The OFFERBUS_<SERVICE>_CURVE_* variables of a keyed local cluster: key pairs (made
    once, kept for the next `up`) in <run-dir>/keys, their public certs in
    <run-dir>/keys/allowed (what the master and the offer-broker admit)."""
    from services.cli.keys import generate

    keys, allowed = run_dir / "keys", run_dir / "keys" / "allowed"
    allowed.mkdir(parents=True, exist_ok=True)
    for name in {*KEYED.values(), *CLIENT_KEYS}:
        if not (keys / f"{name}.key_secret").exists():
            generate(keys, name)
        shutil.copy(keys / f"{name}.key", allowed / f"{name}.key")
    env = {"OFFERBUS_CURVE_SERVER_KEY_FILE": str(keys / "server.key")}
    for service, name in KEYED.items():
        env[f"OFFERBUS_{service.upper()}_CURVE_SECRET_KEY_FILE"] = str(keys / f"{name}.key_secret")
        env[f"OFFERBUS_{service.upper()}_CURVE_ALLOWED_DIR"] = str(allowed)
    return env


def central_name(role: str, index: int) -> tuple[str, str]:
    """(process name, member id) of instance `index` (from 1) of a central role: the first
    is plain "<role>" (what a one-of-each cluster always called it), the others "<role>-N";
    ids are always "<role>-N"."""
    return (role if index == 1 else f"{role}-{index}"), f"{role}-{index}"


def central_argv(opts: UpOptions, url: str) -> list[tuple[str, list[str]]]:
    """(process name, argv) of every master, allocator and offer-broker `up` starts, first
    instances first (each joins its role's election; whichever joins first leads)."""
    out = []
    common = ["--cluster", url]
    for role, count in opts.elected().items():
        for i in range(1, count + 1):
            name, member = central_name(role, i)
            extra = {"master": ["--heartbeat", str(opts.heartbeat)],
                     "broker": ["--offer-timeout", str(opts.offer_timeout)]}.get(role, [])
            out.append((name, ["-m", service_module(role), *common, *extra, "--id", member]))
    return out


def member_id_of(run_dir: Path, name: str) -> str | None:
    """The `--id` process `name` of this run dir was started with (what the election calls
    it), from the argv `spawn` recorded; None if unknown."""
    try:
        argv = json.loads((_pids_dir(run_dir) / f"{name}.argv").read_text())["argv"]
    except (OSError, ValueError, KeyError, TypeError):
        return None
    ids = [b for a, b in itertools.pairwise(argv) if a == "--id"]
    return str(ids[-1]) if ids else None


def member_process(run_dir: Path, member_id: str) -> str | None:
    """The name of this run dir's process started with `--id member_id`; None if none."""
    for argv_file in sorted(_pids_dir(run_dir).glob("*.argv")):
        if member_id_of(run_dir, argv_file.stem) == member_id:
            return argv_file.stem
    return None


def _pids_dir(run_dir: Path) -> Path:
    return run_dir / "pids"


def alive(pid: int) -> bool:
    """True while `pid` runs (a child of this process that exited is reaped)."""
    return _alive(pid)


def _alive(pid: int) -> bool:
    """True while `pid` runs; a child of this process that exited is reaped (a zombie would
    otherwise look alive to kill(pid, 0))."""
    child = next((p for p in _children.values() if p.pid == pid), None)
    if child is not None:
        return child.poll() is None
    return pid_alive(pid)


def running(run_dir: Path) -> dict[str, int]:
    out = {}
    for pid_file in sorted(_pids_dir(run_dir).glob("*.pid")):
        try:
            pid = int(pid_file.read_text())
        except ValueError:
            continue
        if _alive(pid):
            out[pid_file.stem] = pid
    return out


def traces_dir(run_dir: Path) -> Path:
    """Where every process `up` (or `run`) starts writes its `<service>-<pid>.jsonl` spans."""
    return run_dir / "traces"


def spawn(run_dir: Path, name: str, argv: list[str], env: dict[str, str] | None = None) -> int:
    """Start `python -m ...` detached, logging to run_dir/logs/NAME.log; `env` is added to
    this process's environment. A service framework is forked by the run dir's fork server
    when it runs (frameworks/forkserver.py), else started as a new interpreter. Spans go
    to the run dir's traces/ (OFFERBUS_TRACES_DIR: one file per process; an inherited
    OFFERBUS_TRACES_FILE would make them share one)."""
    (run_dir / "logs").mkdir(parents=True, exist_ok=True)
    traces_dir(run_dir).mkdir(parents=True, exist_ok=True)
    child_env = {k: v for k, v in os.environ.items() if k != "OFFERBUS_TRACES_FILE"}
    child_env.update({"OFFERBUS_TRACES_DIR": str(traces_dir(run_dir)), **(env or {})})
    _pids_dir(run_dir).mkdir(parents=True, exist_ok=True)
    global _spawning
    _spawning += 1
    try:
        pid = _forked(run_dir, name, argv, child_env)
        if pid is None:
            log = open(run_dir / "logs" / f"{name}.log", "ab")  # noqa: SIM115 (the child's)
            proc = subprocess.Popen([sys.executable, *argv], stdout=log,
                                    stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                    start_new_session=True, cwd=Path.cwd(), env=child_env)
            log.close()
            pid = proc.pid
            _children[(run_dir.resolve(), name)] = proc
        (_pids_dir(run_dir) / f"{name}.pid").write_text(str(pid))
        (_pids_dir(run_dir) / f"{name}.argv").write_text(json.dumps({"argv": argv,
                                                                      "env": env or {}}))
    finally:
        _spawning -= 1
    if not _spawning and _signalled:
        sys.exit(128 + _signalled.pop())
    return pid


def _forked(run_dir: Path, name: str, argv: list[str], env: dict[str, str]) -> int | None:
    """The pid of `python ARGV` forked by the run dir's framework fork server (a service
    framework, in milliseconds), or None: that is not for it, or it is not there."""
    if not forkserver.serves(argv):
        return None
    try:
        return forkserver.fork(run_dir, name, argv, env, Path.cwd())
    except forkserver.Unavailable:
        _revive_forkserver(run_dir)
        return None  # the interpreter is started instead, as before the fork server


def _revive_forkserver(run_dir: Path) -> None:
    """Start the run dir's fork server again when `up` started one and it is gone (killed,
    crashed), for the next `run`; not waited for. A run dir without one stays without."""
    argv_file = _pids_dir(run_dir) / f"{forkserver.PROCESS}.argv"
    if not argv_file.exists() or forkserver.PROCESS in running(run_dir):
        return
    with contextlib.suppress(OSError, ValueError, KeyError):
        pid = respawn(run_dir, forkserver.PROCESS)
        console.print(f"[yellow]the framework fork server was gone: started it again "
                      f"(pid {pid}); this framework starts as a new interpreter[/]")


def respawn(run_dir: Path, name: str) -> int:
    """Start process `name` of this run dir again, as `spawn` first started it (an agent
    restarted on its machine from its work dir, a master back after a crash)."""
    recorded = json.loads((_pids_dir(run_dir) / f"{name}.argv").read_text())
    return spawn(run_dir, name, recorded["argv"], recorded["env"])


def agent_resources(spec: str, index: int) -> str:
    """The resources of a local cluster's agent number `index` (from 0): its agents share
    one machine, so each gets the ports range(s) of `spec` shifted past the previous agent's,
    and no two tasks are given one host port."""
    match = re.search(r"ports:\[([0-9,\s-]+)\]", spec)
    if match is None or index == 0:
        return spec
    ranges = [tuple(int(x) for x in r.split("-")) for r in match.group(1).split(",")]
    shift = index * (max(hi for _, hi in ranges) - min(lo for lo, _ in ranges) + 1)
    shifted = ",".join(f"{lo + shift}-{hi + shift}" for lo, hi in ranges)
    return spec[:match.start()] + f"ports:[{shifted}]" + spec[match.end():]


def _start_zookeeper(run_dir: Path) -> str:
    """This cluster's own ZooKeeper, on a free port (another cluster's may hold 2181)."""
    from infra.zookeeper import free_ports

    zk_dir = run_dir / "zk"
    subprocess.run([sys.executable, "-m", "infra.zookeeper", "start", "--dir", str(zk_dir),
                    "--port", str(free_ports(1)[0])], check=True, stdout=subprocess.DEVNULL)
    hosts = (zk_dir / "hosts").read_text().strip()
    from kazoo.client import KazooClient

    client = KazooClient(hosts=hosts, timeout=5.0)
    client.start(timeout=15)
    client.ensure_path("/offerbus")
    client.stop()
    client.close()
    return f"zk://{hosts}/offerbus"


def up(opts: UpOptions) -> str:
    run_dir = opts.run_dir.resolve()
    alive = running(run_dir)
    if alive:
        url = (run_dir / "cluster.url").read_text().strip()
        console.print(f"[yellow]a cluster is already up in {run_dir}[/] ({', '.join(alive)}); "
                      f"`offerbus down` stops it")
        return url
    run_dir.mkdir(parents=True, exist_ok=True)
    with console.status("starting ZooKeeper") as status:
        if opts.cluster_url:
            url = opts.cluster_url
        elif opts.standalone:
            url = f"file://{run_dir / 'election'}"
            (run_dir / "election").mkdir(exist_ok=True)
        else:
            url = _start_zookeeper(run_dir)
        (run_dir / "cluster.url").write_text(url + "\n")
        status.update("starting master, allocator, offer-broker")
        common = ["--cluster", url]
        traces = {"OFFERBUS_TRACES_DIR": str(traces_dir(run_dir)),
                  **(curve_env(run_dir) if opts.curve else {})}
        beat = ["--heartbeat", str(opts.heartbeat)]
        for name, argv in central_argv(opts, url):
            spawn(run_dir, name, argv, env=traces)
        for i in range(1, opts.agents + 1):
            name = f"agent-{i}"
            spawn(run_dir, name, [
                "-m", "services.agent", *common, "--work-dir", str(run_dir / "agents" / name),
                "--hostname", name, "--resources", agent_resources(opts.agent_resources, i - 1),
                "--attributes", f"rack:{RACKS[(i - 1) % len(RACKS)]}",
                "--runtime", opts.runtime, *beat], env=traces)
        # `offerbus run` forks its service's framework from it (each framework its own
        # process, in ms rather than a new interpreter's imports). A socket left by a
        # killed one (a machine restart) goes first: `up` then waits for the new one's.
        forkserver.socket_path(run_dir).unlink(missing_ok=True)
        spawn(run_dir, forkserver.PROCESS, ["-m", "frameworks.forkserver", "--run-dir",
                                            str(run_dir)], env=traces)
        state = wait_ready(url, run_dir, opts.agents, opts.timeout, status,
                           expected=opts.elected())
        record_cluster_id(run_dir, state)
        status.update("waiting for the framework fork server")
        forking = wait_socket(forkserver.socket_path(run_dir), FORKSERVER_READY_S)
    if not forking:
        console.print(f"[yellow]the framework fork server is not ready[/] (see "
                      f"{run_dir / 'logs' / 'forkserver.log'}): `offerbus run` starts each "
                      f"framework as a new interpreter meanwhile")
    console.print(f"[green]cluster up[/] in {run_dir}: {central_summary(state)} and "
                  f"{opts.agents} agents; election and registry at {url}")
    console.print(f"  logs: {run_dir / 'logs'}/   state: `offerbus status`, `offerbus agents`")
    if opts.curve:
        keys = run_dir / "keys"
        console.print(f"  CURVE on; operator calls and frameworks need: export "
                      f"OFFERBUS_CURVE_SECRET_KEY_FILE={keys / 'operator.key_secret'} "
                      f"OFFERBUS_CURVE_SERVER_KEY_FILE={keys / 'server.key'}", soft_wrap=True)
    return url


FORKSERVER_READY_S = 20.0  # `up` waits this long for it after the cluster is ready


def wait_socket(path: Path, timeout: float) -> bool:
    """Whether a unix socket is at `path` within `timeout` (the fork server is listening)."""
    deadline = time.monotonic() + timeout
    while not path.is_socket():
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.02)  # polling a condition with a deadline
    return True


def cluster_id_path(run_dir: Path) -> Path:
    return run_dir / "cluster.id"


def record_cluster_id(run_dir: Path, state: dict[str, Any]) -> str:
    """Keep the cluster's id from the master's /state (top-level "cluster_id") in
    <run-dir>/cluster.id; "" (nothing written) when the master does not publish it."""
    cid = str(state.get("cluster_id") or "")
    if cid:
        cluster_id_path(run_dir).write_text(cid + "\n")
    return cid


def known_cluster_id(run_dir: Path) -> str:
    """The id `up` recorded; else asked of this run dir's leading master (1 s), if any."""
    path = cluster_id_path(run_dir)
    if path.exists():
        return path.read_text().strip()
    url_file = run_dir / "cluster.url"
    if not url_file.exists() or not running(run_dir):
        return ""
    try:
        leader = find_leader(url_file.read_text().strip(), timeout=1.0)
        return record_cluster_id(run_dir, http_get(
            leader.endpoints["http"] + state_path("tasks=0&agents=0"), 2.0))
    except (CliError, OSError, ValueError, KeyError):
        return ""


def stop_process(run_dir: Path, name: str, timeout: float = 10.0) -> bool:
    """Stop one process of this run dir for good (SIGTERM to its group, SIGKILL after
    `timeout`) and forget its pid and argv files. True if it was running."""
    pid = running(run_dir).get(name)
    pid_file = _pids_dir(run_dir) / f"{name}.pid"
    (_pids_dir(run_dir) / f"{name}.argv").unlink(missing_ok=True)  # no respawn after this
    if pid is None:
        pid_file.unlink(missing_ok=True)
        return False
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout
    while _alive(pid) and time.monotonic() < deadline:
        time.sleep(0.05)  # polling process exit with a deadline
    if _alive(pid):
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pid, signal.SIGKILL)
    pid_file.unlink(missing_ok=True)
    child = _children.pop((run_dir.resolve(), name), None)
    if child is not None:
        child.poll()
    return True


def wait_ready(url: str, run_dir: Path, agents: int, timeout: float,
               status: object, expected: dict[str, int] | None = None) -> dict[str, Any]:
    """Wait until every central role has its leader and, where the election lists its
    members (ZooKeeper), all `expected[role]` members (the standbys stand), and `agents`
    agents are registered. The master's /state, with "central": {role: {"leader": id,
    "standbys": [ids] (None: the election cannot list them)}}."""
    deadline = time.monotonic() + timeout
    expected = expected or {role: 1 for role in CENTRAL}
    last = ""
    with ElectionView(url) as election:
        while time.monotonic() < deadline:
            dead = [n for (d, n), proc in _children.items()
                    if d == run_dir.resolve() and proc.poll() is not None]
            if dead:
                raise CliError(f"{', '.join(dead)} exited during start-up; see "
                               f"{run_dir / 'logs'}/{dead[0]}.log")
            try:
                central = _central_view(url, election, expected)
                short = [f"{role} {len(v['standbys'] or []) + 1}/{expected[role]}"
                         for role, v in central.items()
                         if v["standbys"] is not None
                         and len(v["standbys"]) + 1 < expected[role]]
                leader = find_leader(url, timeout=1.0)
                state = http_get(leader.endpoints["http"] + state_path("tasks=0"), timeout=2.0)
                registered = sum(1 for a in state.get("agents", [])
                                 if a.get("status") == "AGENT_STATUS_REGISTERED")
                last = f"{registered}/{agents} agents registered" + (
                    f"; in the election: {', '.join(short)}" if short else "")
                if registered >= agents and not short:
                    return {**state, "central": central}
            except CliError as exc:
                last = str(exc)
            if hasattr(status, "update"):
                status.update(f"waiting for the cluster: {last}")
            time.sleep(0.2)  # polling a condition with a deadline
    raise CliError(f"the cluster was not ready within {timeout:g}s: {last}; see "
                   f"{run_dir / 'logs'}/")


def _central_view(url: str, election: ElectionView,
                  expected: dict[str, int]) -> dict[str, dict[str, Any]]:
    out: dict[str, dict[str, Any]] = {}
    for role in expected:
        leader = find_leader(url, timeout=1.0, role=role)
        members = election.members(role)
        out[role] = {"leader": leader.member_id, "epoch": leader.epoch,
                     "standbys": None if members is None else
                     [m.member_id for m in members if m.member_id != leader.member_id]}
    return out


def central_summary(state: dict[str, Any]) -> str:
    """"master-1 (+1 standby), allocator-1, ..." from wait_ready's "central"."""
    parts = []
    for role, v in state.get("central", {}).items():
        standbys = v.get("standbys")
        more = "" if not standbys else f" (+{len(standbys)} standby: {', '.join(standbys)})"
        parts.append(f"{role} {v['leader']}{more}")
    return ", ".join(parts) or "master, allocator, offer-broker"


def _checkpointed_executors(run_dir: Path) -> list[Any]:
    from services.agent.checkpoint import AgentCheckpoint

    out: list[Any] = []
    for work_dir in sorted((run_dir / "agents").glob("*")):
        try:
            state = AgentCheckpoint(work_dir).load_state()
        except Exception:
            continue
        out.extend(state.executors if state is not None else [])
    return out


def executor_pids(run_dir: Path) -> dict[str, int]:
    """Executors run detached from their agent (they survive its restarts): find them in
    the agents' checkpoints."""
    return {f"executor {ex.executor_id}": ex.pid for ex in _checkpointed_executors(run_dir)
            if ex.pid and _alive(ex.pid)}


def executor_ids(run_dir: Path) -> set[str]:
    """The executors this run dir's agents checkpointed (each id ends in a random part, so
    it names one cluster's executor, unlike agent ids before cluster-unique ids)."""
    return {ex.executor_id for ex in _checkpointed_executors(run_dir) if ex.executor_id}


def down(run_dir: Path, timeout: float = 15.0) -> None:
    run_dir = run_dir.resolve()
    cluster_id = known_cluster_id(run_dir)  # before its master stops
    procs = running(run_dir)
    executors = executor_ids(run_dir)
    for name, pid in executor_pids(run_dir).items():
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            continue
        procs.setdefault(name, pid)
    with console.status(f"stopping {len(procs)} processes") as status:
        for pid in procs.values():
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pid, signal.SIGTERM)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and any(_alive(p) for p in procs.values()):
            time.sleep(0.05)  # polling process exit with a deadline
        for name, pid in procs.items():
            if _alive(pid):
                console.print(f"[yellow]{name} did not stop in {timeout:g}s; killing it[/]")
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(pid, signal.SIGKILL)
        status.update("removing task containers")
        removed = remove_task_containers(cluster_id, executors | executor_ids(run_dir))
        if (run_dir / "zk").exists():
            status.update("stopping ZooKeeper")
            subprocess.run([sys.executable, "-m", "infra.zookeeper", "stop", "--dir",
                            str(run_dir / "zk")], stdout=subprocess.DEVNULL, check=False)
    for pid_file in _pids_dir(run_dir).glob("*.pid"):
        pid_file.unlink()
    for key in [k for k in _children if k[0] == run_dir]:
        _children.pop(key).poll()
    # The containers are gone, so is the cluster: its registry (ZooKeeper data or election
    # files), agents' checkpoints, framework specs and traces go too, or the next `up` would
    # recover tasks that no longer exist. Logs stay for reading.
    for part in STATE_PARTS:
        shutil.rmtree(run_dir / part, ignore_errors=True)
    (run_dir / "cluster.url").unlink(missing_ok=True)
    forkserver.socket_path(run_dir).unlink(missing_ok=True)  # left by a killed server
    cluster_id_path(run_dir).unlink(missing_ok=True)
    console.print(f"[green]cluster down[/]: {len(procs)} processes stopped, "
                  f"{removed} containers removed; state cleared (logs kept in "
                  f"{run_dir / 'logs'})")


def owned(labels: dict[str, str], cluster_id: str, executors: set[str]) -> bool:
    """A container is this cluster's when it carries the cluster's id, or was started by
    one of this run dir's checkpointed executors. Never "any Offerbus container"."""
    from services.executor.runtime import LABEL_CLUSTER, LABEL_EXECUTOR

    if cluster_id and labels.get(LABEL_CLUSTER) == cluster_id:
        return True
    return bool(labels.get(LABEL_EXECUTOR)) and labels.get(LABEL_EXECUTOR) in executors


def remove_task_containers(cluster_id: str, executors: set[str]) -> int:
    """The containers of this cluster only (see `owned`), other clusters' stay."""
    from services.executor.runtime import LABEL_TASK

    try:
        import docker

        client = docker.from_env(timeout=30)
        # The low-level list: no inspect per container (one removed meanwhile is no error).
        listed = client.api.containers(all=True, filters={"label": LABEL_TASK})
    except Exception:
        return 0
    mine = [c["Id"] for c in listed if owned(dict(c.get("Labels") or {}), cluster_id, executors)]
    for cid in mine:
        with contextlib.suppress(Exception):
            client.api.remove_container(cid, force=True)
    client.close()
    return len(mine)
