"""The digest of an agent's task report (AgentCall.Reregister.tasks_digest), computed alike
by the agents, the agent emulator and the master: the sum, modulo 2**64, of a 64-bit hash of
each task's (framework id, task id, state, executor id). A sum, so that a set of records can
keep it up to date change by change (followed.py) and its order does not matter. What it
covers is what a master compares before it takes a followed record back whole (agents.py)."""

from __future__ import annotations

from collections.abc import Iterable
from hashlib import blake2b

from schemas import agent_pb2

MASK = (1 << 64) - 1


def item(framework_id: str, task_id: str, state: int, executor_id: str) -> int:
    """One task's part of the digest."""
    raw = f"{framework_id}\0{task_id}\0{state}\0{executor_id}".encode()
    return int.from_bytes(blake2b(raw, digest_size=8).digest(), "little")


def combine(items: Iterable[int]) -> int:
    return sum(items) & MASK


def of_report(reported: Iterable[agent_pb2.AgentCall.Reregister.Task]) -> int:
    """The digest of a Reregister's tasks: each task's state and executor as reported (its
    latest status's executor id, else the task's)."""
    return combine(item(r.framework_id, r.task_info.task_id, r.latest_status.state,
                        r.latest_status.executor_id or r.executor_id) for r in reported)
