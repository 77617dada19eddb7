"""`offerbus`: the operator's command line."""

from __future__ import annotations

import argparse
import os
import sys
import urllib.parse
from collections import Counter
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.markup import escape

from schemas import agent_pb2, operator_pb2
from services import tasks as task_states
from services.cli import chaos as chaos_cli
from services.cli import cluster, follow, lifecycle, profiles, trace, views, why
from services.cli.client import (
    RUN_DIR_DEFAULT,
    CliError,
    ElectionView,
    cluster_url,
    find_leader,
    http_get,
    master_state,
    operator_call,
)
from services.resources import Resources
from services.roles import role_error

console = Console()


def _find_task(state: dict[str, Any], task_id: str) -> dict[str, Any]:
    matches = [t for t in state.get("tasks", []) if t["task_info"]["task_id"] == task_id]
    if not matches:
        raise CliError(f"no task {task_id!r} (see `offerbus tasks --all`)")
    if len(matches) > 1:
        raise CliError(f"task id {task_id!r} is used by several frameworks; pass --framework")
    return matches[0]


def _counts(counts: Counter[str]) -> str:
    return ", ".join(f"{n} {name}" for name, n in sorted(counts.items()))


def cmd_up(args: argparse.Namespace) -> int:
    cluster.up(cluster.UpOptions(run_dir=args.run_dir, agents=args.agents, masters=args.masters,
                                 standbys=args.standbys, agent_resources=args.agent_resources,
                                 standalone=args.standalone, runtime=args.runtime,
                                 curve=args.curve, jobs=not args.no_jobs))
    return 0


def cmd_down(args: argparse.Namespace) -> int:
    cluster.down(args.run_dir)
    return 0


def status_doc(url: str, leader: Any, state: dict[str, Any], others: dict[str, Any],
               standbys: dict[str, list[str] | None] | None = None) -> dict[str, Any]:
    """`offerbus status --json`: leaders, standbys (per role; None when the election cannot
    list them), and counts of agents, frameworks and tasks."""
    agents = Counter(a.get("status", "").removeprefix("AGENT_STATUS_").lower()
                     for a in state.get("agents", []))
    return {"cluster": url, "cluster_id": state.get("cluster_id", ""),
            "leaders": {"master": {"id": leader.member_id, "epoch": leader.epoch,
                                   "http": leader.endpoints.get("http", "")},
                        **{role: (None if o is None else {"id": o.member_id, "epoch": o.epoch})
                           for role, o in others.items()}},
            "standbys": dict(standbys or {}),
            "agents": dict(agents), "frameworks": len(state.get("frameworks", [])),
            "tasks": {s.lower(): n for s, n in views.task_counts(state).items()}}


def standbys_of(url: str, run_dir: Path, leaders: dict[str, Any]) -> dict[str, list[str] | None]:
    """Who stands by for each role: the election's other members (ZooKeeper); for a
    standalone election, this run dir's running processes of the role that do not lead;
    None when neither can tell."""
    out: dict[str, list[str] | None] = {}
    try:
        with ElectionView(url, timeout=2.0) as election:
            for role, leader in leaders.items():
                members = election.members(role)
                lead = None if leader is None else leader.member_id
                out[role] = None if members is None else [
                    m.member_id for m in members if m.member_id != lead]
    except CliError:
        return {role: None for role in leaders}
    running = cluster.running(run_dir) if run_dir.exists() else {}
    for role, leader in leaders.items():
        if out.get(role) is None and running:
            lead = None if leader is None else leader.member_id
            names = [n for n in running if n == role or n.startswith(f"{role}-")]
            ids = [cluster.member_id_of(run_dir, n) for n in names]
            out[role] = sorted(i for i in ids if i and i != lead) or None
    return out


