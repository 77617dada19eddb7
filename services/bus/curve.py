"""Optional CURVE encryption and authentication for every bus socket: servers accept only
clients whose public key is allowed; a ZAP handler per context counts refusals. ZeroMQ is
imported where a key is made or read, not with this module: the CLI reads its settings
(profiles) through it, and most of its commands never touch the bus."""

from __future__ import annotations

import os
import threading
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from services.bus.log import get_logger

if TYPE_CHECKING:
    import zmq

log = get_logger("bus.curve")


@dataclass(frozen=True)
class KeyPair:
    public: bytes  # Z85, 40 bytes
    secret: bytes

    @classmethod
    def generate(cls) -> KeyPair:
        import zmq

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
        import zmq.auth

        public, secret = zmq.auth.load_certificate(str(path))
        if secret is None:
            raise ValueError(f"{path} holds no secret key")
        return cls(public, secret)


def load_public_key(path: Path) -> bytes:
    """The public key of a cert (`NAME.key` or `NAME.key_secret`); ValueError if unreadable."""
    import zmq.auth

    try:
        public, _ = zmq.auth.load_certificate(str(path))
    except (OSError, ValueError) as exc:
        raise ValueError(f"{path}: not a readable CURVE cert ({exc})") from None
    if not public or len(public) != 40:
        raise ValueError(f"{path}: holds no public key")
    return public


def load_public_keys(directory: Path) -> set[bytes]:
    """Every public key in `directory/*.key` (the allowed clients)."""
    return {key for _, key in list_public_keys(directory)}


def list_public_keys(directory: Path) -> list[tuple[str, bytes]]:
    """(name, public key) of every `directory/NAME.key`, by name; ValueError on a bad cert
    or a directory that is not there."""
    if not directory.is_dir():
        raise ValueError(f"{directory}: no such directory")
    return [(path.stem, load_public_key(path)) for path in sorted(directory.glob("*.key"))]


def load_secret(path: Path) -> KeyPair:
    """`KeyPair.load` with a clear ValueError (unreadable, not a cert, no secret)."""
    try:
        return KeyPair.load(path)
    except (OSError, ValueError) as exc:
        raise ValueError(f"{path}: not a readable CURVE secret cert ({exc})") from None


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

    def __init__(self, ctx: zmq.Context[zmq.Socket[bytes]], allowed: set[bytes],
                 names: Mapping[bytes, str] | None = None) -> None:
        """`names`: the principal of each allowed key (the ZAP User-Id its connections'
        messages carry, zmq property "User-Id"); a key without one: its Z85 text."""
        self._allow = _AllowList(allowed)
        self._names = dict(names or {})
        # Imported here: it brings asyncio (7 ms at start, quiet box), which no bus client needs.
        from zmq.auth.thread import ThreadAuthenticator
        self._auth = ThreadAuthenticator(ctx)
        self._auth.curve_user_id = self._user_id  # type: ignore[method-assign]
        self._auth.start()
        self._auth.configure_curve_callback("*", credentials_provider=self._allow)

    def _user_id(self, client_public_key: bytes) -> str:
        from zmq.utils import z85 as zmq_z85

        z85 = zmq_z85.encode(client_public_key)
        return self._names.get(z85) or z85.decode("ascii")

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


# The environment variables a client process (the CLI, a framework) takes its keys from;
# the same names as the services' options (services/shell/config.py).
SECRET_ENV = "OFFERBUS_CURVE_SECRET_KEY_FILE"
SERVER_ENV = "OFFERBUS_CURVE_SERVER_KEY_FILE"


def principal_from_env(environ: Mapping[str, str] | None = None) -> str | None:
    """The principal a client's key makes it at the master: the key's name (NAME of
    NAME.key_secret, whose public cert NAME.key is what the servers' curve_allowed_dir
    holds), or None when the client has no key."""
    env = os.environ if environ is None else environ
    secret = env.get(SECRET_ENV, "")
    return Path(secret).name.removesuffix(".key_secret") if secret else None


def client_from_env(environ: Mapping[str, str] | None = None) -> CurveClient | None:
    """A CurveClient from OFFERBUS_CURVE_SECRET_KEY_FILE and OFFERBUS_CURVE_SERVER_KEY_FILE,
    or None when neither is set; ValueError when only one is, or a file is bad."""
    env = os.environ if environ is None else environ
    secret, server = env.get(SECRET_ENV, ""), env.get(SERVER_ENV, "")
    if not secret and not server:
        return None
    if not secret or not server:
        raise ValueError(f"CURVE needs both {SECRET_ENV} and {SERVER_ENV} (one is unset)")
    return CurveClient(load_secret(Path(secret)), load_public_key(Path(server)))
