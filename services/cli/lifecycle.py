"""A service's lifecycle from the operator's side: `offerbus run` (refuses a name in use,
starts the service framework, shows live progress and waits while progress is made),
`offerbus scale` and `offerbus stop` (the master removes the framework and its tasks, then
its process and spec go). The decisions (is the name free, is the run progressing or
stalled) are pure functions of the master's /state; a thin layer polls and acts."""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

from rich.console import Console
from rich.markup import escape

from schemas import operator_pb2
from services import tasks as task_states
from services.cli import cluster
from services.cli.client import (
    CliError,
    cluster_url,
    http_get_if_changed,
    master_state,
    operator_call,
    state_path,
)

Doc = dict[str, Any]
EXIT_NAME_IN_USE = 2  # a usage error, as argparse's
DEFAULT_STALL_S = 60.0
POLL_S = 0.5  # the longest wait between two looks at the master's /state
POLL_MIN_S = 0.1  # ... the shortest, polling a master that answers an unchanged one at once
POLL_GAP_S = 0.02  # from a changed answer to the next request (bounds a follower's rate)
SHOWN_STATES = ("RUNNING", "STARTING", "STAGING", "KILLING", "UNREACHABLE")


# -- pure decisions -----------------------------------------------------------------------
def frameworks_named(state: Doc, name: str) -> list[str]:
    """The ids of the frameworks registered with the master under this name."""
    return [f["framework_info"].get("framework_id", "") for f in state.get("frameworks", [])
            if f.get("framework_info", {}).get("name") == name]


def name_in_use(name: str, state: Doc, spec_exists: bool,
                process_alive: bool = True) -> str | None:
    """Why `run --name NAME` must be refused, or None when it may go on: the name is free,
    or it is this run dir's service whose framework process is gone (a machine restart):
    `run` then resumes it (see `resuming`)."""
    if spec_exists and not process_alive:
        return None
    fids = frameworks_named(state, name)
    if fids:
        return (f"a framework named {name!r} is registered with the master "
                f"({', '.join(fids)})")
    if spec_exists:
        return f"a service named {name!r} exists in this run dir"
    return None


def resuming(name: str, state: Doc, spec_exists: bool, process_alive: bool) -> str | None:
    """What `run --name NAME` says when it resumes this run dir's service, whose framework
    process is gone: its new process fails over with the framework's id (kept in the
    service's status file), so its tasks that still run are its own again."""
    if not spec_exists or process_alive:
        return None
    fids = frameworks_named(state, name)
    known = (f"framework {', '.join(fids)} fails over to it" if fids else
             "the master no longer knows its framework: it registers anew")
    return (f"resuming service {name}: its framework process is not running (was the "
            f"machine restarted?); a new one starts, and {known}")


def service_query(name: str) -> str:
    """The /state a run or stop polls: the frameworks of this name, the counts of their
    tasks by state and the allocator's latest decision on them, no task or agent list (see
    services/master/view.py)."""
    return urlencode({"framework_name": name, "tasks": 0, "agents": 0, "decisions": 1})


# The allocator's outcomes that keep offers from a framework (internal.proto), said in a
# waiting run's progress line once it made no progress for SAY_WAITING_AFTER_S.
WAITING_OUTCOMES = frozenset(("OUTCOME_FAIR_SHARE", "OUTCOME_NO_FIT", "OUTCOME_QUOTA_LIMIT",
                              "OUTCOME_FILTERED", "OUTCOME_INACTIVE", "OUTCOME_SUPPRESSED"))
SAY_WAITING_AFTER_S = 1.0
MAX_SAID_CHARS = 200


def allocator_says(state: Doc, name: str) -> str:
    """"; allocator: REASON" when the allocator's latest decision on the service's framework
    keeps offers from it (fair share: revocations under way, nothing fits, a quota limit,
    its filters, not subscribed), else "": what a run waits for, in its progress line."""
    fids = set(frameworks_named(state, name))
    for d in state.get("decisions", []):
        if d.get("framework_id") in fids and d.get("outcome") in WAITING_OUTCOMES:
            reason = str(d.get("reason", "")) or str(d.get("outcome"))
            if len(reason) > MAX_SAID_CHARS:
                reason = reason[:MAX_SAID_CHARS - 1] + "…"
            return f"; allocator: {reason}"
    return ""


