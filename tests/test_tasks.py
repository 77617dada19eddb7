"""The task state machine: terminal is final, every live state can end, and the messages say
why a transition is refused."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from schemas import common_pb2
from services import tasks

ALL_VALUES = list(common_pb2.TaskState.values())
states = st.sampled_from(ALL_VALUES)


def test_terminal_set_is_mesos_set() -> None:
    assert {tasks.name(s) for s in tasks.TERMINAL} == {
        "TASK_FINISHED", "TASK_FAILED", "TASK_KILLED", "TASK_ERROR", "TASK_LOST",
        "TASK_DROPPED", "TASK_GONE", "TASK_GONE_BY_OPERATOR",
    }
    assert not tasks.is_terminal(tasks.UNREACHABLE)
    assert not tasks.is_terminal(tasks.UNKNOWN)
    # Every enum value is classified: storable, or one of the two that are not states.
    assert set(ALL_VALUES) == tasks.STORABLE | {tasks.NEW, tasks.UNKNOWN}


@pytest.mark.parametrize(
    ("current", "new"),
    [
        (None, tasks.STAGING),
        (tasks.NEW, tasks.ERROR),
        (tasks.STAGING, tasks.STARTING),
        (tasks.STAGING, tasks.RUNNING),
        (tasks.STAGING, tasks.KILLED),
        (tasks.STAGING, tasks.DROPPED),
        (tasks.STARTING, tasks.RUNNING),
        (tasks.RUNNING, tasks.RUNNING),  # a health update
        (tasks.RUNNING, tasks.KILLING),
        (tasks.RUNNING, tasks.UNREACHABLE),
        (tasks.KILLING, tasks.KILLED),
        (tasks.KILLING, tasks.FINISHED),
        (tasks.UNREACHABLE, tasks.RUNNING),  # agent came back
        (tasks.UNREACHABLE, tasks.GONE),
        (tasks.UNREACHABLE, tasks.GONE_BY_OPERATOR),
        (tasks.RUNNING, tasks.LOST),
    ],
)
def test_legal(current: tasks.State | None, new: tasks.State) -> None:
    assert tasks.transition(current, new) == new


@pytest.mark.parametrize(
    ("current", "new", "says"),
    [
        (tasks.FINISHED, tasks.RUNNING, "TASK_FINISHED is terminal"),
        (tasks.LOST, tasks.LOST, "terminal"),
        (tasks.RUNNING, tasks.STARTING, "may go only to"),
        (tasks.RUNNING, tasks.ERROR, "may go only to"),
        (None, tasks.RUNNING, "from (new)"),
        (tasks.RUNNING, tasks.UNKNOWN, "reconciliation answer"),
        (tasks.UNKNOWN, tasks.RUNNING, "reconciliation answer"),
        (tasks.RUNNING, tasks.NEW, "not a task state"),
    ],
)
def test_illegal_says_why(current: tasks.State | None, new: tasks.State, says: str) -> None:
    with pytest.raises(tasks.IllegalTransition) as err:
        tasks.transition(current, new)
    assert says in str(err.value)
    assert err.value.new == new


def test_as_seen_by() -> None:
    for state in (tasks.UNREACHABLE, tasks.GONE, tasks.DROPPED, tasks.UNKNOWN):
        assert tasks.as_seen_by(state, partition_aware=False) == tasks.LOST
        assert tasks.as_seen_by(state, partition_aware=True) == state
    assert tasks.as_seen_by(tasks.RUNNING, partition_aware=False) == tasks.RUNNING


def test_check_storable() -> None:
    assert tasks.check_storable(tasks.FINISHED) == tasks.FINISHED
    for bad in (tasks.UNKNOWN, tasks.NEW, 99):
        with pytest.raises(tasks.IllegalTransition):
            tasks.check_storable(bad)  # type: ignore[arg-type]


def test_every_live_state_can_end() -> None:
    """From every reachable non-terminal state, some path reaches a terminal state."""
    for start in tasks.TRANSITIONS:
        if tasks.is_terminal(start):
            continue
        seen, frontier = {start}, [start]
        while frontier:
            frontier = [n for s in frontier for n in tasks.TRANSITIONS[s] if n not in seen]
            seen.update(frontier)
        assert seen & tasks.TERMINAL, tasks.name(start)


@given(st.lists(states, max_size=40))
def test_no_path_leaves_a_terminal_state(attempts: list[tasks.State]) -> None:
    """Apply random moves, keeping the legal ones: once terminal, nothing is accepted; the
    result of transition() always agrees with can_transition()."""
    current: tasks.State | None = None
    ended = False
    for new in attempts:
        legal = tasks.can_transition(current, new)
        try:
            tasks.transition(current, new)
            assert legal
        except tasks.IllegalTransition:
            assert not legal
            continue
        assert not ended, f"left terminal {tasks.name(current)} for {tasks.name(new)}"
        assert new != tasks.UNKNOWN
        current = new
        ended = tasks.is_terminal(current)


@given(st.lists(st.integers(min_value=0, max_value=10**6), max_size=30))
def test_random_walk_can_always_end(choices: list[int]) -> None:
    """Walk only along legal moves: the walk never gets stuck before a terminal state, and a
    terminal state has no way out."""
    current: tasks.State = tasks.NEW
    for c in choices:
        nexts = sorted(tasks.TRANSITIONS[current])
        if tasks.is_terminal(current):
            assert nexts == []
            return
        assert nexts, tasks.name(current)
        current = nexts[c % len(nexts)]
        assert any(tasks.is_terminal(n) for n in tasks.TRANSITIONS[current]) or (
            tasks.is_terminal(current)
        )
