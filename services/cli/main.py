"""`offerbus`: the operator's command line."""

from __future__ import annotations

import argparse
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

from rich.console import Console

from schemas import agent_pb2, operator_pb2
from services.cli import cluster, trace, views, why
from services.cli.client import (
    DEFAULT_RUN_DIR,
    CliError,
    cluster_url,
    find_leader,
    master_state,
    operator_call,
)

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
                                 agent_resources=args.agent_resources,
                                 standalone=args.standalone, runtime=args.runtime))
    return 0


def cmd_down(args: argparse.Namespace) -> int:
    cluster.down(args.run_dir)
    return 0


def cmd_status(args: argparse.Namespace) -> int:
    url = cluster_url(args.cluster, args.run_dir)
    leader, state = master_state(url, args.timeout)
    console.print(f"cluster {url}")
    console.print(f"  master     {leader.member_id} (epoch {leader.epoch}) "
                  f"{leader.endpoints['http']}")
    for role in ("allocator", "broker"):
        try:
            other = find_leader(url, 1.0, role)
            console.print(f"  {role:<10} {other.member_id} (epoch {other.epoch})")
        except CliError:
            console.print(f"  {role:<10} [red]no leader[/]")
    statuses = Counter(a.get("status", "").removeprefix("AGENT_STATUS_").lower()
                       for a in state["agents"])
    console.print(f"  agents     {sum(statuses.values())} ({_counts(statuses)})")
    console.print(f"  frameworks {len(state['frameworks'])}")
    tasks = Counter({s.lower(): n for s, n in views.task_counts(state).items()})
    console.print(f"  tasks      {_counts(tasks) or 'none'}")
    return 0


def cmd_table(args: argparse.Namespace) -> int:
    _, state = master_state(cluster_url(args.cluster, args.run_dir), args.timeout)
    if args.command == "agents":
        console.print(views.agents_table(state))
    elif args.command == "frameworks":
        console.print(views.frameworks_table(state))
    else:
        console.print(views.tasks_table(state, show_all=args.all))
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
    event = operator_call(leader, call, args.timeout)
    if event.logs.error:
        raise CliError(f"logs of {args.task}: {event.logs.error}")
    sys.stdout.buffer.write(event.logs.data)
    if event.logs.truncated:
        console.print("[yellow](truncated)[/]")
    return 0


def cmd_run(args: argparse.Namespace) -> int:
    from frameworks import service

    url = cluster_url(args.cluster, args.run_dir)
    spec = service.ServiceSpec(
        name=args.name, image=args.image, instances=args.instances, cpus=args.cpus,
        mem=args.mem, command=args.cmd, constraints=args.constraint or [],
        runtime="docker" if args.image else "process")
    spec_path = service.write_spec(args.run_dir.resolve(), spec)
    pid = cluster.spawn(args.run_dir.resolve(), f"framework-{args.name}", [
        "-m", "frameworks.service", "--cluster", url, "--spec", str(spec_path)])
    console.print(f"framework {args.name} started (pid {pid}); spec {spec_path}")
    if args.no_wait:
        return 0
    deadline = time.monotonic() + args.timeout
    with console.status(f"waiting for {args.instances} instances of {args.name}") as status:
        while time.monotonic() < deadline:
            _, state = master_state(url, 5.0)
            counts = service.instance_states(state, args.name)
            status.update(f"{args.name}: " + ", ".join(f"{n} {s.lower()}"
                                                       for s, n in sorted(counts.items())))
            if counts.get("RUNNING", 0) >= args.instances:
                console.print(f"[green]{args.name}: {args.instances} instances RUNNING[/]")
                return 0
            time.sleep(0.2)  # polling the master's state with a deadline
    raise CliError(f"{args.name} did not reach {args.instances} RUNNING within "
                   f"{args.timeout:g}s; see `offerbus tasks --all` and "
                   f"{args.run_dir}/logs/framework-{args.name}.log")


