#!/usr/bin/env bash
# Installs ferro on a host as systemd units (docs/operations.md): the binaries, the units,
# default configuration under /etc/ferro and, on a control-plane node, the components'
# kubeconfigs signed by the cluster CA. Idempotent: a second run with the same arguments
# changes nothing (files already in place with the same content are left alone, configuration
# a person edited is never overwritten). Run again with new binaries (an upgrade), it replaces
# the binaries and units that differ and restarts those of their units that were running
# (the agent's pods keep running: KillMode=process). --uninstall removes what it installed (recorded in
# /var/lib/ferro/installed-files) and leaves the state (store, volumes) in place.
#
#   scripts/install.sh --role control-plane [--node-name NAME] [--node-ip IP]
#   scripts/install.sh --role worker --api-server URL --token TOKEN --ca-file CA.crt \
#                      --kubeconfig-dir DIR [--node-name NAME] [--node-ip IP]
#   scripts/install.sh --role worker --api-server URL --token TOKEN \
#                      --discovery-token-ca-cert-hash sha256:HEX --kubeconfig-dir DIR ...
#   scripts/install.sh --uninstall
#
# Options:
#   --bin-dir DIR         where the built binaries are (default: target/release)
#   --root DIR            install into this directory tree instead of / (nothing is started;
#                         the units are enabled only with --enable)
#   --node-name NAME      this node's name (default: the host name; with --root, DIR/etc/hostname)
#   --node-ip IP          the node's address (agent, netd, control plane's advertise address)
#   --cluster-cidr CIDR   the pod network (default 10.244.0.0/16)
#   --api-server URL      the API server the node components use on a control-plane node
#                         (default https://127.0.0.1:6443)
#   --token TOKEN         worker: a bootstrap token (`ferro-control-plane token create` on the
#                         control plane); the agent joins with it (TLS bootstrap: it asks for
#                         its own client certificate, auto-approved and signed by the cluster
#                         CA) and writes /etc/ferro/agent.kubeconfig itself
#   --ca-file FILE        worker: the cluster CA certificate (the control plane's
#                         /var/lib/ferro/control-plane/ca.crt), with --token
#   --discovery-token-ca-cert-hash sha256:HEX
#                         worker, instead of --ca-file: the CA is discovered from the control
#                         plane's kube-public/cluster-info, signed for the token, and pinned by
#                         this hash of its public key (kubeadm join's token discovery;
#                         `ferro-control-plane token create --print-join-command` prints it)
#   --kubeconfig-dir DIR  worker: netd.kubeconfig, proxy.kubeconfig, dns.kubeconfig and
#                         csi.kubeconfig (and agent.kubeconfig when there is no --token), made
#                         on the control plane with `ferro-control-plane kubeconfig`
#                         (docs/operations.md)
#   --cni-bin-dir DIR     where containerd looks for CNI plugins (default: its CRI plugin's
#                         bin_dir from `containerd config dump`; with --root, /usr/lib/cni
#                         when the tree has Debian's containerd package, else /opt/cni/bin)
#   --enable / --no-enable  enable and start the units (default: enable when installing into /
#                         under a running systemd)
#   --dry-run             say what would change, change nothing
set -euo pipefail

usage() { sed -n '2,/^set -euo/p' "$0" | sed -e '$d' -e 's/^# \{0,1\}//'; }
die() { echo "install.sh: $*" >&2; exit 1; }

