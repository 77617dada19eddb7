"""Profiling for `python -m bench scale --profile`: a Python process started with this
directory on PYTHONPATH and OFFERBUS_PROFILE_DIR set profiles its main thread (the service's
reactor) with cProfile and writes `<dir>/<name>-<pid>.prof` when it exits cleanly (SIGTERM;
a SIGKILLed process writes nothing). Times are the thread's CPU time (time.thread_time), not
the wall clock: on a busy box a process waiting for a core is not charged to the function it
was in. Without OFFERBUS_PROFILE_DIR it does nothing."""

from __future__ import annotations

import os

_DIR = os.environ.get("OFFERBUS_PROFILE_DIR")

if _DIR:
    import atexit
    import cProfile
    import sys
    import time

    _profile = cProfile.Profile(time.thread_time)

    def _name() -> str:
        """`master-2` for `-m services.master ... --id master-2`; else the module's name."""
        argv = sys.argv
        module = os.path.basename(os.path.dirname(argv[0])) if argv else "python"
        ids = [argv[i + 1] for i in range(len(argv) - 1) if argv[i] == "--id"]
        kind = argv[1] if module == "emulator" and len(argv) > 1 else ""
        return ids[-1] if ids else "-".join(filter(None, [module, kind]))

    def _dump() -> None:
        _profile.disable()
        try:
            os.makedirs(_DIR, exist_ok=True)  # type: ignore[arg-type]
            _profile.dump_stats(os.path.join(_DIR, f"{_name()}-{os.getpid()}.prof"))  # type: ignore[arg-type]
        except OSError:
            pass

    atexit.register(_dump)
    _profile.enable()

# With OFFERBUS_GC_STATS_DIR: the time the cyclic garbage collector took in this process
# (every thread), per generation, written as JSON at a clean exit (`bench scale --gc-stats`).
_GC_DIR = os.environ.get("OFFERBUS_GC_STATS_DIR")

if _GC_DIR:
    import atexit as _atexit
    import gc as _gc
    import json as _json
    import sys as _sys
    import time as _time

    _gc_took = [0.0, 0.0, 0.0]
    _gc_runs = [0, 0, 0]
    _gc_started = [0.0]

    def _gc_timer(phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            _gc_started[0] = _time.thread_time()
        else:
            gen = info.get("generation", 2)
            _gc_took[gen] += _time.thread_time() - _gc_started[0]
            _gc_runs[gen] += 1

    def _gc_dump() -> None:
        argv = _sys.argv
        ids = [argv[i + 1] for i in range(len(argv) - 1) if argv[i] == "--id"]
        name = ids[-1] if ids else os.path.basename(os.path.dirname(argv[0] if argv else ""))
        try:
            os.makedirs(_GC_DIR, exist_ok=True)  # type: ignore[arg-type]
            with open(os.path.join(_GC_DIR, f"{name}-{os.getpid()}.json"), "w") as f:  # type: ignore[arg-type]
                _json.dump({"seconds": _gc_took, "runs": _gc_runs,
                            "cpu_s": _time.process_time()}, f)
        except OSError:
            pass

    _gc.callbacks.append(_gc_timer)
    _atexit.register(_gc_dump)
