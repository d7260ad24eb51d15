//! The host as the volume engine sees it: a narrow trait over files, loop devices, superblocks
//! and mounts. `RealHost` (real.rs) does it with syscalls and util-linux/e2fsprogs/xfsprogs;
//! `RecordingHost` (fake.rs) keeps the same state in memory and records every call, so the
//! engine's decisions and its crash recovery are tested without root. Nothing in the engine
//! touches the host except through this trait (the journal is plain files in the data dir).

use std::io;
use std::path::{Path, PathBuf};

use super::record::FsType;

#[derive(Debug, thiserror::Error)]
pub enum HostError {
    #[error("{what} {path}: {source}")]
    Io {
        what: &'static str,
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("{command} failed ({status}): {stderr}")]
    Command {
        command: String,
        status: String,
        stderr: String,
    },
    /// The process lacks a capability the operation needs.
    #[error("{0}")]
    MissingCapability(String),
    #[error("{0}")]
    Unexpected(String),
}

impl HostError {
    pub fn io(what: &'static str, path: &Path, source: io::Error) -> HostError {
        HostError::Io {
            what,
            path: path.to_path_buf(),
            source,
        }
    }
    /// The filesystem holding the data dir ran out of space.
    pub fn is_no_space(&self) -> bool {
        matches!(self, HostError::Io { source, .. } if source.raw_os_error() == Some(nix::libc::ENOSPC))
    }
}

/// A backing file's size and the bytes really allocated to it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FileInfo {
    pub size: u64,
    pub allocated: u64,
}

/// What a device holds, read from its first blocks (never from a cached flag).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Content {
    /// Zeros wherever a filesystem, partition table or volume header would be.
    Blank,
    /// A filesystem ferro-csi formats.
    Fs(FsType),
    /// A recognised signature of something else (btrfs, swap, LUKS, a partition table...).
    Other(String),
    /// Not zero, not recognised: data of unknown shape.
    Unknown,
}

/// Bytes [`classify`] needs: signatures live in the first 64 KiB + 4 KiB.
pub const PROBE_BYTES: usize = 68 * 1024;

/// Reads a device's first [`PROBE_BYTES`] bytes (fewer on a smaller device) and says what
/// they hold. Anything not all-zero that is not ext4 or XFS is never treated as blank.
pub fn classify(head: &[u8]) -> Content {
    let at = |off: usize, magic: &[u8]| head.get(off..off + magic.len()) == Some(magic);
    if at(1024 + 56, &[0x53, 0xef]) {
        // ext2/3/4 share the magic; ext4 is what ferro formats, the others are refused as
        // foreign (mounting them as ext4 would work, but they are not ours).
        let incompat = head
            .get(1024 + 0x60..1024 + 0x64)
            .map(|b| u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
            .unwrap_or(0);
        // EXTENTS (0x40) or 64BIT (0x80) or FLEX_BG (0x200): made by mkfs.ext4.
        return if incompat & (0x40 | 0x80 | 0x200) != 0 {
            Content::Fs(FsType::Ext4)
        } else {
            Content::Other("ext2/ext3".into())
        };
    }
    if at(0, b"XFSB") {
        return Content::Fs(FsType::Xfs);
    }
    let known: [(usize, &[u8], &str); 4] = [
        (0x10040, b"_BHRfS_M", "btrfs"),
        (0, b"LUKS\xba\xbe", "LUKS"),
        (4096 - 10, b"SWAPSPACE2", "swap"),
        (0x200, b"EFI PART", "GPT partition table"),
    ];
    for (off, magic, name) in known {
        if at(off, magic) {
            return Content::Other(name.into());
        }
    }
    if at(510, &[0x55, 0xaa]) {
        return Content::Other("MBR partition table".into());
    }
    if head.iter().all(|&b| b == 0) {
        Content::Blank
    } else {
        Content::Unknown
    }
}

/// What a device holds and, for a filesystem, how many bytes its superblock says it spans.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Probe {
    pub content: Content,
    pub fs_bytes: Option<u64>,
}

/// The size a filesystem's superblock records (ext4: blocks count x block size; XFS: data
/// blocks x block size), read from the same head bytes as [`classify`].
pub fn fs_bytes(head: &[u8], fs: FsType) -> Option<u64> {
    let le32 = |off: usize| {
        head.get(off..off + 4)
            .map(|b| u32::from_le_bytes([b[0], b[1], b[2], b[3]]) as u64)
    };
    let be32 = |off: usize| {
        head.get(off..off + 4)
            .map(|b| u32::from_be_bytes([b[0], b[1], b[2], b[3]]) as u64)
    };
    let be64 = |off: usize| {
        head.get(off..off + 8)
            .map(|b| u64::from_be_bytes([b[0], b[1], b[2], b[3], b[4], b[5], b[6], b[7]]))
    };
    match fs {
        FsType::Ext4 => {
            let sb = 1024;
            let lo = le32(sb + 0x4)?;
            let log = le32(sb + 0x18)?;
            let incompat = le32(sb + 0x60)?;
            let hi = if incompat & 0x80 != 0 {
                le32(sb + 0x150)?
            } else {
                0
            };
            let block = 1024u64.checked_shl(log as u32)?;
            ((hi << 32) | lo).checked_mul(block)
        }
        FsType::Xfs => be64(8)?.checked_mul(be32(4)?),
    }
}

