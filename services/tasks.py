"""The task state machine, in one place for master, agent and executor: which TaskStates are
terminal, which transitions are legal, and how a state reads to a non-partition-aware framework.

Mesos checks only "terminal is final"; we also refuse moves that make no sense (RUNNING back to
STARTING, ERROR after the task ran), so a bug shows up as IllegalTransition, not as a task that
runs twice. Notes on the shape of the graph:

- Every non-terminal state may repeat itself: a RUNNING update whose `healthy` changed, a
  resent STAGING, an UNREACHABLE re-announced after a master failover.
- The master generates LOST, DROPPED, GONE, GONE_BY_OPERATOR and UNREACHABLE for any live
  task; it stores UNREACHABLE and *tells* non-partition-aware frameworks TASK_LOST
  (`as_seen_by`), so such a task can still come back when its agent re-registers.
- UNREACHABLE -> STAGING/STARTING/RUNNING/KILLING: the agent came back and reported the
  task's real state; UNREACHABLE -> any terminal: it reported an end (or was removed).
- ERROR means "invalid, never ran": only before STAGING (master validation), from STAGING
  (agent validation), or from UNREACHABLE (an agent back with a task it had rejected).
- "No record yet" (None or TASK_STATE_UNSPECIFIED) may go to STAGING, or straight to an end
  the master decides before launching (ERROR, DROPPED, LOST, KILLED).
- TASK_UNKNOWN is a reconciliation *answer* (the master does not know the task), never a
  stored state: every transition into or out of it is illegal.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TypeAlias

from schemas import common_pb2

State: TypeAlias = common_pb2.TaskState.ValueType
_TS = common_pb2.TaskState

NEW = _TS.TASK_STATE_UNSPECIFIED  # "no record yet"
STAGING = _TS.TASK_STAGING
STARTING = _TS.TASK_STARTING
RUNNING = _TS.TASK_RUNNING
KILLING = _TS.TASK_KILLING
FINISHED = _TS.TASK_FINISHED
FAILED = _TS.TASK_FAILED
KILLED = _TS.TASK_KILLED
ERROR = _TS.TASK_ERROR
LOST = _TS.TASK_LOST
DROPPED = _TS.TASK_DROPPED
UNREACHABLE = _TS.TASK_UNREACHABLE
GONE = _TS.TASK_GONE
GONE_BY_OPERATOR = _TS.TASK_GONE_BY_OPERATOR
UNKNOWN = _TS.TASK_UNKNOWN

TERMINAL: frozenset[State] = frozenset(
    {FINISHED, FAILED, KILLED, ERROR, LOST, DROPPED, GONE, GONE_BY_OPERATOR}
)
ACTIVE: frozenset[State] = frozenset({STAGING, STARTING, RUNNING, KILLING, UNREACHABLE})
# States a task record may hold (UNKNOWN and UNSPECIFIED are not among them).
STORABLE: frozenset[State] = TERMINAL | ACTIVE
# States the master declares on its own, from any live state.
MASTER_ENDS: frozenset[State] = frozenset({LOST, DROPPED, GONE, GONE_BY_OPERATOR})
# What a framework without CAPABILITY_PARTITION_AWARE is told instead of these states.
PARTITION_AWARE_ONLY: frozenset[State] = frozenset(
    {UNREACHABLE, DROPPED, GONE, GONE_BY_OPERATOR, UNKNOWN}
)

_ENDS_AFTER_START = TERMINAL - {ERROR}

TRANSITIONS: Mapping[State, frozenset[State]] = {
    NEW: frozenset({STAGING, ERROR, DROPPED, LOST, KILLED}),
    STAGING: frozenset({STAGING, STARTING, RUNNING, KILLING, UNREACHABLE}) | TERMINAL,
    STARTING: frozenset({STARTING, RUNNING, KILLING, UNREACHABLE}) | _ENDS_AFTER_START,
    RUNNING: frozenset({RUNNING, KILLING, UNREACHABLE}) | _ENDS_AFTER_START,
    KILLING: frozenset({KILLING, UNREACHABLE}) | _ENDS_AFTER_START,
    UNREACHABLE: frozenset({UNREACHABLE, STAGING, STARTING, RUNNING, KILLING}) | TERMINAL,
    **{t: frozenset() for t in TERMINAL},
}


class IllegalTransition(ValueError):
    """A task may not move from `current` to `new`."""

    def __init__(self, current: State | None, new: State, why: str) -> None:
        self.current = NEW if current is None else current
        self.new = new
        super().__init__(f"task {name(self.current)} -> {name(new)} is illegal: {why}")


def name(state: State | None) -> str:
    """TASK_RUNNING, or the number for a value this schema does not know."""
    if state is None or state == NEW:
        return "(new)"
    try:
        return _TS.Name(state)
    except ValueError:
        return f"TaskState({int(state)})"


def is_terminal(state: State) -> bool:
    return state in TERMINAL


def can_transition(current: State | None, new: State) -> bool:
    return new in TRANSITIONS.get(NEW if current is None else current, frozenset())


def transition(current: State | None, new: State) -> State:
    """Return `new` if a task in `current` (None: no record yet) may move to it; raise
    IllegalTransition with the reason otherwise."""
    cur = NEW if current is None else current
    if can_transition(cur, new):
        return new
    if new == UNKNOWN or cur == UNKNOWN:
        why = "TASK_UNKNOWN is a reconciliation answer, not a state a task record holds"
    elif cur not in TRANSITIONS:
        why = f"{name(cur)} is not a task state"
    elif new not in STORABLE:
        why = f"{name(new)} is not a task state"
    elif cur in TERMINAL:
        why = f"{name(cur)} is terminal"
    else:
        allowed = ", ".join(sorted(name(s) for s in TRANSITIONS[cur]))
        why = f"from {name(cur)} a task may go only to {allowed}"
    raise IllegalTransition(current, new, why)


def check_storable(state: State) -> State:
    """For a record rebuilt from a report (an agent re-registering): any real state, as is."""
    if state not in STORABLE:
        raise IllegalTransition(NEW, state, f"{name(state)} cannot be stored in a task record")
    return state


def as_seen_by(state: State, partition_aware: bool) -> State:
    """The state a framework is told: non-partition-aware frameworks get TASK_LOST for
    UNREACHABLE, DROPPED, GONE, GONE_BY_OPERATOR and UNKNOWN (Mesos's translation)."""
    if not partition_aware and state in PARTITION_AWARE_ONLY:
        return LOST
    return state


# -- helpers for readers of state documents and of status updates ---------------------------
def from_name(text: str) -> State | None:
    """The state a document names ("TASK_RUNNING", as the master's /state JSON writes it, or
    "RUNNING"); None for a name this schema does not know."""
    try:
        return _TS.Value(text if text.startswith("TASK_") else f"TASK_{text}")
    except ValueError:
        return None


def is_terminal_name(text: str) -> bool:
    """`is_terminal` for a state given by name (a JSON document's)."""
    state = from_name(text)
    return state is not None and state in TERMINAL


def is_active_name(text: str) -> bool:
    """A state given by name is one of ACTIVE (the task may still run)."""
    state = from_name(text)
    return state is not None and state in ACTIVE


def ends_updates(state: State) -> bool:
    """No further update comes for a task after this one: a terminal state, or TASK_UNKNOWN
    (a reconciliation answer: the master does not know the task)."""
    return state in TERMINAL or state == UNKNOWN