ROLE=""
BIN_DIR=""
ROOT=""
NODE_NAME=""
NODE_IP=""
CLUSTER_CIDR=10.244.0.0/16
API_SERVER=https://127.0.0.1:6443
KUBECONFIG_DIR=""
TOKEN=""
CA_FILE=""
CA_HASH=""
API_SERVER_GIVEN=0
ENABLE=""
CNI_BIN_DIR=""
UNINSTALL=0
DRY_RUN=0
while [ $# -gt 0 ]; do
  case "$1" in
    --role) ROLE=${2:?}; shift 2 ;;
    --bin-dir) BIN_DIR=${2:?}; shift 2 ;;
    --root) ROOT=${2:?}; shift 2 ;;
    --node-name) NODE_NAME=${2:?}; shift 2 ;;
    --node-ip) NODE_IP=${2:?}; shift 2 ;;
    --cluster-cidr) CLUSTER_CIDR=${2:?}; shift 2 ;;
    --api-server) API_SERVER=${2:?}; API_SERVER_GIVEN=1; shift 2 ;;
    --token) TOKEN=${2:?}; shift 2 ;;
    --ca-file) CA_FILE=${2:?}; shift 2 ;;
    --discovery-token-ca-cert-hash) CA_HASH=${2:?}; shift 2 ;;
    --kubeconfig-dir) KUBECONFIG_DIR=${2:?}; shift 2 ;;
    --cni-bin-dir) CNI_BIN_DIR=${2:?}; shift 2 ;;
    --enable) ENABLE=1; shift ;;
    --no-enable) ENABLE=0; shift ;;
    --uninstall) UNINSTALL=1; shift ;;
    --dry-run) DRY_RUN=1; shift ;;
    -h|--help) usage; exit 0 ;;
    *) die "unknown argument $1 (see --help)" ;;
  esac
done

[ "$(id -u)" -eq 0 ] || die "run as root"
if [ -n "$ROOT" ]; then
  [ -d "$ROOT" ] || die "--root $ROOT is not a directory"
  ROOT=$(cd "$ROOT" && pwd)
  [ "$ROOT" != / ] || ROOT=""
fi
SRC_DIR=$(cd "$(dirname "$0")/.." && pwd)
MANIFEST=/var/lib/ferro/installed-files
UNITS_ALL=(ferro-control-plane ferro-agent ferro-netd ferro-proxy ferro-dns ferro-csi)
CHANGED=0

say() { echo "$*"; }
note_change() { CHANGED=$((CHANGED + 1)); say "$*"; }
# Records a path (relative to the root) as installed by this script.
record() {
  local p=$1
  grep -qxF "$p" "$ROOT$MANIFEST" 2>/dev/null && return 0
  [ "$DRY_RUN" = 1 ] && return 0
  mkdir -p "$ROOT$(dirname "$MANIFEST")"
  echo "$p" >>"$ROOT$MANIFEST"
}
# install_file SRC DEST MODE: copies when the content or mode differs.
install_file() {
  local src=$1 dest=$2 mode=$3
  if [ -f "$ROOT$dest" ] && cmp -s "$src" "$ROOT$dest" && [ "$(stat -c %a "$ROOT$dest")" = "$mode" ]; then
    record "$dest"
    return 0
  fi
  note_change "install $dest"
  if [ "$DRY_RUN" = 0 ]; then
    mkdir -p "$ROOT$(dirname "$dest")"
    install -m "$mode" "$src" "$ROOT$dest.ferro-new"
    mv -f "$ROOT$dest.ferro-new" "$ROOT$dest"
  fi
  record "$dest"
}
# config_file DEST MODE < content: written only when absent (a person's edits stay).
config_file() {
  local dest=$1 mode=$2 tmp
  tmp=$(mktemp)
  cat >"$tmp"
  if [ -e "$ROOT$dest" ]; then
    cmp -s "$tmp" "$ROOT$dest" || say "keep $dest (differs from the default; not overwritten)"
    rm -f "$tmp"
    record "$dest"
    return 0
  fi
  note_change "write $dest"
  if [ "$DRY_RUN" = 0 ]; then
    mkdir -p "$ROOT$(dirname "$dest")"
    install -m "$mode" "$tmp" "$ROOT$dest"
  fi
  rm -f "$tmp"
  record "$dest"
}
make_dir() {
  local dir=$1 mode=$2
  if [ -d "$ROOT$dir" ]; then return 0; fi
  note_change "mkdir $dir"
  [ "$DRY_RUN" = 1 ] || install -d -m "$mode" "$ROOT$dir"
  record "$dir/"
}
systemd_here() { [ -z "$ROOT" ] && [ -d /run/systemd/system ]; }
systemctl_root() {
  if [ -n "$ROOT" ]; then systemctl --root="$ROOT" "$@"; else systemctl "$@"; fi
}

