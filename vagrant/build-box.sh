#!/usr/bin/env bash
# Builds the Vagrant box ferro's VMs run (libvirt provider), offline from the Debian mirror
# apt already uses: a minimal Debian 12 root (mmdebstrap), the cloud kernel, GRUB on a
# one-partition disk, ssh with Vagrant's insecure key for the first login (Vagrant replaces
# it), the QEMU guest agent, containerd, runc and crun (the second OCI runtime
# vagrant/pod-startup-bench.sh compares), and the tools ferro's units call (iptables,
# nftables, e2fsprogs, xfsprogs). No registry and no image from the network: only .deb
# packages.
#
#   vagrant/build-box.sh [--force]     prints the path of the .box file
#
# The box is cached in /var/cache/ferro/vagrant/ferro-debian12-<hash>.box, the hash covering
# this script and the mirror, and added to Vagrant as ferro/debian12 by vagrant/cluster.sh.
# Needs root (a loop device for the disk image).
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=scripts/lib.sh
. scripts/lib.sh
ferro_require_root

FORCE=0
[ "${1:-}" = --force ] && FORCE=1
CACHE=${FERRO_BOX_CACHE:-/var/cache/ferro/vagrant}
SUITE=bookworm
DISK_SIZE=${FERRO_BOX_DISK:-12G}
PACKAGES=(
  systemd-sysv udev dbus linux-image-cloud-amd64 grub-pc initramfs-tools
  openssh-server sudo qemu-guest-agent ca-certificates procps iproute2 iputils-ping kmod
  containerd runc crun containernetworking-plugins iptables nftables conntrack e2fsprogs xfsprogs
  util-linux mount
)

for cmd in mmdebstrap sfdisk qemu-img mkfs.ext4; do
  command -v "$cmd" >/dev/null 2>&1 || {
    echo "build-box: installing mmdebstrap fdisk qemu-utils e2fsprogs" >&2
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
      mmdebstrap fdisk qemu-utils e2fsprogs >&2
    break
  }
done
# The key Vagrant logs in with the first time (its well-known insecure key, shipped with
# Vagrant itself); `config.ssh.insert_key` replaces it with a key of the VM's own.
VAGRANT_PUB=$(find /usr/share/rubygems-integration /usr/lib/ruby /opt/vagrant -path '*vagrant*/keys/vagrant.pub' 2>/dev/null | head -1 || true)
[ -n "$VAGRANT_PUB" ] || { echo "build-box: Vagrant's keys/vagrant.pub not found: install vagrant first" >&2; exit 1; }