def _task_states(state: Doc, name: str) -> Counter[str]:
    """The states of the tasks of the frameworks named `name`: from the task list, or from
    `task_counts` when the master filtered the document to that name (service_query)."""
    if "tasks" not in state and state.get("filter", {}).get("framework_name") == [name]:
        return Counter({str(k): int(v) for k, v in state.get("task_counts", {}).items()})
    fids = set(frameworks_named(state, name))
    return Counter(t.get("status", {}).get("state", "") for t in state.get("tasks", [])
                   if t.get("framework_id") in fids)


def service_counts(state: Doc, name: str, want: int) -> Counter[str]:
    """The service's instances by state: live tasks by their state, `pending` for instances
    not launched yet, `ended` for attempts that ended (restarts, failures)."""
    counts: Counter[str] = Counter()
    for text, n in _task_states(state, name).items():
        if task_states.is_active_name(text):
            counts[text.removeprefix("TASK_")] += n
        elif task_states.is_terminal_name(text):
            counts["ended"] += n
    live = sum(counts[s] for s in SHOWN_STATES)
    if want > live:
        counts["pending"] = want - live
    return counts


def summary(counts: Counter[str]) -> str:
    """'12 running, 30 staging, 8 pending' (and ended attempts last)."""
    order = [*SHOWN_STATES, "pending", "ended"]
    return ", ".join(f"{counts[s]} {s.lower()}" for s in order if counts.get(s)) or "nothing yet"


@dataclass
class Progress:
    """Is a `run` still getting somewhere? Progress is a new best for the instances running,
    started (running or starting) or launched (live); a crash loop makes none. Stalled after
    `stall_s` without progress; out of time after `timeout_s` (None: no limit)."""

    want: int
    started_at: float
    stall_s: float = DEFAULT_STALL_S
    timeout_s: float | None = None
    best: tuple[int, int, int] = (0, 0, 0)
    last_progress: float = field(default=0.0)

    def __post_init__(self) -> None:
        self.last_progress = self.started_at

    def observe(self, counts: Counter[str], now: float) -> str:
        """'done', 'waiting', 'stalled' or 'timeout'."""
        running = counts.get("RUNNING", 0)
        if running >= self.want:
            return "done"
        now_score = (running, running + counts.get("STARTING", 0),
                     sum(counts.get(s, 0) for s in SHOWN_STATES))
        if any(n > b for n, b in zip(now_score, self.best, strict=True)):
            self.best = tuple(max(n, b) for n, b in zip(now_score, self.best, strict=True))  # type: ignore[assignment]
            self.last_progress = now
        if self.timeout_s is not None and now - self.started_at >= self.timeout_s:
            return "timeout"
        if now - self.last_progress >= self.stall_s:
            return "stalled"
        return "waiting"


def parse_env(items: list[str]) -> dict[str, str]:
    out = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise CliError(f"bad --env {item!r}: use KEY=VALUE")
        out[key] = value
    return out