uninstall() {
  [ -f "$ROOT$MANIFEST" ] || { say "nothing installed by install.sh under ${ROOT:-/}"; return 0; }
  local units=() u p
  for u in "${UNITS_ALL[@]}"; do
    grep -qxF "/etc/systemd/system/$u.service" "$ROOT$MANIFEST" && units+=("$u.service")
  done
  if [ "${#units[@]}" -gt 0 ]; then
    if systemd_here; then
      systemctl disable --now "${units[@]}" || true
    else
      systemctl_root disable "${units[@]}" >/dev/null 2>&1 || true
    fi
  fi
  # files first (newest first), then the directories it made, deepest first
  tac "$ROOT$MANIFEST" | while read -r p; do
    case "$p" in */) ;; *) [ -e "$ROOT$p" ] && { say "remove $p"; rm -f "$ROOT$p"; } ;; esac
  done
  tac "$ROOT$MANIFEST" | grep '/$' | sort -r | while read -r p; do
    if rmdir "$ROOT$p" 2>/dev/null; then say "remove $p"; fi
  done
  rm -f "$ROOT$MANIFEST"
  if systemd_here; then systemctl daemon-reload; fi
  say "uninstalled (state under /var/lib/ferro stays: remove it by hand to wipe the node)"
}

if [ "$UNINSTALL" = 1 ]; then
  uninstall
  exit 0
fi

case "$ROLE" in
  control-plane) UNITS=("${UNITS_ALL[@]}") ;;
  worker) UNITS=(ferro-agent ferro-netd ferro-proxy ferro-dns ferro-csi) ;;
  "") die "--role control-plane or --role worker is needed (or --uninstall)" ;;
  *) die "unknown --role $ROLE (control-plane or worker)" ;;
esac
BIN_DIR=${BIN_DIR:-$SRC_DIR/target/release}
for u in "${UNITS[@]}"; do
  [ -x "$BIN_DIR/$u" ] || die "$BIN_DIR/$u is missing: build with 'cargo build --release --workspace --bins' or pass --bin-dir"
  [ -f "$SRC_DIR/systemd/$u.service" ] || die "$SRC_DIR/systemd/$u.service is missing"
done
[ -x "$BIN_DIR/ferro-cni" ] || die "$BIN_DIR/ferro-cni is missing: build with 'cargo build --release --workspace --bins' or pass --bin-dir"
if [ -z "$NODE_NAME" ]; then
  if [ -n "$ROOT" ] && [ -s "$ROOT/etc/hostname" ]; then NODE_NAME=$(head -n1 "$ROOT/etc/hostname"); else NODE_NAME=$(hostname); fi
fi
NODE_NAME=$(echo "$NODE_NAME" | tr '[:upper:]' '[:lower:]')
[[ $NODE_NAME =~ ^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$ ]] || die "node name $NODE_NAME is not a DNS subdomain (--node-name)"
if [ "$ROLE" = worker ]; then
  [ -n "$KUBECONFIG_DIR" ] || die "--role worker needs --kubeconfig-dir (the node's components other than the agent: docs/operations.md)"
  given=(netd proxy dns csi)
  if [ -n "$TOKEN" ]; then
    [[ $TOKEN =~ ^[a-z0-9]{6}\.[a-z0-9]{16}$ ]] || die "--token must look like abcdef.0123456789abcdef (ferro-control-plane token create)"
    if [ -n "$CA_HASH" ]; then
      [ -z "$CA_FILE" ] || die "--ca-file and --discovery-token-ca-cert-hash are two ways to the CA: give one"
      [[ $CA_HASH =~ ^sha256:[0-9a-fA-F]{64}$ ]] || die "--discovery-token-ca-cert-hash must look like sha256:<64 hex digits> (ferro-control-plane token create --print-join-command)"
    else
      [ -n "$CA_FILE" ] && [ -s "$CA_FILE" ] || die "--token needs --ca-file (the cluster CA certificate) or --discovery-token-ca-cert-hash"
      grep -q "BEGIN CERTIFICATE" "$CA_FILE" || die "--ca-file $CA_FILE is not a PEM certificate"
    fi
    [ "$API_SERVER_GIVEN" = 1 ] || die "--token needs --api-server (the control plane's URL, e.g. https://10.0.0.1:6443)"
  else
    given+=(agent)
  fi
  for c in "${given[@]}"; do
    [ -s "$KUBECONFIG_DIR/$c.kubeconfig" ] || die "$KUBECONFIG_DIR/$c.kubeconfig is missing"
  done
