#!/bin/sh
# The service image's entrypoint: `ROLE [options...]`, or the options alone when the image was
# built with --build-arg ROLE=... (OFFERBUS_ROLE). Runs the role's service in the foreground
# (exec: signals reach it directly). The modules are services/procs.py's SERVICE_MODULES
# (tests/infra/test_systemd_units.py checks that this file agrees).
set -eu
case "${1:-}" in
  master|allocator|broker|jobs|agent|cli) role=$1; shift ;;
  *) role=${OFFERBUS_ROLE:-} ;;
esac
case "$role" in
  master|allocator|broker|agent) exec python -m "services.$role" "$@" ;;
  jobs) exec python -m frameworks.jobrunner "$@" ;;
  cli) exec python -m services.cli "$@" ;;
  *) echo "offerbus image: the first argument is the role: master, allocator, broker, jobs," \
          "agent or cli (got '${role:-nothing}')" >&2
     exit 64 ;;
esac
