"""Principals and ACLs in the master core (issue 11): a framework subscribes only as its
CURVE key's principal and with a role the ACL gives that principal (so it can neither take
over another framework nor use another's role); an operator call is done only for a principal
the ACL gives that action; each refusal is clear and counted (a Notice); without a known
principal (CURVE off) nothing is checked."""

from __future__ import annotations

import pytest

from schemas import bus_pb2, common_pb2, operator_pb2, scheduler_pb2
from services.master.acl import Acl
from services.master.commands import Command, ToFramework, ToOperator
from services.master.core import MasterCore
from services.notice import Notice
from tests.master.helpers import PA, T0, Call, one, register, rejects

ACL = Acl.parse({"principals": {
    "analytics": {"roles": ["eng"]},
    "ops": {"roles": ["*"], "operator": ["kill_task", "teardown_framework"]},
    "viewer": {"operator": ["get_logs"]}}})


def core() -> MasterCore:
    c = MasterCore("m1", 7, acl=ACL, now=T0)
    register(c, b"a1")
    return c


def subscribe(c: MasterCore, peer: bytes, *, principal: str, role: str,
              key: str | None, framework_id: str = "", force: bool = False) -> list[Command]:
    info = common_pb2.FrameworkInfo(framework_id=framework_id, name="fw", role=role,
                                    principal=principal, failover_timeout_s=60,
                                    capabilities=[PA])
    call = Call(framework_id=framework_id,
                subscribe=Call.Subscribe(framework_info=info, force=force))
    return c.scheduler_call(peer, call, "m-sub", T0, principal=key)


def event(cmds: list[Command]) -> scheduler_pb2.SchedulerEvent:
    return one(cmds, ToFramework).event


def counted(cmds: list[Command]) -> list[Notice]:
    return [c for c in cmds if isinstance(c, Notice) and c.kind == "acl_refused"]


@pytest.mark.parametrize("role", ["eng", "eng/batch"])
def test_a_principal_uses_its_roles_and_their_sub_roles(role: str) -> None:
    cmds = subscribe(core(), b"f1", principal="analytics", role=role, key="analytics")
    assert event(cmds).WhichOneof("event") == "subscribed"
    assert not counted(cmds)


@pytest.mark.parametrize("role", ["web", "engineering", "*"])
def test_a_role_not_given_to_the_principal_is_refused(role: str) -> None:
    c = core()
    cmds = subscribe(c, b"f1", principal="analytics", role=role, key="analytics")
    assert event(cmds).error.message == (
        f"principal 'analytics' may not use role {role!r} (the master's ACL)")
    assert len(counted(cmds)) == 1 and not c.frameworks


def test_a_framework_subscribes_only_as_its_keys_principal() -> None:
    cmds = subscribe(core(), b"f1", principal="ops", role="eng", key="analytics")
    assert "key is principal 'analytics'; it may not subscribe as principal 'ops'" in \
        event(cmds).error.message
    assert len(counted(cmds)) == 1


def test_another_principal_cannot_take_over_a_framework_even_with_force() -> None:
    c = core()
    fid = event(subscribe(c, b"f1", principal="analytics", role="eng", key="analytics")
                ).subscribed.framework_id
    # `ops` may use every role, but the framework is analytics's: not a takeover by ops's key
    cmds = subscribe(c, b"f2", principal="analytics", role="eng", key="ops",
                     framework_id=fid, force=True)
    assert "may not subscribe as principal 'analytics'" in event(cmds).error.message
    assert c.frameworks[fid].peer == b"f1"


def test_operator_actions_follow_the_acl() -> None:
    c = core()
    call = operator_pb2.OperatorCall(kill_task=operator_pb2.OperatorCall.KillTask(
        framework_id="nope", task_id="t1"))
    for principal in ("viewer", "analytics", "stranger"):
        cmds = c.operator_call(b"cli", call, "op1", T0, principal=principal)
        [reject] = rejects(cmds)
        assert reject.code == bus_pb2.UNAUTHORIZED
        assert reject.message.startswith(f"principal {principal!r} may not kill_task")
        assert len(counted(cmds)) == 1
    cmds = c.operator_call(b"cli", call, "op1", T0, principal="ops")  # allowed: acted on
    assert rejects(cmds)[0].code == bus_pb2.NOT_FOUND and not counted(cmds)


def test_without_a_principal_nothing_is_checked() -> None:
    c = core()
    cmds = subscribe(c, b"f1", principal="anyone", role="web", key=None)
    assert event(cmds).WhichOneof("event") == "subscribed"
    call = operator_pb2.OperatorCall(set_weight=operator_pb2.OperatorCall.SetWeight(
        role="web", weight=2))
    assert one(c.operator_call(b"cli", call, "op1", T0), ToOperator).event.done.message


@pytest.mark.parametrize("doc, error", [
    ({"users": {}}, "unknown key"),
    ({"principals": {"a": {"roles": "eng"}}}, "must be a list of strings"),
    ({"principals": {"a": {"roles": ["eng//x"]}}}, "empty segment"),
    ({"principals": {"a": {"operator": ["reboot"]}}}, "unknown action"),
    ({"principals": {"a": {"role": ["eng"]}}}, "unknown key"),
])
def test_bad_acl_files_are_refused(doc: dict[str, object], error: str) -> None:
    with pytest.raises(ValueError, match=error):
        Acl.parse(doc)
