"""Where `offerbus trace` and `offerbus why` get spans (issue 11): from every process of the
cluster over HTTP (/traces: services/telemetry/query.py), merged with this machine's run
dir's trace files (local frameworks write there). The peers are every member of every
election (master, allocator, broker, any other role) and every agent the master's /state
lists; they are asked in parallel, each within a short timeout, and those that do not
answer are named in one line, never fatal. Without a reachable cluster the local files are
used alone (when there are any)."""

from __future__ import annotations

import argparse
import json
import logging
import os
import urllib.error
import urllib.request
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from services.cli.client import (
    CliError,
    ElectionView,
    cluster_url,
    http_get,
    http_headers,
    state_path,
)
from services.telemetry.query import (
    MAX_TRACE_IDS,
    Span,
    TraceQuery,
    file_spans,
    linked_traces,
    matches,
    merge,
)

PEER_TIMEOUT_S = 3.0  # the most one peer's /traces answer is waited for
ELECTION_TIMEOUT_S = 5.0  # the most ZooKeeper is waited for (then: the local files alone)
MAX_PARALLEL = 16  # peers asked at once
MAX_NAMED = 5  # silent peers named in the line (the others counted)
ELECTION_ROOT = "/offerbus"  # where the elections live (services/bus/election/zookeeper.py)
STANDALONE_ROLES = ("master", "allocator", "broker")  # a file:// cluster's elected roles
GONE = ("GONE", "REMOVED")  # agent statuses not asked (no process to answer)


@dataclass(frozen=True)
class Peer:
    name: str  # "master master-1", "agent host-2"
    url: str  # its HTTP base, http://host:port


@dataclass
class Gathered:
    spans: list[Span] = field(default_factory=list)
    peers: list[Peer] = field(default_factory=list)
    silent: dict[Peer, str] = field(default_factory=dict)  # peer -> why it did not answer
    truncated: set[Peer] = field(default_factory=set)  # peers that left spans out


def http_base(endpoint: str) -> str:
    """An HTTP endpoint as the CLI asks it: "host:port" or "http://host:port/"."""
    endpoint = endpoint.strip().rstrip("/")
    return endpoint if "://" in endpoint else f"http://{endpoint}"


# -- who to ask ---------------------------------------------------------------------------
def state_peers(state: dict[str, Any]) -> list[Peer]:
    """The agents the master's /state lists (but gone ones), and the leaders it names with
    an HTTP endpoint."""
    out = []
    for a in state.get("agents", []):
        info = a.get("agent_info", {})
        if info.get("endpoint") and not any(g in str(a.get("status", "")) for g in GONE):
            out.append(Peer(f"agent {info.get('hostname') or info.get('agent_id', '?')}",
                            http_base(str(info["endpoint"]))))
    for role, leader in sorted((state.get("leaders") or {}).items()):
        if isinstance(leader, dict):
            http = leader.get("http") or (leader.get("endpoints") or {}).get("http")
            if http:
                out.append(Peer(f"{role} {leader.get('id', '?')}", http_base(str(http))))
    return out


class _Elections(ElectionView):
    def roles(self) -> list[str]:
        """The roles with an election under ELECTION_ROOT (ZooKeeper; [] otherwise)."""
        if self._client is None:
            return []
        from kazoo.exceptions import KazooException

        try:
            return sorted(self._client.get_children(ELECTION_ROOT))
        except KazooException:
            return []


