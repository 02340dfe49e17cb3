#!/usr/bin/env bash
# Brings a Docker daemon up for the compose test where the machine allows it, and takes it down again
# without a trace: only a daemon this script started is stopped, and its bridge and iptables rules go with it.
#
#   docker/daemon.sh up     # root, dockerd installed, none running: start one (state in $DAEMON_STATE)
#   docker/daemon.sh down   # stop the daemon `up` started, restore iptables, delete the bridges it made
#
# `up` exits 0 when a daemon answers (a running one is used as it is), 1 with the reason when none can run.
set -euo pipefail
STATE=${DAEMON_STATE:-/tmp/elastic-dockerd}

answers() { docker info >/dev/null 2>&1; }

up() {
  if answers; then echo "docker: a daemon already runs; using it"; return 0; fi
  [ "$(id -u)" = 0 ] || { echo "docker: no daemon runs and starting one needs root"; return 1; }
  command -v dockerd >/dev/null || { echo "docker: no daemon runs and dockerd is not installed"; return 1; }
  mkdir -p "$STATE"
  iptables-save >"$STATE/iptables.before" 2>/dev/null || true
  ip -o link show type bridge | awk -F': ' '{print $2}' | sort >"$STATE/bridges.before"
  dockerd --pidfile "$STATE/dockerd.pid" >"$STATE/dockerd.log" 2>&1 &
  for _ in $(seq 60); do
    answers && { echo "docker: started dockerd (pid $(cat "$STATE/dockerd.pid"), log $STATE/dockerd.log)"; return 0; }
    sleep 0.5
  done
  echo "docker: dockerd did not answer within 30 s; its log:"; tail -n 20 "$STATE/dockerd.log"
  down
  return 1
}

down() {
  [ -f "$STATE/bridges.before" ] || { echo "docker: no daemon of ours to stop"; return 0; }
  if [ -f "$STATE/dockerd.pid" ]; then
    pid=$(cat "$STATE/dockerd.pid")
    kill "$pid" 2>/dev/null || true
    for _ in $(seq 60); do kill -0 "$pid" 2>/dev/null || break; sleep 0.5; done
    kill -9 "$pid" 2>/dev/null || true
  fi
  [ -s "$STATE/iptables.before" ] && iptables-restore <"$STATE/iptables.before"
  ip -o link show type bridge | awk -F': ' '{print $2}' | sort | comm -13 "$STATE/bridges.before" - |
    while read -r bridge; do ip link delete "$bridge"; done
  rm -rf "$STATE"
  echo "docker: daemon stopped, its bridges and iptables rules removed"
}

"${1:?usage: docker/daemon.sh up|down}"
