"""`offerbus job run FILE | plan FILE | stop NAME | list`: services submitted as job files
(see services/cli/jobfile.py) to the cluster. `run` submits the job to the master, which
keeps it in its registry; the cluster's job runner (frameworks/jobrunner) runs its service
framework, so the job outlives the machine that submitted it; a second `run` submits a new
version (new instances now; any other change by a rolling update, `[update]
max_unavailable` at a time). `plan` says where the instances would go and why not, from
the master's /state, changing nothing; `stop` removes the job (its framework and tasks);
`list` shows every job. OFFERBUS_MASTER (host:port of a master's HTTP) lets `plan` and
`list` read /state without the cluster's ZooKeeper."""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

from rich.console import Console

from frameworks.spec import SPEC_LABEL, spec_digest
from schemas import operator_pb2
from services import tasks as task_states
from services.cli import jobfile, lifecycle, views, why
from services.cli.client import (
    CliError,
    cluster_url,
    find_leader,
    http_get,
    master_state,
    operator_call,
)
from services.master.records import JOB_LABEL

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


def job_query(name: str) -> str:
    """The /state `job run` and `job stop` read: every job, the frameworks named `name` and
    their tasks (not the whole cluster's)."""
    return urlencode({"framework_name": name, "agents": 0})


def submit_call(spec: Any) -> operator_pb2.OperatorCall:
    """The SubmitJob of a job file's spec."""
    call = operator_pb2.OperatorCall()
    call.submit_job.name, call.submit_job.role = spec.name, spec.role
    call.submit_job.spec.update(dataclasses.asdict(spec))
    return call


def changed_fields(current: dict[str, Any], spec: Any) -> list[str]:
    """The fields, other than instances, on which the job the master keeps (its /state
    record) and `spec` differ. /state shows environment values redacted: of the
    environment, only the names are compared."""
    from frameworks.spec import spec_from_doc

    doc = dict(current.get("spec", {}))
    env = dict(doc.pop("env", {}) or {})
    try:
        kept = spec_from_doc(doc)
    except ValueError as exc:
        raise CliError(f"job {spec.name} in the cluster: {exc}") from exc
    kept.env = dict(spec.env) if sorted(env) == sorted(spec.env) else env
    return jobfile.changed(kept, spec)


def runner_state(url: str, timeout: float) -> dict[str, Any] | None:
    """The leading job runner's /jobs, or None when the cluster runs none."""
    try:
        runner = find_leader(url, timeout, role="jobs")
    except CliError:
        return None
    doc = http_get(runner.endpoints["http"] + "/jobs", timeout)
    return doc if isinstance(doc, dict) else None


def cmd_run(args: argparse.Namespace) -> int:
    """Submit the job to the cluster (a new one, or a new version of the job of that name)
    and wait until its instances run. The cluster's job runner runs its framework, so the
    job outlives this command and this machine."""
    try:
        job = load(args.file)
    except jobfile.JobFileError as exc:
        return _bad(args.file, exc)
    spec = job.spec
    args.name = spec.name
    url = cluster_url(args.cluster, args.run_dir)
    _, state = master_state(url, args.timeout, job_query(spec.name))
    current = next((j for j in state.get("jobs", []) if j.get("name") == spec.name), None)
    if current is None and lifecycle.frameworks_named(state, spec.name):
        console.print(f"[red]offerbus: a framework named {spec.name} (not a job) is "
                      f"registered.[/] Stop it with `offerbus stop {spec.name}`, or name the "
                      "job otherwise.", highlight=False)
        return lifecycle.EXIT_NAME_IN_USE
    differ = changed_fields(current, spec) if current is not None else []
    if current is not None and not differ and rollout_counts(state, spec.name,
                                                             spec_digest(spec))["old"]:
        differ = ["env"]  # /state shows no environment values: theirs is what changed
    event = operator_call(find_leader(url, args.timeout), submit_call(spec), args.timeout)
    console.print(event.done.message, highlight=False)
    if current is not None:
        was = int(current.get("spec", {}).get("instances", 0))
        console.print(f"{spec.name}: " + (f"{was} -> {spec.instances} instances"
                                           if was != spec.instances else
                                           f"unchanged ({spec.instances} instances)"))
    if runner_state(url, args.timeout) is None:
        console.print("[yellow]no job runner is up in this cluster: the job is kept and "
                      "starts when one is (`python -m frameworks.jobrunner`)[/]",
                      highlight=False)
        return 0
    if differ:
        console.print(f"{spec.name}: rolling update ({', '.join(differ)} changed), at most "
                      f"{spec.max_unavailable} instance(s) down at a time", highlight=False)
    if args.no_wait:
        return 0
    try:
        if differ:
            return wait_rollout(args, url, spec)
        return lifecycle.wait_running(args, console, url, spec.instances, None)
    except CliError as exc:
        raise CliError(f"{exc}{runner_says(url, spec.name, args.timeout)}") from None