def election_peers(url: str, timeout: float) -> list[Peer]:
    """Every member of every role's election (ZooKeeper), or each role's leader (a file://
    cluster). CliError when the election cannot be reached."""
    from services.bus.election import detector_from_url, parse_url

    out = []
    if parse_url(url)[0] == "file":
        for role in STANDALONE_ROLES:
            detector = detector_from_url(url, role)
            detector.start()  # reads the leader file once
            leader = detector.leader()
            detector.close()
            if leader is not None and leader.endpoints.get("http"):
                out.append(Peer(f"{role} {leader.member_id}",
                                http_base(leader.endpoints["http"])))
        return out
    elections = _Elections(url, min(timeout, ELECTION_TIMEOUT_S))
    kazoo = logging.getLogger("kazoo")
    level = kazoo.level
    kazoo.setLevel(logging.CRITICAL)  # its retries' lines; a failure is our CliError
    try:
        with elections:
            for role in elections.roles():
                try:
                    members = elections.members(role) or []
                except (CliError, ValueError):
                    continue
                out.extend(Peer(f"{role} {m.member_id}", http_base(m.endpoints["http"]))
                           for m in members if m.endpoints.get("http"))
    finally:
        kazoo.setLevel(level)
    return out


def unique(peers: Iterable[Peer]) -> list[Peer]:
    """One peer per URL (the first name given)."""
    out: dict[str, Peer] = {}
    for p in peers:
        out.setdefault(p.url, p)
    return list(out.values())


def discover(args: argparse.Namespace, state: dict[str, Any] | None = None,
             url: str | None = None) -> list[Peer]:
    """The processes to ask. OFFERBUS_MASTER (host:port of a master's HTTP, no --cluster):
    that master, the agents and the leaders its /state lists; else the cluster's elections
    and the leading master's /state (`state` when the caller has it). CliError when no
    cluster is given or reachable."""
    timeout = float(getattr(args, "timeout", PEER_TIMEOUT_S))
    address = os.environ.get("OFFERBUS_MASTER", "").strip()
    if address and not args.cluster:
        base = http_base(address)
        if state is None:
            state = http_get(base + state_path("tasks=0"), timeout)
        if not isinstance(state, dict) or "agents" not in state:
            raise CliError(f"OFFERBUS_MASTER={address}: not a master's /state")
        return unique([Peer("master", base), *state_peers(state)])
    url = url or cluster_url(args.cluster, args.run_dir)
    peers = election_peers(url, timeout)
    if state is None:
        masters = [p for p in peers if p.name.startswith("master ")]
        state = _first_state(masters, timeout)
    return unique([*peers, *state_peers(state or {})])


def _first_state(masters: Sequence[Peer], timeout: float) -> dict[str, Any] | None:
    """The /state of the first master (the leader comes first) that gives a whole one."""
    for m in masters:
        try:
            doc = http_get(m.url + state_path("tasks=0"), timeout)
        except CliError:
            continue
        if isinstance(doc, dict) and doc.get("leading") is not False and "agents" in doc:
            return doc
    return None


# -- asking -------------------------------------------------------------------------------
Fetch = Callable[[Peer, TraceQuery, float], dict[str, Any]]


def fetch(peer: Peer, q: TraceQuery, timeout: float) -> dict[str, Any]:
    """One peer's /traces answer; OSError (or ValueError) with the reason otherwise."""
    req = urllib.request.Request(f"{peer.url}/traces?{q.encode()}", headers=http_headers())
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            doc = json.loads(resp.read())
    except urllib.error.HTTPError as exc:
        hint = " (a version without /traces?)" if exc.code == 404 else ""
        raise OSError(f"HTTP {exc.code}{hint}") from exc
    if not isinstance(doc, dict) or not isinstance(doc.get("spans"), list):
        raise ValueError("not a /traces answer")
    return doc


