//! Chain names as upstream's proxiers derive them: a SHA-256 of the service port name and
//! protocol (plus the endpoint for endpoint chains), base32-encoded and truncated. People who
//! know kube-proxy's rules find the same names in ferro's.

use data_encoding::BASE32;
use ring::digest::SHA256;

use crate::model::{Endpoint, ServicePortName};

/// base32(sha256(text)), the first `n` characters.
pub fn hash_prefix(text: &str, n: usize) -> String {
    let d = ring::digest::digest(&SHA256, text.as_bytes());
    let mut s = BASE32.encode(d.as_ref());
    s.truncate(n);
    s
}

/// Upstream's portProtoHash: the 16-character suffix of a service port's iptables chains.
pub fn port_proto_hash(name: &ServicePortName) -> String {
    hash_prefix(&format!("{name}{}", name.protocol.lower()), 16)
}

/// `KUBE-SVC-<hash>`: the Cluster traffic policy chain.
pub fn svc_chain(name: &ServicePortName) -> String {
    format!("KUBE-SVC-{}", port_proto_hash(name))
}

/// `KUBE-SVL-<hash>`: the Local traffic policy chain.
pub fn svl_chain(name: &ServicePortName) -> String {
    format!("KUBE-SVL-{}", port_proto_hash(name))
}

/// `KUBE-EXT-<hash>`: the external traffic chain.
pub fn ext_chain(name: &ServicePortName) -> String {
    format!("KUBE-EXT-{}", port_proto_hash(name))
}

/// `KUBE-FW-<hash>`: the load-balancer source-range firewall chain.
pub fn fw_chain(name: &ServicePortName) -> String {
    format!("KUBE-FW-{}", port_proto_hash(name))
}

/// `KUBE-SEP-<hash>`: one endpoint's chain (hash of name, protocol and "ip:port").
pub fn sep_chain(name: &ServicePortName, ep: &Endpoint) -> String {
    format!("KUBE-SEP-{}", hash_prefix(&format!("{name}{}{}", name.protocol.lower(), ep.addr()), 16))
}

/// What a backend's committed state keeps of a chain's text: a digest (length and SipHash),
/// not the text, so the state of 100,000 endpoints does not hold the whole ruleset twice.
/// Texts never start with NUL; digests do.
pub fn text_digest(text: &str) -> String {
    use std::hash::{Hash as _, Hasher as _};
    if text.starts_with('\0') {
        return text.to_string();
    }
    let mut h = std::collections::hash_map::DefaultHasher::new();
    text.hash(&mut h);
    format!("\0{:x}:{:016x}", text.len(), h.finish())
}

/// What a committed rendering keeps of each of its chains' texts: its length and SipHash in 16
/// bytes, not a string of its own (110,000 chains at 100,000 endpoints).
pub fn digest(text: &str) -> u128 {
    use std::hash::{Hash as _, Hasher as _};
    let mut h = std::collections::hash_map::DefaultHasher::new();
    text.hash(&mut h);
    (text.len() as u128) << 64 | u128::from(h.finish())
}

/// Whether `stored` (a text or its digest) is the chain text `fresh`.
pub fn same_text(stored: &str, fresh: &str) -> bool {
    if stored.starts_with('\0') {
        stored == text_digest(fresh)
    } else {
        stored == fresh
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use crate::model::Protocol;
    use std::collections::BTreeSet;

    fn spn(ns: &str, name: &str, port: &str, protocol: Protocol) -> ServicePortName {
        ServicePortName { namespace: ns.into(), name: name.into(), port: port.into(), protocol }
    }

    fn ep(ip: &str, port: u16) -> Endpoint {
        Endpoint {
            ip: ip.parse().unwrap(),
            port,
            ready: true,
            serving: true,
            terminating: false,
            local: false,
            zone: None,
            zone_hints: BTreeSet::new(),
        }
    }

    // Names from upstream's proxier tests (TestOverallIPTablesRules): facts the hash must
    // reproduce.
    #[test]
    fn names_match_upstream() {
        let svc1 = spn("ns1", "svc1", "p80", Protocol::Tcp);
        assert_eq!(svc_chain(&svc1), "KUBE-SVC-XPGD46QRK7WJZT7O");
        assert_eq!(sep_chain(&svc1, &ep("10.180.0.1", 80)), "KUBE-SEP-SXIVWICOYRO3J4NJ");
        let svc2 = spn("ns2", "svc2", "p80", Protocol::Tcp);
        assert_eq!(svc_chain(&svc2), "KUBE-SVC-GNZBNJ2PO5MGZ6GT");
        assert_eq!(ext_chain(&svc2), "KUBE-EXT-GNZBNJ2PO5MGZ6GT");
        assert_eq!(svl_chain(&svc2), "KUBE-SVL-GNZBNJ2PO5MGZ6GT");
        assert_eq!(fw_chain(&svc2), "KUBE-FW-GNZBNJ2PO5MGZ6GT");
    }

    #[test]
    fn names_fit_iptables() {
        let long = spn(&"n".repeat(63), &"s".repeat(63), &"p".repeat(15), Protocol::Sctp);
        for c in [svc_chain(&long), svl_chain(&long), ext_chain(&long), fw_chain(&long), sep_chain(&long, &ep("fd00::1", 65535))] {
            assert!(c.len() <= 28, "{c}");
        }
    }

    #[test]
    fn digests_stand_for_their_text() {
        let a = "-A KUBE-SVC-X -j KUBE-SEP-Y\n";
        let d = text_digest(a);
        assert!(d.len() < 30 && same_text(&d, a) && same_text(a, a));
        assert!(!same_text(&d, "-A KUBE-SVC-X -j KUBE-SEP-Z\n"));
        assert_eq!(text_digest(&d), d, "a digest is kept as it is");
    }
}
