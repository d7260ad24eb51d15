//! Service ClusterIP and NodePort ranges: which address or port is free, given the ones taken.
//!
//! These are the pure pickers; what is taken lives in the store, shared by every API server
//! (crate::service_alloc).

use std::collections::BTreeSet;
use std::net::IpAddr;

use rand::Rng;

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AllocError {
    #[error("provided IP is already allocated")]
    IpTaken,
    #[error("provided IP is not in the valid range. The range of valid IPs is {0}")]
    IpOutOfRange(String),
    #[error("range is full")]
    Full,
    #[error("provided port is already allocated")]
    PortTaken,
    #[error("provided port is not in the valid range. The range of valid ports is {0}")]
    PortOutOfRange(String),
    #[error("invalid range {0:?}: {1}")]
    BadRange(String, String),
}

/// An IPv4 or IPv6 CIDR.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Cidr {
    pub base: IpAddr,
    pub prefix: u8,
}

impl Cidr {
    pub fn parse(s: &str) -> Result<Cidr, AllocError> {
        let bad = |why: &str| AllocError::BadRange(s.to_string(), why.to_string());
        let (ip, len) = s.split_once('/').ok_or_else(|| bad("expected ADDRESS/PREFIX"))?;
        let base: IpAddr = ip.parse().map_err(|_| bad("invalid address"))?;
        let prefix: u8 = len.parse().map_err(|_| bad("invalid prefix length"))?;
        let bits = if base.is_ipv4() { 32 } else { 128 };
        if prefix > bits {
            return Err(bad("prefix length too long"));
        }
        if bits - prefix < 2 {
            return Err(bad("range too small"));
        }
        let c = Cidr { base, prefix };
        Ok(Cidr { base: c.addr(c.network()), prefix })
    }

    fn bits(&self) -> u8 {
        if self.base.is_ipv4() {
            32
        } else {
            128
        }
    }

    fn to_int(ip: IpAddr) -> u128 {
        match ip {
            IpAddr::V4(a) => u32::from(a) as u128,
            IpAddr::V6(a) => u128::from(a),
        }
    }

    fn addr(&self, n: u128) -> IpAddr {
        if self.base.is_ipv4() {
            IpAddr::V4((n as u32).into())
        } else {
            IpAddr::V6(n.into())
        }
    }

    fn network(&self) -> u128 {
        let host_bits = (self.bits() - self.prefix) as u32;
        let mask = if host_bits >= 128 { 0 } else { !((1u128 << host_bits) - 1) };
        Self::to_int(self.base) & mask
    }

    fn size(&self) -> u128 {
        1u128 << (self.bits() - self.prefix).min(127)
    }

    pub fn contains(&self, ip: IpAddr) -> bool {
        ip.is_ipv4() == self.base.is_ipv4() && {
            let n = Self::to_int(ip);
            n >= self.network() && n < self.network() + self.size()
        }
    }

    /// Offset of an address inside the range.
    fn offset(&self, ip: IpAddr) -> u128 {
        Self::to_int(ip) - self.network()
    }
}

impl std::fmt::Display for Cidr {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", self.base, self.prefix)
    }
}

/// Allocates service cluster IPs from a CIDR. The network address (and the broadcast address for
/// IPv4) are never handed out; offsets above 2^20 are not used for large IPv6 ranges.
#[derive(Debug, Clone)]
pub struct IpAllocator {
    cidr: Cidr,
    used: BTreeSet<u128>,
    /// Number of usable offsets, starting at offset 1.
    usable: u128,
}

impl IpAllocator {
    pub fn new(cidr: Cidr) -> Self {
        let size = cidr.size().min(1 << 20);
        let usable = if cidr.base.is_ipv4() { size - 2 } else { size - 1 };
        IpAllocator { cidr, used: BTreeSet::new(), usable }
    }

    pub fn cidr(&self) -> Cidr {
        self.cidr
    }

    /// The first usable address (upstream gives it to the `kubernetes` Service).
    pub fn first(&self) -> IpAddr {
        self.cidr.addr(self.cidr.network() + 1)
    }

    pub fn allocate(&mut self, ip: IpAddr) -> Result<(), AllocError> {
        if !self.cidr.contains(ip) {
            return Err(AllocError::IpOutOfRange(self.cidr.to_string()));
        }
        let off = self.cidr.offset(ip);
        if off == 0 || off > self.usable {
            return Err(AllocError::IpOutOfRange(self.cidr.to_string()));
        }
        if !self.used.insert(off) {
            return Err(AllocError::IpTaken);
        }
        Ok(())
    }

    /// Whether `ip` is one this allocator may hand out (in range, not the network or broadcast
    /// address), whatever is allocated.
    pub fn check(&self, ip: IpAddr) -> Result<(), AllocError> {
        let off = if self.cidr.contains(ip) { self.cidr.offset(ip) } else { 0 };
        if off == 0 || off > self.usable {
            return Err(AllocError::IpOutOfRange(self.cidr.to_string()));
        }
        Ok(())
    }

    /// Picks a free address: a random probe first, then a scan, so the cost stays bounded.
    pub fn allocate_next(&mut self) -> Result<IpAddr, AllocError> {
        if self.used.len() as u128 >= self.usable {
            return Err(AllocError::Full);
        }
        let mut rng = rand::rng();
        for _ in 0..16 {
            let off = rng.random_range(1..=self.usable);
            if self.used.insert(off) {
                return Ok(self.cidr.addr(self.cidr.network() + off));
            }
        }
        let start = rng.random_range(1..=self.usable);
        let found = (start..=self.usable)
            .chain(1..start)
            .find(|o| !self.used.contains(o))
            .ok_or(AllocError::Full)?;
        self.used.insert(found);
        Ok(self.cidr.addr(self.cidr.network() + found))
    }

