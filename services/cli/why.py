"""`offerbus why FRAMEWORK|TASK`: plain sentences on why a framework gets (no) offers or why
a task is where it is (or still pending), from the allocator's /decisions, the master's
/state, the spans (`decide`, `allocate`, `offer`) the cluster's processes and the local
trace files hold (services/cli/cluster_traces.py) and the service frameworks' status files. The
explanation is a pure function of those documents; a thin layer fetches them."""

from __future__ import annotations

import argparse
import json
import sys
import time
import urllib.parse
from pathlib import Path
from typing import Any

from rich.console import Console

from frameworks.spec import STATUS_SUFFIX
from services import tasks
from services.allocator.reasons import (
    GUARANTEE_REASON,
    LOWER_SHARES_REASON,
    limited_roles,
    parse_filtered,
    parse_holding,
)
from services.cli.client import CliError, cluster_url, find_leader, http_get, master_state
from services.cli.trace import Span, end_ns, names, start_ns
from services.cli.trace import load_spans as load_spans  # (lifecycle.py's `why` reads the run dir)
from services.telemetry import spans as S

Doc = dict[str, Any]
RECENT = 3  # declines quoted


def _clock(seconds: float) -> str:
    return time.strftime("%H:%M:%S", time.localtime(seconds))


def _outcome(d: Doc) -> str:
    return str(d.get("outcome", "OUTCOME_UNSPECIFIED")).removeprefix("OUTCOME_")


def _share(d: Doc) -> float:
    return float(d.get("dominant_share", 0.0))


def _fw_names(state: Doc) -> dict[str, str]:
    return {f["framework_info"].get("framework_id", ""): f["framework_info"].get("name", "")
            for f in state.get("frameworks", [])}


def _label(fid: str, state: Doc) -> str:
    name = _fw_names(state).get(fid, "")
    return f"{name} ({fid})" if name and name != fid else fid


def resolve_framework(target: str, state: Doc, decisions: list[Doc] | None = None) -> str | None:
    """The framework id `target` names (an id or a name), if any; of several frameworks
    with that name, a connected one."""
    if target in _fw_names(state):
        return target
    named = [f["framework_info"]["framework_id"] for f in state.get("frameworks", [])
             if f.get("framework_info", {}).get("name") == target]
    if named:
        connected = {f["framework_info"]["framework_id"] for f in state.get("frameworks", [])
                     if f.get("connected")}
        return next((fid for fid in named if fid in connected), named[-1])
    return target if any(d.get("framework_id") == target for d in decisions or []) else None


# -- spans --------------------------------------------------------------------------------
def _with_parent(spans: list[Span]) -> dict[tuple[str, str], Span]:
    return {(s["traceId"], s["spanId"]): s for s in spans}


def _attr(span: Span, key: str, by_id: dict[tuple[str, str], Span]) -> Any:
    """An attribute of the span, else of its parent (a decide span's offer)."""
    if span.get("attrs", {}).get(key) not in (None, ""):
        return span["attrs"][key]
    parent = by_id.get((span["traceId"], span.get("parentSpanId", "")))
    return parent.get("attrs", {}).get(key) if parent else None


def _hosts(span: Span, by_id: dict[tuple[str, str], Span]) -> list[str]:
    """The agents of the offers a decide span answers: its parent offer's and its links'."""
    related = [by_id.get((span["traceId"], span.get("parentSpanId", ""))),
               *(by_id.get((x.get("traceId", ""), x.get("spanId", "")))
                 for x in span.get("links", []))]
    hosts = [r["attrs"].get(S.HOSTNAME) or r["attrs"].get(S.AGENT_ID) for r in related if r]
    own = span.get("attrs", {}).get(S.HOSTNAME) or span.get("attrs", {}).get(S.AGENT_ID)
    return list(dict.fromkeys(h for h in [own, *hosts] if h))


