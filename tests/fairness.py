"""The DRF paper's worked example, and what DRF gives (bench/drf.py's independent
progressive filling, on one pool of resources), shared by the core tests and the live ones."""

from __future__ import annotations

from bench import drf
from services.resources import Resources

GB = 1024.0
# The DRF paper's worked example: one agent of 9 CPUs and 18 GB; A runs <1 CPU, 4 GB>
# tasks, B <3 CPUs, 1 GB>; DRF gives A 3 tasks and B 2.
PAPER_AGENT = Resources.of(cpus=9, mem=18 * GB)
A_TASK = Resources.of(cpus=1, mem=4 * GB)
B_TASK = Resources.of(cpus=3, mem=1 * GB)


def progressive_filling(total: Resources, fws: dict[str, tuple[Resources, float]]
                        ) -> dict[str, int]:
    """Tasks per framework ({name: (task, weight)}) on one agent of `total`."""
    return drf.progressive_filling({"agent": total}, fws)