    pub fn release(&mut self, ip: IpAddr) {
        if self.cidr.contains(ip) {
            self.used.remove(&self.cidr.offset(ip));
        }
    }

    pub fn is_allocated(&self, ip: IpAddr) -> bool {
        self.cidr.contains(ip) && self.used.contains(&self.cidr.offset(ip))
    }

    pub fn used(&self) -> usize {
        self.used.len()
    }
}

/// Allocates NodePorts from an inclusive port range.
#[derive(Debug, Clone)]
pub struct PortAllocator {
    first: u16,
    last: u16,
    used: BTreeSet<u16>,
}

impl PortAllocator {
    /// `range` as `--service-node-port-range` takes it: "30000-32767" (or a single port).
    pub fn parse(range: &str) -> Result<Self, AllocError> {
        let bad = |why: &str| AllocError::BadRange(range.to_string(), why.to_string());
        let (a, b) = range.split_once('-').unwrap_or((range, range));
        let first: u16 = a.trim().parse().map_err(|_| bad("invalid port"))?;
        let last: u16 = b.trim().parse().map_err(|_| bad("invalid port"))?;
        if first == 0 || first > last {
            return Err(bad("the first port must be positive and not above the last"));
        }
        Ok(PortAllocator { first, last, used: BTreeSet::new() })
    }

    pub fn range(&self) -> String {
        format!("{}-{}", self.first, self.last)
    }

    pub fn contains(&self, port: u16) -> bool {
        (self.first..=self.last).contains(&port)
    }

    /// Whether `port` is in the range, whatever is allocated.
    pub fn check(&self, port: u16) -> Result<(), AllocError> {
        if !self.contains(port) {
            return Err(AllocError::PortOutOfRange(self.range()));
        }
        Ok(())
    }

    pub fn allocate(&mut self, port: u16) -> Result<(), AllocError> {
        if !self.contains(port) {
            return Err(AllocError::PortOutOfRange(self.range()));
        }
        if !self.used.insert(port) {
            return Err(AllocError::PortTaken);
        }
        Ok(())
    }

    pub fn allocate_next(&mut self) -> Result<u16, AllocError> {
        let size = (self.last - self.first) as usize + 1;
        if self.used.len() >= size {
            return Err(AllocError::Full);
        }
        let start = rand::rng().random_range(self.first..=self.last);
        let port = (start..=self.last)
            .chain(self.first..start)
            .find(|p| !self.used.contains(p))
            .ok_or(AllocError::Full)?;
        self.used.insert(port);
        Ok(port)
    }

    pub fn release(&mut self, port: u16) {
        self.used.remove(&port);
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn cidr_parse_normalizes_and_rejects() {
        assert_eq!(Cidr::parse("10.96.3.4/12").unwrap().to_string(), "10.96.0.0/12");
        assert!(Cidr::parse("10.0.0.0/31").is_err());
        assert!(Cidr::parse("10.0.0.0").is_err());
        assert!(Cidr::parse("10.0.0.0/33").is_err());
        assert!(Cidr::parse("fd00::/64").is_ok());
    }

    #[test]
    fn ip_allocator_never_hands_out_twice_and_skips_network_and_broadcast() {
        let mut a = IpAllocator::new(Cidr::parse("10.0.0.0/29").unwrap());
        let mut got = BTreeSet::new();
        for _ in 0..6 {
            got.insert(a.allocate_next().unwrap());
        }
        assert_eq!(got.len(), 6);
        assert!(!got.contains(&"10.0.0.0".parse::<IpAddr>().unwrap()));
        assert!(!got.contains(&"10.0.0.7".parse::<IpAddr>().unwrap()));
        assert_eq!(a.allocate_next(), Err(AllocError::Full));
        a.release("10.0.0.3".parse().unwrap());
        assert_eq!(a.allocate_next().unwrap(), "10.0.0.3".parse::<IpAddr>().unwrap());
    }

    #[test]
    fn ip_allocator_specific_addresses() {
        let mut a = IpAllocator::new(Cidr::parse("10.96.0.0/12").unwrap());
        assert_eq!(a.first(), "10.96.0.1".parse::<IpAddr>().unwrap());
        a.allocate("10.96.0.10".parse().unwrap()).unwrap();
        assert_eq!(a.allocate("10.96.0.10".parse().unwrap()), Err(AllocError::IpTaken));
        assert!(matches!(
            a.allocate("10.0.0.1".parse().unwrap()),
            Err(AllocError::IpOutOfRange(_))
        ));
        assert!(matches!(
            a.allocate("10.96.0.0".parse().unwrap()),
            Err(AllocError::IpOutOfRange(_))
        ));
        assert!(matches!(
            a.allocate("10.111.255.255".parse().unwrap()),
            Err(AllocError::IpOutOfRange(_))
        ));
        assert!(a.is_allocated("10.96.0.10".parse().unwrap()));
    }

    #[test]
    fn port_allocator() {
        let mut p = PortAllocator::parse("30000-30002").unwrap();
        p.allocate(30001).unwrap();
        assert_eq!(p.allocate(30001), Err(AllocError::PortTaken));
        assert!(matches!(p.allocate(80), Err(AllocError::PortOutOfRange(_))));
        let a = p.allocate_next().unwrap();
        let b = p.allocate_next().unwrap();
        assert_ne!(a, b);
        assert_eq!(p.allocate_next(), Err(AllocError::Full));
        assert!(PortAllocator::parse("5-1").is_err());
        assert!(PortAllocator::parse("x").is_err());
    }
}
