"""Latency and "loss" between namespaces (this kernel has no `tc netem`): a transparent
userspace TCP proxy run inside a client's namespace, fed by an iptables nat OUTPUT DNAT rule,
relaying each connection to its original destination (SO_ORIGINAL_DST) with every chunk
delayed by `delay_ms` +- `jitter_ms`; and per chunk, with probability `stall_p`, a stall of
`stall_ms` (what a lost segment looks like above TCP: a retransmission's delay spike) or with
probability `reset_p` both ends reset (a dropped connection). `Degradation` is its owner:
it starts the proxy, installs the rule, moves established connections onto it (`ss -K`) and
undoes all of it. Run as `python -m chaos.proxy --listen ADDR [...]`."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import random
import select
import signal
import socket
import struct
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

SO_ORIGINAL_DST = 80  # linux/netfilter_ipv4.h
MARK = 0x0B5  # the proxy's own upstream connections carry it, so the DNAT rule skips them
CHUNK = 65536


@dataclass(frozen=True)
class Impairment:
    delay_ms: float = 0.0
    jitter_ms: float = 0.0
    stall_p: float = 0.0
    stall_ms: float = 500.0
    reset_p: float = 0.0

    def argv(self) -> list[str]:
        return ["--delay-ms", f"{self.delay_ms:g}", "--jitter-ms", f"{self.jitter_ms:g}",
                "--stall-p", f"{self.stall_p:g}", "--stall-ms", f"{self.stall_ms:g}",
                "--reset-p", f"{self.reset_p:g}"]


def original_dst(sock: socket.socket) -> tuple[str, int]:
    raw = sock.getsockopt(socket.SOL_IP, SO_ORIGINAL_DST, 16)
    return socket.inet_ntoa(raw[4:8]), struct.unpack_from("!H", raw, 2)[0]


def _reset(*writers: asyncio.StreamWriter) -> None:
    """Close with an RST (linger 0): the peer sees its connection reset."""
    for w in writers:
        with contextlib.suppress(OSError):
            sock = w.get_extra_info("socket")
            if sock is not None:
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        w.transport.abort()


class Proxy:
    def __init__(self, imp: Impairment, rng: random.Random, listen: str) -> None:
        self.imp, self.rng, self.listen = imp, rng, listen
        self.stats = {"connections": 0, "bytes": 0, "stalls": 0, "resets": 0}

    def _delay(self) -> float:
        j = self.imp.jitter_ms
        return max(0.0, self.imp.delay_ms + (self.rng.uniform(-j, j) if j else 0.0)) / 1000

    async def _pump(self, src: asyncio.StreamReader, dst: asyncio.StreamWriter,
                    both: tuple[asyncio.StreamWriter, asyncio.StreamWriter]) -> None:
        """Relay src -> dst, each chunk sent at (read time + delay), in order."""
        queue: asyncio.Queue[tuple[float, bytes]] = asyncio.Queue(maxsize=256)

        async def read() -> None:
            due = 0.0
            try:
                while data := await src.read(CHUNK):
                    roll = self.rng.random()
                    if roll < self.imp.reset_p:
                        self.stats["resets"] += 1
                        _reset(*both)
                        return
                    extra = 0.0
                    if roll < self.imp.reset_p + self.imp.stall_p:
                        self.stats["stalls"] += 1
                        extra = self.imp.stall_ms / 1000
                    due = max(due, time.monotonic() + self._delay() + extra)  # order kept
                    await queue.put((due, data))
            finally:
                with contextlib.suppress(asyncio.QueueFull):
                    queue.put_nowait((0.0, b""))

        async def write() -> None:
            while True:
                due, data = await queue.get()
                if dst.is_closing():
                    return
                if not data:
                    with contextlib.suppress(OSError, RuntimeError):
                        dst.write_eof()
                    return
                await asyncio.sleep(max(0.0, due - time.monotonic()))
                dst.write(data)
                self.stats["bytes"] += len(data)
                await dst.drain()

        rt, wt = asyncio.create_task(read()), asyncio.create_task(write())
        try:
            with contextlib.suppress(OSError, ConnectionError):
                await wt
        finally:
            rt.cancel()
            with contextlib.suppress(asyncio.CancelledError, OSError, ConnectionError):
                await rt

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        sock = writer.get_extra_info("socket")
        try:
            host, port = original_dst(sock)
            if host == self.listen:
                raise OSError("not redirected")
            up = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            up.setsockopt(socket.SOL_SOCKET, socket.SO_MARK, MARK)
            up.setblocking(False)
            await asyncio.wait_for(asyncio.get_running_loop().sock_connect(up, (host, port)), 5)
            ureader, uwriter = await asyncio.open_connection(sock=up)
        except (OSError, TimeoutError):
            _reset(writer)
            return
        self.stats["connections"] += 1
        both = (writer, uwriter)
        with contextlib.suppress(asyncio.CancelledError):  # the proxy stops: they end
            await asyncio.gather(self._pump(reader, uwriter, both),
                                 self._pump(ureader, writer, both))
        for w in both:
            w.close()

    async def serve(self) -> None:
        server = await asyncio.start_server(self.handle, self.listen, 0)
        port = server.sockets[0].getsockname()[1]
        print(f"listening {self.listen}:{port}", flush=True)
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        async with server:
            await stop.wait()
        print(f"stopped {self.stats}", file=sys.stderr, flush=True)


class Degradation:
    """One impairment of `host`'s TCP to `peers` (addresses), owned: the proxy process in the
    host's namespace, its DNAT rules in that namespace's nat OUTPUT chain (only those of this
    host), and the connections moved onto it and back."""

    def __init__(self, ns: str, address: str, peers: Sequence[str], imp: Impairment,
                 seed: int, log: Any = subprocess.DEVNULL) -> None:
        self.ns, self.address, self.peers, self.imp = ns, address, list(peers), imp
        self.seed, self.log = seed, log
        self.popen: subprocess.Popen[str] | None = None
        self.port = 0

    def _ns(self, *argv: str, check: bool = True) -> None:
        from chaos.netns import run

        run("ip", "netns", "exec", self.ns, *argv, check=check)

    def start(self, timeout: float = 10.0) -> None:
        self.popen = subprocess.Popen(
            ["ip", "netns", "exec", self.ns, sys.executable, "-m", "chaos.proxy",
             "--listen", self.address, "--seed", str(self.seed), *self.imp.argv()],
            stdout=subprocess.PIPE, stderr=self.log, stdin=subprocess.DEVNULL, text=True,
            start_new_session=True)
        assert self.popen.stdout is not None
        ready, _, _ = select.select([self.popen.stdout], [], [], timeout)
        line = self.popen.stdout.readline() if ready else ""
        if not line.startswith("listening "):
            self.stop()
            raise RuntimeError(f"the proxy in {self.ns} did not start: {line!r}")
        self.port = int(line.split(":")[-1])
        try:
            for peer in self.peers:
                self._ns("iptables", "-w", "-t", "nat", "-A", "OUTPUT", "-p", "tcp", "-d", peer,
                         "-m", "mark", "!", "--mark", str(MARK), "-j", "DNAT",
                         "--to-destination", f"{self.address}:{self.port}")
            self._kill_connections()  # they reconnect, through the proxy
        except BaseException:
            self.stop()
            raise

    def _kill_connections(self) -> None:
        for peer in self.peers:
            self._ns("ss", "-K", "dst", peer, check=False)

    def stop(self) -> None:
        """Rules removed, the proxy ended (its connections with it), connections to the
        peers killed so they reconnect directly."""
        self._ns("iptables", "-w", "-t", "nat", "-F", "OUTPUT", check=False)
        if self.popen is not None:
            with contextlib.suppress(ProcessLookupError):
                self.popen.terminate()
            try:
                self.popen.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self.popen.kill()
                self.popen.wait(timeout=5)
            if self.popen.stdout is not None:
                self.popen.stdout.close()
        self._kill_connections()


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="chaos.proxy", description=__doc__)
    p.add_argument("--listen", required=True, help="this namespace's own address")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--delay-ms", type=float, default=0.0)
    p.add_argument("--jitter-ms", type=float, default=0.0)
    p.add_argument("--stall-p", type=float, default=0.0)
    p.add_argument("--stall-ms", type=float, default=500.0)
    p.add_argument("--reset-p", type=float, default=0.0)
    a = p.parse_args(argv)
    imp = Impairment(a.delay_ms, a.jitter_ms, a.stall_p, a.stall_ms, a.reset_p)
    asyncio.run(Proxy(imp, random.Random(a.seed), a.listen).serve())


if __name__ == "__main__":
    main()
