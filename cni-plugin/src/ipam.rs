//! host-local compatible address allocation store.
//!
//! On-disk layout, identical to the reference host-local plugin's disk backend, so either can
//! take over a node's state:
//!
//! - `<dataDir>/<network>/<ip>`: one file per reserved address holding
//!   `<containerID>\r\n<ifname>` (host-local's `LineBreak` is `"\r\n"`).
//! - `<dataDir>/<network>/last_reserved_ip.<range set index>`: the address handed out last
//!   from that range set; the next allocation starts after it (round-robin).
//! - `<dataDir>/<network>/lock`: flock'd exclusively for the whole operation, so concurrent
//!   plugin processes (ours or host-local's) never hand out an address twice.
//!
//! Reservations are created atomically with their content: the content is written to a file
//! of ferro's own that is then hard-linked to `<ip>`, which fails if the address is already
//! taken. That file stays, as a second name of the reservation:
//!
//! - `<dataDir>/<network>/.ref:<containerID>:<ifname>:<ip>`: the same file as `<ip>`, so the
//!   owner of every address is known from one directory listing (names and inode numbers),
//!   without opening each reservation. A reference counts only while its inode is that of
//!   `<ip>`: one left by a crash, or whose address was released and reserved again by another
//!   plugin, is stale and ignored. Reservations without a reference (written by host-local,
//!   or with a name too long for one) are read, as host-local reads them.
//! - `<dataDir>/<network>/.free:<inode>`: a released reservation's file, kept (up to
//!   [`FREE_MAX`]) and renamed into the next reservation, so neither ADD nor DEL allocates or
//!   frees an inode. ext4 searches its inode bitmap past every recently freed inode, which
//!   made a file creation the largest single cost of ADD when pods come and go quickly.
//!
//! host-local ignores names that are not addresses when it lists reservations, and the content
//! of these files is a reservation's content, so either plugin can still take over the other's
//! state.
//!
//! An exhausted range set is [`CniError::RangeExhausted`] (code 100): it is not "try again
//! later" (11), since nothing frees addresses except a DEL or GC.

use std::collections::HashMap;
use std::ffi::OsString;
use std::fmt;
use std::fs::{self, File, OpenOptions};
use std::io::{Read, Write};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::os::unix::fs::{DirEntryExt, FileExt};
use std::path::{Path, PathBuf};

use ipnet::IpNet;
use nix::fcntl::{Flock, FlockArg};

use crate::error::CniError;

/// Line separator inside a reservation file, as host-local writes it.
pub const LINE_BREAK: &str = "\r\n";
/// Prefix of the per-range-set last reserved IP files.
pub const LAST_IP_PREFIX: &str = "last_reserved_ip.";
const TMP_PREFIX: &str = ".tmp-";
/// Prefix of a reservation's second name, `.ref:<containerID>:<ifname>:<ip>`.
const REF_PREFIX: &str = ".ref:";
/// Prefix of a released reservation's file kept for reuse, `.free:<inode>`.
const FREE_PREFIX: &str = ".free:";
/// Released files kept for reuse at most; beyond that a release deletes them.
pub const FREE_MAX: usize = 128;
/// Longest file name (NAME_MAX).
const NAME_MAX: usize = 255;

fn to_u128(ip: IpAddr) -> u128 {
    match ip {
        IpAddr::V4(v4) => u128::from(u32::from(v4)),
        IpAddr::V6(v6) => u128::from(v6),
    }
}

fn from_u128(v: u128, v4: bool) -> IpAddr {
    if v4 {
        // Values of an IPv4 range always fit in 32 bits.
        IpAddr::V4(Ipv4Addr::from(v as u32))
    } else {
        IpAddr::V6(Ipv6Addr::from(v))
    }
}

/// One contiguous range of allocatable addresses inside a subnet.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Range {
    pub subnet: IpNet,
    pub start: IpAddr,
    pub end: IpAddr,
    pub gateway: IpAddr,
}

