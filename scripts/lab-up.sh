#!/usr/bin/env bash
# The multi-node lab in the foreground: ferro-control-plane and N nodes (default 3) on this
# machine. Each node is a network namespace with its own containerd, ferro-agent, ferro-netd
# (the VXLAN overlay), ferro-proxy and ferro-csi; an underlay bridge in a namespace of its own
# joins them; nothing changes in the root network namespace. It prints the kubectl command to
# use, runs until Ctrl-C (or SIGTERM), then stops everything it started, by pid, and removes
# the namespaces, loop devices, cgroups and files it made. Layout: docs/design/lab.md ("The
# multi-node lab").
#   scripts/lab-up.sh [--nodes N] [--pool-size 1Gi] [--node-monitor-grace-period 40s]
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=scripts/lib.sh
. scripts/lib.sh
ferro_require_root
ferro_install_deps
ferro_build -p ferro-control-plane -p ferro-agent -p ferro-cni -p ferro-proxy -p ferro-csi -p ferro-lab
BIN=$(ferro_bin_dir)
exec "$BIN/ferro-lab" cluster --bin-dir "$BIN" "$@"
