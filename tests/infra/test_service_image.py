"""The service image (infra/Dockerfile) builds from local layers only, with infra/
build-service-image.sh, and runs every role: the role's own --help (so its imports work in
the image), a configuration error as exit 2 naming the value, an unknown role refused."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from infra.rollout import REPO

pytestmark = [pytest.mark.integration,
              pytest.mark.skipif(shutil.which("docker") is None, reason="no docker command")]


def _docker(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["docker", *args], capture_output=True, text=True, timeout=timeout,
                          check=False)


@pytest.fixture(scope="module")
def image() -> Iterator[str]:
    if _docker("info", timeout=20).returncode != 0:
        pytest.skip("the Docker engine does not answer")
    suffix = uuid.uuid4().hex[:8]
    tag, base = f"offerbus/service:test-{suffix}", f"offerbus/python-base:test-{suffix}"
    env = dict(os.environ, OFFERBUS_PYTHON=sys.executable, OFFERBUS_BASE_IMAGE=base)
    try:
        done = subprocess.run([str(REPO / "infra/build-service-image.sh"), tag], env=env,
                              capture_output=True, text=True, timeout=600, check=False)
        assert done.returncode == 0, done.stderr
        yield tag
    finally:
        _docker("image", "rm", "-f", tag, base)


@pytest.mark.parametrize("role", ["master", "allocator", "broker", "jobs", "agent"])
def test_every_role_runs_in_the_image(image: str, role: str) -> None:
    done = _docker("run", "--rm", image, role, "--help")
    assert done.returncode == 0, done.stderr
    assert f"offerbus-{role}" in done.stdout and "--config FILE" in done.stdout


def test_a_bad_configuration_exits_2_with_its_reason(image: str, tmp_path: Path) -> None:
    (tmp_path / "offerbus.toml").write_text('cluster = "zk://10.0.0.1:2181/o"\n'
                                            "[broker]\noffer_timeout = -1\n")
    tmp_path.chmod(0o755)
    (tmp_path / "offerbus.toml").chmod(0o644)
    done = _docker("run", "--rm", "-v", f"{tmp_path}:/etc/offerbus:ro", image, "broker",
                   "--config", "/etc/offerbus/offerbus.toml")
    assert done.returncode == 2, (done.stdout, done.stderr)
    assert "offer_timeout" in done.stderr and "must be >= 0" in done.stderr


def test_the_cli_role_and_an_unknown_role(image: str) -> None:
    assert _docker("run", "--rm", image, "cli", "--help").stdout.startswith("usage:")
    done = _docker("run", "--rm", image, "frontend")
    assert done.returncode == 64 and "the first argument is the role" in done.stderr
