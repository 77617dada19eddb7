#!/usr/bin/env bash
# Build the local test image offerbus/busybox:latest (no image registry is reachable, so
# nothing can be pulled): a rootfs of Debian's statically linked /bin/busybox
# (busybox-static) with a symlink per applet, a minimal /etc, and /tmp, imported with
# `docker import`.
#
# Idempotent: the image carries the label org.offerbus.recipe; when an image with the
# current recipe exists the script does nothing. Bump RECIPE when the rootfs or the
# --change options below change (a new busybox-static version rebuilds by itself).
set -euo pipefail

IMAGE=${OFFERBUS_IMAGE:-offerbus/busybox:latest}
RECIPE=1
BUSYBOX=/bin/busybox

if ! dpkg-query -W -f='${Status}' busybox-static 2>/dev/null | grep -q 'install ok installed'; then
  echo "image: busybox-static is not installed (run make system / infra/system.sh)" >&2
  exit 1
fi
busybox_version=$(dpkg-query -W -f='${Version}' busybox-static)
marker="${RECIPE}-busybox-${busybox_version}"

if ! timeout 10 docker info >/dev/null 2>&1; then
  echo "image: the Docker engine does not answer (run make engine / infra/docker-engine.sh)" >&2
  exit 1
fi

current_marker() {
  docker image inspect --format '{{ index .Config.Labels "org.offerbus.recipe" }}' "$IMAGE" \
    2>/dev/null || true
}

# Two builds at once (two make processes) would race on the tag; serialise them.
exec 9>/var/lock/offerbus-build-image.lock
flock 9

if [[ "$(current_marker)" == "$marker" ]]; then
  id=$(docker image inspect --format '{{.Id}}' "$IMAGE")
  echo "image: $IMAGE up to date (recipe $marker, ${id:7:12}); nothing to do"
  exit 0
fi

old_id=$(docker image inspect --format '{{.Id}}' "$IMAGE" 2>/dev/null || true)

rootfs=$(mktemp -d /tmp/offerbus-rootfs.XXXXXX)
trap 'rm -rf "$rootfs"' EXIT

mkdir -p "$rootfs"/{bin,sbin,usr/bin,usr/sbin,etc,root,tmp,var/tmp,home,proc,sys,dev,run}
chmod 1777 "$rootfs/tmp" "$rootfs/var/tmp"
chmod 700 "$rootfs/root"
install -m 755 "$BUSYBOX" "$rootfs/bin/busybox"
# One symlink per applet, where busybox itself says it belongs (bin/sh, usr/bin/env, ...).
while read -r applet; do
  [[ -z $applet || $applet == linuxrc ]] && continue
  [[ -e "$rootfs/$applet" ]] && continue
  mkdir -p "$rootfs/$(dirname "$applet")"
  ln -s /bin/busybox "$rootfs/$applet"
done < <("$BUSYBOX" --list-full)

cat >"$rootfs/etc/passwd" <<'EOF'
root:x:0:0:root:/root:/bin/sh
nobody:x:65534:65534:nobody:/home:/bin/false
EOF
cat >"$rootfs/etc/group" <<'EOF'
root:x:0:
nogroup:x:65534:
EOF
printf 'root:*:19000:0:99999:7:::\nnobody:*:19000:0:99999:7:::\n' >"$rootfs/etc/shadow"
chmod 640 "$rootfs/etc/shadow"
printf 'hosts: files dns\n' >"$rootfs/etc/nsswitch.conf"
printf 'offerbus busybox image, recipe %s\n' "$marker" >"$rootfs/etc/offerbus-release"

tar --numeric-owner --owner=0 --group=0 -C "$rootfs" -c . |
  docker import \
    --change "LABEL org.offerbus.recipe=$marker" \
    --change 'ENV PATH=/usr/sbin:/usr/bin:/sbin:/bin' \
    --change 'WORKDIR /' \
    --change 'CMD ["sh"]' \
    --message "offerbus busybox image (recipe $marker)" \
    - "$IMAGE" >/dev/null

id=$(docker image inspect --format '{{.Id}}' "$IMAGE")
if [[ -n $old_id && $old_id != "$id" ]]; then
  # The previous build is now untagged; drop it unless a container still uses it.
  docker image rm "$old_id" >/dev/null 2>&1 || true
fi
out=$(docker run --rm "$IMAGE" sh -c 'echo ok')
if [[ $out != ok ]]; then
  echo "image: built $IMAGE but a test container printed '$out' instead of 'ok'" >&2
  exit 1
fi
echo "image: built $IMAGE (recipe $marker, ${id:7:12}, $("$BUSYBOX" --list | wc -l) applets)"
