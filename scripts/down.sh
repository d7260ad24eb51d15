#!/usr/bin/env bash
# Stops what scripts/up.sh started and removes the lab namespace. Keeps the data dir unless
# --purge is given.
set -euo pipefail
STATE=/run/ferro/lab
LAB_NS=ferro-lab
if [ -f "$STATE/control-plane.pid" ]; then
  pid=$(cat "$STATE/control-plane.pid")
  if kill -0 "$pid" 2>/dev/null; then
    kill "$pid"
    for _ in $(seq 1 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
  fi
  rm -f "$STATE/control-plane.pid"
fi
if ip netns list | grep -qw "$LAB_NS"; then
  ip netns del "$LAB_NS"
fi
if [ "${1:-}" = "--purge" ]; then
  rm -rf /var/lib/ferro/lab "$STATE"
  rmdir /run/ferro /var/lib/ferro 2>/dev/null || true
fi
echo "ferro is down"
