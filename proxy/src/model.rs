//! The pure model every renderer works from: Services and EndpointSlices (and this node's name
//! and zone) reduced, per IP family, to service ports and their endpoints, with upstream's
//! meaning of each field. Nothing here touches the host; bad input becomes a [`Problem`] and
//! the rest of the model is still built.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::net::IpAddr;
use std::sync::Arc;

use ipnet::IpNet;
use crate::slim::Service;

use crate::slim::{Address, EndpointSlice};
/// The label that hands a Service to another proxy (upstream's `service.kubernetes.io/service-proxy-name`).
pub const LABEL_SERVICE_PROXY_NAME: &str = "service.kubernetes.io/service-proxy-name";
/// The label the EndpointSlice controller puts on slices of headless Services.
pub const LABEL_HEADLESS: &str = "service.kubernetes.io/headless";
/// The label naming an EndpointSlice's Service.
pub const LABEL_SERVICE_NAME: &str = "kubernetes.io/service-name";
/// The node label carrying its zone.
pub const LABEL_ZONE: &str = "topology.kubernetes.io/zone";
/// Upstream's default ClientIP affinity timeout (3 hours).
pub const DEFAULT_AFFINITY_SECONDS: u32 = 10800;

/// An IP family; each is rendered into its own tables.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Family {
    V4,
    V6,
}

impl Family {
    pub fn of(ip: &IpAddr) -> Family {
        if ip.is_ipv4() {
            Family::V4
        } else {
            Family::V6
        }
    }

    pub fn contains(self, ip: &IpAddr) -> bool {
        Family::of(ip) == self
    }

    pub fn contains_net(self, net: &IpNet) -> bool {
        Family::of(&net.addr()) == self
    }
}

/// A service port's protocol.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Protocol {
    Tcp,
    Udp,
    Sctp,
}

impl Protocol {
    /// From the API's spelling (`TCP`, `UDP`, `SCTP`; an unset protocol is TCP).
    pub fn parse(s: Option<&str>) -> Option<Protocol> {
        match s.unwrap_or("TCP") {
            "TCP" => Some(Protocol::Tcp),
            "UDP" => Some(Protocol::Udp),
            "SCTP" => Some(Protocol::Sctp),
            _ => None,
        }
    }

    /// Lower case, as iptables' `-p` and upstream's chain hashes spell it.
    pub fn lower(self) -> &'static str {
        match self {
            Protocol::Tcp => "tcp",
            Protocol::Udp => "udp",
            Protocol::Sctp => "sctp",
        }
    }
}

/// Upstream's `ServicePortName`: namespace, Service name, port name and protocol. Its
/// [`Display`](fmt::Display) is upstream's `String()` ("ns/svc:port", or "ns/svc" for an
/// unnamed port), which also feeds the chain-name hashes.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ServicePortName {
    /// Shared (`Arc`): a service port's name is a key of the model, of the committed states and
    /// of the model cache, and the namespace and Service name are the same for all its ports.
    pub namespace: Arc<str>,
    pub name: Arc<str>,
    pub port: Arc<str>,
    pub protocol: Protocol,
}

impl fmt::Display for ServicePortName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.namespace, self.name)?;
        if !self.port.is_empty() {
            write!(f, ":{}", self.port)?;
        }
        Ok(())
    }
}

/// One port of a Service, for one IP family.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServicePort {
    pub name: ServicePortName,
    pub cluster_ip: IpAddr,
    pub port: u16,
    pub protocol: Protocol,
    /// 0: none.
    pub node_port: u16,
    pub external_ips: Vec<IpAddr>,
    /// status.loadBalancer.ingress IPs (those with ipMode Proxy are left out, as upstream).
    pub load_balancer_ips: Vec<IpAddr>,
    pub load_balancer_source_ranges: Vec<IpNet>,
    /// ClientIP session affinity with its timeout in seconds.
    pub affinity_seconds: Option<u32>,
    pub external_policy_local: bool,
    pub internal_policy_local: bool,
    /// 0: none.
    pub health_check_node_port: u16,
    /// Topology-aware routing asked for (trafficDistribution PreferClose/PreferSameZone, or
    /// the topology-mode annotation Auto).
    pub topology_aware: bool,
}

impl ServicePort {
    /// Upstream's ExternallyAccessible: a node port, a load-balancer IP or an external IP.
    pub fn externally_accessible(&self) -> bool {
        self.node_port != 0 || !self.load_balancer_ips.is_empty() || !self.external_ips.is_empty()
    }

    /// Upstream's UsesClusterEndpoints: internal policy Cluster, or any external access (even
    /// with external policy Local, cluster endpoints serve the short circuit for pods).
    pub fn uses_cluster_endpoints(&self) -> bool {
        !self.internal_policy_local || self.externally_accessible()
    }

    /// Upstream's UsesLocalEndpoints.
    pub fn uses_local_endpoints(&self) -> bool {
        self.internal_policy_local || (self.external_policy_local && self.externally_accessible())
    }
}

/// One endpoint of a service port (for one family).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct Endpoint {
    pub ip: IpAddr,
    pub port: u16,
    pub ready: bool,
    pub serving: bool,
    pub terminating: bool,
    /// On this node (its nodeName is this node's).
    pub local: bool,
    pub zone: Option<String>,
    /// hints.forZones.
    pub zone_hints: BTreeSet<String>,
}

impl Endpoint {
    /// "ip:port" ("[ip]:port" for IPv6), upstream's endpoint String(), part of the KUBE-SEP hash.
    pub fn addr(&self) -> String {
        match self.ip {
            IpAddr::V4(ip) => format!("{ip}:{}", self.port),
            IpAddr::V6(ip) => format!("[{ip}]:{}", self.port),
        }
    }
}

/// A service port with the endpoints the EndpointSlices give it, sorted by address.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServiceEntry {
    pub port: ServicePort,
    pub endpoints: Vec<Endpoint>,
}

/// This node, as the model needs it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct NodeInfo {
    pub name: String,
    pub zone: Option<String>,
}

/// Everything of one family the renderers need.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FamilyModel {
    pub family: Family,
    pub services: BTreeMap<ServicePortName, Arc<ServiceEntry>>,
}

