"""Resource arithmetic: algebraic laws (hypothesis) and the flag/proto formats."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from services.resources import Resources

ranges = st.lists(st.tuples(st.integers(0, 200), st.integers(0, 20)).map(
    lambda t: (t[0], t[0] + t[1])), max_size=4)
bags = st.builds(
    lambda c, m, p, role: Resources.of(role=role, cpus=c, mem=m, ports=p),
    st.integers(0, 16000).map(lambda x: x / 1000), st.integers(0, 4096), ranges,
    st.sampled_from(["*", "web"]),
)


@given(bags, bags)
def test_sum_contains_its_parts(a: Resources, b: Resources) -> None:
    assert (a + b).contains(a) and (a + b).contains(b)
    assert a + b == b + a


@given(bags, bags)
def test_scalars_add_and_subtract_as_a_bag(a: Resources, b: Resources) -> None:
    a, b = Resources(a.scalars), Resources(b.scalars)
    assert (a + b) - b == a


@given(bags, bags)
def test_ranges_subtract_as_sets(a: Resources, b: Resources) -> None:
    a, b = Resources(ranges=a.ranges), Resources(ranges=b.ranges)
    total = a + b
    rest = total - b
    assert total.contains(rest) and (rest + b) == total
    for key, rs in rest.ranges.items():  # nothing of b is left
        for lo, hi in rs:
            assert not any(blo <= hi and lo <= bhi for blo, bhi in b.ranges.get(key, ()))


@given(bags, bags)
def test_subtraction_needs_containment(a: Resources, b: Resources) -> None:
    if not a.contains(b):
        with pytest.raises(ValueError):
            a - b


@given(bags)
def test_proto_and_text_round_trips(a: Resources) -> None:
    assert Resources.from_proto(a.to_proto()) == a
    assert Resources.parse(str(a)) == a


def test_parse_flag_syntax_and_errors() -> None:
    r = Resources.parse("cpus:2;mem:1024;ports:[31000-31009,31020-31020];cpus(web):1")
    assert r.scalar("cpus") == 3 and r.scalar("mem") == 1024
    assert r.ranges[("ports", "*")] == ((31000, 31009), (31020, 31020))
    assert r.for_role("db").scalar("cpus") == 2 and r.for_role("web").scalar("cpus") == 3
    for bad in ("cpus", "cpus:x", "cpus:-1", "ports:[a-b]", "Cpus:1"):
        with pytest.raises(ValueError):
            Resources.parse(bad)


def test_fixed_point_does_not_drift() -> None:
    total = Resources.of(cpus=1.0)
    tenth = Resources.of(cpus=0.1)
    for _ in range(10):
        total = total - tenth
    assert total.is_empty()


def test_port_ranges_split_and_merge() -> None:
    r = Resources.of(ports=[(31000, 31010)]) - Resources.of(ports=[(31003, 31004)])
    assert r.ranges[("ports", "*")] == ((31000, 31002), (31005, 31010))
    assert (r + Resources.of(ports=[(31003, 31004)])) == Resources.of(ports=[(31000, 31010)])


def test_from_proto_is_canonical_and_refuses_what_is_not_a_quantity() -> None:
    from schemas import common_pb2

    zero = [common_pb2.Resource(name="cpus", scalar=0.0), common_pb2.Resource(name="ports")]
    zero[1].ranges.SetInParent()
    assert Resources.from_proto(zero) == Resources()  # no `cpus:0` left to compare unequal
    # 1.8e305 is finite, but not once counted in thousandths (it overflowed to inf, and a
    # registration carrying it raised OverflowError inside the master core).
    for bad in (float("inf"), float("nan"), -1.0, 1.7976931348623159e305):
        with pytest.raises(ValueError):
            Resources.from_proto([common_pb2.Resource(name="mem", scalar=bad)])


def test_total_same_and_with_role() -> None:
    a, b = Resources.of(cpus=1, mem=64), Resources.of(role="web", cpus=0.5, ports=[(1, 2)])
    assert Resources.total([a, b]) == a + b and Resources.total([]) == Resources()
    assert (a + b).same(b + a) and not a.same(b)
    moved = b.with_role("*")
    assert moved.for_role("db").scalar("cpus") == 0.5  # now unreserved: anyone may use it
    assert moved.with_role("web") == b


@given(st.lists(st.tuples(bags, st.integers(1, 4)), max_size=4))
def test_total_is_the_sum_with_a_bag_given_several_times_in_a_row(
        runs: list[tuple[Resources, int]]) -> None:
    """`total` adds a run of one bag object once, its scalars times the run's length: the
    same as adding each (ranges and sets merge into themselves)."""
    listed = [bag for bag, times in runs for _ in range(times)]
    one_by_one = Resources()
    for bag in listed:
        one_by_one += bag
    assert Resources.total(listed) == one_by_one
    assert Resources.total(iter(listed)) == one_by_one


@given(st.lists(bags, max_size=4))
def test_total_disjoint_is_the_total_exactly_when_no_port_is_shared(bs: list[Resources]) -> None:
    ports = [{p for rs in b.ranges.values() for lo, hi in rs for p in range(lo, hi + 1)}
             for b in bs]
    shared = any(ports[i] & ports[j] for i in range(len(bs)) for j in range(i))
    named = [(f"t{i}", b) for i, b in enumerate(bs)]
    if shared:
        with pytest.raises(ValueError, match="both use port"):
            Resources.total_disjoint(named)
    else:
        assert Resources.total_disjoint(named) == Resources.total(bs)


def test_total_disjoint_names_the_two_holders_whatever_their_roles() -> None:
    a = Resources.of(cpus=1, ports=[(31000, 31004)])
    b = Resources.of(role="web", cpus=0.5, ports=[(31005, 31009)])
    assert Resources.total_disjoint([("a", a), ("b", b)]) == a + b  # scalars still sum
    c = Resources.of(role="db", ports=[(31004, 31020)])
    with pytest.raises(ValueError, match=r"^'a' and 'c' both use port 31004$"):
        Resources.total_disjoint([("a", a), ("b", b), ("c", c)])
    with pytest.raises(ValueError, match=r"^'x' and 'y' both use disk 'sda'$"):
        Resources.total_disjoint([("x", Resources.parse("disks:{sda,sdb}")),
                                  ("y", Resources.parse("disks(web):{sdc,sda}"))])
    with pytest.raises(ValueError, match=r"^'x' uses port 5 twice$"):
        Resources.total_disjoint([("x", Resources.parse("ports:[5-5];ports(web):[4-6]"))])


sets = st.frozensets(st.sampled_from(["sda", "sdb", "sdc"]), max_size=3)
mixed = st.lists(st.tuples(bags, sets, st.sampled_from(["*", "web", "db"])), max_size=3).map(
    lambda parts: Resources.total(b + Resources(sets={("disks", role): s} if s else {})
                                  for b, s, role in parts))


def _with_role_by_hand(bag: Resources, role: str) -> Resources:
    """with_role as it was first written: one bag per part, added up."""
    out = Resources()
    for (n, _), v in bag.scalars.items():
        out += Resources({(n, role): v})
    for (n, _), rs in bag.ranges.items():
        out += Resources(ranges={(n, role): rs})
    for (n, _), items in bag.sets.items():
        out += Resources(sets={(n, role): items})
    return out


@given(mixed, st.sampled_from(["*", "web", "db"]))
def test_with_role_moves_every_part_and_keeps_the_quantities(bag: Resources, role: str) -> None:
    moved = bag.with_role(role)
    assert moved == _with_role_by_hand(bag, role)
    assert {r for _, r in [*moved.scalars, *moved.ranges, *moved.sets]} <= {role}


@given(mixed, mixed)
def test_from_proto_remembers_nothing_it_should_not(a: Resources, b: Resources) -> None:
    """The parse memo's key holds all that the parse reads: two bags parse as themselves
    whatever was parsed before (and a role spelled "" is the unreserved one)."""
    for bag in (a, b, a, b):
        assert Resources.from_proto(bag.to_proto()) == bag
    items = a.to_proto()
    for r in items:
        if r.role == "*":
            r.role = ""
    assert Resources.from_proto(items) == a
