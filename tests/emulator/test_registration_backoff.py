"""The agent emulator's (re-)registration resends (issue 8 d): an unanswered one is resent
with backoff, capped as the real agent caps its own (services/agent/core.py), so a reply
lost in a failover costs a virtual agent seconds, not half a minute, while it holds a slot
of the registration window."""

from __future__ import annotations

import itertools

from services.emulator.agents import REGISTER_TIMEOUT_MAX_S, REGISTER_TIMEOUT_S
from tests.emulator.test_agents_core import calls, core


def test_an_unanswered_registration_is_resent_with_capped_backoff() -> None:
    c = core(n=1)
    now = 100.0
    assert len(calls(c.master_detected(now))) == 1
    sent = [now]
    for _ in range(8):  # the master never answers
        at = c.next_deadline()
        assert at is not None
        resent = calls(c.tick(at))
        assert len(resent) == 1
        sent.append(at)
    gaps = [b - a for a, b in itertools.pairwise(sent)]
    assert gaps[0] == REGISTER_TIMEOUT_S
    assert gaps == sorted(gaps), gaps  # growing
    assert max(gaps) <= 5.0, gaps  # the real agent's cap
    assert gaps[-1] == REGISTER_TIMEOUT_MAX_S
    c.validate()