impl FamilyModel {
    /// The service ports whose entry differs from what a renderer committed (`committed`: its
    /// entry and rendering of each service port): added, changed or gone. `hint`, the names
    /// the controller says changed, is looked at instead of comparing every entry; names in it
    /// whose entry is in fact unchanged are left out either way.
    pub fn changed_since<R, S: std::hash::BuildHasher>(
        &self,
        committed: &std::collections::HashMap<ServicePortName, (Arc<ServiceEntry>, R), S>,
        hint: Option<&BTreeSet<ServicePortName>>,
    ) -> Vec<ServicePortName> {
        let candidates: Vec<ServicePortName> = match hint {
            Some(names) => names.iter().cloned().collect(),
            None => {
                let mut names: Vec<ServicePortName> = Vec::new();
                let mut present = 0usize;
                for (name, entry) in &self.services {
                    match committed.get(name) {
                        Some((e, _)) if e == entry => present += 1,
                        Some(_) => {
                            present += 1;
                            names.push(name.clone());
                        }
                        None => names.push(name.clone()),
                    }
                }
                if present < committed.len() {
                    names.extend(committed.keys().filter(|n| !self.services.contains_key(*n)).cloned());
                }
                names
            }
        };
        candidates
            .into_iter()
            .filter(|name| match (committed.get(name), self.services.get(name)) {
                (Some((e, _)), Some(n)) => e != n,
                (None, None) => false,
                _ => true,
            })
            .collect()
    }
}

/// Something in the input that was left out, and why (logged and turned into an Event by the
/// controller; the rest is still programmed).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Problem {
    UnsupportedProtocol { service: String, port: String, protocol: String },
    InvalidIp { service: String, field: &'static str, value: String },
    InvalidCidr { service: String, field: &'static str, value: String },
    InvalidPort { service: String, port: String, value: i32 },
    InvalidEndpoint { slice: String, address: String, reason: String },
    /// The kernel refused this service port's rules: it is left out (the others are
    /// programmed) until its Service or endpoints change.
    Refused { service: String, port: String, family: Family, message: String },
}

impl fmt::Display for Problem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Problem::UnsupportedProtocol { service, port, protocol } => {
                write!(f, "service {service} port {port:?}: unsupported protocol {protocol:?}")
            }
            Problem::InvalidIp { service, field, value } => {
                write!(f, "service {service}: {field} {value:?} is not an IP address")
            }
            Problem::InvalidCidr { service, field, value } => {
                write!(f, "service {service}: {field} {value:?} is not a CIDR")
            }
            Problem::InvalidPort { service, port, value } => {
                write!(f, "service {service} port {port:?}: {value} is not a valid port")
            }
            Problem::InvalidEndpoint { slice, address, reason } => {
                write!(f, "endpointslice {slice}: endpoint {address:?} skipped: {reason}")
            }
            Problem::Refused { service, port, family, message } => {
                write!(f, "service {service} port {port:?}: the kernel refused its {family:?} rules, left out until it changes: {message}")
            }
        }
    }
}

/// Whether the proxy handles this Service at all: not headless, not ExternalName, not handed to
/// another proxy by the service-proxy-name label.
pub fn is_proxied(svc: &Service) -> bool {
    let labels = svc.metadata.labels.as_ref();
    if labels.is_some_and(|l| l.contains_key(LABEL_SERVICE_PROXY_NAME)) {
        return false;
    }
    let Some(spec) = &svc.spec else { return false };
    if spec.type_.as_deref() == Some("ExternalName") {
        return false;
    }
    match spec.cluster_ip.as_deref() {
        None | Some("") | Some("None") => false,
        Some(_) => true,
    }
}

fn key_of(svc: &Service) -> String {
    format!(
        "{}/{}",
        svc.metadata.namespace.as_deref().unwrap_or_default(),
        svc.metadata.name.as_deref().unwrap_or_default()
    )
}

fn port_u16(v: i32) -> Option<u16> {
    u16::try_from(v).ok().filter(|p| *p != 0)
}

