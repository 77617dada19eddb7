"""What `offerbus roles` shows: each role's weight, quota, frameworks and share of the
cluster (its subtree's, for a parent role), read from an AllocatorCore (pure: no sockets,
no clock)."""

from __future__ import annotations

from services.allocator.core import AllocatorCore
from services.allocator.quota import quota_view
from services.allocator.sorter import role_path


def roles_view(core: AllocatorCore) -> list[dict[str, object]]:
    """Each role with a framework (or one below it), a weight or a quota: its weight,
    guarantee and limit, its own frameworks, and the share of the cluster its subtree
    holds per DRF resource (offered + used), the dominant one first."""
    total = core.sorter.total
    roles: dict[str, list[str]] = {r: [] for r in (*core.weights, *core.quotas.roles)}
    for fid, fw in sorted(core.frameworks.items()):
        for p in role_path(fw.role):
            roles.setdefault(p, [])
        roles[fw.role].append(fid)
    out: list[dict[str, object]] = []
    for role in sorted(roles):
        used = core.sorter.role_allocation(role)
        shares = {n: v / total[n] for n, v in sorted(used.items()) if total.get(n)}
        dominant = max(shares, key=shares.__getitem__, default="")
        out.append({"role": role, "weight": core.weights.get(role, 1.0),
                    "frameworks": roles[role], "shares": shares,
                    "dominant_resource": dominant,
                    "dominant_share": shares.get(dominant, 0.0), **quota_view(core, role)})
    return out
