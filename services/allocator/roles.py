"""What `offerbus roles` shows: each role's weight, frameworks and share of the cluster,
read from an AllocatorCore (pure: no sockets, no clock)."""

from __future__ import annotations

from services.allocator.core import AllocatorCore


def roles_view(core: AllocatorCore) -> list[dict[str, object]]:
    """Each role with a framework or a weight: its weight, frameworks, and its share of
    the cluster per DRF resource (offered + used), the dominant one first."""
    total = core.sorter.total
    roles: dict[str, list[str]] = {r: [] for r in core.weights}
    for fid, fw in sorted(core.frameworks.items()):
        roles.setdefault(fw.role, []).append(fid)
    out: list[dict[str, object]] = []
    for role in sorted(roles):
        used: dict[str, int] = {}
        for fid in roles[role]:
            for name, v in core.sorter.allocation(fid).items():
                used[name] = used.get(name, 0) + v
        shares = {n: v / total[n] for n, v in sorted(used.items()) if total.get(n)}
        dominant = max(shares, key=shares.__getitem__, default="")
        out.append({"role": role, "weight": core.weights.get(role, 1.0),
                    "frameworks": roles[role], "shares": shares,
                    "dominant_resource": dominant,
                    "dominant_share": shares.get(dominant, 0.0)})
    return out