/// The service ports of one Service in one family (empty when it has no cluster IP of that
/// family or is not proxied).
pub fn service_ports(svc: &Service, family: Family, problems: &mut Vec<Problem>) -> Vec<ServicePort> {
    let mut out = Vec::new();
    if !is_proxied(svc) {
        return out;
    }
    let Some(spec) = &svc.spec else { return out };
    let key = key_of(svc);
    let (namespace, name): (Arc<str>, Arc<str>) = (
        svc.metadata.namespace.as_deref().unwrap_or_default().into(),
        svc.metadata.name.as_deref().unwrap_or_default().into(),
    );
    // clusterIPs wins; clusterIP is its first element (older objects may carry only it).
    let ips: Vec<&String> = match &spec.cluster_ips {
        Some(ips) if !ips.is_empty() => ips.iter().collect(),
        _ => spec.cluster_ip.iter().collect(),
    };
    let mut cluster_ip = None;
    for s in ips {
        match s.parse::<IpAddr>() {
            Ok(ip) if family.contains(&ip) => {
                cluster_ip.get_or_insert(ip);
            }
            Ok(_) => {}
            Err(_) => problems.push(Problem::InvalidIp { service: key.clone(), field: "clusterIPs", value: s.clone() }),
        }
    }
    let Some(cluster_ip) = cluster_ip else { return out };

    let type_ = spec.type_.as_deref().unwrap_or("ClusterIP");
    let mut external_ips = Vec::new();
    for s in spec.external_ips.iter().flatten() {
        match s.parse::<IpAddr>() {
            Ok(ip) if family.contains(&ip) => external_ips.push(ip),
            Ok(_) => {}
            Err(_) => problems.push(Problem::InvalidIp { service: key.clone(), field: "externalIPs", value: s.clone() }),
        }
    }
    let mut load_balancer_ips = Vec::new();
    if type_ == "LoadBalancer" {
        let ingress = svc.status.as_ref().and_then(|s| s.load_balancer.as_ref()).and_then(|l| l.ingress.as_ref());
        for ing in ingress.into_iter().flatten() {
            if ing.ip_mode.as_deref() == Some("Proxy") {
                continue;
            }
            let Some(s) = &ing.ip else { continue };
            match s.parse::<IpAddr>() {
                Ok(ip) if family.contains(&ip) => load_balancer_ips.push(ip),
                Ok(_) => {}
                Err(_) => problems.push(Problem::InvalidIp {
                    service: key.clone(),
                    field: "status.loadBalancer.ingress.ip",
                    value: s.clone(),
                }),
            }
        }
    }
    let mut load_balancer_source_ranges = Vec::new();
    if type_ == "LoadBalancer" {
        // The field wins over the (older) annotation, as upstream.
        let from_field: Vec<String> = spec.load_balancer_source_ranges.clone().unwrap_or_default();
        let ranges: Vec<String> = if !from_field.is_empty() {
            from_field
        } else {
            svc.metadata
                .annotations
                .as_ref()
                .and_then(|a| a.get("service.beta.kubernetes.io/load-balancer-source-ranges"))
                .map(|v| v.split(',').map(|s| s.trim().to_string()).filter(|s| !s.is_empty()).collect())
                .unwrap_or_default()
        };
        for s in ranges {
            match s.trim().parse::<IpNet>() {
                Ok(net) if family.contains_net(&net) => load_balancer_source_ranges.push(net.trunc()),
                Ok(_) => {}
                Err(_) => problems.push(Problem::InvalidCidr {
                    service: key.clone(),
                    field: "loadBalancerSourceRanges",
                    value: s.clone(),
                }),
            }
        }
    }
    let affinity_seconds = (spec.session_affinity.as_deref() == Some("ClientIP")).then(|| {
        spec.session_affinity_config
            .as_ref()
            .and_then(|c| c.client_ip.as_ref())
            .and_then(|c| c.timeout_seconds)
            .and_then(|t| u32::try_from(t).ok())
            .filter(|t| *t > 0)
            .unwrap_or(DEFAULT_AFFINITY_SECONDS)
    });
    let svc_externally_accessible =
        matches!(type_, "NodePort" | "LoadBalancer") || (type_ == "ClusterIP" && !external_ips.is_empty());
    let external_policy_local =
        svc_externally_accessible && spec.external_traffic_policy.as_deref() == Some("Local");
    let internal_policy_local = spec.internal_traffic_policy.as_deref() == Some("Local");
    let health_check_node_port = if external_policy_local && type_ == "LoadBalancer" {
        spec.health_check_node_port.and_then(port_u16).unwrap_or(0)
    } else {
        0
    };
    let annotations = svc.metadata.annotations.as_ref();
    let topology_aware = matches!(spec.traffic_distribution.as_deref(), Some("PreferClose") | Some("PreferSameZone"))
        || annotations.and_then(|a| a.get("service.kubernetes.io/topology-mode")).is_some_and(|v| v == "Auto")
        || annotations.and_then(|a| a.get("service.kubernetes.io/topology-aware-hints")).is_some_and(|v| v == "Auto");

    for p in spec.ports.iter().flatten() {
        let port_name = p.name.clone().unwrap_or_default();
        let Some(protocol) = Protocol::parse(p.protocol.as_deref()) else {
            problems.push(Problem::UnsupportedProtocol {
                service: key.clone(),
                port: port_name,
                protocol: p.protocol.as_deref().unwrap_or_default().to_string(),
            });
            continue;
        };
        let Some(port) = port_u16(p.port) else {
            problems.push(Problem::InvalidPort { service: key.clone(), port: port_name, value: p.port });
            continue;
        };
        let node_port = if matches!(type_, "NodePort" | "LoadBalancer") {
            match p.node_port {
                None | Some(0) => 0,
                Some(v) => match port_u16(v) {
                    Some(np) => np,
                    None => {
                        problems.push(Problem::InvalidPort { service: key.clone(), port: port_name, value: v });
                        continue;
                    }
                },
            }
        } else {
            0
        };
        out.push(ServicePort {
            name: ServicePortName { namespace: namespace.clone(), name: name.clone(), port: port_name.into(), protocol },
            cluster_ip,
            port,
            protocol,
            node_port,
            external_ips: external_ips.clone(),
            load_balancer_ips: load_balancer_ips.clone(),
            load_balancer_source_ranges: load_balancer_source_ranges.clone(),
            affinity_seconds,
            external_policy_local: external_policy_local && (node_port != 0 || !external_ips.is_empty() || !load_balancer_ips.is_empty()),
            internal_policy_local,
            health_check_node_port,
            topology_aware,
        });
    }
    out
}

/// The endpoints an EndpointSlice gives each service port (by port name and protocol) in one
/// family. Only the first address of an endpoint counts, as upstream.
pub fn slice_endpoints(
    slice: &EndpointSlice,
    family: Family,
    node: &NodeInfo,
    problems: &mut Vec<Problem>,
) -> Vec<(ServicePortName, Endpoint)> {
    let mut out = Vec::new();
    let want = match family {
        Family::V4 => "IPv4",
        Family::V6 => "IPv6",
    };
    if slice.address_type != want {
        return out;
    }
    let labels = slice.metadata.labels.as_ref();
    if labels.is_some_and(|l| l.contains_key(LABEL_SERVICE_PROXY_NAME) || l.contains_key(LABEL_HEADLESS)) {
        return out;
    }
    let Some(service) = slice.service_name() else { return out };
    let namespace: Arc<str> = slice.metadata.namespace.as_deref().unwrap_or_default().into();
    let service: Arc<str> = service.into();
    let slice_key = format!("{namespace}/{}", slice.metadata.name.as_deref().unwrap_or_default());
    for ep in &slice.endpoints {
        let Some(addr) = &ep.address else { continue };
        let ip = match addr {
            Address::Ip(ip) if family.contains(ip) => *ip,
            Address::Ip(_) => {
                problems.push(Problem::InvalidEndpoint {
                    slice: slice_key.clone(),
                    address: addr.to_string(),
                    reason: format!("not an {want} address"),
                });
                continue;
            }
            Address::Invalid(text) => {
                problems.push(Problem::InvalidEndpoint {
                    slice: slice_key.clone(),
                    address: text.to_string(),
                    reason: "not an IP address".into(),
                });
                continue;
            }
        };
        let cond = ep.conditions.as_ref();
        // nil ready means ready; nil serving means "as ready"; nil terminating means not.
        let ready = cond.and_then(|c| c.ready).unwrap_or(true);
        let serving = cond.and_then(|c| c.serving).unwrap_or(ready);
        let terminating = cond.and_then(|c| c.terminating).unwrap_or(false);
        let local = ep.node_name.as_deref().is_some_and(|n| !n.is_empty() && n == node.name);
        let zone_hints: BTreeSet<String> = ep
            .hints
            .as_ref()
            .and_then(|h| h.for_zones.as_ref())
            .map(|z| z.iter().map(|z| z.name.clone()).collect())
            .unwrap_or_default();
        for p in slice.ports.iter().flatten() {
            let Some(protocol) = Protocol::parse(p.protocol.as_deref()) else { continue };
            let Some(port) = p.port.and_then(port_u16) else { continue };
            out.push((
                ServicePortName {
                    namespace: namespace.clone(),
                    name: service.clone(),
                    port: p.name.as_deref().unwrap_or_default().into(),
                    protocol,
                },
                Endpoint {
                    ip,
                    port,
                    ready,
                    serving,
                    terminating,
                    local,
                    zone: ep.zone.as_deref().map(str::to_string),
                    zone_hints: zone_hints.clone(),
                },
            ));
        }
    }
    out
}