def runner_says(url: str, name: str, timeout: float) -> str:
    """What the job runner says of job `name` (its phase, why its framework last ended or
    cannot run): appended to a stuck `job run`."""
    try:
        doc = runner_state(url, timeout)
    except CliError:
        doc = None
    entry = (doc or {}).get("jobs", {}).get(name)
    if not entry:
        return " The job runner does not run it (is one up? `offerbus status`)."
    facts = [f"{k.replace('_', ' ')}: {entry[k]}" for k in ("phase", "error", "last_end")
             if entry.get(k)]
    return f" The job runner says: {'; '.join(facts)}." if facts else ""


def rollout_counts(state: dict[str, Any], name: str, digest: str) -> Counter[str]:
    """The job's live tasks by state: RUNNING, STARTING, ... for those of the spec of
    `digest`, `old` for live ones of another spec."""
    fids = set(lifecycle.frameworks_named(state, name))
    counts: Counter[str] = Counter()
    for t in state.get("tasks", []):
        text = str(t.get("status", {}).get("state", ""))
        if t.get("framework_id") not in fids or not task_states.is_active_name(text):
            continue
        # A task launched before specs were labelled is left alone by the scheduler too.
        new = t.get("task_info", {}).get("labels", {}).get(SPEC_LABEL, digest) == digest
        counts[text.removeprefix("TASK_") if new else "old"] += 1
    return counts


def wait_rollout(args: argparse.Namespace, url: str, spec: Any) -> int:
    """Until every instance runs from the new spec and none of an older one is left."""
    digest = spec_digest(spec)
    poll = lifecycle.StatePoller(url, args.timeout, job_query(spec.name))
    progress = lifecycle.Progress(spec.instances, time.monotonic(), stall_s=args.stall,
                                  timeout_s=args.wait_timeout)
    with lifecycle.Reporter(console, f"rolling update of {spec.name}") as shown:
        while True:
            # The master's state as it changes (held until then: StatePoller.next).
            counts = rollout_counts(poll.next(), spec.name, digest)
            shown.show(f"{spec.name}: {counts['RUNNING']}/{spec.instances} new running, "
                       f"{counts['old']} old left")
            verdict = progress.observe(counts, time.monotonic())
            if verdict == "done" and not counts["old"]:
                console.print(f"[green]{spec.name}: {spec.instances} instances RUNNING the "
                              "new spec[/]")
                return 0
            if verdict in ("stalled", "timeout"):
                raise CliError(f"{spec.name}: the rolling update is stuck ({counts['RUNNING']} "
                               f"new running, {counts['old']} old left). See `offerbus job "
                               f"list`, `offerbus why {spec.name}`")


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
    # (Imported here: the plan runs the service framework's own placement, whose module
    # brings the whole SDK, ~70 ms that every other command would pay.)
    from services.cli import jobplan

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
    """Remove the job: the master drops it and tears its framework down (its tasks are
    killed); then wait until its containers are gone. A service started with `offerbus run`
    (no job of that name) is stopped as `offerbus stop` does."""
    url = cluster_url(args.cluster, args.run_dir)
    _, state = master_state(url, args.timeout, job_query(args.name))
    if not any(j.get("name") == args.name for j in state.get("jobs", [])):
        try:
            return lifecycle.cmd_stop(args, console)
        except CliError as exc:
            if not str(exc).startswith("no service"):
                raise
            raise CliError(f"no job {args.name!r} (`offerbus job list` shows the jobs) and no "
                           "service of that name started with `offerbus run`") from None
    fids = {f["framework_info"]["framework_id"] for f in state.get("frameworks", [])
            if f["framework_info"].get("labels", {}).get(JOB_LABEL) == args.name}
    executors = lifecycle.executors_of(state, fids)
    cluster_id = str(state.get("cluster_id") or "")
    call = operator_pb2.OperatorCall()
    call.remove_job.name = args.name
    event = operator_call(find_leader(url, args.timeout), call, args.timeout)
    console.print(event.done.message, highlight=False)
    with lifecycle.Reporter(console, f"stopping {args.name}") as shown:
        def left() -> str | None:
            n = lifecycle.containers_of(fids, cluster_id, executors) if cluster_id else 0
            return f"{args.name}: {n} container(s) left" if n else None

        lifecycle.wait_until(left, args.wait_timeout or 60.0, shown)
    console.print(f"[green]{args.name} stopped[/]", highlight=False)
    return 0


