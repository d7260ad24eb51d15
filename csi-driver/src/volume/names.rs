//! Names: the driver's name and topology key, volume and snapshot IDs, and where each lives on
//! disk. IDs derive from the CO's request name so that a retried CreateVolume finds the volume
//! its first try made without any index, and every path built from an ID is checked first: an
//! ID that is not one of ours can never name a path outside the data dir.

use std::path::{Path, PathBuf};

/// The CSI driver name (`GetPluginInfo`, the StorageClass's provisioner, the CSINode entry).
pub const DRIVER_NAME: &str = "loop.csi.ferro.dev";
/// The topology key NodeGetInfo reports and volumes are pinned to.
pub const TOPOLOGY_KEY: &str = "topology.loop.csi.ferro.dev/node";

const VOLUME_PREFIX: &str = "loop-";
const SNAPSHOT_PREFIX: &str = "snap-";
/// Hex digits of the name's SHA-256 kept in an ID (128 bits).
const ID_HEX: usize = 32;

fn digest_hex(name: &str) -> String {
    let d = ring::digest::digest(&ring::digest::SHA256, name.as_bytes());
    let mut hex = data_encoding::HEXLOWER.encode(d.as_ref());
    hex.truncate(ID_HEX);
    hex
}

/// The volume ID of the volume made for request name `name`.
pub fn volume_id(name: &str) -> String {
    format!("{VOLUME_PREFIX}{}", digest_hex(name))
}

/// The ID ferro-csi keeps an inline (CSI "Ephemeral") volume under, for the volume ID the CO
/// chose (kubelet: `csi-<sha256(pod uid + volume name)>`). The CO's ID is any string, so it
/// never names a path itself; the prefix keeps these IDs apart from those of CreateVolume
/// names.
pub fn ephemeral_volume_id(co_volume_id: &str) -> String {
    volume_id(&format!("{EPHEMERAL_NAME_PREFIX}{co_volume_id}"))
}

const EPHEMERAL_NAME_PREFIX: &str = "ephemeral:";

/// The snapshot ID of the snapshot made for request name `name`.
pub fn snapshot_id(name: &str) -> String {
    format!("{SNAPSHOT_PREFIX}{}", digest_hex(name))
}

fn well_formed(id: &str, prefix: &str) -> bool {
    id.strip_prefix(prefix).is_some_and(|hex| {
        hex.len() == ID_HEX
            && hex
                .bytes()
                .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
    })
}

/// Whether `id` has the shape of a volume ID ferro-csi hands out.
pub fn is_volume_id(id: &str) -> bool {
    well_formed(id, VOLUME_PREFIX)
}

/// Whether `id` has the shape of a snapshot ID ferro-csi hands out.
pub fn is_snapshot_id(id: &str) -> bool {
    well_formed(id, SNAPSHOT_PREFIX)
}

/// The data dir's layout: `volumes/<id>/{record.json,disk.img}`,
/// `snapshots/<id>/{record.json,disk.img}` and `staging/<id>`, where an inline volume's
/// filesystem is mounted (the CO stages only persistent volumes). Staging dirs live outside
/// the volume dirs: removing a volume dir never walks into a mounted filesystem.
#[derive(Clone, Debug)]
pub struct Layout {
    root: PathBuf,
}

impl Layout {
    pub fn new(root: impl Into<PathBuf>) -> Layout {
        Layout { root: root.into() }
    }
    pub fn root(&self) -> &Path {
        &self.root
    }
    pub fn volumes(&self) -> PathBuf {
        self.root.join("volumes")
    }
    pub fn snapshots(&self) -> PathBuf {
        self.root.join("snapshots")
    }
    /// A volume's directory; `id` must have passed [`is_volume_id`].
    pub fn volume_dir(&self, id: &str) -> PathBuf {
        debug_assert!(is_volume_id(id));
        self.volumes().join(id)
    }
    pub fn volume_disk(&self, id: &str) -> PathBuf {
        self.volume_dir(id).join("disk.img")
    }
    /// A snapshot's directory; `id` must have passed [`is_snapshot_id`].
    pub fn snapshot_dir(&self, id: &str) -> PathBuf {
        debug_assert!(is_snapshot_id(id));
        self.snapshots().join(id)
    }
    pub fn snapshot_disk(&self, id: &str) -> PathBuf {
        self.snapshot_dir(id).join("disk.img")
    }
    /// Where an inline volume is staged; `id` must have passed [`is_volume_id`].
    pub fn staging_dir(&self, id: &str) -> PathBuf {
        debug_assert!(is_volume_id(id));
        self.root.join("staging").join(id)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_are_stable_per_name_and_distinct_between_names() {
        let a = volume_id("pvc-1");
        assert_eq!(a, volume_id("pvc-1"));
        assert_ne!(a, volume_id("pvc-2"));
        assert!(is_volume_id(&a), "{a}");
        assert!(!is_snapshot_id(&a));
        let s = snapshot_id("pvc-1");
        assert!(is_snapshot_id(&s) && !is_volume_id(&s), "{s}");
        assert_eq!(a.len(), "loop-".len() + 32);
    }

    #[test]
    fn ids_that_could_escape_the_data_dir_are_not_ids() {
        for bad in [
            "",
            "loop-",
            "../../etc/passwd",
            "loop-../../../../etc/shadow000000000",
            "loop-0123456789abcdef0123456789ABCDEF",
            "loop-0123456789abcdef0123456789abcdef0",
            "loop-0123456789abcdef0123456789abcde/",
            "some-vol-id",
        ] {
            assert!(!is_volume_id(bad), "{bad:?} taken for a volume id");
        }
    }

    #[test]
    fn ephemeral_ids_are_volume_ids_apart_from_create_names() {
        let co = "csi-0123456789abcdef";
        let id = ephemeral_volume_id(co);
        assert!(is_volume_id(&id), "{id}");
        assert_eq!(id, ephemeral_volume_id(co));
        assert_ne!(id, volume_id(co), "a CreateVolume named like the CO's ID is another volume");
        assert_ne!(id, ephemeral_volume_id("csi-other"));
        for hostile in ["../../etc", "", "/dev/sda"] {
            assert!(is_volume_id(&ephemeral_volume_id(hostile)));
        }
    }

    #[test]
    fn layout_keeps_each_object_in_its_own_directory() {
        let l = Layout::new("/var/lib/ferro/csi");
        let id = volume_id("x");
        assert_eq!(
            l.volume_disk(&id),
            PathBuf::from(format!("/var/lib/ferro/csi/volumes/{id}/disk.img"))
        );
        let s = snapshot_id("x");
        assert_eq!(
            l.snapshot_dir(&s),
            PathBuf::from(format!("/var/lib/ferro/csi/snapshots/{s}"))
        );
        assert_eq!(
            l.staging_dir(&id),
            PathBuf::from(format!("/var/lib/ferro/csi/staging/{id}"))
        );
        assert!(!l.staging_dir(&id).starts_with(l.volume_dir(&id)));
    }
}
