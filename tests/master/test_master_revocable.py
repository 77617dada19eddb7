"""Revocable tasks in the master (issue 9 item 2): a task launched on a revocable offer comes
marked by the broker (TaskInfo.revocable); the master keeps the mark on its record (so /state
and `offerbus tasks` show it), and a revocation takes revocable tasks first, then the
youngest."""

from __future__ import annotations

from services.master.core import MasterCore
from tests.master.helpers import (
    T0,
    TS,
    cluster,
    launch_msg,
    task_info,
    update,
)
from tests.master.test_master_revocation import revoke, revokes


def launched(revocable: dict[str, bool]) -> tuple[MasterCore, str, str]:
    """f1 runs these tasks on a1, launched a second apart, in this order."""
    core, aid, fid = cluster()
    for n, (tid, rev) in enumerate(revocable.items()):
        info = task_info(tid, "cpus:1;mem:256")
        info.revocable = rev
        core.internal_message(b"broker", launch_msg(fid, aid, info, rid=f"r{n}"), T0 + n,
                              traceparent="00-tp")
        update(core, b"a1", aid, fid, tid, TS.TASK_RUNNING, uuid=f"{tid}-run".encode(),
               now=T0 + n)
    return core, aid, fid


def test_the_mark_is_kept_on_the_task_record() -> None:
    core, _, _ = launched({"t1": True, "t2": False})
    records = {e.value.task.task_info.task_id: e.value.task.task_info.revocable
               for e in core.snapshot_entries() if e.key.startswith("tasks/")}
    assert records == {"t1": True, "t2": False}


def test_a_revocation_takes_revocable_tasks_first_then_the_youngest() -> None:
    core, aid, fid = launched({"t1": True, "t2": False, "t3": False})
    [ev] = revokes(revoke(core, fid, aid, "cpus:1.5"))
    assert list(ev.task_ids) == ["t1", "t3"]  # before: t3, t2 (the youngest)
    core.validate()
