"""The campaign's executor fault excuses what the executor process serves when it is killed,
not when it was chosen: a task launched into the same executor host in between (the campaign
samples the cluster between the two) ends with it by the suite's doing, and must not be
counted as a wrong status update (a `make test` failure at stop 24: short-22-x1 started in
host pid 19964 between the choice and the SIGKILL and was counted against the fault)."""

from __future__ import annotations

import subprocess
from pathlib import Path

from chaos import scenario as sc
from chaos.campaign import Campaign
from services import tasks as ts


class Executors:
    """The fleet's executor processes as its agents' checkpoints show them, changeable."""

    def __init__(self, served: dict[int, tuple[str, list[str]]]) -> None:
        self.served = served

    def executors(self) -> dict[int, tuple[str, list[str]]]:
        return {pid: (host, list(ids)) for pid, (host, ids) in self.served.items()}


def test_a_task_launched_into_the_executor_host_after_it_was_chosen_is_excused(
        tmp_path: Path) -> None:
    scen = sc.load(Path(__file__).resolve().parents[2] / "chaos" / "scenarios" / "short.toml")
    campaign = Campaign(scen, tmp_path)
    host = subprocess.Popen(["sleep", "60"])  # stands for the executor host process
    try:
        fleet = Executors({host.pid: ("agent-1", ["e-svc"])})
        campaign.fleet = fleet  # type: ignore[assignment]
        w = campaign.work
        w.states.update({"svc-1": ts.RUNNING, "other": ts.RUNNING})
        w.executor_of.update({"svc-1": "e-svc", "other": "e-other"})
        w.where.update({"svc-1": "agent-1", "other": "agent-2"})
        fault = sc.Fault(target="executor")
        victim = campaign._resolve(fault)
        assert victim == f"executor:{host.pid}"
        # Between the choice and the kill, a short task starts in the same host process.
        fleet.served[host.pid][1].append("e-short")
        w.states["short-22-x1"] = ts.RUNNING
        w.executor_of["short-22-x1"] = "e-short"
        w.where["short-22-x1"] = "agent-1"
        campaign._apply(fault, victim)
        assert host.wait(timeout=10) == -9  # SIGKILLed
        assert {"svc-1", "short-22-x1"} <= w.excused and "other" not in w.excused
        assert campaign._must_end == {"svc-1", "short-22-x1"}
    finally:
        host.kill()
        host.wait()