def declines(spans: list[Span], framework_ids: set[str], framework_names: set[str],
             task_id: str = "") -> list[Span]:
    """The `decide` spans that declined, of these frameworks (or naming the task), newest
    first."""
    out = []
    for s in spans:
        a = s.get("attrs", {})
        if s.get("name") != S.DECIDE or a.get(S.DECISION) != "decline":
            continue
        if (a.get(S.FRAMEWORK_ID) in framework_ids or a.get(S.FRAMEWORK_NAME) in framework_names
                or (task_id and names(s, "task", task_id))):
            out.append(s)
    return sorted(out, key=start_ns, reverse=True)


def decline_sentences(found: list[Span], spans: list[Span], who: str) -> list[str]:
    """The most recent declines with distinct reasons, as sentences."""
    by_id = _with_parent(spans)
    out: list[str] = []
    seen: set[str] = set()
    for s in found:
        reason = str(s["attrs"].get(S.REASON) or "no reason given")
        if reason in seen:
            continue
        seen.add(reason)
        where = ", ".join(_hosts(s, by_id))
        offers = _attr(s, S.OFFER_IDS, by_id) or [_attr(s, S.OFFER_ID, by_id) or "?"]
        refuse = s["attrs"].get(S.REFUSE_SECONDS)
        text = (f"At {_clock(start_ns(s) / 1e9)} {who} declined offer"
                f"{'s' if len(offers) > 1 else ''} {', '.join(offers)}"
                + (f" from {where}" if where else ""))
        if refuse:
            until = _clock(end_ns(s) / 1e9 + float(refuse))
            text += (f" (filtering {'them' if len(offers) > 1 else 'it'} for "
                     f"{float(refuse):g}s, until {until})")
        out.append(f"{text}: {reason}.")
        if len(out) == RECENT:
            break
    return out


# -- frameworks ---------------------------------------------------------------------------
def _filtered(d: Doc, now: float | None) -> str:
    n = int(d.get("agents_filtered", 0))
    reason = str(d.get("reason", ""))
    first = parse_filtered(reason)
    text = f"its decline filters are in force on {n} agent(s)"
    if first is not None:
        agent_id, until = first
        left = f", {until - now:.0f}s from now" if now is not None and until > now else ""
        text += f", e.g. {agent_id} until {_clock(until)}{left}"
    elif reason:
        text += f" ({reason})"
    return text + " (a REVIVE clears them)"


def _share_when_offered(d: Doc, spans: list[Span]) -> float | None:
    """A framework's dominant share when DRF chose it: its allocate spans' share (the
    decision's share already counts what it was just offered)."""
    ids = set(d.get("allocation_ids", []))
    shares = [float(s["attrs"][S.DOMINANT_SHARE]) for s in spans
              if s.get("name") == S.ALLOCATE and s["attrs"].get(S.ALLOCATION_ID) in ids
              and s["attrs"].get(S.DOMINANT_SHARE) is not None]
    return min(shares) if shares else None


def _fair_share(d: Doc, decisions: list[Doc], state: Doc, spans: list[Span]) -> str:
    def weighted(x: Doc) -> float:
        return _share(x) / float(x.get("weight", 1.0) or 1.0)

    mine = _share(d)
    head = f"its dominant share {mine:.3f} (of {d.get('dominant_resource') or '-'})"
    others = [x for x in decisions if x.get("framework_id") != d.get("framework_id")
              and _outcome(x) not in ("INACTIVE", "SUPPRESSED")]
    offered = sorted((x for x in others if _outcome(x) == "OFFERED"), key=weighted)
    lower = sorted((x for x in others if weighted(x) < weighted(d)), key=weighted)
    if not offered and not lower:
        return (f"{head} is above the other frameworks': DRF offers to the lowest share first "
                f"and they took the free resources")
    low = offered[0] if offered else lower[0]
    then = _share_when_offered(low, spans) if offered else None
    theirs = (f"{then:.3f} when it was offered" if then is not None else
              f"{_share(low):.3f} (of {low.get('dominant_resource') or '-'})"
              + (", counting what it was just offered" if offered else ""))
    return (f"{head} is above framework {_label(str(low.get('framework_id')), state)}'s "
            f"{theirs}: DRF offers to the lowest share first"
            + (", and it took the free resources" if offered else ""))


