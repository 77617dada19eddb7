"""What the operator reads: agents, frameworks, tasks and roles as rows (plain data, printed
as JSON by `--json`) and as rich tables that fit the terminal, rendered from the master's
/state and the allocator's /roles."""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterable
from typing import Any

from google.protobuf.json_format import ParseDict
from rich.console import Console
from rich.table import Table

from schemas import common_pb2, state_pb2
from services import tasks as task_states

Doc = dict[str, Any]
Row = dict[str, Any]


def _scalar(resources: list[Doc], name: str) -> float:
    return sum(float(r.get("scalar", 0)) for r in resources if r.get("name") == name)


def _fmt(x: float) -> str:
    return f"{x:g}"


def _short_state(state: str) -> str:
    return state.removeprefix("TASK_")


def _active(t: Doc) -> bool:
    return task_states.is_active_name(t.get("status", {}).get("state", ""))


def table(title: str, columns: Iterable[str], rows: Iterable[Iterable[str]]) -> Table:
    """A table that fits the console: long cells fold onto more lines, never off-screen."""
    out = Table(title=title, expand=False, pad_edge=False, collapse_padding=True)
    for col in columns:
        out.add_column(col, overflow="fold")
    for row in rows:
        out.add_row(*row)
    return out


def print_json(console: Console, doc: Any) -> None:
    """Machine-readable output: plain JSON on stdout (no colour, no wrapping)."""
    console.file.write(json.dumps(doc, indent=2, sort_keys=True) + "\n")
    console.file.flush()


# -- agents ---------------------------------------------------------------------------------
def agent_rows(state: Doc) -> list[Row]:
    live = Counter(t.get("agent_id") for t in state.get("tasks", []) if _active(t))
    out = []
    for a in sorted(state.get("agents", []), key=lambda a: a["agent_info"].get("hostname", "")):
        info = a["agent_info"]
        total, used = info.get("resources", []), a.get("used_resources", [])
        out.append({
            "id": info.get("agent_id", ""), "hostname": info.get("hostname", ""),
            "status": a.get("status", "").removeprefix("AGENT_STATUS_"),
            "cpus_used": _scalar(used, "cpus"), "cpus_total": _scalar(total, "cpus"),
            "mem_used": _scalar(used, "mem"), "mem_total": _scalar(total, "mem"),
            "tasks": live.get(info.get("agent_id"), 0),
            "attributes": {x["name"]: x.get("text", x.get("scalar", ""))
                           for x in info.get("attributes", [])}})
    return out


def agents_table(state: Doc) -> Table:
    return table("agents", ("id", "hostname", "status", "cpus used/total",
                            "mem MiB used/total", "tasks", "attributes"),
                 ((r["id"], r["hostname"], r["status"],
                   f"{_fmt(r['cpus_used'])}/{_fmt(r['cpus_total'])}",
                   f"{_fmt(r['mem_used'])}/{_fmt(r['mem_total'])}", str(r["tasks"]),
                   ";".join(f"{k}:{v}" for k, v in r["attributes"].items()))
                  for r in agent_rows(state)))


# -- frameworks -----------------------------------------------------------------------------
def framework_rows(state: Doc) -> list[Row]:
    active = Counter(t.get("framework_id") for t in state.get("tasks", []) if _active(t))
    out = []
    for f in state.get("frameworks", []):
        info = f["framework_info"]
        out.append({"id": info.get("framework_id", ""), "name": info.get("name", ""),
                    "role": info.get("role", "*"), "connected": bool(f.get("connected")),
                    "active_tasks": active.get(info.get("framework_id"), 0)})
    return out


def frameworks_table(state: Doc) -> Table:
    return table("frameworks", ("id", "name", "role", "connected", "active tasks"),
                 ((r["id"], r["name"], r["role"], "yes" if r["connected"] else "no",
                   str(r["active_tasks"])) for r in framework_rows(state)))


# -- tasks ----------------------------------------------------------------------------------
def health(t: Doc) -> str:
    """healthy / unhealthy from the task's latest status, blank when it has no check."""
    value = t.get("status", {}).get("healthy")
    return "" if value is None else ("healthy" if value else "unhealthy")


