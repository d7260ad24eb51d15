//! Writing a set of files into a volume directory so that a container never sees a mix of old
//! and new contents: the layout of the upstream kubelet's AtomicWriter, which tools in pods
//! (and people) know.
//!
//! ```text
//! <dir>/..2026_11_22_00_10_00.123456789/   the payload (a timestamped directory)
//! <dir>/..data -> ..2026_11_22_00_10_00.123456789
//! <dir>/<name> -> ..data/<name>              one per first path component of the payload
//! ```
//!
//! An update writes a new timestamped directory, gives the whole volume to the pod's fsGroup
//! when it has one (see [`super::ownership`]; upstream's setPerms step), renames a temporary
//! symlink over `..data` (the one atomic step), adds and removes the user-visible symlinks, then
//! removes the old directory. When the payload (contents, modes and, with an fsGroup, the group)
//! equals what `..data` holds nothing is rewritten.

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::io::ErrorKind;
use std::os::unix::fs::{symlink, DirBuilderExt, MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};

use super::ownership::{self, ChangePolicy};
use super::VolumeError;

/// The symlink to the current payload directory.
pub const DATA_DIR: &str = "..data";
/// The temporary symlink renamed over [`DATA_DIR`].
const DATA_TMP: &str = "..data_tmp";
/// Upstream's limit on a payload path.
const MAX_PATH_LEN: usize = 4096;

/// One file of a payload: its contents and permission bits.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FileProjection {
    pub data: Vec<u8>,
    pub mode: u32,
}

/// Checks one payload path: relative, not empty, no empty, "." or ".." components, and not
/// starting with ".." (names the writer keeps for itself).
pub fn validate_path(path: &str) -> Result<(), VolumeError> {
    let bad = |reason: &'static str| Err(VolumeError::BadPath { path: path.to_string(), reason });
    if path.is_empty() {
        return bad("must not be empty");
    }
    if path.len() > MAX_PATH_LEN {
        return bad("must be at most 4096 characters");
    }
    if path.starts_with('/') {
        return bad("must be a relative path");
    }
    if path.contains('\0') {
        return bad("must not contain NUL");
    }
    for component in path.split('/') {
        match component {
            "" => return bad("must not contain empty components"),
            "." => return bad("must not contain '.' components"),
            ".." => return bad("must not contain '..'"),
            _ => {}
        }
    }
    if path.starts_with("..") {
        return bad("must not start with '..'");
    }
    Ok(())
}

/// All paths valid, and no path is a directory of another one ("a" and "a/b").
fn validate_payload(payload: &BTreeMap<String, FileProjection>) -> Result<(), VolumeError> {
    for path in payload.keys() {
        validate_path(path)?;
        let mut prefix = String::new();
        let components: Vec<&str> = path.split('/').collect();
        for component in &components[..components.len() - 1] {
            if !prefix.is_empty() {
                prefix.push('/');
            }
            prefix.push_str(component);
            if payload.contains_key(&prefix) {
                return Err(VolumeError::BadPath {
                    path: path.clone(),
                    reason: "conflicts with another file of the payload",
                });
            }
        }
    }
    Ok(())
}

fn io(op: &'static str, path: &Path) -> impl FnOnce(std::io::Error) -> VolumeError {
    let path = path.to_path_buf();
    move |source| VolumeError::Io { op, path, source }
}

fn first_component(path: &str) -> &str {
    path.split('/').next().unwrap_or(path)
}

