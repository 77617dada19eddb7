"""The job runner's pure core (frameworks/jobrunner/core.py): nothing runs before it leads and
has the whole stream; each job gets one scheduler, failing over to the framework the master
knows for it (with that framework's live tasks as its instances); a new version updates the
running scheduler; a removed job is torn down; an ended framework restarts after a doubling
back-off; stepping down stops every scheduler with failover. A hypothesis state machine
checks `validate()` and the one-scheduler-per-job rule after every step."""

from __future__ import annotations

from typing import Any

import pytest
from google.protobuf import struct_pb2
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from frameworks.jobrunner.core import (
    RESTART_FIRST_S,
    IllegalMove,
    JobRunnerCore,
    Phase,
    Runner,
    Start,
    Stop,
    Update,
)
from frameworks.spec import SPEC_LABEL
from schemas import bus_pb2, common_pb2, state_pb2
from services.master.records import JOB_LABEL


def job(name: str, version: int = 1, **more: Any) -> bus_pb2.StateEntry:
    spec = struct_pb2.Struct()
    spec.update({"name": name, "role": "*", "image": "busybox", "instances": 2.0,
                 "cpus": 0.1, "mem": 16.0, **more})
    return bus_pb2.StateEntry(key=f"jobs/{name}", value=state_pb2.StateValue(
        job=state_pb2.JobRecord(name=name, role="*", version=version, spec=spec)))


def framework(fid: str, job_name: str, principal: str = "jobs",
              at: int = 1) -> bus_pb2.StateEntry:
    info = common_pb2.FrameworkInfo(framework_id=fid, name=job_name, principal=principal)
    info.labels[JOB_LABEL] = job_name
    return bus_pb2.StateEntry(key=f"frameworks/{fid}", value=state_pb2.StateValue(
        framework=state_pb2.FrameworkRecord(framework_info=info, registered_at_us=at)))


def task(fid: str, tid: str, state: int = common_pb2.TASK_RUNNING) -> bus_pb2.StateEntry:
    return bus_pb2.StateEntry(key=f"tasks/{fid}/{tid}", value=state_pb2.StateValue(
        task=state_pb2.TaskRecord(framework_id=fid, agent_id="S1",
                                  task_info=common_pb2.TaskInfo(
                                      task_id=tid, labels={SPEC_LABEL: "d0"}),
                                  status=common_pb2.TaskStatus(task_id=tid, state=state))))  # type: ignore[arg-type]


def deleted(key: str) -> bus_pb2.StateEntry:
    return bus_pb2.StateEntry(key=key, deleted=True)


def leading(*entries: bus_pb2.StateEntry, principal: str = "jobs") -> tuple[JobRunnerCore,
                                                                            list[Any]]:
    core = JobRunnerCore(principal=principal)
    assert core.lead(0.0) == []  # nothing before the whole stream
    out = core.stream(list(entries), 0.0, reset=True)
    core.validate()
    return core, out


def test_a_job_starts_once_the_runner_leads_and_has_the_snapshot() -> None:
    core = JobRunnerCore()
    assert core.stream([job("web")], 0.0, reset=True) == []  # not leading
    (start,) = core.lead(1.0)
    assert isinstance(start, Start) and (start.name, start.framework_id) == ("web", "")
    assert start.spec.instances == 2 and isinstance(start.spec.instances, int)
    assert core.stream([job("web")], 2.0) == []  # the same version: nothing to do


def test_it_fails_over_to_the_jobs_framework_with_its_live_tasks() -> None:
    _, out = leading(job("web"), framework("F1", "web", at=1), framework("F2", "web", at=5),
                     framework("F9", "web", principal="mallory"),
                     task("F2", "web-0-3"), task("F2", "web-1-1"),
                     task("F2", "web-2-1", common_pb2.TASK_FINISHED), task("F2", "other-0-1"))
    (start,) = out
    assert start.framework_id == "F2"  # the latest registered, of this runner's principal
    assert start.recovered == {"framework_id": "F2", "tasks": {
        "0": {"task_id": "web-0-3", "agent_id": "S1", "state": "TASK_RUNNING",
              "digest": "d0", "healthy": None},
        "1": {"task_id": "web-1-1", "agent_id": "S1", "state": "TASK_RUNNING",
              "digest": "d0", "healthy": None}}}


def test_versions_update_and_removals_tear_down() -> None:
    core, _ = leading(job("web"), job("api"))
    (update,) = core.stream([job("web", 2, instances=5.0)], 1.0)
    assert isinstance(update, Update) and update.spec.instances == 5 and update.version == 2
    assert core.stream([deleted("jobs/api")], 2.0) == [Stop("api", failover=False)]
    assert sorted(core.runners) == ["web"]
    core.validate()