elif [ -n "$TOKEN" ]; then
  die "--token is for --role worker"
elif [ -n "$CA_HASH" ]; then
  die "--discovery-token-ca-cert-hash is for --role worker with --token"
fi

# --- the cluster CA by discovery (a worker with --discovery-token-ca-cert-hash), before
# anything is installed: a wrong hash or token leaves the machine as it was
BOOT=/etc/ferro/bootstrap-agent.kubeconfig
DISCOVERED=""
if [ -n "$CA_HASH" ]; then
  DISCOVERED=$(mktemp)
  trap 'rm -f "$DISCOVERED"' EXIT
  if [ -s "$ROOT$BOOT" ] && grep -qxF "    token: $TOKEN" "$ROOT$BOOT" && grep -qxF "    server: $API_SERVER" "$ROOT$BOOT"; then
    # discovered on an earlier run (the token may be gone by now)
    cp "$ROOT$BOOT" "$DISCOVERED"
  elif [ "$DRY_RUN" = 1 ]; then
    say "would discover the cluster CA at $API_SERVER (pinned by $CA_HASH)"
    rm -f "$DISCOVERED"
    DISCOVERED=""
  else
    [ -x "$BIN_DIR/ferro-agent" ] || die "$BIN_DIR/ferro-agent is missing (build it, or --bin-dir)"
    # the CA from kube-public/cluster-info, signed for the token, pinned by its hash
    "$BIN_DIR/ferro-agent" discover --server "$API_SERVER" --token "$TOKEN" \
      --ca-cert-hash "$CA_HASH" --output "$DISCOVERED" ||
      die "cluster CA discovery at $API_SERVER failed (above); nothing installed"
  fi
fi

# --- binaries and units (the units whose files changed: restarted below if they run)
CHANGED_UNITS=()
for u in "${UNITS[@]}"; do
  before=$CHANGED
  install_file "$BIN_DIR/$u" "/usr/local/bin/$u" 755
  install_file "$SRC_DIR/systemd/$u.service" "/etc/systemd/system/$u.service" 644
  [ "$CHANGED" = "$before" ] || CHANGED_UNITS+=("$u.service")
done
# --- the CNI plugins containerd calls for the pods, in its CRI plugin's bin_dir (Debian's
# containerd: /usr/lib/cni, where containernetworking-plugins puts the reference plugins;
# upstream's default: /opt/cni/bin): ferro-cni as type "ferro" (the conflist ferro-netd
# writes), and the reference loopback (every sandbox's lo) and portmap (hostPort) linked from
# /usr/lib/cni when the bin_dir is elsewhere
if [ -z "$CNI_BIN_DIR" ]; then
  if [ -z "$ROOT" ] && command -v containerd >/dev/null 2>&1; then
    CNI_BIN_DIR=$(containerd config dump 2>/dev/null | awk -F'"' '$1 ~ /^ *bin_dir = $/ {print $2; exit}')
  fi
  if [ -z "$CNI_BIN_DIR" ] && [ -d "$ROOT/usr/share/doc/containerd" ]; then
    CNI_BIN_DIR=/usr/lib/cni # Debian's containerd package in a --root tree
  fi
  CNI_BIN_DIR=${CNI_BIN_DIR:-/opt/cni/bin}
