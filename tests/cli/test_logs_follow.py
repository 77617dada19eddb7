"""`logs -f`: the offset reads of the runtimes and the client's follow loop (pure)."""

from __future__ import annotations

import io
from pathlib import Path

import pytest

from services.cli.follow import (
    GIVE_UP_AFTER_END,
    CannotFollow,
    Follower,
    Reply,
    check_offsets,
    follow,
)
from services.executor.runtime import from_offset, read_file_from


def chunks(data: bytes, size: int) -> list[bytes]:
    return [data[i:i + size] for i in range(0, len(data), size)]


def test_file_reads_from_the_offset_at_most_max_bytes(tmp_path: Path) -> None:
    path = tmp_path / "stdout"
    path.write_bytes(b"line0\nline1\nline2\n")
    first = read_file_from(path, 0, 8)
    assert (first.data, first.truncated, first.next_offset) == (b"line0\nli", True, 8)
    rest = read_file_from(path, first.next_offset, 100)
    assert (rest.data, rest.truncated, rest.next_offset) == (b"ne1\nline2\n", False, 18)
    assert first.data + rest.data == path.read_bytes()


def test_file_past_its_end_or_missing_keeps_the_offset(tmp_path: Path) -> None:
    path = tmp_path / "stdout"
    path.write_bytes(b"abc")
    assert read_file_from(path, 10, 100).next_offset == 10  # never moves back (no repeats)
    gone = read_file_from(tmp_path / "nothing", 5, 100)
    assert (gone.data, gone.next_offset) == (b"", 5)


def test_stream_offset_matches_the_file_offset_for_any_chunking(tmp_path: Path) -> None:
    data = b"".join(b"line %d\n" % i for i in range(50))
    path = tmp_path / "stdout"
    path.write_bytes(data)
    for size in (1, 3, 7, 64, 1000):
        for since in (0, 5, 100, len(data), len(data) + 3):
            for cap in (0, 1, 10, 10_000):
                got = from_offset(chunks(data, size), since, cap)
                want = read_file_from(path, since, cap)
                assert got == want, (size, since, cap)


def test_follower_prints_each_byte_once_even_from_overlapping_replies() -> None:
    f = Follower()
    assert f.on_reply(Reply(b"abc", 3, False, False)).out == b"abc"
    assert f.on_reply(Reply(b"bcde", 5, False, False)).out == b"de"  # overlap dropped
    assert f.on_reply(Reply(b"abc", 3, False, False)).out == b""  # an older answer
    assert f.offset == 5


def test_follower_stops_only_after_an_empty_read_that_began_after_the_end() -> None:
    f = Follower()
    assert not f.on_reply(Reply(b"", 0, False, False)).done  # running, nothing yet
    step = f.on_reply(Reply(b"last\n", 5, False, True))  # ended, but bytes came: read again
    assert (step.out, step.done) == (b"last\n", False)
    capped = f.on_reply(Reply(b"", 5, True, True))
    assert not capped.done and capped.again_now
    assert f.on_reply(Reply(b"", 5, False, True)).done


class FakeTask:
    """A task's stdout growing by one line per poll, ending after `lines`; some polls fail."""

    def __init__(self, lines: int, cap: int, fail_at: set[int]) -> None:
        self.log, self.lines, self.cap, self.fail_at, self.polls = b"", lines, cap, fail_at, 0

    def poll(self, offset: int) -> Reply:
        self.polls += 1
        if self.polls in self.fail_at:
            raise ConnectionError("agent a1 is not reachable")
        ended = self.log.count(b"\n") >= self.lines
        if not ended:
            self.log += b"line %03d\n" % self.log.count(b"\n")
        data = self.log[offset:offset + self.cap]
        return Reply(data, offset + len(data), offset + len(data) < len(self.log), ended)


def test_follow_prints_every_line_once_in_order_and_reports_outages() -> None:
    task = FakeTask(lines=20, cap=13, fail_at={4, 5, 9})
    out, err, waits = io.BytesIO(), io.StringIO(), []
    clock = [0.0]

    def wait(s: float) -> None:
        waits.append(s)
        clock[0] += s
    rc = follow(task.poll, out, err, interval=0.5, clock=lambda: clock[0], wait=wait)
    assert rc == 0
    assert out.getvalue() == b"".join(b"line %03d\n" % i for i in range(20))
    assert err.getvalue().count("not reachable") == 2  # said once per outage
    assert "reachable again" in err.getvalue()
    assert waits and all(0 < w <= 0.5 for w in waits)


def test_follow_gives_up_when_an_ended_task_stays_unreadable() -> None:
    calls = []

    def poll(offset: int) -> Reply:
        calls.append(offset)
        if len(calls) == 1:
            return Reply(b"x", 1, False, True)
        raise ConnectionError("sandbox gone")
    err = io.StringIO()
    assert follow(poll, io.BytesIO(), err, clock=lambda: 0.0, wait=lambda s: None) == 1
    assert len(calls) == 1 + GIVE_UP_AFTER_END
    assert "giving up" in err.getvalue()


def test_an_agent_that_ignores_offsets_is_said_once_not_retried_forever() -> None:
    """Seen on a cluster whose agents predate `logs -f`: they answer the whole log with no
    next_offset, and the CLI printed nothing, polling forever. It now says why and stops."""
    polls: list[int] = []

    def poll(offset: int) -> Reply:
        polls.append(offset)
        data, next_offset = b"hello\n" * 3, 0  # what an old agent answers
        check_offsets(offset, data, next_offset, False)
        return Reply(data, next_offset, False, False)

    with pytest.raises(CannotFollow, match="predates"):
        follow(poll, io.BytesIO(), io.StringIO(), wait=lambda s: None)
    assert polls == [0]
    check_offsets(0, b"", 0, False)  # an empty log is fine
    check_offsets(6, b"abc", 9, False)  # and so is an agent that follows