/// Builds the model of one family from everything the informers hold.
pub fn build(
    family: Family,
    services: &[Arc<Service>],
    slices: &[Arc<EndpointSlice>],
    node: &NodeInfo,
) -> (FamilyModel, Vec<Problem>) {
    let mut problems = Vec::new();
    let mut entries: BTreeMap<ServicePortName, ServiceEntry> = BTreeMap::new();
    for svc in services {
        for port in service_ports(svc, family, &mut problems) {
            entries.insert(port.name.clone(), ServiceEntry { port, endpoints: Vec::new() });
        }
    }
    let owners: std::collections::HashSet<(&str, &str)> = services
        .iter()
        .map(|s| (s.metadata.namespace.as_deref().unwrap_or_default(), s.metadata.name.as_deref().unwrap_or_default()))
        .collect();
    for slice in slices {
        // a slice of no proxied Service is not looked at (nor reported)
        let owner = slice.service_name();
        if !owner.is_some_and(|o| owners.contains(&(slice.metadata.namespace.as_deref().unwrap_or_default(), o))) {
            continue;
        }
        for (name, ep) in slice_endpoints(slice, family, node, &mut problems) {
            if let Some(e) = entries.get_mut(&name) {
                e.endpoints.push(ep);
            }
        }
    }
    for e in entries.values_mut() {
        // One endpoint per address: the same pod may appear in two slices while the
        // controller moves it; the more useful state wins (ready over serving over neither).
        e.endpoints.sort_by(|a, b| {
            (a.ip, a.port)
                .cmp(&(b.ip, b.port))
                .then((b.ready, b.serving, !b.terminating).cmp(&(a.ready, a.serving, !a.terminating)))
        });
        e.endpoints.dedup_by(|later, first| later.ip == first.ip && later.port == first.port);
        // kept until the Service changes: no room for endpoints that never come
        e.endpoints.shrink_to_fit();
    }
    (FamilyModel { family, services: entries.into_iter().map(|(k, v)| (k, Arc::new(v))).collect() }, problems)
}

/// The endpoints one service port sends traffic to, as upstream's CategorizeEndpoints.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Categorized<'a> {
    /// For "Cluster" policy traffic (ready, topology-filtered; else serving-terminating).
    pub cluster: Vec<&'a Endpoint>,
    /// For "Local" policy traffic (local ready; else local serving-terminating).
    pub local: Vec<&'a Endpoint>,
    /// Every endpoint any rule of this service can reach (each needs its KUBE-SEP chain).
    pub all_reachable: Vec<&'a Endpoint>,
    /// Whether any usable endpoint exists anywhere (else: REJECT).
    pub has_any: bool,
}

/// Upstream's topologyModeFromHints + availableForTopology: with topology asked for, every
/// ready endpoint hinted and some hinted for this node's zone, only those for this zone.
fn topology_zone<'a>(port: &ServicePort, endpoints: &'a [Endpoint], node: &'a NodeInfo) -> Option<&'a str> {
    if !port.topology_aware {
        return None;
    }
    let zone = node.zone.as_deref().filter(|z| !z.is_empty())?;
    let mut any_for_zone = false;
    for ep in endpoints.iter().filter(|e| e.ready) {
        if ep.zone_hints.is_empty() {
            return None;
        }
        if ep.zone_hints.contains(zone) {
            any_for_zone = true;
        }
    }
    any_for_zone.then_some(zone)
}

/// Splits a service port's endpoints as upstream's CategorizeEndpoints.
pub fn categorize<'a>(entry: &'a ServiceEntry, node: &'a NodeInfo) -> Categorized<'a> {
    let port = &entry.port;
    let eps = &entry.endpoints;
    let mut c = Categorized::default();
    if port.uses_cluster_endpoints() {
        let zone = topology_zone(port, eps, node);
        c.cluster = eps
            .iter()
            .filter(|e| e.ready && zone.is_none_or(|z| e.zone_hints.contains(z)))
            .collect();
        if c.cluster.is_empty() {
            c.cluster = eps.iter().filter(|e| e.serving && e.terminating).collect();
        }
        c.has_any = !c.cluster.is_empty();
    }
    if !port.uses_local_endpoints() {
        c.all_reachable = c.cluster.clone();
        return c;
    }
    let usable = |e: &&Endpoint| e.ready || (e.serving && e.terminating);
    if eps.iter().any(|e| usable(&e)) {
        c.has_any = true;
    }
    c.local = if eps.iter().any(|e| e.local && e.ready) {
        eps.iter().filter(|e| e.local && e.ready).collect()
    } else {
        eps.iter().filter(|e| e.local && e.serving && e.terminating).collect()
    };
    if !port.uses_cluster_endpoints() {
        c.all_reachable = c.local.clone();
        return c;
    }
    let mut all: Vec<&Endpoint> = c.cluster.iter().chain(c.local.iter()).copied().collect();
    all.sort_by_key(|e| (e.ip, e.port));
    all.dedup_by_key(|e| (e.ip, e.port));
    c.all_reachable = all;
    c
}

/// What one Service contributed to a model, and the versions it was built from.
#[derive(Debug, Clone)]
struct Cached {
    namespace: String,
    name: String,
    /// The Service's resourceVersion, and (name, resourceVersion) of each of its slices.
    version: String,
    slices: Vec<(String, String)>,
    /// The service ports it put into the model.
    ports: Vec<ServicePortName>,
    problems: Vec<Problem>,
}

impl Cached {
    /// Whether `svc` and `slices` are the objects this was built from (same resourceVersions;
    /// objects without one, in tests, never are). Allocates nothing.
    fn is_of(&self, svc: &Service, slices: &[&Arc<EndpointSlice>]) -> bool {
        let Some(version) = svc.metadata.resource_version.as_deref() else { return false };
        version == self.version
            && slices.len() == self.slices.len()
            && slices.iter().all(|s| {
                let (name, version) = (s.metadata.name.as_deref().unwrap_or_default(), s.metadata.resource_version.as_deref());
                version.is_some_and(|v| self.slices.iter().any(|(n, r)| n == name && r == v))
            })
    }
}

/// One service port of a model that changed, with its entry before the change (None: it was
/// not in the model).
pub type Changed = (ServicePortName, Option<Arc<ServiceEntry>>);

