"""The fleet's network: a bridge in a namespace of its own, the root namespace linked to it
(an address per service running there), and per "machine" a network namespace joined to it
by a veth pair; partitions as iptables rules inside a namespace. Every name carries the
fleet id, so two fleets never collide and `remove_all(fleet_id)` finds exactly one fleet's
leftovers."""

from __future__ import annotations

import contextlib
import hashlib
import ipaddress
import subprocess
from collections.abc import Sequence

PREFIX = "ob"  # every link and namespace name starts "ob" + a role letter + "-<fleet id>"


class NetError(RuntimeError):
    """An `ip`/`iptables` command failed (the message carries its stderr)."""


def run(*argv: str, check: bool = True) -> str:
    proc = subprocess.run(list(argv), capture_output=True, text=True, timeout=30)
    if check and proc.returncode != 0:
        raise NetError(f"{' '.join(argv)}: {proc.stderr.strip() or proc.returncode}")
    return proc.stdout


def bridge_name(fleet_id: str) -> str:
    return f"{PREFIX}b-{fleet_id}"  # 10 characters (interface names hold 15)


def ns_name(fleet_id: str, host: str) -> str:
    return f"{PREFIX}n-{fleet_id}-{host}"


def veth_name(fleet_id: str, index: int) -> str:
    return f"{PREFIX}v-{fleet_id}-{index}"


def used_networks() -> list[ipaddress.IPv4Network | ipaddress.IPv6Network]:
    """Every IPv4 network configured in the root namespace right now."""
    nets = []
    for line in run("ip", "-4", "-o", "addr", "show").splitlines():
        parts = line.split()
        if "inet" in parts:
            nets.append(ipaddress.ip_interface(parts[parts.index("inet") + 1]).network)
    return nets


def pick_subnet(fleet_id: str) -> ipaddress.IPv4Network:
    """A /24 in 10.200.0.0/13 derived from the fleet id that overlaps nothing configured."""
    used = used_networks()
    seed = int(hashlib.sha256(fleet_id.encode()).hexdigest(), 16)
    for attempt in range(2048):
        n = (seed + attempt) % 2048
        net = ipaddress.ip_network(f"10.{200 + n // 256}.{n % 256}.0/24")
        if not any(net.overlaps(u) for u in used):
            return ipaddress.IPv4Network(net)
    raise NetError("no free /24 in 10.200.0.0/13")


class Network:
    """One fleet's bridge, its root-namespace addresses and its namespaces."""

    def __init__(self, fleet_id: str, subnet: ipaddress.IPv4Network) -> None:
        self.fleet_id, self.subnet = fleet_id, subnet
        self.bridge = bridge_name(fleet_id)
        self.prefix = subnet.prefixlen
        self.namespaces: dict[str, str] = {}  # host -> namespace name

    def address(self, index: int) -> str:
        return str(self.subnet.network_address + index)

    @property
    def bridge_ns(self) -> str:
        return ns_name(self.fleet_id, "bridge")

    def create_bridge(self, root_addresses: Sequence[int]) -> None:
        """The bridge, in a namespace of its own (so the host's firewall, e.g. Docker's
        FORWARD DROP, never sees traffic between two of the fleet's namespaces), and the root
        namespace's veth link to it holding `.1` and each of `root_addresses` (services of
        the root namespace bind one each, so a partition can name them by address)."""
        run("ip", "netns", "add", self.bridge_ns)
        run("ip", "-n", self.bridge_ns, "link", "add", self.bridge, "type", "bridge")
        run("ip", "-n", self.bridge_ns, "link", "set", self.bridge, "up")
        root = veth_name(self.fleet_id, 0)
        self._plug(root)
        run("ip", "addr", "add", f"{self.address(1)}/{self.prefix}", "dev", root)
        for index in root_addresses:
            run("ip", "addr", "add", f"{self.address(index)}/{self.prefix}", "dev", root)
        run("ip", "link", "set", root, "up")

    def _plug(self, veth: str) -> None:
        """A veth pair `veth` / `veth`p whose p end is on the bridge."""
        run("ip", "link", "add", veth, "type", "veth", "peer", "name", f"{veth}p")
        run("ip", "link", "set", f"{veth}p", "netns", self.bridge_ns)
        run("ip", "-n", self.bridge_ns, "link", "set", f"{veth}p", "master", self.bridge)
        run("ip", "-n", self.bridge_ns, "link", "set", f"{veth}p", "up")

    def add_host(self, host: str, index: int) -> str:
        """A namespace for `host` with address number `index` on eth0 (a veth pair whose
        other end is on the bridge) and loopback up; returns the address."""
        ns = ns_name(self.fleet_id, host)
        veth = veth_name(self.fleet_id, index)
        run("ip", "netns", "add", ns)
        self.namespaces[host] = ns
        self._plug(veth)
        run("ip", "link", "set", veth, "netns", ns)
        addr = self.address(index)
        self.ns_exec(host, "ip", "link", "set", veth, "name", "eth0")
        self.ns_exec(host, "ip", "addr", "add", f"{addr}/{self.prefix}", "dev", "eth0")
        self.ns_exec(host, "ip", "link", "set", "eth0", "up")
        self.ns_exec(host, "ip", "link", "set", "lo", "up")
        return addr

    def ns_exec(self, host: str, *argv: str, check: bool = True) -> str:
        return run("ip", "netns", "exec", self.namespaces[host], *argv, check=check)

    def wrap(self, host: str | None, argv: list[str]) -> list[str]:
        """`argv` run inside `host`'s namespace (as is for the root namespace)."""
        if host is None:
            return argv
        return ["ip", "netns", "exec", self.namespaces[host], *argv]

    # -- partitions: rules only inside a fleet namespace --------------------------------------
    def cut(self, host: str, peers: Sequence[str], one_way: bool = False) -> None:
        """Drop what `host` sends to `peers` (addresses) and, unless `one_way`, what it
        receives from them: a real partition (connections time out)."""
        for peer in peers:
            self.ns_exec(host, "iptables", "-w", "-A", "OUTPUT", "-d", peer, "-j", "DROP")
            if not one_way:
                self.ns_exec(host, "iptables", "-w", "-A", "INPUT", "-s", peer, "-j", "DROP")

    def heal(self, host: str) -> None:
        """Remove every rule of `host`'s namespace (only this namespace's own tables)."""
        self.ns_exec(host, "iptables", "-w", "-F", "INPUT")
        self.ns_exec(host, "iptables", "-w", "-F", "OUTPUT")


def remove_all(fleet_id: str) -> list[str]:
    """Remove this fleet's namespaces, veths and bridge (and only those); what was removed."""
    removed = []
    tag = f"-{fleet_id}"
    for line in run("ip", "netns", "list", check=False).splitlines():
        name = line.split()[0] if line.split() else ""
        if name.startswith(f"{PREFIX}n{tag}-"):
            run("ip", "netns", "del", name, check=False)
            removed.append(name)
    for line in run("ip", "-o", "link", "show", check=False).splitlines():
        parts = line.split(":")
        if len(parts) < 2:
            continue
        name = parts[1].strip().split("@")[0]
        if name.startswith((f"{PREFIX}v{tag}-", f"{PREFIX}b{tag}")):
            with contextlib.suppress(NetError):
                run("ip", "link", "del", name)
                removed.append(name)
    return removed
