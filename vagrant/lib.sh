# Shared by vagrant/cluster.sh and vagrant/pod-startup-bench.sh (sourced, after scripts/lib.sh):
# the VM packages, libvirt in a network namespace of its own, the box, and the teardown.
#
# The machine's network is left alone: libvirtd, its networks (bridges, dnsmasq, firewall
# rules) and the VMs live in the network namespace $NS, which is removed at the end; the VMs'
# networks are isolated (no forwarding), so nothing they send leaves that namespace.
NS=ferro-vagrant
STATE=/var/lib/ferro-vagrant
export VAGRANT_CWD=$PWD/vagrant VAGRANT_DEFAULT_PROVIDER=libvirt
export LIBVIRT_DEFAULT_URI=qemu:///system
VG_START=$SECONDS
step() { printf '== %s (%ss)\n' "$*" "$((SECONDS - VG_START))"; }
in_ns() { nsenter --net="/run/netns/$NS" -- "$@"; }
vg() { in_ns vagrant "$@"; }

# Vagrant with its libvirt plugin, libvirt, QEMU. Where qemu-utils already comes from
# bookworm-backports (as on the machine ferro is developed on), QEMU and libvirt must come
# from there too; systemd stays bookworm's.
vg_install_packages() {
  local vm_packages=(vagrant vagrant-libvirt libvirt-daemon-system libvirt-daemon-driver-qemu qemu-system-x86)
  local missing=() p
  for p in "${vm_packages[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
  done
  [ "${#missing[@]}" -gt 0 ] || return 0
  if dpkg-query -W -f='${Version}' qemu-utils 2>/dev/null | grep -q bpo12; then
    cat >/etc/apt/sources.list.d/ferro-backports.sources <<'SRC'
Types: deb
URIs: http://deb.debian.org/debian
Suites: bookworm-backports
Components: main
SRC
    cat >/etc/apt/preferences.d/ferro-vm <<'PIN'
Package: qemu-* libvirt* seabios ipxe-qemu libslirp0
Pin: release n=bookworm-backports
Pin-Priority: 990
PIN
  fi
  DEBIAN_FRONTEND=noninteractive apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}"
  if [ -d /run/systemd/system ]; then
    # the package enables a libvirtd of the root network namespace; ferro's runs in $NS
    systemctl disable --now libvirtd.service libvirtd.socket virtlogd.socket >/dev/null 2>&1 || true
  fi
}

LIBVIRTD_PID=""
VIRTLOGD_PID=""
VG_KEEP=0
# The EXIT trap: unless kept (and successful), destroys the VMs, undefines the networks
# vagrant-libvirt made, ends libvirtd and virtlogd by pid, removes the namespace and the
# files named in VG_CLEAN_FILES.
vg_cleanup() {
  local rc=$?
  if [ "$VG_KEEP" = 0 ] || [ "$rc" != 0 ]; then
    if [ -e "/run/netns/$NS" ] && [ -n "$LIBVIRTD_PID" ]; then
      step "destroying the VMs"
      vg destroy -f >/dev/null 2>&1 || true
      # the networks vagrant-libvirt defined for these VMs (libvirt's own "default" stays)
      local n
      for n in vagrant-libvirt ferro-private; do
        in_ns virsh net-destroy "$n" >/dev/null 2>&1 || true
        in_ns virsh net-undefine "$n" >/dev/null 2>&1 || true
      done
    fi
    local p
    for p in $LIBVIRTD_PID $VIRTLOGD_PID; do
      kill "$p" 2>/dev/null || true
    done
    for p in $LIBVIRTD_PID $VIRTLOGD_PID; do
      while kill -0 "$p" 2>/dev/null; do sleep 0.2; done
    done
    [ -e "/run/netns/$NS" ] && ip netns delete "$NS"
    # shellcheck disable=SC2086
    rm -rf "$STATE/libvirtd.pid" "$STATE/virtlogd.pid" ${VG_CLEAN_FILES:-}
  elif [ "$VG_KEEP" = 1 ]; then
    echo "kept: VMs in namespace $NS (${VG_KEPT_HINT:-})"
    echo "      remove with: $0 --destroy"
  fi
  exit "$rc"
}

# Sets the EXIT trap; with DESTROY_ONLY=1 (--destroy) takes the pids a kept run recorded, so
# that the trap ends them, and exits: the teardown is all that runs.
vg_begin() {
  trap vg_cleanup EXIT
  if [ "$1" = 1 ]; then
    LIBVIRTD_PID=$(cat "$STATE/libvirtd.pid" 2>/dev/null || true)
    VIRTLOGD_PID=$(cat "$STATE/virtlogd.pid" 2>/dev/null || true)
    exit 0
  fi
}

vg_start_libvirt() {
  if pgrep -x libvirtd >/dev/null; then
    echo "$0: a libvirtd is already running on this machine; this script runs its own in namespace $NS (stop the other first)" >&2
    exit 1
  fi
  mkdir -p "$STATE"
  [ -e "/run/netns/$NS" ] || ip netns add "$NS"
  in_ns ip link set lo up
  # nsenter execs the daemon: $! is the daemon's pid (not a subshell's, as through in_ns)
  nsenter --net="/run/netns/$NS" -- virtlogd >"$STATE/virtlogd.log" 2>&1 &
  VIRTLOGD_PID=$!
  nsenter --net="/run/netns/$NS" -- libvirtd >"$STATE/libvirtd.log" 2>&1 &
  LIBVIRTD_PID=$!
  echo "$VIRTLOGD_PID" >"$STATE/virtlogd.pid"
  echo "$LIBVIRTD_PID" >"$STATE/libvirtd.pid"
  local _
  for _ in $(seq 100); do
    in_ns virsh version >/dev/null 2>&1 && return 0
    kill -0 "$LIBVIRTD_PID" 2>/dev/null || { cat "$STATE/libvirtd.log" >&2; exit 1; }
    sleep 0.2
  done
  echo "$0: libvirtd did not answer" >&2
  cat "$STATE/libvirtd.log" >&2
  exit 1
}

# The box (vagrant/build-box.sh, cached), added to Vagrant as ferro/debian12 when it changed;
# then libvirt started (vagrant-libvirt keeps its copy of a box in libvirt's default pool and
# would go on using an old one of the same name: removed when the box changed).
vg_box_and_libvirt() {
  local box marker=$STATE/box-added box_changed=0 v
  mkdir -p "$STATE"
  box=$(vagrant/build-box.sh)
  if [ "$(cat "$marker" 2>/dev/null)" != "$box" ] || ! vagrant box list 2>/dev/null | grep -q '^ferro/debian12 '; then
    vagrant box add --force --name ferro/debian12 "$box" >/dev/null
    box_changed=1
  fi
  vg_start_libvirt
  if [ "$box_changed" = 1 ]; then
    for v in $(in_ns virsh vol-list --pool default 2>/dev/null | awk '/ferro-VAGRANTSLASH-debian12/ {print $1}'); do
      in_ns virsh vol-delete --pool default "$v" >/dev/null
    done
    echo "$box" >"$marker"
  fi
}
