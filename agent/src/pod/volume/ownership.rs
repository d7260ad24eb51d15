//! Volume ownership for a pod's fsGroup: upstream's SetVolumeOwnership (pkg/volume/volume_linux.go).
//!
//! Every file and directory of the volume (symlinks included, without following them) gets the
//! group fsGroup; files get group read-write (read for read-only volumes) added to their mode,
//! directories the same plus group search and the setgid bit, so that what is created in them
//! later belongs to fsGroup too. Bits are only ever added: a configMap file of mode 0400 becomes
//! 0440, one of 0644 stays 0644. Symlinks keep their mode (a chmod would reach their target).
//!
//! Which volumes and when, as upstream: emptyDir once, when it is set up (read-write); configMap,
//! secret, downwardAPI and projected volumes whenever a new payload is written, over the whole
//! volume before the `..data` swap (read-only). hostPath volumes are never touched. Those volume
//! types always walk the whole tree (upstream passes no fsGroupChangePolicy for them);
//! [`ChangePolicy::OnRootMismatch`] is for volumes that honour the pod's policy.

use std::fs;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::Path;

use super::VolumeError;

/// Group read-write (upstream rwMask).
const RW_MASK: u32 = 0o660;
/// Group read (upstream roMask).
const RO_MASK: u32 = 0o440;
/// Search on directories (upstream execMask).
const EXEC_MASK: u32 = 0o110;
const SETGID: u32 = 0o2000;

/// The pod's fsGroupChangePolicy.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ChangePolicy {
    /// Walk the whole volume every time (the default).
    Always,
    /// Skip the walk when the volume's root already has the group, the permissions and setgid.
    OnRootMismatch,
}

impl ChangePolicy {
    /// From the pod's `securityContext.fsGroupChangePolicy` (anything but OnRootMismatch is
    /// Always).
    pub fn from_spec(policy: Option<&str>) -> ChangePolicy {
        match policy {
            Some("OnRootMismatch") => ChangePolicy::OnRootMismatch,
            _ => ChangePolicy::Always,
        }
    }
}

/// The permission bits (`mode & 0o7777`) an entry gets: `mode` with the group bits added (upstream
/// changeFilePermission).
pub fn wanted_mode(mode: u32, is_dir: bool, read_only: bool) -> u32 {
    let mut mask = if read_only { RO_MASK } else { RW_MASK };
    if is_dir {
        mask |= SETGID | EXEC_MASK;
    }
    (mode & 0o7777) | mask
}

/// Whether the volume's root already is as the walk would leave it (upstream's
/// requiresPermissionChange, negated): the group is fsGroup, it is a directory whose permission
/// bits include the group bits, and it has setgid.
pub fn root_is_set(root_gid: u32, root_mode: u32, is_dir: bool, fs_group: u32, read_only: bool) -> bool {
    if root_gid != fs_group || !is_dir {
        return false;
    }
    let perms = (if read_only { RO_MASK } else { RW_MASK }) | EXEC_MASK;
    root_mode & perms == perms && root_mode & SETGID != 0
}

/// Gives `dir` and everything under it the group `fs_group` and the group permissions (see the
/// module). An entry that cannot be chowned or chmodded is logged and skipped, as upstream; an
/// entry that cannot be read (lstat, readdir) ends the walk with an error.
pub fn set_volume_ownership(
    dir: &Path,
    fs_group: u32,
    policy: ChangePolicy,
    read_only: bool,
) -> Result<(), VolumeError> {
    if policy == ChangePolicy::OnRootMismatch {
        if let Ok(m) = fs::metadata(dir) {
            if root_is_set(m.gid(), m.mode(), m.is_dir(), fs_group, read_only) {
                tracing::debug!(path = %dir.display(), "volume root already owned by fsGroup; skipping the walk");
                return Ok(());
            }
        }
    }
    let meta = fs::symlink_metadata(dir).map_err(io("stat", dir))?;
    walk(dir, &meta, fs_group, read_only)
}

