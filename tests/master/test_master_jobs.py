"""Jobs in the master core (issue 11, services/master/jobs.py): SubmitJob keeps a job in the
registry and publishes jobs/<name>; a second submission is a new version (the same spec:
unchanged); only the submitting principal replaces or removes it; its role never changes and
must be one the submitter's ACL gives; bad names, specs and the job count limit are refused;
RemoveJob drops the record and tears down the frameworks labelled with the job; a new
leader recovers the jobs from the registry."""

from __future__ import annotations

from typing import Any

import pytest
from google.protobuf import struct_pb2

from schemas import bus_pb2, common_pb2, operator_pb2, scheduler_pb2
from services.master.acl import Acl
from services.master.commands import Command, ToFramework, ToOperator
from services.master.core import MasterCore
from services.master.records import JOB_LABEL, MAX_JOB_SPEC_BYTES, MAX_JOBS
from services.master.registry import merge
from tests.master.helpers import (
    PA,
    T0,
    Call,
    one,
    published,
    register,
    registry,
    rejects,
    running,
)

SubmitJob = operator_pb2.OperatorCall.SubmitJob


def spec(name: str = "web", role: str = "*", **more: Any) -> struct_pb2.Struct:
    s = struct_pb2.Struct()
    s.update({"name": name, "role": role, "image": "busybox", "instances": 2, "cpus": 0.1,
              "mem": 16, "env": {"SECRET": "x"}, **more})
    return s


def submit(c: MasterCore, name: str = "web", role: str = "*", principal: str | None = None,
           now: float = T0, **more: Any) -> list[Command]:
    call = operator_pb2.OperatorCall(submit_job=SubmitJob(
        name=name, role=role, spec=spec(name, role, **more)))
    return c.operator_call(b"cli", call, "op1", now, principal=principal)


def remove(c: MasterCore, name: str = "web", principal: str | None = None) -> list[Command]:
    call = operator_pb2.OperatorCall(remove_job=operator_pb2.OperatorCall.RemoveJob(name=name))
    return c.operator_call(b"cli", call, "op2", T0, principal=principal)


def done(cmds: list[Command]) -> str:
    return one(cmds, ToOperator).event.done.message


def refused(cmds: list[Command]) -> tuple[int, str]:
    (r,) = rejects(cmds)
    return r.code, r.message


def test_a_job_is_kept_published_and_versioned() -> None:
    c = MasterCore("m1", 7, now=T0)
    cmds = submit(c)
    assert done(cmds) == "job web version 1 submitted"
    rec = published(cmds)["jobs/web"].job
    assert (rec.name, rec.role, rec.version, rec.spec["image"]) == ("web", "*", 1, "busybox")
    assert registry(cmds)["jobs"]["web"]["version"] == 1  # type: ignore[index]
    assert done(submit(c)) == "job web unchanged (version 1)"
    cmds = submit(c, instances=5, now=T0 + 1)
    assert done(cmds) == "job web version 2 submitted"
    rec = published(cmds)["jobs/web"].job
    assert (rec.version, rec.spec["instances"]) == (2, 5)
    assert rec.submitted_at_us < rec.updated_at_us


def test_a_new_leader_recovers_the_jobs_from_the_registry() -> None:
    c = MasterCore("m1", 7, now=T0)
    doc: dict[str, Any] = {}
    for cmds in (submit(c), submit(c, "api", instances=3), submit(c, instances=4)):
        change = registry(cmds)
        assert change is not None
        merge(doc, change)
    new = MasterCore("m2", 8, recovered_registry=doc, now=T0 + 5)
    assert sorted(new.jobs) == ["api", "web"]
    assert new.jobs["web"] == c.jobs["web"] and new.jobs["api"] == c.jobs["api"]
    keys = [e.key for e in new.snapshot_entries() if e.key.startswith("jobs/")]
    assert keys == ["jobs/api", "jobs/web"]