def cmd_list(args: argparse.Namespace) -> int:
    """Every job the master keeps, with what the job runner says of it."""
    url, state = master_doc(args)
    runner = runner_state(url, args.timeout) if url is not None else None
    jobs = sorted(state.get("jobs", []), key=lambda j: str(j.get("name")))
    ran = (runner or {}).get("jobs", {})
    rows = []
    for j in jobs:
        name = str(j.get("name"))
        spec = j.get("spec", {})
        r = ran.get(name, {})
        states = r.get("states", {})
        rows.append({"name": name, "role": j.get("role", ""), "version": j.get("version", ""),
                     "principal": j.get("principal", "") or "-", "image": spec.get("image", ""),
                     "instances": int(spec.get("instances", 0)),
                     "running": int(states.get("TASK_RUNNING", 0)),
                     "runner": r.get("phase", "-" if runner is None else "not started"),
                     "why": r.get("pending_reason") or r.get("error") or r.get("last_end")
                     or ""})
    if args.json:
        views.print_json(console, {"jobs": rows, "job_runner": runner is not None})
        return 0
    console.print(views.table(
        f"{len(rows)} job(s)", ("name", "role", "ver", "principal", "image", "want", "running",
                                "runner", "why"),
        (tuple(str(v) for v in (r["name"], r["role"], r["version"], r["principal"],
                                r["image"], r["instances"], r["running"], r["runner"],
                                r["why"] or "-")) for r in rows)))
    if runner is None:
        console.print("no job runner answers: jobs are kept, and nothing keeps them running",
                      highlight=False)
    return 0


def register(sub: Any) -> None:
    """`offerbus job run|plan|stop`."""
    p = sub.add_parser("job", help="run, plan or stop a service described by a job file")
    inner = p.add_subparsers(dest="job_command", required=True)
    r = inner.add_parser("run", help="submit the job to the cluster (its job runner keeps it "
                         "running), or a new version of it; "
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
    s = inner.add_parser("stop", help="remove a job: its framework and tasks go")
    s.add_argument("name")
    s.add_argument("--timeout", dest="wait_timeout", type=float, default=60.0,
                   help="seconds to wait for the framework and its containers to go")
    s.set_defaults(fn=cmd_stop)
    ls = inner.add_parser("list", help="the jobs the cluster keeps, and how each runs")
    ls.add_argument("--json", action="store_true", help="print machine-readable JSON")
    ls.set_defaults(fn=cmd_list)
