#!/usr/bin/env bash
# Runs inside a ferro VM as root (Vagrant's shell provisioner): the node's private address,
# the test images into containerd (no registry: the box is offline), then scripts/install.sh
# from the bundle the host built, as a control plane or as a worker joining with a bootstrap
# token.
#
#   provision.sh control-plane|worker NODE_IP CONTROL_PLANE_IP
#
# Files Vagrant copied in: /tmp/ferro-bundle.tar.gz (bin/, scripts/, systemd/, images/), and
# on a worker /tmp/ferro-join.tar.gz (token, ca.crt, kubeconfigs/ for netd, proxy, dns, csi).
set -euo pipefail
role=${1:?role} ip=${2:?node ip} cp_ip=${3:?control plane ip}
name=$(hostname)

# the private network: the second NIC, a static address (the first is Vagrant's management
# network, DHCP)
nic=$(ip -o link | awk -F': ' '$2 != "lo" {print $2}' | sed -n 2p)
[ -n "$nic" ] || { echo "provision: no second network interface" >&2; exit 1; }
mac=$(cat "/sys/class/net/$nic/address")
cat >/etc/systemd/network/20-ferro-private.network <<EOF
[Match]
MACAddress=$mac

[Network]
Address=$ip/24
EOF
ip addr replace "$ip/24" dev "$nic"
ip link set "$nic" up

rm -rf /opt/ferro
mkdir -p /opt/ferro
tar -xzf /tmp/ferro-bundle.tar.gz -C /opt/ferro
install -m 0755 /opt/ferro/bin/kubectl /usr/local/bin/kubectl

# images: imported into the CRI plugin's namespace; ferro's pause is also tagged with the name
# containerd's CRI plugin runs sandboxes from (its sandbox_image)
systemctl start containerd
for t in /opt/ferro/images/*.tar; do
  ctr -n k8s.io images import --all-platforms "$t" >/dev/null
done
sandbox=$(containerd config dump 2>/dev/null | awk -F'"' '/sandbox_image/ {print $2; exit}')
[ -n "$sandbox" ] && ctr -n k8s.io images tag --force registry.ferro.test/pause:1 "$sandbox" >/dev/null

args=(--bin-dir /opt/ferro/bin --node-name "$name" --node-ip "$ip")
if [ "$role" = control-plane ]; then
  /opt/ferro/scripts/install.sh --role control-plane "${args[@]}" \
    --api-server "https://$cp_ip:6443"
else
  rm -rf /opt/ferro/join
  mkdir -p /opt/ferro/join
  tar -xzf /tmp/ferro-join.tar.gz -C /opt/ferro/join
  /opt/ferro/scripts/install.sh --role worker "${args[@]}" \
    --api-server "https://$cp_ip:6443" --token "$(cat /opt/ferro/join/token)" \
    --ca-file /opt/ferro/join/ca.crt --kubeconfig-dir /opt/ferro/join/kubeconfigs
fi