# -- the thin layer -----------------------------------------------------------------------
class StatePoller:
    """The master's /state (filtered by `query`), polled: the leader is looked up once (a
    ZooKeeper session each time would be costly) and again only when its address stops
    answering; a document unchanged since the last poll is not sent again (ETag).

    `next()` follows the document: after the first, each request asks the master to hold
    its answer until the document changes, for up to POLL_S (`Prefer: wait`), so a change
    is seen as it happens, not up to a poll interval later; after a changed answer the
    next request waits POLL_GAP_S (changes in a burst come together); a master that
    answers an unchanged document at once is polled with a backoff instead."""

    def __init__(self, url: str, timeout: float, query: str = "") -> None:
        self.url, self.timeout, self.query = url, timeout, query
        self.leader: Any = None
        self.doc: Doc | None = None
        self.etag = ""
        self.backoff = Backoff()
        self._pause = 0.0  # before next()'s request

    def __call__(self) -> Doc:
        return self._get(0.0)[0]

    def next(self) -> Doc:
        """The document, once it changed or POLL_S passed (the first: at once)."""
        if self._pause:
            time.sleep(self._pause)  # pacing: a changed answer just came, or no holding
        asked = time.monotonic()
        wait = POLL_S if self.etag and self.doc is not None else 0.0
        doc, changed = self._get(wait)
        held = time.monotonic() - asked >= wait / 2
        self._pause = POLL_GAP_S if changed else 0.0 if held else self.backoff.next(False)
        if changed:
            self.backoff.next(True)
        return doc

    def _get(self, wait: float) -> tuple[Doc, bool]:
        """(the document, whether it is another than the last one)."""
        if self.leader is not None:
            try:
                got = http_get_if_changed(self.leader.endpoints["http"] + state_path(
                    self.query), self.timeout, self.etag if self.doc is not None else "",
                    wait)
                if got is None and self.doc is not None:
                    return self.doc, False
                if got is not None and isinstance(got[0], dict) and got[0].get(
                        "leading", True) is not False:
                    self.doc, self.etag = got
                    return got[0], True
            except CliError:
                pass
        self.leader, doc = master_state(self.url, self.timeout, self.query)
        self.doc, self.etag = doc, ""
        return doc, True


@dataclass
class Backoff:
    """How long to wait before the next poll: `low` right after a change, doubling while
    nothing changes, up to `high`."""

    low: float = POLL_MIN_S
    high: float = POLL_S
    delay: float = 0.0

    def next(self, changed: bool) -> float:
        self.delay = self.low if changed or not self.delay else min(2 * self.delay,
                                                                     self.high)
        return self.delay


class Reporter:
    """Live progress: a spinner line on a terminal, a printed line per change otherwise."""

    def __init__(self, console: Console, title: str) -> None:
        self.console = console
        self.last = ""
        self.status = console.status(title) if console.is_terminal else None

    def __enter__(self) -> Reporter:
        if self.status is not None:
            self.status.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        if self.status is not None:
            self.status.__exit__(None, None, None)

    def show(self, text: str) -> None:
        """`text` as written (an engine's message may hold brackets rich takes for markup)."""
        if text == self.last:
            return
        self.last = text
        if self.status is not None:
            self.status.update(escape(text))
        else:
            self.console.print(text, highlight=False, markup=False)


MAX_FAILURE_CHARS = 300  # of a failure's message in a progress line


def recorded_frameworks(spec: Path) -> set[str]:
    """The framework id in the status file of spec file `spec`, as a set (empty when there is
    none, or the file is unreadable)."""
    from frameworks import spec as specs

    try:
        doc = json.loads(specs.status_path(spec).read_text())
    except (OSError, ValueError):
        return set()
    fid = doc.get("framework_id") if isinstance(doc, dict) else None
    return {fid} if isinstance(fid, str) and fid else set()


def last_failure(run_dir: Path, name: str) -> str:
    """"; last failure TASK: STATE (REASON): MESSAGE" from the local service framework's
    status file, or "" (none yet, or the file unreadable: a progress line never fails)."""
    from frameworks import spec as specs

    try:
        doc = json.loads(specs.status_path(specs.spec_path(run_dir.resolve(), name))
                         .read_text())
        f = doc.get("last_failure") if isinstance(doc, dict) else None
        if not isinstance(f, dict):
            return ""
        message = str(f.get("message") or "")
        if len(message) > MAX_FAILURE_CHARS:
            message = message[:MAX_FAILURE_CHARS] + "..."
        return (f"; last failure {f.get('task_id', '?')}: {f.get('state', '?')} "
                f"({f.get('reason', '?')})" + (f": {message}" if message else ""))
    except (OSError, ValueError):
        return ""


def _stuck(args: argparse.Namespace, url: str, name: str) -> str:
    """What `why` says about the service (best effort), from the master's whole /state."""
    from services.cli import why  # only a stalled run says it (its imports: ~30 ms)

    try:
        _, state = master_state(url, args.timeout)
        fid = why.resolve_framework(name, state)
        decisions = why.fetch_decisions(url, fid, args.timeout) if fid else []
        spans = why.load_spans(args.run_dir / "traces")
        statuses = why.load_statuses(args.run_dir / "frameworks")
        return " ".join(why.explain(name, decisions, state, spans, statuses, time.time()))
    except CliError as exc:
        return f"(why: {exc})"


