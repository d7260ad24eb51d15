#!/usr/bin/env bash
# Shared by up.sh, down.sh and test.sh: installs what ferro needs on Debian 12, and the lab's
# names and places (docs/design/lab.md, "The quick start").
set -euo pipefail

FERRO_APT_PACKAGES=(iproute2 iputils-ping iptables nftables containernetworking-plugins curl ca-certificates e2fsprogs xfsprogs util-linux procps
  containerd runc umoci skopeo busybox-static file protobuf-compiler libprotobuf-dev iperf3 docker-registry ipset
  etcd-server etcd-client dnsmasq-base dnsperf
  mmdebstrap systemd-container) # the units' test: a Debian root booted under systemd-nspawn

# The quick start's lab (up.sh, down.sh).
# shellcheck disable=SC2034 # used by the scripts that source this file
{
  LAB_NS=ferro-lab                          # the lab's network namespace
  LAB_STATE=/run/ferro/lab                  # pids, logs, containerd's state and socket
  LAB_DATA=/var/lib/ferro/lab               # control plane, registry, containerd root, CNI, agent
  LAB_LOGS=/var/log/ferro-lab               # pod logs (podLogsDir)
  LAB_CGROUP_ROOT=/ferro-lab                # the agent's --cgroup-root (pod cgroups under it)
  LAB_REGISTRY=127.0.0.1:5000               # docker-registry, inside the namespace
  LAB_CTRD_SOCK=$LAB_STATE/containerd/containerd.sock
  LAB_NODE=ferro-node-1
  LAB_POD_CIDR=10.244.0.0/24
  LAB_DNS_IP=169.254.20.10                  # ferro-dns on its own link in the namespace: the pods' clusterDNS
}

# The build up.sh, lab-up.sh and down.sh use: cargo's dev profile (ferro's crates without
# optimisation, their dependencies at opt-level 1, no debug info for them: Cargo.toml), which
# builds in about half the time of --release and is the build scripts/test.sh makes, so the
# README's two commands build the dependencies once. FERRO_PROFILE=release for optimised
# binaries (what install.sh installs on hosts and what docs/performance.md measures).
FERRO_PROFILE=${FERRO_PROFILE:-dev}
ferro_build() { cargo build --profile "$FERRO_PROFILE" "$@"; }
ferro_bin_dir() {
  local dir=${CARGO_TARGET_DIR:-$PWD/target}
  if [ "$FERRO_PROFILE" = dev ]; then echo "$dir/debug"; else echo "$dir/$FERRO_PROFILE"; fi
}

ferro_require_root() {
  if [ "$(id -u)" -ne 0 ]; then
    echo "error: run as root (ferro builds network namespaces)" >&2
    exit 1
  fi
}

ferro_install_deps() {
  local missing=()
  local p
  for p in "${FERRO_APT_PACKAGES[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
  done
  if ! command -v kubectl >/dev/null 2>&1; then
    # Debian's own kubectl is old but enough for the basics; a newer one on PATH wins.
    missing+=(kubernetes-client)
  fi
  if [ "${#missing[@]}" -gt 0 ]; then
    echo "installing Debian packages: ${missing[*]}" >&2
    DEBIAN_FRONTEND=noninteractive apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}"
    if printf '%s\n' "${missing[@]}" | grep -qx docker-registry && [ -d /run/systemd/system ]; then
      # The package enables and starts a system-wide registry on :5000 of the root network
      # namespace; the lab runs its own inside its namespace and wants none outside it.
      systemctl disable --now docker-registry.service >/dev/null 2>&1 || true
    fi
    if printf '%s\n' "${missing[@]}" | grep -qx etcd-server && [ -d /run/systemd/system ]; then
      # Likewise etcd-server starts a system etcd on 127.0.0.1:2379; the tests start their own
      # (on free loopback ports, removed after each test).
      systemctl disable --now etcd.service >/dev/null 2>&1 || true
    fi
  fi
  if ! command -v cargo >/dev/null 2>&1; then
    if [ -x "$HOME/.cargo/bin/cargo" ]; then
      export PATH="$HOME/.cargo/bin:$PATH"
    else
      echo "error: cargo (Rust 1.89 or newer) is needed; install it with rustup" >&2
      exit 1
    fi
  fi
}

# Every test binary `cargo test --workspace --no-run` built (nothing is compiled again), one
# per line: "<package dir>\t<executable>\t<target kind>" (kind: lib, bin or test). Running
# them directly from their package dir is what `cargo test` does, without cargo's second look
# at features: `cargo test -p <one package>` unifies features differently from the workspace
# build and recompiles dozens of crates.
ferro_test_binaries() {
  cargo test --workspace --no-run --message-format=json 2>/dev/null | python3 -c '
import sys, json, os
for line in sys.stdin:
    try:
        m = json.loads(line)
    except ValueError:
        continue
    if m.get("reason") == "compiler-artifact" and m.get("executable") and m["profile"]["test"]:
        kind = m["target"]["kind"][0]
        print(os.path.dirname(m["manifest_path"]) + "\t" + m["executable"] + "\t" + kind)
'
}
