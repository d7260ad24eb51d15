//! The pure model: Services and their EndpointSlices -> the records of the Kubernetes DNS
//! specification (schema 1.1.0), and the index [`crate::answer`] looks names up in.
//!
//! One Service's records come from [`service_records`] (a pure function of the Service and the
//! slices labelled with its name); the controller keeps them per Service and builds an
//! [`Index`] from all of them. Names are compared case-insensitively (hickory's `Name` hashes
//! and compares lower-cased labels); there are no wildcards.

use std::collections::{BTreeSet, HashMap, HashSet};
use std::net::IpAddr;
use std::sync::Arc;

use hickory_proto::rr::rdata::{A, AAAA, CNAME, NS, PTR, SOA, SRV, TXT};
use hickory_proto::rr::{Name, RData, Record, RecordType};
use k8s_openapi::api::core::v1::Service;
use k8s_openapi::api::discovery::v1::EndpointSlice;

/// The version of the specification these records follow (`dns-version.<zone>` TXT).
pub const SCHEMA_VERSION: &str = "1.1.0";
/// The label linking an EndpointSlice to its Service.
pub const LABEL_SERVICE_NAME: &str = "kubernetes.io/service-name";
/// The legacy annotation that makes every endpoint count as ready (the specification's
/// definition of _ready_).
pub const TOLERATE_UNREADY: &str = "service.alpha.kubernetes.io/tolerate-unready-endpoints";

/// The cluster domain and how answers from it are stamped.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Zone {
    /// `cluster.local.`, lower case, fully qualified.
    pub domain: Name,
    /// TTL of every record, and the negative TTL (SOA minimum).
    pub ttl: u32,
    /// Addresses of this server, answered for `ns.dns.<zone>` (the SOA's and NS's name).
    pub ns_addrs: Vec<IpAddr>,
}

/// Why a name could not be made (a Service the API server accepted always works; this guards
/// against objects from elsewhere).
#[derive(Debug, thiserror::Error, Clone, PartialEq, Eq)]
pub enum ModelError {
    #[error("invalid cluster domain {domain:?}: {reason}")]
    Domain { domain: String, reason: String },
    #[error("service {service}: {what} {value:?} is not a usable DNS name: {reason}")]
    Name { service: String, what: &'static str, value: String, reason: String },
}

impl Zone {
    pub fn new(domain: &str, ttl: u32, ns_addrs: Vec<IpAddr>) -> Result<Zone, ModelError> {
        let err = |reason: String| ModelError::Domain { domain: domain.to_string(), reason };
        let trimmed = domain.trim_end_matches('.');
        if trimmed.is_empty() {
            return Err(err("empty".into()));
        }
        let mut name = Name::from_ascii(trimmed).map_err(|e| err(e.to_string()))?.to_lowercase();
        name.set_fqdn(true);
        Ok(Zone { domain: name, ttl, ns_addrs })
    }

    /// `labels` (most specific first) under the zone.
    fn name(&self, labels: &[&str]) -> Result<Name, String> {
        let rel = Name::from_labels(labels.iter().map(|l| l.as_bytes())).map_err(|e| e.to_string())?;
        rel.append_domain(&self.domain).map_err(|e| e.to_string())
    }

    /// `ns.dns.<zone>`, the name server of the SOA and NS records.
    pub fn ns_name(&self) -> Name {
        self.name(&["ns", "dns"]).unwrap_or_else(|_| self.domain.clone())
    }

    /// The zone's SOA (RFC 2308: the negative TTL is the smaller of its TTL and its minimum,
    /// both `ttl` here).
    pub fn soa(&self, serial: u32) -> Record {
        let rname = self.name(&["hostmaster"]).unwrap_or_else(|_| self.domain.clone());
        let soa = SOA::new(self.ns_name(), rname, serial, 7200, 1800, 86400, self.ttl);
        Record::from_rdata(self.domain.clone(), self.ttl, RData::SOA(soa))
    }
}

/// The records one Service contributes, owner name -> data.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ServiceRecords {
    pub records: Vec<(Name, RData)>,
}

/// The reverse-lookup name of an address (`d.c.b.a.in-addr.arpa.`, nibbles under `ip6.arpa.`).
pub fn reverse_name(ip: IpAddr) -> Name {
    let text = match ip {
        IpAddr::V4(v4) => {
            let o = v4.octets();
            format!("{}.{}.{}.{}.in-addr.arpa.", o[3], o[2], o[1], o[0])
        }
        IpAddr::V6(v6) => {
            let mut s = String::with_capacity(73);
            for b in v6.octets().iter().rev() {
                s.push_str(&format!("{:x}.{:x}.", b & 0xf, b >> 4));
            }
            s.push_str("ip6.arpa.");
            s
        }
    };
    // Only digits, hex letters and dots: always a valid name.
    Name::from_ascii(&text).unwrap_or_else(|_| Name::root())
}

