"""The master's /state under load (issue 8): an in-process master (real sockets, file
election and registry) holding 1k, 5k and 20k tasks, its state changing (one task launched
every CHURN_S), while a client fetches /state in a loop. Two ways, taking turns going first:

- old: the document built on the reactor from the core (the route the master had before
  issue 8: `reference_document` of services/master/view.py, run through the reactor's mailbox);
- new: /state as served now, from the view on the HTTP threads.

Per way: the scrape's latency, and the reactor's lateness (a timer every TICK_S: how late it
ran; a heartbeat is sent by such a timer, so this is how late heartbeats would be).

The heap the setup built is frozen (gc.freeze): the cyclic collector's full passes over it
hold the GIL 0.1-0.4 s at 5k tasks whatever /state does, and would blur both ways' figures
(a stall of their own, left for another change)."""

from __future__ import annotations

import gc
import itertools
import logging
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from bench.report import progress, summary, write
from schemas import agent_pb2, common_pb2, internal_pb2, scheduler_pb2
from services.master.core import MasterCore
from services.master.shell import MasterConfig, MasterShell
from services.master.view import reference_document
from services.resources import Resources
from services.shell.http import Query, Response, json_response

SIZES = (1000, 5000, 20_000)
WAYS = ("old", "new")
ROUNDS = 3
WINDOW_S = 2.0  # each way scrapes at least this long ...
MIN_SCRAPES = 3  # ... and at least this many times
TICK_S = 0.01
CHURN_S = 0.05


class Master:
    """A leading master with one agent and one framework holding `tasks` tasks."""

    def __init__(self, run_dir: Path, tasks: int) -> None:
        # The agent is a name only (no connection): never declared unreachable meanwhile.
        self.m = MasterShell(MasterConfig("bench", f"file://{run_dir}", f"file://{run_dir}",
                                          agent_timeout_s=3600))
        m = self.m
        if not m.reactor.run(until=lambda: m.core is not None, timeout=10):
            raise RuntimeError("the master never led")
        core = self.core
        res = Resources.parse(f"cpus:{tasks * 2 + 10_000};mem:{tasks * 256 + 10**7}")
        m.driver.step(lambda now: core.agent_call(b"a1", agent_pb2.AgentCall(
            register=agent_pb2.AgentCall.Register(agent_info=common_pb2.AgentInfo(
                hostname="a1", resources=res.to_proto()))), now))
        self.aid = next(iter(core.agents))
        info = common_pb2.FrameworkInfo(name="bench", role="*", principal="bench")
        call = scheduler_pb2.SchedulerCall(subscribe=scheduler_pb2.SchedulerCall.Subscribe(
            framework_info=info))
        m.driver.step(lambda now: core.scheduler_call(b"f1", call, "sub", now))
        self.fid = next(iter(core.frameworks))
        self.launched = 0
        for i in range(0, tasks, 500):
            self.launch(min(500, tasks - i))
        m.reactor.run(timeout=0.05)
        assert m.http is not None
        self.url = m.http.url
        # The old way, as the master served /state before issue 8: on the reactor.
        m.http.routes["/state-old"] = self._old

    @property
    def core(self) -> MasterCore:
        assert self.m.core is not None
        return self.m.core

    def _old(self, query: Query) -> Response:
        return json_response(reference_document(self.m.view.meta(),
                                                self.core.snapshot_entries()))

    def launch(self, n: int) -> None:
        core = self.core
        tasks = [common_pb2.TaskInfo(task_id=f"t{j}", name=f"t{j}", resources=Resources.parse(
            "cpus:1;mem:128").to_proto()) for j in range(self.launched, self.launched + n)]
        self.launched += n
        op = common_pb2.Operation(launch=common_pb2.Operation.Launch(tasks=tasks))
        msg = internal_pb2.InternalMessage(launch_request=internal_pb2.InternalMessage
                                           .LaunchRequest(request_id=f"r{self.launched}",
                                                          framework_id=self.fid,
                                                          agent_id=self.aid, offer_ids=["o"],
                                                          operations=[op]))
        self.m.driver.step(lambda now: core.internal_message(b"broker", msg, now, ""))

    def close(self) -> None:
        self.m.close()


# The client is a process of its own (as curl or the CLI are): its reading of the documents
# does not compete for the master's GIL. One line per fetch: status, seconds, bytes; it
# stops, between two fetches, once its stdin is closed.
SCRAPER = """
import select, sys, time, urllib.error, urllib.request
while not select.select([sys.stdin], [], [], 0)[0]:
    started = time.perf_counter()
    try:
        with urllib.request.urlopen(sys.argv[1], timeout=60) as resp:
            status, size = resp.status, len(resp.read())
    except urllib.error.HTTPError as exc:
        status, size = exc.code, 0
    print(status, time.perf_counter() - started, size, flush=True)
"""


