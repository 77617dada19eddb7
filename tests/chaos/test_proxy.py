"""The latency/loss proxy between two namespaces made by the test: a round trip through it
takes at least twice the configured delay (it is measured without the proxy first, the same
way), a reset probability of 1 resets the connection, and stopping it leaves no rule, no
process and direct connections again."""

from __future__ import annotations

import os
import secrets
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from chaos import netns
from chaos.proxy import Degradation, Impairment

pytestmark = [pytest.mark.integration,
              pytest.mark.skipif(os.geteuid() != 0, reason="network namespaces need root")]

PORT = 45077
ECHO = """
import socket, sys
s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind((sys.argv[1], int(sys.argv[2]))); s.listen(8); print("ready", flush=True)
while True:
    c, _ = s.accept()
    try:
        while data := c.recv(4096):
            c.sendall(data)
    except OSError:
        pass  # reset by the proxy
    c.close()
"""
# N round trips of one byte on one connection; prints the fastest (seconds) or the error
PING = """
import socket, sys, time
try:
    c = socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=5)
    best = 1e9
    for _ in range(5):
        t = time.monotonic(); c.sendall(b"x")
        if c.recv(1) != b"x":
            raise ConnectionError("closed")
        best = min(best, time.monotonic() - t)
    print(f"rtt {best:.4f}")
except OSError as exc:
    print(f"error {type(exc).__name__}")
"""


@pytest.fixture
def pair() -> Iterator[tuple[netns.Network, str, str]]:
    fleet_id = secrets.token_hex(3)
    net = netns.Network(fleet_id, netns.pick_subnet(fleet_id))
    echo = None
    try:
        net.create_bridge([])
        client, server = net.add_host("c", 101), net.add_host("s", 102)
        echo = subprocess.Popen(net.wrap("s", [sys.executable, "-c", ECHO, server, str(PORT)]),
                                stdout=subprocess.PIPE, text=True)
        assert echo.stdout is not None and echo.stdout.readline().strip() == "ready"
        yield net, client, server
    finally:
        if echo is not None:
            echo.kill()
            echo.wait(timeout=10)
        netns.remove_all(fleet_id)


def _ping(net: netns.Network, server: str) -> str:
    out = subprocess.run(net.wrap("c", [sys.executable, "-c", PING, server, str(PORT)]),
                         capture_output=True, text=True, timeout=30)
    return out.stdout.strip()


def _nat_rules(net: netns.Network) -> list[str]:
    return [r for r in net.ns_exec("c", "iptables", "-w", "-t", "nat", "-S", "OUTPUT")
            .splitlines() if "DNAT" in r]


@pytest.mark.timeout(60)
def test_the_proxy_delays_every_byte_both_ways_and_leaves_nothing(
        pair: tuple[netns.Network, str, str]) -> None:
    net, client, server = pair
    direct = _ping(net, server)
    assert direct.startswith("rtt ")
    assert float(direct.split()[1]) < 0.2  # a direct round trip: far below the delay
    deg = Degradation(net.namespaces["c"], client, [server], Impairment(delay_ms=150), seed=1)
    deg.start()
    try:
        assert len(_nat_rules(net)) == 1
        proxied = _ping(net, server)
        assert proxied.startswith("rtt "), proxied  # relayed to the original destination
        assert float(proxied.split()[1]) >= 0.3  # 150 ms there, 150 ms back
    finally:
        deg.stop()
    assert deg.popen is not None and deg.popen.poll() is not None
    assert _nat_rules(net) == []
    assert float(_ping(net, server).split()[1]) < 0.2  # direct again


@pytest.mark.timeout(60)
def test_a_reset_probability_of_one_resets_the_connection(
        pair: tuple[netns.Network, str, str]) -> None:
    net, client, server = pair
    deg = Degradation(net.namespaces["c"], client, [server], Impairment(reset_p=1.0), seed=1)
    deg.start()
    try:
        assert _ping(net, server) in ("error ConnectionResetError", "error ConnectionError")
    finally:
        deg.stop()
    assert _ping(net, server).startswith("rtt ")


@pytest.mark.timeout(200)
def test_a_campaign_with_degraded_links_recovers_and_leaves_no_proxy(
        tmp_path: Path, busybox_image: str) -> None:
    """chaos/scenarios/degraded.toml: latency on an agent's and the leading allocator's
    connections to the masters, stalls on an agent's. Every fault recovers with nothing lost
    (no running task, no status update: moving connections onto the proxy resets them, and a
    launch in flight on a reset connection was lost for good until the agent re-registered
    after a reset; chaos/README.md, "Found"), no duplicate launch and no violation; the
    proxies carried the traffic, and nothing of them is left."""
    from chaos import scenario as sc
    from chaos.campaign import Campaign
    from chaos.report import failures, summary

    scen = sc.load(Path(__file__).resolve().parents[2] / "chaos" / "scenarios" / "degraded.toml")
    campaign = Campaign(scen, tmp_path)
    report = campaign.run()
    rows = {r["fault"]: r for r in summary(report)}
    assert set(rows) == {f.label() for f in scen.faults}
    assert all(r["recovered"] == r["n"] for r in rows.values())
    for o in report["outcomes"]:
        assert (o["tasks_lost"], o["duplicates"], o["violations"]) == ([], [], []), o
    assert report["violations"] == []
    assert failures(report) == []  # status updates too
    logs = tmp_path / "fleet" / "logs"
    carried = [line for p in logs.glob("proxy-*.log") for line in p.read_text().splitlines()
               if line.startswith("stopped ")]
    assert len(carried) == len(scen.faults)
    assert all("'connections': 0" not in line for line in carried)  # traffic went through
    fid = campaign.fleet.fleet_id
    names = netns.run("ip", "netns", "list").split() + netns.run("ip", "-o", "link").split()
    assert [n for n in names if f"-{fid}" in n] == []
    assert campaign.fleet.net is not None
    prefix = str(campaign.fleet.net.subnet.network_address).rsplit(".", 1)[0] + "."
    proxies = subprocess.run(["pgrep", "-f", f"chaos.proxy --listen {prefix}"],
                             capture_output=True, text=True).stdout.split()
    assert proxies == []  # every proxy of this fleet ended
    assert all(d.popen is None or d.popen.poll() is not None
               for d in campaign.fleet.degraded.values())
    assert campaign.fleet.degraded == {}