impl Range {
    /// Fills in host-local's defaults (start = network + 1; end = broadcast - 1 for IPv4, the
    /// last address for IPv6; gateway = network + 1) and checks the result.
    pub fn new(
        subnet: IpNet,
        start: Option<IpAddr>,
        end: Option<IpAddr>,
        gateway: Option<IpAddr>,
    ) -> Result<Range, String> {
        let subnet = subnet.trunc();
        let v4 = matches!(subnet, IpNet::V4(_));
        if subnet.prefix_len() + 2 > subnet.max_prefix_len() {
            return Err(format!("subnet {subnet} is too small to allocate from"));
        }
        let net = to_u128(subnet.network());
        let bcast = to_u128(subnet.broadcast());
        let last = if v4 { bcast - 1 } else { bcast };
        let start = start.unwrap_or(from_u128(net + 1, v4));
        let end = end.unwrap_or(from_u128(last, v4));
        let gateway = gateway.unwrap_or(from_u128(net + 1, v4));
        for (name, ip) in [
            ("rangeStart", start),
            ("rangeEnd", end),
            ("gateway", gateway),
        ] {
            if !subnet.contains(&ip) {
                return Err(format!("{name} {ip} is outside subnet {subnet}"));
            }
        }
        for (name, ip) in [("rangeStart", start), ("rangeEnd", end)] {
            let v = to_u128(ip);
            if v == net {
                return Err(format!("{name} {ip} is the network address of {subnet}"));
            }
            if v4 && v == bcast {
                return Err(format!("{name} {ip} is the broadcast address of {subnet}"));
            }
        }
        if to_u128(start) > to_u128(end) {
            return Err(format!("rangeStart {start} is after rangeEnd {end}"));
        }
        Ok(Range {
            subnet,
            start,
            end,
            gateway,
        })
    }

    pub fn is_ipv4(&self) -> bool {
        matches!(self.subnet, IpNet::V4(_))
    }

    /// Whether `ip` is between start and end (inclusive).
    pub fn contains(&self, ip: IpAddr) -> bool {
        ip.is_ipv4() == self.is_ipv4()
            && (to_u128(self.start)..=to_u128(self.end)).contains(&to_u128(ip))
    }

    /// Whether the two ranges share an address.
    pub fn overlaps(&self, other: &Range) -> bool {
        self.is_ipv4() == other.is_ipv4()
            && to_u128(self.start) <= to_u128(other.end)
            && to_u128(other.start) <= to_u128(self.end)
    }

    fn allocatable(&self, v: u128) -> bool {
        let ip = from_u128(v, self.is_ipv4());
        ip != self.gateway
            && ip != self.subnet.network()
            && !(self.is_ipv4() && ip == self.subnet.broadcast())
    }
}

impl fmt::Display for Range {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}-{}", self.start, self.end)
    }
}

/// Ranges of one family; an ADD gets one address from each range set.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RangeSet(pub Vec<Range>);

/// One assigned address.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Allocation {
    pub ip: IpAddr,
    pub prefix: u8,
    pub gateway: IpAddr,
}

impl Allocation {
    /// The address with its prefix length, as a result's `address`.
    pub fn address(&self) -> IpNet {
        // prefix comes from the subnet of the same family, so it is always valid.
        IpNet::new(self.ip, self.prefix).unwrap_or_else(|_| IpNet::from(self.ip))
    }
}

/// The allocation store of one network.
#[derive(Debug, Clone)]
pub struct Store {
    dir: PathBuf,
    sets: Vec<RangeSet>,
}

/// One reservation file's content.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Owner {
    container_id: String,
    ifname: String,
}

impl Owner {
    fn new(container_id: &str, ifname: &str) -> Owner {
        Owner {
            container_id: container_id.trim().to_string(),
            ifname: ifname.trim().to_string(),
        }
    }

    /// The reference name of this owner's reservation of `ip`; `None` when the owner's names
    /// could not be read back from it (a ':' or '/' in them) or it is too long.
    fn ref_name(&self, ip: IpAddr) -> Option<String> {
        let bad = |s: &str| s.is_empty() || s.contains([':', '/']);
        if bad(&self.container_id) || bad(&self.ifname) {
            return None;
        }
        let name = format!("{REF_PREFIX}{}:{}:{ip}", self.container_id, self.ifname);
        (name.len() <= NAME_MAX).then_some(name)
    }

