"""A contender as a process, for integration tests and chaos: one JSON line per event on
stdout, flushed. `python -m services.bus.election --url URL --role ROLE --member-id ID`."""

from __future__ import annotations

import argparse
import json
import os
import select
import signal
import sys
import time
from types import FrameType
from typing import Any

from services.bus.election import contender_from_url
from services.bus.election.port import Elected, Lost, Suspended
from services.bus.log import configure


def _say(event: str, **fields: Any) -> None:
    sys.stdout.write(json.dumps({"event": event, **fields, "t": time.time()}) + "\n")
    sys.stdout.flush()


def _endpoint(text: str) -> tuple[str, str]:
    name, sep, addr = text.partition("=")
    if not sep or not name:
        raise argparse.ArgumentTypeError(f"expected name=address, got {text!r}")
    return name, addr


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m services.bus.election")
    parser.add_argument("--url", required=True, help="zk://hosts/chroot or file:///run/dir")
    parser.add_argument("--role", required=True)
    parser.add_argument("--member-id", required=True)
    parser.add_argument("--endpoint", action="append", type=_endpoint, default=[])
    parser.add_argument("--session-timeout", type=float, default=None)
    args = parser.parse_args(argv)
    configure("election", os.environ.get("OFFERBUS_LOG_LEVEL", "WARNING"))

    stop_r, stop_w = os.pipe()
    os.set_blocking(stop_w, False)

    def on_signal(signum: int, frame: FrameType | None) -> None:
        os.write(stop_w, b"x")

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)

    contender = contender_from_url(
        args.url,
        args.role,
        args.member_id,
        dict(args.endpoint),
        session_timeout=args.session_timeout,
    )
    contender.start()
    _say("started", pid=os.getpid(), member_id=args.member_id, role=args.role)
    while True:
        readable, _, _ = select.select([contender.fileno(), stop_r], [], [])
        if stop_r in readable:
            break
        for event in contender.events():
            if isinstance(event, Elected):
                _say("elected", epoch=event.epoch)
            elif isinstance(event, Suspended):
                _say("suspended")
            elif isinstance(event, Lost):
                _say("lost")
    contender.close()
    _say("closed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
