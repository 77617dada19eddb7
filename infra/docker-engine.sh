#!/usr/bin/env bash
# Make sure the local Docker engine (dockerd) is running and answering.
#
# Nothing starts dockerd for us on these machines. A dockerd that was killed leaves
# /var/run/docker.pid behind and the next dockerd refuses to start until it is removed,
# so a stale pid file is removed when no dockerd process runs.
set -euo pipefail

LOG=${OFFERBUS_DOCKERD_LOG:-/var/log/offerbus-dockerd.log}
PIDFILE=/var/run/docker.pid
DEADLINE_S=${OFFERBUS_DOCKERD_TIMEOUT:-60}

engine_answers() {
  timeout 10 docker info >/dev/null 2>&1
}

server_version() {
  timeout 10 docker version --format '{{.Server.Version}}' 2>/dev/null || echo '?'
}

if engine_answers; then
  echo "engine: dockerd already running (Docker $(server_version))"
  exit 0
fi

if ! command -v dockerd >/dev/null 2>&1; then
  echo "engine: dockerd is not installed (run make system / infra/system.sh)" >&2
  exit 1
fi

started_pid=
if pgrep -x dockerd >/dev/null 2>&1; then
  # A dockerd exists but does not answer yet (starting up, or stuck): wait for it below
  # rather than starting a second one.
  echo "engine: a dockerd process exists (pid $(pgrep -x dockerd | tr '\n' ' ')); waiting for it"
else
  if [[ -e $PIDFILE ]]; then
    echo "engine: removing stale $PIDFILE (pid $(cat "$PIDFILE" 2>/dev/null || echo '?'), no dockerd running)"
    rm -f "$PIDFILE"
  fi
  mkdir -p "$(dirname "$LOG")"
  echo "=== $(date -Is) offerbus: starting dockerd ===" >>"$LOG"
  # setsid + nohup: its own session, so it outlives make and a Ctrl-C of the caller.
  setsid nohup dockerd >>"$LOG" 2>&1 </dev/null &
  started_pid=$!
  echo "engine: started dockerd (pid $started_pid), log in $LOG"
fi

dockerd_alive() {
  if [[ -n ${started_pid:-} ]]; then
    kill -0 "$started_pid" 2>/dev/null
  else
    pgrep -x dockerd >/dev/null 2>&1
  fi
}

deadline=$((SECONDS + DEADLINE_S))
until engine_answers; do
  if ((SECONDS >= deadline)); then
    echo "engine: dockerd did not answer 'docker info' within ${DEADLINE_S}s; last lines of $LOG:" >&2
    tail -n 30 "$LOG" >&2 || true
    exit 1
  fi
  if ! dockerd_alive; then
    echo "engine: dockerd exited while starting; last lines of $LOG:" >&2
    tail -n 30 "$LOG" >&2 || true
    exit 1
  fi
  sleep 0.2
done
echo "engine: dockerd up (Docker $(server_version))"