    /// The owner and address of a reference name.
    fn from_ref_name(name: &str) -> Option<(Owner, IpAddr)> {
        let rest = name.strip_prefix(REF_PREFIX)?;
        let (id, rest) = rest.split_once(':')?;
        let (ifname, ip) = rest.split_once(':')?;
        Some((Owner::new(id, ifname), ip.parse().ok()?))
    }

    fn content(&self) -> String {
        format!("{}{LINE_BREAK}{}", self.container_id, self.ifname)
    }

    fn parse(text: &str) -> Owner {
        let mut lines = text.lines().map(str::trim);
        Owner {
            container_id: lines.next().unwrap_or_default().to_string(),
            ifname: lines.next().unwrap_or_default().to_string(),
        }
    }

    fn is(&self, container_id: &str, ifname: &str) -> bool {
        self.container_id == container_id.trim() && self.ifname == ifname.trim()
    }
}

/// One listing of a network's directory: names and inode numbers, no file opened.
#[derive(Debug, Default)]
struct Listing {
    /// `<ip>` entries and their inodes.
    ips: HashMap<IpAddr, u64>,
    /// References whose inode is their address's: address -> (owner, reference name).
    refs: HashMap<IpAddr, (Owner, OsString)>,
    /// Files to reuse: `.free:*`, stale references and temp files a crash left.
    free: Vec<OsString>,
}

impl Store {
    /// The store for `network` under `data_dir` (e.g. /var/lib/cni/networks). `sets` may be
    /// empty for [`Store::release`] and [`Store::gc`], which need no ranges.
    pub fn new(data_dir: &Path, network: &str, sets: Vec<RangeSet>) -> Store {
        Store {
            dir: data_dir.join(network),
            sets,
        }
    }

