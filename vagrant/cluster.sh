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
# The machine's network is left alone (vagrant/lib.sh). Needs root.
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=scripts/lib.sh
. scripts/lib.sh
# shellcheck source=vagrant/lib.sh
. vagrant/lib.sh
ferro_require_root

DESTROY_ONLY=0
WORKERS=${FERRO_WORKERS:-2}
DRIVER=${FERRO_VM_DRIVER:-kvm}
BIN_DIR=""
while [ $# -gt 0 ]; do
  case "$1" in
    --keep) VG_KEEP=1; shift ;;
    --destroy) DESTROY_ONLY=1; shift ;;
    --workers) WORKERS=${2:?}; shift 2 ;;
    --driver) DRIVER=${2:?}; shift 2 ;;
    --bin-dir) BIN_DIR=${2:?}; shift 2 ;;
    *) echo "cluster.sh: unknown argument $1" >&2; exit 2 ;;
  esac
done
NET=${FERRO_NET_PREFIX:-192.168.78}
CP_IP=$NET.10
export FERRO_WORKERS=$WORKERS FERRO_VM_DRIVER=$DRIVER FERRO_NET_PREFIX=$NET
vg_install_packages
work=$STATE/work
# the bundle and the join files (a token, kubeconfigs) of a cluster that is gone
VG_CLEAN_FILES="$work $STATE/admin.kubeconfig"
VG_KEPT_HINT="kubectl: nsenter --net=/run/netns/$NS kubectl --kubeconfig $STATE/admin.kubeconfig get nodes"

vg_begin "$DESTROY_ONLY"

# --- binaries, images, bundle
if [ -z "$BIN_DIR" ]; then
  step "building the release binaries"
  cargo build --release --workspace --bins
  BIN_DIR=target/release
fi
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

# --- the box, libvirt
step "the box"
vg_box_and_libvirt
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