def task_rows(state: Doc, show_all: bool = False) -> list[Row]:
    hosts = {a["agent_info"].get("agent_id"): a["agent_info"].get("hostname", "")
             for a in state.get("agents", [])}
    names = {f["framework_info"].get("framework_id"): f["framework_info"].get("name", "")
             for f in state.get("frameworks", [])}
    out = []
    for t in sorted(state.get("tasks", []), key=lambda t: t["task_info"]["task_id"]):
        if not show_all and not _active(t):
            continue
        res = t["task_info"].get("resources", [])
        agent = t.get("agent_id", "")
        status = t.get("status", {})
        out.append({"id": t["task_info"]["task_id"], "framework_id": t.get("framework_id", ""),
                    "framework": names.get(t.get("framework_id"), ""), "agent_id": agent,
                    "host": hosts.get(agent, ""),
                    "state": _short_state(status.get("state", "")), "health": health(t),
                    "cpus": _scalar(res, "cpus"), "mem": _scalar(res, "mem"),
                    "revocable": bool(t["task_info"].get("revocable")),
                    "message": status.get("message", "")})
    return out


def tasks_table(state: Doc, show_all: bool = False) -> Table:
    """REV: "yes" for a revocable task (launched beyond its framework's guaranteed share:
    revoked first when a framework below its share needs the resources)."""
    return table("tasks", ("task", "framework", "agent (host)", "state", "health", "cpus",
                           "mem", "rev", "message"),
                 ((r["id"], r["framework"] or r["framework_id"],
                   f"{r['agent_id']} ({r['host'] or '?'})", r["state"], r["health"],
                   _fmt(r["cpus"]), _fmt(r["mem"]), "yes" if r["revocable"] else "",
                   r["message"])
                  for r in task_rows(state, show_all)))


def task_counts(state: Doc) -> Counter[str]:
    return Counter(_short_state(t.get("status", {}).get("state", ""))
                   for t in state.get("tasks", []))


# -- roles (the allocator's /roles) ---------------------------------------------------------
def role_rows(doc: Doc, state: Doc | None = None) -> list[Row]:
    names = {f["framework_info"].get("framework_id"): f["framework_info"].get("name", "")
             for f in (state or {}).get("frameworks", [])}
    out = []
    for r in sorted(doc.get("roles", []), key=lambda r: str(r.get("role", ""))):
        fids = [str(f) for f in r.get("frameworks", [])]
        out.append({"role": str(r.get("role", "")), "weight": float(r.get("weight", 1.0)),
                    "guarantee": _amounts(r.get("guarantee")),
                    "limit": _amounts(r.get("limit")),
                    "dominant_share": float(r.get("dominant_share", 0.0)),
                    "dominant_resource": str(r.get("dominant_resource", "")),
                    "shares": {str(k): float(v) for k, v in r.get("shares", {}).items()},
                    "frameworks": fids,
                    "framework_names": [names.get(f) or f for f in fids]})
    return out


def _amounts(value: object) -> dict[str, float]:
    return ({str(k): float(v) for k, v in value.items()} if isinstance(value, dict) else {})


def _quota_cell(r: Row) -> str:
    parts = [f"{what} " + ";".join(f"{n}:{_fmt(v)}" for n, v in sorted(r[what].items()))
             for what in ("guarantee", "limit") if r[what]]
    return "\n".join(parts) or "-"


def role_quota(state: Doc, role: str) -> dict[str, list[common_pb2.Resource]]:
    """The role's quota as the master's /state has it (RoleRecord): guarantee, limit."""
    for r in state.get("roles", []):
        if r.get("role") == role:
            rec = ParseDict(r, state_pb2.RoleRecord(), ignore_unknown_fields=True)
            return {"guarantee": list(rec.quota_guarantee), "limit": list(rec.quota_limit)}
    return {}


def roles_table(doc: Doc, state: Doc | None = None) -> Table:
    return table("roles", ("role", "weight", "quota", "dominant share", "shares",
                           "frameworks"),
                 ((r["role"], _fmt(r["weight"]), _quota_cell(r),
                   f"{r['dominant_share']:.3f}"
                   + (f" ({r['dominant_resource']})" if r["dominant_resource"] else ""),
                   ", ".join(f"{k} {v:.3f}" for k, v in sorted(r["shares"].items())),
                   ", ".join(r["framework_names"]) or "-")
                  for r in role_rows(doc, state)))