def cmd_status(args: argparse.Namespace) -> int:
    url = cluster_url(args.cluster, args.run_dir)
    leader, state = master_state(url, args.timeout)
    others: dict[str, Any] = {}
    for role in ("allocator", "broker", "jobs"):
        try:
            others[role] = find_leader(url, 1.0, role)
        except CliError:
            others[role] = None
    standbys = standbys_of(url, args.run_dir, {"master": leader, **others})
    doc = status_doc(url, leader, state, others, standbys)
    if args.json:
        views.print_json(console, doc)
        return 0

    def by(role: str) -> str:
        ids = standbys.get(role)
        return "" if ids is None else (f"; standing by: {', '.join(ids)}" if ids
                                       else "; [yellow]no standby[/]")

    console.print(f"cluster {url}" + (f" (id {doc['cluster_id']})" if doc["cluster_id"] else ""))
    console.print(f"  master     {leader.member_id} (epoch {leader.epoch}) "
                  f"{leader.endpoints['http']}{by('master')}")
    for role, other in others.items():
        if other is None:
            console.print(f"  {role:<10} [red]no leader[/]{by(role)}")
        else:
            console.print(f"  {role:<10} {other.member_id} (epoch {other.epoch}){by(role)}")
    agents = Counter(doc["agents"])
    console.print(f"  agents     {sum(agents.values())} ({_counts(agents)})")
    console.print(f"  frameworks {doc['frameworks']}")
    console.print(f"  tasks      {_counts(Counter(doc['tasks'])) or 'none'}")
    return 0


def cmd_table(args: argparse.Namespace) -> int:
    _, state = master_state(cluster_url(args.cluster, args.run_dir), args.timeout)
    if args.command == "agents":
        rows, tbl = views.agent_rows(state), views.agents_table(state)
    elif args.command == "frameworks":
        rows, tbl = views.framework_rows(state), views.frameworks_table(state)
    else:
        rows, tbl = views.task_rows(state, args.all), views.tasks_table(state, args.all)
    if args.json:
        views.print_json(console, rows)
    else:
        console.print(tbl)
    return 0


def cmd_roles(args: argparse.Namespace) -> int:
    if args.what:
        if args.what[0] == "quota":
            return _set_quota(args)
        return _set_weight(args)
    url = cluster_url(args.cluster, args.run_dir)
    allocator = find_leader(url, args.timeout, role="allocator")
    doc = http_get(allocator.endpoints["http"] + "/roles", args.timeout)
    if not isinstance(doc, dict) or "roles" not in doc:
        raise CliError(f"the allocator {allocator.member_id} does not serve /roles yet")
    if doc.get("leading") is False:
        raise CliError(f"the allocator {allocator.member_id} is not leading (yet); try again")
    try:
        _, state = master_state(url, args.timeout)
    except CliError:
        state = None  # frameworks then shown by id
    if args.json:
        views.print_json(console, views.role_rows(doc, state))
    else:
        console.print(views.roles_table(doc, state))
    return 0


def _set_weight(args: argparse.Namespace) -> int:
    """`offerbus roles weight ROLE W`: the operator's SetWeight (weighted DRF)."""
    what = args.what
    if len(what) != 3 or what[0] != "weight":
        raise CliError("usage: offerbus roles weight ROLE WEIGHT, e.g. offerbus roles weight "
                       "eng/batch 2; or offerbus roles quota ROLE [--guarantee R] [--limit R]")
    try:
        weight = float(what[2])
    except ValueError:
        raise CliError(f"weight {what[2]!r} is not a number") from None
    _check_role(what[1])
    url = cluster_url(args.cluster, args.run_dir)
    leader, _ = master_state(url, args.timeout)
    call = operator_pb2.OperatorCall()
    call.set_weight.role, call.set_weight.weight = what[1], weight
    event = operator_call(leader, call, args.timeout)
    console.print(event.done.message or f"role {what[1]} weight {weight:g}")
    return 0


def _check_role(role: str) -> None:
    error = role_error(role)
    if error is not None:
        raise CliError(error)


def _set_quota(args: argparse.Namespace) -> int:
    """`offerbus roles quota ROLE [--guarantee R] [--limit R] [--clear]`: the operator's
    SetQuota. What is not given is kept as the master has it; `--clear` drops both."""
    what = args.what
    if len(what) != 2 or (args.guarantee is None and args.limit is None and not args.clear):
        raise CliError("usage: offerbus roles quota ROLE [--guarantee cpus:2;mem:1024] "
                       "[--limit cpus:4] [--clear]; an empty value ('') clears one")
    role = what[1]
    _check_role(role)
    given = {}
    for name, text in (("guarantee", args.guarantee), ("limit", args.limit)):
        if text is not None:
            try:
                given[name] = Resources.parse(text).to_proto()  # zeros kept: cpus:0 limits
            except ValueError as exc:
                raise CliError(f"--{name} {text!r}: {exc}") from None
    url = cluster_url(args.cluster, args.run_dir)
    leader, state = master_state(url, args.timeout)
    now = {} if args.clear else views.role_quota(state, role)
    call = operator_pb2.OperatorCall()
    call.set_quota.role = role
    for name, items in (("guarantee", call.set_quota.guarantee),
                        ("limit", call.set_quota.limit)):
        items.extend(given.get(name, now.get(name, [])))
    event = operator_call(leader, call, args.timeout)
    console.print(event.done.message or f"role {role} quota set")
    return 0