/// The system-assigned _hostname_ of an endpoint without one: its address with `-` for the
/// separators (`10-0-0-1`, `2001-db8--1`).
pub fn dashed(ip: IpAddr) -> String {
    ip.to_string().replace(['.', ':'], "-")
}

fn rdata_for(ip: IpAddr) -> RData {
    match ip {
        IpAddr::V4(v4) => RData::A(A(v4)),
        IpAddr::V6(v6) => RData::AAAA(AAAA(v6)),
    }
}

/// The key of the Service an EndpointSlice belongs to (its `kubernetes.io/service-name`
/// label), as `namespace/name`.
pub fn slice_service(slice: &EndpointSlice) -> Option<(String, String)> {
    let ns = slice.metadata.namespace.clone()?;
    let name = slice.metadata.labels.as_ref()?.get(LABEL_SERVICE_NAME)?.clone();
    Some((ns, name))
}

fn is_headless(svc: &Service) -> bool {
    svc.spec.as_ref().and_then(|s| s.cluster_ip.as_deref()) == Some("None")
}

/// Whether every endpoint of the Service counts as ready (publishNotReadyAddresses, or the
/// legacy annotation the specification names).
fn tolerates_unready(svc: &Service) -> bool {
    svc.spec.as_ref().and_then(|s| s.publish_not_ready_addresses) == Some(true)
        || svc.metadata.annotations.as_ref().and_then(|a| a.get(TOLERATE_UNREADY)).map(String::as_str) == Some("true")
}

fn proto_label(protocol: Option<&str>) -> String {
    format!("_{}", protocol.unwrap_or("TCP").to_ascii_lowercase())
}