/// [`build`], incrementally and in place: the cache keeps, per Service, the resourceVersions of
/// the Service and its EndpointSlices it last parsed and the service ports it put into the
/// model; [`ModelCache::update`] parses again only the Services whose versions changed (or that
/// came or went) and changes only their service ports in the model it is given. At 100,000
/// endpoints a sync after one changed slice parses one Service's slices and writes one entry;
/// the rest is one pass comparing versions, without allocating. Objects without a
/// resourceVersion (tests) are always parsed.
#[derive(Debug, Default)]
pub struct ModelCache {
    node: Option<NodeInfo>,
    /// Per family, sorted by (namespace, name).
    per_family: BTreeMap<Family, Vec<Cached>>,
}

impl ModelCache {
    /// Brings `model` (the one this cache updated last time for its family, possibly with
    /// service ports taken out since) to what [`build`] would make of `services` and `slices`,
    /// changing only the service ports of Services whose objects changed. Returns the service
    /// ports written or removed, each with its entry before, and every current problem.
    pub fn update(
        &mut self,
        model: &mut FamilyModel,
        services: &[Arc<Service>],
        slices: &[Arc<EndpointSlice>],
        node: &NodeInfo,
    ) -> (Vec<Changed>, Vec<Problem>) {
        let family = model.family;
        if self.node.as_ref() != Some(node) {
            // locality and topology depend on the node: start over
            self.per_family.clear();
            self.node = Some(node.clone());
        }
        // both in (namespace, name) order: an informer lists them so (sorting is then one pass)
        let mut svcs: Vec<&Arc<Service>> = services.iter().collect();
        svcs.sort_by(|a, b| key(a.metadata.namespace.as_ref(), a.metadata.name.as_ref()).cmp(&key(b.metadata.namespace.as_ref(), b.metadata.name.as_ref())));
        let mut by_service: Vec<((&str, &str), &Arc<EndpointSlice>)> = slices
            .iter()
            .filter_map(|s| {
                let svc = s.service_name()?;
                Some(((s.metadata.namespace.as_deref().unwrap_or_default(), svc), s))
            })
            .collect();
        by_service.sort_by(|a, b| a.0.cmp(&b.0));
        let old = std::mem::take(self.per_family.entry(family).or_default());
        let mut next: Vec<Cached> = Vec::with_capacity(svcs.len());
        let mut changes: Vec<Changed> = Vec::new();
        let mut problems = Vec::new();
        let mut old = old.into_iter().peekable();
        let mut at = 0usize;
        let mut mine: Vec<&Arc<EndpointSlice>> = Vec::new();
        for (i, svc) in svcs.iter().enumerate() {
            let id = key(svc.metadata.namespace.as_ref(), svc.metadata.name.as_ref());
            if i > 0 && key(svcs[i - 1].metadata.namespace.as_ref(), svcs[i - 1].metadata.name.as_ref()) == id {
                // the same Service twice (never from an informer): the first one counts
                continue;
            }
            // Services the cache had that are gone
            while let Some(c) = old.next_if(|c| (c.namespace.as_str(), c.name.as_str()) < id) {
                remove_ports(model, &c.ports, &mut changes);
            }
            while by_service.get(at).is_some_and(|(k, _)| *k < id) {
                at += 1;
            }
            mine.clear();
            while let Some((k, s)) = by_service.get(at) {
                if *k != id {
                    break;
                }
                mine.push(s);
                at += 1;
            }
            let prev = old.next_if(|c| (c.namespace.as_str(), c.name.as_str()) == id);
            if let Some(c) = prev.as_ref().filter(|c| c.is_of(svc, &mine)) {
                problems.extend(c.problems.iter().cloned());
                next.extend(prev);
                continue;
            }
            let owned: Vec<Arc<EndpointSlice>> = mine.iter().map(|s| Arc::clone(s)).collect();
            let (m, p) = build(family, std::slice::from_ref(*svc), &owned, node);
            if let Some(c) = &prev {
                let gone: Vec<ServicePortName> = c.ports.iter().filter(|n| !m.services.contains_key(*n)).cloned().collect();
                remove_ports(model, &gone, &mut changes);
            }
            let mut ports = Vec::with_capacity(m.services.len());
            for (name, entry) in m.services {
                let before = model.services.insert(name.clone(), entry);
                if before.as_ref() != model.services.get(&name) {
                    changes.push((name.clone(), before));
                }
                ports.push(name);
            }
            problems.extend(p.iter().cloned());
            let mut versions: Vec<(String, String)> = mine
                .iter()
                .map(|s| (s.metadata.name.clone().unwrap_or_default(), s.metadata.resource_version.clone().unwrap_or_default()))
                .collect();
            versions.sort();
            next.push(Cached {
                namespace: id.0.to_string(),
                name: id.1.to_string(),
                version: svc.metadata.resource_version.clone().unwrap_or_default(),
                slices: versions,
                ports,
                problems: p,
            });
        }
        for c in old {
            remove_ports(model, &c.ports, &mut changes);
        }
        self.per_family.insert(family, next);
        (changes, problems)
    }
}

impl ModelCache {
    /// Whether the Service `name` belongs to gave the service port `name` at the last update.
    pub fn has_port(&self, family: Family, name: &ServicePortName) -> bool {
        let Some(cached) = self.per_family.get(&family) else { return false };
        cached
            .binary_search_by(|c| (c.namespace.as_str(), c.name.as_str()).cmp(&(&*name.namespace, &*name.name)))
            .is_ok_and(|i| cached[i].ports.contains(name))
    }
}

/// (namespace, name) of an object, "" for a missing one.
fn key<'a>(ns: Option<&'a String>, name: Option<&'a String>) -> (&'a str, &'a str) {
    (ns.map(String::as_str).unwrap_or_default(), name.map(String::as_str).unwrap_or_default())
}

/// Takes a Service's service ports out of the model, noting each as changed.
fn remove_ports(model: &mut FamilyModel, ports: &[ServicePortName], changes: &mut Vec<Changed>) {
    for name in ports {
        if let Some(before) = model.services.remove(name) {
            changes.push((name.clone(), Some(before)));
        }
    }
}

/// The 1-based line of its input a kernel tool's error names: iptables-restore's "Error
/// occurred at line: N" / "line N failed", nft's "/dev/stdin:N:col: Error".
/// The 1-based column where nft's error points ("/dev/stdin:6:22-29: ..." gives 22).
pub fn error_column(stderr: &str) -> Option<usize> {
    let rest = stderr.lines().find_map(|l| l.split("/dev/stdin:").nth(1))?;
    let cols = rest.split(':').nth(1)?;
    cols.split('-').next()?.parse().ok()
}