/// Writes `payload` into `dir` (created when missing). With `fs_group`, a new payload gives the
/// whole volume to that group before the swap (read-only group bits, as upstream for these
/// volumes), so the files keep their mode plus group read. Returns whether anything changed.
pub fn write_payload(
    dir: &Path,
    payload: &BTreeMap<String, FileProjection>,
    fs_group: Option<u32>,
) -> Result<bool, VolumeError> {
    validate_payload(payload)?;
    fs::create_dir_all(dir).map_err(io("create directory", dir))?;

    let data_link = dir.join(DATA_DIR);
    let old_ts = match fs::read_link(&data_link) {
        // Only a sibling "..<ts>" counts; anything else is treated as no payload (and replaced).
        Ok(target) => Some(target.to_string_lossy().into_owned()).filter(|t| t.starts_with("..") && !t.contains('/')),
        Err(e) if e.kind() == ErrorKind::NotFound => None,
        Err(e) => return Err(io("read symlink", &data_link)(e)),
    };
    let old_files = match &old_ts {
        Some(ts) => files_under(&dir.join(ts))?,
        None => BTreeMap::new(),
    };

    if old_ts.is_some() && same_payload(&old_files, payload, fs_group)? {
        ensure_user_visible(dir, payload)?;
        remove_stale(dir, old_ts.as_deref())?;
        return Ok(false);
    }

    let (ts_name, ts_dir) = new_ts_dir(dir)?;
    for (rel, file) in payload {
        let full = ts_dir.join(rel);
        if let Some(parent) = full.parent() {
            fs::DirBuilder::new().recursive(true).mode(0o755).create(parent).map_err(io("create directory", parent))?;
        }
        fs::write(&full, &file.data).map_err(io("write", &full))?;
        // Set explicitly: the umask must not change the mode the pod asked for.
        fs::set_permissions(&full, fs::Permissions::from_mode(file.mode & 0o7777)).map_err(io("chmod", &full))?;
    }
    // Over the whole volume, not only the new payload: the first write also makes the root
    // (and the links created below inherit the group from the setgid root).
    if let Some(gid) = fs_group {
        ownership::set_volume_ownership(dir, gid, ChangePolicy::Always, true)?;
    }

    let tmp = dir.join(DATA_TMP);
    match fs::remove_file(&tmp) {
        Ok(()) => {}
        Err(e) if e.kind() == ErrorKind::NotFound => {}
        Err(e) => return Err(io("remove", &tmp)(e)),
    }
    symlink(&ts_name, &tmp).map_err(io("symlink", &tmp))?;
    fs::rename(&tmp, &data_link).map_err(io("rename", &data_link))?;

    ensure_user_visible(dir, payload)?;
    let new_first: BTreeSet<&str> = payload.keys().map(|p| first_component(p)).collect();
    let old_first: BTreeSet<&str> = old_files.keys().map(|p| first_component(p)).collect();
    for gone in old_first.difference(&new_first) {
        let link = dir.join(gone);
        match fs::symlink_metadata(&link) {
            Ok(m) if m.file_type().is_symlink() => fs::remove_file(&link).map_err(io("remove", &link))?,
            _ => {}
        }
    }
    remove_stale(dir, Some(&ts_name))?;
    Ok(true)
}

/// Regular files under `root`, by path relative to it ("a/b").
fn files_under(root: &Path) -> Result<BTreeMap<String, PathBuf>, VolumeError> {
    let mut out = BTreeMap::new();
    let mut stack = vec![(root.to_path_buf(), String::new())];
    while let Some((dir, rel)) = stack.pop() {
        let entries = match fs::read_dir(&dir) {
            Ok(entries) => entries,
            // A dangling ..data (crash between removal and rename) counts as no payload.
            Err(e) if e.kind() == ErrorKind::NotFound => continue,
            Err(e) => return Err(io("read directory", &dir)(e)),
        };
        for entry in entries {
            let entry = entry.map_err(io("read directory", &dir))?;
            let name = entry.file_name().to_string_lossy().into_owned();
            let child_rel = if rel.is_empty() { name } else { format!("{rel}/{name}") };
            let ft = entry.file_type().map_err(io("stat", &entry.path()))?;
            if ft.is_dir() {
                stack.push((entry.path(), child_rel));
            } else if ft.is_file() {
                out.insert(child_rel, entry.path());
            }
        }
    }
    Ok(out)
}

fn same_payload(
    old: &BTreeMap<String, PathBuf>,
    payload: &BTreeMap<String, FileProjection>,
    fs_group: Option<u32>,
) -> Result<bool, VolumeError> {
    if !old.keys().eq(payload.keys()) {
        return Ok(false);
    }
    for (rel, file) in payload {
        let Some(path) = old.get(rel) else {
            return Ok(false);
        };
        let meta = fs::metadata(path).map_err(io("stat", path))?;
        let want = match fs_group {
            Some(_) => ownership::wanted_mode(file.mode, false, true),
            None => file.mode & 0o7777,
        };
        if meta.permissions().mode() & 0o7777 != want || fs_group.is_some_and(|g| meta.gid() != g) {
            return Ok(false);
        }
        if meta.len() != file.data.len() as u64 || fs::read(path).map_err(io("read", path))? != file.data {
            return Ok(false);
        }
    }
    Ok(true)
}