    /// The network's directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    fn lock(&self) -> Result<Flock<File>, CniError> {
        fs::create_dir_all(&self.dir)
            .map_err(|e| CniError::io(format!("create {}", self.dir.display()), e))?;
        let path = self.dir.join("lock");
        let file = OpenOptions::new()
            .create(true)
            .truncate(false)
            .read(true)
            .write(true)
            .open(&path)
            .map_err(|e| CniError::io(format!("open {}", path.display()), e))?;
        Flock::lock(file, FlockArg::LockExclusive)
            .map_err(|(_, errno)| CniError::io(format!("flock {}", path.display()), errno.into()))
    }

    /// Lists the directory (under the lock).
    fn list(&self) -> Result<Listing, CniError> {
        let ctx = || format!("read {}", self.dir.display());
        let mut listing = Listing::default();
        let mut refs = Vec::new();
        for entry in fs::read_dir(&self.dir).map_err(|e| CniError::io(ctx(), e))? {
            let entry = entry.map_err(|e| CniError::io(ctx(), e))?;
            let name = entry.file_name();
            let Some(text) = name.to_str() else {
                continue;
            };
            if let Ok(ip) = text.parse::<IpAddr>() {
                listing.ips.insert(ip, entry.ino());
            } else if let Some((owner, ip)) = Owner::from_ref_name(text) {
                refs.push((ip, entry.ino(), owner, name));
            } else if text.starts_with(FREE_PREFIX) || text.starts_with(TMP_PREFIX) {
                // Temp files are used only under the lock: one seen now was left by a crash.
                listing.free.push(name);
            }
        }
        for (ip, ino, owner, name) in refs {
            if listing.ips.get(&ip) == Some(&ino) && !listing.refs.contains_key(&ip) {
                listing.refs.insert(ip, (owner, name));
            } else {
                listing.free.push(name);
            }
        }
        Ok(listing)
    }

    /// All reservations: (ip, owner), the owner from the reference when there is one, else
    /// from the file's content.
    fn reservations(&self, listing: &Listing) -> Result<Vec<(IpAddr, Owner)>, CniError> {
        let mut out = Vec::with_capacity(listing.ips.len());
        for ip in listing.ips.keys() {
            let owner = match listing.refs.get(ip) {
                Some((owner, _)) => owner.clone(),
                None => {
                    let path = self.dir.join(ip.to_string());
                    match read_small(&path) {
                        Ok(text) => Owner::parse(&String::from_utf8_lossy(&text)),
                        // Released by another process between the listing and now: none
                        // can be (the lock is held), but it is not ours to report.
                        Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
                        Err(e) => return Err(CniError::io(format!("read {}", path.display()), e)),
                    }
                }
            };
            out.push((*ip, owner));
        }
        out.sort_by_key(|(ip, _)| (ip.is_ipv6(), to_u128(*ip)));
        Ok(out)
    }

    /// Reserves one address per range set for `container_id`/`ifname`. Addresses it already
    /// holds are returned again (idempotent ADD). If a later range set is exhausted, the
    /// addresses reserved by this call are released again.
    pub fn allocate(&self, container_id: &str, ifname: &str) -> Result<Vec<Allocation>, CniError> {
        self.allocate_noting_held(container_id, ifname)
            .map(|(allocs, _)| allocs)
    }

    /// [`Store::allocate`], also telling whether the attachment held an address before
    /// (one scan of the directory for both).
    pub fn allocate_noting_held(
        &self,
        container_id: &str,
        ifname: &str,
    ) -> Result<(Vec<Allocation>, bool), CniError> {
        let _lock = self.lock()?;
        let mut listing = self.list()?;
        let existing: Vec<IpAddr> = self
            .reservations(&listing)?
            .into_iter()
            .filter(|(_, o)| o.is(container_id, ifname))
            .map(|(ip, _)| ip)
            .collect();
        let owner = Owner::new(container_id, ifname);
        let mut out = Vec::new();
        let mut fresh = Vec::new();
        for (idx, set) in self.sets.iter().enumerate() {
            let held = existing
                .iter()
                .find_map(|ip| set.0.iter().find(|r| r.contains(*ip)).map(|r| (*ip, r)));
            let result = match held {
                Some((ip, r)) => Ok((ip, r)),
                None => self
                    .reserve_next(idx, set, &owner, &mut listing)
                    .inspect(|(ip, _)| {
                        fresh.push(*ip);
                    }),
            };
            match result {
                Ok((ip, r)) => out.push(Allocation {
                    ip,
                    prefix: r.subnet.prefix_len(),
                    gateway: r.gateway,
                }),
                Err(e) => {
                    for ip in fresh {
                        let _ = self.unreserve(ip, &mut listing);
                    }
                    return Err(e);
                }
            }
        }
        Ok((out, !existing.is_empty()))
    }

    fn reserve_next<'a>(
        &self,
        idx: usize,
        set: &'a RangeSet,
        owner: &Owner,
        listing: &mut Listing,
    ) -> Result<(IpAddr, &'a Range), CniError> {
        let ranges = &set.0;
        let Some(first) = ranges.first() else {
            return Err(CniError::InvalidConfig(format!("range set {idx} is empty")));
        };
        let last_path = self.dir.join(format!("{LAST_IP_PREFIX}{idx}"));
        let last: Option<IpAddr> = fs::read_to_string(&last_path)
            .ok()
            .and_then(|s| s.trim().parse().ok());
        // Position (range index, address) of the first candidate: just after the last
        // reserved address if it lies in this set, else the start of the first range.
        let mut pos = (0usize, to_u128(first.start));
        if let Some(last) = last {
            if let Some(ri) = ranges.iter().position(|r| r.contains(last)) {
                pos = next_pos(ranges, ri, to_u128(last));
            }
        }
        let total = ranges.iter().fold(0u128, |acc, r| {
            acc.saturating_add(to_u128(r.end) - to_u128(r.start) + 1)
        });
        let mut tried = 0u128;
        while tried < total {
            let (ri, v) = pos;
            let r = &ranges[ri];
            if r.allocatable(v) {
                let ip = from_u128(v, r.is_ipv4());
                if self.try_reserve(ip, owner, listing)? {
                    overwrite(&last_path, ip.to_string().as_bytes())?;
                    return Ok((ip, r));
                }
            }
            pos = next_pos(ranges, ri, v);
            tried += 1;
        }
        let desc: Vec<String> = ranges.iter().map(Range::to_string).collect();
        Err(CniError::RangeExhausted(format!(
            "no free address in range set {idx} ({}) of {}",
            desc.join(", "),
            self.dir.display()
        )))
    }

    /// Creates `<ip>` for `owner` unless it exists. Returns whether it was created.
    fn try_reserve(
        &self,
        ip: IpAddr,
        owner: &Owner,
        listing: &mut Listing,
    ) -> Result<bool, CniError> {
        if listing.ips.contains_key(&ip) {
            return Ok(false);
        }
        let target = self.dir.join(ip.to_string());
        let content = owner.content();
        let Some(name) = owner.ref_name(ip) else {
            // No reference possible: a temp file, linked, then removed.
            let tmp = write_tmp(&self.dir, content.as_bytes())?;
            let linked = fs::hard_link(&tmp, &target);
            let _ = fs::remove_file(&tmp);
            return match linked {
                Ok(()) => {
                    listing.ips.insert(ip, 0);
                    Ok(true)
                }
                Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => Ok(false),
                Err(e) => Err(CniError::io(format!("create {}", target.display()), e)),
            };
        };
        let name = OsString::from(name);
        let path = self.dir.join(&name);
        let file = self.reuse_or_create(&name, listing)?;
        let ctx = || format!("write {}", path.display());
        // No fsync: a reservation names a network namespace, and the events that lose
        // unsynced page cache (kernel crash, power loss) also destroy every namespace, so
        // durability would protect nothing; host-local does not sync either. It cost ~9 ms
        // per ADD on this machine's disk.
        file.write_all_at(content.as_bytes(), 0)
            .map_err(|e| CniError::io(ctx(), e))?;
        let meta = file.metadata().map_err(|e| CniError::io(ctx(), e))?;
        if meta.len() > content.len() as u64 {
            file.set_len(content.len() as u64)
                .map_err(|e| CniError::io(ctx(), e))?;
        }
        match fs::hard_link(&path, &target) {
            Ok(()) => {
                use std::os::unix::fs::MetadataExt;
                listing.ips.insert(ip, meta.ino());
                listing.refs.insert(ip, (owner.clone(), name));
                Ok(true)
            }
            Err(e) => {
                // The file stays, as a stale reference, for the next reservation.
                listing.free.push(name);
                match e.kind() {
                    std::io::ErrorKind::AlreadyExists => Ok(false),
                    _ => Err(CniError::io(format!("create {}", target.display()), e)),
                }
            }
        }
    }

    /// The file `name` for a new reservation: a released one renamed (a stale reference of
    /// that very name as it is), else a new one.
    fn reuse_or_create(&self, name: &OsString, listing: &mut Listing) -> Result<File, CniError> {
        let path = self.dir.join(name);
        let open = |create: bool| {
            OpenOptions::new()
                .write(true)
                .create(create)
                .truncate(false)
                .open(&path)
        };
        if let Some(i) = listing.free.iter().position(|f| f == name) {
            listing.free.swap_remove(i);
            if let Ok(f) = open(false) {
                return Ok(f);
            }
        }
        while let Some(free) = listing.free.pop() {
            // Renamed, never over an existing name (which would make ext4 flush it at once).
            if fs::rename(self.dir.join(&free), &path).is_ok() {
                if let Ok(f) = open(false) {
                    return Ok(f);
                }
            }
        }
        open(true).map_err(|e| CniError::io(format!("create {}", path.display()), e))
    }

    /// Releases `ip`: removes `<ip>`, and keeps its reference's file for reuse (or removes
    /// it when [`FREE_MAX`] are kept already).
    fn unreserve(&self, ip: IpAddr, listing: &mut Listing) -> Result<bool, CniError> {
        let path = self.dir.join(ip.to_string());
        let removed = match fs::remove_file(&path) {
            Ok(()) => true,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => false,
            Err(e) => return Err(CniError::io(format!("remove {}", path.display()), e)),
        };
        let ino = listing.ips.remove(&ip);
        if let Some((_, name)) = listing.refs.remove(&ip) {
            let from = self.dir.join(&name);
            let kept = listing.free.len() < FREE_MAX
                && ino.is_some_and(|ino| {
                    let free = OsString::from(format!("{FREE_PREFIX}{ino}"));
                    let ok = fs::rename(&from, self.dir.join(&free)).is_ok();
                    if ok {
                        listing.free.push(free);
                    }
                    ok
                });
            if !kept {
                let _ = fs::remove_file(&from);
            }
        }
        Ok(removed)
    }

    /// The addresses reserved for `container_id`/`ifname`.
    pub fn find(&self, container_id: &str, ifname: &str) -> Result<Vec<IpAddr>, CniError> {
        if !self.dir.exists() {
            return Ok(Vec::new());
        }
        let _lock = self.lock()?;
        let listing = self.list()?;
        Ok(self
            .reservations(&listing)?
            .into_iter()
            .filter(|(_, o)| o.is(container_id, ifname))
            .map(|(ip, _)| ip)
            .collect())
    }

    /// Releases every address of `container_id`/`ifname`; returns them. Releasing what is
    /// not reserved is not an error (DEL is idempotent).
    pub fn release(&self, container_id: &str, ifname: &str) -> Result<Vec<IpAddr>, CniError> {
        if !self.dir.exists() {
            return Ok(Vec::new());
        }
        let _lock = self.lock()?;
        self.remove_where(|o| o.is(container_id, ifname))
    }

    /// Releases every address whose owner is not in `valid` (containerID, ifname); returns
    /// them.
    pub fn gc(&self, valid: &[(String, String)]) -> Result<Vec<IpAddr>, CniError> {
        if !self.dir.exists() {
            return Ok(Vec::new());
        }
        let _lock = self.lock()?;
        self.remove_where(|o| !valid.iter().any(|(c, i)| o.is(c, i)))
    }

    fn remove_where(&self, pred: impl Fn(&Owner) -> bool) -> Result<Vec<IpAddr>, CniError> {
        let mut listing = self.list()?;
        let mut removed = Vec::new();
        for (ip, owner) in self.reservations(&listing)? {
            if pred(&owner) && self.unreserve(ip, &mut listing)? {
                removed.push(ip);
            }
        }
        Ok(removed)
    }
}

