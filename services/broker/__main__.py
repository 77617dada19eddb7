"""`python -m services.broker`: run an offer-broker (leader or hot standby)."""

from __future__ import annotations

import socket
import sys
from typing import Any

from services.broker.core import DEFAULT_LAUNCH_TIMEOUT_S, DEFAULT_OFFER_TIMEOUT_S
from services.broker.shell import BrokerConfig, BrokerShell
from services.shell.config import Option
from services.shell.process import main as run_service

OPTIONS = (
    Option("id", default=f"broker-{socket.gethostname()}", help="this broker's id"),
    Option("port", int, 0, "ROUTER port the allocator connects to", minimum=0, maximum=65535),
    Option("offer_timeout", float, DEFAULT_OFFER_TIMEOUT_S,
           "seconds before an unanswered offer is rescinded (0 = never)", minimum=0),
    Option("launch_timeout", float, DEFAULT_LAUNCH_TIMEOUT_S,
           "seconds a launch may go unanswered (and its tasks unseen on the state stream) "
           "before it counts as refused", minimum=0),
)


def build(v: dict[str, Any]) -> BrokerShell:
    return BrokerShell(BrokerConfig(
        broker_id=v["id"], election_url=v["cluster"], host=v["host"], port=v["port"],
        http_port=v["http_port"], offer_timeout=v["offer_timeout"],
        launch_timeout=v["launch_timeout"], heartbeat_interval=v["heartbeat"],
        max_missed=v["max_missed"]))


def main(argv: list[str] | None = None) -> int:
    return run_service("broker", OPTIONS, build, argv, __doc__)


if __name__ == "__main__":
    sys.exit(main())