def cmd_run(args: argparse.Namespace, console: Console) -> int:
    # frameworks.spec, not frameworks.service: the service's scheduler brings the whole SDK
    # (OpenTelemetry's, ZeroMQ's, ~70 ms), which its own process imports, not this one.
    from frameworks.spec import ServiceSpec

    spec = ServiceSpec(
        name=args.name, image=args.image, instances=args.instances, cpus=args.cpus,
        mem=args.mem, command=args.cmd, constraints=args.constraint or [],
        runtime="docker" if args.image else "process", role=args.role,
        env=parse_env(args.env or []), ports=args.port or [],
        health_cmd=args.health_cmd or "", health_http=args.health_http or "",
        health_interval_s=args.health_interval, health_failures=args.health_failures)
    return start_service(args, console, spec)


def start_service(args: argparse.Namespace, console: Console, spec: Any) -> int:
    """Start the service framework of `spec` (a frameworks.spec.ServiceSpec), as
    `offerbus run` does (and `offerbus job run`): refused when its name is in use, resumed
    when this run dir's process of it is gone; then waits (unless --no-wait)."""
    from frameworks import spec as specs

    run_dir = args.run_dir.resolve()
    url = cluster_url(args.cluster, args.run_dir)
    _, state = master_state(url, args.timeout)
    proc_name = f"framework-{args.name}"
    exists = specs.spec_path(run_dir, args.name).exists()
    alive = proc_name in cluster.running(run_dir)
    used = name_in_use(args.name, state, exists, alive)
    if used:
        console.print(f"[red]offerbus: {used}.[/] Change its size with `offerbus scale "
                      f"{args.name} N`, or remove it with `offerbus stop {args.name}` "
                      f"first.", highlight=False)
        return EXIT_NAME_IN_USE
    resume = resuming(args.name, state, exists, alive)
    if resume:
        console.print(resume, highlight=False)
    try:
        spec_path = specs.write_spec(run_dir, spec)
    except ValueError as exc:
        raise CliError(str(exc)) from exc
    pid = cluster.spawn(run_dir, proc_name, [
        "-m", "frameworks.service", "--cluster", url, "--spec", str(spec_path)])
    console.print(f"framework {args.name} started (pid {pid}); spec {spec_path}")
    if args.no_wait:
        return 0
    return wait_running(args, console, url, spec.instances, pid)


def wait_running(args: argparse.Namespace, console: Console, url: str, want: int,
                 pid: int | None) -> int:
    """Until `want` instances of service `args.name` run, showing progress; `pid`: its
    framework process on this machine (None: a job, its framework in the cluster)."""
    name = args.name
    log = (args.run_dir / "logs" / f"framework-{name}.log" if pid is not None
           else "`offerbus job list`")
    now = time.monotonic()
    progress = Progress(want, now, stall_s=args.stall, timeout_s=args.wait_timeout)
    poll = StatePoller(url, args.timeout, service_query(name))
    with Reporter(console, f"waiting for {want} instances of {name}") as shown:
        while True:
            if pid is not None and not cluster.alive(pid):
                raise CliError(f"the {name} framework exited; see {log}")
            # The master's state as it changes (held until then: StatePoller.next).
            doc = poll.next()
            counts = service_counts(doc, name, want)
            failure = last_failure(args.run_dir, name) if pid is not None and \
                counts.get("ended") else ""
            quiet = time.monotonic() - progress.last_progress >= SAY_WAITING_AFTER_S
            waiting = allocator_says(doc, name) if quiet and counts.get("pending") else ""
            shown.show(f"{name}: {summary(counts)}{failure}{waiting}")
            verdict = progress.observe(counts, time.monotonic())
            if verdict == "done":
                console.print(f"[green]{name}: {want} instances RUNNING[/]")
                return 0
            if verdict in ("stalled", "timeout"):
                when = (f"no progress for {args.stall:g}s" if verdict == "stalled" else
                        f"not done within --timeout {args.wait_timeout:g}s")
                stuck = _stuck(args, url, name)
                raise CliError(f"{name}: {when} ({summary(counts)}){failure}. {stuck} See "
                               f"`offerbus why {name}`, `offerbus tasks --all` and {log}")


