"""Jobs (issue 11): long-running services operators submit (`offerbus job run FILE`), kept in
the master's registry and published as `jobs/<name>` on the state stream, where the job
runner (frameworks/jobrunner) follows them and runs each as a framework labelled
`offerbus.job=<name>`. Here: the SubmitJob and RemoveJob operator calls (who may, what is
valid), the registry section, and its recovery. Pure, as the rest of the core."""

from __future__ import annotations

import json

from google.protobuf.json_format import MessageToDict

from schemas import bus_pb2, operator_pb2, scheduler_pb2, state_pb2
from services.master.acl import Acl
from services.master.commands import Command, Reject, ToFramework, ToOperator
from services.master.frameworks import FrameworkHandlers
from services.master.records import (
    JOB_LABEL,
    MAX_JOB_SPEC_BYTES,
    MAX_JOBS,
    job_name_error,
    us,
)
from services.roles import role_error


class JobHandlers(FrameworkHandlers):
    """Mixed into MasterCore: `jobs` is one of its tables (state.py); a job's frameworks
    are removed as TeardownFramework removes one (frameworks.py)."""

    acl: Acl | None = None  # who may use which role (acl.py); None: no check

    def _job_call(self, peer: bytes, call: operator_pb2.OperatorCall, message_id: str,
                  principal: str | None) -> list[Command]:
        kind = call.WhichOneof("call")

        def reject(code: int, why: str) -> list[Command]:
            return [Reject(peer, code, why, message_id)]

        def done(what: str) -> list[Command]:
            return [ToOperator(peer, operator_pb2.OperatorEvent(
                done=operator_pb2.OperatorEvent.Done(message=what)), message_id)]

        name = call.submit_job.name if kind == "submit_job" else call.remove_job.name
        error = job_name_error(name)
        if error is not None:
            return reject(bus_pb2.INVALID, f"{kind}: {error}")
        old = self.jobs.get(name)
        if old is not None and old.principal and principal is not None \
                and old.principal != principal:
            return reject(bus_pb2.UNAUTHORIZED, f"{kind}: job {name} belongs to principal "
                          f"{old.principal!r}, not {principal!r}")
        if kind == "remove_job":
            if old is None:
                return reject(bus_pb2.NOT_FOUND, f"job {name!r} is unknown")
            del self.jobs[name]
            self._touch("job", name)
            self._registry_changed()
            out, killed = self._remove_job_frameworks(name)
            return [*out, *done(f"job {name} removed; {killed} tasks killed")]
        sj = call.submit_job
        error = role_error(sj.role) or self._spec_error(sj)
        if error is None and old is not None and old.role != sj.role:
            error = (f"job {name} runs in role {old.role}; a job's role never changes (`offerbus "
                     f"job stop {name}` first)")
        if error is None and old is None and len(self.jobs) >= MAX_JOBS:
            error = f"the cluster keeps at most {MAX_JOBS} jobs"
        if error is not None:
            return reject(bus_pb2.INVALID, f"submit_job: {error}")
        acl = self.acl
        if acl is not None and principal is not None and not acl.may_use_role(principal,
                                                                               sj.role):
            return reject(bus_pb2.UNAUTHORIZED, f"submit_job: principal {principal!r} may not "
                          f"use role {sj.role!r}")
        if old is not None and old.spec == sj.spec:
            return done(f"job {name} unchanged (version {old.version})")
        rec = state_pb2.JobRecord(
            name=name, role=sj.role, principal=principal or "", spec=sj.spec,
            version=old.version + 1 if old is not None else 1,
            submitted_at_us=old.submitted_at_us if old is not None else us(self._now),
            updated_at_us=us(self._now))
        self.jobs[name] = rec
        self._touch("job", name)
        self._registry_changed()
        return done(f"job {name} version {rec.version} submitted")

    @staticmethod
    def _spec_error(sj: operator_pb2.OperatorCall.SubmitJob) -> str | None:
        fields = sj.spec.fields
        if len(json.dumps(MessageToDict(sj.spec))) > MAX_JOB_SPEC_BYTES:
            return f"the spec is over {MAX_JOB_SPEC_BYTES} bytes"
        for key, want in (("name", sj.name), ("role", sj.role)):
            given = fields[key].string_value if key in fields else None
            if given != want:
                return f"the spec's {key} {given!r} is not the job's {want!r}"
        if "image" not in fields or fields["image"].WhichOneof("kind") != "string_value":
            return "the spec has no image"
        return None

    def _remove_job_frameworks(self, name: str) -> tuple[list[Command], int]:
        """Remove the frameworks running job `name` (as TeardownFramework does): (commands,
        tasks killed)."""
        out: list[Command] = []
        killed = 0
        for fw in [f for f in self.frameworks.values()
                   if f.info.labels.get(JOB_LABEL) == name]:
            if fw.peer is not None:
                out.append(ToFramework(fw.peer, fw.framework_id, scheduler_pb2.SchedulerEvent(
                    error=scheduler_pb2.SchedulerEvent.Error(
                        message=f"framework {fw.framework_id} ({name}) was removed with its "
                                "job"))))
            killed += len(fw.tasks)
            out += self._remove_framework(fw, f"job {name} removed")
        return out, killed
