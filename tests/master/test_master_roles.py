"""Operator calls on roles (weights of hierarchical roles, quota): checked, published on the
state stream (roles/<role>, RoleRecord), persisted in the registry's roles and recovered by
the next leader."""

from __future__ import annotations

import pytest

from schemas import bus_pb2, operator_pb2
from services.master.commands import Reject, ToOperator
from services.master.core import MasterCore
from services.resources import Resources
from tests.master.helpers import T0, cluster, one, operator, published, registry

Quota = operator_pb2.OperatorCall.SetQuota
Weight = operator_pb2.OperatorCall.SetWeight


def quota(role: str, guarantee: str = "", limit: str = "") -> Quota:
    return Quota(role=role, guarantee=Resources.parse(guarantee).to_proto(),
                 limit=Resources.parse(limit).to_proto())


def test_a_quota_is_published_persisted_and_cleared() -> None:
    core, _, _ = cluster()
    cmds = operator(core, b"cli", set_quota=quota("eng/web", "cpus:2;mem:1024", "cpus:4"))
    assert "guarantee cpus:2;mem:1024 limit cpus:4" in one(cmds, ToOperator).event.done.message
    rec = published(cmds)["roles/eng/web"].role
    assert Resources.from_proto(rec.quota_guarantee) == Resources.of(cpus=2, mem=1024)
    assert Resources.from_proto(rec.quota_limit) == Resources.of(cpus=4)
    assert rec.weight == 1.0
    assert registry(cmds)["roles"] == {  # type: ignore[index]
        "eng/web": {"weight": 1.0, "guarantee": "cpus:2;mem:1024", "limit": "cpus:4"}}
    cmds = operator(core, b"cli", set_weight=Weight(role="eng/web", weight=3))
    assert published(cmds)["roles/eng/web"].role.quota_limit  # a weight keeps the quota
    cmds = operator(core, b"cli", set_quota=quota("eng/web"))
    rec = published(cmds)["roles/eng/web"].role
    assert (rec.weight, list(rec.quota_guarantee), list(rec.quota_limit)) == (3.0, [], [])
    assert registry(cmds)["roles"] == {"eng/web": {"weight": 3.0}}  # type: ignore[index]


def test_a_zero_limit_is_a_limit() -> None:
    core, _, _ = cluster()
    cmds = operator(core, b"cli", set_quota=quota("batch", limit="cpus:0"))
    assert [(r.name, r.scalar) for r in published(cmds)["roles/batch"].role.quota_limit] == [
        ("cpus", 0.0)]
    assert registry(cmds)["roles"] == {  # type: ignore[index]
        "batch": {"weight": 1.0, "limit": "cpus:0"}}


def test_roles_and_quotas_survive_a_master_failover() -> None:
    old, _, _ = cluster()
    operator(old, b"cli", set_quota=quota("eng", "cpus:1", "cpus:3;mem:2048;gpus:0"))
    operator(old, b"cli", set_weight=Weight(role="eng/batch", weight=2))
    new = MasterCore("m2", 8, recovered_registry=old.registry_document(), now=T0 + 30)
    assert new.roles == old.roles
    assert [e.key for e in new.snapshot_entries() if e.key.startswith("roles/")] == [
        "roles/eng", "roles/eng/batch"]


@pytest.mark.parametrize("call", [
    quota("", limit="cpus:1"),
    quota("eng//web", limit="cpus:1"),
    quota("eng/../x", limit="cpus:1"),
    quota("eng web", limit="cpus:1"),
    quota("eng", limit="cpus(eng):1"),  # reserved
    quota("eng", limit="ports:[1-2]"),
    quota("eng", limit="foo:1"),
    quota("eng", guarantee="cpus:4", limit="cpus:2"),  # a guarantee above the limit
])
def test_invalid_quotas_are_refused(call: Quota) -> None:
    core, _, _ = cluster()
    assert one(operator(core, b"cli", set_quota=call), Reject).code == bus_pb2.INVALID
    assert not core.roles


@pytest.mark.parametrize("role,ok", [("eng/batch", True), ("*", True), ("a.b-c_d/x", True),
                                     ("eng/", False), ("/eng", False), (".", False),
                                     ("eng/..", False), ("", False)])
def test_weights_of_hierarchical_roles(role: str, ok: bool) -> None:
    core, _, _ = cluster()
    cmds = operator(core, b"cli", set_weight=Weight(role=role, weight=2))
    if ok:
        assert published(cmds)[f"roles/{role}"].role.weight == 2
    else:
        assert one(cmds, Reject).code == bus_pb2.INVALID
