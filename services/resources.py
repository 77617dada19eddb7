"""Resource arithmetic, the currency of offers, allocations and tasks: scalars (cpus, mem,
disk, gpus) in fixed point, port ranges and sets, each keyed by name and reservation role."""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from itertools import pairwise

from schemas import common_pb2

UNRESERVED = "*"
MILLI = 1000  # scalars are kept in thousandths, as Mesos's fixed point: no float drift

Key = tuple[str, str]  # (name, role)
Range = tuple[int, int]  # inclusive


def _role(role: str) -> str:
    return role or UNRESERVED


def _merge(ranges: Iterable[Range]) -> tuple[Range, ...]:
    out: list[list[int]] = []
    for lo, hi in sorted(ranges):
        if lo > hi:
            raise ValueError(f"empty range [{lo}-{hi}]")
        if out and lo <= out[-1][1] + 1:
            out[-1][1] = max(out[-1][1], hi)
        else:
            out.append([lo, hi])
    return tuple((lo, hi) for lo, hi in out)


def _subtract_ranges(a: tuple[Range, ...], b: tuple[Range, ...]) -> tuple[Range, ...]:
    out = list(a)
    for blo, bhi in b:
        nxt: list[Range] = []
        for lo, hi in out:
            if bhi < lo or blo > hi:
                nxt.append((lo, hi))
                continue
            if lo < blo:
                nxt.append((lo, blo - 1))
            if bhi < hi:
                nxt.append((bhi + 1, hi))
        out = nxt
    return tuple(out)


def _shared(held: str, label: str, name: str, value: str) -> str:
    """"'a' and 'b' both use port 31000", or "'a' uses port 31000 twice" (two roles)."""
    what = f"{name.removesuffix('s')} {value}"
    return f"{held!r} uses {what} twice" if held == label else \
        f"{held!r} and {label!r} both use {what}"


def _ranges_contain(a: tuple[Range, ...], b: tuple[Range, ...]) -> bool:
    return all(any(lo <= blo and bhi <= hi for lo, hi in a) for blo, bhi in b)


PARSED_MEMO = 4096  # distinct encodings from_proto remembers (then it forgets them all)
_PARSED: dict[tuple[object, ...], Resources] = {}


def memo_key(items: Iterable[common_pb2.Resource]) -> tuple[object, ...] | None:
    """What `_parse` reads of each item (name, role and value; nothing else), as a key for
    the memo; None for an item with no value (refused by `_parse`). Reading the fields
    costs less than serialising each item, which was a third of the broker's accept check."""
    key: list[object] = []
    for r in items:
        kind = r.WhichOneof("value")
        if kind == "scalar":
            key.append((r.name, r.role, r.scalar))
        elif kind == "ranges":
            key.append((r.name, r.role, "r", tuple((x.begin, x.end) for x in r.ranges.ranges)))
        elif kind == "set":
            key.append((r.name, r.role, "s", tuple(r.set.items)))
        else:
            return None
    return tuple(key)


