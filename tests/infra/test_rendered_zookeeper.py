"""The rendered ZooKeeper files form an ensemble when started with the unit's own command: three
members on 127.0.0.1-3, each with the rendered zoo.cfg, log4j.properties and its myid, run by
the ExecStart of infra/systemd/offerbus-zookeeper.service (paths moved under tmp_path, and
each member's client port bound to its own address, as three members share this machine),
elect one leader and two followers."""

from __future__ import annotations

import re
import shlex
import socket
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from infra import inventory
from tests.e2e import stop_processes
from tests.waiting import wait_for

pytestmark = [pytest.mark.integration,
              pytest.mark.skipif(not Path("/usr/share/java/zookeeper.jar").exists(),
                                 reason="Debian's zookeeper package is not installed")]
ADDRESSES = ("127.0.0.1", "127.0.0.2", "127.0.0.3")


def _free(count: int) -> list[int]:
    ports: list[int] = []
    start = 41000 + uuid.uuid4().int % 8000
    for port in range(start, 49999):
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
        ports.append(port)
        if len(ports) == count:
            return ports
    raise AssertionError("no free ports")


def srvr(address: str, port: int) -> str:
    with socket.create_connection((address, port), timeout=2) as sock:
        sock.sendall(b"srvr")
        sock.shutdown(socket.SHUT_WR)
        return sock.makefile("rb").read().decode()


def exec_start() -> list[str]:
    unit = inventory.unit("zookeeper", "/opt/offerbus").replace("\\\n", " ")
    line = next(x for x in unit.splitlines() if x.startswith("ExecStart="))
    return shlex.split(line.removeprefix("ExecStart="))


@pytest.fixture
def ensemble(tmp_path: Path) -> Iterator[tuple[inventory.Inventory, list[Path]]]:
    client, peer, election = _free(3)
    hosts = "".join(f'[[host]]\nname = "zk-{i}"\naddress = "{a}"\nroles = ["zookeeper"]\n'
                    for i, a in enumerate(ADDRESSES, start=1))
    inv = inventory.parse(
        f"[cluster]\nzk_client_port = {client}\nzk_peer_port = {peer}\n"
        f"zk_election_port = {election}\n{hosts}"
        '[[host]]\nname = "all"\naddress = "127.0.0.9"\n'
        'roles = ["master", "allocator", "broker", "agent"]\n')
    procs: list[subprocess.Popen[bytes]] = []
    roots: list[Path] = []
    try:
        for host in inv.with_role("zookeeper"):
            root = tmp_path / host.name
            roots.append(root)
            files = {f.path: f.content for f in inventory.files_for(inv, host)}
            (root / "data").mkdir(parents=True)
            cfg = files[f"{inventory.ZK_CONF_DIR}/zoo.cfg"].replace(
                f"dataDir={inventory.ZK_DATA_DIR}", f"dataDir={root / 'data'}")
            (root / "zoo.cfg").write_text(cfg + f"clientPortAddress={host.address}\n")
            (root / "log4j.properties").write_text(
                files[f"{inventory.ZK_CONF_DIR}/log4j.properties"])
            (root / "data" / "myid").write_text(files[f"{inventory.ZK_DATA_DIR}/myid"])
            argv = [a.replace(inventory.ZK_CONF_DIR, str(root)) for a in exec_start()]
            with open(root / "console.log", "wb") as out:
                procs.append(subprocess.Popen(argv, cwd=root, stdout=out,
                                              stderr=subprocess.STDOUT))
        yield inv, roots
    finally:
        stop_processes(procs)


def test_the_rendered_ensemble_elects_a_leader(
        ensemble: tuple[inventory.Inventory, list[Path]]) -> None:
    inv, roots = ensemble
    port = int(inv.cluster["zk_client_port"])

    def modes() -> list[str] | None:
        found = [re.search(r"^Mode: (\w+)", srvr(a, port), re.MULTILINE) for a in ADDRESSES]
        return sorted(m.group(1) for m in found) if all(found) else None  # type: ignore[union-attr]
    logs = "; ".join(str(r / "console.log") for r in roots)
    assert wait_for(modes, 90, 0.2, f"no quorum; see {logs}",
                    ignore=(OSError,)) == ["follower", "follower", "leader"]
    assert "INFO" in (roots[0] / "console.log").read_text()  # log4j to the console (journal)