fn io(op: &'static str, path: &Path) -> impl FnOnce(std::io::Error) -> VolumeError {
    let path = path.to_path_buf();
    move |source| VolumeError::Io { op, path, source }
}

/// Children first, then the entry itself (upstream's walkDeep); symlinks are not followed.
fn walk(path: &Path, meta: &fs::Metadata, fs_group: u32, read_only: bool) -> Result<(), VolumeError> {
    if meta.is_dir() {
        for entry in fs::read_dir(path).map_err(io("read directory", path))? {
            let child = entry.map_err(io("read directory", path))?.path();
            let child_meta = fs::symlink_metadata(&child).map_err(io("stat", &child))?;
            walk(&child, &child_meta, fs_group, read_only)?;
        }
    }
    change(path, meta, fs_group, read_only);
    Ok(())
}

fn change(path: &Path, meta: &fs::Metadata, fs_group: u32, read_only: bool) {
    if let Err(error) = std::os::unix::fs::lchown(path, None, Some(fs_group)) {
        tracing::warn!(path = %path.display(), %error, "lchown to the pod's fsGroup failed");
    }
    if meta.file_type().is_symlink() {
        return;
    }
    let mode = wanted_mode(meta.mode(), meta.is_dir(), read_only);
    if let Err(error) = fs::set_permissions(path, fs::Permissions::from_mode(mode)) {
        tracing::warn!(path = %path.display(), %error, "chmod for the pod's fsGroup failed");
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use std::os::unix::fs::symlink;

    use super::*;

    fn stat(p: &Path) -> (u32, u32) {
        let m = fs::symlink_metadata(p).unwrap();
        (m.gid(), m.mode() & 0o7777)
    }

    fn chmod(p: &Path, mode: u32) {
        fs::set_permissions(p, fs::Permissions::from_mode(mode)).unwrap();
    }

    #[test]
    fn modes_as_upstream() {
        assert_eq!(wanted_mode(0o644, false, false), 0o664);
        assert_eq!(wanted_mode(0o600, false, false), 0o660);
        assert_eq!(wanted_mode(0o644, false, true), 0o644);
        assert_eq!(wanted_mode(0o400, false, true), 0o440);
        assert_eq!(wanted_mode(0o000, false, true), 0o440);
        assert_eq!(wanted_mode(0o755, true, false), 0o2775);
        assert_eq!(wanted_mode(0o700, true, true), 0o2750);
        assert_eq!(wanted_mode(0o1777, true, false), 0o3777, "sticky kept");
        assert_eq!(wanted_mode(0o40755, true, false), 0o2775, "file type bits dropped");
    }

    #[test]
    fn root_check() {
        assert!(root_is_set(2000, 0o2770, true, 2000, false));
        assert!(root_is_set(2000, 0o2777, true, 2000, false));
        assert!(root_is_set(2000, 0o2550, true, 2000, true));
        assert!(!root_is_set(2000, 0o2550, true, 2000, false), "group write missing");
        assert!(!root_is_set(2000, 0o0770, true, 2000, false), "no setgid");
        assert!(!root_is_set(0, 0o2770, true, 2000, false), "wrong group");
        assert!(!root_is_set(2000, 0o2770, false, 2000, false), "not a directory");
        assert_eq!(ChangePolicy::from_spec(Some("OnRootMismatch")), ChangePolicy::OnRootMismatch);
        assert_eq!(ChangePolicy::from_spec(Some("Always")), ChangePolicy::Always);
        assert_eq!(ChangePolicy::from_spec(None), ChangePolicy::Always);
    }

    #[test]
    #[ignore = "privileged: needs root (chown, tmpfs and bind mounts); run by scripts/test.sh"]
    fn walk_sets_group_and_modes() {
        assert!(nix::unistd::geteuid().is_root(), "the ownership tests chown: run them as root");
        let tmp = tempfile::tempdir().unwrap();
        let v = tmp.path().join("vol");
        fs::create_dir_all(v.join("sub/deeper")).unwrap();
        chmod(&v, 0o777);
        chmod(&v.join("sub"), 0o700);
        fs::write(v.join("f"), "x").unwrap();
        chmod(&v.join("f"), 0o600);
        fs::write(v.join("sub/deeper/g"), "y").unwrap();
        chmod(&v.join("sub/deeper/g"), 0o644);
        // A symlink to a file outside the volume: only the link's group changes.
        let outside = tmp.path().join("outside");
        fs::write(&outside, "o").unwrap();
        chmod(&outside, 0o600);
        symlink(&outside, v.join("link")).unwrap();

        set_volume_ownership(&v, 2000, ChangePolicy::Always, false).unwrap();
        assert_eq!(stat(&v), (2000, 0o2777));
        assert_eq!(stat(&v.join("sub")), (2000, 0o2770));
        assert_eq!(stat(&v.join("sub/deeper")).0, 2000);
        assert_eq!(stat(&v.join("f")), (2000, 0o660));
        assert_eq!(stat(&v.join("sub/deeper/g")), (2000, 0o664));
        assert_eq!(stat(&v.join("link")).0, 2000);
        assert_eq!(stat(&outside), (0, 0o600), "the link's target is left alone");

        // New entries in a setgid directory inherit the group.
        fs::write(v.join("sub/new"), "n").unwrap();
        assert_eq!(stat(&v.join("sub/new")).0, 2000);

        // Read-only: group read only.
        let ro = tmp.path().join("ro");
        fs::create_dir(&ro).unwrap();
        chmod(&ro, 0o755);
        fs::write(ro.join("k"), "v").unwrap();
        chmod(&ro.join("k"), 0o400);
        set_volume_ownership(&ro, 3000, ChangePolicy::Always, true).unwrap();
        assert_eq!(stat(&ro), (3000, 0o2755));
        assert_eq!(stat(&ro.join("k")), (3000, 0o440));
    }

    #[test]
    #[ignore = "privileged: needs root (chown, tmpfs and bind mounts); run by scripts/test.sh"]
    fn on_root_mismatch_skips_a_set_root() {
        assert!(nix::unistd::geteuid().is_root(), "the ownership tests chown: run them as root");
        let tmp = tempfile::tempdir().unwrap();
        let v = tmp.path().join("vol");
        fs::create_dir(&v).unwrap();
        chmod(&v, 0o755);
        fs::write(v.join("f"), "x").unwrap();
        chmod(&v.join("f"), 0o600);
        // Root not set: the walk runs.
        set_volume_ownership(&v, 2000, ChangePolicy::OnRootMismatch, false).unwrap();
        assert_eq!(stat(&v), (2000, 0o2775));
        assert_eq!(stat(&v.join("f")), (2000, 0o660));
        // Root set: a file changed since is left as it is.
        std::os::unix::fs::lchown(v.join("f"), None, Some(0)).unwrap();
        chmod(&v.join("f"), 0o600);
        set_volume_ownership(&v, 2000, ChangePolicy::OnRootMismatch, false).unwrap();
        assert_eq!(stat(&v.join("f")), (0, 0o600));
        // Always walks anyway.
        set_volume_ownership(&v, 2000, ChangePolicy::Always, false).unwrap();
        assert_eq!(stat(&v.join("f")), (2000, 0o660));
        // A root without setgid is a mismatch.
        chmod(&v, 0o775);
        std::os::unix::fs::lchown(v.join("f"), None, Some(0)).unwrap();
        set_volume_ownership(&v, 2000, ChangePolicy::OnRootMismatch, false).unwrap();
        assert_eq!(stat(&v), (2000, 0o2775));
        assert_eq!(stat(&v.join("f")).0, 2000);
    }
}
