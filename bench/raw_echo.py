"""The in-run peer for the bus benchmark: a bare pyzmq ROUTER echo (no envelope, no codec,
no heartbeats), so the bench reports what the bus adds over raw ZeroMQ."""

from __future__ import annotations

import sys

import zmq


def main() -> None:
    reply_every = int(sys.argv[1]) if len(sys.argv) > 1 else 1
    ctx = zmq.Context()
    sock = ctx.socket(zmq.ROUTER)
    sock.setsockopt(zmq.RCVHWM, 100_000)
    sock.setsockopt(zmq.SNDHWM, 100_000)
    sock.bind("tcp://127.0.0.1:*")
    print(sock.getsockopt_string(zmq.LAST_ENDPOINT), flush=True)
    n = 0
    while True:
        peer, frame = sock.recv_multipart()
        n += 1
        if n % reply_every == 0:
            sock.send_multipart([peer, frame])


if __name__ == "__main__":
    main()
