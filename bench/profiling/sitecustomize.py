"""Profiling for `python -m bench scale --profile`: a Python process started with this
directory on PYTHONPATH and OFFERBUS_PROFILE_DIR set profiles its main thread (the service's
reactor) with cProfile and writes `<dir>/<name>-<pid>.prof` when it exits cleanly (SIGTERM;
a SIGKILLed process writes nothing). Without OFFERBUS_PROFILE_DIR it does nothing."""

from __future__ import annotations

import os

_DIR = os.environ.get("OFFERBUS_PROFILE_DIR")

if _DIR:
    import atexit
    import cProfile
    import sys

    _profile = cProfile.Profile()

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
