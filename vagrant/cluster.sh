#!/usr/bin/env bash
# ferro on Vagrant VMs, end to end: builds the release binaries and the test images on this
# host, the box (vagrant/build-box.sh, offline), brings up one control-plane VM and the
# workers with vagrant/Vagrantfile (libvirt provider), joins the workers with a bootstrap
# token, checks the cluster with kubectl (every node Ready; a Deployment behind a Service
# answering across VMs, by its ClusterIP from a pod on every node and by its NodePort on every
# VM) and destroys everything.
#
#   vagrant/cluster.sh [--keep] [--workers N] [--driver kvm|qemu]
#
#   --keep          leave the VMs running at the end (vagrant/cluster.sh --destroy removes them)
#   --destroy       only destroy what a --keep run left
#   --workers N     workers beside the control plane (default 2)
#   --bin-dir DIR   take the binaries from DIR (default: build them, target/release)
#   --driver D      libvirt domain type (default: kvm when /dev/kvm runs a stock kernel, which
#                   this script cannot know: pass --driver qemu on machines whose /dev/kvm
#                   does not, as the one ferro is developed on; FERRO_VM_DRIVER works too)
#
# The machine's network is left alone: libvirtd, its networks (bridges, dnsmasq, firewall
# rules) and the VMs live in a network namespace of their own (ferro-vagrant), which is
# removed at the end; the VMs' networks are isolated (no forwarding), so nothing they send
# leaves that namespace. Needs root.
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=scripts/lib.sh
. scripts/lib.sh
ferro_require_root

KEEP=0
DESTROY_ONLY=0
WORKERS=${FERRO_WORKERS:-2}
DRIVER=${FERRO_VM_DRIVER:-kvm}
BIN_DIR=""
while [ $# -gt 0 ]; do
  case "$1" in
    --keep) KEEP=1; shift ;;
    --destroy) DESTROY_ONLY=1; shift ;;
    --workers) WORKERS=${2:?}; shift 2 ;;
    --driver) DRIVER=${2:?}; shift 2 ;;
    --bin-dir) BIN_DIR=${2:?}; shift 2 ;;
    *) echo "cluster.sh: unknown argument $1" >&2; exit 2 ;;
  esac
done
NS=ferro-vagrant
STATE=/var/lib/ferro-vagrant
NET=${FERRO_NET_PREFIX:-192.168.78}
CP_IP=$NET.10
export FERRO_WORKERS=$WORKERS FERRO_VM_DRIVER=$DRIVER FERRO_NET_PREFIX=$NET
export VAGRANT_CWD=$PWD/vagrant VAGRANT_DEFAULT_PROVIDER=libvirt
export LIBVIRT_DEFAULT_URI=qemu:///system
start=$SECONDS
step() { printf '== %s (%ss)\n' "$*" "$((SECONDS - start))"; }
in_ns() { nsenter --net="/run/netns/$NS" -- "$@"; }
vg() { in_ns vagrant "$@"; }