@pytest.mark.parametrize(("name", "role", "more", "why"), [
    ("../x", "*", {}, "bad job name"),
    ("web", "a//b", {}, "empty segment"),
    ("web", "*", {"name": "other"}, "the spec's name 'other' is not the job's 'web'"),
    ("web", "*", {"role": "eng"}, "the spec's role 'eng' is not the job's '*'"),
    ("web", "*", {"image": 3}, "the spec has no image"),
    ("web", "*", {"blob": "x" * MAX_JOB_SPEC_BYTES}, f"over {MAX_JOB_SPEC_BYTES} bytes"),
])
def test_bad_jobs_are_refused_with_the_reason(name: str, role: str, more: dict[str, Any],
                                              why: str) -> None:
    c = MasterCore("m1", 7, now=T0)
    call = operator_pb2.OperatorCall(submit_job=SubmitJob(name=name, role=role,
                                                          spec=spec(name, role)))
    call.submit_job.spec.update(more)
    code, message = refused(c.operator_call(b"cli", call, "op1", T0))
    assert code == bus_pb2.INVALID and why in message, message
    assert c.jobs == {}


def test_a_jobs_role_never_changes_and_the_count_is_bounded() -> None:
    c = MasterCore("m1", 7, now=T0)
    submit(c)
    code, message = refused(submit(c, role="eng"))
    assert code == bus_pb2.INVALID and "a job's role never changes" in message
    for i in range(MAX_JOBS - 1):
        submit(c, f"j{i}")
    code, message = refused(submit(c, "one-more"))
    assert f"at most {MAX_JOBS} jobs" in message and len(c.jobs) == MAX_JOBS
    assert done(submit(c, instances=9)).startswith("job web version 2")  # a replacement


def test_only_the_submitter_replaces_or_removes_a_job_and_roles_follow_the_acl() -> None:
    acl = Acl.parse({"principals": {
        "alice": {"roles": ["eng"], "operator": ["submit_job", "remove_job"]},
        "bob": {"roles": ["*"], "operator": ["submit_job", "remove_job"]},
        "viewer": {"roles": ["*"]}}})
    c = MasterCore("m1", 7, acl=acl, now=T0)
    code, message = refused(submit(c, role="ops", principal="alice"))
    assert code == bus_pb2.UNAUTHORIZED and "may not use role 'ops'" in message
    assert done(submit(c, role="eng/web", principal="alice")).endswith("submitted")
    assert c.jobs["web"].principal == "alice"
    code, message = refused(submit(c, role="eng/web", principal="bob", instances=7))
    assert code == bus_pb2.UNAUTHORIZED and "belongs to principal 'alice'" in message
    code, _ = refused(remove(c, principal="bob"))
    assert code == bus_pb2.UNAUTHORIZED and "web" in c.jobs
    code, message = refused(submit(c, "x", principal="viewer"))
    assert code == bus_pb2.UNAUTHORIZED and "may not submit_job" in message
    assert done(remove(c, principal="alice")) == "job web removed; 0 tasks killed"


def test_removing_a_job_tears_down_its_frameworks_only() -> None:
    c = MasterCore("m1", 7, now=T0)
    aid = register(c, b"a1")
    submit(c)
    fids = {}
    for peer, label in ((b"runner", "web"), (b"other", "")):
        info = common_pb2.FrameworkInfo(name="web", role="*", principal="jobs",
                                        failover_timeout_s=60, capabilities=[PA])
        if label:
            info.labels[JOB_LABEL] = label
        cmds = c.scheduler_call(peer, Call(subscribe=Call.Subscribe(framework_info=info)),
                                "s1", T0)
        fids[peer] = one(cmds, ToFramework).event.subscribed.framework_id
    running(c, aid, fids[b"runner"], "web-0-1")
    cmds = remove(c)
    assert done(cmds) == "job web removed; 1 tasks killed"
    told = [t for t in cmds if isinstance(t, ToFramework) and t.peer == b"runner"]
    assert told and told[0].event.error.message.endswith("was removed with its job")
    assert fids[b"runner"] not in c.frameworks and fids[b"other"] in c.frameworks
    assert published(cmds)["jobs/web"] is None
    assert isinstance(told[0].event, scheduler_pb2.SchedulerEvent)
    code, message = refused(remove(c))
    assert code == bus_pb2.NOT_FOUND and message == "job 'web' is unknown"