/// The records of one Service (specification 2.3 to 2.5), from the Service and the
/// EndpointSlices labelled with its name.
pub fn service_records(zone: &Zone, svc: &Service, slices: &[Arc<EndpointSlice>]) -> Result<ServiceRecords, ModelError> {
    let ns = svc.metadata.namespace.clone().unwrap_or_else(|| "default".into());
    let name = svc.metadata.name.clone().unwrap_or_default();
    let key = format!("{ns}/{name}");
    let bad = |what: &'static str, value: &str, reason: String| ModelError::Name {
        service: key.clone(),
        what,
        value: value.to_string(),
        reason,
    };
    let base = zone.name(&[&name, &ns, "svc"]).map_err(|r| bad("name", &name, r))?;
    let Some(spec) = svc.spec.as_ref() else { return Ok(ServiceRecords::default()) };
    let mut out = ServiceRecords::default();

    if spec.type_.as_deref() == Some("ExternalName") {
        let ext = spec.external_name.as_deref().unwrap_or_default();
        let mut target = Name::from_ascii(ext.trim_end_matches('.')).map_err(|e| bad("externalName", ext, e.to_string()))?;
        if ext.is_empty() {
            return Err(bad("externalName", ext, "empty".into()));
        }
        target.set_fqdn(true);
        out.records.push((base, RData::CNAME(CNAME(target))));
        return Ok(out);
    }

    if !is_headless(svc) {
        let mut ips: Vec<&str> = spec.cluster_ips.iter().flatten().map(String::as_str).collect();
        if ips.is_empty() {
            ips.extend(spec.cluster_ip.as_deref());
        }
        let ips: Vec<IpAddr> = ips.iter().filter_map(|s| s.parse().ok()).collect();
        if ips.is_empty() {
            return Ok(out);
        }
        for ip in &ips {
            out.records.push((base.clone(), rdata_for(*ip)));
            out.records.push((reverse_name(*ip), RData::PTR(PTR(base.clone()))));
        }
        for p in spec.ports.iter().flatten() {
            let Some(port_name) = p.name.as_deref().filter(|n| !n.is_empty()) else { continue };
            let Ok(port) = u16::try_from(p.port) else { continue };
            let owner = Name::from_labels([format!("_{port_name}").as_bytes(), proto_label(p.protocol.as_deref()).as_bytes()])
                .and_then(|n| n.append_domain(&base))
                .map_err(|e| bad("port name", port_name, e.to_string()))?;
            out.records.push((owner, RData::SRV(SRV::new(0, 100, port, base.clone()))));
        }
        return Ok(out);
    }

    // Headless: the ready endpoints, each under its hostname (or its dashed address).
    let all = tolerates_unready(svc);
    // (endpoint name, address) once each, whatever the number of slices listing it
    let mut endpoints: BTreeSet<(String, IpAddr)> = BTreeSet::new();
    // (port name, protocol label, port) -> endpoint names
    let mut srv: BTreeSet<(String, String, u16, String)> = BTreeSet::new();
    for slice in slices {
        if !matches!(slice.address_type.as_str(), "IPv4" | "IPv6") {
            continue;
        }
        let ports: Vec<(String, String, u16)> = slice
            .ports
            .iter()
            .flatten()
            .filter_map(|p| {
                let n = p.name.clone().filter(|n| !n.is_empty())?;
                let port = u16::try_from(p.port?).ok()?;
                Some((n, proto_label(p.protocol.as_deref()), port))
            })
            .collect();
        for ep in &slice.endpoints {
            let ready = all || ep.conditions.as_ref().and_then(|c| c.ready) != Some(false);
            if !ready {
                continue;
            }
            for a in &ep.addresses {
                let Ok(ip) = a.parse::<IpAddr>() else { continue };
                let host = ep.hostname.clone().filter(|h| !h.is_empty()).unwrap_or_else(|| dashed(ip));
                endpoints.insert((host.clone(), ip));
                for (pn, proto, port) in &ports {
                    srv.insert((pn.clone(), proto.clone(), *port, host.clone()));
                }
            }
        }
    }
    for (host, ip) in &endpoints {
        let owner = Name::from_labels([host.as_bytes()]).and_then(|n| n.append_domain(&base)).map_err(|e| bad("endpoint hostname", host, e.to_string()))?;
        out.records.push((base.clone(), rdata_for(*ip)));
        out.records.push((owner.clone(), rdata_for(*ip)));
        out.records.push((reverse_name(*ip), RData::PTR(PTR(owner))));
    }
    // equal weights that add up to about 100 per port, as RFC 2782 leaves the choice to us
    let mut per_port: HashMap<(String, String, u16), u16> = HashMap::new();
    for (pn, proto, port, _) in &srv {
        *per_port.entry((pn.clone(), proto.clone(), *port)).or_default() += 1;
    }
    for (pn, proto, port, host) in &srv {
        let n = per_port.get(&(pn.clone(), proto.clone(), *port)).copied().unwrap_or(1).max(1);
        let owner = Name::from_labels([format!("_{pn}").as_bytes(), proto.as_bytes()])
            .and_then(|o| o.append_domain(&base))
            .map_err(|e| bad("port name", pn, e.to_string()))?;
        let target = Name::from_labels([host.as_bytes()]).and_then(|t| t.append_domain(&base)).map_err(|e| bad("endpoint hostname", host, e.to_string()))?;
        out.records.push((owner, RData::SRV(SRV::new(0, (100 / n).max(1), *port, target))));
    }
    Ok(out)
}

/// What the server answers from: every record by owner name, the names that exist only as
/// ancestors of others (empty non-terminals: NODATA, not NXDOMAIN), and the zone's SOA.
#[derive(Debug, Clone)]
pub struct Index {
    pub zone: Zone,
    names: HashMap<Name, Vec<RData>>,
    ents: HashSet<Name>,
    soa: Record,
    /// How many Services went into it.
    pub services: usize,
}

