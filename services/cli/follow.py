"""`offerbus logs -f`: follow a task's output by repeated bounded GetLogs from a byte offset.

Design: each poll asks the agent (through the master) for the bytes of the stream from
`since_bytes` on, at most the agent's cap per reply; the reply's `next_offset` is where the next
poll starts. Byte offsets work for every source: the process runtime's sandbox file (one seek),
a finished task's sandbox copy (the same bytes), and a running Docker container (the agent
reads the engine's stream and drops the bytes before the offset as they come; memory stays
bounded). Because the client only ever prints bytes past the offset it has printed, nothing
is printed twice and, offsets being contiguous, nothing is skipped.

`Follower` is the pure part (offsets, de-duplication, when to stop); `follow` is the loop.
"""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import BinaryIO, TextIO

POLL_S = 0.5  # how often `logs -f` polls when nothing new came
GIVE_UP_AFTER_END = 10  # failed polls in a row, once the task has ended, before giving up


@dataclass(frozen=True)
class Reply:
    """What one poll learnt: the logs reply, and whether the task had ended before it."""

    data: bytes
    next_offset: int
    more: bool  # the reply was capped: more bytes are waiting (poll again at once)
    ended_before: bool  # the task was terminal when this poll started


@dataclass(frozen=True)
class Step:
    out: bytes  # print these
    done: bool  # the task ended and all its output was printed
    again_now: bool  # do not wait for the timer: more is waiting


class Follower:
    """The offset of a followed stream: which bytes of a reply are new, and when to stop."""

    def __init__(self, offset: int = 0) -> None:
        self.offset = offset

    def on_reply(self, r: Reply) -> Step:
        start = r.next_offset - len(r.data)  # where the reply's data begins in the stream
        if r.next_offset <= self.offset:
            new = b""  # nothing past what was printed (or an older answer)
        else:
            new = r.data[max(0, self.offset - start):]  # drop what was already printed
            self.offset = r.next_offset
        done = r.ended_before and not new and not r.more
        return Step(new, done, r.more and not done)


Poll = Callable[[int], Reply]  # since_bytes -> Reply; raises on a failed poll


class CannotFollow(Exception):
    """Not a passing failure: following cannot work (retrying would not help)."""


def check_offsets(offset: int, data: bytes, next_offset: int, truncated: bool) -> None:
    """An agent older than `logs -f` ignores since_bytes and answers the whole log without a
    next_offset: say so instead of printing nothing forever."""
    if data and not truncated and next_offset < offset + len(data):
        raise CannotFollow("the task's agent cannot follow logs (it predates `logs -f`; "
                           "upgrade it): use `offerbus logs` without -f")


def follow(poll: Poll, out: BinaryIO, err: TextIO, interval: float = POLL_S,
           clock: Callable[[], float] = time.monotonic,
           wait: Callable[[float], object] | None = None) -> int:
    """Poll until the task has ended and its output is printed (0). A failed poll (agent or
    master briefly unreachable) is said once on `err` and retried at the next tick; once the
    task has ended, GIVE_UP_AFTER_END failures in a row end the loop (1)."""
    wait = wait or threading.Event().wait  # a timer on a never-set event
    follower, failing, ended, failures = Follower(), False, False, 0
    next_at = clock()
    while True:
        try:
            reply = poll(follower.offset)
        except CannotFollow:
            raise
        except Exception as exc:
            failures += 1
            if not failing:
                err.write(f"logs -f: {exc}; retrying every {interval:g}s\n")
                err.flush()
                failing = True
            if ended and failures >= GIVE_UP_AFTER_END:
                err.write("logs -f: the task has ended and its logs cannot be read; giving up\n")
                return 1
        else:
            if failing:
                err.write("logs -f: reachable again\n")
                err.flush()
            failing, failures, ended = False, 0, reply.ended_before
            step = follower.on_reply(reply)
            if step.out:
                out.write(step.out)
                out.flush()
            if step.done:
                return 0
            if step.again_now:
                continue
        next_at += interval
        delay = next_at - clock()
        if delay > 0:
            wait(delay)
        else:
            next_at = clock()  # late (a slow poll): do not try to catch up


def stdout_binary() -> BinaryIO:
    return sys.stdout.buffer
