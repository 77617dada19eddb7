"""`offerbus run / stop / scale` decisions without a cluster: a name in use is refused (exit
2, pointing at scale and stop), progress is told from a stall (a slow 50-instance start is
not a failure; a crash loop is), and the counts shown while waiting."""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from rich.console import Console

from frameworks import service
from frameworks import spec as specs
from services.cli import lifecycle
from services.cli import main as cli_main


def state(frameworks: dict[str, str] | None = None,
          tasks: list[tuple[str, str, str]] = ()) -> dict[str, Any]:  # type: ignore[assignment]
    """A master /state: frameworks {id: name}, tasks [(framework id, task id, state)]."""
    return {"agents": [], "roles": [],
            "frameworks": [{"framework_info": {"framework_id": fid, "name": name},
                            "connected": True} for fid, name in (frameworks or {}).items()],
            "tasks": [{"framework_id": fid, "task_info": {"task_id": tid},
                       "status": {"state": st}} for fid, tid, st in tasks]}


@pytest.fixture
def cli(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Any:
    """Runs `offerbus ...` in-process against a given /state; records spawned processes."""
    spawned: list[list[str]] = []
    console = Console(width=200, record=True)
    monkeypatch.setattr(cli_main, "console", console)

    def run(doc: dict[str, Any] | list[dict[str, Any]], *argv: str) -> tuple[int, str]:
        """`doc`: the /state every call returns, or a list of them in turn (last repeated)."""
        docs = list(doc) if isinstance(doc, list) else [doc]
        monkeypatch.setattr(lifecycle, "master_state",
                            lambda url, t, query="": (None, docs.pop(0) if len(docs) > 1
                                                      else docs[0]))
        monkeypatch.setattr(lifecycle.cluster, "spawn",
                            lambda run_dir, name, argv, env=None: spawned.append(argv) or 4242)
        code = cli_main.main(["--run-dir", str(tmp_path), "--cluster", "file:///x", *argv])
        return code, console.export_text()

    run.spawned = spawned  # type: ignore[attr-defined]
    return run


RUN_WEB = ("run", "--name", "web", "--image", "offerbus/busybox:latest", "--no-wait", "--",
           "sleep", "60")


def test_run_refuses_a_name_registered_with_the_master(cli: Any) -> None:
    code, out = cli(state({"fw-1": "web"}), *RUN_WEB)
    assert code == lifecycle.EXIT_NAME_IN_USE == 2
    assert "framework named 'web' is registered" in out and "fw-1" in out
    assert "offerbus scale web N" in out and "offerbus stop web" in out
    assert cli.spawned == []


def test_run_refuses_a_name_of_this_run_dir(cli: Any, tmp_path: Path,
                                           monkeypatch: pytest.MonkeyPatch) -> None:
    specs.write_spec(tmp_path, service.ServiceSpec("web", "img", 1, 0.1, 32))
    monkeypatch.setattr(lifecycle.cluster, "running", lambda run_dir: {"framework-web": 7})
    code, out = cli(state(), *RUN_WEB)
    assert code == 2 and "service named 'web' exists in this run dir" in out
    assert cli.spawned == []


def test_run_resumes_this_run_dirs_service_whose_process_is_gone(cli: Any,
                                                                 tmp_path: Path) -> None:
    """After a machine restart: the spec and status file stay, the process is gone."""
    specs.write_spec(tmp_path, service.ServiceSpec("web", "img", 1, 0.1, 32))
    code, out = cli(state({"fw-1": "web"}), *RUN_WEB)
    assert code == 0 and "resuming service web" in out and "fw-1 fails over" in out
    assert len(cli.spawned) == 1


def test_run_with_a_free_name_starts_one_framework_with_its_spec(cli: Any,
                                                                 tmp_path: Path) -> None:
    code, _ = cli(state({"fw-1": "db"}), "run", "--name", "web", "--image", "img", "--role",
                  "blue", "--env", "A=1", "--env", "B=x=y", "--port", "80", "--health-http",
                  "/ok", "--health-failures", "5", "--no-wait", "--", "sleep", "60")
    assert code == 0 and len(cli.spawned) == 1
    spec = specs.read_spec(tmp_path, "web")
    assert (spec.role, spec.env, spec.ports) == ("blue", {"A": "1", "B": "x=y"}, [80])
    assert (spec.health_http, spec.health_failures, spec.command) == ("/ok", 5, ["sleep", "60"])


def test_bad_arguments_are_clear_errors(cli: Any) -> None:
    code, out = cli(state(), "run", "--name", "web", "--env", "NOEQUALS", "--no-wait")
    assert code == 1 and "bad --env 'NOEQUALS'" in out
    code, out = cli(state(), "run", "--name", "web", "--health-http", "/", "--no-wait")
    assert code == 1 and "--port" in out
    code, out = cli(state(), "scale", "nothing", "3")
    assert code == 1 and "no service 'nothing'" in out


def test_a_name_no_container_can_carry_is_refused_before_anything_starts(cli: Any) -> None:
    """`offerbus run --name "bad name!"` started a framework whose every instance failed on
    the engine ("Invalid container name") until the 60 s stall window ended. The name is
    checked as a job file's is, before any process starts; and text in brackets in an
    error is shown as written, not taken for console markup (the engine's list of allowed
    characters, [a-zA-Z0-9][a-zA-Z0-9_.-], vanished from the line)."""
    for bad in ("bad name!", "-dash", "x" * 64, "a/b"):
        code, out = cli(state(), "run", f"--name={bad}", "--image", "i", "--no-wait", "--",
                        "sleep", "1")
        assert code == 1 and "letters, digits" in out, (bad, out)
    assert not cli.spawned
    code, out = cli(state(), "run", "--name", "ok.name_1-x", "--image", "i", "--no-wait")
    assert code == 0 and len(cli.spawned) == 1
    code, out = cli(state(), "run", "--name", "web", "--constraint", "[a-z]", "--no-wait")
    assert code == 1 and "[a-z]" in out, out
    console = Console(width=200, record=True)
    lifecycle.Reporter(console, "t").show("create failed: only [a-zA-Z0-9][a-zA-Z0-9_.-] "
                                          "are allowed")
    assert "only [a-zA-Z0-9][a-zA-Z0-9_.-] are allowed" in console.export_text()


def test_counts_shown_while_waiting() -> None:
    doc = state({"fw-1": "web", "fw-2": "db"},
                [("fw-1", f"web-{i}-1", "TASK_RUNNING") for i in range(12)]
                + [("fw-1", f"web-{i}-1", "TASK_STAGING") for i in range(12, 42)]
                + [("fw-1", "web-0-0", "TASK_FAILED"), ("fw-2", "db-0-1", "TASK_RUNNING")])
    counts = lifecycle.service_counts(doc, "web", 50)
    assert lifecycle.summary(counts) == "12 running, 30 staging, 8 pending, 1 ended"


def test_a_slow_start_that_keeps_progressing_is_not_a_failure() -> None:
    """50 containers taking 11 s (the old fixed 10 s deadline failed this)."""
    progress = lifecycle.Progress(50, 0.0)
    t = 0.0
    for running in range(0, 50, 5):  # 5 more running every 1.1 s
        t += 1.1
        assert progress.observe(Counter(RUNNING=running, STAGING=50 - running), t) == "waiting"
    assert progress.observe(Counter(RUNNING=50), 11.5) == "done"


def test_no_progress_for_the_stall_window_fails_and_a_crash_loop_is_no_progress() -> None:
    progress = lifecycle.Progress(3, 0.0, stall_s=60.0)
    assert progress.observe(Counter(RUNNING=1, STAGING=2), 1.0) == "waiting"
    # Instances keep failing and being relaunched: the counts move, the best does not.
    for i in range(2, 61):
        loop = Counter(RUNNING=1, STAGING=2) if i % 2 else Counter(RUNNING=1, pending=2)
        verdict = progress.observe(loop, float(i))
        assert verdict == ("stalled" if i >= 61 else "waiting"), i
    assert progress.observe(Counter(RUNNING=1, pending=2), 61.0) == "stalled"


def test_timeout_bounds_the_wait_even_with_progress() -> None:
    progress = lifecycle.Progress(100, 0.0, timeout_s=5.0)
    assert progress.observe(Counter(RUNNING=1), 1.0) == "waiting"
    assert progress.observe(Counter(RUNNING=2), 5.0) == "timeout"


def test_name_in_use_decision() -> None:
    assert lifecycle.name_in_use("web", state({"f": "db"}), False) is None
    assert "registered" in (lifecycle.name_in_use("web", state({"f": "web"}), False) or "")
    assert "run dir" in (lifecycle.name_in_use("web", state(), True) or "")
    # this run dir's service whose framework process is gone (a machine restart): resumed
    assert lifecycle.name_in_use("web", state({"f": "web"}), True, process_alive=False) is None
    assert "fails over" in (lifecycle.resuming("web", state({"f": "web"}), True, False) or "")
    assert "anew" in (lifecycle.resuming("web", state(), True, False) or "")
    assert lifecycle.resuming("web", state({"f": "web"}), True, True) is None
    assert lifecycle.resuming("web", state({"f": "web"}), False, False) is None


def test_a_stalled_run_fails_saying_what_is_stuck(cli: Any, monkeypatch: pytest.MonkeyPatch,
                                                  tmp_path: Path) -> None:
    from services.cli import why

    def no_allocator(*a: Any, **kw: Any) -> Any:
        raise lifecycle.CliError("no leading allocator")

    monkeypatch.setattr(why, "find_leader", no_allocator)
    monkeypatch.setattr(lifecycle.cluster, "alive", lambda pid: True)
    stuck = state({"fw-1": "web"}, [("fw-1", "web-0-1", "TASK_STAGING")])
    code, out = cli([state(), stuck], "run", "--name", "web", "--image", "img", "--instances", "2",
                    "--stall", "0.2", "--", "sleep", "60")
    assert code == 1
    assert "web: no progress for 0.2s (1 staging, 1 pending)" in out
    assert "Framework web (fw-1) (role *) is connected and has 1 live task(s)" in out
    assert "offerbus why web" in out and "framework-web.log" in out


def test_while_instances_fail_the_progress_says_the_last_failure(
        cli: Any, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """A crash loop showed only "1 pending, 6 ended" until the stall window ended: the
    progress line now says the last failure (from the framework's status file), so the
    user sees why at once."""
    import json

    from services.cli import why

    monkeypatch.setattr(why, "find_leader", lambda *a, **kw: (_ for _ in ()).throw(
        lifecycle.CliError("no leading allocator")))
    monkeypatch.setattr(lifecycle.cluster, "alive", lambda pid: True)
    status = tmp_path / "frameworks" / "web.status.json"
    status.parent.mkdir(parents=True, exist_ok=True)
    status.write_text(json.dumps({"name": "web", "last_failure": {
        "task_id": "web-0-2", "state": "TASK_FAILED",
        "reason": "REASON_CONTAINER_LAUNCH_FAILED", "message": "no such image: nope"}}))
    failing = state({"fw-1": "web"}, [("fw-1", "web-0-1", "TASK_FAILED"),
                                      ("fw-1", "web-0-2", "TASK_FAILED")])
    code, out = cli([state(), failing], "run", "--name", "web", "--image", "nope",
                    "--stall", "0.2", "--", "sleep", "60")
    assert code == 1
    assert ("web: 1 pending, 2 ended; last failure web-0-2: TASK_FAILED "
            "(REASON_CONTAINER_LAUNCH_FAILED): no such image: nope") in out
    # And the error the run ends with says it too: it is what stays on the screen (the
    # progress line is redrawn) and what a script's log keeps.
    assert ("web: no progress for 0.2s (1 pending, 2 ended); last failure web-0-2: "
            "TASK_FAILED (REASON_CONTAINER_LAUNCH_FAILED): no such image: nope.") \
        in " ".join(out.split())


def test_a_run_whose_framework_exits_fails_at_once(cli: Any, monkeypatch: pytest.MonkeyPatch,
                                                   tmp_path: Path) -> None:
    monkeypatch.setattr(lifecycle.cluster, "alive", lambda pid: False)
    code, out = cli(state(), "run", "--name", "web", "--image", "img", "--", "sleep", "60")
    assert code == 1 and "the web framework exited; see" in out


def test_counts_from_a_document_filtered_to_the_service() -> None:
    """The poll of `run` asks for the service's frameworks and task counts only."""
    full = state({"fw-1": "web", "fw-2": "db"},
                 [("fw-1", "web-0-1", "TASK_RUNNING"), ("fw-1", "web-1-1", "TASK_STAGING"),
                  ("fw-1", "web-1-0", "TASK_FAILED"), ("fw-2", "db-0-1", "TASK_RUNNING")])
    filtered = {"frameworks": full["frameworks"][:1], "roles": [],
                "filter": {"framework": [], "framework_name": ["web"]},
                "task_counts": {"TASK_RUNNING": 1, "TASK_STAGING": 1, "TASK_FAILED": 1}}
    assert lifecycle.service_counts(filtered, "web", 3) == lifecycle.service_counts(
        full, "web", 3) == Counter(RUNNING=1, STAGING=1, pending=1, ended=1)
    # Counts not filtered to this name are not taken for the service's.
    unfiltered = {**filtered, "filter": {"framework": [], "framework_name": ["db"]}}
    assert lifecycle.service_counts(unfiltered, "web", 3) == Counter(pending=3)
    assert lifecycle.service_query("web") == (
        "framework_name=web&tasks=0&agents=0&decisions=1")


def test_a_waiting_run_says_what_the_allocator_decided_on_its_framework() -> None:
    doc = state({"fw-1": "web", "fw-2": "db"}, [])
    doc["decisions"] = [
        {"framework_id": "fw-2", "outcome": "OUTCOME_NO_FIT", "reason": "not this one"},
        {"framework_id": "fw-1", "outcome": "OUTCOME_FAIR_SHARE",
         "reason": "below its fair share: revoking cpus:1 of fw-2's tasks on a1 (grace 5 s)"}]
    assert lifecycle.allocator_says(doc, "web") == (
        "; allocator: below its fair share: revoking cpus:1 of fw-2's tasks on a1 (grace 5 s)")
    doc["decisions"][1].update(outcome="OUTCOME_OFFERED", reason="offered 1 agent(s)")
    assert lifecycle.allocator_says(doc, "web") == ""  # offers come: nothing to wait for
    doc["decisions"][1].update(outcome="OUTCOME_NO_FIT", reason="x" * 500)
    said = lifecycle.allocator_says(doc, "web")
    assert len(said) == len("; allocator: ") + lifecycle.MAX_SAID_CHARS and said.endswith("…")
    assert lifecycle.allocator_says({"frameworks": doc["frameworks"]}, "web") == ""


def test_polls_are_frequent_while_things_change_and_back_off_when_not() -> None:
    backoff = lifecycle.Backoff(0.1, 0.5)
    assert [backoff.next(c) for c in (True, False, False, False, False, True, False)] == \
        [0.1, 0.2, 0.4, 0.5, 0.5, 0.1, 0.2]


def test_the_poller_sees_a_change_as_it_happens_and_backs_off_from_a_master_that_does_not_hold(
        ) -> None:
    """`offerbus run` returned up to a poll interval (0.1-0.5 s) after its last instance
    was RUNNING. It now asks the master to hold an unchanged answer until the document
    changes (Prefer: wait) and sees the change as it happens; a master that answers at once
    is polled with a backoff, not in a spin. (Real HTTP servers; no cluster.)"""
    import threading
    from types import SimpleNamespace

    from services.bus.reactor import Reactor
    from services.shell.http import Direct, Query, Response, StatusServer

    version, cond, waiting = [1], threading.Condition(), threading.Event()

    def doc(query: Query) -> Response:
        with cond:
            v = version[0]
        return Response(200, "application/json", b'{"v": %d}' % v, f'"v{v}"')

    def changes(seen: int, timeout: float) -> int:
        with cond:
            if seen >= 0:
                waiting.set()
            cond.wait_for(lambda: version[0] != seen, timeout)
            return version[0]

    holding = StatusServer(Reactor(), "127.0.0.1", 0, {"/state": Direct(doc, changes)})
    plain = StatusServer(Reactor(), "127.0.0.1", 0, {"/state": Direct(doc)})
    try:
        poll = lifecycle.StatePoller("unused", 10.0)
        poll.leader = SimpleNamespace(endpoints={"http": holding.url})
        assert poll.next() == {"v": 1}  # the first: at once
        got: list[Any] = []
        follower = threading.Thread(target=lambda: got.append(poll.next()), daemon=True)
        follower.start()
        assert waiting.wait(10), "the poller did not ask the master to hold its answer"
        with cond:
            version[0] = 2
            cond.notify_all()
        follower.join(10)
        assert got == [{"v": 2}]
        assert poll._pause == lifecycle.POLL_GAP_S  # a changed answer: a short gap

        other = lifecycle.StatePoller("unused", 10.0)
        other.leader = SimpleNamespace(endpoints={"http": plain.url})
        assert other.next() == {"v": 2}
        assert other.next() == {"v": 2}  # a 304 at once: not held
        assert other._pause == 2 * lifecycle.POLL_MIN_S  # backing off, as Backoff does
        assert other.next() == {"v": 2}
        assert other._pause == 4 * lifecycle.POLL_MIN_S
    finally:
        holding.close()
        plain.close()
