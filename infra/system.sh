#!/usr/bin/env bash
# Install the Debian packages Offerbus needs on a fresh Debian 12 machine (run as root).
#
# Idempotent: when every package is already installed it does not touch apt at all
# (no `apt-get update`), so `make test` stays fast on a machine that has them.
# It never starts or enables Debian's own zookeeper or docker services: infra/zookeeper.py
# runs ZooKeeper with our own config and infra/docker-engine.sh starts dockerd.
set -euo pipefail

# package -> why
packages=(
  zookeeper        # real ZooKeeper 3.8 (jars under /usr/share/java), run by infra/zookeeper.py
  docker.io        # dockerd + docker CLI, the agents' container runtime
  busybox-static   # the rootfs of the local test image (nothing can be pulled)
  netcat-openbsd   # nc, for poking at ports by hand
  iproute2         # ip netns / veth for multi-host tests
  iptables         # partitions between those hosts (and dockerd's networking)
  prometheus       # promtool, which checks every service's /metrics in the tests
  chromium         # headless browser: the dashboard test loads the master's page in it
)

is_installed() {
  [[ "$(dpkg-query -W -f='${Status}' "$1" 2>/dev/null || true)" == "install ok installed" ]]
}

missing=()
for pkg in "${packages[@]}"; do
  is_installed "$pkg" || missing+=("$pkg")
done

# The venv needs `python3 -m venv` with ensurepip; Debian's python3 has it only with
# python3-venv (a pyenv or upstream Python has it built in).
if ! python3 -m venv --help >/dev/null 2>&1 || ! python3 -c 'import ensurepip' >/dev/null 2>&1; then
  is_installed python3-venv || missing+=(python3-venv)
fi

if [[ ${#missing[@]} -eq 0 ]]; then
  echo "system: all Debian packages present (${packages[*]}); apt not run"
  exit 0
fi

if [[ $(id -u) -ne 0 ]]; then
  echo "system: missing Debian packages: ${missing[*]}; run as root to install them" >&2
  exit 1
fi

# Keep package maintainer scripts from starting services (docker.io would otherwise try to
# start dockerd through invoke-rc.d). Docker-built images ship this file already; add a
# temporary one only when there is none, and remove only the one we added.
policy=/usr/sbin/policy-rc.d
added_policy=0
if [[ ! -e $policy ]]; then
  printf '#!/bin/sh\n# added by offerbus infra/system.sh during apt-get install\nexit 101\n' >"$policy"
  chmod 755 "$policy"
  added_policy=1
fi
cleanup() {
  if [[ $added_policy -eq 1 ]]; then rm -f "$policy"; fi
}
trap cleanup EXIT

export DEBIAN_FRONTEND=noninteractive
export NEEDRESTART_SUSPEND=1  # no needrestart prompt or scan after the install
apt_opts=(-o DPkg::Lock::Timeout=300 -o Dpkg::Use-Pty=0 -q)
apt-get "${apt_opts[@]}" update >/dev/null
apt-get "${apt_opts[@]}" install -y --no-install-recommends "${missing[@]}" >/dev/null

for pkg in "${missing[@]}"; do
  if ! is_installed "$pkg"; then
    echo "system: $pkg is still not installed after apt-get install" >&2
    exit 1
  fi
done
echo "system: installed ${missing[*]}"