def window(master: Master, way: str) -> dict[str, Any]:
    """Scrape `way`'s /state in a loop while the state churns; the reactor's lateness."""
    path = "/state-old" if way == "old" else "/state"
    lines: list[list[str]] = []
    ticks: list[float] = []
    churn = itertools.count()

    def tick() -> None:
        ticks.append(time.perf_counter())
        if next(churn) % round(CHURN_S / TICK_S) == 0:
            master.launch(1)

    reactor = master.m.reactor
    timer = reactor.every(TICK_S, tick)
    scraper = subprocess.Popen([sys.executable, "-c", SCRAPER, master.url + path],
                               stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert scraper.stdin is not None and scraper.stdout is not None
    out = scraper.stdout
    reader = threading.Thread(target=lambda: lines.extend(ln.split() for ln in out),
                              daemon=True)
    reader.start()
    started = time.perf_counter()
    reactor.run(until=lambda: len(lines) >= MIN_SCRAPES
                and time.perf_counter() - started >= WINDOW_S, timeout=120)
    timer.cancel()
    scraper.stdin.close()
    # Its request in flight may need the reactor (the old way): served before the next way.
    if not reactor.run(until=lambda: scraper.poll() is not None, timeout=60):
        scraper.kill()
    scraper.wait()
    reader.join(5)
    done = [(int(st), float(sec), int(size)) for st, sec, size in lines]
    if any(st not in (200, 503) for st, _, _ in done):
        raise RuntimeError(f"{path}: unexpected answers {sorted({d[0] for d in done})}")
    late = [max(0.0, b - a - TICK_S) for a, b in itertools.pairwise(ticks)]
    return {"scrape_s": [sec for st, sec, _ in done if st == 200], "lateness_s": late,
            "bytes": max((size for _, _, size in done), default=0),
            "busy": sum(st == 503 for st, _, _ in done)}  # not taken by the reactor in 5 s


def main() -> None:
    logging.getLogger("master").setLevel(logging.ERROR)  # "send failed": no agent, no broker
    results: dict[str, Any] = {"config": {
        "sizes": SIZES, "rounds": ROUNDS, "window_s": WINDOW_S, "min_scrapes": MIN_SCRAPES,
        "tick_s": TICK_S, "churn_s": CHURN_S}}
    rows = []
    for size in SIZES:
        run_dir = Path(tempfile.mkdtemp(prefix="bench-state-"))
        master = Master(run_dir, size)
        gc.collect()
        gc.freeze()
        samples: dict[str, dict[str, list[float]]] = {
            w: {"scrape_s": [], "lateness_s": []} for w in WAYS}
        busy = dict.fromkeys(WAYS, 0)
        nbytes = 0
        try:
            for r in range(ROUNDS):
                for way in (WAYS if r % 2 == 0 else WAYS[::-1]):
                    got = window(master, way)
                    samples[way]["scrape_s"] += got["scrape_s"]
                    samples[way]["lateness_s"] += got["lateness_s"]
                    nbytes = max(nbytes, got["bytes"])
                    busy[way] += got["busy"]
                    progress(f"{size} tasks, round {r + 1}, {way}: {len(got['scrape_s'])} "
                             f"scrapes ({got['busy']} answered 503), reactor late "
                             f"{max(got['lateness_s']) * 1000:.0f} ms at most")
        finally:
            gc.unfreeze()
            master.close()
            shutil.rmtree(run_dir, ignore_errors=True)
        entry: dict[str, Any] = {"bytes": nbytes}
        for way in WAYS:
            entry[way] = {k: summary(v) for k, v in samples[way].items() if v}
            entry[way]["busy_503"] = busy[way]
        results[str(size)] = entry
        rows.append((size, entry))
    report(results, rows)


def report(results: dict[str, Any], rows: list[tuple[int, dict[str, Any]]]) -> None:
    print(f"\n{'tasks':>6} {'way':<4} {'scrapes':>7} {'503':>4} {'scrape p50':>10} "
          f"{'scrape max':>10} {'late p99':>9} {'late max':>9} {'old/new late max':>16}")
    none = {"n": 0, "p50": float("nan"), "max": float("nan")}
    for size, entry in rows:
        for way in WAYS:
            s, late = entry[way].get("scrape_s", none), entry[way]["lateness_s"]
            ratio = ""
            if way == "new":
                new_max = late["max"] or 1e-6
                ratio = f"{entry['old']['lateness_s']['max'] / new_max:.0f}x"
                entry["old_over_new_lateness_max"] = entry["old"]["lateness_s"]["max"] / new_max
            print(f"{size:>6} {way:<4} {s['n']:>7} {entry[way]['busy_503']:>4} "
                  f"{s['p50'] * 1000:>8.1f}ms "
                  f"{s['max'] * 1000:>8.1f}ms {late['p99'] * 1000:>7.1f}ms "
                  f"{late['max'] * 1000:>7.1f}ms {ratio:>16}")
    print(f"(document {rows[-1][1]['bytes'] / 1e6:.1f} MB at {rows[-1][0]} tasks; the reactor "
          f"runs a {TICK_S * 1000:g} ms timer and launches a task every {CHURN_S * 1000:g} ms)")
    print(f"results: {write('state', results)}")


if __name__ == "__main__":
    main()