mirror=$(awk '/^URIs:/ {print $2; exit} /^deb / {print $2; exit}' /etc/apt/sources.list.d/debian.sources /etc/apt/sources.list 2>/dev/null | head -1)
mirror=${mirror:-http://deb.debian.org/debian}
hash=$( (cat "$0"; echo "$mirror") | sha256sum | cut -c1-16)
box="$CACHE/ferro-debian12-$hash.box"
if [ -s "$box" ] && [ "$FORCE" = 0 ]; then
  echo "$box"
  exit 0
fi
mkdir -p "$CACHE"
work=$(mktemp -d "$CACHE/build.XXXXXX")
loop=""
made_node=""
mnt="$work/mnt"
cleanup() {
  for m in dev/pts dev proc sys ""; do
    mountpoint -q "$mnt/$m" 2>/dev/null && umount "$mnt/$m"
  done
  [ -n "$loop" ] && losetup -d "$loop" 2>/dev/null
  [ -n "$made_node" ] && rm -f "$made_node"
  rm -rf "$work"
}
trap cleanup EXIT

# the root file system as a tarball, cached by its package list and mirror (the slow part)
inc=$(IFS=,; echo "${PACKAGES[*]}")
root_tar="$CACHE/root-$(echo "$SUITE $inc $mirror" | sha256sum | cut -c1-16).tar"
if [ ! -s "$root_tar" ] || [ "$FORCE" = 1 ]; then
  echo "build-box: mmdebstrap $SUITE from $mirror" >&2
  mmdebstrap --quiet --variant=minbase --include="$inc" "$SUITE" "$work/root.tar" "$mirror" >&2
  mv "$work/root.tar" "$root_tar"
fi

echo "build-box: disk image ($DISK_SIZE, one ext4 partition, GRUB)" >&2
truncate -s "$DISK_SIZE" "$work/disk.raw"
printf 'label: dos\n,,83,*\n' | sfdisk --quiet "$work/disk.raw"
loop=$(losetup --find --show --partscan "$work/disk.raw")
# the partition's device node (without udev, as in a container, nobody else makes it)
part_sys=/sys/block/$(basename "$loop")/$(basename "$loop")p1
# (the kernel's own scan at attach does not always run: ask for the partitions explicitly)
[ -e "$part_sys/dev" ] || partx --add "$loop"
made_node=""
if [ ! -b "${loop}p1" ]; then
  mknod "${loop}p1" b "$(cut -d: -f1 "$part_sys/dev")" "$(cut -d: -f2 "$part_sys/dev")"
  made_node=${loop}p1
fi
mkfs.ext4 -q -L ferro-root "${loop}p1"
mkdir "$mnt"
mount "${loop}p1" "$mnt"
# --xattrs: file capabilities (ping's cap_net_raw) live in extended attributes
tar --xattrs --xattrs-include='*' --numeric-owner -xpf "$root_tar" -C "$mnt"

cat >"$mnt/etc/fstab" <<'EOF'
LABEL=ferro-root / ext4 errors=remount-ro 0 1
EOF
# every VM gets its own machine id and ssh host keys at its first boot
: >"$mnt/etc/machine-id"
rm -f "$mnt"/etc/ssh/ssh_host_*
mkdir -p "$mnt/etc/systemd/system/ssh.service.d"
cat >"$mnt/etc/systemd/system/ssh.service.d/host-keys.conf" <<'EOF'
[Service]
ExecStartPre=
ExecStartPre=/bin/sh -c 'for t in ecdsa ed25519; do f=/etc/ssh/ssh_host_$${t}_key; [ -s $$f ] || ssh-keygen -q -t $$t -N "" -f $$f; done'
ExecStartPre=/usr/sbin/sshd -t
EOF
# (no RSA host key: generating one takes a minute under software emulation; ECDSA and Ed25519
# are what ssh clients negotiate first anyway)
printf 'UseDNS no\nHostKey /etc/ssh/ssh_host_ecdsa_key\nHostKey /etc/ssh/ssh_host_ed25519_key\n' >"$mnt/etc/ssh/sshd_config.d/vagrant.conf"
# the first NIC (QEMU's user-mode network: ssh from the host only) by DHCP; the private
# network between the VMs is configured by vagrant/provision.sh with the node's address
cat >"$mnt/etc/systemd/network/10-eth0.network" <<'EOF'
[Match]
Name=eth0

[Network]
DHCP=ipv4
EOF
echo localhost >"$mnt/etc/hostname"
chroot "$mnt" systemctl enable systemd-networkd.service ssh.service >/dev/null 2>&1
# the vagrant user, password-less sudo, Vagrant's insecure key for the first login
chroot "$mnt" useradd --create-home --shell /bin/bash vagrant
echo 'vagrant ALL=(ALL) NOPASSWD: ALL' >"$mnt/etc/sudoers.d/vagrant"
chmod 0440 "$mnt/etc/sudoers.d/vagrant"
install -d -m 0700 -o 1000 -g 1000 "$mnt/home/vagrant/.ssh"
install -m 0600 -o 1000 -g 1000 "$VAGRANT_PUB" "$mnt/home/vagrant/.ssh/authorized_keys"

# GRUB on the disk, the serial console, classic interface names (eth0, eth1)
cat >"$mnt/etc/default/grub" <<'EOF'
GRUB_DEFAULT=0
GRUB_TIMEOUT=0
GRUB_DISTRIBUTOR=Debian
GRUB_CMDLINE_LINUX_DEFAULT=""
GRUB_CMDLINE_LINUX="console=ttyS0 net.ifnames=0 biosdevname=0"
GRUB_TERMINAL=serial
GRUB_SERIAL_COMMAND="serial --unit=0 --speed=115200"
EOF
for m in dev dev/pts proc sys; do mount --bind "/$m" "$mnt/$m"; done
chroot "$mnt" grub-install --target=i386-pc "$loop" >&2
chroot "$mnt" update-grub >&2
# without udev in the build there is no /dev/disk/by-uuid, so update-grub named the build's
# loop device as the root: the file system's label instead (update-grub in the VM, with udev,
# writes its UUID)
sed -i "s|root=${loop}p1|root=LABEL=ferro-root|g" "$mnt/boot/grub/grub.cfg"
grep -q "root=LABEL=ferro-root" "$mnt/boot/grub/grub.cfg" || { echo "build-box: no root= in grub.cfg" >&2; exit 1; }
for m in dev/pts dev proc sys; do umount "$mnt/$m"; done
umount "$mnt"
losetup -d "$loop"
loop=""
[ -n "$made_node" ] && rm -f "$made_node"
made_node=""

echo "build-box: qcow2 and box" >&2
qemu-img convert -c -O qcow2 "$work/disk.raw" "$work/box.img"
rm -f "$work/disk.raw"
virtual=$(qemu-img info --output=json "$work/box.img" | python3 -c 'import json,sys; print(json.load(sys.stdin)["virtual-size"] // 2**30)')
printf '{"provider": "libvirt", "format": "qcow2", "virtual_size": %s}\n' "$virtual" >"$work/metadata.json"
cat >"$work/Vagrantfile" <<'EOF'
Vagrant.configure("2") do |config|
  config.vm.provider :libvirt do |libvirt|
    libvirt.disk_bus = "virtio"
  end
end
EOF
tar -C "$work" -cf "$box.tmp" metadata.json Vagrantfile box.img
mv "$box.tmp" "$box"
echo "$box"
