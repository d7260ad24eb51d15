#!/usr/bin/env bash
# Shared by up.sh, down.sh and test.sh: installs what ferro needs on Debian 12.
set -euo pipefail

FERRO_APT_PACKAGES=(iproute2 iputils-ping iptables nftables containernetworking-plugins curl ca-certificates e2fsprogs xfsprogs util-linux procps
  containerd runc umoci skopeo busybox-static file protobuf-compiler iperf3)

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
