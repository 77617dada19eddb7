"""Bus budget: envelope encode+decode cost, ROUTER/DEALER round trip and one-way throughput
to a separate server process, each beside raw pyzmq/protobuf measured in the same run."""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Callable
from typing import Any

import zmq

from bench.report import progress, summary, write
from services.bus import codec
from services.bus.peer import DealerClient, HeartbeatConfig, Sender
from services.bus.reactor import Reactor

AGENT = codec.Role.Value("ROLE_AGENT")
REPEATS = 3


def _small() -> codec.Envelope:
    env = codec.Envelope()
    env.heartbeat.interval_ms = 1000
    return Sender("agent-1", AGENT).stamp(env)


def _batch(n: int = 100) -> codec.Envelope:
    env = codec.Envelope()
    for i in range(n):
        e = env.state_delta.entries.add(key=f"task/{i:06d}")
        e.value.task.framework_id = f"framework-{i % 7}"
    env.state_delta.seq = 1
    return Sender("master-1", codec.Role.Value("ROLE_MASTER"), epoch=3).stamp(env)


def _per_op(fn: Callable[[], object], n: int) -> float:
    for _ in range(n // 5):  # warm up caches and the allocator before timing
        fn()
    best = float("inf")
    for _ in range(2 * REPEATS):
        t = time.perf_counter()
        for _ in range(n):
            fn()
        best = min(best, (time.perf_counter() - t) / n)
    return best * 1e6  # microseconds


def codec_cost() -> dict[str, Any]:
    out = {}
    for name, env, n in (("heartbeat", _small(), 50_000), ("delta_100_entries", _batch(), 2_000)):
        frame = codec.encode(env)
        def raw_round(env: codec.Envelope = env) -> object:
            return codec.Envelope.FromString(env.SerializeToString())

        def our_round(env: codec.Envelope = env) -> object:
            return codec.decode(codec.encode(env))

        raw = _per_op(raw_round, n)
        ours = _per_op(our_round, n)
        out[name] = {"bytes": len(frame), "codec_us": ours, "raw_protobuf_us": raw,
                     "ratio": ours / raw}
        progress(f"codec {name}: {ours:.2f} us vs raw protobuf {raw:.2f} us")
    return out


def _spawn(args: list[str]) -> tuple[subprocess.Popen[str], str]:
    proc = subprocess.Popen([sys.executable, *args], stdout=subprocess.PIPE, text=True,
                            stderr=subprocess.DEVNULL)
    assert proc.stdout is not None
    return proc, proc.stdout.readline().strip()


def _bus_round_trips(endpoint: str, n: int) -> list[float]:
    ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
    reactor = Reactor()
    replies: list[codec.Envelope] = []
    client = DealerClient(reactor, ctx, Sender("bench", AGENT), replies.append,
                          heartbeat=HeartbeatConfig(interval=1.0))
    client.connect(endpoint)
    reactor.run(until=lambda: client.connected, timeout=10)
    samples = []
    for i in range(n):
        env = codec.Envelope()
        env.snapshot_request.prefix = str(i)
        t = time.perf_counter()
        client.send(env)
        reactor.run(until=lambda: bool(replies), timeout=10)
        samples.append(time.perf_counter() - t)
        replies.clear()
    client.close()
    ctx.destroy(linger=0)
    return samples


def _raw_round_trips(endpoint: str, n: int) -> list[float]:
    ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
    sock = ctx.socket(zmq.DEALER)
    sock.connect(endpoint)
    frame = codec.encode(_small())
    sock.send(frame)
    sock.recv()
    samples = []
    for _ in range(n):
        t = time.perf_counter()
        sock.send(frame)
        sock.recv()
        samples.append(time.perf_counter() - t)
    ctx.destroy(linger=0)
    return samples


def _bus_one_way(endpoint: str, n: int) -> float:
    ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
    reactor = Reactor()
    replies: list[codec.Envelope] = []
    client = DealerClient(reactor, ctx, Sender("bench", AGENT), replies.append)
    client.connect(endpoint)
    reactor.run(until=lambda: client.connected, timeout=10)
    t = time.perf_counter()
    for i in range(n):
        env = codec.Envelope()
        env.snapshot_request.prefix = str(i)
        client.send(env)
    reactor.run(until=lambda: bool(replies), timeout=60)
    elapsed = time.perf_counter() - t
    assert replies, "the sink never confirmed the last message"
    client.close()
    ctx.destroy(linger=0)
    return n / elapsed


def _raw_one_way(endpoint: str, n: int) -> float:
    ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
    sock = ctx.socket(zmq.DEALER)
    sock.setsockopt(zmq.SNDHWM, 100_000)
    sock.connect(endpoint)
    frame = codec.encode(_small())
    t = time.perf_counter()
    for _ in range(n):
        sock.send(frame)
    assert sock.poll(60_000)
    sock.recv()
    elapsed = time.perf_counter() - t
    ctx.destroy(linger=0)
    return n / elapsed


def transport(n_rt: int = 3000, n_oneway: int = 50_000) -> dict[str, Any]:
    out: dict[str, Any] = {}
    servers = {
        "bus": ["-m", "services.bus.echo"],
        "raw_zmq": ["-m", "bench.raw_echo"],
    }
    rt_fns = {"bus": _bus_round_trips, "raw_zmq": _raw_round_trips}
    for name, args in servers.items():
        proc, endpoint = _spawn(args)
        try:
            samples = []
            for r in range(REPEATS):
                samples += rt_fns[name](endpoint, n_rt)
                progress(f"round trip {name}: run {r + 1}/{REPEATS}")
            out[f"round_trip_us_{name}"] = {k: v * 1e6 if k != "n" else v
                                            for k, v in summary(samples).items()}
        finally:
            proc.terminate()
            proc.wait()
    ow_fns = {"bus": (_bus_one_way, ["-m", "services.bus.echo", "--reply-every"]),
              "raw_zmq": (_raw_one_way, ["-m", "bench.raw_echo"])}
    for name, (fn, args) in ow_fns.items():
        rates = []
        for r in range(REPEATS):
            proc, endpoint = _spawn([*args, str(n_oneway)])
            try:
                rates.append(fn(endpoint, n_oneway))
            finally:
                proc.terminate()
                proc.wait()
            progress(f"one-way {name}: run {r + 1}/{REPEATS}: {rates[-1]:,.0f} msg/s")
        out[f"one_way_msgs_per_s_{name}"] = {"min": min(rates), "median": sorted(rates)[1],
                                             "max": max(rates)}
    return out


def main() -> None:
    print("bench bus: envelope codec, ROUTER/DEALER round trip and one-way throughput")
    results: dict[str, Any] = {"codec": codec_cost(), **transport()}
    rt_bus, rt_raw = results["round_trip_us_bus"], results["round_trip_us_raw_zmq"]
    ow_bus = results["one_way_msgs_per_s_bus"]["median"]
    ow_raw = results["one_way_msgs_per_s_raw_zmq"]["median"]
    results["ratios"] = {"round_trip_p50_bus_over_raw": rt_bus["p50"] / rt_raw["p50"],
                         "one_way_raw_over_bus": ow_raw / ow_bus}
    print(f"{'':24}{'offerbus bus':>16}{'raw pyzmq':>14}{'ratio':>8}")
    for name, c in results["codec"].items():
        print(f"{'encode+decode ' + name:24}{c['codec_us']:>13.2f} us{c['raw_protobuf_us']:>11.2f}"
              f" us{c['ratio']:>7.2f}x   ({c['bytes']} B)")
    print(f"{'round trip p50':24}{rt_bus['p50']:>13.1f} us{rt_raw['p50']:>11.1f} us"
          f"{rt_bus['p50'] / rt_raw['p50']:>7.2f}x")
    print(f"{'round trip p99':24}{rt_bus['p99']:>13.1f} us{rt_raw['p99']:>11.1f} us"
          f"{rt_bus['p99'] / rt_raw['p99']:>7.2f}x")
    print(f"{'one-way throughput':24}{ow_bus:>11,.0f} msg/s{ow_raw:>9,.0f} msg/s"
          f"{ow_raw / ow_bus:>7.2f}x")
    print(f"results: {write('bus', results)}")


if __name__ == "__main__":
    main()