def decision_sentence(d: Doc, decisions: list[Doc], state: Doc, spans: list[Span],
                      now: float | None = None) -> str:
    """The allocator's latest decision on a framework, as a sentence; and the offers it
    holds unanswered when the decision names them (resources no one else is offered)."""
    text = _decision(d, decisions, state, spans, now)
    reason = str(d.get("reason", ""))
    holding = parse_holding(reason)
    if holding is not None and reason not in text:  # (a sentence that quotes the reason)
        n, agent_id = holding
        text += (f" It holds {n} offer(s) not answered yet (e.g. on {agent_id}): no other "
                 f"framework is offered those resources until it answers, or the offer "
                 f"times out.")
    return text


def _decision(d: Doc, decisions: list[Doc], state: Doc, spans: list[Span],
              now: float | None) -> str:
    fid = str(d.get("framework_id", ""))
    outcome, cycle = _outcome(d), d.get("cycle", "?")
    who = f"Framework {_label(fid, state)}"
    if outcome == "SUPPRESSED":
        return f"{who} gets no offers: it suppressed offers (revive to get offers again)."
    if outcome == "FILTERED":
        return f"{who} got no offer in cycle {cycle}: {_filtered(d, now)}."
    if outcome == "QUOTA_LIMIT":
        roles = limited_roles(str(d.get("reason", ""))) or [str(d.get("role", "")) or "?"]
        return (f"{who} got no offer in cycle {cycle}: its role's quota limit holds it back "
                f"({d.get('reason', '')}); an operator may raise or clear the limit ("
                + " or ".join(f"offerbus roles quota {r} --limit RESOURCES" for r in roles)
                + ", or --clear).")
    if outcome == "FAIR_SHARE" and str(d.get("reason", "")).startswith(GUARANTEE_REASON):
        return (f"{who} got no offer in cycle {cycle}: {d.get('reason', '')}; they come "
                f"first until they hold their guarantee or have no demand left.")
    if outcome == "FAIR_SHARE":
        said = str(d.get("reason", ""))
        more = ("" if not said or said.startswith(LOWER_SHARES_REASON)
                else f"; the allocator says: {said}")  # reclaiming, revoking, its next task
        return (f"{who} got no offer in cycle {cycle}: "
                f"{_fair_share(d, decisions, state, spans)}{more}.")
    if outcome == "NO_FIT":
        return (f"{who} got no offer in cycle {cycle}: no agent has free resources it may use "
                f"({d.get('reason', '')}).")
    if outcome == "INACTIVE":
        return (f"{who} gets no offers: it is not subscribed (disconnected or failing over); "
                f"the allocator skips it until it subscribes again.")
    if outcome == "OFFERED":
        ids = list(d.get("allocation_ids", []))
        offered = [s for s in spans if s.get("name") == S.OFFER
                   and s.get("attrs", {}).get(S.ALLOCATION_ID) in ids]
        what = "; ".join(
            f"{s['attrs'].get(S.HOSTNAME) or s['attrs'].get(S.AGENT_ID, '?')}: "
            f"{s['attrs'].get(S.RESOURCES, '?')}" for s in offered[:RECENT])
        return (f"{who} was offered resources in cycle {cycle}: {len(ids)} allocation(s) "
                f"({', '.join(ids[:RECENT]) or '-'}) at dominant share {_share(d):.3f} "
                f"(of {d.get('dominant_resource') or '-'})" + (f" — {what}" if what else "")
                + ".")
    return f"{who}: the allocator's latest decision is {outcome}: {d.get('reason', '')}."


