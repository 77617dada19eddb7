"""Tables the operator reads: agents, frameworks, tasks and the cluster summary, rendered
from the master's /state."""

from __future__ import annotations

from collections import Counter
from typing import Any

from rich.console import Console
from rich.table import Table

console = Console()


def _scalar(resources: list[dict[str, Any]], name: str) -> float:
    return sum(float(r.get("scalar", 0)) for r in resources if r.get("name") == name)


def _fmt(x: float) -> str:
    return f"{x:g}"


def _short_state(state: str) -> str:
    return state.removeprefix("TASK_")


def agents_table(state: dict[str, Any]) -> Table:
    table = Table(title="agents")
    for col in ("id", "hostname", "status", "cpus used/total", "mem used/total (MiB)",
                "tasks", "attributes"):
        table.add_column(col)
    running = Counter(t.get("agent_id") for t in state.get("tasks", [])
                      if _short_state(t.get("status", {}).get("state", "")) in
                      ("STAGING", "STARTING", "RUNNING", "KILLING"))
    for a in sorted(state.get("agents", []), key=lambda a: a["agent_info"]["hostname"]):
        info = a["agent_info"]
        total, used = info.get("resources", []), a.get("used_resources", [])
        attrs = ";".join(f"{x['name']}:{x.get('text', x.get('scalar', ''))}"
                         for x in info.get("attributes", []))
        table.add_row(info.get("agent_id", ""), info.get("hostname", ""),
                      a.get("status", "").removeprefix("AGENT_STATUS_"),
                      f"{_fmt(_scalar(used, 'cpus'))}/{_fmt(_scalar(total, 'cpus'))}",
                      f"{_fmt(_scalar(used, 'mem'))}/{_fmt(_scalar(total, 'mem'))}",
                      str(running.get(info.get("agent_id"), 0)), attrs)
    return table


def frameworks_table(state: dict[str, Any]) -> Table:
    table = Table(title="frameworks")
    for col in ("id", "name", "role", "connected", "active tasks"):
        table.add_column(col)
    active = Counter(t.get("framework_id") for t in state.get("tasks", [])
                     if _short_state(t.get("status", {}).get("state", "")) in
                     ("STAGING", "STARTING", "RUNNING", "KILLING"))
    for f in state.get("frameworks", []):
        info = f["framework_info"]
        table.add_row(info.get("framework_id", ""), info.get("name", ""), info.get("role", "*"),
                      "yes" if f.get("connected") else "no",
                      str(active.get(info.get("framework_id"), 0)))
    return table


def tasks_table(state: dict[str, Any], show_all: bool = False) -> Table:
    hosts = {a["agent_info"].get("agent_id"): a["agent_info"].get("hostname", "")
             for a in state.get("agents", [])}
    names = {f["framework_info"].get("framework_id"): f["framework_info"].get("name", "")
             for f in state.get("frameworks", [])}
    table = Table(title="tasks")
    for col in ("task", "framework", "agent (host)", "state", "cpus", "mem", "message"):
        table.add_column(col)
    for t in sorted(state.get("tasks", []), key=lambda t: t["task_info"]["task_id"]):
        st = _short_state(t.get("status", {}).get("state", ""))
        if not show_all and st not in ("STAGING", "STARTING", "RUNNING", "KILLING",
                                        "UNREACHABLE"):
            continue
        res = t["task_info"].get("resources", [])
        agent = t.get("agent_id", "")
        table.add_row(t["task_info"]["task_id"], names.get(t.get("framework_id"), "") or
                      t.get("framework_id", ""), f"{agent} ({hosts.get(agent, '?')})", st,
                      _fmt(_scalar(res, "cpus")), _fmt(_scalar(res, "mem")),
                      t.get("status", {}).get("message", ""))
    return table


def task_counts(state: dict[str, Any]) -> Counter[str]:
    return Counter(_short_state(t.get("status", {}).get("state", ""))
                   for t in state.get("tasks", []))