def cmd_kill(args: argparse.Namespace) -> int:
    url = cluster_url(args.cluster, args.run_dir)
    leader, state = master_state(url, args.timeout)
    task = _find_task(state, args.task) if not args.framework else {
        "framework_id": args.framework}
    call = operator_pb2.OperatorCall()
    call.kill_task.framework_id = task["framework_id"]
    call.kill_task.task_id = args.task
    event = operator_call(leader, call, args.timeout)
    console.print(f"kill sent: {event.done.message or args.task}")
    return 0


def cmd_logs(args: argparse.Namespace) -> int:
    url = cluster_url(args.cluster, args.run_dir)
    leader, state = master_state(url, args.timeout)
    task = _find_task(state, args.task)
    call = operator_pb2.OperatorCall()
    call.get_logs.framework_id = task["framework_id"]
    call.get_logs.task_id = args.task
    call.get_logs.stream = agent_pb2.LOG_STREAM_STDERR if args.stderr else \
        agent_pb2.LOG_STREAM_STDOUT
    call.get_logs.tail_lines = args.tail
    if args.follow:
        return _follow_logs(url, args, call)
    event = operator_call(leader, call, args.timeout)
    if event.logs.error:
        raise CliError(f"logs of {args.task}: {event.logs.error}")
    sys.stdout.buffer.write(event.logs.data)
    if event.logs.truncated:
        console.print("[yellow](truncated)[/]")
    return 0


def _follow_logs(url: str, args: argparse.Namespace, call: operator_pb2.OperatorCall) -> int:
    """`logs -f`: bounded GetLogs from the printed offset, every follow.POLL_S (services/cli/
    follow.py); the task's state is read before each so its last bytes are never missed."""
    call.get_logs.tail_lines = 0

    def poll(offset: int) -> follow.Reply:
        # Only the task's framework, without agents: a poll costs its framework, not the fleet.
        query = urllib.parse.urlencode({"framework": call.get_logs.framework_id, "agents": 0})
        leader, state = master_state(url, args.timeout, query)
        status = _find_task(state, args.task).get("status", {})
        ended = task_states.from_name(status.get("state", "")) in task_states.TERMINAL
        call.get_logs.since_bytes = offset
        logs = operator_call(leader, call, args.timeout).logs
        if logs.error:
            raise CliError(f"logs of {args.task}: {logs.error}")
        follow.check_offsets(offset, logs.data, logs.next_offset, logs.truncated)
        return follow.Reply(logs.data, logs.next_offset, logs.truncated, ended)
    try:
        return follow.follow(poll, sys.stdout.buffer, sys.stderr)
    except follow.CannotFollow as exc:
        raise CliError(f"logs of {args.task}: {exc}") from exc
    except KeyboardInterrupt:
        return 130


def cmd_run(args: argparse.Namespace) -> int:
    return lifecycle.cmd_run(args, console)


def cmd_scale(args: argparse.Namespace) -> int:
    return lifecycle.cmd_scale(args, console)


def cmd_stop(args: argparse.Namespace) -> int:
    return lifecycle.cmd_stop(args, console)


def cmd_trace(args: argparse.Namespace) -> int:
    return trace.cmd_trace(args, console)


def cmd_why(args: argparse.Namespace) -> int:
    return why.cmd_why(args, console)


