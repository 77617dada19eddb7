"""The allocator follows dynamic reservations (issue 9 item 5): a RESERVE or UNRESERVE inside
an ACCEPT reaches it twice, in either order -- the broker recovers the unused remainder under
the new labels, the state stream brings the agent's new total and the task -- and whatever the
order, the offer is used up, the split is the master's, and the reserved part goes only to
its role."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given
from hypothesis import strategies as st

from services.allocator.core import AllocatorCore
from services.allocator.reserved import as_held, follow_split, only, overlap
from services.resources import UNRESERVED, Resources

R = Resources.parse

# name: (agent total before, what the ACCEPT's task uses, the remainder the broker recovers,
#        the total the master publishes after)
SCENARIOS = {
    "reserve, launch on the reservation": (
        "cpus:4;mem:4096", "cpus(web):1", "cpus(web):1;cpus:2;mem:4096",
        "cpus(web):2;cpus:2;mem:4096"),
    "reserve, launch on unreserved": (
        "cpus:4;mem:4096", "cpus:1", "cpus(web):1;cpus:2;mem:4096",
        "cpus(web):1;cpus:3;mem:4096"),
    "reserve everything, launch nothing": (
        "cpus:4;mem:4096", "", "cpus(web):4;mem(web):4096", "cpus(web):4;mem(web):4096"),
    "unreserve, launch on it": (
        "cpus(web):2;cpus:2;mem:4096", "cpus:1", "cpus:3;mem:4096", "cpus:4;mem:4096"),
    "unreserve part, launch on the rest": (
        "cpus(web):2;cpus:2;mem:4096", "cpus(web):1", "cpus:3;mem:4096",
        "cpus(web):1;cpus:3;mem:4096"),
}
# The stream brings the task with (or after) the agent's new total; the broker's recovery
# may come at any point.
ORDERS = [o for o in itertools.permutations(("recover", "total", "task"))
          if o.index("total") < o.index("task")]


def _offered(before: str) -> tuple[AllocatorCore, str]:
    core = AllocatorCore()
    core.agent_added("a1", "h1", R(before))
    core.framework_added("web-fw", "web")
    [offer] = core.allocate(0.0).allocations
    assert offer.resources == R(before)
    core.framework_added("batch-fw", "batch")
    return core, offer.framework_id


@pytest.mark.parametrize("order", ORDERS, ids="-".join)
@pytest.mark.parametrize("name", SCENARIOS)
def test_a_reservation_in_an_accept_is_followed_in_any_order(name: str,
                                                             order: tuple[str, ...]) -> None:
    before, task, rest, after = SCENARIOS[name]
    core, fid = _offered(before)
    for step in order:
        if step == "recover":
            core.recover("a1", fid, R(rest), 0, 1.0)
        elif step == "total":
            core.agent_total_changed("a1", R(after))
        elif task:
            core.resources_used("a1", fid, R(task))
        core.validate()
    agent = core.agents["a1"]
    assert agent.total == R(after)
    assert not agent.offered, "an offer is left counted: the agent is never offered again"
    assert agent.used == ({fid: R(task)} if task else {})
    assert agent.free.same(R(after) - R(task or "")) and agent.free == R(after) - R(task or "")
    cycle = core.allocate(2.0)
    got = {a.framework_id: a.resources for a in cycle.allocations}
    free = R(after) - R(task or "")
    assert got.get("batch-fw", Resources()) == only(free, UNRESERVED)  # never the reservation
    assert got.get(fid, Resources()) == only(free, "web")
    core.validate()


def test_a_refused_launch_gives_everything_back_under_the_old_split() -> None:
    """The master refused the ACCEPT (its reservation never happened): the broker recovers
    the remainder and the task's resources, both under the new labels."""
    core, fid = _offered("cpus:4;mem:4096")
    core.recover("a1", fid, R("cpus(web):1;cpus:2;mem:4096"), 0, 1.0)
    core.recover("a1", fid, R("cpus(web):1"), 0, 1.0)
    agent = core.agents["a1"]
    assert not agent.offered and agent.free == R("cpus:4;mem:4096")
    core.validate()


def test_a_recovery_the_offer_cannot_hold_is_still_refused() -> None:
    core, fid = _offered("cpus:4;mem:4096")
    with pytest.raises(ValueError, match="returns"):
        core.recover("a1", fid, R("cpus(batch):1"), 0, 1.0)  # not its role
    with pytest.raises(ValueError, match="returns"):
        core.recover("a1", fid, R("cpus(web):5"), 0, 1.0)  # more than offered
    core.validate()