@dataclass(frozen=True)
class Resources:
    """An immutable bag of resources. `a - b` needs `a.contains(b)`; `+` merges."""

    scalars: Mapping[Key, int] = field(default_factory=dict)  # milli-units
    ranges: Mapping[Key, tuple[Range, ...]] = field(default_factory=dict)
    sets: Mapping[Key, frozenset[str]] = field(default_factory=dict)

    # -- construction ------------------------------------------------------------------
    @classmethod
    def of(cls, role: str = UNRESERVED, ports: Iterable[Range] = (), **scalars: float) -> Resources:
        """Resources.of(cpus=0.5, mem=128, ports=[(31000, 31009)])"""
        role = _role(role)
        sc = {(n, role): round(v * MILLI) for n, v in scalars.items() if round(v * MILLI)}
        rg = {("ports", role): _merge(ports)} if ports else {}
        return cls(sc, rg, {})

    @classmethod
    def parse(cls, text: str, role: str = UNRESERVED) -> Resources:
        """Parse the flag syntax `cpus:2;mem:1024;ports:[31000-31999,32005-32005];gpus:0`."""
        scalars: dict[Key, int] = {}
        ranges: dict[Key, tuple[Range, ...]] = {}
        sets: dict[Key, frozenset[str]] = {}
        for part in filter(None, (p.strip() for p in text.split(";"))):
            m = re.fullmatch(r"([a-z_][a-z0-9_]*)(?:\(([^)]*)\))?:(.+)", part)
            if not m:
                raise ValueError(f"bad resource {part!r}: expected name:value, e.g. cpus:2")
            name, part_role, value = m.group(1), _role(m.group(2) or role), m.group(3).strip()
            key = (name, part_role)
            if value.startswith("["):
                body = value.strip("[]")
                try:
                    pairs = [tuple(int(x) for x in r.split("-")) for r in body.split(",") if r]
                    ranges[key] = _merge((p[0], p[-1]) for p in pairs)
                except (ValueError, IndexError) as exc:
                    raise ValueError(f"bad ranges in {part!r}: {exc}") from exc
            elif value.startswith("{"):
                sets[key] = frozenset(x.strip() for x in value.strip("{}").split(",") if x.strip())
            else:
                try:
                    amount = float(value)
                except ValueError as exc:
                    raise ValueError(f"bad scalar in {part!r}") from exc
                if amount < 0 or amount != amount:
                    raise ValueError(f"negative or NaN scalar in {part!r}")
                scalars[key] = round(amount * MILLI)
        return cls(scalars, ranges, sets)

    @classmethod
    def total(cls, bags: Iterable[Resources]) -> Resources:
        """The sum of several bags (in one pass: no bag per addition). A bag given again
        right after itself (tasks of one shape share their parsed bag) is added once, its
        scalars times its count: its ranges and sets would merge into themselves."""
        scalars: dict[Key, int] = {}
        ranges: dict[Key, list[Range]] = {}
        sets: dict[Key, frozenset[str]] = {}
        last: Resources | None = None
        times = 0
        for bag in (*bags, None):
            if bag is last:
                times += 1
                continue
            if last is not None:
                for k, v in last.scalars.items():
                    scalars[k] = scalars.get(k, 0) + v * times
                for k, rs in last.ranges.items():
                    ranges.setdefault(k, []).extend(rs)
                for k, items in last.sets.items():
                    sets[k] = sets.get(k, frozenset()) | items
            last, times = bag, 1
        return cls(scalars, {k: _merge(rs) for k, rs in ranges.items()}, sets)

    @classmethod
    def total_disjoint(cls, named: Iterable[tuple[str, Resources]]) -> Resources:
        """The sum of several bags, each with its holder's name, when no two share a port
        (range value) or set item, whatever their roles: one port cannot go to two tasks,
        though `total` would merge it into one range. Otherwise ValueError naming both
        holders, e.g. "'a' and 'b' both use port 31000". Scalars sum as in `total`."""
        out = cls()
        spans: dict[str, list[tuple[int, int, int, str]]] = {}  # name -> (lo, order, hi, who)
        holders: dict[tuple[str, str], str] = {}
        for order, (label, bag) in enumerate(named):
            for (name, _), rs in bag.ranges.items():
                spans.setdefault(name, []).extend((lo, order, hi, label) for lo, hi in rs)
            for (name, _), items in bag.sets.items():
                for item in sorted(items):
                    if (name, item) in holders:
                        raise ValueError(_shared(holders[name, item], label, name, repr(item)))
                    holders[name, item] = label
            out += bag
        for name, ss in spans.items():
            ss.sort()  # by first value: if any two overlap, two neighbours do
            for (_, _, reach, held), (lo, _, _, label) in pairwise(ss):
                if lo <= reach:
                    raise ValueError(_shared(held, label, name, str(lo)))
        return out

    @classmethod
    def from_proto(cls, resources: Iterable[common_pb2.Resource]) -> Resources:
        """Parsed once per encoding (bounded memo): every service parses the same few task
        and offer shapes again and again; ValueError when malformed (never remembered)."""
        items = list(resources)
        key = memo_key(items)
        got = _PARSED.get(key) if key is not None else None
        if got is None:
            got = cls._parse(items)
            if key is None:
                return got  # not a quantity: _parse raised, or nothing worth remembering
            if len(_PARSED) >= PARSED_MEMO:
                _PARSED.clear()
            _PARSED[key] = got
        return got

    @classmethod
    def _parse(cls, resources: Iterable[common_pb2.Resource]) -> Resources:
        """Items of one name and role add up (scalars summed, ranges merged, sets united).
        Built in one pass (no bag per item: a re-registration storm parses 100,000)."""
        scalars: dict[Key, int] = {}
        ranges: dict[Key, tuple[Range, ...]] = {}
        sets: dict[Key, frozenset[str]] = {}
        for r in resources:
            key = (r.name, _role(r.role))
            kind = r.WhichOneof("value")
            if kind == "scalar":
                if not math.isfinite(r.scalar * MILLI) or r.scalar < 0:
                    raise ValueError(f"resource {r.name}: scalar {r.scalar} is not a finite, "
                                     "non-negative number")
                milli = round(r.scalar * MILLI)
                if milli:
                    scalars[key] = scalars.get(key, 0) + milli
            elif kind == "ranges":
                if r.ranges.ranges:
                    ranges[key] = _merge((*ranges.get(key, ()),
                                          *((x.begin, x.end) for x in r.ranges.ranges)))
            elif kind == "set":
                if r.set.items:
                    sets[key] = sets.get(key, frozenset()) | frozenset(r.set.items)
            else:
                raise ValueError(f"resource {r.name!r} has no value")
        return cls(scalars, ranges, sets)

    def to_proto(self) -> list[common_pb2.Resource]:
        out = []
        for (name, role), v in sorted(self.scalars.items()):
            out.append(common_pb2.Resource(name=name, role=role, scalar=v / MILLI))
        for (name, role), rs in sorted(self.ranges.items()):
            r = common_pb2.Resource(name=name, role=role)
            r.ranges.ranges.extend(common_pb2.ValueRange(begin=lo, end=hi) for lo, hi in rs)
            out.append(r)
        for (name, role), items in sorted(self.sets.items()):
            r = common_pb2.Resource(name=name, role=role)
            r.set.items.extend(sorted(items))
            out.append(r)
        return out

    # -- algebra -----------------------------------------------------------------------
    def __add__(self, other: Resources) -> Resources:
        # A bag is never changed once made: a part `other` has nothing of is shared.
        scalars = self.scalars
        if other.scalars:
            scalars = dict(scalars)
            for k, v in other.scalars.items():
                scalars[k] = scalars.get(k, 0) + v
        ranges = self.ranges
        if other.ranges:
            ranges = dict(ranges)
            for k, rs in other.ranges.items():
                ranges[k] = _merge((*ranges.get(k, ()), *rs))
        sets = self.sets
        if other.sets:
            sets = dict(sets)
            for k, items in other.sets.items():
                sets[k] = sets.get(k, frozenset()) | items
        return Resources(scalars, ranges, sets)

    def contains(self, other: Resources) -> bool:
        return (
            all(self.scalars.get(k, 0) >= v for k, v in other.scalars.items())
            and all(_ranges_contain(self.ranges.get(k, ()), rs) for k, rs in other.ranges.items())
            and all(items <= self.sets.get(k, frozenset()) for k, items in other.sets.items())
        )

    def __sub__(self, other: Resources) -> Resources:
        if not self.contains(other):
            raise ValueError(f"cannot subtract {other} from {self}")
        scalars = {k: v - other.scalars.get(k, 0) for k, v in self.scalars.items()}
        ranges = {k: _subtract_ranges(rs, other.ranges.get(k, ())) for k, rs in self.ranges.items()}
        sets = {k: items - other.sets.get(k, frozenset()) for k, items in self.sets.items()}
        return Resources({k: v for k, v in scalars.items() if v},
                         {k: v for k, v in ranges.items() if v},
                         {k: v for k, v in sets.items() if v})

    def same(self, other: Resources) -> bool:
        """The same quantities (each contains the other), however they are represented."""
        return self.contains(other) and other.contains(self)

    def with_role(self, role: str) -> Resources:
        """The same quantities under `role` (UNRESERVED strips reservations); the bag itself
        when all of it is already under `role` (most bags are unreserved: the broker asks
        this of every offer and launch it checks)."""
        role = _role(role)
        if all(r == role for _, r in self.scalars) and all(r == role for _, r in self.ranges) \
                and all(r == role for _, r in self.sets):
            return self
        scalars: dict[Key, int] = {}
        for (n, _), v in self.scalars.items():
            scalars[(n, role)] = scalars.get((n, role), 0) + v
        ranges: dict[Key, list[Range]] = {}
        for (n, _), rs in self.ranges.items():
            ranges.setdefault((n, role), []).extend(rs)
        sets: dict[Key, frozenset[str]] = {}
        for (n, _), items in self.sets.items():
            sets[(n, role)] = sets.get((n, role), frozenset()) | items
        return Resources(scalars, {k: _merge(rs) for k, rs in ranges.items()}, sets)

    def is_empty(self) -> bool:
        return not (self.scalars or self.ranges or self.sets)

    def __bool__(self) -> bool:
        return not self.is_empty()

    # -- views -------------------------------------------------------------------------
    def quantities(self) -> Resources:
        """The scalars alone: what adds up across agents (port 31000 on two machines is two
        ports, which ranges keyed by name alone cannot say)."""
        return Resources(dict(self.scalars))

    def scalar(self, name: str) -> float:
        """Total of a scalar across roles, in its unit (cores, MiB)."""
        return sum(v for (n, _), v in self.scalars.items() if n == name) / MILLI

    def names(self) -> set[str]:
        return {n for n, _ in (*self.scalars, *self.ranges, *self.sets)}

    def for_role(self, role: str) -> Resources:
        """What a framework of `role` may use: unreserved plus reserved for `role`."""
        keep = {UNRESERVED, _role(role)}
        return Resources({k: v for k, v in self.scalars.items() if k[1] in keep},
                         {k: v for k, v in self.ranges.items() if k[1] in keep},
                         {k: v for k, v in self.sets.items() if k[1] in keep})

    def __str__(self) -> str:
        parts = []
        for (n, r), v in sorted(self.scalars.items()):
            parts.append(f"{n}{'' if r == UNRESERVED else f'({r})'}:{v / MILLI:g}")
        for (n, r), rs in sorted(self.ranges.items()):
            body = ",".join(f"{lo}-{hi}" for lo, hi in rs)
            parts.append(f"{n}{'' if r == UNRESERVED else f'({r})'}:[{body}]")
        for (n, r), items in sorted(self.sets.items()):
            parts.append(f"{n}{'' if r == UNRESERVED else f'({r})'}:{{{','.join(sorted(items))}}}")
        return ";".join(parts)
