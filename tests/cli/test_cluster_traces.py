"""`offerbus trace` / `why` read spans from the cluster (issue 11): each service's trace file
served by a peer (the real query code answering, as /traces does), asked in two rounds (the
spans naming the task, then their traces), merged with the local run dir's files, gives the
same waterfall as all files read locally; peers that do not answer are named in one line;
the peers come from the elections and the master's /state; --local and no cluster keep the
local files."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

import pytest

from services.cli import cluster_traces as ct
from services.cli import main as cli_main
from services.cli import trace as tv
from services.cli.client import CliError
from services.telemetry import query as Q
from tests.cli.test_trace_view import write_cluster_traces


def serving(files: dict[ct.Peer, Path], silent: dict[ct.Peer, str] | None = None,
            asked: list[tuple[str, str]] | None = None) -> ct.Fetch:
    """A fetch that answers as each peer's /traces would, from its file."""
    def get(peer: ct.Peer, q: Q.TraceQuery, timeout: float) -> dict[str, Any]:
        if asked is not None:
            asked.append((peer.name, q.kind))
        if silent and peer in silent:
            raise OSError(silent[peer])
        spans, truncated = Q.scan([files[peer]], q)
        return {"spans": spans, "truncated": truncated}
    return get


@pytest.fixture
def folder(tmp_path: Path) -> Path:
    out = tmp_path / "all"
    write_cluster_traces(out)
    return out


def peers_of(folder: Path, but: str = "") -> dict[ct.Peer, Path]:
    return {ct.Peer(p.stem, f"http://127.0.0.1:{4100 + i}"): p
            for i, p in enumerate(sorted(folder.glob("*.jsonl")))
            if not (but and p.name.startswith(but))}


def keys(spans: list[Q.Span]) -> list[tuple[str, str]]:
    return sorted((s["traceId"], s["spanId"]) for s in spans)


@pytest.mark.parametrize(("kind", "ident"), [("task", "web-0-1"), ("offer", "o-1"),
                                             ("offer", "o-2")])
def test_the_cluster_gives_the_waterfall_the_local_files_give(
        folder: Path, kind: str, ident: str) -> None:
    files = peers_of(folder)
    got = ct.gather(list(files), [Q.TraceQuery(kind, (ident,))], 1.0, follow=True,
                    get=serving(files))
    everything = tv.load_spans(folder)
    assert keys(tv.select(got.spans, kind, ident)) == keys(tv.select(everything, kind, ident))
    assert len(tv.select(got.spans, kind, ident)) >= 3 and not got.silent
    # Without the second round (the spans of their traces) the allocator's and the
    # broker's spans, which do not name the task, would be missing.
    first = ct.gather(list(files), [Q.TraceQuery(kind, (ident,))], 1.0, get=serving(files))
    assert len(tv.select(first.spans, kind, ident)) < len(tv.select(everything, kind, ident))


def test_local_spans_seed_the_second_round(folder: Path) -> None:
    """The framework (an `offerbus run` process here) has no /traces: its decide span is
    local, and the traces it names are still asked of the services."""
    files = peers_of(folder, but="framework-")
    local = [s for p in folder.glob("framework-*.jsonl") for s in tv.load_spans(p.parent)
             if s["resource"]["service.name"].startswith("framework-")]
    got = ct.gather(list(files), [Q.TraceQuery("offer", ("o-2",))], 1.0, follow=True,
                    seen=[s for s in local if Q.matches(s, Q.TraceQuery("offer", ("o-2",)))],
                    get=serving(files))
    merged = Q.merge(got.spans, local)
    assert keys(tv.select(merged, "offer", "o-2")) == keys(
        tv.select(tv.load_spans(folder), "offer", "o-2"))


def test_peers_that_do_not_answer_are_named_in_one_line(folder: Path) -> None:
    files = peers_of(folder)
    quiet = sorted(files, key=lambda p: p.name)[:2]
    asked: list[tuple[str, str]] = []
    got = ct.gather(list(files), [Q.TraceQuery("task", ("web-0-1",))], 1.0, follow=True,
                    get=serving(files, {quiet[0]: "timed out", quiet[1]: "HTTP 404"}, asked))
    line = ct.silent_line(got)
    assert line.startswith(f"2 of {len(files)} peers did not answer: ")
    assert f"{quiet[0].name} at {quiet[0].url} (timed out)" in line and "(HTTP 404)" in line
    assert [k for n, k in asked if n == quiet[0].name] == ["task"]  # not asked again
    assert ct.silent_line(ct.Gathered(peers=list(files))) == ""
    many = ct.Gathered(peers=list(files), silent={p: "down" for p in files})
    assert ct.silent_line(many).endswith(f" and {len(files) - ct.MAX_NAMED} more")


