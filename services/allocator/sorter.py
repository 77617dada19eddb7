"""Fair-share ordering for the allocator (Mesos's sorter): who is offered next. The DRF
sorter keeps each client's allocation and the cluster's total as integer vectors over the
scalars (cpus, mem, disk, gpus) and orders clients by weighted dominant share."""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Protocol

from services.resources import MILLI, Resources

# The scalars dominant shares are computed over (ports and sets have no share).
DRF_RESOURCES = ("cpus", "mem", "disk", "gpus")


def scalar_vector(resources: Resources) -> dict[str, int]:
    """The DRF scalars of `resources`, in milli-units, summed across reservation roles."""
    out: dict[str, int] = {}
    for (name, _), v in resources.scalars.items():
        if name in DRF_RESOURCES and v:
            out[name] = out.get(name, 0) + v
    return out


@dataclass(frozen=True)
class Share:
    """A client's standing: `key` orders clients (dominant share / weight)."""

    key: float
    dominant_share: float  # unweighted: max over resources of allocated / cluster total
    dominant_resource: str  # "" when the client holds nothing
    weight: float
    shares: Mapping[str, float]  # per resource name: allocated / cluster total


class Sorter(Protocol):
    """What the allocator needs of a fair-share policy; DRFSorter is the default."""

    @property
    def total(self) -> Mapping[str, int]: ...  # the cluster's DRF scalars, milli-units

    def add(self, client: str, weight: float) -> None: ...
    def remove(self, client: str) -> None: ...
    def set_weight(self, client: str, weight: float) -> None: ...
    def allocated(self, client: str, resources: Resources) -> None: ...
    def unallocated(self, client: str, resources: Resources) -> None: ...
    def add_total(self, resources: Resources) -> None: ...
    def remove_total(self, resources: Resources) -> None: ...
    def key(self, client: str) -> float: ...
    def share(self, client: str) -> Share: ...
    def dominant(self, client: str) -> tuple[float, str, float]: ...
    def sort(self, clients: Iterable[str]) -> list[tuple[float, str]]: ...
    def allocation(self, client: str) -> Mapping[str, int]: ...
    def validate(self) -> None: ...


class DRFSorter:
    """Weighted Dominant Resource Fairness (Ghodsi et al., NSDI 2011).

    Updates are O(1) in the number of clients; `sort` is O(n log n) and meant once per
    allocation cycle (the cluster total, hence every share, may change between cycles).
    Ties are broken by client id, so the order is deterministic.
    """

    def __init__(self) -> None:
        self.total: dict[str, int] = {}  # the cluster's DRF scalars, milli-units
        self._allocated: dict[str, dict[str, int]] = {}
        self._weights: dict[str, float] = {}

    # -- clients -----------------------------------------------------------------------
    def add(self, client: str, weight: float = 1.0) -> None:
        if client in self._allocated:
            raise ValueError(f"sorter: client {client!r} already added")
        _check_weight(weight)
        self._allocated[client] = {}
        self._weights[client] = weight

    def remove(self, client: str) -> None:
        self._vector(client)
        del self._allocated[client], self._weights[client]

    def set_weight(self, client: str, weight: float) -> None:
        self._vector(client)
        _check_weight(weight)
        self._weights[client] = weight

    # -- allocations and totals --------------------------------------------------------
    def allocated(self, client: str, resources: Resources) -> None:
        _add(self._vector(client), scalar_vector(resources))

    def unallocated(self, client: str, resources: Resources) -> None:
        _sub(self._vector(client), scalar_vector(resources), f"client {client!r}")

    def add_total(self, resources: Resources) -> None:
        _add(self.total, scalar_vector(resources))

    def remove_total(self, resources: Resources) -> None:
        _sub(self.total, scalar_vector(resources), "cluster total")

    # -- ordering ----------------------------------------------------------------------
    def key(self, client: str) -> float:
        vec = self._vector(client)
        dominant = max((v / self.total[n] for n, v in vec.items() if self.total.get(n)),
                       default=0.0)
        return dominant / self._weights[client]

    def share(self, client: str) -> Share:
        vec = self._vector(client)
        shares = {n: vec[n] / self.total[n] for n in DRF_RESOURCES
                  if vec.get(n) and self.total.get(n)}
        resource = max(shares, key=shares.__getitem__, default="")  # ties: cpus, mem, ...
        dominant = shares.get(resource, 0.0)
        weight = self._weights[client]
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
        return best, resource, self._weights[client]

    def sort(self, clients: Iterable[str]) -> list[tuple[float, str]]:
        """(key, client) pairs, lowest weighted dominant share first."""
        return sorted((self.key(c), c) for c in clients)

    def allocation(self, client: str) -> Mapping[str, int]:
        return dict(self._vector(client))

    def validate(self) -> None:
        assert set(self._allocated) == set(self._weights)
        assert all(w > 0 and math.isfinite(w) for w in self._weights.values())
        for vec in (self.total, *self._allocated.values()):
            assert all(v > 0 for v in vec.values()), vec
        for client in self._allocated:
            share = self.share(client)
            assert self.dominant(client) == (share.dominant_share, share.dominant_resource,
                                             share.weight), client

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


def _sub(into: dict[str, int], vec: Mapping[str, int], what: str) -> None:
    for n, v in vec.items():
        left = into.get(n, 0) - v
        if left < 0:
            have = into.get(n, 0) / MILLI
            raise ValueError(f"sorter: {what} would hold {n} {left / MILLI:g} (had {have:g})")
    for n, v in vec.items():
        left = into[n] - v
        if left:
            into[n] = left
        else:
            del into[n]