def cmd_scale(args: argparse.Namespace, console: Console) -> int:
    from frameworks import spec as specs

    try:
        spec = specs.read_spec(args.run_dir.resolve(), args.name)
        spec.instances = args.instances
        specs.write_spec(args.run_dir.resolve(), spec)
    except ValueError as exc:
        raise CliError(str(exc)) from exc
    console.print(f"{args.name}: scaling to {args.instances} instances")
    return 0


def executors_of(state: Doc, fids: set[str]) -> set[str]:
    """The executor ids the master's /state names for these frameworks' tasks."""
    return {t.get("status", {}).get("executor_id", "") for t in state.get("tasks", [])
            if t.get("framework_id") in fids} - {""}


def containers_of(fids: set[str], cluster_id: str, executors: set[str]) -> int | None:
    """How many containers of these frameworks, of this cluster, are left (None: no Docker
    engine). Framework ids alone may repeat across clusters: ownership is checked too."""
    from services.executor.runtime import LABEL_FRAMEWORK

    try:
        import docker

        client = docker.from_env(timeout=10)
        try:
            return sum(1 for fid in fids for c in client.api.containers(
                all=True, filters={"label": f"{LABEL_FRAMEWORK}={fid}"})
                if cluster.owned(dict(c.get("Labels") or {}), cluster_id, executors))
        finally:
            client.close()
    except Exception:
        return None


def teardown(url: str, args: argparse.Namespace, fid: str, proc_pid: int | None,
             console: Console) -> str:
    """Ask the master to remove the framework; a master that does not know the call yet
    gets the framework's own teardown instead (SIGUSR1 to its process in this run dir)."""
    call = operator_pb2.OperatorCall()
    call.teardown_framework.framework_id = fid
    leader, _ = master_state(url, args.timeout)
    try:
        event = operator_call(leader, call, args.timeout)
        return event.done.message or f"framework {fid} removed"
    except CliError as exc:
        if proc_pid is None:
            raise
        console.print(f"[yellow]the master did not remove {fid} ({exc}); asking the "
                      f"framework to tear itself down[/]", highlight=False)
        os.kill(proc_pid, signal.SIGUSR1)
        return f"framework {fid} tearing itself down"


def wait_until(check: Callable[[], str | None], timeout: float, shown: Reporter) -> None:
    """Poll `check` (None: done; else what is left) until done or `timeout`."""
    deadline = time.monotonic() + timeout
    while True:
        left = check()
        if left is None:
            return
        shown.show(left)
        if time.monotonic() >= deadline:
            raise CliError(f"not done within {timeout:g}s: {left}")
        time.sleep(POLL_S)  # polling with a deadline


