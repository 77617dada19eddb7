#!/usr/bin/env bash
# Build the Offerbus service image (infra/Dockerfile) from local layers only: no registry is
# reachable, so its base offerbus/python-base is imported from a root filesystem made of this
# machine's Python and Offerbus's run-time dependencies (python -m infra.image_rootfs), then
# the Dockerfile adds the tree. Usage: infra/build-service-image.sh [TAG]
# (default offerbus/service:latest; OFFERBUS_PYTHON: the interpreter whose environment has
# the dependencies, default .venv/bin/python).
set -euo pipefail

cd "$(dirname "$0")/.."
TAG=${1:-offerbus/service:latest}
BASE=${OFFERBUS_BASE_IMAGE:-offerbus/python-base:latest}
PYTHON=${OFFERBUS_PYTHON:-.venv/bin/python}

if ! timeout 10 docker info >/dev/null 2>&1; then
  echo "image: the Docker engine does not answer (run make engine / infra/docker-engine.sh)" >&2
  exit 1
fi

work=$(mktemp -d /tmp/offerbus-service-image.XXXXXX)
trap 'rm -rf "$work"' EXIT
mkdir "$work/rootfs" "$work/context"

"$PYTHON" -m infra.image_rootfs "$work/rootfs"
tar --numeric-owner --owner=0 --group=0 -C "$work/rootfs" -c . |
  docker import --change 'ENV PATH=/usr/local/bin:/bin' --change 'CMD ["python3"]' \
    --message "offerbus python base (this machine's Python and the run-time dependencies)" \
    - "$BASE" >/dev/null

tar -c --exclude=__pycache__ services schemas frameworks infra pyproject.toml |
  tar -x -C "$work/context"
docker build --quiet -t "$TAG" --build-arg "BASE=$BASE" -f infra/Dockerfile "$work/context" \
  >/dev/null
out=$(docker run --rm "$TAG" cli --help | head -1)
if [[ $out != usage:* ]]; then
  echo "image: built $TAG but \`cli --help\` printed '$out'" >&2
  exit 1
fi
echo "image: built $TAG on $BASE ($(docker image inspect --format '{{.Size}}' "$TAG") bytes)"