def test_the_peers_come_from_the_elections_and_the_masters_state(
        monkeypatch: pytest.MonkeyPatch) -> None:
    state = {"agents": [
        {"agent_info": {"hostname": "h1", "endpoint": "http://10.0.0.1:5051/"},
         "status": "AGENT_STATUS_REGISTERED"},
        {"agent_info": {"hostname": "h2", "endpoint": "10.0.0.2:5051"},
         "status": "AGENT_STATUS_DISCONNECTED"},
        {"agent_info": {"hostname": "h3", "endpoint": "10.0.0.3:5051"},
         "status": "AGENT_STATUS_GONE"},
        {"agent_info": {"hostname": "h4"}}],
        "leaders": {"allocator": {"id": "a-1", "epoch": 2},
                    "broker": {"id": "b-1", "endpoints": {"http": "http://10.0.0.9:1"}}}}
    assert ct.state_peers(state) == [ct.Peer("agent h1", "http://10.0.0.1:5051"),
                                     ct.Peer("agent h2", "http://10.0.0.2:5051"),
                                     ct.Peer("broker b-1", "http://10.0.0.9:1")]
    members = [ct.Peer("master m-1", "http://10.0.0.5:1"), ct.Peer("broker b-1",
                                                                   "http://10.0.0.9:1")]
    monkeypatch.setattr(ct, "election_peers", lambda url, timeout: members)
    monkeypatch.delenv("OFFERBUS_MASTER", raising=False)
    args = argparse.Namespace(cluster="zk://x:1/c", run_dir=Path("/nonexistent"), timeout=1.0)
    assert ct.discover(args, state) == [*members, *ct.state_peers(state)[:2]]
    # OFFERBUS_MASTER (no ZooKeeper): that master and what its /state lists.
    monkeypatch.setenv("OFFERBUS_MASTER", "10.0.0.5:1")
    args.cluster = None
    assert ct.discover(args, state) == [ct.Peer("master", "http://10.0.0.5:1"),
                                        *ct.state_peers(state)]


def test_local_only_with_local_or_without_a_cluster(
        folder: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("OFFERBUS_MASTER", raising=False)
    monkeypatch.delenv("OFFERBUS_CLUSTER", raising=False)

    def no_cluster(*a: Any) -> list[ct.Peer]:
        raise CliError("no cluster given")

    monkeypatch.setattr(ct, "discover", no_cluster)
    args = argparse.Namespace(cluster=None, run_dir=tmp_path, timeout=1.0, local=False,
                              traces=None)
    q = [Q.TraceQuery("task", ("web-0-1",))]
    spans, notes = ct.collect(args, folder, q, follow=True)
    assert len(spans) == len(tv.load_spans(folder)) and notes[0].startswith("no cluster")
    assert ct.collect(args, tmp_path / "empty", q) == ([], [
        f"no cluster reachable (no cluster given): the spans of {tmp_path / 'empty'} only"])
    args.local = True
    assert ct.collect(args, folder, q) == (spans, [])


def test_cli_trace_reads_the_cluster_and_names_the_silent(
        folder: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    from rich.console import Console

    files = peers_of(folder)
    quiet = ct.Peer("agent gone", "http://127.0.0.1:4999")
    monkeypatch.setattr(ct, "discover", lambda args, state=None, url=None: [*files, quiet])
    monkeypatch.setattr(ct, "fetch", serving({**files, quiet: folder}, {quiet: "timed out"}))
    console = Console(width=250, record=True)
    monkeypatch.setattr(cli_main, "console", console)
    run_dir = tmp_path / "elsewhere"  # no trace files here
    assert cli_main.main(["--run-dir", str(run_dir), "trace", "task", "web-0-1"]) == 0
    assert "task web-0-1: 8 spans in 2 trace(s)" in console.export_text()
    assert f"1 of {len(files) + 1} peers did not answer: agent gone" in capsys.readouterr().err
    assert cli_main.main(["--run-dir", str(run_dir), "trace", "task", "web-0-1",
                          "--local"]) == 1
    assert "no spans for task web-0-1" in console.export_text()


def test_why_asks_for_the_framework_by_id_and_name_and_for_the_task(
        folder: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from services.cli import why
    from tests.cli.test_why import state_json

    asked: list[list[Q.TraceQuery]] = []

    def collect(args: Any, where: Path, queries: list[Q.TraceQuery],
                **kw: Any) -> tuple[list[Q.Span], list[str]]:
        asked.append(list(queries))
        assert kw["state"] is state and kw["url"] == "zk://x:1/c"
        return tv.load_spans(folder), []

    monkeypatch.setattr(ct, "collect", collect)
    state = state_json()
    args = argparse.Namespace(target="web", traces=None, run_dir=tmp_path, local=False)
    spans, _ = why.why_spans(args, "zk://x:1/c", state, "fw-web", {})
    assert asked[-1] == [Q.TraceQuery("framework", ("fw-web",)),
                         Q.TraceQuery("framework", ("web",))] and spans
    args.target = "web-3-1"  # a task of service web, not known to the master
    why.why_spans(args, "zk://x:1/c", state, "fw-web", {})
    assert asked[-1][-1] == Q.TraceQuery("task", ("web-3-1",))