/// `<dir>/<first component>` -> `..data/<first component>` for every payload path.
fn ensure_user_visible(dir: &Path, payload: &BTreeMap<String, FileProjection>) -> Result<(), VolumeError> {
    let names: BTreeSet<&str> = payload.keys().map(|p| first_component(p)).collect();
    for name in names {
        let link = dir.join(name);
        let target = Path::new(DATA_DIR).join(name);
        match fs::symlink_metadata(&link) {
            Ok(m) if m.file_type().is_symlink() => {
                if fs::read_link(&link).map_err(io("read symlink", &link))? == target {
                    continue;
                }
                fs::remove_file(&link).map_err(io("remove", &link))?;
            }
            Ok(_) => return Err(VolumeError::NotSymlink(link)),
            Err(e) if e.kind() == ErrorKind::NotFound => {}
            Err(e) => return Err(io("stat", &link)(e)),
        }
        symlink(&target, &link).map_err(io("symlink", &link))?;
    }
    Ok(())
}

/// Removes timestamped directories other than `keep` (the previous payload after a swap, or one
/// left behind by a crash before the swap).
fn remove_stale(dir: &Path, keep: Option<&str>) -> Result<(), VolumeError> {
    for entry in fs::read_dir(dir).map_err(io("read directory", dir))? {
        let entry = entry.map_err(io("read directory", dir))?;
        let name = entry.file_name().to_string_lossy().into_owned();
        if !name.starts_with("..") || name == DATA_DIR || name == DATA_TMP || Some(name.as_str()) == keep {
            continue;
        }
        if entry.file_type().map_err(io("stat", &entry.path()))?.is_dir() {
            fs::remove_dir_all(entry.path()).map_err(io("remove", &entry.path()))?;
        }
    }
    Ok(())
}