/// One line of /proc/self/mountinfo, the fields the engine reads.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MountEntry {
    pub major_minor: String,
    /// The root of the mount within its filesystem (`/loop3` for a bind of /dev/loop3).
    pub root: String,
    pub target: PathBuf,
    /// Per-mount options (`rw,relatime`).
    pub options: String,
    pub fstype: String,
    pub source: String,
}

impl MountEntry {
    pub fn read_only(&self) -> bool {
        self.options.split(',').any(|o| o == "ro")
    }
}

/// mountinfo escapes space, tab, newline and backslash as octal.
fn unescape(field: &str) -> String {
    let mut out = Vec::with_capacity(field.len());
    let b = field.as_bytes();
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'\\'
            && i + 3 < b.len()
            && b[i + 1..i + 4].iter().all(|c| (b'0'..=b'7').contains(c))
        {
            let v = (b[i + 1] - b'0') * 64 + (b[i + 2] - b'0') * 8 + (b[i + 3] - b'0');
            out.push(v);
            i += 4;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// Parses /proc/self/mountinfo text.
pub fn parse_mountinfo(text: &str) -> Vec<MountEntry> {
    let mut out = Vec::new();
    for line in text.lines() {
        let fields: Vec<&str> = line.split(' ').collect();
        let Some(sep) = fields.iter().position(|f| *f == "-") else {
            continue;
        };
        if fields.len() < 6 || fields.len() < sep + 3 {
            continue;
        }
        out.push(MountEntry {
            major_minor: fields[2].to_string(),
            root: unescape(fields[3]),
            target: PathBuf::from(unescape(fields[4])),
            options: fields[5].to_string(),
            fstype: fields[sep + 1].to_string(),
            source: unescape(fields[sep + 2]),
        });
    }
    out
}

/// bytes and inodes of a mounted filesystem (statvfs).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct FsStats {
    pub total_bytes: u64,
    pub available_bytes: u64,
    pub used_bytes: u64,
    pub total_inodes: u64,
    pub free_inodes: u64,
    pub used_inodes: u64,
}

/// A mount the engine asks for.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum MountSpec {
    /// A filesystem on a device, with the CO's mount flags.
    Fs {
        device: PathBuf,
        target: PathBuf,
        fs: FsType,
        flags: Vec<String>,
    },
    /// A bind mount (staging dir -> target dir, or device node -> target file), made
    /// read-only when asked.
    Bind {
        source: PathBuf,
        target: PathBuf,
        readonly: bool,
    },
}

/// What is at a path.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PathKind {
    Dir,
    File,
    Other,
}

