#!/usr/bin/env bash
# Brings ferro up on this machine: builds it, starts ferro-control-plane inside the lab network
# namespace "ferro-lab" (nothing changes in the root network namespace) and prints how to use it.
# Stop everything with scripts/down.sh.
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=scripts/lib.sh
. scripts/lib.sh
ferro_require_root
ferro_install_deps

LAB_NS=ferro-lab
STATE=/run/ferro/lab
DATA=/var/lib/ferro/lab/control-plane

cargo build --release -p ferro-control-plane
install -d "$STATE" "$DATA"

if ! ip netns list | grep -qw "$LAB_NS"; then
  ip netns add "$LAB_NS"
fi
ip -n "$LAB_NS" link set lo up

if [ -f "$STATE/control-plane.pid" ] && kill -0 "$(cat "$STATE/control-plane.pid")" 2>/dev/null; then
  echo "ferro-control-plane already running (pid $(cat "$STATE/control-plane.pid"))"
else
  ip netns exec "$LAB_NS" ./target/release/ferro-control-plane \
    --data-dir "$DATA" --bind-address 127.0.0.1 --secure-port 6443 \
    --allocate-node-cidrs --cluster-cidr 10.244.0.0/16 \
    >"$STATE/control-plane.log" 2>&1 &
  echo $! >"$STATE/control-plane.pid"
fi

for _ in $(seq 1 100); do
  if [ -f "$DATA/admin.kubeconfig" ] && \
     ip netns exec "$LAB_NS" kubectl --kubeconfig "$DATA/admin.kubeconfig" get --raw /readyz >/dev/null 2>&1; then
    break
  fi
  sleep 0.1
done
ip netns exec "$LAB_NS" kubectl --kubeconfig "$DATA/admin.kubeconfig" get namespaces

cat <<TXT

ferro is up: ferro-control-plane serves the Kubernetes API at https://127.0.0.1:6443 inside the
network namespace $LAB_NS (log: $STATE/control-plane.log). Use it with:

  ip netns exec $LAB_NS kubectl --kubeconfig $DATA/admin.kubeconfig get all -A

Stop it with: scripts/down.sh
TXT