def cmd_scale(args: argparse.Namespace) -> int:
    from frameworks import service

    spec = service.read_spec(args.run_dir.resolve(), args.name)
    spec.instances = args.instances
    service.write_spec(args.run_dir.resolve(), spec)
    console.print(f"{args.name}: scaling to {args.instances} instances")
    return 0


def cmd_trace(args: argparse.Namespace) -> int:
    return trace.cmd_trace(args, console)


def cmd_why(args: argparse.Namespace) -> int:
    return why.cmd_why(args, console)


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="offerbus", description="Offerbus cluster manager.")
    ap.add_argument("--run-dir", type=Path, default=DEFAULT_RUN_DIR,
                    help=f"where `up` keeps pids, logs and work dirs (default {DEFAULT_RUN_DIR})")
    ap.add_argument("--cluster", help="zk://hosts/chroot or file:///dir (default: the run dir's)")
    ap.add_argument("--timeout", type=float, default=10.0, help="seconds to wait for answers")
    sub = ap.add_subparsers(dest="command", required=True)
    p = sub.add_parser("up", help="start a local cluster (ZooKeeper, services, agents)")
    p.add_argument("--agents", type=int, default=3)
    p.add_argument("--masters", type=int, default=1, help="more than 1: hot standbys")
    p.add_argument("--agent-resources", default="cpus:4;mem:4096;disk:10240;ports:[31000-31999]")
    p.add_argument("--standalone", action="store_true", help="no ZooKeeper: file election")
    p.add_argument("--runtime", choices=["docker", "process"], default="docker")
    p.set_defaults(fn=cmd_up)
    sub.add_parser("down", help="stop the local cluster and remove its containers"
                   ).set_defaults(fn=cmd_down)
    sub.add_parser("status", help="leaders, agents, frameworks, tasks").set_defaults(fn=cmd_status)
    sub.add_parser("agents", help="agents and their resources").set_defaults(fn=cmd_table)
    sub.add_parser("frameworks", help="frameworks").set_defaults(fn=cmd_table)
    p = sub.add_parser("tasks", help="tasks and where they run")
    p.add_argument("--all", action="store_true", help="include finished tasks")
    p.set_defaults(fn=cmd_table)
    p = sub.add_parser("kill", help="kill a task (operator)")
    p.add_argument("task")
    p.add_argument("--framework", help="the task's framework id, if ambiguous")
    p.set_defaults(fn=cmd_kill)
    p = sub.add_parser("logs", help="a task's container output")
    p.add_argument("task")
    p.add_argument("--stderr", action="store_true")
    p.add_argument("--tail", type=int, default=0, help="last N lines (0: all)")
    p.set_defaults(fn=cmd_logs)
    p = sub.add_parser("run", help="run N instances of a container as a service")
    p.add_argument("--name", required=True)
    p.add_argument("--image", default="", help="Docker image (empty: a plain process)")
    p.add_argument("--instances", type=int, default=1)
    p.add_argument("--cpus", type=float, default=0.1)
    p.add_argument("--mem", type=float, default=32)
    p.add_argument("--constraint", action="append",
                   help='placement: "hostname:unique" or "rack:a" (attribute match)')
    p.add_argument("--no-wait", action="store_true")
    p.add_argument("cmd", nargs=argparse.REMAINDER, help="-- command and args")
    p.set_defaults(fn=cmd_run)
    p = sub.add_parser("scale", help="change a service's number of instances")
    p.add_argument("name")
    p.add_argument("instances", type=int)
    p.set_defaults(fn=cmd_scale)
    trace.add_parser(sub)
    sub.choices["trace"].set_defaults(fn=cmd_trace)
    why.add_parser(sub)
    sub.choices["why"].set_defaults(fn=cmd_why)
    return ap


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    if getattr(args, "cmd", None) and args.cmd[:1] == ["--"]:
        args.cmd = args.cmd[1:]
    try:
        return int(args.fn(args))
    except CliError as exc:
        console.print(f"[red]offerbus: {exc}[/]")
        return 1
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