pub trait Host: Send + Sync + 'static {
    fn file_info(&self, path: &Path) -> Result<Option<FileInfo>, HostError>;
    /// Creates `path` (and its directory) with `size` bytes, all allocated when `thick`; an
    /// existing file is brought to that size.
    fn create_file(&self, path: &Path, size: u64, thick: bool) -> Result<(), HostError>;
    /// Grows a backing file (allocating the new range when `thick`).
    fn grow_file(&self, path: &Path, size: u64, thick: bool) -> Result<(), HostError>;
    /// Copies a backing file as a reflink where the filesystem can, else sparse.
    fn copy_file(&self, from: &Path, to: &Path) -> Result<(), HostError>;
    /// Removes a file; a missing file is not an error.
    fn remove_file(&self, path: &Path) -> Result<(), HostError>;

    /// Loop devices backed by `file` (normally zero or one).
    fn loops_of(&self, file: &Path) -> Result<Vec<PathBuf>, HostError>;
    /// Attaches `file` to a free loop device and returns the device.
    fn attach(&self, file: &Path) -> Result<PathBuf, HostError>;
    fn detach(&self, device: &Path) -> Result<(), HostError>;
    /// Makes the loop device take its backing file's new size.
    fn refresh(&self, device: &Path) -> Result<(), HostError>;
    fn device_size(&self, device: &Path) -> Result<u64, HostError>;
    fn probe(&self, device: &Path) -> Result<Probe, HostError>;
    fn format(&self, device: &Path, fs: FsType) -> Result<(), HostError>;

    fn mounts(&self) -> Result<Vec<MountEntry>, HostError>;
    fn mount(&self, spec: &MountSpec) -> Result<(), HostError>;
    fn unmount(&self, target: &Path) -> Result<(), HostError>;
    /// Grows an unmounted ext4 filesystem to its device's size (checked first, as resize2fs
    /// asks); needs no capability beyond opening the device.
    fn grow_fs_offline(&self, fs: FsType, device: &Path) -> Result<(), HostError>;
    /// Grows a mounted filesystem to its device's size.
    fn grow_fs(&self, fs: FsType, device: &Path, mountpoint: &Path) -> Result<(), HostError>;
    /// Freezes (`true`) or thaws a mounted filesystem.
    fn freeze(&self, mountpoint: &Path, frozen: bool) -> Result<(), HostError>;
    fn fs_stats(&self, path: &Path) -> Result<FsStats, HostError>;

    fn path_kind(&self, path: &Path) -> Result<Option<PathKind>, HostError>;
    fn make_dir(&self, path: &Path) -> Result<(), HostError>;
    /// Creates an empty regular file (a raw block target).
    fn make_file(&self, path: &Path) -> Result<(), HostError>;
    /// Removes a file or an empty directory; missing is not an error.
    fn remove_path(&self, path: &Path) -> Result<(), HostError>;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn blank_and_unknown_heads() {
        assert_eq!(classify(&vec![0; PROBE_BYTES]), Content::Blank);
        assert_eq!(classify(&[]), Content::Blank);
        let mut data = vec![0; PROBE_BYTES];
        data[40_000] = 7;
        assert_eq!(classify(&data), Content::Unknown);
    }

    #[test]
    fn filesystems_and_foreign_signatures() {
        let mut ext4 = vec![0; PROBE_BYTES];
        ext4[1024 + 56] = 0x53;
        ext4[1024 + 57] = 0xef;
        assert_eq!(classify(&ext4), Content::Other("ext2/ext3".into()));
        ext4[1024 + 0x60] = 0x40 | 0x02;
        assert_eq!(classify(&ext4), Content::Fs(FsType::Ext4));
        let mut xfs = vec![0; PROBE_BYTES];
        xfs[..4].copy_from_slice(b"XFSB");
        assert_eq!(classify(&xfs), Content::Fs(FsType::Xfs));
        let mut mbr = vec![0; PROBE_BYTES];
        mbr[510] = 0x55;
        mbr[511] = 0xaa;
        assert_eq!(classify(&mbr), Content::Other("MBR partition table".into()));
        let mut luks = vec![0; PROBE_BYTES];
        luks[..6].copy_from_slice(b"LUKS\xba\xbe");
        assert_eq!(classify(&luks), Content::Other("LUKS".into()));
    }

    #[test]
    fn filesystem_sizes_from_superblocks() {
        let mut ext4 = vec![0; PROBE_BYTES];
        ext4[1024 + 4..1024 + 8].copy_from_slice(&16384u32.to_le_bytes());
        ext4[1024 + 0x18..1024 + 0x1c].copy_from_slice(&2u32.to_le_bytes());
        assert_eq!(fs_bytes(&ext4, FsType::Ext4), Some(16384 * 4096));
        ext4[1024 + 0x60] = 0x80;
        ext4[1024 + 0x150..1024 + 0x154].copy_from_slice(&1u32.to_le_bytes());
        assert_eq!(
            fs_bytes(&ext4, FsType::Ext4),
            Some(((1u64 << 32) + 16384) * 4096)
        );
        let mut xfs = vec![0; PROBE_BYTES];
        xfs[4..8].copy_from_slice(&4096u32.to_be_bytes());
        xfs[8..16].copy_from_slice(&76800u64.to_be_bytes());
        assert_eq!(fs_bytes(&xfs, FsType::Xfs), Some(300 << 20));
        assert_eq!(fs_bytes(&[], FsType::Xfs), None);
    }

    #[test]
    fn mountinfo_lines_with_escapes_and_optional_fields() {
        let text = "36 35 7:3 / /var/lib/kubelet/plugins/x\\040y/globalmount rw,relatime shared:1 - ext4 /dev/loop3 rw\n\
                    40 35 0:5 /loop3 /var/lib/kubelet/pods/u/volumeDevices/p rw,nosuid - devtmpfs udev rw\n\
                    bad line\n";
        let m = parse_mountinfo(text);
        assert_eq!(m.len(), 2);
        assert_eq!(
            m[0].target,
            PathBuf::from("/var/lib/kubelet/plugins/x y/globalmount")
        );
        assert_eq!(
            (m[0].fstype.as_str(), m[0].source.as_str()),
            ("ext4", "/dev/loop3")
        );
        assert!(!m[0].read_only());
        assert_eq!(m[1].root, "/loop3");
        assert_eq!(m[1].major_minor, "0:5");
    }
}
