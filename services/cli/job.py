"""`offerbus job run FILE | plan FILE | stop NAME`: services submitted as job files (see
services/cli/jobfile.py). `run` starts the job's service framework as `offerbus run` does,
or changes the number of instances of the running one; `plan` says where the instances
would go and why not, from the master's /state, changing nothing; `stop` is `offerbus
stop`. OFFERBUS_MASTER (host:port of a master's HTTP) lets `plan` read /state without the
cluster's ZooKeeper."""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path
from typing import Any

from rich.console import Console

from services.cli import cluster, jobfile, jobplan, lifecycle, views, why
from services.cli.client import CliError, cluster_url, find_leader, http_get, master_state

EXIT_BAD_JOB = 2  # a usage error, as argparse's
console = Console()


def load(path: str) -> jobfile.Job:
    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise jobfile.JobFileError(f"cannot read it ({exc})") from None
    return jobfile.loads(text)


def _bad(path: str, exc: Exception) -> int:
    print(f"offerbus job: {path}: {exc}", file=sys.stderr)
    return EXIT_BAD_JOB


def cmd_run(args: argparse.Namespace) -> int:
    from frameworks import spec as specs

    try:
        job = load(args.file)
    except jobfile.JobFileError as exc:
        return _bad(args.file, exc)
    spec = job.spec
    args.name = spec.name
    run_dir = args.run_dir.resolve()
    if not specs.spec_path(run_dir, spec.name).exists():
        return lifecycle.start_service(args, console, spec)
    # This run dir has a service of that name: an update (of its instances only).
    try:
        current = specs.read_spec(run_dir, spec.name)
    except (ValueError, TypeError) as exc:
        raise CliError(str(exc)) from exc
    differ = jobfile.changed(current, spec)
    if differ:
        return _bad(args.file, jobfile.JobFileError(
            f"{spec.name} (in this run dir) has another {', '.join(differ)}; the service "
            f"framework has no rolling update yet, so a running job changes its instances "
            f"only: `offerbus job stop {spec.name}`, then `offerbus job run {args.file}`"))
    pid = cluster.running(run_dir).get(f"framework-{spec.name}")
    if pid is None:  # its framework process is gone (a restart): resumed as `run` does
        return lifecycle.start_service(args, console, spec)
    if current.instances == spec.instances:
        console.print(f"{spec.name}: unchanged ({spec.instances} instances)")
    else:
        specs.write_spec(run_dir, spec)
        console.print(f"{spec.name}: {current.instances} -> {spec.instances} instances")
    if args.no_wait:
        return 0
    url = cluster_url(args.cluster, args.run_dir)
    return lifecycle.wait_running(args, console, url, spec.instances, pid)


def master_doc(args: argparse.Namespace) -> tuple[str | None, dict[str, Any]]:
    """(the cluster URL or None, the master's whole /state): from OFFERBUS_MASTER when set
    (no ZooKeeper needed), else from the leader the cluster's election names."""
    address = os.environ.get("OFFERBUS_MASTER", "").strip()
    if address and not args.cluster:
        base = address if "://" in address else f"http://{address}"
        doc = http_get(base.rstrip("/") + "/state", args.timeout)
        if not isinstance(doc, dict) or doc.get("leading") is False or "agents" not in doc:
            raise CliError(f"OFFERBUS_MASTER={address}: not a leading master's /state")
        return None, doc
    url = cluster_url(args.cluster, args.run_dir)
    return url, master_state(url, args.timeout)[1]


def allocator_view(url: str | None, spec: Any, state: dict[str, Any],
                   timeout: float) -> list[str]:
    """What the allocator says: its latest decision on the job's framework if one exists,
    else its view of the job's role (best effort: [] when it cannot be asked)."""
    if url is None:
        return []
    try:
        fid = why.resolve_framework(spec.name, state)
        if fid is not None:
            decisions = why.fetch_decisions(url, fid, timeout)
            return why.explain_framework(fid, decisions, state, [], time.time())
        allocator = find_leader(url, timeout, role="allocator")
        doc = http_get(allocator.endpoints["http"] + "/roles", timeout)
    except CliError as exc:
        return [f"(allocator: {exc})"]
    rows = [r for r in views.role_rows(doc if isinstance(doc, dict) else {}, state)
            if r["role"] == spec.role]
    if not rows:
        return [f"Role {spec.role} has no framework yet: the job's framework would be its "
                "first (weight 1 unless set)."]
    r = rows[0]
    return [f"Role {spec.role}: weight {r['weight']:g}, dominant share "
            f"{r['dominant_share']:.3f}, frameworks {', '.join(r['framework_names']) or '-'}."]


def cmd_plan(args: argparse.Namespace) -> int:
    try:
        job = load(args.file)
    except jobfile.JobFileError as exc:
        return _bad(args.file, exc)
    url, state = master_doc(args)
    plan = jobplan.plan_job(job.spec, state)
    notes = allocator_view(url, job.spec, state, args.timeout)
    if args.json:
        views.print_json(console, {**plan.doc(), "allocator": notes})
        return 0
    console.print(views.table(
        f"job {plan.name}: {plan.want} instance(s), {plan.live} live",
        ("agent", "status", "free", "new", "running", "why no (more)"),
        ((a.hostname or a.agent_id, a.status, a.free, _ids(a.new), _ids(a.running),
          a.why_not or "-") for a in plan.agents)))
    placed = sum(len(a.new) for a in plan.agents)
    console.print(f"{placed} instance(s) would be placed now"
                  + (f"; not placed: {_ids(plan.unplaced)} ({plan.why})" if plan.unplaced
                     else "") + (f"; would stop: {_ids(plan.remove)}" if plan.remove else ""),
                  highlight=False)
    for line in notes:
        console.print(line, highlight=False)
    return 0


def _ids(indexes: list[int]) -> str:
    return ", ".join(str(i) for i in indexes) or "-"


def cmd_stop(args: argparse.Namespace) -> int:
    return lifecycle.cmd_stop(args, console)


def register(sub: Any) -> None:
    """`offerbus job run|plan|stop`."""
    p = sub.add_parser("job", help="run, plan or stop a service described by a job file")
    inner = p.add_subparsers(dest="job_command", required=True)
    r = inner.add_parser("run", help="start the job's service, or change its instances; "
                         f"exit {EXIT_BAD_JOB} on a bad job file")
    r.add_argument("file", help="a TOML job file (see frameworks/jobs/web.toml)")
    r.add_argument("--no-wait", action="store_true")
    r.add_argument("--stall", type=float, default=lifecycle.DEFAULT_STALL_S,
                   help="fail after this many seconds without progress")
    r.add_argument("--timeout", dest="wait_timeout", type=float, default=None,
                   help="fail if not all running after this many seconds (default: none)")
    r.set_defaults(fn=cmd_run)
    q = inner.add_parser("plan", help="where the job's instances would go, and why not "
                         "(a dry run: nothing changes)")
    q.add_argument("file")
    q.add_argument("--json", action="store_true", help="print machine-readable JSON")
    q.set_defaults(fn=cmd_plan)
    s = inner.add_parser("stop", help="remove a job's service (as `offerbus stop`)")
    s.add_argument("name")
    s.add_argument("--timeout", dest="wait_timeout", type=float, default=60.0,
                   help="seconds to wait for the framework and its containers to go")
    s.set_defaults(fn=cmd_stop)
