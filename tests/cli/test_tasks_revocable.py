"""`offerbus tasks` marks revocable tasks (issue 9 item 2: launched beyond their framework's
guaranteed share, revoked first) in its REV column."""

from __future__ import annotations

from services.cli import views
from tests.cli.test_views import master_state, render


def test_a_revocable_task_is_marked() -> None:
    state = master_state()
    state["tasks"][1]["task_info"]["revocable"] = True
    rows = views.task_rows(state)
    assert [r["revocable"] for r in rows] == [False, True, False]
    out = render(views.tasks_table(state), width=400).splitlines()
    header = next(line for line in out if "HEALTH" in line.upper())
    assert "REV" in header.upper()
    col = header.upper().index("REV")
    marked = [line for line in out if "web-" in line and line[col:col + 3] == "yes"]
    assert len(marked) == 1 and "web-1-1" in marked[0]