pub fn error_line(stderr: &str) -> Option<usize> {
    for l in stderr.lines() {
        if let Some(rest) = l.split("/dev/stdin:").nth(1) {
            if let Some(n) = rest.split(':').next().and_then(|n| n.parse().ok()) {
                return Some(n);
            }
        }
        if let Some(rest) = l.split("line: ").nth(1).or_else(|| l.split("line ").nth(1)) {
            if let Some(n) = rest.split_whitespace().next().and_then(|n| n.parse().ok()) {
                return Some(n);
            }
        }
    }
    None
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use serde_json::json;

    fn svc(v: serde_json::Value) -> Arc<Service> {
        Arc::new(serde_json::from_value(v).unwrap())
    }

    fn slice(v: serde_json::Value) -> Arc<EndpointSlice> {
        Arc::new(serde_json::from_value(v).unwrap())
    }

    fn node() -> NodeInfo {
        NodeInfo { name: "node-a".into(), zone: Some("z1".into()) }
    }

    fn basic_slice(eps: serde_json::Value) -> Arc<EndpointSlice> {
        slice(json!({
            "metadata": {"namespace": "ns", "name": "web-abc", "labels": {LABEL_SERVICE_NAME: "web"}},
            "addressType": "IPv4",
            "ports": [{"name": "http", "port": 8080, "protocol": "TCP"}],
            "endpoints": eps,
        }))
    }

    fn web(extra: serde_json::Value) -> Arc<Service> {
        let mut v = json!({
            "metadata": {"namespace": "ns", "name": "web"},
            "spec": {"clusterIP": "10.96.0.10", "clusterIPs": ["10.96.0.10", "fd00::10"],
                     "ports": [{"name": "http", "port": 80, "protocol": "TCP", "targetPort": 8080}]},
        });
        if let (Some(spec), Some(extra)) = (v["spec"].as_object_mut(), extra.as_object()) {
            for (k, val) in extra {
                spec.insert(k.clone(), val.clone());
            }
        }
        svc(v)
    }

    #[test]
    fn service_port_name_prints_as_upstream() {
        let mut n = ServicePortName { namespace: "ns1".into(), name: "svc1".into(), port: "p80".into(), protocol: Protocol::Tcp };
        assert_eq!(n.to_string(), "ns1/svc1:p80");
        n.port = "".into();
        assert_eq!(n.to_string(), "ns1/svc1");
    }

    #[test]
    fn builds_both_families_and_joins_endpoints() {
        let services = [web(json!({}))];
        let slices = [basic_slice(json!([
            {"addresses": ["10.244.0.5"], "nodeName": "node-a"},
            {"addresses": ["10.244.1.5"], "conditions": {"ready": false, "serving": true, "terminating": true}, "nodeName": "node-b"},
        ]))];
        let (v4, problems) = build(Family::V4, &services, &slices, &node());
        assert!(problems.is_empty(), "{problems:?}");
        let e = v4.services.values().next().unwrap();
        assert_eq!(e.port.cluster_ip, "10.96.0.10".parse::<IpAddr>().unwrap());
        assert_eq!(e.port.port, 80);
        assert_eq!(e.endpoints.len(), 2);
        assert!(e.endpoints[0].local && e.endpoints[0].ready && e.endpoints[0].serving);
        assert!(!e.endpoints[1].ready && e.endpoints[1].serving && e.endpoints[1].terminating);
        assert_eq!(e.endpoints[0].addr(), "10.244.0.5:8080");
        let (v6, _) = build(Family::V6, &services, &slices, &node());
        let e6 = v6.services.values().next().unwrap();
        assert_eq!(e6.port.cluster_ip, "fd00::10".parse::<IpAddr>().unwrap());
        assert!(e6.endpoints.is_empty(), "IPv4 slices give IPv6 nothing");
    }

    #[test]
    fn headless_externalname_and_other_proxies_are_ignored() {
        let headless = svc(json!({"metadata": {"namespace": "ns", "name": "h"}, "spec": {"clusterIP": "None", "ports": [{"port": 80}]}}));
        let ext = svc(json!({"metadata": {"namespace": "ns", "name": "e"}, "spec": {"type": "ExternalName", "externalName": "x.example", "ports": [{"port": 80}]}}));
        let other = svc(json!({"metadata": {"namespace": "ns", "name": "o", "labels": {LABEL_SERVICE_PROXY_NAME: "cilium"}},
            "spec": {"clusterIP": "10.96.0.3", "ports": [{"port": 80}]}}));
        let (m, _) = build(Family::V4, &[headless, ext, other], &[], &node());
        assert!(m.services.is_empty());
    }

    #[test]
    fn bad_input_is_a_problem_and_the_rest_is_kept() {
        let s = web(json!({
            "type": "LoadBalancer",
            "externalIPs": ["192.0.2.1", "not-an-ip"],
            "loadBalancerSourceRanges": ["203.0.113.0/24", "nonsense"],
            "ports": [
                {"name": "http", "port": 80, "protocol": "TCP", "nodePort": 30080},
                {"name": "weird", "port": 81, "protocol": "ICMP"},
            ],
        }));
        let sl = basic_slice(json!([{"addresses": ["10.244.0.300"]}, {"addresses": ["10.244.0.6"]}]));
        let (m, problems) = build(Family::V4, &[s], &[sl], &node());
        let e = m.services.values().next().unwrap();
        assert_eq!(m.services.len(), 1);
        assert_eq!(e.port.external_ips, ["192.0.2.1".parse::<IpAddr>().unwrap()]);
        assert_eq!(e.port.load_balancer_source_ranges, ["203.0.113.0/24".parse::<IpNet>().unwrap()]);
        assert_eq!(e.port.node_port, 30080);
        assert_eq!(e.endpoints.len(), 1);
        let text: Vec<String> = problems.iter().map(ToString::to_string).collect();
        assert_eq!(text.len(), 4, "{text:?}");
        assert!(text.iter().any(|t| t.contains("unsupported protocol \"ICMP\"")));
        assert!(text.iter().any(|t| t.contains("\"not-an-ip\" is not an IP")));
        assert!(text.iter().any(|t| t.contains("\"nonsense\" is not a CIDR")));
        assert!(text.iter().any(|t| t.contains("10.244.0.300")));
    }

    #[test]
    fn affinity_defaults_to_three_hours() {
        let s = web(json!({"sessionAffinity": "ClientIP"}));
        let (m, _) = build(Family::V4, &[s], &[], &node());
        assert_eq!(m.services.values().next().unwrap().port.affinity_seconds, Some(10800));
        let s = web(json!({"sessionAffinity": "ClientIP", "sessionAffinityConfig": {"clientIP": {"timeoutSeconds": 60}}}));
        let (m, _) = build(Family::V4, &[s], &[], &node());
        assert_eq!(m.services.values().next().unwrap().port.affinity_seconds, Some(60));
    }

    #[test]
    fn duplicate_endpoints_keep_the_ready_one() {
        let s = web(json!({}));
        let a = basic_slice(json!([{"addresses": ["10.244.0.5"], "conditions": {"ready": false}}]));
        let mut b = (*basic_slice(json!([{"addresses": ["10.244.0.5"], "conditions": {"ready": true}}]))).clone();
        b.metadata.name = Some("web-def".into());
        let (m, _) = build(Family::V4, &[s], &[a, Arc::new(b)], &node());
        let e = m.services.values().next().unwrap();
        assert_eq!(e.endpoints.len(), 1);
        assert!(e.endpoints[0].ready);
    }

    fn entry(port: ServicePort, eps: Vec<Endpoint>) -> ServiceEntry {
        ServiceEntry { port, endpoints: eps }
    }

    #[test]
    fn changed_since_names_added_changed_and_gone_ports_with_or_without_a_hint() {
        let named = |n: &str, ip: &str| {
            let mut p = port(|p| p.name.name = n.into());
            p.cluster_ip = ip.parse().unwrap();
            entry(p, vec![ep("10.244.0.5", true, true, false, true, &[])])
        };
        let (same, changed_old, changed_new, gone, added) =
            (named("same", "10.96.0.1"), named("chg", "10.96.0.2"), named("chg", "10.96.0.3"), named("gone", "10.96.0.4"), named("new", "10.96.0.5"));
        let mut committed = std::collections::HashMap::new();
        for e in [&same, &changed_old, &gone] {
            committed.insert(e.port.name.clone(), (Arc::new(e.clone()), ()));
        }
        let model = FamilyModel {
            family: Family::V4,
            services: [&same, &changed_new, &added].into_iter().map(|e| (e.port.name.clone(), Arc::new(e.clone()))).collect(),
        };
        let names = |v: Vec<ServicePortName>| v.into_iter().map(|n| n.name.to_string()).collect::<BTreeSet<_>>();
        let expected: BTreeSet<String> = ["chg", "gone", "new"].into_iter().map(String::from).collect();
        assert_eq!(names(model.changed_since(&committed, None)), expected);
        // told: an unchanged name in the hint is left out, a name outside it is not looked at
        let hint: BTreeSet<ServicePortName> = [&same, &changed_new, &gone].into_iter().map(|e| e.port.name.clone()).collect();
        let told: BTreeSet<String> = ["chg", "gone"].into_iter().map(String::from).collect();
        assert_eq!(names(model.changed_since(&committed, Some(&hint))), told);
        assert!(FamilyModel { family: Family::V4, services: BTreeMap::new() }
            .changed_since(&std::collections::HashMap::<ServicePortName, (Arc<ServiceEntry>, ())>::new(), None)
            .is_empty());
    }

    fn ep(ip: &str, ready: bool, serving: bool, terminating: bool, local: bool, hints: &[&str]) -> Endpoint {
        Endpoint {
            ip: ip.parse().unwrap(),
            port: 80,
            ready,
            serving,
            terminating,
            local,
            zone: None,
            zone_hints: hints.iter().map(|s| s.to_string()).collect(),
        }
    }

    fn port(f: impl FnOnce(&mut ServicePort)) -> ServicePort {
        let mut p = ServicePort {
            name: ServicePortName { namespace: "ns".into(), name: "s".into(), port: "".into(), protocol: Protocol::Tcp },
            cluster_ip: "10.96.0.1".parse().unwrap(),
            port: 80,
            protocol: Protocol::Tcp,
            node_port: 0,
            external_ips: vec![],
            load_balancer_ips: vec![],
            load_balancer_source_ranges: vec![],
            affinity_seconds: None,
            external_policy_local: false,
            internal_policy_local: false,
            health_check_node_port: 0,
            topology_aware: false,
        };
        f(&mut p);
        p
    }

    fn ips(v: &[&Endpoint]) -> Vec<String> {
        v.iter().map(|e| e.ip.to_string()).collect()
    }

    #[test]
    fn categorize_cluster_policy_falls_back_to_serving_terminating() {
        let n = node();
        let e = entry(port(|_| {}), vec![ep("10.0.0.1", true, true, false, false, &[]), ep("10.0.0.2", false, true, true, false, &[])]);
        let c = categorize(&e, &n);
        assert_eq!(ips(&c.cluster), ["10.0.0.1"]);
        assert!(c.has_any);
        let e = entry(port(|_| {}), vec![ep("10.0.0.1", false, false, false, false, &[]), ep("10.0.0.2", false, true, true, false, &[])]);
        let c = categorize(&e, &n);
        assert_eq!(ips(&c.cluster), ["10.0.0.2"]);
        let e = entry(port(|_| {}), vec![ep("10.0.0.1", false, false, true, false, &[])]);
        let c = categorize(&e, &n);
        assert!(c.cluster.is_empty() && !c.has_any && c.all_reachable.is_empty());
    }

    #[test]
    fn categorize_internal_local_uses_only_local_endpoints() {
        let n = node();
        let e = entry(
            port(|p| p.internal_policy_local = true),
            vec![ep("10.0.0.1", true, true, false, false, &[]), ep("10.0.0.2", true, true, false, true, &[])],
        );
        let c = categorize(&e, &n);
        assert!(c.cluster.is_empty());
        assert_eq!(ips(&c.local), ["10.0.0.2"]);
        assert_eq!(ips(&c.all_reachable), ["10.0.0.2"]);
        assert!(c.has_any);
        // only a remote endpoint: has_any (so traffic is dropped, not rejected), no local
        let e = entry(port(|p| p.internal_policy_local = true), vec![ep("10.0.0.1", true, true, false, false, &[])]);
        let c = categorize(&e, &n);
        assert!(c.local.is_empty() && c.has_any);
    }

    #[test]
    fn categorize_external_local_merges_cluster_and_local() {
        let n = node();
        let e = entry(
            port(|p| {
                p.node_port = 30000;
                p.external_policy_local = true;
            }),
            vec![
                ep("10.0.0.1", true, true, false, false, &[]),
                ep("10.0.0.2", false, true, true, true, &[]),
            ],
        );
        let c = categorize(&e, &n);
        assert_eq!(ips(&c.cluster), ["10.0.0.1"]);
        assert_eq!(ips(&c.local), ["10.0.0.2"], "local falls back to serving-terminating");
        assert_eq!(ips(&c.all_reachable), ["10.0.0.1", "10.0.0.2"]);
    }

    #[test]
    fn categorize_topology_hints() {
        let n = node();
        let p = port(|p| p.topology_aware = true);
        let e = entry(p.clone(), vec![ep("10.0.0.1", true, true, false, false, &["z1"]), ep("10.0.0.2", true, true, false, false, &["z2"])]);
        assert_eq!(ips(&categorize(&e, &n).cluster), ["10.0.0.1"]);
        // one ready endpoint without hints: topology ignored
        let e = entry(p.clone(), vec![ep("10.0.0.1", true, true, false, false, &["z1"]), ep("10.0.0.2", true, true, false, false, &[])]);
        assert_eq!(categorize(&e, &n).cluster.len(), 2);
        // no endpoint for this zone: topology ignored
        let e = entry(p, vec![ep("10.0.0.1", true, true, false, false, &["z3"]), ep("10.0.0.2", true, true, false, false, &["z2"])]);
        assert_eq!(categorize(&e, &n).cluster.len(), 2);
    }

    #[test]
    fn error_lines_of_both_tools() {
        assert_eq!(error_line("iptables-restore v1.8.9 (nf_tables): Chain 'X' does not exist\nError occurred at line: 5\nTry `iptables-restore -h'"), Some(5));
        assert_eq!(error_line("iptables-restore: line 12 failed\n"), Some(12));
        assert_eq!(error_line("/dev/stdin:6:22-29: Error: Could not process rule: File exists\nadd element ip t m { 10.0.0.1 : goto c2 }\n"), Some(6));
        assert_eq!(error_line("Error: Could not process rule: Operation not permitted"), None);
        assert_eq!(error_column("/dev/stdin:6:22-29: Error: Could not process rule: File exists"), Some(22));
        assert_eq!(error_column("Error occurred at line: 5"), None);
    }

    #[test]
    fn the_cache_builds_what_build_builds_and_reparses_only_what_changed() {
        let svc = |name: &str, ip: &str, rv: &str| -> Arc<Service> {
            Arc::new(serde_json::from_value(json!({
                "metadata": {"namespace": "ns", "name": name, "resourceVersion": rv},
                "spec": {"clusterIP": ip, "ports": [{"name": "p", "port": 80, "targetPort": 8080}]},
            })).unwrap())
        };
        let slice = |svc: &str, n: u32, addrs: &[&str], rv: &str| -> Arc<EndpointSlice> {
            let eps: Vec<serde_json::Value> = addrs.iter().map(|a| json!({"addresses": [a], "nodeName": "node-a"})).collect();
            Arc::new(serde_json::from_value(json!({
                "metadata": {"namespace": "ns", "name": format!("{svc}-{n}"), "resourceVersion": rv, "labels": {LABEL_SERVICE_NAME: svc}},
                "addressType": "IPv4", "ports": [{"name": "p", "port": 8080, "protocol": "TCP"}], "endpoints": eps,
            })).unwrap())
        };
        let node = NodeInfo { name: "node-a".into(), zone: None };
        let mut cache = ModelCache::default();
        let mut model = FamilyModel { family: Family::V4, services: BTreeMap::new() };
        let mut services = vec![svc("a", "10.96.0.1", "1"), svc("b", "10.96.0.2", "2")];
        let mut slices = vec![slice("a", 1, &["10.0.0.1", "10.0.0.2"], "3"), slice("b", 1, &["10.0.0.3", "bad"], "4")];
        // every update: the model is what build makes, the problems are build's, and the
        // changes name exactly the service ports whose entry differs, with their entry before
        let check = |cache: &mut ModelCache, model: &mut FamilyModel, services: &[Arc<Service>], slices: &[Arc<EndpointSlice>]| {
            let before = model.clone();
            let (want, want_p) = build(Family::V4, services, slices, &node);
            let (changes, got_p) = cache.update(model, services, slices, &node);
            assert_eq!(*model, want);
            let text = |p: Vec<Problem>| {
                let mut v: Vec<String> = p.iter().map(ToString::to_string).collect();
                v.sort();
                v
            };
            assert_eq!(text(got_p), text(want_p));
            let differing: BTreeSet<&ServicePortName> = before
                .services
                .keys()
                .chain(model.services.keys())
                .filter(|n| before.services.get(*n) != model.services.get(*n))
                .collect();
            let named: BTreeSet<&ServicePortName> = changes.iter().map(|(n, _)| n).collect();
            assert!(differing.iter().all(|n| named.contains(n)), "{differing:?} not all in {named:?}");
            assert_eq!(named.len(), changes.len(), "each service port once: {changes:?}");
            for (name, old) in &changes {
                assert_eq!(old.as_ref(), before.services.get(name), "{name}");
            }
            changes.len()
        };
        check(&mut cache, &mut model, &services, &slices);
        // nothing changed: nothing parsed, no change reported
        assert_eq!(check(&mut cache, &mut model, &services, &slices), 0);
        // an unchanged object is not parsed again: its cached entry is used even if the
        // object behind the same versions were different (it never is in an informer)
        cache.update(&mut model, &services, &[slice("a", 1, &["10.0.0.9"], "3"), slices[1].clone()], &node);
        assert_eq!(model.services.values().next().unwrap().endpoints[0].ip.to_string(), "10.0.0.1");
        // a changed slice, a second slice, a new Service, a deleted one: as build
        slices[0] = slice("a", 1, &["10.0.0.1", "10.0.0.5"], "5");
        slices.push(slice("a", 2, &["10.0.0.6"], "6"));
        services.push(svc("c", "10.96.0.3", "7"));
        assert_eq!(check(&mut cache, &mut model, &services, &slices), 2, "a's port rewritten, c's added");
        services.remove(1);
        assert_eq!(check(&mut cache, &mut model, &services, &slices), 1, "b's port removed");
        services[0] = svc("a", "10.96.0.10", "8");
        check(&mut cache, &mut model, &services, &slices);
        // out of order (not as an informer lists them) and a service port taken out of the
        // model by the caller: still what build makes once the Service changes
        services.reverse();
        model.services.clear();
        services[0] = svc("c", "10.96.0.4", "9");
        services[1] = svc("a", "10.96.0.11", "10");
        check(&mut cache, &mut model, &services, &slices);
    }
}
