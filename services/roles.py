"""Role names (hierarchical: `eng/batch`): what a valid one is, one fact shared by the master
(operator calls) and the CLI. `*` is the default role (unreserved resources)."""

from __future__ import annotations

import re

DEFAULT_ROLE = "*"
_SEGMENT = re.compile(r"[A-Za-z0-9_.-]+")


def role_error(role: str) -> str | None:
    """Why `role` is not a valid role name, or None: `*`, or segments of letters, digits,
    `_`, `-` and `.` separated by `/`, none empty, `.` or `..`."""
    if role == DEFAULT_ROLE:
        return None
    if not role:
        return "a role name is needed"
    for seg in role.split("/"):
        if not seg:
            return f"role {role!r} has an empty segment"
        if seg in (".", ".."):
            return f"role {role!r} has a segment {seg!r}"
        if not _SEGMENT.fullmatch(seg):
            return (f"role {role!r}: segment {seg!r} may hold only letters, digits, "
                    f"'_', '-' and '.'")
    return None
