"""Dynamic reservations as the allocator follows them (pure arithmetic, no state): a RESERVE or
UNRESERVE inside an ACCEPT relabels resources of the framework's offer (unreserved <-> reserved
for its role), and the allocator hears of it twice, in either order: from the broker, which
recovers the unused remainder under the new labels, and from the state stream, which brings
the agent's new total (same quantities, another reserved/unreserved split) and the tasks.

- `as_held`: recovered (or launched) resources, matched against what the allocator holds
  for the framework: a label the offer lacks is taken from the other label the framework
  may use (unreserved or its role), so the recovery is not refused.
- `follow_split`: the agent's new split moves the same amounts in the offers of the
  frameworks of the role that gained (or lost) the reservation, lowest id first: a
  reservation is made from its framework's offer. What is moved beyond them was free.
- `swap_for_use`: a task whose labels its framework's offer lacks (the offer was relabelled
  before the task came) swaps labels between the offer and the free resources."""

from __future__ import annotations

from collections.abc import Mapping

from services.resources import UNRESERVED, Range, Resources


def _intersect(a: tuple[Range, ...], b: tuple[Range, ...]) -> tuple[Range, ...]:
    return tuple((max(lo, blo), min(hi, bhi)) for lo, hi in a for blo, bhi in b
                 if max(lo, blo) <= min(hi, bhi))


def overlap(a: Resources, b: Resources) -> Resources:
    """The largest resources both `a` and `b` contain (label by label)."""
    scalars = {k: min(v, b.scalars[k]) for k, v in a.scalars.items()
               if min(v, b.scalars.get(k, 0)) > 0}
    ranges = {k: both for k, rs in a.ranges.items()
              if (both := _intersect(rs, b.ranges.get(k, ())))}
    sets = {k: common for k, items in a.sets.items()
            if (common := items & b.sets.get(k, frozenset()))}
    return Resources() + Resources(scalars, ranges, sets)  # `+` normalises the ranges


def only(r: Resources, role: str) -> Resources:
    """The part of `r` labelled `role`."""
    return Resources({k: v for k, v in r.scalars.items() if k[1] == role},
                     {k: v for k, v in r.ranges.items() if k[1] == role},
                     {k: v for k, v in r.sets.items() if k[1] == role})


def _directions(role: str) -> tuple[tuple[str, str], ...]:
    """(from, to) label pairs a framework of `role` may convert between."""
    return () if role in ("", UNRESERVED) else ((UNRESERVED, role), (role, UNRESERVED))


def as_held(held: Resources, resources: Resources, role: str) -> Resources:
    """`resources` under the labels of `held` (what the framework is offered on the agent)
    where `held` lacks their own: the same quantities, reserved for `role` or unreserved.
    What `held` has under neither label is left as it is (the caller refuses it)."""
    exact = overlap(held, resources)
    rest = resources - exact
    if not rest:
        return resources
    spare = held - exact
    moved = Resources()
    for src, dst in _directions(role):
        got = overlap(spare, only(rest, dst).with_role(src))
        moved, spare, rest = moved + got, spare - got, rest - got.with_role(dst)
    return exact + moved + rest


def follow_split(old: Resources, new: Resources, offered: Mapping[str, Resources],
                 roles: Mapping[str, str]) -> dict[str, Resources]:
    """What each framework is offered on an agent whose total went from `old` to `new`:
    the amounts that moved from one label to the other (what `new` gained under `dst` and
    `old` had under `src`) move, up to what they hold, in the offers of `src`/`dst`'s
    frameworks, lowest id first."""
    out = dict(offered)
    movable: dict[tuple[str, str], Resources] = {}
    for fid in sorted(out):
        for src, dst in _directions(roles[fid]):
            if (src, dst) not in movable:
                gained = only(new, dst) - overlap(only(new, dst), only(old, dst))
                lost = only(old, src) - overlap(only(old, src), only(new, src))
                movable[src, dst] = overlap(gained.with_role(src), lost)
            take = overlap(out[fid], movable[src, dst])
            if take:
                out[fid] = out[fid] - take + take.with_role(dst)
                movable[src, dst] -= take
    return out


def swap_for_use(offered: Resources, free: Resources, resources: Resources,
                 role: str) -> tuple[Resources, Resources]:
    """(offered, free) with labels swapped between them so that the offer holds as much of
    `resources` (a task of the framework) as it can: the same quantities stay offered and
    free, under the labels the task uses."""
    rest = resources - overlap(offered, resources)
    spare = offered - overlap(offered, resources)
    for src, dst in _directions(role):
        # offered under src, used under dst, and free has dst to give for it
        x = overlap(overlap(spare, only(rest, dst).with_role(src)),
                    only(free, dst).with_role(src))
        if x:
            offered = offered - x + x.with_role(dst)
            free = free - x.with_role(dst) + x
            spare, rest = spare - x, rest - x.with_role(dst)
    return offered, free