def cmd_stop(args: argparse.Namespace, console: Console) -> int:
    from frameworks import spec as specs

    run_dir = args.run_dir.resolve()
    name = args.name
    url = cluster_url(args.cluster, args.run_dir)
    _, state = master_state(url, args.timeout)
    fids = set(frameworks_named(state, name))
    spec = specs.spec_path(run_dir, name)
    proc = f"framework-{name}"
    pid = cluster.running(run_dir).get(proc)
    if not fids and not spec.exists() and pid is None:
        raise CliError(f"no service {name!r}: no framework of that name is registered and "
                       f"{spec} does not exist")
    # The framework this run dir's service last ran as: the master may have removed it
    # already (a stop that timed out before this one), and its containers may still run.
    recorded = recorded_frameworks(spec)
    timeout = args.wait_timeout or 60.0
    cluster_id = str(state.get("cluster_id") or cluster.known_cluster_id(run_dir))
    executors = executors_of(state, fids) | cluster.executor_ids(run_dir)
    with Reporter(console, f"stopping {name}") as shown:
        for fid in sorted(fids):
            shown.show(teardown(url, args, fid, pid, console))
        if pid is not None:  # before waiting: no framework of this name can come after
            shown.show(f"{name}: stopping its framework process {pid}")
            cluster.stop_process(run_dir, proc, timeout=10.0)

        poll = StatePoller(url, args.timeout, service_query(name))
        unchecked: list[bool] = []

        def left() -> str | None:
            now_state = poll()
            named = set(frameworks_named(now_state, name))
            # Registered after the first look (a `run --no-wait` still starting): its
            # tasks would have outlived the stop.
            for fid in sorted(named - fids):
                shown.show(teardown(url, args, fid, None, console))
                fids.add(fid)
                executors.update(executors_of(now_state, {fid}))
            still = fids & named
            containers = containers_of(fids | recorded, cluster_id, executors)
            if containers is None:  # no Docker engine here: say so, do not claim "gone"
                unchecked.append(True)
                containers = 0
            if not still and not containers:
                return None
            return (f"{name}: {len(still)} framework(s) registered, {containers} "
                    f"container(s) left")

        wait_until(left, timeout, shown)
    if pid is None:  # no process was running: its pid and argv files go all the same
        cluster.stop_process(run_dir, proc)
    for path in (spec, specs.status_path(spec), specs.lock_path(spec)):
        with contextlib.suppress(FileNotFoundError):
            path.unlink()
    gone = ("its containers were not checked (no Docker engine reachable from here)"
            if unchecked else "its containers gone")
    console.print(f"[green]{name} stopped[/]: framework {', '.join(sorted(fids)) or '-'} "
                  f"removed, {gone}, spec {spec} removed", highlight=False)
    return 0


def add_parsers(sub: Any) -> None:
    p = sub.add_parser(
        "run", help="run N instances of a container as a service",
        description="Start a service framework keeping N instances running. Refuses a name "
        f"in use (exit code {EXIT_NAME_IN_USE}): use `offerbus scale NAME N` or `offerbus "
        "stop NAME`. Waits, showing progress, while the instances keep getting placed and "
        f"started; fails (exit 1) after --stall seconds without progress (default "
        f"{DEFAULT_STALL_S:g}) or after --timeout seconds (default: no limit), saying what "
        "is stuck.")
    p.add_argument("--name", required=True)
    p.add_argument("--image", default="", help="Docker image (empty: a plain process)")
    p.add_argument("--instances", type=int, default=1)
    p.add_argument("--cpus", type=float, default=0.1)
    p.add_argument("--mem", type=float, default=32)
    p.add_argument("--role", default="*", help="the framework's role (default *)")
    p.add_argument("--env", action="append", metavar="K=V", help="container environment")
    p.add_argument("--port", action="append", type=int, metavar="N",
                   help="publish container port N on a host port from the offer's ports "
                        "(env PORT0.. and PORT_<N> name the host port)")
    p.add_argument("--health-cmd", help="a shell command: healthy when it exits 0")
    p.add_argument("--health-http", metavar="PATH",
                   help="an HTTP path checked on the first published port")
    p.add_argument("--health-interval", type=float, default=10.0, help="seconds")
    p.add_argument("--health-failures", type=int, default=3,
                   help="consecutive failures before the task is killed and replaced")
    p.add_argument("--constraint", action="append",
                   help='placement: "hostname:unique" or "rack:a" (attribute match)')
    p.add_argument("--no-wait", action="store_true")
    p.add_argument("--stall", type=float, default=DEFAULT_STALL_S,
                   help="fail after this many seconds without progress")
    p.add_argument("--timeout", dest="wait_timeout", type=float, default=None,
                   help="fail if not all running after this many seconds (default: none)")
    p.add_argument("cmd", nargs=argparse.REMAINDER, help="-- command and args")
    p = sub.add_parser("scale", help="change a service's number of instances")
    p.add_argument("name")
    p.add_argument("instances", type=int)
    p = sub.add_parser("stop", help="remove a service: its framework, tasks and containers")
    p.add_argument("name")
    p.add_argument("--timeout", dest="wait_timeout", type=float, default=60.0,
                   help="seconds to wait for the framework and its containers to go")
