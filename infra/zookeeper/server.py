"""Run real ZooKeeper 3.8 (Debian's package) as local processes, for tests and laptops.

No Debian service scripts: each server is one ``java ... QuorumPeerMain zoo.cfg`` process
with our own config in its own directory, in its own session (so a Ctrl-C in the caller's
terminal does not reach it), logging to a file in that directory.

Layout of a server directory ``root``::

    root/zoo.cfg            our config (clientPort, dataDir, tickTime, ...)
    root/log4j.properties   logs go to root/zookeeper.log, never the console
    root/data/              dataDir (and data/myid in an ensemble)
    root/zookeeper.out      the JVM's own stdout/stderr (crashes before logging starts)
    root/zookeeper.pid      pid of the running server

An ensemble of N lives in ``root/zk1 .. root/zkN``.

The command line that starts and stops them is ``python -m infra.zookeeper`` (its
``__main__.py``).
"""

from __future__ import annotations

import atexit
import contextlib
import os
import shutil
import signal
import socket
import subprocess
import time
import weakref
from collections.abc import Callable, Sequence
from pathlib import Path

from services.procs import cmdline, pid_alive

__all__ = [
    "ZooKeeperEnsemble",
    "ZooKeeperError",
    "ZooKeeperServer",
    "four_letter",
    "free_ports",
]

JAVA_DIR = Path("/usr/share/java")
# An explicit class path. zookeeper.jar's manifest pulls in its own dependencies but no
# SLF4J binding; "/usr/share/java/*" holds six bindings and SLF4J then picks slf4j-nop (seen
# here), which silently drops every log line. So name the log4j 1.2 binding ourselves.
CLASSPATH_JARS = ("zookeeper.jar", "slf4j-log4j12.jar", "log4j-1.2.jar")
MAIN_CLASS = "org.apache.zookeeper.server.quorum.QuorumPeerMain"
SERVING_MODES = ("standalone", "leader", "follower", "observer")

_POLL_S = 0.05


class ZooKeeperError(RuntimeError):
    """A ZooKeeper server could not be started (the message carries its log tail)."""


def four_letter(port: int, cmd: str, timeout: float = 2.0) -> str:
    """Send a four-letter word (``ruok``, ``srvr``, ``mntr``, ...) to 127.0.0.1:port.

    Returns the whole answer. Raises OSError when the port does not answer in time.
    """
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as sock:
        sock.sendall(cmd.encode("ascii"))
        with contextlib.suppress(OSError):
            sock.shutdown(socket.SHUT_WR)
        chunks: list[bytes] = []
        while True:
            data = sock.recv(65536)
            if not data:
                break
            chunks.append(data)
    return b"".join(chunks).decode("utf-8", "replace")