fi
install_file "$BIN_DIR/ferro-cni" "$CNI_BIN_DIR/ferro" 755
for p in loopback portmap; do
  [ "$CNI_BIN_DIR" = /usr/lib/cni ] && [ -x "$ROOT/usr/lib/cni/$p" ] && continue
  if [ -L "$ROOT$CNI_BIN_DIR/$p" ] && [ "$(readlink "$ROOT$CNI_BIN_DIR/$p")" = "/usr/lib/cni/$p" ]; then
    record "$CNI_BIN_DIR/$p"
  elif [ -e "$ROOT$CNI_BIN_DIR/$p" ]; then
    say "keep $CNI_BIN_DIR/$p (not ours)"
  elif [ -x "$ROOT/usr/lib/cni/$p" ]; then
    note_change "link $CNI_BIN_DIR/$p -> /usr/lib/cni/$p"
    [ "$DRY_RUN" = 1 ] || { mkdir -p "$ROOT$CNI_BIN_DIR"; ln -s "/usr/lib/cni/$p" "$ROOT$CNI_BIN_DIR/$p"; }
    record "$CNI_BIN_DIR/$p"
  else
    say "warning: the CNI plugin $p is missing: pods cannot start without it (apt-get install containernetworking-plugins)"
  fi
done

# --- configuration (/etc/ferro), state (/var/lib/ferro); sockets go under /run/ferro
make_dir /etc/ferro 755
make_dir /etc/ferro/manifests 755
make_dir /var/lib/ferro 755
advertise=()
[ -z "$NODE_IP" ] || advertise=(--advertise-address "$NODE_IP")
node_ip=()
[ -z "$NODE_IP" ] || node_ip=(--node-ip "$NODE_IP")
if [ "$ROLE" = control-plane ]; then
  config_file /etc/ferro/control-plane.env 644 <<EOF
# ferro-control-plane's flags (ferro-control-plane --help)
FERRO_CONTROL_PLANE_ARGS="--allocate-node-cidrs --cluster-cidr $CLUSTER_CIDR${advertise[*]:+ ${advertise[*]}}"
EOF
fi
bootstrap=()
[ -z "$TOKEN" ] || bootstrap=(--bootstrap-kubeconfig /etc/ferro/bootstrap-agent.kubeconfig)
config_file /etc/ferro/agent.env 644 <<EOF
# ferro-agent's flags (ferro-agent --help); the KubeletConfiguration is agent-config.yaml
FERRO_AGENT_ARGS="--hostname-override $NODE_NAME${node_ip[*]:+ ${node_ip[*]}}${bootstrap[*]:+ ${bootstrap[*]}}"
EOF
config_file /etc/ferro/agent-config.yaml 644 <<EOF
apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
clusterDomain: cluster.local
# ferro-dns on this node (ferro-dns.service, its default listen address)
clusterDNS: [169.254.20.10]
EOF
config_file /etc/ferro/netd.env 644 <<EOF
# ferro-netd's flags (ferro-netd --help)
FERRO_NETD_ARGS="--hostname-override $NODE_NAME --cluster-cidr $CLUSTER_CIDR${node_ip[*]:+ ${node_ip[*]}}"
EOF
config_file /etc/ferro/proxy.env 644 <<EOF
# ferro-proxy's flags (ferro-proxy --help)
FERRO_PROXY_ARGS="--hostname-override $NODE_NAME --cluster-cidr $CLUSTER_CIDR --healthz-bind-address 127.0.0.1:10256"
EOF
config_file /etc/ferro/dns.env 644 <<EOF
# ferro-dns's flags (ferro-dns --help), e.g. --upstream 10.0.0.2 or --no-forward
FERRO_DNS_ARGS=""
EOF
config_file /etc/ferro/csi.env 644 <<EOF
# ferro-csi: this node's name and flags (ferro-csi --help), e.g. --pool-size 50Gi
NODE_NAME=$NODE_NAME
FERRO_CSI_ARGS=""
EOF

