"""The root filesystem of the local base image offerbus/python-base (no image registry is
reachable, so nothing can be pulled): this machine's Python (its prefix, without its tests
and site-packages, at the same path), the distributions Offerbus needs at run time (the
closure of pyproject's dependencies, from the running interpreter's environment), the shared
libraries all of them link to (from ldd), Debian's static busybox for a shell, and a minimal
/etc. `python -m infra.image_rootfs DIR` fills DIR; infra/build-service-image.sh imports it
and builds infra/Dockerfile on it."""

from __future__ import annotations

import argparse
import re
import shutil
import subprocess
import sys
import sysconfig
import tomllib
from importlib import metadata
from pathlib import Path

from packaging.requirements import Requirement

REPO = Path(__file__).resolve().parent.parent
BUSYBOX = Path("/bin/busybox")
STDLIB_SKIP = {"test", "site-packages", "idlelib", "tkinter", "turtledemo", "ensurepip",
               "lib2to3", "__pycache__"}


def runtime_distributions() -> list[metadata.Distribution]:
    """pyproject's dependencies and theirs (extras and markers that do not apply left out)."""
    doc = tomllib.loads((REPO / "pyproject.toml").read_text())
    todo = [Requirement(r) for r in doc["project"]["dependencies"]]
    seen: dict[str, metadata.Distribution] = {}
    while todo:
        req = todo.pop()
        if req.marker is not None and not req.marker.evaluate({"extra": ""}):
            continue
        key = re.sub(r"[-_.]+", "-", req.name).lower()
        if key in seen:
            continue
        dist = metadata.distribution(req.name)
        seen[key] = dist
        todo += [Requirement(r) for r in dist.requires or ()]
    return list(seen.values())


def _copy(src: Path, root: Path) -> None:
    dest = root / src.relative_to("/")
    if dest.exists() or dest.is_symlink():
        return
    dest.parent.mkdir(parents=True, exist_ok=True)
    if src.is_symlink():
        target = src.readlink()
        dest.symlink_to(target)
        _copy((src.parent / target).resolve(), root)
    else:
        shutil.copy2(src, dest)


def _libraries(binary: Path) -> set[Path]:
    done = subprocess.run(["ldd", str(binary)], capture_output=True, text=True, check=False)
    return {Path(m) for m in re.findall(r"(/\S+) \(0x", done.stdout)}


def build(root: Path) -> None:
    for top in ("lib", "lib64", "sbin"):  # a merged /usr (Debian 12): mirror its symlinks
        if Path("/", top).is_symlink():
            (root / "usr" / top).mkdir(parents=True, exist_ok=True)
            (root / top).symlink_to(Path("/", top).readlink())
    prefix = Path(sys.base_prefix)
    version = f"python{sys.version_info.major}.{sys.version_info.minor}"
    stdlib = prefix / "lib" / version
    for path in stdlib.rglob("*"):
        parts = set(path.relative_to(stdlib).parts)
        if path.is_file() and not parts & STDLIB_SKIP:
            _copy(path, root)
    for path in [*prefix.glob("bin/python3*"), *prefix.glob("lib/libpython3*")]:
        _copy(path, root)
    site = root / Path(sysconfig.get_paths()["purelib"].replace(sys.prefix, sys.base_prefix,
                                                                1)).relative_to("/")
    base = Path(sysconfig.get_paths()["purelib"])
    for dist in runtime_distributions():
        for file in dist.files or ():
            src = Path(str(dist.locate_file(file))).resolve()
            if src.is_file() and "__pycache__" not in src.parts and src.is_relative_to(base):
                dest = site / src.relative_to(base)
                dest.parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(src, dest)
    binaries = [Path(sys.executable).resolve(), *root.rglob("*.so*")]
    for binary in binaries:
        for lib in _libraries(binary):
            if not lib.is_relative_to(root):
                _copy(lib, root)
    python = root / prefix.relative_to("/") / "bin" / version
    (root / "usr/local/bin").mkdir(parents=True, exist_ok=True)
    for name in ("python", "python3"):
        (root / "usr/local/bin" / name).symlink_to(Path("/") / python.relative_to(root))
    (root / "bin").mkdir(exist_ok=True)
    shutil.copy2(BUSYBOX, root / "bin/busybox")
    for applet in ("sh", "env", "cat", "ls", "ps", "wget"):
        (root / "bin" / applet).symlink_to("busybox")
    etc = root / "etc"
    etc.mkdir(exist_ok=True)
    (etc / "passwd").write_text("root:x:0:0:root:/root:/bin/sh\n"
                                "offerbus:x:999:999:offerbus:/var/lib/offerbus:/bin/false\n")
    (etc / "group").write_text("root:x:0:\nofferbus:x:999:\n")
    (etc / "nsswitch.conf").write_text("hosts: files dns\n")
    for directory in ("tmp", "root", "var/lib/offerbus", "etc/offerbus", "proc", "sys", "dev"):
        (root / directory).mkdir(parents=True, exist_ok=True)
    (root / "tmp").chmod(0o1777)


def main() -> int:
    ap = argparse.ArgumentParser(prog="python -m infra.image_rootfs", description=__doc__)
    ap.add_argument("dir", help="an empty directory to fill")
    root = Path(ap.parse_args().dir)
    build(root)
    print(f"image_rootfs: {sum(1 for _ in root.rglob('*'))} entries in {root}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
