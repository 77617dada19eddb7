"""Epoch fencing against the elected leader (issue 10, defect 5): a message from an elected
role is admitted only at the epoch, and from the member, of that role's leader as the
receiver's detector knows it. Whatever a sender claims never moves the bar: one forged
frame with a huge epoch used to fence the real leader out for good."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from services.bus import codec
from services.bus.election import LeaderInfo
from services.bus.epoch import EpochFence, Verdict

BROKER = codec.Role.Value("ROLE_BROKER")
MASTER = codec.Role.Value("ROLE_MASTER")
AGENT = codec.Role.Value("ROLE_AGENT")


def info(member: str, epoch: int, role: str = "broker") -> LeaderInfo:
    return LeaderInfo(role, member, epoch, {})


def test_only_the_elected_leaders_epoch_and_member_are_admitted() -> None:
    fence = EpochFence(frozenset({BROKER}))
    assert fence.check(BROKER, 7, "b1") is Verdict.UNKNOWN_LEADER  # no leader known yet
    fence.follow(BROKER, info("b1", 7))
    assert fence.check(BROKER, 7, "b1") is Verdict.ADMIT
    assert fence.check(BROKER, 6, "b1") is Verdict.STALE_EPOCH
    assert fence.check(BROKER, 8, "b2") is Verdict.NEWER_EPOCH  # the detector may lag
    assert fence.check(BROKER, 7, "mallory") is Verdict.WRONG_MEMBER
    assert fence.check(AGENT, 0, "agent-1") is Verdict.ADMIT  # not an elected role


def test_a_forged_huge_epoch_never_fences_the_real_leader_out() -> None:
    fence = EpochFence(frozenset({BROKER}))
    fence.follow(BROKER, info("b1", 7))
    assert fence.check(BROKER, 10**12, "b1") is Verdict.NEWER_EPOCH
    assert fence.check(BROKER, 7, "b1") is Verdict.ADMIT
    assert fence.leader(BROKER) == info("b1", 7)


def test_the_bar_follows_the_detector_down_as_well_as_up() -> None:
    """The detector is the authority: a new leader's epoch is higher, and a leader gone
    leaves no one to admit."""
    fence = EpochFence(frozenset({MASTER}))
    fence.follow(MASTER, info("m1", 3, "master"))
    fence.follow(MASTER, info("m2", 4, "master"))
    assert fence.check(MASTER, 3, "m1") is Verdict.STALE_EPOCH
    assert fence.check(MASTER, 4, "m2") is Verdict.ADMIT
    fence.follow(MASTER, None)
    assert fence.check(MASTER, 4, "m2") is Verdict.UNKNOWN_LEADER


def test_listeners_hear_every_change_of_leader() -> None:
    fence = EpochFence(frozenset({MASTER}))
    heard: list[int] = []
    stop = fence.listen(lambda: heard.append(1))
    fence.follow(MASTER, info("m1", 3, "master"))
    fence.follow(MASTER, info("m1", 3, "master"))  # the same: nothing to tell
    stop()
    fence.follow(MASTER, info("m2", 4, "master"))
    assert heard == [1]


def test_verdicts_say_what_may_be_held_and_how_to_answer() -> None:
    assert {v for v in Verdict if v.holdable} == {Verdict.UNKNOWN_LEADER, Verdict.NEWER_EPOCH}
    assert Verdict.STALE_EPOCH.code == codec.ErrorCode.Value("STALE_EPOCH")
    assert all(v.code == codec.ErrorCode.Value("NOT_LEADER") for v in Verdict
               if v not in (Verdict.ADMIT, Verdict.STALE_EPOCH))


CLAIMS = st.tuples(st.integers(min_value=0, max_value=2**63 - 1),
                   st.sampled_from(["b1", "b2", "mallory", ""]))


@given(st.lists(CLAIMS, max_size=50), st.integers(min_value=1, max_value=1000))
def test_no_claim_changes_what_is_admitted(claims: list[tuple[int, str]], epoch: int) -> None:
    fence = EpochFence(frozenset({BROKER}))
    fence.follow(BROKER, info("b1", epoch))
    for claimed, member in claims:
        verdict = fence.check(BROKER, claimed, member)
        assert (verdict is Verdict.ADMIT) == (claimed == epoch and member in ("b1", ""))
        assert fence.check(BROKER, epoch, "b1") is Verdict.ADMIT