impl Index {
    /// The index of `services` (records of each Service, in any order). `serial` is the SOA's.
    pub fn build<'a>(zone: &Zone, serial: u32, services: impl IntoIterator<Item = &'a ServiceRecords>) -> Index {
        let mut names: HashMap<Name, Vec<RData>> = HashMap::new();
        let mut count = 0;
        for s in services {
            count += 1;
            for (owner, data) in &s.records {
                let v = names.entry(owner.clone()).or_default();
                if !v.contains(data) {
                    v.push(data.clone());
                }
            }
        }
        // The zone's own names.
        let soa = zone.soa(serial);
        let apex = names.entry(zone.domain.clone()).or_default();
        apex.push(soa.data().clone());
        apex.push(RData::NS(NS(zone.ns_name())));
        if let Ok(v) = Name::from_labels([b"dns-version".as_slice()]).and_then(|n| n.append_domain(&zone.domain)) {
            names.entry(v).or_default().push(RData::TXT(TXT::new(vec![SCHEMA_VERSION.to_string()])));
        }
        let ns = names.entry(zone.ns_name()).or_default();
        for ip in &zone.ns_addrs {
            ns.push(rdata_for(*ip));
        }
        // Records in a stable order: answers do not change between two identical builds.
        for v in names.values_mut() {
            v.sort_by_cached_key(|d| d.to_string());
        }
        let mut ents = HashSet::new();
        for owner in names.keys() {
            if !zone.domain.zone_of(owner) {
                continue;
            }
            let mut n = owner.base_name();
            while zone.domain.zone_of(&n) && !names.contains_key(&n) {
                if !ents.insert(n.clone()) {
                    break;
                }
                n = n.base_name();
            }
        }
        Index { zone: zone.clone(), soa, names, ents, services: count }
    }

    /// An index with no Services (before the informers synced).
    pub fn empty(zone: &Zone) -> Index {
        Self::build(zone, 0, std::iter::empty())
    }

    /// Whether the name is in the cluster domain (answered here, never forwarded).
    pub fn in_zone(&self, name: &Name) -> bool {
        self.zone.domain.zone_of(name)
    }

    /// The records at `name` (any type), if it has any.
    pub fn records(&self, name: &Name) -> Option<&[RData]> {
        self.names.get(name).map(Vec::as_slice)
    }

    /// Whether `name` exists: it has records, or names below it do.
    pub fn exists(&self, name: &Name) -> bool {
        self.names.contains_key(name) || self.ents.contains(name)
    }

    /// The records at `name` of type `rtype` (ANY: all of them).
    pub fn lookup(&self, name: &Name, rtype: RecordType) -> impl Iterator<Item = &RData> {
        self.records(name).unwrap_or_default().iter().filter(move |d| rtype == RecordType::ANY || d.record_type() == rtype)
    }

    pub fn soa(&self) -> &Record {
        &self.soa
    }

    /// Owner names with records (for tests and the benchmark's name list).
    pub fn names(&self) -> impl Iterator<Item = &Name> {
        self.names.keys()
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use serde_json::json;

    pub(crate) fn zone() -> Zone {
        Zone::new("cluster.local", 5, vec!["169.254.20.10".parse().unwrap()]).unwrap()
    }

    fn svc(v: serde_json::Value) -> Service {
        serde_json::from_value(v).unwrap()
    }

    fn slice(v: serde_json::Value) -> Arc<EndpointSlice> {
        Arc::new(serde_json::from_value(v).unwrap())
    }

    fn n(s: &str) -> Name {
        Name::from_ascii(s).unwrap()
    }

    fn has(r: &ServiceRecords, owner: &str, data: &str) -> bool {
        r.records.iter().any(|(o, d)| *o == n(owner) && d.to_string() == data)
    }

    #[test]
    fn cluster_ip_service_has_a_ptr_and_srv_for_named_ports_only() {
        let s = svc(json!({"metadata": {"name": "web", "namespace": "ns1"},
            "spec": {"clusterIP": "10.96.0.5", "clusterIPs": ["10.96.0.5", "fd00::5"],
                "ports": [{"name": "http", "port": 80}, {"port": 81}, {"name": "dns", "port": 53, "protocol": "UDP"}]}}));
        let r = service_records(&zone(), &s, &[]).unwrap();
        assert!(has(&r, "web.ns1.svc.cluster.local.", "10.96.0.5"));
        assert!(has(&r, "web.ns1.svc.cluster.local.", "fd00::5"));
        assert!(has(&r, "5.0.96.10.in-addr.arpa.", "web.ns1.svc.cluster.local."));
        let v6 = reverse_name("fd00::5".parse().unwrap());
        assert_eq!(v6.to_ascii(), "5.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.d.f.ip6.arpa.");
        assert!(has(&r, &v6.to_ascii(), "web.ns1.svc.cluster.local."));
        assert!(has(&r, "_http._tcp.web.ns1.svc.cluster.local.", "0 100 80 web.ns1.svc.cluster.local."));
        assert!(has(&r, "_dns._udp.web.ns1.svc.cluster.local.", "0 100 53 web.ns1.svc.cluster.local."));
        // the unnamed port has none
        assert_eq!(r.records.iter().filter(|(_, d)| d.record_type() == RecordType::SRV).count(), 2);
        // endpoints of a ClusterIP Service are not published
        let sl = slice(json!({"metadata": {"name": "web-1", "namespace": "ns1", "labels": {LABEL_SERVICE_NAME: "web"}},
            "addressType": "IPv4", "endpoints": [{"addresses": ["10.88.0.7"], "hostname": "x"}]}));
        assert_eq!(service_records(&zone(), &s, &[sl]).unwrap(), r);
    }

    #[test]
    fn headless_service_publishes_ready_endpoints_by_hostname_or_address() {
        let s = svc(json!({"metadata": {"name": "db", "namespace": "ns1"},
            "spec": {"clusterIP": "None", "ports": [{"name": "pg", "port": 5432}]}}));
        let sl = slice(json!({"metadata": {"name": "db-1", "namespace": "ns1", "labels": {LABEL_SERVICE_NAME: "db"}},
            "addressType": "IPv4", "ports": [{"name": "pg", "port": 5432, "protocol": "TCP"}],
            "endpoints": [
                {"addresses": ["10.88.0.10"], "hostname": "db-0", "conditions": {"ready": true}},
                {"addresses": ["10.88.0.11"], "conditions": {}},
                {"addresses": ["10.88.0.12"], "hostname": "db-2", "conditions": {"ready": false}}]}));
        let r = service_records(&zone(), &s, std::slice::from_ref(&sl)).unwrap();
        assert!(has(&r, "db.ns1.svc.cluster.local.", "10.88.0.10"));
        assert!(has(&r, "db.ns1.svc.cluster.local.", "10.88.0.11"));
        assert!(!has(&r, "db.ns1.svc.cluster.local.", "10.88.0.12"));
        assert!(has(&r, "db-0.db.ns1.svc.cluster.local.", "10.88.0.10"));
        assert!(has(&r, "10-88-0-11.db.ns1.svc.cluster.local.", "10.88.0.11"));
        assert!(has(&r, "10.0.88.10.in-addr.arpa.", "db-0.db.ns1.svc.cluster.local."));
        assert!(has(&r, "_pg._tcp.db.ns1.svc.cluster.local.", "0 50 5432 db-0.db.ns1.svc.cluster.local."));
        assert!(has(&r, "_pg._tcp.db.ns1.svc.cluster.local.", "0 50 5432 10-88-0-11.db.ns1.svc.cluster.local."));
        // publishNotReadyAddresses: the unready one too
        let mut s2 = s.clone();
        s2.spec.as_mut().unwrap().publish_not_ready_addresses = Some(true);
        let r2 = service_records(&zone(), &s2, std::slice::from_ref(&sl)).unwrap();
        assert!(has(&r2, "db-2.db.ns1.svc.cluster.local.", "10.88.0.12"));
        // the legacy annotation likewise
        let mut s3 = s.clone();
        s3.metadata.annotations = Some([(TOLERATE_UNREADY.to_string(), "true".to_string())].into());
        assert!(has(&service_records(&zone(), &s3, &[sl]).unwrap(), "db.ns1.svc.cluster.local.", "10.88.0.12"));
    }

    #[test]
    fn external_name_is_a_cname() {
        let s = svc(json!({"metadata": {"name": "ext", "namespace": "ns1"},
            "spec": {"type": "ExternalName", "externalName": "www.example.com"}}));
        let r = service_records(&zone(), &s, &[]).unwrap();
        assert_eq!(r.records.len(), 1);
        assert!(has(&r, "ext.ns1.svc.cluster.local.", "www.example.com."));
        let bad = svc(json!({"metadata": {"name": "ext", "namespace": "ns1"}, "spec": {"type": "ExternalName"}}));
        assert!(service_records(&zone(), &bad, &[]).is_err());
    }

    #[test]
    fn index_knows_empty_non_terminals_and_the_zone_names() {
        let s = svc(json!({"metadata": {"name": "web", "namespace": "ns1"},
            "spec": {"clusterIP": "10.96.0.5", "ports": [{"name": "http", "port": 80}]}}));
        let r = service_records(&zone(), &s, &[]).unwrap();
        let idx = Index::build(&zone(), 1, [&r]);
        for e in ["ns1.svc.cluster.local.", "svc.cluster.local.", "cluster.local.", "_tcp.web.ns1.svc.cluster.local.", "dns.cluster.local."] {
            assert!(idx.exists(&n(e)), "{e}");
        }
        assert!(!idx.exists(&n("ns2.svc.cluster.local.")));
        assert!(!idx.exists(&n("in-addr.arpa.")), "reverse ancestors are not ours");
        assert_eq!(idx.lookup(&n("dns-version.cluster.local."), RecordType::TXT).next().unwrap().to_string(), "1.1.0");
        assert_eq!(idx.lookup(&n("ns.dns.cluster.local."), RecordType::A).next().unwrap().to_string(), "169.254.20.10");
        // case-insensitive
        assert_eq!(idx.lookup(&n("WEB.Ns1.svc.Cluster.LOCAL."), RecordType::A).count(), 1);
        assert_eq!(idx.soa().ttl(), 5);
    }
}
