"""Who may do what (issue 11): the ACL file mapping principals (the names of the CURVE keys
the master admits: `NAME.key` in its `curve_allowed_dir`) to the roles they may register
frameworks with and the operator actions they may take, and (optionally) which principals
may act as agents. Pure: parsed once, asked by the master core (frameworks.py at subscribe,
core.py for operator calls, agents.py for agent calls).

    agents = ["agent"]           # optional; without it every admitted key may be an agent

    [principals.analytics]
    roles = ["eng"]              # eng and its sub-roles (eng/batch, ...)
    [principals.ops]
    roles = ["*"]
    operator = ["kill_task", "get_logs", "mark_agent_gone", "set_weight", "set_quota",
                "teardown_framework"]

A principal not in the file may use no role and take no action. Whatever the file says, an
agent id is bound to the principal that registered it (agents.py)."""

from __future__ import annotations

import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from schemas import operator_pb2
from services.roles import role_error

ACTIONS = frozenset(  # the operator calls: kill_task, get_logs, ...
    f.name for f in operator_pb2.OperatorCall.DESCRIPTOR.oneofs_by_name["call"].fields)
MAX_PRINCIPALS = 100_000


@dataclass(frozen=True)
class Acl:
    roles: Mapping[str, frozenset[str]] = field(default_factory=dict)
    actions: Mapping[str, frozenset[str]] = field(default_factory=dict)
    agents: frozenset[str] | None = None  # who may act as an agent; None: any admitted key

    def may_use_role(self, principal: str, role: str) -> bool:
        """`role` is one the principal was given, or a sub-role of one."""
        return any(role == r or role.startswith(f"{r}/")
                   for r in self.roles.get(principal, frozenset()))

    def may(self, principal: str, action: str) -> bool:
        return action in self.actions.get(principal, frozenset())

    def may_act_as_agent(self, principal: str) -> bool:
        return self.agents is None or principal in self.agents

    @classmethod
    def parse(cls, doc: Mapping[str, object], where: str = "acl") -> Acl:
        """ValueError naming the bad entry."""
        unknown = sorted(set(doc) - {"principals", "agents"})
        if unknown:
            raise ValueError(f"{where}: unknown key(s) {', '.join(unknown)}; expected "
                             "[principals.NAME] tables and an agents list")
        agents = frozenset(_strings(doc["agents"], f"{where}: agents")) \
            if "agents" in doc else None
        principals = doc.get("principals", {})
        if not isinstance(principals, Mapping) or len(principals) > MAX_PRINCIPALS:
            raise ValueError(f"{where}: principals must be a table of at most "
                             f"{MAX_PRINCIPALS} [principals.NAME] tables")
        roles: dict[str, frozenset[str]] = {}
        actions: dict[str, frozenset[str]] = {}
        for name, entry in principals.items():
            at = f"{where}: principals.{name}"
            if not isinstance(entry, Mapping):
                raise ValueError(f"{at} must be a table")
            extra = sorted(set(entry) - {"roles", "operator"})
            if extra:
                raise ValueError(f"{at}: unknown key(s) {', '.join(extra)}; expected roles, "
                                 "operator")
            given_roles = _strings(entry.get("roles", []), f"{at}.roles")
            for role in given_roles:
                error = role_error(role)
                if error is not None:
                    raise ValueError(f"{at}.roles: {error}")
            given_actions = _strings(entry.get("operator", []), f"{at}.operator")
            bad = sorted(set(given_actions) - ACTIONS)
            if bad:
                raise ValueError(f"{at}.operator: unknown action(s) {', '.join(bad)}; known: "
                                 f"{', '.join(sorted(ACTIONS))}")
            roles[str(name)] = frozenset(given_roles)
            actions[str(name)] = frozenset(given_actions)
        return cls(roles, actions, agents)

    @classmethod
    def load(cls, path: str) -> Acl:
        try:
            doc = tomllib.loads(Path(path).read_text())
        except OSError as exc:
            raise ValueError(f"acl_file {path}: cannot read it ({exc.strerror})") from None
        except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
            raise ValueError(f"acl_file {path}: not valid TOML ({exc})") from None
        return cls.parse(doc, f"acl_file {path}")


def _strings(value: object, where: str) -> list[str]:
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise ValueError(f"{where} must be a list of strings")
    return list(value)
