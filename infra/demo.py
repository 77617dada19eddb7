"""``make run`` until the Offerbus services exist: check that what a local cluster stands
on is up (ZooKeeper, the Docker engine, the local image), run one container, and say what
is coming.

    python -m infra.demo [--zk-dir .run/zk] [--zk HOST:PORT,...] [--image offerbus/busybox:latest]
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from infra.zookeeper import four_letter

DEFAULT_IMAGE = "offerbus/busybox:latest"
COMING = (
    ("master", "front door for agents and frameworks, registry in ZooKeeper, hot standbys"),
    ("allocator", "DRF / weighted DRF over roles, quotas, filters, suppress/revive"),
    ("offer-broker", "outstanding offers, timeouts, rescinds, ACCEPT validation"),
    ("agents", "one per machine: resources, executors, checkpointed status updates"),
    ("executors", "one per task: the container, health checks, kill with grace period"),
    ("offerbus CLI", "what runs where, why a task is pending, an offer's trace"),
    ("demo service", "a framework that runs a small service on this cluster"),
)


class Missing(Exception):
    """Something the local cluster needs is not there; the message says how to fix it."""


def check_zookeeper(hosts: str) -> list[str]:
    """Return one ``host:port (mode)`` line per server; raise Missing if none answers."""
    lines = []
    for host in hosts.split("/", 1)[0].split(","):
        _, _, port_text = host.rpartition(":")
        port = int(port_text)
        try:
            answer = four_letter(port, "ruok")
            srvr = four_letter(port, "srvr")
        except OSError as exc:
            raise Missing(
                f"ZooKeeper at {host} does not answer ({exc}); start it with `make zk-up`"
            ) from exc
        if answer != "imok":
            raise Missing(f"ZooKeeper at {host} answered {answer!r} to ruok instead of 'imok'")
        mode = next(
            (ln.split(":", 1)[1].strip() for ln in srvr.splitlines() if ln.startswith("Mode:")),
            "not serving",
        )
        version = next(
            (
                ln.split(":", 1)[1].strip().split("-")[0]
                for ln in srvr.splitlines()
                if ln.startswith("Zookeeper version:")
            ),
            "?",
        )
        lines.append(f"{host} ({mode}, ZooKeeper {version})")
    return lines


def check_docker(image: str) -> tuple[str, str, str, float]:
    """Ping the engine, run one container from ``image`` and remove it.

    Returns (engine version, image id, the container's output, seconds it took)."""
    import docker
    from docker.errors import DockerException, ImageNotFound

    try:
        client = docker.from_env(timeout=30)
        client.ping()
    except DockerException as exc:
        raise Missing(
            f"the Docker engine does not answer ({exc}); start it with `make engine`"
        ) from exc
    try:
        version = str(client.version().get("Version", "?"))
        try:
            image_id = str(client.images.get(image).id)
        except ImageNotFound as exc:
            raise Missing(f"image {image} is missing; build it with `make image`") from exc
        started = time.monotonic()
        container = client.containers.run(
            image,
            [
                "sh",
                "-c",
                'echo "hello from a container on $(hostname), busybox $(busybox | '
                'head -1 | cut -d" " -f2)"',
            ],
            detach=True,
            labels={"org.offerbus.demo": "1"},
        )
        try:
            status = container.wait(timeout=30)
            output = container.logs().decode(errors="replace").strip()
        finally:
            container.remove(force=True)
        elapsed = time.monotonic() - started
        if status.get("StatusCode") != 0:
            raise Missing(f"the demo container exited with {status}: {output}")
        return version, image_id, output, elapsed
    finally:
        client.close()


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m infra.demo", description=__doc__)
    parser.add_argument(
        "--zk-dir",
        type=Path,
        default=Path(".run/zk"),
        help="where `make zk-up` left ZooKeeper (its hosts file)",
    )
    parser.add_argument("--zk", help="ZooKeeper connection string (default: from --zk-dir)")
    parser.add_argument("--image", default=DEFAULT_IMAGE)
    args = parser.parse_args(argv)

    hosts: str | None = args.zk
    hosts_file = args.zk_dir / "hosts"
    if hosts is None:
        try:
            hosts = hosts_file.read_text().strip()
        except OSError:
            print(
                f"offerbus: no ZooKeeper found ({hosts_file} is missing); "
                "start one with `make zk-up`",
                file=sys.stderr,
            )
            return 1

    try:
        zk_lines = check_zookeeper(hosts)
        engine, image_id, output, elapsed = check_docker(args.image)
    except Missing as exc:
        print(f"offerbus: {exc}", file=sys.stderr)
        return 1

    print("Offerbus local cluster: the ground floor is up.\n")
    print("Up now")
    for line in zk_lines:
        print(f"  ZooKeeper      {line}   (connect string: {hosts})")
    print(f"  Docker engine  {engine}")
    print(f"  Image          {args.image}  {image_id[:19]}")
    print(f"  A container    ran and was removed in {elapsed:.2f}s, and said:")
    print(f"                 {output}")
    print("\nComing in later issues")
    width = max(len(name) for name, _ in COMING)
    for name, what in COMING:
        print(f"  {name:<{width}}  {what}")
    print("\nStop it with `make zk-down` (ZooKeeper; the Docker engine stays up for other work).")
    return 0


if __name__ == "__main__":
    sys.exit(main())
