"""Structured log lines (logfmt: `event key=value ...`) for every service and tool."""

from __future__ import annotations

import logging
import os
import sys
from typing import Any


def _fmt(value: Any) -> str:
    if isinstance(value, bytes):  # a socket identity: as text when it is, else its hex
        text = value.decode("ascii", errors="replace")
        text = text if text.isprintable() else "0x" + value.hex()
    else:
        text = str(value)
    if not text.isprintable():  # a control byte would break the line (and grep)
        text = text.encode("unicode_escape").decode("ascii")
    if not text or any(c in text for c in ' ="\n'):
        return '"' + text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n") + '"'
    return text


class KV:
    """A logger that writes `event k=v ...`; fields are formatted only when enabled."""

    def __init__(self, name: str) -> None:
        self._log = logging.getLogger(name)

    def _emit(self, level: int, event: str, fields: dict[str, Any]) -> None:
        if self._log.isEnabledFor(level):
            exc_info = bool(fields.pop("exc_info", False))  # True: append the traceback
            tail = " ".join(f"{k}={_fmt(v)}" for k, v in fields.items())
            self._log.log(level, f"{event} {tail}" if tail else event, exc_info=exc_info)

    def debug(self, event: str, **fields: Any) -> None:
        self._emit(logging.DEBUG, event, fields)

    def info(self, event: str, **fields: Any) -> None:
        self._emit(logging.INFO, event, fields)

    def warning(self, event: str, **fields: Any) -> None:
        self._emit(logging.WARNING, event, fields)

    def error(self, event: str, **fields: Any) -> None:
        self._emit(logging.ERROR, event, fields)


def get_logger(name: str) -> KV:
    return KV(name)


def configure(service: str, level: str | None = None) -> None:
    """Log to stderr as `ts level service logger: event k=v`; level from OFFERBUS_LOG_LEVEL."""
    level = level or os.environ.get("OFFERBUS_LOG_LEVEL", "INFO")
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(
        logging.Formatter(f"%(asctime)s %(levelname)s {service} %(name)s: %(message)s")
    )
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