# --- kubeconfigs: signed here on a control-plane node, given on a worker
kubeconfig_for() { # component user [group]
  local c=$1 user=$2 group=${3:-} dest=/etc/ferro/$1.kubeconfig
  if [ -s "$ROOT$dest" ]; then record "$dest"; return 0; fi
  note_change "write $dest ($user)"
  if [ "$DRY_RUN" = 0 ]; then
    local tmp
    tmp=$(mktemp)
    if [ "$ROLE" = control-plane ]; then
      # the cluster CA is made in the control plane's data dir on first use and is the one
      # ferro-control-plane.service serves with
      install -d -m 700 "$ROOT/var/lib/ferro/control-plane"
      local groups=()
      [ -z "$group" ] || groups=(--group "$group")
      "$BIN_DIR/ferro-control-plane" kubeconfig --data-dir "$ROOT/var/lib/ferro/control-plane" \
        --user "$user" "${groups[@]}" --server "$API_SERVER" >"$tmp"
    else
      cat "$KUBECONFIG_DIR/$c.kubeconfig" >"$tmp"
    fi
    install -m 600 "$tmp" "$ROOT$dest"
    rm -f "$tmp"
  fi
  record "$dest"
}
# Identities: the agent and netd (which reads Nodes and annotates its own) as the node's user,
# under the Node authorizer; the proxy as upstream's system:kube-proxy (system:node-proxier);
# dns as system:ferro-dns (its ClusterRole: services and EndpointSlices); csi as
# system:ferro-csi (its ClusterRole: what upstream's provisioner and snapshotter sidecars are
# granted, and the create of its CSIDriver object).
if [ -n "$TOKEN" ]; then
  # the TLS-bootstrap join: the agent asks for its own certificate with the token and writes
  # /etc/ferro/agent.kubeconfig (recorded, so --uninstall removes it too)
  if [ -n "$CA_HASH" ]; then
    # discovered before anything was installed (below the argument checks)
    [ -z "$DISCOVERED" ] || install_file "$DISCOVERED" "$BOOT" 600
  else
  boot_tmp=$(mktemp)
  ca_data=$(base64 -w0 <"$CA_FILE")
  cat >"$boot_tmp" <<EOF
apiVersion: v1
kind: Config
clusters:
- name: ferro
  cluster:
    server: $API_SERVER
    certificate-authority-data: $ca_data
contexts:
- name: tls-bootstrap
  context:
    cluster: ferro
    user: tls-bootstrap
current-context: tls-bootstrap
users:
- name: tls-bootstrap
  user:
    token: $TOKEN
EOF
  install_file "$boot_tmp" "$BOOT" 600
  rm -f "$boot_tmp"
  fi
  record /etc/ferro/agent.kubeconfig
else
  kubeconfig_for agent "system:node:$NODE_NAME" system:nodes
fi
kubeconfig_for netd "system:node:$NODE_NAME" system:nodes
kubeconfig_for proxy system:kube-proxy
kubeconfig_for dns system:ferro-dns
kubeconfig_for csi system:ferro-csi

# --- enable and start
if [ -z "$ENABLE" ]; then
  if systemd_here; then ENABLE=1; else ENABLE=0; fi
fi
if [ "$DRY_RUN" = 0 ]; then
  if systemd_here; then systemctl daemon-reload; fi
  if [ "$ENABLE" = 1 ]; then
    services=()
    for u in "${UNITS[@]}"; do services+=("$u.service"); done
    if systemd_here; then
      # an upgrade: units already running whose binary or unit file changed restart (the
      # control plane first: the others wait for it to answer)
      restart=()
      for u in "${CHANGED_UNITS[@]}"; do
        if systemctl is-active --quiet "$u"; then restart+=("$u"); fi
      done
      if [ "${#restart[@]}" -gt 0 ]; then
        say "restarting ${restart[*]} (binary or unit changed)"
        others=()
        for u in "${restart[@]}"; do
          if [ "$u" = ferro-control-plane.service ]; then
            systemctl restart "$u"
          else
            others+=("$u")
          fi
        done
        if [ "${#others[@]}" -gt 0 ]; then systemctl restart "${others[@]}"; fi
      fi
      # the control plane first: the others wait for it to answer
      if [ "$ROLE" = control-plane ]; then systemctl enable --now ferro-control-plane.service; fi
      systemctl enable --now "${services[@]}"
    else
      systemctl_root enable "${services[@]}" >/dev/null 2>&1
    fi
  fi
fi
if [ "$CHANGED" = 0 ]; then
  say "nothing to change: ferro ($ROLE, node $NODE_NAME) is installed under ${ROOT:-/}"
else
  say "$CHANGED change(s): ferro ($ROLE, node $NODE_NAME) installed under ${ROOT:-/}"
fi