/// Reads a reservation file (a few dozen bytes) with plain reads: no size probe first.
fn read_small(path: &Path) -> std::io::Result<Vec<u8>> {
    let mut f = File::open(path)?;
    let mut out = Vec::new();
    let mut buf = [0u8; 256];
    loop {
        match f.read(&mut buf)? {
            0 => return Ok(out),
            n => out.extend_from_slice(&buf[..n]),
        }
    }
}

fn next_pos(ranges: &[Range], ri: usize, v: u128) -> (usize, u128) {
    if v >= to_u128(ranges[ri].end) {
        let n = (ri + 1) % ranges.len();
        (n, to_u128(ranges[n].start))
    } else {
        (ri, v + 1)
    }
}

fn write_tmp(dir: &Path, content: &[u8]) -> Result<PathBuf, CniError> {
    let mut n = 0u32;
    loop {
        let path = dir.join(format!("{TMP_PREFIX}{}-{n}", std::process::id()));
        match OpenOptions::new().write(true).create_new(true).open(&path) {
            Ok(mut f) => {
                // No fsync: a reservation names a network namespace, and the events that
                // lose unsynced page cache (kernel crash, power loss) also destroy every
                // namespace, so durability would protect nothing; host-local does not sync
                // either. It cost ~9 ms per ADD on this machine's disk.
                f.write_all(content)
                    .map_err(|e| CniError::io(format!("write {}", path.display()), e))?;
                return Ok(path);
            }
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists && n < 1000 => n += 1,
            Err(e) => return Err(CniError::io(format!("create {}", path.display()), e)),
        }
    }
}

/// Overwrites the hint file `path` in place: write at offset 0, then cut what is left of a
/// longer earlier value. Not atomic, and need not be: it is read and written only under the
/// lock, and a value torn by a crash fails to parse, which only restarts the scan at the
/// start of the range. Replacing the file instead (rename over it, or truncating it to zero)
/// makes ext4 flush the new data at once (`auto_da_alloc`): 1.3-5 ms per ADD here.
fn overwrite(path: &Path, content: &[u8]) -> Result<(), CniError> {
    let ctx = || format!("write {}", path.display());
    let f = OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(false)
        .open(path)
        .map_err(|e| CniError::io(ctx(), e))?;
    f.write_all_at(content, 0)
        .and_then(|()| {
            if f.metadata()?.len() > content.len() as u64 {
                f.set_len(content.len() as u64)?;
            }
            Ok(())
        })
        .map_err(|e| CniError::io(ctx(), e))
}
