"""What DRF should give, computed independently of the allocator: progressive filling over
task shapes (Ghodsi et al., NSDI 2011), shared by the core tests and the live ones."""

from __future__ import annotations

from services.resources import Resources

GB = 1024.0
# The DRF paper's worked example: one agent of 9 CPUs and 18 GB; A runs <1 CPU, 4 GB>
# tasks, B <3 CPUs, 1 GB>; DRF gives A 3 tasks and B 2.
PAPER_AGENT = Resources.of(cpus=9, mem=18 * GB)
A_TASK = Resources.of(cpus=1, mem=4 * GB)
B_TASK = Resources.of(cpus=3, mem=1 * GB)


def progressive_filling(total: Resources, fws: dict[str, tuple[Resources, float]]
                        ) -> dict[str, int]:
    """Tasks per framework ({name: (task, weight)}): repeatedly one task to the framework
    with the lowest weighted dominant share whose task still fits (ties: by name)."""
    counts = dict.fromkeys(fws, 0)
    free = total
    names = [n for n in ("cpus", "mem", "disk", "gpus") if total.scalar(n)]

    def key(f: str) -> float:
        task, w = fws[f]
        return max(counts[f] * task.scalar(n) / total.scalar(n) for n in names) / w

    while True:
        fits = [f for f in fws if free.contains(fws[f][0])]
        if not fits:
            return counts
        f = min(fits, key=lambda f: (key(f), f))
        counts[f] += 1
        free -= fws[f][0]