def test_a_reserved_port_range_follows_item_by_item() -> None:
    core = AllocatorCore()
    core.agent_added("a1", "h1", R("cpus:1;ports:[31000-31009]"))
    core.framework_added("web-fw", "web")
    [offer] = core.allocate(0.0).allocations
    core.agent_total_changed("a1", R("cpus:1;ports:[31000-31001,31005-31009];"
                                     "ports(web):[31002-31004]"))
    assert core.agents["a1"].offered["web-fw"] == R(
        "cpus:1;ports:[31000-31001,31005-31009];ports(web):[31002-31004]")
    core.recover("a1", offer.framework_id, core.agents["a1"].offered["web-fw"], 0, 1.0)
    core.validate()


# -- the arithmetic, as properties -----------------------------------------------------------

LABELS = st.sampled_from([UNRESERVED, "web", "batch"])
BAGS = st.builds(
    lambda parts: Resources.total(Resources.of(role=r, **{n: v}) for r, n, v in parts),
    st.lists(st.tuples(LABELS, st.sampled_from(["cpus", "mem"]),
                       st.integers(0, 8).map(float)), max_size=6))


@given(BAGS, BAGS)
def test_as_held_keeps_quantities_and_changes_only_labels_web_may_use(held: Resources,
                                                                      r: Resources) -> None:
    out = as_held(held, r, "web")
    assert out.with_role(UNRESERVED).same(r.with_role(UNRESERVED))
    assert only(out, "batch") == only(r, "batch")  # another role's label is never made up
    if held.contains(r):
        assert out == r


@given(BAGS, BAGS, BAGS)
def test_follow_split_keeps_what_each_holds(old: Resources, moved: Resources,
                                            offer: Resources) -> None:
    """Moving `moved` (of `old`'s unreserved part) to web: each offer keeps its amounts, and
    the new labels of the offers fit the new total when the old ones fitted the old."""
    unreserved = overlap(old, moved.with_role(UNRESERVED))
    new = old - unreserved + unreserved.with_role("web")
    offer = overlap(old, offer)
    out = follow_split(old, new, {"f": offer}, {"f": "web"})
    assert out["f"].with_role(UNRESERVED).same(offer.with_role(UNRESERVED))
    assert new.contains(out["f"])



ROLE_OF = {"web-fw": "web", "db-fw": "db", "any-fw": UNRESERVED}


@given(st.lists(st.tuples(st.sampled_from(sorted(ROLE_OF)), st.integers(1, 4)), max_size=4),
       st.lists(st.tuples(LABELS, LABELS, st.integers(1, 4)), min_size=1, max_size=3))
def test_a_new_split_is_taken_whole_or_refused_whole(takes: list[tuple[str, int]],
                                                     moves: list[tuple[str, str, int]]) -> None:
    """Frameworks hold offers on an agent, some given back; its total is relabelled (cpus
    moved between labels): the core follows (validate() holds) or refuses, unchanged."""
    core = AllocatorCore()
    core.agent_added("a1", "h1", R("cpus:4;cpus(web):2;cpus(db):2;mem:4096"))
    for fid, role in ROLE_OF.items():
        core.framework_added(fid, role)
    core.allocate(0.0)  # each takes what its role may use: any-fw first, the unreserved
    for fid, n in takes:  # some of it comes back
        held = core.agents["a1"].offered.get(fid)
        cpus = next((k for k in held.scalars if k[0] == "cpus"), None) if held else None
        if held is not None and cpus is not None:
            back = Resources({cpus: min(n * 1000, held.scalars[cpus])})
            core.recover("a1", fid, back, 0, 1.0)
    core.validate()
    total = core.agents["a1"].total
    for src, dst, n in moves:
        have = only(total, src).scalars.get(("cpus", src), 0) // 1000
        if src != dst and have:
            moved = Resources.of(role=src, cpus=min(n, have))
            total = total - moved + moved.with_role(dst)
    before = (core.agents["a1"].total, dict(core.agents["a1"].offered), core.agents["a1"].free)
    try:
        core.agent_total_changed("a1", total)
    except ValueError:
        assert (core.agents["a1"].total, core.agents["a1"].offered,
                core.agents["a1"].free) == before
    else:
        assert core.agents["a1"].total == total
    core.validate()
