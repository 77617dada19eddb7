"""How the CLI reaches a cluster: the cluster URL (flag, env, or the run dir `up` wrote),
the leading master through the election, every member of a role's election (leader and
standbys), its HTTP /state, and operator calls over ZeroMQ."""

from __future__ import annotations

import json
import os
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

from schemas import operator_pb2
from services.bus.election import LeaderInfo, detector_from_url, parse_url
from services.bus.election.zookeeper import election_path, member_epoch, sorted_members

RUN_DIR_DEFAULT = ".run/cluster"  # without --run-dir, OFFERBUS_RUN_DIR or a profile
DEFAULT_RUN_DIR = Path(os.environ.get("OFFERBUS_RUN_DIR", RUN_DIR_DEFAULT))


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


class ElectionView:
    """Read-only: the members of each role's election, in order (the first leads, the others
    stand by), each as a LeaderInfo with the epoch it would lead at. Only a ZooKeeper
    election lists its members; for a standalone one (file://) `members` is None. A context
    manager: one ZooKeeper session for every read."""

    def __init__(self, url: str, timeout: float = 5.0) -> None:
        self.kind, self.where, _ = parse_url(url)
        self.timeout = timeout
        self._client: Any = None

    def __enter__(self) -> ElectionView:
        if self.kind == "zk":
            from kazoo.client import KazooClient
            from kazoo.handlers.threading import KazooTimeoutError

            self._client = KazooClient(hosts=self.where, timeout=self.timeout)
            try:
                self._client.start(timeout=self.timeout)
            except KazooTimeoutError as exc:
                self._client.close()
                raise CliError(f"ZooKeeper {self.where} did not answer within "
                               f"{self.timeout:g}s") from exc
        return self

    def __exit__(self, *exc: object) -> None:
        if self._client is not None:
            self._client.stop()
            self._client.close()
            self._client = None

    def members(self, role: str) -> list[LeaderInfo] | None:
        if self._client is None:
            return None
        from kazoo.exceptions import KazooException, NoNodeError

        path = election_path("/offerbus", role)
        out = []
        try:
            names = sorted_members(self._client.get_children(path))
        except NoNodeError:
            return []
        except KazooException as exc:
            raise CliError(f"reading the {role} election: {exc!r}") from exc
        for name in names:
            try:
                data, _ = self._client.get(f"{path}/{name}")
                doc = json.loads(data)
                endpoints = {str(k): str(v) for k, v in dict(doc.get("endpoints", {})).items()}
                member_id = str(doc["member_id"])
            except NoNodeError:
                continue  # it left between the two reads
            except (ValueError, KeyError, TypeError, AttributeError):
                endpoints, member_id = {}, name
            out.append(LeaderInfo(role, member_id, member_epoch(name), endpoints))
        return out


def http_headers(environ: dict[str, str] | None = None) -> dict[str, str]:
    """The Authorization header of the cluster's HTTP token (OFFERBUS_HTTP_TOKEN, or the file
    OFFERBUS_HTTP_TOKEN_FILE names), or none."""
    env = os.environ if environ is None else environ
    token = env.get("OFFERBUS_HTTP_TOKEN", "")
    if env.get("OFFERBUS_HTTP_TOKEN_FILE"):
        try:
            token = Path(env["OFFERBUS_HTTP_TOKEN_FILE"]).read_text().strip()
        except OSError as exc:
            raise CliError(f"OFFERBUS_HTTP_TOKEN_FILE: cannot read "
                           f"{env['OFFERBUS_HTTP_TOKEN_FILE']} ({exc.strerror})") from exc
    return {"Authorization": f"Bearer {token}"} if token else {}


def _text(body: bytes) -> str:
    return body[:300].decode(errors="replace").strip()


def http_get(url: str, timeout: float = 5.0) -> Any:
    req = urllib.request.Request(url, headers=http_headers())
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            return json.loads(resp.read())
    except urllib.error.HTTPError as exc:
        body = exc.read()
        try:
            return json.loads(body)
        except ValueError:
            raise CliError(f"{url}: HTTP {exc.code}: {_text(body)}") from exc
    except (urllib.error.URLError, OSError) as exc:
        raise CliError(f"{url}: {exc}") from exc


def http_get_if_changed(url: str, timeout: float = 5.0, etag: str = "",
                        wait: float = 0.0) -> tuple[Any, str] | None:
    """(the JSON document at `url`, its ETag), or None when it still has the ETag `etag`
    (the server answered 304 Not Modified: nothing was built or sent). `wait`: ask the
    server to answer only once the document changed, or after `wait` seconds (a server
    that does not know `Prefer: wait` answers at once)."""
    headers = http_headers() | ({"If-None-Match": etag} if etag else {})
    if etag and wait > 0:
        headers["Prefer"] = f"wait={wait:g}"
    req = urllib.request.Request(url, headers=headers)
    try:
        with urllib.request.urlopen(req, timeout=timeout + wait) as resp:
            return json.loads(resp.read()), resp.headers.get("ETag", "")
    except urllib.error.HTTPError as exc:
        if exc.code == 304 and etag:
            return None
        body = exc.read()
        try:
            return json.loads(body), ""
        except ValueError:
            raise CliError(f"{url}: HTTP {exc.code}: {_text(body)}") from exc
    except (urllib.error.URLError, OSError) as exc:
        raise CliError(f"{url}: {exc}") from exc


def state_path(query: str = "") -> str:
    """The master's /state, filtered by `query` (framework=ID, framework_name=NAME,
    tasks=0, agents=0: see services/master/view.py)."""
    return "/state" + (f"?{query}" if query else "")


def master_state(url: str, timeout: float = 5.0,
                 query: str = "") -> tuple[LeaderInfo, dict[str, Any]]:
    leader = find_leader(url, timeout)
    return leader, http_get(leader.endpoints["http"] + state_path(query), timeout)


def operator_call(leader: LeaderInfo, call: operator_pb2.OperatorCall,
                  timeout: float = 10.0) -> operator_pb2.OperatorEvent:
    """One request and its answer on the master's front ROUTER, with this operator's CURVE
    key when OFFERBUS_CURVE_SECRET_KEY_FILE and OFFERBUS_CURVE_SERVER_KEY_FILE are set."""
    # (Imported here: the bus's modules cost ~20 ms to load, and most commands only read.)
    import zmq

    from services.bus import codec
    from services.bus.curve import client_from_env
    from services.bus.peer import Sender

    try:
        curve = client_from_env()
    except ValueError as exc:
        raise CliError(str(exc)) from exc
    ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
    sock = ctx.socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    if curve is not None:
        curve.apply(sock)
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
        hint = ("; is this key (OFFERBUS_CURVE_SECRET_KEY_FILE) among the master's allowed "
                "ones, and the server key right?" if curve is not None else
                "; if the cluster runs with CURVE, set OFFERBUS_CURVE_SECRET_KEY_FILE and "
                "OFFERBUS_CURVE_SERVER_KEY_FILE")
        raise CliError(f"no answer from the master at {leader.endpoints['front']} "
                       f"within {timeout:g}s{hint}")
    finally:
        sock.close()
        ctx.term()
