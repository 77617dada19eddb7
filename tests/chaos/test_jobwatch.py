"""What the chaos suite sees of its job (chaos/jobwatch.py), without a fleet: instances
running, an instance lost (its task ended, its container gone), relaunched while the old
task still ran, ended by the suite's own executor kill (excused), and when the job counts
as back."""

from __future__ import annotations

from typing import Any

from chaos.jobwatch import JOB_NAME, JobWatch, job_spec

AGENTS = [{"agent_info": {"agent_id": "a1", "hostname": "agent-1"}},
          {"agent_info": {"agent_id": "a2", "hostname": "agent-2"}}]


def state(tasks: dict[str, str], connected: bool = True,
          executors: dict[str, str] | None = None) -> dict[str, Any]:
    """A master's /state with the job's framework and `tasks` (task id -> state)."""
    fw = {"framework_info": {"framework_id": "f1", "name": JOB_NAME,
                             "labels": {"offerbus.job": JOB_NAME}}, "connected": connected}
    other = {"framework_info": {"framework_id": "f2", "name": "chaos"}, "connected": True}
    docs = [{"framework_id": "f1", "agent_id": "a1",
             "task_info": {"task_id": t},
             "status": {"state": s, "executor_id": (executors or {}).get(t, "")}}
            for t, s in tasks.items()]
    docs.append({"framework_id": "f2", "agent_id": "a1", "task_info": {"task_id": "svc-0-1"},
                 "status": {"state": "TASK_FAILED"}})
    return {"frameworks": [fw, other], "agents": AGENTS, "tasks": docs}


def running(n: int, attempt: int = 0) -> dict[str, str]:
    return {f"{JOB_NAME}-{i}-{attempt}": "TASK_RUNNING" for i in range(n)}


def test_the_job_is_back_when_subscribed_connected_and_every_instance_runs() -> None:
    watch = JobWatch(instances=3)
    assert job_spec(3, "img").command == ["sleep", "86400"]
    view = watch.observe_master(state(running(3)), "subscribed", 1.0)
    assert (view.connected, view.running) == (True, 3)
    assert watch.missing(view) == ""
    assert "2/3" in watch.missing(watch.observe_master(
        state({**running(2), f"{JOB_NAME}-2-0": "TASK_STAGING"}), "subscribed", 2.0))
    assert "not connected" in watch.missing(watch.observe_master(
        state(running(3), connected=False), "subscribed", 3.0))
    assert "starting" in watch.missing(watch.observe_master(state(running(3)), "starting", 4.0))
    assert "no leading job runner" in watch.missing(
        watch.observe_master(state(running(3)), None, 5.0))
    assert JobWatch(instances=0).missing(None) == ""
    assert watch.events == []


def test_an_instance_that_ends_or_whose_container_goes_is_lost_once() -> None:
    watch = JobWatch(instances=2)
    ids = list(running(2))
    watch.observe_master(state(running(2)), "subscribed", 1.0)
    watch.observe_containers([*ids, "svc-0-1"], 1.5)
    watch.observe_master(state({ids[0]: "TASK_FAILED", ids[1]: "TASK_RUNNING"}),
                         "subscribed", 2.0)
    watch.observe_containers([ids[1]], 2.5)  # the failed one's container is gone too
    watch.observe_containers([], 3.0)  # the other's container goes, the master not told yet
    assert [(t, k) for t, k, _ in watch.events] == [(2.0, "lost"), (3.0, "lost")]
    assert ids[0] in watch.events[0][2] and "TASK_FAILED" in watch.events[0][2]
    assert ids[1] in watch.events[1][2] and "container" in watch.events[1][2]


def test_a_relaunch_while_the_old_task_runs_is_a_duplicate() -> None:
    watch = JobWatch(instances=1)
    old, new = f"{JOB_NAME}-0-0", f"{JOB_NAME}-0-1"
    watch.observe_master(state({old: "TASK_RUNNING"}), "subscribed", 1.0)
    watch.observe_master(state({old: "TASK_RUNNING", new: "TASK_STAGING"}), "subscribed", 2.0)
    watch.observe_master(state({old: "TASK_RUNNING", new: "TASK_STAGING"}), "subscribed", 2.1)
    watch.observe_containers([old, new], 2.5)
    kinds = [(t, k) for t, k, _ in watch.events]
    assert kinds == [(2.0, "duplicate")]  # one relaunch, one duplicate
    assert "master" in watch.events[0][2]
    docker_only = JobWatch(instances=1)  # Docker alone sees it too
    docker_only.observe_containers([old, new], 3.0)
    docker_only.observe_containers([new, new], 4.0)  # one task id, two containers
    assert [(t, k) for t, k, d in docker_only.events if "containers" in d] == [
        (3.0, "duplicate"), (4.0, "duplicate")]


def test_one_task_id_live_in_two_frameworks_is_a_duplicate() -> None:
    watch = JobWatch(instances=1)
    doc = state({f"{JOB_NAME}-0-1": "TASK_RUNNING"})
    twin = {**doc["tasks"][0], "framework_id": "f0"}
    doc["frameworks"].append({"framework_info": {"framework_id": "f0", "name": JOB_NAME}})
    watch.observe_master({**doc, "tasks": [*doc["tasks"], twin]}, "subscribed", 1.0)
    assert [k for _, k, _ in watch.events] == ["duplicate"]
    assert "(f0)" in watch.events[0][2] and "(f1)" in watch.events[0][2]


def test_a_relaunch_after_the_old_task_ended_is_no_duplicate() -> None:
    watch = JobWatch(instances=1)
    old, new = f"{JOB_NAME}-0-0", f"{JOB_NAME}-0-1"
    watch.observe_master(state({old: "TASK_RUNNING"}), "subscribed", 1.0)
    watch.observe_master(state({old: "TASK_KILLED", new: "TASK_RUNNING"}), "subscribed", 2.0)
    assert [k for _, k, _ in watch.events] == ["lost"]


def test_instances_on_an_executor_the_suite_kills_are_excused() -> None:
    watch = JobWatch(instances=2)
    a, b = f"{JOB_NAME}-0-0", f"{JOB_NAME}-1-0"
    watch.observe_master(state(running(2), executors={a: "e1", b: "e2"}), "subscribed", 1.0)
    watch.observe_containers([a, b], 1.2)
    assert watch.excuse("agent-1", ["e1"]) == {a}
    watch.observe_containers([b], 2.0)
    watch.observe_master(state({a: "TASK_FAILED", b: "TASK_RUNNING",
                                f"{JOB_NAME}-0-1": "TASK_RUNNING"}), "subscribed", 2.5)
    assert watch.events == []
    watch.observe_containers([], 3.0)  # b was not on the killed executor
    assert [d.split(":")[0] for _, _, d in watch.events] == [b]