def ask(peers: Sequence[Peer], queries: Sequence[TraceQuery], timeout: float,
        get: Fetch | None = None, into: Gathered | None = None) -> Gathered:
    """Each query of each peer, in parallel (by `get`, default `fetch`); the answers merged
    into `into`. A peer that fails a query is silent (asked nothing more)."""
    fetch_one = get or fetch
    out = into if into is not None else Gathered(peers=list(peers))
    jobs = [(p, q) for p in peers for q in queries if p not in out.silent]
    if not jobs:
        return out

    def one(job: tuple[Peer, TraceQuery]) -> tuple[Peer, dict[str, Any] | str]:
        peer, q = job
        try:
            return peer, fetch_one(peer, q, timeout)
        except (OSError, ValueError) as exc:
            return peer, _reason(exc)

    with ThreadPoolExecutor(max_workers=min(MAX_PARALLEL, len(jobs))) as pool:
        results = list(pool.map(one, jobs))
    batches = [out.spans]
    for peer, doc in results:
        if isinstance(doc, str):
            out.silent.setdefault(peer, doc)
            continue
        batches.append([s for s in doc["spans"] if isinstance(s, dict)])
        if doc.get("truncated"):
            out.truncated.add(peer)
    out.spans = merge(*batches)
    return out


def _reason(exc: BaseException) -> str:
    reason = getattr(exc, "reason", None)
    text = str(reason if reason is not None else exc) or type(exc).__name__
    return "timed out" if "timed out" in text else text


def gather(peers: Sequence[Peer], queries: Sequence[TraceQuery], timeout: float, *,
           follow: bool = False, seen: Sequence[Span] = (),
           get: Fetch | None = None) -> Gathered:
    """The spans the queries select on every peer; with `follow`, also every span of the
    traces they (or the spans `seen` elsewhere) are in or link to: a task's trace crosses
    processes whose spans do not name it (the allocator's allocate, the broker's offer)."""
    got = ask(peers, queries, timeout, get)
    if follow and (got.spans or seen):
        traces = linked_traces([*got.spans, *seen])
        chunks = [traces[i:i + MAX_TRACE_IDS] for i in range(0, len(traces), MAX_TRACE_IDS)]
        ask([p for p in peers if p not in got.silent],
            [TraceQuery("trace", tuple(c)) for c in chunks], timeout, get, got)
    return got


def silent_line(got: Gathered) -> str:
    """"3 of 9 peers did not answer: agent a (timed out), ..." ("" when all did)."""
    if not got.silent:
        return ""
    named = [f"{p.name} at {p.url} ({why})" for p, why in list(got.silent.items())[:MAX_NAMED]]
    more = len(got.silent) - len(named)
    return (f"{len(got.silent)} of {len(got.peers)} peers did not answer: {', '.join(named)}"
            + (f" and {more} more" if more else ""))


def truncated_line(got: Gathered) -> str:
    if not got.truncated:
        return ""
    return ("older spans left out by " + ", ".join(sorted(p.name for p in got.truncated))
            + " (each answer is bounded; the newest are kept)")


# -- local and cluster together -------------------------------------------------------------
def local_spans(folder: Path) -> list[Span]:
    """Every span in every *.jsonl file of `folder` (missing folder: none)."""
    out: list[Span] = []
    for path in sorted(folder.glob("*.jsonl")) if folder.is_dir() else ():
        out.extend(file_spans(path))
    return out


def collect(args: argparse.Namespace, folder: Path, queries: Sequence[TraceQuery], *,
            follow: bool = False, state: dict[str, Any] | None = None,
            url: str | None = None) -> tuple[list[Span], list[str]]:
    """(the spans to select from, notes for the operator): the local folder's spans merged
    with what the cluster's processes answer. Only the folder with --local or --traces
    DIR, or when no cluster is given or reachable (a note says so)."""
    local = local_spans(folder)
    if getattr(args, "local", False) or getattr(args, "traces", None):
        return local, []
    try:
        peers = discover(args, state, url)
    except CliError as exc:  # the local files alone (the caller says when there are none)
        return local, [f"no cluster reachable ({exc}): the spans of {folder} only"]
    timeout = min(float(getattr(args, "timeout", PEER_TIMEOUT_S)), PEER_TIMEOUT_S)
    seen = [s for s in local if any(matches(s, q) for q in queries)]
    got = gather(peers, queries, timeout, follow=follow, seen=seen)
    notes = [x for x in (silent_line(got), truncated_line(got)) if x]
    return merge(got.spans, local), notes