def test_an_ended_framework_restarts_after_a_doubling_back_off() -> None:
    core, _ = leading(job("web"))
    assert core.subscribed("web", "F1", 0.5) == []
    assert core.ended("web", "removed by the operator", 1.0) == [Stop("web", failover=True)]
    assert core.next_deadline() == 1.0 + RESTART_FIRST_S
    assert core.tick(1.5) == []
    (start,) = core.tick(2.0)
    assert isinstance(start, Start) and start.framework_id == ""
    core.ended("web", "refused", 2.5)  # again before it subscribed: twice as long
    assert core.next_deadline() == 2.5 + 2 * RESTART_FIRST_S
    assert core.view()["web"]["last_end"] == "refused"
    core.validate()


def test_a_paused_reign_starts_and_restarts_nothing_until_it_resumes() -> None:
    core, _ = leading(job("web"))
    core.subscribed("web", "F1", 0.5)
    assert core.pause() == []
    assert core.ended("web", "framework F1 failed over to another scheduler", 1.0) == [
        Stop("web", failover=True)]
    assert core.next_deadline() is None and core.tick(100.0) == []
    assert core.stream([job("api")], 100.0) == []  # nothing new either
    out = core.resume(101.0)
    assert sorted(type(c).__name__ + c.name for c in out) == ["Startapi", "Startweb"]
    core.validate()


def test_stepping_down_stops_every_scheduler_with_failover() -> None:
    core, _ = leading(job("web"), job("api"))
    assert core.step_down() == [Stop("api", failover=True), Stop("web", failover=True)]
    assert core.runners == {} and core.stream([job("x")], 3.0) == []
    core.validate()


def test_a_spec_this_runner_cannot_run_is_reported_not_started() -> None:
    core, out = leading(job("web", color="red"))
    assert out == [] and "unknown spec field(s) color" in core.view()["web"]["error"]


def test_moves_outside_the_table_raise() -> None:
    with pytest.raises(IllegalMove):
        JobRunnerCore._move(Runner(1, Phase.ENDED), Phase.SUBSCRIBED)


class RunnerMachine(RuleBasedStateMachine):
    """Random streams, leadership changes and scheduler ends; the shell's view of which
    schedulers run is rebuilt from the commands alone."""

    def __init__(self) -> None:
        super().__init__()
        self.core = JobRunnerCore(principal="jobs")
        self.running: dict[str, str] = {}  # job -> framework id it started with
        self.now = 0.0

    def apply(self, out: list[Any]) -> None:
        for cmd in out:
            if isinstance(cmd, Start):
                assert cmd.name not in self.running, f"{cmd.name} started twice"
                self.running[cmd.name] = cmd.framework_id
            elif isinstance(cmd, Update):
                assert cmd.name in self.running
            else:
                self.running.pop(cmd.name, None)
        self.core.validate()

    @rule(names=st.lists(st.sampled_from("abc"), unique=True), reset=st.booleans(),
          version=st.integers(1, 3))
    def stream(self, names: list[str], reset: bool, version: int) -> None:
        self.apply(self.core.stream([job(n, version) for n in names], self.now, reset=reset))

    @rule(name=st.sampled_from("abc"))
    def remove(self, name: str) -> None:
        self.apply(self.core.stream([deleted(f"jobs/{name}")], self.now))

    @rule(name=st.sampled_from("abc"), fid=st.sampled_from(["F1", "F2"]))
    def framework_seen(self, name: str, fid: str) -> None:
        self.apply(self.core.stream([framework(fid, name)], self.now))

    @rule()
    def lead(self) -> None:
        if not self.core.leading:
            self.apply(self.core.lead(self.now))

    @rule()
    def pause(self) -> None:
        if self.core.leading:
            self.apply(self.core.pause())

    @rule()
    def resume(self) -> None:
        if self.core.leading and self.core.paused:
            self.apply(self.core.resume(self.now))

    @rule()
    def step_down(self) -> None:
        self.apply(self.core.step_down())
        assert self.running == {}

    @rule(name=st.sampled_from("abc"))
    def subscribed(self, name: str) -> None:
        if name in self.running:
            self.apply(self.core.subscribed(name, "F1", self.now))

    @rule(name=st.sampled_from("abc"))
    def ended(self, name: str) -> None:
        if name in self.running:
            self.apply(self.core.ended(name, "gone", self.now))

    @rule(dt=st.floats(0.0, 40.0))
    def time_passes(self, dt: float) -> None:
        self.now += dt
        self.apply(self.core.tick(self.now))

    @invariant()
    def schedulers_are_the_runners_that_have_not_ended(self) -> None:
        live = {n for n, r in self.core.runners.items() if r.phase is not Phase.ENDED}
        assert set(self.running) == live


RunnerMachine.TestCase.settings = settings(max_examples=150, stateful_step_count=40,
                                           deadline=None)
test_runner_machine = RunnerMachine.TestCase
