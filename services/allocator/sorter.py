"""Fair-share ordering for the allocator (Mesos's sorter): who is offered next. The DRF
sorter keeps each client's allocation, each role's (the sum over its subtree of roles, for
hierarchical roles like `eng/batch`) and the cluster's total as integer vectors over the
scalars (cpus, mem, disk, gpus), and orders clients by weighted dominant share along their
role path: first the shares of the roles above the client's role (each divided by its
weight), then the client's own share divided by its role's weight."""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Protocol

from services.resources import MILLI, Resources

# The scalars dominant shares are computed over (ports and sets have no share).
DRF_RESOURCES = ("cpus", "mem", "disk", "gpus")
DEFAULT_ROLE = "*"
Key = tuple[float, ...]  # a client's sort key: weighted shares along its role path
Move = tuple[str, Mapping[str, int], int]  # (client, DRF scalars, +1 gains / -1 gives up)


def scalar_vector(resources: Resources) -> dict[str, int]:
    """The DRF scalars of `resources`, in milli-units, summed across reservation roles."""
    out: dict[str, int] = {}
    for (name, _), v in resources.scalars.items():
        if name in DRF_RESOURCES and v:
            out[name] = out.get(name, 0) + v
    return out


def role_path(role: str) -> tuple[str, ...]:
    """`eng/batch/x` -> (`eng`, `eng/batch`, `eng/batch/x`): the role and its ancestors."""
    parts = role.split("/")
    return tuple("/".join(parts[:i + 1]) for i in range(len(parts)))


def compare(a: Key, b: Key, eps: float) -> int:
    """-1, 0 or 1 as key `a` is below, equal to (within `eps` per element) or above `b`."""
    for x, y in zip(a, b, strict=False):
        if x < y - eps:
            return -1
        if x > y + eps:
            return 1
    return (len(a) > len(b)) - (len(a) < len(b))


@dataclass(frozen=True)
class Share:
    """A client's standing: `key` is its dominant share / its role's weight (the last
    element of its sort key)."""

    key: float
    dominant_share: float  # unweighted: max over resources of allocated / cluster total
    dominant_resource: str  # "" when the client holds nothing
    weight: float
    shares: Mapping[str, float]  # per resource name: allocated / cluster total


class Sorter(Protocol):
    """What the allocator needs of a fair-share policy; DRFSorter is the default."""

    @property
    def total(self) -> Mapping[str, int]: ...  # the cluster's DRF scalars, milli-units

    @property
    def used(self) -> Mapping[str, int]: ...  # allocated to all clients, milli-units

    def add(self, client: str, role: str) -> None: ...
    def remove(self, client: str) -> None: ...
    def set_role_weight(self, role: str, weight: float) -> None: ...
    def allocated(self, client: str, resources: Resources) -> None: ...
    def unallocated(self, client: str, resources: Resources) -> None: ...
    def add_total(self, resources: Resources) -> None: ...
    def remove_total(self, resources: Resources) -> None: ...
    def key(self, client: str) -> Key: ...
    def key_after(self, client: str, moves: Iterable[Move]) -> Key: ...
    def room_to(self, client: str, other: Key) -> tuple[Mapping[str, int], float]: ...
    def share(self, client: str) -> Share: ...
    def dominant(self, client: str) -> tuple[float, str, float]: ...
    def sort(self, clients: Iterable[str]) -> list[tuple[Key, str]]: ...
    def allocation(self, client: str) -> Mapping[str, int]: ...
    def role_allocation(self, role: str) -> Mapping[str, int]: ...
    def role_clients(self, role: str) -> set[str]: ...
    def hierarchical(self, client: str) -> bool: ...
    def validate(self) -> None: ...


