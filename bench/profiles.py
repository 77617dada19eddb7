"""What bench.scale reads of its services' profiles: cProfile files (`--profile`), garbage
collection timings (`--gc-stats`), both switched on through bench/profiling's
sitecustomize, and py-spy's collapsed stacks of the standby master (`--spy`)."""

from __future__ import annotations

import contextlib
import json
import os
import pstats
import re
from pathlib import Path
from typing import Any

WAITING = ("poll", "acquire", "compile", "marshal", "exec", "_imp.", "create_dynamic")
IDLE = ("select", "wait", "sleep", "recv")  # other threads waiting (py-spy samples)


def folded_summary(path: Path, top: int = 12) -> dict[str, list[list[Any]]]:
    """py-spy's collapsed stacks (`--format raw`) of the reactor's thread, by function (line
    numbers dropped): the `top` by own samples and by inclusive samples (waiting in poll
    left out of both), and the other threads' busiest functions (they take the GIL)."""
    own: dict[str, int] = {}
    incl: dict[str, int] = {}
    others: dict[str, int] = {}
    for line in path.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        frames = [re.sub(r":\d+\)$", ")", f) for f in stack.split(";")]
        if not stack or any(w in frames[-1] for w in WAITING + IDLE):
            continue
        n = int(count)
        if not frames[0].startswith("_run_module_as_main"):
            where = next((f for f in frames[3:] if not f.startswith(("Thread.", "_"))),
                         frames[-1])
            others[where] = others.get(where, 0) + n
            continue
        own[frames[-1]] = own.get(frames[-1], 0) + n
        for f in set(frames):
            incl[f] = incl.get(f, 0) + n

    def rows(d: dict[str, int]) -> list[list[Any]]:
        return [[n, f] for f, n in sorted(d.items(), key=lambda kv: -kv[1])[:top]]
    return {"inclusive": rows(incl), "own": rows(own), "other threads": rows(others)}


def profiling_on(run_dir: Path, profile: bool = True, gc_stats: bool = False,
                 ) -> dict[str, str]:
    """Make the processes started from now on profile themselves and/or time their garbage
    collections (bench/profiling); returns the environment to restore."""
    saved = dict(os.environ)
    here = str(Path(__file__).parent / "profiling")
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [here,
                                                             os.environ.get("PYTHONPATH")]))
    if profile:
        os.environ["OFFERBUS_PROFILE_DIR"] = str(run_dir / "profiles")
    if gc_stats:
        os.environ["OFFERBUS_GC_STATS_DIR"] = str(run_dir / "gc")
    return saved


def gc_summary(folder: Path) -> dict[str, dict[str, Any]]:
    """Per process that exited cleanly: seconds its garbage collections took, by generation,
    against its whole CPU time."""
    out: dict[str, dict[str, Any]] = {}
    for path in sorted(folder.glob("*.json")):
        with contextlib.suppress(OSError, ValueError):
            out[path.stem.rsplit("-", 1)[0]] = json.loads(path.read_text())
    return out


def profile_summary(profiles: Path, top: int = 8) -> dict[str, list[list[Any]]]:
    """Per process: its `top` functions by own time (seconds, calls, where)."""
    out: dict[str, list[list[Any]]] = {}
    for path in sorted(profiles.glob("*.prof")):
        stats = pstats.Stats(str(path))
        rows = sorted(((k, v) for k, v in stats.stats.items()  # type: ignore[attr-defined]
                       if not any(w in k[2] for w in WAITING)),
                      key=lambda kv: -kv[1][2])[:top]
        out[path.stem.rsplit("-", 1)[0]] = [
            [round(tt, 2), nc, f"{Path(fn).name}:{line} {func}"]
            for (fn, line, func), (_cc, nc, tt, _ct, _callers) in rows]
    return out