# --- packages: Vagrant with its libvirt plugin, libvirt, QEMU. Where qemu-utils already comes
# from bookworm-backports (as on the machine ferro is developed on), QEMU and libvirt must come
# from there too; systemd stays bookworm's.
vm_packages=(vagrant vagrant-libvirt libvirt-daemon-system libvirt-daemon-driver-qemu qemu-system-x86)
missing=()
for p in "${vm_packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ "${#missing[@]}" -gt 0 ]; then
  if dpkg-query -W -f='${Version}' qemu-utils 2>/dev/null | grep -q bpo12; then
    cat >/etc/apt/sources.list.d/ferro-backports.sources <<'EOF'
Types: deb
URIs: http://deb.debian.org/debian
Suites: bookworm-backports
Components: main
EOF
    cat >/etc/apt/preferences.d/ferro-vm <<'EOF'
Package: qemu-* libvirt* seabios ipxe-qemu libslirp0
Pin: release n=bookworm-backports
Pin-Priority: 990
EOF
  fi
  DEBIAN_FRONTEND=noninteractive apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi

# --- the namespace with libvirt: started here, ended by pid at the end
LIBVIRTD_PID=""
VIRTLOGD_PID=""
cleanup() {
  local rc=$?
  if [ "$KEEP" = 0 ] || [ "$rc" != 0 ]; then
    if [ -e "/run/netns/$NS" ] && [ -n "$LIBVIRTD_PID" ]; then
      step "destroying the VMs"
      vg destroy -f >/dev/null 2>&1 || true
      # the networks vagrant-libvirt defined for these VMs (libvirt's own "default" stays)
      for n in vagrant-libvirt ferro-private; do
        in_ns virsh net-destroy "$n" >/dev/null 2>&1 || true
        in_ns virsh net-undefine "$n" >/dev/null 2>&1 || true
      done
    fi
    for p in $LIBVIRTD_PID $VIRTLOGD_PID; do
      kill "$p" 2>/dev/null || true
    done
    for p in $LIBVIRTD_PID $VIRTLOGD_PID; do
      while kill -0 "$p" 2>/dev/null; do sleep 0.2; done
    done
    [ -e "/run/netns/$NS" ] && ip netns delete "$NS"
    # the bundle and the join files (a token, kubeconfigs) of a cluster that is gone
    rm -rf "$STATE/libvirtd.pid" "$STATE/virtlogd.pid" "$STATE/work" "$STATE/admin.kubeconfig"
  elif [ "$KEEP" = 1 ]; then
    echo "kept: VMs in namespace $NS; kubectl: nsenter --net=/run/netns/$NS kubectl --kubeconfig $STATE/admin.kubeconfig get nodes"
    echo "      remove with: vagrant/cluster.sh --destroy"
  fi
  exit "$rc"
}

start_libvirt() {
  if pgrep -x libvirtd >/dev/null; then
    echo "cluster.sh: a libvirtd is already running on this machine; this script runs its own in namespace $NS (stop the other first)" >&2
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
  for _ in $(seq 100); do
    in_ns virsh version >/dev/null 2>&1 && return 0
    kill -0 "$LIBVIRTD_PID" 2>/dev/null || { cat "$STATE/libvirtd.log" >&2; exit 1; }
    sleep 0.2
  done
  echo "cluster.sh: libvirtd did not answer" >&2
  cat "$STATE/libvirtd.log" >&2
  exit 1
}

if [ "$DESTROY_ONLY" = 1 ]; then
  LIBVIRTD_PID=$(cat "$STATE/libvirtd.pid" 2>/dev/null || true)
  VIRTLOGD_PID=$(cat "$STATE/virtlogd.pid" 2>/dev/null || true)
  trap cleanup EXIT
  exit 0
fi
trap cleanup EXIT

# --- binaries, images, bundle
if [ -z "$BIN_DIR" ]; then
  step "building the release binaries"
  cargo build --release --workspace --bins
  BIN_DIR=target/release
fi
work=$STATE/work
rm -rf "$work"
mkdir -p "$work/bundle/bin" "$work/bundle/scripts" "$work/join"
for b in ferro-control-plane ferro-agent ferro-netd ferro-proxy ferro-dns ferro-csi ferro-cni; do
  cp "$BIN_DIR/$b" "$work/bundle/bin/"
  strip "$work/bundle/bin/$b"
done
cp "$(command -v kubectl)" "$work/bundle/bin/kubectl"
cp scripts/install.sh "$work/bundle/scripts/"
cp -r systemd "$work/bundle/"
step "test images (built offline)"
"$BIN_DIR/ferro-lab" images --out "$work/bundle/images" >/dev/null
tar -C "$work/bundle" -czf "$work/bundle.tar.gz" .
export FERRO_BUNDLE=$work/bundle.tar.gz FERRO_JOIN_DIR=$work/join

# --- the box
step "the box"
box=$(vagrant/build-box.sh)
marker=$STATE/box-added
box_changed=0
if [ "$(cat "$marker" 2>/dev/null)" != "$box" ] || ! vagrant box list 2>/dev/null | grep -q '^ferro/debian12 '; then
  vagrant box add --force --name ferro/debian12 "$box" >/dev/null
  box_changed=1
fi

start_libvirt
if [ "$box_changed" = 1 ]; then
  # vagrant-libvirt keeps its copy of a box in libvirt's default pool and would go on using
  # an old one of the same name
  for v in $(in_ns virsh vol-list --pool default 2>/dev/null | awk '/ferro-VAGRANTSLASH-debian12/ {print $1}'); do
    in_ns virsh vol-delete --pool default "$v" >/dev/null
  done
  echo "$box" >"$marker"
fi
step "the control plane VM"
vg up cp --no-parallel
# the workers' join files: a bootstrap token and the CA for the agent (TLS bootstrap), and
# the other components' kubeconfigs as docs/operations.md says
cp_ssh() { vg ssh cp --no-tty -c "sudo $*" -- -q 2>/dev/null; }
token=$(cp_ssh ferro-control-plane token create --data-dir /var/lib/ferro/control-plane | tr -d '\r')
[ -n "$token" ] || { echo "cluster.sh: no bootstrap token from the control plane" >&2; exit 1; }
for i in $(seq "$WORKERS"); do
  name=worker$i
  d=$work/join/$name
  mkdir -p "$d/kubeconfigs"
  echo "$token" >"$d/token"
  cp_ssh cat /var/lib/ferro/control-plane/ca.crt >"$d/ca.crt"
  kc() { cp_ssh ferro-control-plane kubeconfig --data-dir /var/lib/ferro/control-plane --server "https://$CP_IP:6443" "$@"; }
  kc --user "system:node:$name" --group system:nodes >"$d/kubeconfigs/netd.kubeconfig"
  kc --user system:kube-proxy >"$d/kubeconfigs/proxy.kubeconfig"
  kc --user system:ferro-dns >"$d/kubeconfigs/dns.kubeconfig"
  kc --user system:ferro-csi >"$d/kubeconfigs/csi.kubeconfig"
  tar -C "$d" -czf "$work/join/$name.tar.gz" .
done
workers=()
for i in $(seq "$WORKERS"); do workers+=("worker$i"); done
step "the worker VMs"
vg up "${workers[@]}"

# --- checks, with kubectl from the namespace (the private network's host side)
cp_ssh cat /var/lib/ferro/control-plane/admin.kubeconfig >"$STATE/admin.kubeconfig"
k() { in_ns kubectl --kubeconfig "$STATE/admin.kubeconfig" --server "https://$CP_IP:6443" "$@"; }
nodes=$((WORKERS + 1))
step "waiting for $nodes nodes Ready"
for _ in $(seq 300); do
  ready=$(k get nodes -o jsonpath='{range .items[*]}{.status.conditions[?(@.type=="Ready")].status}{"\n"}{end}' 2>/dev/null | grep -c True || true)
  [ "$ready" = "$nodes" ] && break
  sleep 2
done
k get nodes -o wide
[ "$ready" = "$nodes" ] || { echo "cluster.sh: $ready of $nodes nodes Ready" >&2; exit 1; }

step "a Deployment behind a NodePort Service"
replicas=$nodes
k apply -f - <<EOF
apiVersion: apps/v1
kind: Deployment
metadata: {name: web}
spec:
  replicas: $replicas
  selector: {matchLabels: {app: web}}
  template:
    metadata: {labels: {app: web}}
    spec:
      terminationGracePeriodSeconds: 1
      containers:
      - name: httpd
        image: registry.ferro.test/busybox:1
        imagePullPolicy: Never
        command: [sh, -c, 'mkdir -p /www && hostname > /www/index.html && exec httpd -f -p 8080 -h /www']
        readinessProbe: {tcpSocket: {port: 8080}, periodSeconds: 2}
---
apiVersion: v1
kind: Service
metadata: {name: web}
spec:
  type: NodePort
  selector: {app: web}
  ports:
  - {port: 80, targetPort: 8080}
EOF
k rollout status deployment/web --timeout 15m
k get pods -o wide
cluster_ip=$(k get service web -o jsonpath='{.spec.clusterIP}')
node_port=$(k get service web -o jsonpath='{.spec.ports[0].nodePort}')
declare -A node_of
while read -r pod node; do node_of[$pod]=$node; done < <(k get pods -l app=web -o jsonpath='{range .items[*]}{.metadata.name} {.spec.nodeName}{"\n"}{end}')
# from every pod, the ClusterIP until a pod on another node answers (kube-proxy's random
# balancing: a few tries)
for pod in "${!node_of[@]}"; do
  crossed=""
  for _ in $(seq 30); do
    answer=$(k exec "$pod" -- timeout 5 wget -qO- "http://$cluster_ip/" 2>/dev/null | tr -d '\r\n' || true)
    if [ -n "$answer" ] && [ "${node_of[$answer]:-}" != "" ] && [ "${node_of[$answer]}" != "${node_of[$pod]}" ]; then
      crossed=$answer
      break
    fi
  done
  [ -n "$crossed" ] || { echo "cluster.sh: from $pod (${node_of[$pod]}) no answer by $cluster_ip from a pod on another node" >&2; exit 1; }
  echo "ClusterIP $cluster_ip from $pod on ${node_of[$pod]}: answered by $crossed on ${node_of[$crossed]}"
done
# the NodePort on every VM, from the namespace
for ip in "$CP_IP" $(for i in $(seq "$WORKERS"); do echo "$NET.$((10 + i))"; done); do
  answer=""
  for _ in $(seq 30); do
    answer=$(in_ns timeout 5 wget -qO- "http://$ip:$node_port/" 2>/dev/null | tr -d '\r\n' || true)
    [ -n "$answer" ] && [ -n "${node_of[$answer]:-}" ] && break
    answer=""
  done
  [ -n "$answer" ] || { echo "cluster.sh: no answer from NodePort $ip:$node_port" >&2; exit 1; }
  echo "NodePort $ip:$node_port: answered by $answer on ${node_of[$answer]}"
done
step "the cluster works"