def explain_framework(fid: str, decisions: list[Doc] | None, state: Doc, spans: list[Span],
                      now: float | None = None) -> list[str]:
    """Sentences on framework `fid`: the allocator's latest decision, then its declines."""
    out = []
    record = next((f for f in state.get("frameworks", [])
                   if f["framework_info"].get("framework_id") == fid), None)
    if record is not None:
        info = record["framework_info"]
        live = sum(1 for t in state.get("tasks", []) if t.get("framework_id") == fid
                   and not tasks.is_terminal_name(t.get("status", {}).get("state", "")))
        out.append(f"Framework {_label(fid, state)} (role {info.get('role', '*')}) is "
                   f"{'connected' if record.get('connected') else 'disconnected'} and has "
                   f"{live} live task(s).")
    mine = next((d for d in decisions or [] if d.get("framework_id") == fid), None)
    if decisions is None:
        out.append("The allocator's decisions are unavailable (no allocator leader?).")
    elif mine is None:
        out.append(f"The allocator has no decision for {fid} yet (not yet subscribed, or no "
                   f"allocation cycle since).")
    else:
        out.append(decision_sentence(mine, decisions, state, spans, now))
    name = _fw_names(state).get(fid, "")
    found = declines(spans, {fid}, {name} - {""})
    out.extend(decline_sentences(found, spans, "it"))
    return out


# -- tasks --------------------------------------------------------------------------------
def _service_of(task_id: str, statuses: dict[str, Doc], state: Doc) -> str | None:
    """The service framework a task id belongs to: a status file lists it, or the id is
    `<service>-<instance>-<attempt>` of a status file's or a registered framework's name."""
    for name, doc in statuses.items():
        if any(t.get("task_id") == task_id for t in doc.get("tasks", {}).values()):
            return name
    known = set(statuses) | (set(_fw_names(state).values()) - {""})
    fits = [n for n in known if task_id == n or task_id.startswith(n + "-")]
    return max(fits, key=len) if fits else None


def explain_task(task_id: str, state: Doc, spans: list[Span],
                 statuses: dict[str, Doc], decisions: list[Doc] | None = None,
                 now: float | None = None) -> list[str]:
    """Sentences on a task: its state and place if the master knows it, else why its
    framework has not launched it (the allocator's decision on it, its declines, the
    service's pending reason)."""
    hosts = {a["agent_info"].get("agent_id"): a["agent_info"].get("hostname", "")
             for a in state.get("agents", [])}
    known = [t for t in state.get("tasks", []) if t["task_info"]["task_id"] == task_id]
    out = []
    for t in known:
        st = t.get("status", {})
        agent = t.get("agent_id", "")
        text = (f"Task {task_id} of framework {_label(t.get('framework_id', ''), state)} is "
                f"{st.get('state', '?').removeprefix('TASK_')} on agent {agent} "
                f"({hosts.get(agent, '?')})")
        if st.get("reason") or st.get("message"):
            text += f": {' '.join(x for x in (st.get('reason', ''), st.get('message', '')) if x)}"
        out.append(text + f". `offerbus trace task {task_id}` shows how it got there.")
    if known:
        return out
    service = _service_of(task_id, statuses, state)
    out.append(f"The master does not know task {task_id}: its framework has not launched it"
               + (f" (service {service} has it pending)." if service else "."))
    fids = {fid for fid, name in _fw_names(state).items() if service and name == service}
    out.extend(decision_sentence(d, decisions or [], state, spans, now)
               for d in decisions or [] if d.get("framework_id") in fids)
    found = declines(spans, fids, {service} if service else set(), task_id)
    out.extend(decline_sentences(found, spans, f"framework {service or '?'}"))
    doc = statuses.get(service or "")
    if doc:
        running = doc.get("states", {}).get("TASK_RUNNING", 0)
        reason = doc.get("pending_reason") or "nothing pending"
        out.append(f"Service {service} runs {running} of {doc.get('instances', '?')} "
                   f"instance(s); its status file says: {reason}.")
    if not found and not doc:
        out.append("No decline span or status file mentions it — is tracing on (`offerbus "
                   "up` writes <run-dir>/traces/) and is its framework running?")
    return out


