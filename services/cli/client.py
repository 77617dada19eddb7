"""How the CLI reaches a cluster: the cluster URL (flag, env, or the run dir `up` wrote),
the leading master through the election, its HTTP /state, and operator calls over ZeroMQ."""

from __future__ import annotations

import json
import os
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import zmq

from schemas import operator_pb2
from services.bus import codec
from services.bus.election import LeaderInfo, detector_from_url
from services.bus.peer import Sender

DEFAULT_RUN_DIR = Path(os.environ.get("OFFERBUS_RUN_DIR", ".run/cluster"))


class CliError(Exception):
    """A problem the operator can act on; printed without a traceback."""


def cluster_url(flag: str | None, run_dir: Path) -> str:
    if flag:
        return flag
    if os.environ.get("OFFERBUS_CLUSTER"):
        return os.environ["OFFERBUS_CLUSTER"]
    saved = run_dir / "cluster.url"
    if saved.exists():
        return saved.read_text().strip()
    raise CliError(f"no cluster given: pass --cluster zk://... or file://..., set "
                   f"OFFERBUS_CLUSTER, or start one with `offerbus up` ({saved} not found)")


def find_leader(url: str, timeout: float = 5.0, role: str = "master") -> LeaderInfo:
    detector = detector_from_url(url, role)
    try:
        detector.start()
        leader = detector.wait_for_leader(timeout)
    finally:
        detector.close()
    if leader is None:
        raise CliError(f"no leading {role} reachable through {url} within {timeout:g}s "
                       f"(is the cluster up? `offerbus status`)")
    return leader


def http_get(url: str, timeout: float = 5.0) -> Any:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as resp:
            return json.loads(resp.read())
    except urllib.error.HTTPError as exc:
        body = exc.read()
        try:
            return json.loads(body)
        except ValueError:
            raise CliError(f"{url}: HTTP {exc.code}: {body[:200]!r}") from exc
    except (urllib.error.URLError, OSError) as exc:
        raise CliError(f"{url}: {exc}") from exc


def master_state(url: str, timeout: float = 5.0) -> tuple[LeaderInfo, dict[str, Any]]:
    leader = find_leader(url, timeout)
    return leader, http_get(leader.endpoints["http"] + "/state", timeout)


def operator_call(leader: LeaderInfo, call: operator_pb2.OperatorCall,
                  timeout: float = 10.0) -> operator_pb2.OperatorEvent:
    """One request and its answer on the master's front ROUTER."""
    ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
    sock = ctx.socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    try:
        sock.connect(leader.endpoints["front"])
        env = codec.Envelope()
        env.operator_call.CopyFrom(call)
        Sender(f"cli-{os.getpid()}", codec.Role.Value("ROLE_CLI")).stamp(env)
        sock.send(codec.encode(env))
        deadline = time.monotonic() + timeout
        while (left := deadline - time.monotonic()) > 0:
            if not sock.poll(int(left * 1000)):
                break
            reply = codec.decode(sock.recv())
            kind = codec.payload_kind(reply)
            if kind == "operator_event":
                return reply.operator_event
            if kind == "error":
                raise CliError(f"the master refused: {reply.error.message}")
        raise CliError(f"no answer from the master at {leader.endpoints['front']} "
                       f"within {timeout:g}s")
    finally:
        sock.close()
        ctx.term()
