"""`python -m services.bus.echo`: a minimal bus service that answers every message with its
own payload. It is the live peer for the bus's integration tests and `make bench`."""

from __future__ import annotations

import argparse
import signal
import sys
from pathlib import Path
from types import FrameType

import zmq

from services.bus import codec, log
from services.bus.curve import CurveAuthority, CurveServer, KeyPair, load_public_keys
from services.bus.peer import HeartbeatConfig, RouterServer, Sender
from services.bus.reactor import Reactor


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--bind", default="tcp://127.0.0.1:*")
    ap.add_argument("--heartbeat", type=float, default=1.0, help="beat interval, seconds")
    ap.add_argument("--frame-limit", type=int, default=codec.DEFAULT_FRAME_LIMIT)
    ap.add_argument("--reply-every", type=int, default=1,
                    help="answer only every Nth message (measures one-way throughput)")
    ap.add_argument("--curve-keys", type=Path, help="server key pair (a .key_secret file)")
    ap.add_argument("--curve-clients", type=Path, help="folder of allowed client *.key files")
    args = ap.parse_args(argv)
    log.configure("echo")
    ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
    curve = None
    if args.curve_keys:
        CurveAuthority(ctx, load_public_keys(args.curve_clients) if args.curve_clients else set())
        curve = CurveServer(KeyPair.load(args.curve_keys))
    reactor = Reactor()
    server: RouterServer
    received = 0

    def on_message(peer: bytes, env: codec.Envelope) -> None:
        nonlocal received
        received += 1
        if received % args.reply_every:
            return
        reply = codec.Envelope(in_reply_to=env.message_id)
        getattr(reply, codec.payload_kind(env)).CopyFrom(getattr(env, codec.payload_kind(env)))
        server.send(peer, reply)

    server = RouterServer(reactor, ctx, args.bind, Sender("echo", codec.Role.Value("ROLE_CLI")),
                          on_message, heartbeat=HeartbeatConfig(args.heartbeat),
                          frame_limit=args.frame_limit, curve=curve, name="echo")

    def stop(signum: int, frame: FrameType | None) -> None:
        reactor.stop()

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    print(server.endpoint, flush=True)  # the parent reads the bound endpoint from here
    reactor.run()
    server.close()
    print("stats " + " ".join(f"{k}={v}" for k, v in sorted(server.stats.snapshot().items())),
          file=sys.stderr, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