class DRFSorter:
    """Weighted Dominant Resource Fairness (Ghodsi et al., NSDI 2011), over hierarchical
    roles: at each level of the role tree a role with sub-roles competes with the sum of
    its subtree, weighted by its own weight; a client (framework) competes alone, weighted
    by its role's weight (so flat roles are what they always were: frameworks of weighted
    roles). A client's key is the tuple of those weighted shares along its role path;
    tuples compare level by level.

    Updates are O(depth of the role); `sort` is O(n log n) and meant once per allocation
    cycle (the cluster total, hence every share, may change between cycles). Ties are
    broken by client id, so the order is deterministic.
    """

    def __init__(self) -> None:
        self.total: dict[str, int] = {}  # the cluster's DRF scalars, milli-units
        self._allocated: dict[str, dict[str, int]] = {}
        self._path: dict[str, tuple[str, ...]] = {}  # client -> its role path
        self._roles: dict[str, dict[str, int]] = {}  # role -> its subtree's allocation
        self._members: dict[str, set[str]] = {}  # role -> the clients of its subtree
        self._weights: dict[str, float] = {}  # role -> weight; absent = 1.0
        self._deep: dict[str, int] = {}  # top-level role -> its clients of sub-roles
        # client -> its allocation and its roles' (on its path), updated together
        self._roles_of: dict[str, list[dict[str, int]]] = {}

    # -- clients -----------------------------------------------------------------------
    def add(self, client: str, role: str = DEFAULT_ROLE) -> None:
        if client in self._allocated:
            raise ValueError(f"sorter: client {client!r} already added")
        self._allocated[client] = {}
        path = self._path[client] = role_path(role)
        for p in path:
            self._members.setdefault(p, set()).add(client)
            self._roles.setdefault(p, {})
        self._roles_of[client] = [self._allocated[client], *(self._roles[p] for p in path)]
        if len(path) > 1:
            self._deep[path[0]] = self._deep.get(path[0], 0) + 1

    def remove(self, client: str) -> None:
        vec = self._vector(client)
        for p in self._path[client]:
            members = self._members[p]
            members.discard(client)
            if members:
                _drop(self._roles[p], vec)
            else:
                del self._members[p], self._roles[p]
        path = self._path[client]
        if len(path) > 1:
            self._deep[path[0]] -= 1
            if not self._deep[path[0]]:
                del self._deep[path[0]]
        del self._allocated[client], self._path[client], self._roles_of[client]

    def set_role_weight(self, role: str, weight: float) -> None:
        _check_weight(weight)
        if weight == 1.0:
            self._weights.pop(role, None)
        else:
            self._weights[role] = weight

    def weight(self, role: str) -> float:
        return self._weights.get(role, 1.0)

    # -- allocations and totals --------------------------------------------------------
    def allocated(self, client: str, resources: Resources) -> None:
        vec = scalar_vector(resources)
        try:
            targets = self._roles_of[client]
        except KeyError:
            raise ValueError(f"sorter: unknown client {client!r}") from None
        for into in targets:  # the hot path: inlined
            for n, v in vec.items():
                into[n] = into.get(n, 0) + v

    def unallocated(self, client: str, resources: Resources) -> None:
        vec = scalar_vector(resources)
        _sub(self._vector(client), vec, f"client {client!r}")
        for into in self._roles_of[client][1:]:  # each holds the client's: no check needed
            _drop(into, vec)

    @property
    def used(self) -> dict[str, int]:
        """What all clients hold (the sum of the top-level roles')."""
        out: dict[str, int] = {}
        for role, vec in self._roles.items():
            if "/" not in role:
                _add(out, vec)
        return out

    def add_total(self, resources: Resources) -> None:
        _add(self.total, scalar_vector(resources))

    def remove_total(self, resources: Resources) -> None:
        _sub(self.total, scalar_vector(resources), "cluster total")

    # -- ordering ----------------------------------------------------------------------
    def key(self, client: str) -> Key:
        vec, path, total = self._vector(client), self._path[client], self.total
        best = 0.0
        for n, v in vec.items():  # the hot path: _dominant inlined
            t = total.get(n)
            if t and v / t > best:
                best = v / t
        own = best / self._weights.get(path[-1], 1.0)
        if len(path) == 1:
            return (own,)
        return (*(self._dominant(self._roles[p]) / self._weights.get(p, 1.0)
                  for p in path[:-1]), own)

    def key_after(self, client: str, moves: Iterable[Move]) -> Key:
        """The client's key if each (c, delta, sign) of `moves` were applied to c's
        allocation (and its roles')."""
        moves = list(moves)
        path = self._path[client]
        out = []
        for i, p in enumerate(path):
            leaf = i == len(path) - 1
            vec = dict(self._vector(client) if leaf else self._roles[p])
            for c, delta, sign in moves:
                if (c == client) if leaf else (p in self._path[c]):
                    for n, v in delta.items():
                        vec[n] = vec.get(n, 0) + sign * v
            out.append(self._dominant(vec) / self._weights.get(p, 1.0))
        return tuple(out)

    def room_to(self, client: str, other: Key) -> tuple[Mapping[str, int], float]:
        """Where the client's key first differs from `other` (a key above it): the
        allocation that decides it there (its own, or a role's above it) and the dominant
        share that allocation may grow to before the key passes `other`."""
        mine, path = self.key(client), self._path[client]
        n = min(len(mine), len(other))
        i = next((i for i in range(n) if mine[i] != other[i]), n - 1)
        if i < len(path) - 1:
            return self._roles[path[i]], other[i] * self._weights.get(path[i], 1.0)
        return self._vector(client), other[i] * self._weights.get(path[-1], 1.0)

    def share(self, client: str) -> Share:
        vec = self._vector(client)
        shares = {n: vec[n] / self.total[n] for n in DRF_RESOURCES
                  if vec.get(n) and self.total.get(n)}
        resource = max(shares, key=shares.__getitem__, default="")  # ties: cpus, mem, ...
        dominant = shares.get(resource, 0.0)
        weight = self._weights.get(self._path[client][-1], 1.0)
        return Share(dominant / weight, dominant, resource, weight, shares)

    def dominant(self, client: str) -> tuple[float, str, float]:
        """(dominant share, its resource, weight): `share` without the per-resource map
        (once per allocation)."""
        vec, total = self._vector(client), self.total
        best, resource = 0.0, ""
        for n in DRF_RESOURCES:
            v, t = vec.get(n), total.get(n)
            if v and t and v / t > best:
                best, resource = v / t, n
        return best, resource, self._weights.get(self._path[client][-1], 1.0)

    def sort(self, clients: Iterable[str]) -> list[tuple[Key, str]]:
        """(key, client) pairs, lowest weighted dominant share first."""
        return sorted((self.key(c), c) for c in clients)

    def allocation(self, client: str) -> Mapping[str, int]:
        return dict(self._vector(client))

    def role_allocation(self, role: str) -> Mapping[str, int]:
        """What the clients of the role and its sub-roles hold together."""
        return self._roles.get(role, {})

    def role_clients(self, role: str) -> set[str]:
        """The clients of the role and its sub-roles."""
        return self._members.get(role, set())

    def hierarchical(self, client: str) -> bool:
        """Whether what the client holds counts in other clients' keys (a role above
        theirs): its top-level role has sub-roles with clients."""
        return self._path[client][0] in self._deep

    def validate(self) -> None:
        assert set(self._allocated) == set(self._path) == set(self._roles_of)
        for client, path in self._path.items():
            assert self._roles_of[client][0] is self._allocated[client]
            assert all(a is self._roles[p] for a, p in zip(self._roles_of[client][1:], path,
                                                           strict=True)), client
        assert all(w > 0 and math.isfinite(w) for w in self._weights.values())
        for vec in (self.total, *self._allocated.values(), *self._roles.values()):
            assert all(v > 0 for v in vec.values()), vec
        used: dict[str, int] = {}
        for vec in self._allocated.values():
            _add(used, vec)
        assert used == self.used, (used, self.used)
        members: dict[str, set[str]] = {}
        for client, path in self._path.items():
            for p in path:
                members.setdefault(p, set()).add(client)
        assert members == self._members, (members, self._members)
        deep: dict[str, int] = {}
        for path in self._path.values():
            if len(path) > 1:
                deep[path[0]] = deep.get(path[0], 0) + 1
        assert deep == self._deep, (deep, self._deep)
        for role, clients in members.items():
            held: dict[str, int] = {}
            for c in clients:
                _add(held, self._allocated[c])
            assert held == self._roles[role], (role, held, self._roles[role])
        for client in self._allocated:
            share = self.share(client)
            assert self.dominant(client) == (share.dominant_share, share.dominant_resource,
                                             share.weight), client

    def _dominant(self, vec: Mapping[str, int]) -> float:
        total = self.total
        return max((v / total[n] for n, v in vec.items() if total.get(n)), default=0.0)

    def _vector(self, client: str) -> dict[str, int]:
        try:
            return self._allocated[client]
        except KeyError:
            raise ValueError(f"sorter: unknown client {client!r}") from None


def _check_weight(weight: float) -> None:
    if not (weight > 0 and math.isfinite(weight)):
        raise ValueError(f"weight must be a positive finite number, got {weight!r}")


def _add(into: dict[str, int], vec: Mapping[str, int]) -> None:
    for n, v in vec.items():
        into[n] = into.get(n, 0) + v


def _drop(into: dict[str, int], vec: Mapping[str, int]) -> None:
    """into -= vec, zeros dropped; `into` is known to hold `vec`."""
    for n, v in vec.items():
        left = into[n] - v
        if left:
            into[n] = left
        else:
            del into[n]


def _sub(into: dict[str, int], vec: Mapping[str, int], what: str) -> None:
    for n, v in vec.items():
        left = into.get(n, 0) - v
        if left < 0:
            have = into.get(n, 0) / MILLI
            raise ValueError(f"sorter: {what} would hold {n} {left / MILLI:g} (had {have:g})")
    _drop(into, vec)
