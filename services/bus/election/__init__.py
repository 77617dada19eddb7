"""Leader election and discovery for the central roles, behind one port (port.py), with a
ZooKeeper implementation and a one-machine standalone one, chosen by URL:
"zk://host:port,host:port/chroot[?session_timeout=1.0]" or "file:///path/to/run_dir"."""

from __future__ import annotations

from pathlib import Path
from urllib.parse import parse_qs, urlsplit

from services.bus.election.port import (
    Contender,
    Detector,
    Elected,
    ElectionEvent,
    LeaderChanged,
    LeaderInfo,
    Lost,
    Suspended,
)
from services.bus.election.standalone import StandaloneContender, StandaloneDetector
from services.bus.election.zookeeper import ZooKeeperContender, ZooKeeperDetector

__all__ = [
    "Contender",
    "Detector",
    "Elected",
    "ElectionEvent",
    "LeaderChanged",
    "LeaderInfo",
    "Lost",
    "StandaloneContender",
    "StandaloneDetector",
    "Suspended",
    "ZooKeeperContender",
    "ZooKeeperDetector",
    "contender_from_url",
    "detector_from_url",
    "parse_url",
]


def parse_url(url: str) -> tuple[str, str, float | None]:
    """("zk", "h:p,h:p/chroot", session_timeout) or ("file", "/run/dir", None)."""
    parts = urlsplit(url)
    if parts.scheme == "zk":
        if not parts.netloc:
            raise ValueError(f"zk URL without hosts: {url!r}")
        query = parse_qs(parts.query)
        timeout = float(query["session_timeout"][0]) if "session_timeout" in query else None
        chroot = parts.path.rstrip("/")
        return "zk", parts.netloc + chroot, timeout
    if parts.scheme == "file":
        if not parts.path:
            raise ValueError(f"file URL without a path: {url!r}")
        return "file", parts.path, None
    raise ValueError(f"unsupported election URL {url!r}: expected zk://... or file://...")


def contender_from_url(
    url: str,
    role: str,
    member_id: str,
    endpoints: dict[str, str],
    *,
    session_timeout: float | None = None,
) -> ZooKeeperContender | StandaloneContender:
    kind, where, url_timeout = parse_url(url)
    if kind == "file":
        return StandaloneContender(Path(where), role, member_id, endpoints)
    timeout = session_timeout or url_timeout or 1.0
    return ZooKeeperContender(where, role, member_id, endpoints, session_timeout=timeout)


def detector_from_url(
    url: str, role: str, *, session_timeout: float | None = None
) -> ZooKeeperDetector | StandaloneDetector:
    kind, where, url_timeout = parse_url(url)
    if kind == "file":
        return StandaloneDetector(Path(where), role)
    return ZooKeeperDetector(where, role, session_timeout=session_timeout or url_timeout or 1.0)
