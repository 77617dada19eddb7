"""Log fields stay one printable logfmt line: a socket identity zmq made up (5 bytes, the
first 0) is shown as hex, a text identity as text, and a control character is escaped. The
master's log had raw identity bytes in its `peer gone` lines (grep called it binary)."""

from __future__ import annotations

import logging

import pytest

from services.bus.log import get_logger


def _line(caplog: pytest.LogCaptureFixture, **fields: object) -> str:
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="test.fields"):
        get_logger("test.fields").info("peer gone", **fields)
    [record] = caplog.records
    return record.getMessage()


def test_a_made_up_identity_is_hex_and_a_named_one_text(caplog: pytest.LogCaptureFixture,
                                                         ) -> None:
    line = _line(caplog, peer=b"\x00k\x8bEk", named=b"agent-1/ab12cd", empty=b"")
    assert line == 'peer gone peer=0x006b8b456b named=agent-1/ab12cd empty=""'
    assert line.isprintable()


def test_control_characters_are_escaped(caplog: pytest.LogCaptureFixture) -> None:
    line = _line(caplog, why="bell\x07 and\ttab")
    assert line.isprintable() and "\\x07" in line and "\\t" in line
