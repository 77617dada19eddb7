"""A stuck `offerbus job run` names what the job runner says of the job (its phase, why its
framework last ended), or that no runner runs it."""

from __future__ import annotations

from typing import Any

import pytest

from services.cli import job


def test_a_stuck_job_run_says_what_the_runner_says(monkeypatch: pytest.MonkeyPatch) -> None:
    doc: dict[str, Any] = {"jobs": {"web": {
        "phase": "ended", "error": "",
        "last_end": "principal 'jobs' may not use role 'eng' (the master's ACL)"}}}
    monkeypatch.setattr(job, "runner_state", lambda url, timeout: doc)
    said = job.runner_says("zk://x", "web", 1.0)
    assert said == (" The job runner says: phase: ended; last end: principal 'jobs' may not "
                    "use role 'eng' (the master's ACL).")
    assert "does not run it" in job.runner_says("zk://x", "api", 1.0)
    monkeypatch.setattr(job, "runner_state", lambda url, timeout: None)
    assert "is one up?" in job.runner_says("zk://x", "web", 1.0)