def free_ports(count: int) -> list[int]:
    """Return ``count`` distinct TCP ports that are free on 127.0.0.1 right now."""
    socks: list[socket.socket] = []
    try:
        for _ in range(count):
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            s.bind(("127.0.0.1", 0))
            socks.append(s)
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def _port_is_free(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def _wait_until(predicate: Callable[[], bool], deadline: float) -> bool:
    """Poll ``predicate`` until it is true or the monotonic ``deadline`` passes."""
    while True:
        if predicate():
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(_POLL_S)


def _java() -> str:
    java = shutil.which("java") or "/usr/bin/java"
    if not Path(java).exists():
        raise ZooKeeperError("java not found; install ZooKeeper with `make system`")
    return java


def _classpath() -> str:
    jars = [JAVA_DIR / name for name in CLASSPATH_JARS]
    missing = [str(j) for j in jars if not j.exists()]
    if missing:
        raise ZooKeeperError(
            f"ZooKeeper jars missing ({', '.join(missing)}); run `make system` "
            "(Debian package zookeeper)"
        )
    return ":".join(str(j) for j in jars)


_LOG4J = """\
# Written by infra/zookeeper.py: ZooKeeper logs to a file next to its zoo.cfg.
log4j.rootLogger=INFO, FILE
log4j.appender.FILE=org.apache.log4j.RollingFileAppender
log4j.appender.FILE.File={log}
log4j.appender.FILE.MaxFileSize=10MB
log4j.appender.FILE.MaxBackupIndex=2
log4j.appender.FILE.layout=org.apache.log4j.PatternLayout
log4j.appender.FILE.layout.ConversionPattern=%d{{ISO8601}} %-5p [%t:%C{{1}}@%L] - %m%n
"""

# Servers started through the API by this process; killed at interpreter exit so an
# aborted test run does not leave JVMs behind (the CLI detaches its server from this).
_owned: weakref.WeakSet[ZooKeeperServer] = weakref.WeakSet()


@atexit.register
def _kill_owned() -> None:
    for server in list(_owned):
        with contextlib.suppress(Exception):
            server.kill()


class ZooKeeperServer:
    """One real ZooKeeper server process: standalone, or one member of an ensemble.

    ``peers`` is the whole ensemble as ``(myid, peer_port, election_port)`` tuples (this
    server included, with ``myid``); without it the server runs standalone.
    """

    def __init__(
        self,
        root: Path,
        client_port: int | None = None,
        tick_ms: int = 200,
        *,
        myid: int | None = None,
        peers: list[tuple[int, int, int]] | None = None,
    ) -> None:
        if (myid is None) != (peers is None):
            raise ValueError("myid and peers go together (ensemble member) or not at all")
        if peers is not None and myid not in {p[0] for p in peers}:
            raise ValueError(f"myid {myid} is not among the peers {peers}")
        self.root = Path(root).absolute()
        self.client_port: int = client_port if client_port is not None else free_ports(1)[0]
        self.hosts: str = f"127.0.0.1:{self.client_port}"
        self.tick_ms = tick_ms
        self.myid = myid
        self.peers = list(peers) if peers is not None else None
        self._proc: subprocess.Popen[bytes] | None = None
        self._pid: int | None = None

    # -- files ------------------------------------------------------------------------

    @property
    def data_dir(self) -> Path:
        return self.root / "data"

    @property
    def config_path(self) -> Path:
        return self.root / "zoo.cfg"

    @property
    def log_path(self) -> Path:
        return self.root / "zookeeper.log"

    @property
    def out_path(self) -> Path:
        return self.root / "zookeeper.out"

    @property
    def pid_path(self) -> Path:
        return self.root / "zookeeper.pid"

    @property
    def pid(self) -> int | None:
        return self._pid

    def config_text(self) -> str:
        lines = [
            "# Written by infra/zookeeper.py",
            f"tickTime={self.tick_ms}",
            # Followers get initLimit ticks to connect and sync, syncLimit ticks to stay in
            # step: 2 s and 1 s at tickTime=200.
            "initLimit=10",
            "syncLimit=5",
            f"dataDir={self.data_dir}",
            f"clientPort={self.client_port}",
            "clientPortAddress=127.0.0.1",
            # Sessions of 0.4 s .. 20 s at tickTime=200 (Offerbus uses 1-2 s).
            f"minSessionTimeout={2 * self.tick_ms}",
            f"maxSessionTimeout={100 * self.tick_ms}",
            # Every test client comes from 127.0.0.1; the default cap is 60 per address.
            "maxClientCnxns=0",
            "admin.enableServer=false",
            "4lw.commands.whitelist=*",
            # A local/test server: write every transaction but do not fsync each one. A
            # killed process loses nothing (the data is in the page cache); only a machine
            # crash could.
            "forceSync=no",
            "autopurge.snapRetainCount=3",
            "autopurge.purgeInterval=1",
        ]
        if self.peers is not None:
            lines.append("standaloneEnabled=false")
            for sid, peer_port, election_port in sorted(self.peers):
                lines.append(f"server.{sid}=127.0.0.1:{peer_port}:{election_port}")
        return "\n".join(lines) + "\n"

    def _write_files(self) -> None:
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self.config_path.write_text(self.config_text())
        (self.root / "log4j.properties").write_text(_LOG4J.format(log=self.log_path))
        if self.myid is not None:
            (self.data_dir / "myid").write_text(f"{self.myid}\n")

    def command(self) -> list[str]:
        return [
            _java(),
            "-Xmx256m",
            "-Xms32m",
            "-XX:+UseSerialGC",
            "-XX:TieredStopAtLevel=1",  # starts faster; ZooKeeper here is not CPU bound
            "-Djava.net.preferIPv4Stack=true",
            f"-Dlog4j.configuration=file:{self.root / 'log4j.properties'}",
            f"-Dzookeeper.log.dir={self.root}",
            "-Dzookeeper.jmx.log4j.disable=true",
            # Give up on an unreachable election peer after 1 s instead of 5 s, so a
            # killed member does not slow leader election down.
            "-Dzookeeper.cnxTimeout=1000",
            "-cp",
            _classpath(),
            MAIN_CLASS,
            str(self.config_path),
        ]

    # -- lifecycle ----------------------------------------------------------------------

    def launch(self) -> None:
        """Start the process and return at once (``start`` also waits for it to serve)."""
        if self.alive():
            return
        self.root.mkdir(parents=True, exist_ok=True)
        self._write_files()
        with self.out_path.open("ab") as out:
            self._proc = subprocess.Popen(
                self.command(),
                cwd=self.root,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                close_fds=True,
            )
        self._pid = self._proc.pid
        self.pid_path.write_text(f"{self._pid}\n")
        _owned.add(self)

    def start(self, timeout: float = 30.0) -> None:
        """Start the server and return once it answers ``ruok`` and serves clients.

        Serving means ``srvr`` reports a mode (standalone, leader or follower): an ensemble
        member only serves once a quorum has formed. Raises ZooKeeperError with the log tail
        when that does not happen within ``timeout`` seconds.
        """
        if not self.alive() and not _port_is_free(self.client_port):
            raise ZooKeeperError(
                f"port {self.client_port} on 127.0.0.1 is already in use; "
                "is another ZooKeeper running? (choose another port)"
            )
        self.launch()
        self.wait_serving(time.monotonic() + timeout)

    def wait_serving(self, deadline: float) -> None:
        """Wait until the server serves, or raise ZooKeeperError at the monotonic deadline."""
        if _wait_until(lambda: not self.alive() or self.serving(), deadline) and self.alive():
            return
        if not self.alive():
            raise ZooKeeperError(
                f"ZooKeeper at {self.hosts} exited while starting (exit code "
                f"{self._exit_code()}).\n{self.log_tail()}"
            )
        raise ZooKeeperError(
            f"ZooKeeper at {self.hosts} is not serving after the deadline "
            f"(ruok: {self._safe_four_letter('ruok')!r}, "
            f"srvr: {self._safe_four_letter('srvr').strip()!r}).\n{self.log_tail()}"
        )

    def stop(self) -> None:
        """Stop the server: SIGTERM, wait up to 10 s, then SIGKILL."""
        self._signal_and_wait(signal.SIGTERM, 10.0)
        if self.alive():
            self._signal_and_wait(signal.SIGKILL, 10.0)
        self._forget()

    def kill(self) -> None:
        """SIGKILL the server at once (for failure tests). ``start`` brings it back."""
        self._signal_and_wait(signal.SIGKILL, 10.0)
        self._forget()

    def alive(self) -> bool:
        if self._proc is not None:
            return self._proc.poll() is None
        pid = self._pid
        return pid is not None and pid_alive(pid) and self._is_ours(pid)

    def detach(self) -> None:
        """Let the server outlive this Python process (the CLI's ``start``)."""
        _owned.discard(self)

    @classmethod
    def from_dir(cls, root: Path) -> ZooKeeperServer:
        """A handle on a server started earlier (by the CLI) in ``root``: port from its
        zoo.cfg, pid from its pid file (it may no longer be running)."""
        root = Path(root).absolute()
        config = _read_config(root / "zoo.cfg")
        server = cls(root, int(config["clientPort"]), int(config.get("tickTime", "200")))
        with contextlib.suppress(OSError, ValueError):
            server._pid = int((root / "zookeeper.pid").read_text().strip())
        return server

    # -- state ----------------------------------------------------------------------------

    def mode(self) -> str | None:
        """``standalone``, ``leader``, ``follower`` ... as reported by ``srvr``, or None
        when the server does not answer or does not serve (no quorum)."""
        try:
            answer = four_letter(self.client_port, "srvr", timeout=1.0)
        except OSError:
            return None
        for line in answer.splitlines():
            if line.startswith("Mode:"):
                return line.split(":", 1)[1].strip()
        return None

    def serving(self) -> bool:
        if self._safe_four_letter("ruok") != "imok":
            return False
        return self.mode() in SERVING_MODES

    def log_tail(self, lines: int = 30) -> str:
        parts = []
        for path in (self.out_path, self.log_path):
            try:
                text = path.read_text(errors="replace").splitlines()[-lines:]
            except OSError:
                continue
            if text:
                parts.append(f"--- last lines of {path} ---\n" + "\n".join(text))
        return "\n".join(parts) or f"(no log in {self.root})"

    def __repr__(self) -> str:
        role = f"myid={self.myid}" if self.myid is not None else "standalone"
        return f"ZooKeeperServer({self.hosts}, {role}, pid={self._pid}, root={self.root})"

    # -- internals ---------------------------------------------------------------------

    def _safe_four_letter(self, cmd: str) -> str:
        try:
            return four_letter(self.client_port, cmd, timeout=1.0)
        except OSError as exc:
            return f"<{exc.__class__.__name__}: {exc}>"

    def _is_ours(self, pid: int) -> bool:
        """The pid still is our java process (pids get reused after a reboot or a kill)."""
        cmd = cmdline(pid)
        return MAIN_CLASS in cmd and str(self.config_path) in cmd

    def _exit_code(self) -> int | None:
        return self._proc.poll() if self._proc is not None else None

    def _signal_and_wait(self, sig: signal.Signals, wait_s: float) -> None:
        pid = self._pid
        if pid is None or not self.alive():
            return
        # The server leads its own session and process group: signal the whole group.
        try:
            os.killpg(pid, sig)
        except ProcessLookupError:
            return
        except PermissionError:
            os.kill(pid, sig)
        deadline = time.monotonic() + wait_s
        if self._proc is not None:
            with contextlib.suppress(subprocess.TimeoutExpired):
                self._proc.wait(timeout=wait_s)
        else:
            _wait_until(lambda: not pid_alive(pid), deadline)

    def _forget(self) -> None:
        if self.alive():
            return
        _owned.discard(self)
        with contextlib.suppress(OSError):
            self.pid_path.unlink()


def _read_config(path: Path) -> dict[str, str]:
    config: dict[str, str] = {}
    for line in path.read_text().splitlines():
        line = line.strip()
        if line and not line.startswith("#") and "=" in line:
            key, value = line.split("=", 1)
            config[key.strip()] = value.strip()
    return config


class ZooKeeperEnsemble:
    """``size`` real ZooKeeper servers on 127.0.0.1 forming one quorum, in root/zk1..zkN."""

    def __init__(
        self,
        root: Path,
        size: int = 3,
        tick_ms: int = 200,
        *,
        client_ports: Sequence[int] | None = None,
    ) -> None:
        if size < 1:
            raise ValueError("an ensemble needs at least one server")
        if client_ports is not None and len(client_ports) != size:
            raise ValueError(f"{len(client_ports)} client ports for {size} servers")
        self.root = Path(root).absolute()
        ports = free_ports(3 * size)
        clients = list(client_ports) if client_ports is not None else ports[:size]
        peers = [(i + 1, ports[size + i], ports[2 * size + i]) for i in range(size)]
        self.servers: list[ZooKeeperServer] = [
            ZooKeeperServer(
                self.root / f"zk{sid}", clients[sid - 1], tick_ms, myid=sid, peers=peers
            )
            for sid, _, _ in peers
        ]
        self.hosts: str = ",".join(s.hosts for s in self.servers)

    def start(self, timeout: float = 60.0) -> None:
        """Start every server and return once all serve (a quorum formed, one leader)."""
        deadline = time.monotonic() + timeout
        busy = [s.client_port for s in self.servers if not s.alive()]
        busy = [p for p in busy if not _port_is_free(p)]
        if busy:
            raise ZooKeeperError(f"client ports already in use on 127.0.0.1: {busy}")
        for server in self.servers:
            server.launch()
        try:
            for server in self.servers:
                server.wait_serving(deadline)
        except ZooKeeperError:
            self.stop()
            raise

    def stop(self) -> None:
        for server in self.servers:
            server._signal_and_wait(signal.SIGTERM, 0.0)  # all at once, then wait each
        for server in self.servers:
            server.stop()

    def leader(self) -> ZooKeeperServer | None:
        """The member that reports itself leader right now, if any."""
        for server in self.servers:
            if server.mode() == "leader":
                return server
        return None

    def serving(self) -> list[ZooKeeperServer]:
        return [s for s in self.servers if s.serving()]

    def __repr__(self) -> str:
        return f"ZooKeeperEnsemble({self.hosts}, root={self.root})"


# -- CLI ------------------------------------------------------------------------------------