/// Creates `<dir>/..<UTC timestamp>.<nanoseconds>` (0755), unique within `dir`.
fn new_ts_dir(dir: &Path) -> Result<(String, PathBuf), VolumeError> {
    let now = jiff::Timestamp::now();
    let base = format!("..{}.{:09}", now.strftime("%Y_%m_%d_%H_%M_%S"), now.subsec_nanosecond());
    let mut attempt = 0u32;
    loop {
        let name = if attempt == 0 { base.clone() } else { format!("{base}{attempt}") };
        let path = dir.join(&name);
        match fs::DirBuilder::new().mode(0o755).create(&path) {
            Ok(()) => return Ok((name, path)),
            Err(e) if e.kind() == ErrorKind::AlreadyExists && attempt < 1000 => attempt += 1,
            Err(e) => return Err(io("create directory", &path)(e)),
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn file(data: &str, mode: u32) -> FileProjection {
        FileProjection { data: data.as_bytes().to_vec(), mode }
    }

    fn payload(entries: &[(&str, &str, u32)]) -> BTreeMap<String, FileProjection> {
        entries.iter().map(|(p, d, m)| (p.to_string(), file(d, *m))).collect()
    }

    fn mode(path: &Path) -> u32 {
        fs::metadata(path).unwrap().permissions().mode() & 0o7777
    }

    fn ts_dirs(dir: &Path) -> Vec<String> {
        let mut v: Vec<String> = fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .filter(|n| n.starts_with("..") && n != DATA_DIR)
            .collect();
        v.sort();
        v
    }

    #[test]
    fn layout_and_modes() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("vol");
        let p = payload(&[("a", "1", 0o644), ("sub/dir/b", "2", 0o400), ("sub/c", "3", 0o755)]);
        assert!(write_payload(&dir, &p, None).unwrap());

        let ts = fs::read_link(dir.join(DATA_DIR)).unwrap();
        let ts = ts.to_str().unwrap();
        assert!(ts.starts_with("..") && ts.len() > 25, "{ts}");
        assert_eq!(ts_dirs(&dir), [ts]);
        assert_eq!(fs::read_link(dir.join("a")).unwrap(), Path::new("..data/a"));
        // Nested paths: only the first component is a symlink.
        assert_eq!(fs::read_link(dir.join("sub")).unwrap(), Path::new("..data/sub"));
        assert_eq!(fs::read_to_string(dir.join("sub/dir/b")).unwrap(), "2");
        assert_eq!(fs::read_to_string(dir.join("a")).unwrap(), "1");
        assert_eq!(mode(&dir.join("a")), 0o644);
        assert_eq!(mode(&dir.join("sub/dir/b")), 0o400);
        assert_eq!(mode(&dir.join("sub/c")), 0o755);
        let mut names: Vec<String> =
            fs::read_dir(&dir).unwrap().map(|e| e.unwrap().file_name().to_string_lossy().into_owned()).collect();
        names.sort();
        assert_eq!(names, [ts, DATA_DIR, "a", "sub"]);
    }

    #[test]
    fn swap_and_unchanged() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path();
        let p1 = payload(&[("a", "1", 0o644), ("b", "2", 0o644)]);
        assert!(write_payload(dir, &p1, None).unwrap());
        let ts1 = fs::read_link(dir.join(DATA_DIR)).unwrap();

        // Unchanged: nothing rewritten.
        assert!(!write_payload(dir, &p1, None).unwrap());
        assert_eq!(fs::read_link(dir.join(DATA_DIR)).unwrap(), ts1);

        // Changed content, "b" gone, "c" new.
        let p2 = payload(&[("a", "one", 0o644), ("c", "3", 0o644)]);
        assert!(write_payload(dir, &p2, None).unwrap());
        let ts2 = fs::read_link(dir.join(DATA_DIR)).unwrap();
        assert_ne!(ts1, ts2);
        assert!(!dir.join(&ts1).exists(), "old payload directory removed");
        assert_eq!(ts_dirs(dir), [ts2.to_str().unwrap()]);
        assert_eq!(fs::read_to_string(dir.join("a")).unwrap(), "one");
        assert_eq!(fs::read_to_string(dir.join("c")).unwrap(), "3");
        assert!(fs::symlink_metadata(dir.join("b")).is_err(), "stale user-visible link removed");
        assert!(!dir.join(DATA_TMP).exists());

        // A mode change alone is a change.
        let p3 = payload(&[("a", "one", 0o600), ("c", "3", 0o644)]);
        assert!(write_payload(dir, &p3, None).unwrap());
        assert_eq!(mode(&dir.join("a")), 0o600);
        assert!(!write_payload(dir, &p3, None).unwrap());
    }

    #[test]
    #[ignore = "privileged: needs root (chown, tmpfs and bind mounts); run by scripts/test.sh"]
    fn fs_group_ownership_kept_across_swaps() {
        assert!(nix::unistd::geteuid().is_root(), "the fsGroup test chowns: run it as root");
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("vol");
        fs::create_dir(&dir).unwrap();
        fs::set_permissions(&dir, fs::Permissions::from_mode(0o777)).unwrap();
        // The entry itself (links included), and what a path resolves to.
        let gid = |p: &Path| fs::symlink_metadata(p).unwrap().gid();
        let fgid = |p: &Path| fs::metadata(p).unwrap().gid();
        let p1 = payload(&[("a", "1", 0o644), ("sub/b", "2", 0o400), ("c", "3", 0o600)]);
        assert!(write_payload(&dir, &p1, Some(2000)).unwrap());
        // Group read added to each file's mode, setgid and group search on directories.
        assert_eq!((fgid(&dir.join("a")), mode(&dir.join("a"))), (2000, 0o644));
        assert_eq!((fgid(&dir.join("sub/b")), mode(&dir.join("sub/b"))), (2000, 0o440));
        assert_eq!(mode(&dir.join("c")), 0o640);
        assert_eq!((gid(&dir), mode(&dir)), (2000, 0o2777));
        let ts1 = fs::read_link(dir.join(DATA_DIR)).unwrap();
        assert_eq!((gid(&dir.join(&ts1)), mode(&dir.join(&ts1))), (2000, 0o2755));
        for link in [DATA_DIR, "a", "sub"] {
            assert_eq!(gid(&dir.join(link)), 2000, "{link}");
        }
        // Unchanged with the fsGroup's bits applied: not rewritten.
        assert!(!write_payload(&dir, &p1, Some(2000)).unwrap());
        assert_eq!(fs::read_link(dir.join(DATA_DIR)).unwrap(), ts1);
        // A file whose group was changed since is a change.
        std::os::unix::fs::chown(dir.join("a"), None, Some(0)).unwrap();
        assert!(write_payload(&dir, &p1, Some(2000)).unwrap());
        assert_eq!(fgid(&dir.join("a")), 2000);
        // An update keeps the ownership, new files and links included.
        let p2 = payload(&[("a", "one", 0o644), ("d", "4", 0o600)]);
        assert!(write_payload(&dir, &p2, Some(2000)).unwrap());
        assert_eq!((fgid(&dir.join("d")), mode(&dir.join("d"))), (2000, 0o640));
        assert_eq!(gid(&dir.join("d")), 2000, "the new user-visible link");
        assert_eq!(gid(&dir.join(fs::read_link(dir.join(DATA_DIR)).unwrap())), 2000);
        assert_eq!(fs::read_to_string(dir.join("a")).unwrap(), "one");
    }

    #[test]
    fn empty_payload_and_repairs() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path();
        assert!(write_payload(dir, &BTreeMap::new(), None).unwrap());
        assert!(dir.join(DATA_DIR).exists());
        assert!(!write_payload(dir, &BTreeMap::new(), None).unwrap());

        let p = payload(&[("a", "1", 0o644)]);
        assert!(write_payload(dir, &p, None).unwrap());
        // A removed user-visible link comes back without a rewrite; a leftover payload
        // directory from a crash is cleaned up.
        fs::remove_file(dir.join("a")).unwrap();
        fs::create_dir(dir.join("..2020_01_01_00_00_00.000000000")).unwrap();
        assert!(!write_payload(dir, &p, None).unwrap());
        assert_eq!(fs::read_to_string(dir.join("a")).unwrap(), "1");
        assert_eq!(ts_dirs(dir).len(), 1);

        // A ..data pointing outside the volume is not trusted as the current payload.
        let outside = tempfile::tempdir().unwrap();
        fs::write(outside.path().join("a"), "1").unwrap();
        fs::set_permissions(outside.path().join("a"), fs::Permissions::from_mode(0o644)).unwrap();
        fs::remove_file(dir.join(DATA_DIR)).unwrap();
        symlink(outside.path(), dir.join(DATA_DIR)).unwrap();
        assert!(write_payload(dir, &p, None).unwrap());
        assert!(fs::read_link(dir.join(DATA_DIR)).unwrap().to_str().unwrap().starts_with(".."));
        assert_eq!(fs::read_to_string(outside.path().join("a")).unwrap(), "1", "left alone");

        // A real file where a link belongs is an error, not silently replaced.
        let p2 = payload(&[("a", "1", 0o644), ("x", "2", 0o644)]);
        fs::write(dir.join("x"), "mine").unwrap();
        assert!(matches!(write_payload(dir, &p2, None), Err(VolumeError::NotSymlink(_))));
    }

    #[test]
    fn bad_paths_rejected() {
        let tmp = tempfile::tempdir().unwrap();
        for bad in ["", "/abs", "a/../b", "..", "../x", "a//b", "a/", "./a", "..data", "..x/y", "a/./b"] {
            let p = payload(&[(bad, "x", 0o644)]);
            let err = write_payload(tmp.path(), &p, None).unwrap_err();
            assert!(matches!(err, VolumeError::BadPath { .. }), "{bad:?}: {err}");
        }
        let conflict = payload(&[("a", "x", 0o644), ("a/b", "y", 0o644)]);
        let err = write_payload(tmp.path(), &conflict, None).unwrap_err();
        assert_eq!(err.to_string(), "invalid path \"a/b\": conflicts with another file of the payload");
        assert_eq!(
            validate_path("a/../b").unwrap_err().to_string(),
            "invalid path \"a/../b\": must not contain '..'"
        );
        // Nothing was written for rejected payloads.
        assert_eq!(fs::read_dir(tmp.path()).unwrap().count(), 0);
        for good in ["a", "a/b/c", ".hidden", "a..b", "a/..b"] {
            validate_path(good).unwrap();
        }
    }
}
