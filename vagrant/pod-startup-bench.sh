#!/usr/bin/env bash
# The pod-startup benchmark (agent/examples/pod-startup-bench) inside a VM, once per OCI
# runtime (runc, then crun): in a VM the cgroup hierarchy is the unified one (v2), where crun
# runs; on this host (hybrid cgroups) it does not. Builds the benchmark and the binaries it
# starts (release) and the test images on the host, brings up one VM ("bench" of
# vagrant/Vagrantfile, the box of vagrant/build-box.sh, nothing of ferro installed), copies
# them in, runs the benchmark as root there for each runtime, prints and keeps the outputs,
# and destroys the VM.
#
#   vagrant/pod-startup-bench.sh [--pods N] [--idle-seconds S] [--runtimes "runc crun"]
#                                [--bin-dir DIR] [--driver kvm|qemu] [--out DIR] [--keep]
#
#   --pods N          pods per burst (default 30, as the benchmark)
#   --idle-seconds S  the benchmark's footprint windows (default 10)
#   --runtimes LIST   OCI runtimes, each a binary in the VM's /usr/bin (default "runc crun")
#   --bin-dir DIR     take ferro-agent, ferro-cni, ferro-control-plane, ferro-lab and
#                     examples/pod-startup-bench from DIR (default: build them, target/release)
#   --driver D        libvirt domain type (kvm, or qemu where /dev/kvm cannot run a stock
#                     kernel, as here; FERRO_VM_DRIVER works too)
#   --out DIR         where each runtime's output goes (default /var/lib/ferro-vagrant/bench-results)
#   --keep            leave the VM running (vagrant/pod-startup-bench.sh --destroy removes it)
#
# The VM has FERRO_VM_CPUS vCPUs (default 2) and FERRO_VM_MEMORY MiB (default here 4096).
# Under QEMU's emulation the times are emulated: compare the runtimes with each other, not
# with the host's figures. The machine's network is left alone (vagrant/lib.sh). Needs root.
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=scripts/lib.sh
. scripts/lib.sh
# shellcheck source=vagrant/lib.sh
. vagrant/lib.sh
ferro_require_root

PODS=30
IDLE=10
RUNTIMES="runc crun"
BIN_DIR=""
DRIVER=${FERRO_VM_DRIVER:-kvm}
OUT=$STATE/bench-results
DESTROY_ONLY=0
while [ $# -gt 0 ]; do
  case "$1" in
    --pods) PODS=${2:?}; shift 2 ;;
    --idle-seconds) IDLE=${2:?}; shift 2 ;;
    --runtimes) RUNTIMES=${2:?}; shift 2 ;;
    --bin-dir) BIN_DIR=${2:?}; shift 2 ;;
    --driver) DRIVER=${2:?}; shift 2 ;;
    --out) OUT=${2:?}; shift 2 ;;
    --keep) VG_KEEP=1; shift ;;
    --destroy) DESTROY_ONLY=1; shift ;;
    *) echo "pod-startup-bench.sh: unknown argument $1" >&2; exit 2 ;;
  esac
done
export FERRO_BENCH_VM=1 FERRO_VM_DRIVER=$DRIVER FERRO_VM_MEMORY=${FERRO_VM_MEMORY:-4096}
vg_install_packages
work=$STATE/bench
VG_CLEAN_FILES=$work
VG_KEPT_HINT="vagrant: VAGRANT_CWD=$VAGRANT_CWD FERRO_BENCH_VM=1 nsenter --net=/run/netns/$NS vagrant ssh bench"
vg_begin "$DESTROY_ONLY"

# --- the benchmark, the binaries it starts, the images; laid out as cargo's target dir,
# where the benchmark looks for its sibling binaries (examples/..)
if [ -z "$BIN_DIR" ]; then
  step "building the benchmark and its binaries (release)"
  cargo build --release -p ferro-agent -p ferro-control-plane -p ferro-cni -p ferro-lab --bins --example pod-startup-bench
  BIN_DIR=target/release
fi
rm -rf "$work"
mkdir -p "$work/bundle/release/examples" "$work/bundle/bin"
for b in ferro-agent ferro-cni ferro-control-plane; do
  cp "$BIN_DIR/$b" "$work/bundle/release/"
  strip "$work/bundle/release/$b"
done
cp "$BIN_DIR/examples/pod-startup-bench" "$work/bundle/release/examples/"
strip "$work/bundle/release/examples/pod-startup-bench"
cp "$(command -v kubectl)" "$work/bundle/bin/kubectl"
step "test images (built offline)"
"$BIN_DIR/ferro-lab" images --out "$work/bundle/images" >/dev/null
tar -C "$work/bundle" -czf "$work/bench.tar.gz" .

step "the box, libvirt"
vg_box_and_libvirt
step "the bench VM ($FERRO_VM_DRIVER, ${FERRO_VM_CPUS:-2} vCPUs, $FERRO_VM_MEMORY MiB)"
vg up bench
vg upload "$work/bench.tar.gz" /tmp/ferro-bench.tar.gz bench >/dev/null
in_vm() { vg ssh bench --no-tty -c "sudo $*" -- -q; }
in_vm "sh -c 'rm -rf /opt/ferro-bench && mkdir -p /opt/ferro-bench && tar -C /opt/ferro-bench -xzf /tmp/ferro-bench.tar.gz && install -m 0755 /opt/ferro-bench/bin/kubectl /usr/local/bin/kubectl'"
in_vm "sh -c 'echo cgroup: \$(stat -fc %T /sys/fs/cgroup); uname -r; nproc; containerd --version; for r in $RUNTIMES; do /usr/bin/\$r --version | head -1; done'"

mkdir -p "$OUT"
for r in $RUNTIMES; do
  step "pod-startup-bench with $r ($PODS pods)"
  runtime=()
  # runc is containerd's default; any other is the runc shim's BinaryName
  [ "$r" = runc ] || runtime=(--oci-runtime "/usr/bin/$r")
  if ! in_vm "env FERRO_LAB_IMAGES=/opt/ferro-bench/images /opt/ferro-bench/release/examples/pod-startup-bench --pods $PODS --idle-seconds $IDLE ${runtime[*]}" 2>&1 | tee "$OUT/$r.txt"; then
    echo "pod-startup-bench.sh: the benchmark with $r failed (its output: $OUT/$r.txt)" >&2
    exit 1
  fi
done
step "done: outputs in $OUT"