def _count(minimum: int) -> Any:
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
        if value < minimum:
            raise argparse.ArgumentTypeError(f"expected at least {minimum}, got {value}")
        return value
    return parse


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(
        prog="offerbus", description="Offerbus cluster manager.",
        epilog="Settings come from, in order: flags, OFFERBUS_* environment variables, the "
        "chosen profile of the CLI config file (--profile), defaults.")
    profiles.add_flag(ap)
    ap.add_argument("--run-dir", type=Path, default=None,
                    help="where `up` keeps pids, logs and work dirs (default: "
                    f"OFFERBUS_RUN_DIR, else the profile's run_dir, else {RUN_DIR_DEFAULT})")
    ap.add_argument("--cluster", help="zk://hosts/chroot or file:///dir (default: "
                    "OFFERBUS_CLUSTER, else the profile's cluster, else the run dir's)")
    ap.add_argument("--timeout", type=float, default=10.0, help="seconds to wait for answers")
    sub = ap.add_subparsers(dest="command", required=True)
    p = sub.add_parser("up", help="start a local cluster (ZooKeeper, services, agents)")
    p.add_argument("--agents", type=_count(0), default=3)
    p.add_argument("--masters", type=_count(1), default=1, help="more than 1: hot standbys")
    p.add_argument("--standbys", type=_count(0), default=0,
                   help="hot standbys of every central service: N+1 each of master, allocator "
                   "and offer-broker under the election (masters: at least N+1)")
    p.add_argument("--agent-resources", default="cpus:4;mem:4096;disk:10240;ports:[31000-31999]")
    p.add_argument("--standalone", action="store_true", help="no ZooKeeper: file election")
    p.add_argument("--runtime", choices=["docker", "process"], default="docker")
    p.add_argument("--curve", action="store_true", help="CURVE on the bus, keys in "
                   "<run-dir>/keys (the CLI then needs the OFFERBUS_CURVE_* it prints)")
    p.add_argument("--no-jobs", action="store_true", help="no job runner (`offerbus job run` "
                   "jobs are then kept but not run)")
    p.set_defaults(fn=cmd_up)
    sub.add_parser("down", help="stop the local cluster and remove its containers"
                   ).set_defaults(fn=cmd_down)
    listing = {"status": ("leaders, agents, frameworks, tasks", cmd_status),
               "agents": ("agents and their resources", cmd_table),
               "frameworks": ("frameworks", cmd_table),
               "tasks": ("tasks, where they run, their health", cmd_table),
               "roles": ("roles: weight, quota, frameworks, dominant share (the allocator's)",
                         cmd_roles)}
    for name, (text, fn) in listing.items():
        p = sub.add_parser(name, help=text)
        p.add_argument("--json", action="store_true", help="print machine-readable JSON")
        if name == "tasks":
            p.add_argument("--all", action="store_true", help="include finished tasks")
        if name == "roles":
            p.add_argument("what", nargs="*", metavar="weight ROLE WEIGHT | quota ROLE",
                           help="set a role's weight or quota (operator), e.g. `roles "
                           "weight eng/batch 2`, `roles quota eng --limit cpus:4`")
            p.add_argument("--guarantee", metavar="RESOURCES",
                           help="with quota: set aside for the role while it has demand")
            p.add_argument("--limit", metavar="RESOURCES",
                           help="with quota: never offered to the role beyond this")
            p.add_argument("--clear", action="store_true", help="with quota: drop both")
        p.set_defaults(fn=fn)
    p = sub.add_parser("kill", help="kill a task (operator)")
    p.add_argument("task")
    p.add_argument("--framework", help="the task's framework id, if ambiguous")
    p.set_defaults(fn=cmd_kill)
    p = sub.add_parser("logs", help="a task's container output")
    p.add_argument("task")
    p.add_argument("--stderr", action="store_true")
    p.add_argument("--tail", type=int, default=0, help="last N lines (0: all)")
    p.add_argument("-f", "--follow", action="store_true",
                   help="print new output as it comes, until the task ends (or Ctrl-C)")
    p.set_defaults(fn=cmd_logs)
    from services.cli import config_cmd  # `offerbus config check FILE`

    config_cmd.register(sub)
    from services.cli import job as job_cmd  # `offerbus job run|plan|stop`
    job_cmd.register(sub)
    from services.cli import keys as keys_cmd  # `offerbus keys generate|list`
    keys_cmd.register(sub)
    lifecycle.add_parsers(sub)
    for name, fn in (("run", cmd_run), ("scale", cmd_scale), ("stop", cmd_stop)):
        sub.choices[name].set_defaults(fn=fn)
    trace.add_parser(sub)
    sub.choices["trace"].set_defaults(fn=cmd_trace)
    why.add_parser(sub)
    sub.choices["why"].set_defaults(fn=cmd_why)
    chaos_cli.register(sub)  # `offerbus chaos run|replay|clean` (chaos/)
    return ap


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    if getattr(args, "cmd", None) and args.cmd[:1] == ["--"]:
        args.cmd = args.cmd[1:]
    try:
        profiles.start(args, os.environ)  # the profile's settings, for every command
        return int(args.fn(args))
    except CliError as exc:
        console.print(f"[red]offerbus: {escape(str(exc))}[/]")  # its brackets as written
        return 1
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
