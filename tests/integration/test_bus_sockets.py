"""The bus on real ZeroMQ sockets and a separate server process: bad frames are answered
and counted while the service goes on; heartbeats detect loss both ways and the client
reconnects; stale epochs are fenced; CURVE refuses unknown keys."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import zmq

from services.bus import codec
from services.bus.curve import CurveAuthority, CurveClient, CurveServer, KeyPair
from services.bus.election import LeaderInfo
from services.bus.epoch import EpochFence
from services.bus.peer import DealerClient, HeartbeatConfig, RouterServer, Sender
from services.bus.reactor import Reactor

AGENT = codec.Role.Value("ROLE_AGENT")
MASTER = codec.Role.Value("ROLE_MASTER")
FRAME_LIMIT = 64 * 1024


class EchoProcess:
    def __init__(self, *args: str) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "services.bus.echo", "--heartbeat", "0.1",
             "--frame-limit", str(FRAME_LIMIT), *args],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )
        assert self.proc.stdout is not None
        self.endpoint = self.proc.stdout.readline().strip()
        if not self.endpoint.startswith("tcp://"):
            err = self.proc.stderr.read() if self.proc.stderr else ""
            raise AssertionError(f"echo server did not start: {err}")

    def stop(self) -> dict[str, int]:
        """SIGTERM; returns the counters the process printed on its way out."""
        os.kill(self.proc.pid, signal.SIGCONT)
        self.proc.terminate()
        _, err = self.proc.communicate(timeout=10)
        line = next(ln for ln in err.splitlines() if ln.startswith("stats "))
        return {k: int(v) for k, v in (kv.rsplit("=", 1) for kv in line.split()[1:])}


@pytest.fixture
def echo() -> Iterator[EchoProcess]:
    proc = EchoProcess()
    yield proc
    if proc.proc.poll() is None:
        proc.proc.kill()
        proc.proc.wait()


@pytest.fixture
def ctx() -> Iterator[zmq.Context[zmq.Socket[bytes]]]:
    context: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
    yield context
    context.destroy(linger=0)


def envelope(role: int = AGENT, epoch: int = 0, **payload: str) -> codec.Envelope:
    env = codec.Envelope(version=codec.PROTOCOL_VERSION, message_id=os.urandom(4).hex(),
                         sender_id="test", sender_role=role, epoch=epoch)  # type: ignore[arg-type]
    env.snapshot_request.prefix = payload.get("prefix", "hello")
    return env


def ask(sock: zmq.Socket[bytes], *frames: bytes, timeout_ms: int = 3000) -> codec.Envelope:
    sock.send_multipart(list(frames))
    while True:
        assert sock.poll(timeout_ms), "no reply before the deadline"
        reply = codec.Envelope.FromString(sock.recv())
        if reply.WhichOneof("payload") != "heartbeat":
            return reply


BAD_FRAMES = {
    "garbage": ([b"\xde\xad\xbe\xef" * 8], "MALFORMED_FRAME"),
    "empty": ([b""], "MALFORMED_FRAME"),
    "truncated": ([envelope().SerializeToString()[:-3]], "MALFORMED_FRAME"),
    "two frames": ([envelope().SerializeToString()] * 2, "MALFORMED_FRAME"),
    "oversized": ([envelope(prefix="x" * (FRAME_LIMIT + 1)).SerializeToString()],
                  "FRAME_TOO_LARGE"),
}


def test_bad_frames_are_answered_counted_and_the_service_goes_on(
    echo: EchoProcess, ctx: zmq.Context[zmq.Socket[bytes]]
) -> None:
    sock = ctx.socket(zmq.DEALER)
    sock.connect(echo.endpoint)
    for name, (frames, code) in BAD_FRAMES.items():
        reply = ask(sock, *frames)
        assert reply.WhichOneof("payload") == "error", name
        assert codec.ErrorCode.Name(reply.error.code) == code, (name, reply.error.message)
    wrong = envelope()
    wrong.version = 99
    reply = ask(sock, wrong.SerializeToString())
    assert codec.ErrorCode.Name(reply.error.code) == "UNSUPPORTED_VERSION"
    assert reply.in_reply_to == wrong.message_id
    # Still serving, and correctly:
    good = envelope(prefix="still here")
    reply = ask(sock, good.SerializeToString())
    assert reply.snapshot_request.prefix == "still here" and reply.in_reply_to == good.message_id
    assert echo.proc.poll() is None
    stats = echo.stop()
    assert stats["frames_dropped{reason=malformed}"] == 4
    assert stats["frames_dropped{reason=too_large}"] == 1
    assert stats["frames_dropped{reason=unsupported_version}"] == 1


def test_client_detects_a_frozen_server_and_reconnects_when_it_returns(
    echo: EchoProcess, ctx: zmq.Context[zmq.Socket[bytes]]
) -> None:
    reactor = Reactor()
    events: list[str] = []
    replies: list[codec.Envelope] = []
    client = DealerClient(
        reactor, ctx, Sender("agent-1", AGENT), replies.append,
        on_connected=lambda: events.append("connected"), on_gone=lambda: events.append("gone"),
        heartbeat=HeartbeatConfig(interval=0.1, max_missed=3),
    )
    client.connect(echo.endpoint)
    assert reactor.run(until=lambda: events == ["connected"], timeout=5)
    os.kill(echo.proc.pid, signal.SIGSTOP)  # a paused server: TCP stays up, beats stop
    start = reactor.now()
    assert reactor.run(until=lambda: events[-1:] == ["gone"], timeout=5)
    detected = reactor.now() - start
    assert 0.25 <= detected <= 1.5, detected  # 3 missed 0.1 s beats, not before
    os.kill(echo.proc.pid, signal.SIGCONT)
    assert reactor.run(until=lambda: events[-1:] == ["connected"], timeout=5)
    client.send(envelope(prefix="after"))
    assert reactor.run(until=lambda: any(r.snapshot_request.prefix == "after" for r in replies),
                       timeout=5)
    client.close()


def test_server_reports_a_silent_client_gone(ctx: zmq.Context[zmq.Socket[bytes]]) -> None:
    reactor = Reactor()
    gone: list[bytes] = []
    server = RouterServer(reactor, ctx, "tcp://127.0.0.1:*", Sender("master-1", MASTER),
                          lambda p, e: None, on_peer_gone=gone.append,
                          heartbeat=HeartbeatConfig(interval=0.1, max_missed=3))
    raw = ctx.socket(zmq.DEALER)
    raw.setsockopt(zmq.ROUTING_ID, b"agent-9")
    raw.connect(server.endpoint)
    hello = envelope()
    hello.heartbeat.interval_ms = 100
    raw.send(hello.SerializeToString())  # then never again: the agent "died"
    assert reactor.run(until=lambda: b"agent-9" in server.peers.peers, timeout=5)
    assert reactor.run(until=lambda: gone == [b"agent-9"], timeout=5)
    assert server.stats.get("peers_lost") == 1
    server.close()


@pytest.mark.parametrize(("server_s", "client_s"), [(0.1, 0.5), (0.5, 0.1)])
def test_peers_with_different_heartbeat_intervals_do_not_drop_each_other(
    ctx: zmq.Context[zmq.Socket[bytes]], server_s: float, client_s: float
) -> None:
    """Each side judges the other by the longer of the two intervals (the heartbeats say
    theirs): before, the side with the shorter one declared its peer gone after 5 of its
    own intervals and re-made the connection, again and again."""
    reactor = Reactor()
    server_lost: list[bytes] = []
    client_events: list[str] = []
    server = RouterServer(reactor, ctx, "tcp://127.0.0.1:*", Sender("master-1", MASTER),
                          lambda p, e: None, on_peer_gone=server_lost.append,
                          heartbeat=HeartbeatConfig(interval=server_s, max_missed=3))
    client = DealerClient(
        reactor, ctx, Sender("agent-1", AGENT), lambda e: None,
        on_connected=lambda: client_events.append("connected"),
        on_gone=lambda: client_events.append("gone"),
        heartbeat=HeartbeatConfig(interval=client_s, max_missed=3))
    client.connect(server.endpoint)
    assert reactor.run(until=lambda: client_events == ["connected"], timeout=5)
    # Ten of the shorter side's patience windows: before, each of them lost its peer.
    flapped = reactor.run(until=lambda: bool(server_lost) or "gone" in client_events,
                          timeout=10 * 3 * min(server_s, client_s) + 1.5)
    assert not flapped, (server_lost, client_events)
    assert server.stats.get("peers_lost") == 0 and client.stats.get("peers_lost") == 0
    client.close()
    server.close()


def test_stale_epoch_messages_are_dropped_and_answered(
    ctx: zmq.Context[zmq.Socket[bytes]]
) -> None:
    reactor = Reactor()
    delivered: list[codec.Envelope] = []
    fence = EpochFence(frozenset({MASTER}))
    fence.follow(MASTER, LeaderInfo("master", "test", 8, {}))  # what the detector says
    server = RouterServer(reactor, ctx, "tcp://127.0.0.1:*", Sender("broker-1", 3),
                          lambda p, e: delivered.append(e), fence=fence)
    new_master = ctx.socket(zmq.DEALER)
    old_master = ctx.socket(zmq.DEALER)
    for s in (new_master, old_master):
        s.connect(server.endpoint)
    new_master.send(envelope(MASTER, epoch=8, prefix="from 8").SerializeToString())
    assert reactor.run(until=lambda: len(delivered) == 1, timeout=5)
    old_master.send(envelope(MASTER, epoch=7, prefix="from 7").SerializeToString())
    assert reactor.run(until=lambda: server.stats.get("frames_dropped{reason=stale_epoch}") == 1,
                       timeout=5)
    assert old_master.poll(3000)
    reply = codec.Envelope.FromString(old_master.recv())
    while reply.WhichOneof("payload") == "heartbeat":
        assert old_master.poll(3000)
        reply = codec.Envelope.FromString(old_master.recv())
    assert codec.ErrorCode.Name(reply.error.code) == "STALE_EPOCH"
    assert [e.snapshot_request.prefix for e in delivered] == ["from 8"]
    server.close()


def test_curve_refuses_a_client_with_the_wrong_key(
    tmp_path: Path, ctx: zmq.Context[zmq.Socket[bytes]]
) -> None:
    server_keys, good, bad = KeyPair.generate(), KeyPair.generate(), KeyPair.generate()
    server_keys.save(tmp_path / "server", "server")
    good.save(tmp_path / "clients", "framework-a")
    proc = EchoProcess("--curve-keys", str(tmp_path / "server" / "server.key_secret"),
                       "--curve-clients", str(tmp_path / "clients"))
    try:
        reactor = Reactor()
        got: dict[str, list[codec.Envelope]] = {"good": [], "bad": []}
        clients = {
            name: DealerClient(reactor, ctx, Sender(name, AGENT), got[name].append,
                               curve=CurveClient(keys, server_keys.public),
                               heartbeat=HeartbeatConfig(interval=0.1))
            for name, keys in (("good", good), ("bad", bad))
        }
        for client in clients.values():
            client.connect(proc.endpoint)
            client.send(envelope(prefix="secret"))
        assert reactor.run(until=lambda: bool(got["good"]), timeout=5)
        assert got["good"][0].snapshot_request.prefix == "secret"
        # The refused client stays unconnected however long we give it.
        assert not reactor.run(until=lambda: bool(got["bad"]) or clients["bad"].connected,
                               timeout=1.5)
        plain = ctx.socket(zmq.DEALER)  # no CURVE at all
        try:
            plain.connect(proc.endpoint)
            plain.send(envelope().SerializeToString())
            assert not plain.poll(1000)
        finally:
            # Its message can never leave: closed with the default linger (as its garbage
            # collection would), the context's term would wait for it forever (seen once
            # as a 120 s teardown timeout; pyzmq issue 1407).
            plain.close(linger=0)
        for client in clients.values():
            client.close()
    finally:
        stats = proc.stop()
    assert stats["frames_received"] >= 2  # the good client's heartbeat and message
    assert "frames_dropped{reason=malformed}" not in stats


def test_curve_authority_counts_refusals(ctx: zmq.Context[zmq.Socket[bytes]]) -> None:
    server_keys, good, bad = KeyPair.generate(), KeyPair.generate(), KeyPair.generate()
    authority = CurveAuthority(ctx, {good.public})
    try:
        reactor = Reactor()
        delivered: list[codec.Envelope] = []
        server = RouterServer(reactor, ctx, "tcp://127.0.0.1:*", Sender("m", MASTER),
                              lambda p, e: delivered.append(e), curve=CurveServer(server_keys))
        client_ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
        intruder = client_ctx.socket(zmq.DEALER)
        CurveClient(bad, server_keys.public).apply(intruder)
        intruder.connect(server.endpoint)
        intruder.send(envelope().SerializeToString())
        assert reactor.run(until=lambda: authority.refused >= 1, timeout=5)
        assert not delivered
        server.close()
        intruder.close(linger=0)
        client_ctx.destroy(linger=0)
    finally:
        authority.stop()
