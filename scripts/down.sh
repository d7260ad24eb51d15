#!/usr/bin/env bash
# Stops what scripts/up.sh started, by the pids it recorded in /run/ferro/lab: the agent, the
# pods (through CRI, then containerd's tasks, then the runc shims' pids), containerd, the
# registry and the control plane; unmounts what is left under the lab's directories, removes
# the lab's cgroups (/ferro-lab in every hierarchy) and the namespace. Keeps the data
# (/var/lib/ferro/lab) unless --purge is given. Touches nothing else: no pkill by name.
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=scripts/lib.sh
. scripts/lib.sh
ferro_require_root

PURGE=no
case "${1:-}" in
  --purge) PURGE=yes ;;
  "") ;;
  *) echo "usage: $0 [--purge]" >&2; exit 2 ;;
esac

BIN=$(ferro_bin_dir)
if [ ! -x "$BIN/ferro-lab" ]; then
  # up.sh may have run with another FERRO_PROFILE
  for b in "${CARGO_TARGET_DIR:-$PWD/target}"/{debug,release}; do
    if [ -x "$b/ferro-lab" ]; then BIN=$b; break; fi
  done
fi
CTRD_RUN=$LAB_STATE/containerd

# pid_of NAME PATTERN: the pid in $LAB_STATE/NAME.pid if it is alive and its command line has
# PATTERN (a pid file left after a reboot may name someone else's process).
pid_of() {
  local f=$LAB_STATE/$1.pid pid cmd
  [ -f "$f" ] || return 1
  pid=$(cat "$f")
  [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null || return 1
  cmd=$(tr '\0' ' ' 2>/dev/null <"/proc/$pid/cmdline") || return 1
  [[ $cmd == *"$2"* ]] || return 1
  echo "$pid"
}

# stop NAME PATTERN: SIGTERM, SIGKILL after 10 s; removes the pid file.
stop() {
  local pid i
  if pid=$(pid_of "$1" "$2"); then
    echo "stopping $1 (pid $pid)"
    kill "$pid" 2>/dev/null || true
    for ((i = 0; i < 100; i++)); do
      kill -0 "$pid" 2>/dev/null || break
      sleep 0.1
    done
    if kill -0 "$pid" 2>/dev/null; then
      echo "$1 (pid $pid) ignored SIGTERM: SIGKILL"
      kill -9 "$pid" 2>/dev/null || true
      sleep 0.2
    fi
  fi
  rm -f "$LAB_STATE/$1.pid"
}

stop proxy ferro-proxy
stop dns ferro-dns
stop agent ferro-agent
# SIGTERM: ferro-csi stops serving and leaves every volume as it is.
stop csi ferro-csi

if pid_of containerd containerd >/dev/null; then
  # The pods first, through CRI: stops their containers and calls CNI DEL (releases the
  # addresses and veths); then whatever task containerd still has.
  if [ -x "$BIN/ferro-lab" ]; then
    timeout 60 "$BIN/ferro-lab" cri-teardown --socket "$LAB_CTRD_SOCK" ||
      echo "warning: CRI teardown incomplete; killing the tasks" >&2
  fi
  for ns in $(ctr --address "$LAB_CTRD_SOCK" namespaces ls -q 2>/dev/null); do
    for task in $(ctr --address "$LAB_CTRD_SOCK" -n "$ns" tasks ls -q 2>/dev/null); do
      ctr --address "$LAB_CTRD_SOCK" -n "$ns" tasks kill -s SIGKILL "$task" >/dev/null 2>&1 || true
      ctr --address "$LAB_CTRD_SOCK" -n "$ns" tasks rm -f "$task" >/dev/null 2>&1 || true
    done
  done
fi
# Container processes this containerd started (init.pid under its state dir, as the lab
# fixture's Drop does), then its shims: the processes whose command line names our socket
# (`containerd-shim-runc-v2 ... -address /run/ferro/lab/containerd/containerd.sock`).
for f in "$CTRD_RUN"/state/io.containerd.runtime.v2.task/*/*/init.pid; do
  [ -f "$f" ] || continue
  pid=$(cat "$f")
  case "$pid" in "" | *[!0-9]* | 0 | 1) continue ;; esac
  kill -9 "$pid" 2>/dev/null || true
done
for d in /proc/[0-9]*; do
  cmd=$(tr '\0' ' ' 2>/dev/null <"$d/cmdline") || continue
  if [[ $cmd == *containerd-shim*" -address $LAB_CTRD_SOCK "* ]]; then
    kill -9 "${d#/proc/}" 2>/dev/null || true
  fi
done
stop containerd containerd
stop registry docker-registry
stop control-plane ferro-control-plane

# Processes still in the lab's pod cgroups (only the lab's pods are placed there).
cgroup_dirs() {
  local d
  for d in /sys/fs/cgroup"$LAB_CGROUP_ROOT" /sys/fs/cgroup/*"$LAB_CGROUP_ROOT"; do
    [ -d "$d" ] && echo "$d"
  done
  return 0
}
for d in $(cgroup_dirs); do
  find "$d" -name cgroup.procs -exec cat {} + 2>/dev/null | while read -r pid; do
    kill -9 "$pid" 2>/dev/null || true
  done
done

# Mounts left in this mount namespace under the lab's directories, deepest first (normally
# none: containerd's and the agent's mounts live in containerd's mount namespace and went
# away with its last process).
awk -v a="$LAB_DATA" -v b="$LAB_STATE" '$5 == a || index($5, a "/") == 1 || $5 == b || index($5, b "/") == 1 { print $5 }' \
  /proc/self/mountinfo | sort -r | while read -r m; do
  echo "unmounting $m"
  umount -l "$m" || true
done

# Loop devices of ferro-csi's volumes (global, unlike the mounts, which went with containerd's
# mount namespace). The backing files stay: the next up.sh re-attaches what its pods use.
for dev in /sys/block/loop*; do
  backing=$(cat "$dev/loop/backing_file" 2>/dev/null) || continue
  case "$backing" in
  "$LAB_DATA/csi/"*)
    echo "detaching /dev/${dev##*/} ($backing)"
    losetup --detach "/dev/${dev##*/}" || true
    ;;
  esac
done

# The lab's cgroups, deepest first, in every hierarchy.
for d in $(cgroup_dirs); do
  find "$d" -depth -type d -exec rmdir {} \; 2>/dev/null || true
  if [ -d "$d" ]; then
    echo "warning: $d is still there (a process left in it?)" >&2
  fi
done

if ip netns list | grep -qw "$LAB_NS"; then
  ip netns del "$LAB_NS"
fi
if [ -f "$LAB_STATE/created-run-containerd" ]; then
  rmdir /run/containerd 2>/dev/null || true
  rm -f "$LAB_STATE/created-run-containerd"
fi

if [ "$PURGE" = yes ]; then
  rm -rf "$LAB_DATA" "$LAB_STATE" "$LAB_LOGS"
  rmdir /run/ferro /var/lib/ferro 2>/dev/null || true
fi
echo "ferro is down"
