"""Task environments on HTTP (issue 11): the master's /state (and the reference document it is
tested against) shows every environment variable's name and never its value, the task's and
its health check's; everything else stays as it was."""

from __future__ import annotations

import json

from schemas import bus_pb2, common_pb2, state_pb2
from services.master.view import StateView, reference_document
from services.shell.http import REDACTED, redacted

SECRET = "hunter2-do-not-show"


def secret_task() -> bus_pb2.StateEntry:
    info = common_pb2.TaskInfo(task_id="t1", name="db")
    info.command.value = "run"
    info.command.env["DB_PASSWORD"] = SECRET
    info.command.env["MODE"] = "prod"
    info.health_check.command.command.value = "check"
    info.health_check.command.command.env["CHECK_TOKEN"] = SECRET
    value = state_pb2.StateValue(task=state_pb2.TaskRecord(
        framework_id="f", task_info=info,
        status=common_pb2.TaskStatus(state=common_pb2.TASK_RUNNING)))
    return bus_pb2.StateEntry(key="tasks/f/t1", value=value)


def test_state_shows_the_names_of_a_tasks_environment_never_the_values() -> None:
    view = StateView("m1")
    view.lead([secret_task()], epoch=1, paused=False, cluster_id="c")
    status, body, _ = view.document({})
    assert status == 200
    assert SECRET.encode() not in body and b"prod" not in body
    [task] = json.loads(body)["tasks"]
    info = task["task_info"]
    assert info["command"]["env"] == {"DB_PASSWORD": REDACTED, "MODE": REDACTED}
    assert info["health_check"]["command"]["command"]["env"] == {"CHECK_TOKEN": REDACTED}
    assert info["command"]["value"] == "run" and info["name"] == "db"

    reference = reference_document({"master_id": "m1"}, [secret_task()])
    assert SECRET.encode() not in reference
    assert json.loads(reference)["tasks"] == json.loads(body)["tasks"]


def test_only_env_maps_are_redacted() -> None:
    doc = {"env": {"A": "1"}, "labels": {"env": "prod"}, "list": [{"env": {"B": "2"}}],
           "name": "env"}
    assert redacted(doc) == {"env": {"A": REDACTED}, "labels": {"env": "prod"},
                             "list": [{"env": {"B": REDACTED}}], "name": "env"}