def explain(target: str, decisions: list[Doc] | None, state: Doc, spans: list[Span],
            statuses: dict[str, Doc], now: float | None = None) -> list[str]:
    """`offerbus why TARGET`: a framework (id or name) or a task id."""
    fid = resolve_framework(target, state, decisions or [])
    if fid is not None:
        return explain_framework(fid, decisions, state, spans, now)
    return explain_task(target, state, spans, statuses, decisions, now)


# -- the thin layer -----------------------------------------------------------------------
def load_statuses(folder: Path) -> dict[str, Doc]:
    """Service frameworks' <name>.status.json files, by service name."""
    out = {}
    for path in sorted(folder.glob(f"*{STATUS_SUFFIX}")) if folder.is_dir() else ():
        try:
            doc = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        out[str(doc.get("name") or path.name.removesuffix(STATUS_SUFFIX))] = doc
    return out


def fetch_decisions(url: str, fid: str, timeout: float) -> list[Doc] | None:
    try:
        allocator = find_leader(url, timeout, role="allocator")
    except CliError:
        return None
    base = allocator.endpoints["http"] + "/decisions"
    doc = http_get(f"{base}?framework={urllib.parse.quote(fid)}", timeout)
    decisions: list[Doc] = list(doc.get("decisions", []))
    if any(_outcome(d) == "FAIR_SHARE" for d in decisions):  # compare with the others
        decisions = list(http_get(base, timeout).get("decisions", []))
    return decisions


def why_spans(args: argparse.Namespace, url: str, state: Doc, fid: str | None,
              statuses: dict[str, Doc]) -> tuple[list[Span], list[str]]:
    """The spans `why` reads: of the framework (by id and by name) and, for a task, those
    naming it; from the cluster's processes and the local trace files."""
    from services.cli.cluster import traces_dir
    from services.cli.cluster_traces import collect
    from services.telemetry.query import TraceQuery

    target = args.target
    is_task = resolve_framework(target, state) is None
    name = _fw_names(state).get(fid or "", "") or (
        _service_of(target, statuses, state) if is_task else "") or ""
    idents = list(dict.fromkeys(x for x in (fid, name) if x))
    queries = [TraceQuery("framework", (x,)) for x in idents]
    if is_task:
        queries.append(TraceQuery("task", (target,)))
    return collect(args, args.traces or traces_dir(args.run_dir), queries, state=state,
                   url=url)


def cmd_why(args: argparse.Namespace, console: Console) -> int:
    url = cluster_url(args.cluster, args.run_dir)
    _, state = master_state(url, args.timeout)
    fid = resolve_framework(args.target, state)
    statuses = load_statuses(args.run_dir / "frameworks")
    if fid is None:  # a task: the allocator's decision on its service's framework
        service = _service_of(args.target, statuses, state)
        fid = resolve_framework(service, state) if service else None
    decisions = fetch_decisions(url, fid, args.timeout) if fid else []
    spans, notes = why_spans(args, url, state, fid, statuses)
    for note in notes:
        print(f"offerbus why: {note}", file=sys.stderr)
    for sentence in explain(args.target, decisions, state, spans, statuses, time.time()):
        console.print(sentence, highlight=False)
    return 0


def add_parser(sub: Any) -> None:
    p = sub.add_parser("why", help="why a framework gets no offers, or a task is pending")
    p.add_argument("target", help="a framework id or name, or a task id")
    p.add_argument("--traces", type=Path, default=None,
                   help="read spans only from this folder of OTLP-JSON trace files")
    p.add_argument("--local", action="store_true",
                   help="read spans only from <run-dir>/traces, not the cluster's /traces")
