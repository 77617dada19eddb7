"""Optional CURVE encryption and authentication for every bus socket: servers accept only
clients whose public key is allowed; a ZAP handler per context counts refusals."""

from __future__ import annotations

import threading
from dataclasses import dataclass
from pathlib import Path

import zmq
import zmq.auth
from zmq.auth.thread import ThreadAuthenticator

from services.bus.log import get_logger

log = get_logger("bus.curve")


@dataclass(frozen=True)
class KeyPair:
    public: bytes  # Z85, 40 bytes
    secret: bytes

    @classmethod
    def generate(cls) -> KeyPair:
        public, secret = zmq.curve_keypair()
        return cls(public, secret)

    def save(self, directory: Path, name: str) -> None:
        """Write `name.key` (public) and `name.key_secret` (0600) in ZeroMQ's cert format."""
        directory.mkdir(parents=True, exist_ok=True)
        (directory / f"{name}.key").write_text(
            f"metadata\ncurve\n    public-key = \"{self.public.decode()}\"\n")
        secret = directory / f"{name}.key_secret"
        secret.touch(mode=0o600)
        secret.write_text(
            f"metadata\ncurve\n    public-key = \"{self.public.decode()}\"\n"
            f"    secret-key = \"{self.secret.decode()}\"\n")

    @classmethod
    def load(cls, path: Path) -> KeyPair:
        public, secret = zmq.auth.load_certificate(str(path))
        if secret is None:
            raise ValueError(f"{path} holds no secret key")
        return cls(public, secret)


def load_public_keys(directory: Path) -> set[bytes]:
    """Every public key in `directory/*.key` (the allowed clients)."""
    keys = set()
    for path in sorted(directory.glob("*.key")):
        public, _ = zmq.auth.load_certificate(str(path))
        keys.add(public)
    return keys


class _AllowList:
    def __init__(self, allowed: set[bytes]) -> None:
        self.allowed = set(allowed)
        self.refused = 0
        self._lock = threading.Lock()  # called from the authenticator's thread

    def callback(self, domain: str, key: bytes) -> bool:
        ok = key in self.allowed
        if not ok:
            with self._lock:
                self.refused += 1
            log.warning("refused CURVE client", domain=domain, key=key.decode(errors="replace"))
        return ok


class CurveAuthority:
    """The ZAP handler of one zmq Context (one per process): which client keys may connect."""

    def __init__(self, ctx: zmq.Context[zmq.Socket[bytes]], allowed: set[bytes]) -> None:
        self._allow = _AllowList(allowed)
        self._auth = ThreadAuthenticator(ctx)
        self._auth.start()
        self._auth.configure_curve_callback("*", credentials_provider=self._allow)

    @property
    def refused(self) -> int:
        return self._allow.refused

    def allow(self, key: bytes) -> None:
        self._allow.allowed.add(key)

    def stop(self) -> None:
        self._auth.stop()


@dataclass(frozen=True)
class CurveServer:
    keys: KeyPair

    def apply(self, sock: zmq.Socket[bytes]) -> None:
        sock.curve_secretkey = self.keys.secret
        sock.curve_publickey = self.keys.public
        sock.curve_server = True


@dataclass(frozen=True)
class CurveClient:
    keys: KeyPair
    server_public: bytes

    def apply(self, sock: zmq.Socket[bytes]) -> None:
        sock.curve_secretkey = self.keys.secret
        sock.curve_publickey = self.keys.public
        sock.curve_serverkey = self.server_public
