//! Endpoint planners: upstream's EndpointSlice controller (`k8s.io/endpointslice` reconciler)
//! and the legacy Endpoints controller (`pkg/controller/endpoint`).
//!
//! [`plan_slices`] turns a Service, the pods of its namespace and the slices it already has into
//! the slices to create, update and delete, with upstream's minimal-churn algorithm: keep
//! endpoints where they are, update only the slices whose endpoints changed, fill those before
//! reusing untouched ones or creating new ones, and keep one empty placeholder slice per address
//! type while a Service has no endpoints. [`plan_endpoints`] builds the Service's Endpoints
//! object and returns it only when it differs from the stored one.
//!
//! Simplification: upstream skips pods whose node does not exist (unless the Service publishes
//! not-ready addresses); `zone_of` cannot tell a missing node apart, so such pods are kept.

use std::collections::{BTreeMap, BTreeSet};
use std::net::Ipv6Addr;

use k8s_openapi::api::core::v1::{
    EndpointAddress, EndpointPort as CoreEndpointPort, EndpointSubset, Endpoints, ObjectReference,
    Pod, Service, ServicePort,
};
use k8s_openapi::api::discovery::v1::{Endpoint, EndpointConditions, EndpointPort, EndpointSlice};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use k8s_semantics::resources::is_restartable_init_container;

/// The value of `endpointslice.kubernetes.io/managed-by` on the slices this controller owns.
pub const MANAGED_BY: &str = "endpointslice-controller.k8s.io";
/// Slice label naming the Service.
pub const LABEL_SERVICE_NAME: &str = "kubernetes.io/service-name";
/// Slice label naming the controller that manages the slice.
pub const LABEL_MANAGED_BY: &str = "endpointslice.kubernetes.io/managed-by";
/// Label set (empty value) on the slices and Endpoints of headless Services.
pub const LABEL_HEADLESS: &str = "service.kubernetes.io/headless";
/// Endpoints label telling the mirroring controller not to mirror the object into slices.
pub const LABEL_SKIP_MIRROR: &str = "endpointslice.kubernetes.io/skip-mirror";
/// Endpoints annotation set when addresses were cut to [`MAX_ENDPOINTS_CAPACITY`].
pub const ANN_OVER_CAPACITY: &str = "endpoints.kubernetes.io/over-capacity";
/// Upstream's default `--max-endpoints-per-slice`.
pub const MAX_ENDPOINTS_PER_SLICE: usize = 100;
/// The most addresses an Endpoints object holds (upstream `maxCapacity`).
pub const MAX_ENDPOINTS_CAPACITY: usize = 1000;

/// Slice writes for one Service.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct SlicePlan {
    /// New slices: `metadata.name` empty, `metadata.generateName` "<svc>-"; create them with
    /// generateName.
    pub create: Vec<EndpointSlice>,
    /// full objects based on the observed ones (keep metadata.resourceVersion)
    pub update: Vec<EndpointSlice>,
    /// Names of slices to delete.
    pub delete: Vec<String>,
}

impl SlicePlan {
    /// True when nothing needs writing.
    pub fn is_empty(&self) -> bool {
        self.create.is_empty() && self.update.is_empty() && self.delete.is_empty()
    }
}

fn is_ipv6(ip: &str) -> bool {
    ip.parse::<Ipv6Addr>().is_ok()
}

fn selector(svc: &Service) -> Option<&BTreeMap<String, String>> {
    let spec = svc.spec.as_ref()?;
    if spec.type_.as_deref() == Some("ExternalName") {
        return None;
    }
    spec.selector.as_ref().filter(|s| !s.is_empty())
}

fn selected<'a>(svc: &Service, sel: &BTreeMap<String, String>, pods: &[&'a Pod]) -> Vec<&'a Pod> {
    let empty = BTreeMap::new();
    let mut out: Vec<&Pod> = pods
        .iter()
        .copied()
        .filter(|p| p.metadata.namespace == svc.metadata.namespace)
        .filter(|p| {
            let labels = p.metadata.labels.as_ref().unwrap_or(&empty);
            sel.iter().all(|(k, v)| labels.get(k) == Some(v))
        })
        .collect();
    out.sort_by(|a, b| a.metadata.name.cmp(&b.metadata.name));
    out
}

fn pod_ips(pod: &Pod) -> Vec<&str> {
    let Some(status) = pod.status.as_ref() else {
        return Vec::new();
    };
    let ips: Vec<&str> = status
        .pod_ips
        .iter()
        .flatten()
        .map(|p| p.ip.as_str())
        .filter(|i| !i.is_empty())
        .collect();
    if ips.is_empty() {
        status
            .pod_ip
            .as_deref()
            .filter(|i| !i.is_empty())
            .into_iter()
            .collect()
    } else {
        ips
    }
}

fn pod_ready(pod: &Pod) -> bool {
    pod.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|cs| cs.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
}

/// Upstream `ShouldPodBeInEndpoints`: not terminal, has an IP, and not terminating unless
/// `include_terminating`.
fn should_be_in_endpoints(pod: &Pod, include_terminating: bool) -> bool {
    let phase = pod.status.as_ref().and_then(|s| s.phase.as_deref());
    if matches!(phase, Some("Succeeded" | "Failed")) || pod_ips(pod).is_empty() {
        return false;
    }
    include_terminating || pod.metadata.deletion_timestamp.is_none()
}

fn publish_not_ready(svc: &Service) -> bool {
    svc.spec
        .as_ref()
        .and_then(|s| s.publish_not_ready_addresses)
        .unwrap_or(false)
}

fn cluster_ip(svc: &Service) -> &str {
    svc.spec
        .as_ref()
        .and_then(|s| s.cluster_ip.as_deref())
        .unwrap_or("")
}

/// Upstream `IsServiceIPSet`.
fn service_ip_set(svc: &Service) -> bool {
    let ip = cluster_ip(svc);
    !ip.is_empty() && ip != "None"
}

fn service_ports(svc: &Service) -> &[ServicePort] {
    svc.spec
        .as_ref()
        .and_then(|s| s.ports.as_deref())
        .unwrap_or(&[])
}

fn protocol(p: Option<&str>) -> &str {
    p.unwrap_or("TCP")
}

/// Upstream `FindPort`: a numeric targetPort as is (default: the service port), a named one by
/// the container (or restartable init container) port of that name and protocol.
fn find_port(pod: &Pod, sp: &ServicePort) -> Option<i32> {
    match &sp.target_port {
        None => Some(sp.port),
        Some(IntOrString::Int(n)) => Some(*n),
        Some(IntOrString::String(name)) => {
            let spec = pod.spec.as_ref()?;
            let sidecars = spec
                .init_containers
                .iter()
                .flatten()
                .filter(|c| is_restartable_init_container(c));
            spec.containers
                .iter()
                .chain(sidecars)
                .flat_map(|c| c.ports.iter().flatten())
                .find(|p| {
                    p.name.as_deref() == Some(name.as_str())
                        && protocol(p.protocol.as_deref()) == protocol(sp.protocol.as_deref())
                })
                .map(|p| p.container_port)
        }
    }
}

fn hostname_for(pod: &Pod, svc: &Service) -> Option<String> {
    let spec = pod.spec.as_ref()?;
    let host = spec.hostname.as_deref().filter(|h| !h.is_empty())?;
    (spec.subdomain.as_deref() == svc.metadata.name.as_deref()
        && pod.metadata.namespace == svc.metadata.namespace)
        .then(|| host.to_string())
}

fn address_types(svc: &Service) -> Vec<&'static str> {
    let mut out = Vec::new();
    for f in svc
        .spec
        .as_ref()
        .and_then(|s| s.ip_families.as_ref())
        .into_iter()
        .flatten()
    {
        let t = match f.as_str() {
            "IPv4" => "IPv4",
            "IPv6" => "IPv6",
            _ => continue,
        };
        if !out.contains(&t) {
            out.push(t);
        }
    }
    if !out.is_empty() {
        return out;
    }
    if service_ip_set(svc) {
        return vec![if is_ipv6(cluster_ip(svc)) {
            "IPv6"
        } else {
            "IPv4"
        }];
    }
    vec!["IPv4", "IPv6"]
}

fn owner_ref(svc: &Service) -> OwnerReference {
    OwnerReference {
        api_version: "v1".into(),
        kind: "Service".into(),
        name: svc.metadata.name.clone().unwrap_or_default(),
        uid: svc.metadata.uid.clone().unwrap_or_default(),
        controller: Some(true),
        block_owner_deletion: Some(true),
    }
}

fn owned_by(slice: &EndpointSlice, svc: &Service) -> bool {
    slice
        .metadata
        .owner_references
        .iter()
        .flatten()
        .any(|o| match svc.metadata.uid.as_deref() {
            Some(uid) if !uid.is_empty() => o.uid == uid,
            _ => o.kind == "Service" && Some(o.name.as_str()) == svc.metadata.name.as_deref(),
        })
}

fn is_reserved_label(k: &str) -> bool {
    k == LABEL_SERVICE_NAME || k == LABEL_MANAGED_BY || k == LABEL_HEADLESS
}

/// Upstream `setEndpointSliceLabels`: the Service's labels (minus the reserved ones), the
/// headless label for Services without a cluster IP, the service name and the manager.
fn slice_labels(svc: &Service) -> BTreeMap<String, String> {
    let mut labels: BTreeMap<String, String> = svc
        .metadata
        .labels
        .iter()
        .flatten()
        .filter(|(k, _)| !is_reserved_label(k))
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    if !service_ip_set(svc) {
        labels.insert(LABEL_HEADLESS.into(), String::new());
    }
    labels.insert(
        LABEL_SERVICE_NAME.into(),
        svc.metadata.name.clone().unwrap_or_default(),
    );
    labels.insert(LABEL_MANAGED_BY.into(), MANAGED_BY.into());
    labels
}

/// Port set identity, independent of order (upstream `NewPortMapKey`).
type PortKey = Vec<(String, i32, String, Option<String>)>;

fn port_key(ports: &[EndpointPort]) -> PortKey {
    let mut k: PortKey = ports
        .iter()
        .map(|p| {
            (
                p.name.clone().unwrap_or_default(),
                p.port.unwrap_or(0),
                protocol(p.protocol.as_deref()).to_string(),
                p.app_protocol.clone(),
            )
        })
        .collect();
    k.sort();
    k
}

/// Endpoint identity within a port set (upstream `hashEndpoint`: addresses, hostname, target
/// namespace and name); ordered so pods are taken by namespace and name.
type EpKey = (String, String, Vec<String>, String);

fn ep_key(e: &Endpoint) -> EpKey {
    let (ns, name) = e
        .target_ref
        .as_ref()
        .map(|r| {
            (
                r.namespace.clone().unwrap_or_default(),
                r.name.clone().unwrap_or_default(),
            )
        })
        .unwrap_or_default();
    let mut addrs = e.addresses.clone();
    addrs.sort();
    (ns, name, addrs, e.hostname.clone().unwrap_or_default())
}

fn endpoint_ports(svc: &Service, pod: &Pod) -> Vec<EndpointPort> {
    service_ports(svc)
        .iter()
        .filter_map(|sp| {
            let port = find_port(pod, sp)?;
            Some(EndpointPort {
                name: Some(sp.name.clone().unwrap_or_default()),
                port: Some(port),
                protocol: Some(protocol(sp.protocol.as_deref()).to_string()),
                app_protocol: sp.app_protocol.clone(),
            })
        })
        .collect()
}

/// Upstream `podToEndpoint`.
fn pod_to_endpoint(
    pod: &Pod,
    svc: &Service,
    address_type: &str,
    zone_of: &dyn Fn(&str) -> Option<String>,
) -> Endpoint {
    let serving = pod_ready(pod);
    let terminating = pod.metadata.deletion_timestamp.is_some();
    let ready = publish_not_ready(svc) || (serving && !terminating);
    let node = pod
        .spec
        .as_ref()
        .and_then(|s| s.node_name.clone())
        .filter(|n| !n.is_empty());
    Endpoint {
        addresses: pod_ips(pod)
            .into_iter()
            .filter(|ip| is_ipv6(ip) == (address_type == "IPv6"))
            .map(str::to_string)
            .collect(),
        conditions: Some(EndpointConditions {
            ready: Some(ready),
            serving: Some(serving),
            terminating: Some(terminating),
        }),
        zone: node.as_deref().and_then(zone_of).filter(|z| !z.is_empty()),
        node_name: node,
        hostname: hostname_for(pod, svc),
        target_ref: Some(ObjectReference {
            kind: Some("Pod".into()),
            namespace: pod.metadata.namespace.clone(),
            name: pod.metadata.name.clone(),
            uid: pod.metadata.uid.clone(),
            ..Default::default()
        }),
        deprecated_topology: None,
        hints: None,
    }
}

fn new_slice(svc: &Service, address_type: &str, ports: &[EndpointPort]) -> EndpointSlice {
    EndpointSlice {
        metadata: ObjectMeta {
            generate_name: Some(format!("{}-", svc.metadata.name.as_deref().unwrap_or(""))),
            namespace: svc.metadata.namespace.clone(),
            labels: Some(slice_labels(svc)),
            owner_references: Some(vec![owner_ref(svc)]),
            ..Default::default()
        },
        address_type: address_type.into(),
        endpoints: Vec::new(),
        ports: (!ports.is_empty()).then(|| ports.to_vec()),
    }
}

/// Upstream `getSliceToFill`: the unchanged slice that the endpoints fill most closely.
fn slice_to_fill(
    candidates: &[String],
    by_name: &BTreeMap<String, EndpointSlice>,
    n: usize,
) -> Option<String> {
    let mut best: Option<(usize, &String)> = None;
    for name in candidates {
        let Some(s) = by_name.get(name) else { continue };
        let Some(diff) = MAX_ENDPOINTS_PER_SLICE.checked_sub(n + s.endpoints.len()) else {
            continue;
        };
        if best.is_none_or(|(d, _)| diff < d) {
            best = Some((diff, name));
        }
    }
    best.map(|(_, n)| n.clone())
}

struct Changes {
    create: Vec<EndpointSlice>,
    update: Vec<EndpointSlice>,
    delete: Vec<EndpointSlice>,
}

/// Upstream `reconcileByPortMapping` for one port set.
fn reconcile_port_set(
    svc: &Service,
    address_type: &str,
    ports: &[EndpointPort],
    existing: &[&EndpointSlice],
    mut desired: BTreeMap<EpKey, Endpoint>,
    out: &mut Changes,
) {
    let labels = slice_labels(svc);
    let mut by_name: BTreeMap<String, EndpointSlice> = BTreeMap::new();
    let mut unchanged: Vec<String> = Vec::new();
    let mut to_update: BTreeSet<String> = BTreeSet::new();
    // 1. drop endpoints no longer desired, refresh changed ones
    for s in existing {
        let name = s.metadata.name.clone().unwrap_or_default();
        let mut kept = Vec::new();
        let mut changed = false;
        for e in &s.endpoints {
            if let Some(want) = desired.remove(&ep_key(e)) {
                changed |= want != *e;
                kept.push(want);
            }
        }
        let labels_changed = s.metadata.labels.as_ref() != Some(&labels);
        if changed || kept.len() != s.endpoints.len() {
            if kept.is_empty() {
                out.delete.push((*s).clone());
                continue;
            }
            let mut copy = (*s).clone();
            copy.endpoints = kept;
            copy.metadata.labels = Some(labels.clone());
            to_update.insert(name.clone());
            by_name.insert(name, copy);
        } else if labels_changed {
            let mut copy = (*s).clone();
            copy.metadata.labels = Some(labels.clone());
            to_update.insert(name.clone());
            by_name.insert(name, copy);
        } else {
            unchanged.push(name.clone());
            by_name.insert(name, (*s).clone());
        }
    }
    let pop = |desired: &mut BTreeMap<EpKey, Endpoint>| desired.pop_first().map(|(_, e)| e);
    // 2. fill the slices being updated anyway, fullest first
    if !desired.is_empty() {
        let mut names: Vec<&String> = to_update.iter().collect();
        names.sort_by_key(|n| std::cmp::Reverse(by_name.get(*n).map_or(0, |s| s.endpoints.len())));
        for name in names {
            let Some(s) = by_name.get_mut(name) else {
                continue;
            };
            while s.endpoints.len() < MAX_ENDPOINTS_PER_SLICE {
                let Some(e) = pop(&mut desired) else { break };
                s.endpoints.push(e);
            }
        }
    }
    // 3. the rest into an unchanged slice they fit, or new slices
    while !desired.is_empty() {
        let fill = if desired.len() < MAX_ENDPOINTS_PER_SLICE && !unchanged.is_empty() {
            slice_to_fill(&unchanged, &by_name, desired.len())
        } else {
            None
        };
        match fill {
            Some(name) => {
                unchanged.retain(|n| *n != name);
                to_update.insert(name.clone());
                if let Some(s) = by_name.get_mut(&name) {
                    while s.endpoints.len() < MAX_ENDPOINTS_PER_SLICE {
                        let Some(e) = pop(&mut desired) else { break };
                        s.endpoints.push(e);
                    }
                }
            }
            None => {
                let mut s = new_slice(svc, address_type, ports);
                while s.endpoints.len() < MAX_ENDPOINTS_PER_SLICE {
                    let Some(e) = pop(&mut desired) else { break };
                    s.endpoints.push(e);
                }
                out.create.push(s);
            }
        }
    }
    for name in to_update {
        if let Some(s) = by_name.remove(&name) {
            out.update.push(s);
        }
    }
}

/// Upstream's placeholder comparison: same namespace, labels and owners, no endpoints, no ports.
fn is_placeholder_of(s: &EndpointSlice, placeholder: &EndpointSlice) -> bool {
    s.metadata.namespace == placeholder.metadata.namespace
        && s.metadata.labels.clone().unwrap_or_default()
            == placeholder.metadata.labels.clone().unwrap_or_default()
        && s.metadata.owner_references.clone().unwrap_or_default()
            == placeholder
                .metadata
                .owner_references
                .clone()
                .unwrap_or_default()
        && s.address_type == placeholder.address_type
        && s.endpoints.is_empty()
        && s.ports.as_ref().is_none_or(Vec::is_empty)
}

/// Upstream `reconcileByAddressType` plus `finalize` for one address type.
fn reconcile_address_type(
    svc: &Service,
    pods: &[&Pod],
    existing: &[&EndpointSlice],
    address_type: &str,
    zone_of: &dyn Fn(&str) -> Option<String>,
    plan: &mut SlicePlan,
) {
    let mut changes = Changes {
        create: Vec::new(),
        update: Vec::new(),
        delete: Vec::new(),
    };
    let mut existing_by_ports: BTreeMap<PortKey, Vec<&EndpointSlice>> = BTreeMap::new();
    for s in existing {
        if owned_by(s, svc) {
            existing_by_ports
                .entry(port_key(s.ports.as_deref().unwrap_or(&[])))
                .or_default()
                .push(s);
        } else {
            changes.delete.push((*s).clone());
        }
    }
    let mut desired: BTreeMap<PortKey, (Vec<EndpointPort>, BTreeMap<EpKey, Endpoint>)> =
        BTreeMap::new();
    for pod in pods {
        if !should_be_in_endpoints(pod, true) {
            continue;
        }
        let ports = endpoint_ports(svc, pod);
        let entry = desired
            .entry(port_key(&ports))
            .or_insert_with(|| (ports, BTreeMap::new()));
        let ep = pod_to_endpoint(pod, svc, address_type, zone_of);
        if !ep.addresses.is_empty() {
            entry.1.insert(ep_key(&ep), ep);
        }
    }
    for (key, (ports, eps)) in desired.iter() {
        let current = existing_by_ports.get(key).map(Vec::as_slice).unwrap_or(&[]);
        reconcile_port_set(svc, address_type, ports, current, eps.clone(), &mut changes);
    }
    for (key, slices) in &existing_by_ports {
        if !desired.contains_key(key) {
            changes.delete.extend(slices.iter().map(|s| (*s).clone()));
        }
    }
    if existing.len() == changes.delete.len() && changes.create.is_empty() {
        let placeholder = new_slice(svc, address_type, &[]);
        if changes.delete.len() == 1 && is_placeholder_of(&changes.delete[0], &placeholder) {
            changes.delete.clear();
        } else {
            changes.create.push(placeholder);
        }
    }
    // finalize: reuse slices about to be deleted for slices about to be created
    changes
        .delete
        .sort_by(|a, b| a.metadata.name.cmp(&b.metadata.name));
    let mut deletes = Vec::new();
    for old in changes.delete {
        let reusable = old.address_type == address_type && owned_by(&old, svc);
        match changes.create.pop() {
            Some(mut new) if reusable => {
                let mut meta = old.metadata.clone();
                meta.labels = new.metadata.labels.take();
                meta.owner_references = new.metadata.owner_references.take();
                new.metadata = meta;
                changes.update.push(new);
            }
            other => {
                if let Some(new) = other {
                    changes.create.push(new);
                }
                deletes.push(old.metadata.name.clone().unwrap_or_default());
            }
        }
    }
    changes
        .update
        .sort_by(|a, b| a.metadata.name.cmp(&b.metadata.name));
    plan.create.extend(changes.create);
    plan.update.extend(changes.update);
    plan.delete.extend(deletes);
}

/// Plans the EndpointSlices of one Service (upstream EndpointSlice reconciler).
///
/// `pods` are the pods of the Service's namespace; `existing` the slices labelled
/// `kubernetes.io/service-name=<svc>` and managed by [`MANAGED_BY`]; `zone_of` maps a node name
/// to its `topology.kubernetes.io/zone` label. Services without a selector and ExternalName
/// Services get an empty plan. See the module notes for the algorithm.
pub fn plan_slices(
    svc: &Service,
    pods: &[&Pod],
    existing: &[&EndpointSlice],
    zone_of: &dyn Fn(&str) -> Option<String>,
) -> SlicePlan {
    let mut plan = SlicePlan::default();
    let Some(sel) = selector(svc) else {
        return plan;
    };
    let pods = selected(svc, sel, pods);
    let types = address_types(svc);
    let mut existing: Vec<&EndpointSlice> = existing.to_vec();
    existing.sort_by(|a, b| a.metadata.name.cmp(&b.metadata.name));
    for s in &existing {
        if !types.contains(&s.address_type.as_str()) {
            plan.delete
                .push(s.metadata.name.clone().unwrap_or_default());
        }
    }
    for t in types {
        let mine: Vec<&EndpointSlice> = existing
            .iter()
            .copied()
            .filter(|s| s.address_type == t)
            .collect();
        reconcile_address_type(svc, &pods, &mine, t, zone_of, &mut plan);
    }
    plan
}

// ---------------------------------------------------------------------------
// legacy Endpoints
// ---------------------------------------------------------------------------

/// Upstream `podToEndpointAddressForService`: the pod IP of the Service's primary family.
fn pod_address(svc: &Service, pod: &Pod) -> Option<EndpointAddress> {
    let families = svc.spec.as_ref().and_then(|s| s.ip_families.as_ref());
    let want_v6 = match families.and_then(|f| f.first()) {
        Some(f) => f == "IPv6",
        None if service_ip_set(svc) => is_ipv6(cluster_ip(svc)),
        None => pod
            .status
            .as_ref()
            .and_then(|s| s.pod_ip.as_deref())
            .is_some_and(is_ipv6),
    };
    let ip = pod_ips(pod).into_iter().find(|ip| is_ipv6(ip) == want_v6)?;
    Some(EndpointAddress {
        ip: ip.to_string(),
        hostname: hostname_for(pod, svc),
        node_name: pod
            .spec
            .as_ref()
            .and_then(|s| s.node_name.clone())
            .filter(|n| !n.is_empty()),
        target_ref: Some(ObjectReference {
            kind: Some("Pod".into()),
            namespace: pod.metadata.namespace.clone(),
            name: pod.metadata.name.clone(),
            uid: pod.metadata.uid.clone(),
            resource_version: pod.metadata.resource_version.clone(),
            ..Default::default()
        }),
    })
}

type AddrKey = (String, String);

fn addr_key(a: &EndpointAddress) -> AddrKey {
    (
        a.ip.clone(),
        a.target_ref
            .as_ref()
            .and_then(|r| r.uid.clone())
            .unwrap_or_default(),
    )
}

type CorePortKey = (String, i32, String, Option<String>);

/// A port (None: no port) and the addresses serving it, with readiness.
type PortAddrs = (Option<CoreEndpointPort>, BTreeMap<AddrKey, bool>);

fn core_port_key(p: &CoreEndpointPort) -> CorePortKey {
    (
        p.name.clone().unwrap_or_default(),
        p.port,
        protocol(p.protocol.as_deref()).to_string(),
        p.app_protocol.clone(),
    )
}

/// Upstream `RepackSubsets`: ports that serve the same set of (address, ready) share a subset.
/// `entries` are (address, ready, port or None for "no ports").
fn repack(entries: Vec<(EndpointAddress, bool, Option<CoreEndpointPort>)>) -> Vec<EndpointSubset> {
    let mut addrs: BTreeMap<AddrKey, EndpointAddress> = BTreeMap::new();
    // port (None: the no-port sentinel) -> address -> ready
    let mut by_port: BTreeMap<Option<CorePortKey>, PortAddrs> = BTreeMap::new();
    for (addr, ready, port) in entries {
        let k = addr_key(&addr);
        addrs.entry(k.clone()).or_insert(addr);
        let entry = by_port
            .entry(port.as_ref().map(core_port_key))
            .or_insert_with(|| (port, BTreeMap::new()));
        let r = entry.1.entry(k).or_insert(false);
        *r = *r || ready;
    }
    let mut groups: BTreeMap<Vec<(AddrKey, bool)>, Vec<CoreEndpointPort>> = BTreeMap::new();
    for (_, (port, set)) in by_port {
        let key: Vec<(AddrKey, bool)> = set.into_iter().collect();
        let ports = groups.entry(key).or_default();
        if let Some(p) = port {
            ports.push(p);
        }
    }
    let mut subsets: Vec<EndpointSubset> = groups
        .into_iter()
        .map(|(set, mut ports)| {
            ports.sort_by_key(core_port_key);
            let pick = |want: bool| -> Vec<EndpointAddress> {
                set.iter()
                    .filter(|(_, r)| *r == want)
                    .filter_map(|(k, _)| addrs.get(k).cloned())
                    .collect()
            };
            subset(pick(true), pick(false), ports)
        })
        .collect();
    sort_subsets(&mut subsets);
    subsets
}

fn subset(
    ready: Vec<EndpointAddress>,
    not_ready: Vec<EndpointAddress>,
    ports: Vec<CoreEndpointPort>,
) -> EndpointSubset {
    EndpointSubset {
        addresses: (!ready.is_empty()).then_some(ready),
        not_ready_addresses: (!not_ready.is_empty()).then_some(not_ready),
        ports: (!ports.is_empty()).then_some(ports),
    }
}

type SubsetKey = (Vec<AddrKey>, Vec<AddrKey>, Vec<CorePortKey>);

fn subset_key(s: &EndpointSubset) -> SubsetKey {
    (
        s.addresses.iter().flatten().map(addr_key).collect(),
        s.not_ready_addresses
            .iter()
            .flatten()
            .map(addr_key)
            .collect(),
        s.ports.iter().flatten().map(core_port_key).collect(),
    )
}

/// Sorts addresses, ports and subsets so equal contents compare equal.
fn sort_subsets(subsets: &mut [EndpointSubset]) {
    for s in subsets.iter_mut() {
        for list in [&mut s.addresses, &mut s.not_ready_addresses]
            .into_iter()
            .flatten()
        {
            list.sort_by_key(addr_key);
        }
        if let Some(ports) = s.ports.as_mut() {
            ports.sort_by_key(core_port_key);
        }
    }
    subsets.sort_by_key(subset_key);
}

/// Upstream `truncateEndpoints`: keeps at most [`MAX_ENDPOINTS_CAPACITY`] addresses, cutting
/// not-ready ones first, proportionally per subset. True when something was cut.
fn truncate(subsets: &mut [EndpointSubset]) -> bool {
    let count = |l: &Option<Vec<EndpointAddress>>| l.as_ref().map_or(0, Vec::len);
    let ready: usize = subsets.iter().map(|s| count(&s.addresses)).sum();
    let not_ready: usize = subsets.iter().map(|s| count(&s.not_ready_addresses)).sum();
    if ready + not_ready <= MAX_ENDPOINTS_CAPACITY {
        return false;
    }
    let truncate_ready = ready > MAX_ENDPOINTS_CAPACITY;
    let (max, total) = if truncate_ready {
        (MAX_ENDPOINTS_CAPACITY, ready)
    } else {
        (MAX_ENDPOINTS_CAPACITY - ready, not_ready)
    };
    let mut can_add = max;
    for s in subsets.iter_mut() {
        let n = if truncate_ready {
            count(&s.addresses)
        } else {
            count(&s.not_ready_addresses)
        };
        let share = (n * max).div_ceil(total.max(1)).min(can_add);
        if truncate_ready {
            if let Some(a) = s.addresses.as_mut() {
                a.truncate(share);
            }
            s.not_ready_addresses = None;
            can_add -= count(&s.addresses);
        } else {
            if let Some(a) = s.not_ready_addresses.as_mut() {
                a.truncate(share);
            }
            can_add -= count(&s.not_ready_addresses);
        }
        if s.addresses.as_ref().is_some_and(Vec::is_empty) {
            s.addresses = None;
        }
        if s.not_ready_addresses.as_ref().is_some_and(Vec::is_empty) {
            s.not_ready_addresses = None;
        }
    }
    true
}

fn endpoints_labels(svc: &Service) -> BTreeMap<String, String> {
    let mut labels = svc.metadata.labels.clone().unwrap_or_default();
    if service_ip_set(svc) {
        labels.remove(LABEL_HEADLESS);
    } else {
        labels.insert(LABEL_HEADLESS.into(), String::new());
    }
    labels.insert(LABEL_SKIP_MIRROR.into(), "true".into());
    labels
}

/// Subsets as compared: sorted, pod resourceVersions ignored (upstream
/// `endpointSubsetsEqualIgnoreResourceVersion`), empty lists as absent.
fn comparable(subsets: Option<&Vec<EndpointSubset>>) -> Vec<EndpointSubset> {
    let mut out: Vec<EndpointSubset> = subsets
        .into_iter()
        .flatten()
        .map(|s| {
            let strip = |l: &Option<Vec<EndpointAddress>>| {
                l.as_ref().filter(|v| !v.is_empty()).map(|v| {
                    v.iter()
                        .cloned()
                        .map(|mut a| {
                            if let Some(r) = a.target_ref.as_mut() {
                                r.resource_version = None;
                            }
                            a
                        })
                        .collect()
                })
            };
            EndpointSubset {
                addresses: strip(&s.addresses),
                not_ready_addresses: strip(&s.not_ready_addresses),
                ports: s.ports.clone().filter(|p| !p.is_empty()),
            }
        })
        .collect();
    sort_subsets(&mut out);
    out
}

/// Plans the legacy Endpoints object of one Service (upstream Endpoints controller). Returns the
/// full object to create (when `existing` is None) or update (based on `existing`, keeping its
/// metadata and resourceVersion), or None when nothing changes (or the Service has no selector
/// or is ExternalName).
///
/// Pods matching the selector with an IP of the Service's primary family, not terminal, and not
/// terminating (unless `publishNotReadyAddresses`) become addresses (ready, or
/// publishNotReadyAddresses) or notReadyAddresses, with ip, nodeName, hostname (when the pod's
/// subdomain is the Service) and targetRef; ports are resolved per pod and subsets repacked as
/// upstream `RepackSubsets` does. Labels are the Service's plus
/// `endpointslice.kubernetes.io/skip-mirror: "true"` (and `service.kubernetes.io/headless` for
/// headless Services). Over 1000 addresses are truncated with the
/// `endpoints.kubernetes.io/over-capacity: truncated` annotation. The
/// `endpoints.kubernetes.io/last-change-trigger-time` annotation is not managed.
pub fn plan_endpoints(
    svc: &Service,
    pods: &[&Pod],
    existing: Option<&Endpoints>,
) -> Option<Endpoints> {
    let sel = selector(svc)?;
    let pods = selected(svc, sel, pods);
    let tolerate = publish_not_ready(svc);
    let headless = !service_ip_set(svc);
    let mut entries = Vec::new();
    for pod in pods {
        if !should_be_in_endpoints(pod, tolerate) {
            continue;
        }
        let Some(addr) = pod_address(svc, pod) else {
            continue;
        };
        let ready = tolerate || pod_ready(pod);
        let ports = service_ports(svc);
        if ports.is_empty() {
            if headless {
                entries.push((addr, ready, None));
            }
            continue;
        }
        for sp in ports {
            let Some(port) = find_port(pod, sp) else {
                continue;
            };
            let ep = CoreEndpointPort {
                name: sp.name.clone(),
                port,
                protocol: Some(protocol(sp.protocol.as_deref()).to_string()),
                app_protocol: sp.app_protocol.clone(),
            };
            entries.push((addr.clone(), ready, Some(ep)));
        }
    }
    let mut subsets = repack(entries);
    let truncated = truncate(&mut subsets);
    let labels = endpoints_labels(svc);

    let mut out = match existing {
        Some(e) => e.clone(),
        None => Endpoints {
            metadata: ObjectMeta {
                name: svc.metadata.name.clone(),
                namespace: svc.metadata.namespace.clone(),
                ..Default::default()
            },
            subsets: None,
        },
    };
    let mut annotations = out.metadata.annotations.clone().unwrap_or_default();
    if truncated {
        annotations.insert(ANN_OVER_CAPACITY.into(), "truncated".into());
    } else {
        annotations.remove(ANN_OVER_CAPACITY);
    }
    if let Some(e) = existing {
        let same_annotations = e.metadata.annotations.clone().unwrap_or_default() == annotations;
        let same_labels = e.metadata.labels.clone().unwrap_or_default() == labels;
        if same_annotations
            && same_labels
            && comparable(e.subsets.as_ref()) == comparable(Some(&subsets))
        {
            return None;
        }
    }
    out.metadata.labels = Some(labels);
    out.metadata.annotations = (!annotations.is_empty()).then_some(annotations);
    out.subsets = (!subsets.is_empty()).then_some(subsets);
    Some(out)
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::{
        Container, ContainerPort, PodCondition, PodIP, PodSpec, PodStatus, ServiceSpec,
    };
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

    fn svc(ports: Vec<ServicePort>) -> Service {
        Service {
            metadata: ObjectMeta {
                name: Some("web".into()),
                namespace: Some("ns".into()),
                uid: Some("svc-uid".into()),
                labels: Some(BTreeMap::from([("team".into(), "a".into())])),
                ..Default::default()
            },
            spec: Some(ServiceSpec {
                selector: Some(BTreeMap::from([("app".into(), "web".into())])),
                cluster_ip: Some("10.96.0.10".into()),
                ip_families: Some(vec!["IPv4".into()]),
                ports: Some(ports),
                ..Default::default()
            }),
            status: None,
        }
    }

    fn sport(name: &str, port: i32, target: IntOrString) -> ServicePort {
        ServicePort {
            name: Some(name.into()),
            port,
            target_port: Some(target),
            protocol: Some("TCP".into()),
            ..Default::default()
        }
    }

    fn http_svc() -> Service {
        svc(vec![sport("http", 80, IntOrString::Int(8080))])
    }

    fn pod(name: &str, ip: &str, ready: bool) -> Pod {
        Pod {
            metadata: ObjectMeta {
                name: Some(name.into()),
                namespace: Some("ns".into()),
                uid: Some(format!("uid-{name}")),
                resource_version: Some("7".into()),
                labels: Some(BTreeMap::from([("app".into(), "web".into())])),
                ..Default::default()
            },
            spec: Some(PodSpec {
                node_name: Some("n1".into()),
                containers: vec![Container {
                    name: "c".into(),
                    ..Default::default()
                }],
                ..Default::default()
            }),
            status: Some(PodStatus {
                phase: Some("Running".into()),
                pod_ip: Some(ip.into()),
                pod_ips: Some(ip.split(',').map(|i| PodIP { ip: i.into() }).collect()),
                conditions: Some(vec![PodCondition {
                    type_: "Ready".into(),
                    status: if ready { "True" } else { "False" }.into(),
                    ..Default::default()
                }]),
                ..Default::default()
            }),
        }
    }

    fn zone(n: &str) -> Option<String> {
        (n == "n1").then(|| "z1".to_string())
    }

    /// Applies a plan to a fake store, naming created slices web-<n>.
    fn apply(store: &mut Vec<EndpointSlice>, plan: &SlicePlan, counter: &mut usize) {
        store.retain(|s| !plan.delete.contains(s.metadata.name.as_ref().unwrap()));
        for u in &plan.update {
            let slot = store
                .iter_mut()
                .find(|s| s.metadata.name == u.metadata.name)
                .unwrap();
            *slot = u.clone();
        }
        for c in &plan.create {
            let mut c = c.clone();
            *counter += 1;
            c.metadata.name = Some(format!("web-{counter}"));
            c.metadata.resource_version = Some("1".into());
            store.push(c);
        }
    }

    fn run(s: &Service, pods: &[Pod], store: &[EndpointSlice]) -> SlicePlan {
        let pods: Vec<&Pod> = pods.iter().collect();
        let existing: Vec<&EndpointSlice> = store.iter().collect();
        plan_slices(s, &pods, &existing, &zone)
    }

    fn conds(e: &Endpoint) -> (bool, bool, bool) {
        let c = e.conditions.as_ref().unwrap();
        (c.ready.unwrap(), c.serving.unwrap(), c.terminating.unwrap())
    }

    #[test]
    fn ready_not_ready_and_terminating() {
        let s = http_svc();
        let mut dying = pod("c", "10.0.0.3", true);
        dying.metadata.deletion_timestamp = Some(Time(jiff::Timestamp::UNIX_EPOCH));
        let mut done = pod("d", "10.0.0.4", false);
        done.status.as_mut().unwrap().phase = Some("Succeeded".into());
        let mut no_ip = pod("e", "", true);
        no_ip.status.as_mut().unwrap().pod_ips = None;
        let mut other = pod("f", "10.0.0.6", true);
        other.metadata.labels = None;
        let pods = [
            pod("a", "10.0.0.1", true),
            pod("b", "10.0.0.2", false),
            dying,
            done,
            no_ip,
            other,
        ];
        let plan = run(&s, &pods, &[]);
        assert_eq!(plan.create.len(), 1);
        assert!(plan.update.is_empty() && plan.delete.is_empty());
        let slice = &plan.create[0];
        assert_eq!(slice.metadata.name, None);
        assert_eq!(slice.metadata.generate_name.as_deref(), Some("web-"));
        assert_eq!(slice.address_type, "IPv4");
        let labels = slice.metadata.labels.as_ref().unwrap();
        assert_eq!(
            labels.get(LABEL_SERVICE_NAME).map(String::as_str),
            Some("web")
        );
        assert_eq!(
            labels.get(LABEL_MANAGED_BY).map(String::as_str),
            Some(MANAGED_BY)
        );
        assert_eq!(labels.get("team").map(String::as_str), Some("a"));
        assert!(!labels.contains_key(LABEL_HEADLESS));
        let owner = &slice.metadata.owner_references.as_ref().unwrap()[0];
        assert_eq!(
            (
                owner.kind.as_str(),
                owner.uid.as_str(),
                owner.controller,
                owner.block_owner_deletion
            ),
            ("Service", "svc-uid", Some(true), Some(true))
        );
        let ports = slice.ports.as_ref().unwrap();
        assert_eq!(ports[0].port, Some(8080));
        assert_eq!(ports[0].name.as_deref(), Some("http"));
        assert_eq!(ports[0].protocol.as_deref(), Some("TCP"));
        let eps = &slice.endpoints;
        assert_eq!(eps.len(), 3);
        assert_eq!(conds(&eps[0]), (true, true, false));
        assert_eq!(conds(&eps[1]), (false, false, false));
        assert_eq!(conds(&eps[2]), (false, true, true));
        assert_eq!(eps[0].addresses, vec!["10.0.0.1".to_string()]);
        assert_eq!(eps[0].node_name.as_deref(), Some("n1"));
        assert_eq!(eps[0].zone.as_deref(), Some("z1"));
        let r = eps[0].target_ref.as_ref().unwrap();
        assert_eq!(
            (
                r.kind.as_deref(),
                r.namespace.as_deref(),
                r.name.as_deref(),
                r.uid.as_deref()
            ),
            (Some("Pod"), Some("ns"), Some("a"), Some("uid-a"))
        );

        // publishNotReadyAddresses: all ready
        let mut s2 = http_svc();
        s2.spec.as_mut().unwrap().publish_not_ready_addresses = Some(true);
        let plan = run(&s2, &pods, &[]);
        assert!(plan.create[0].endpoints.iter().all(|e| conds(e).0));
    }

    fn named_pod(name: &str, ip: &str, port: i32) -> Pod {
        let mut p = pod(name, ip, true);
        p.spec.as_mut().unwrap().containers[0].ports = Some(vec![ContainerPort {
            name: Some("http".into()),
            container_port: port,
            protocol: Some("TCP".into()),
            ..Default::default()
        }]);
        p
    }

    #[test]
    fn named_ports_resolving_differently_make_two_slices() {
        let s = svc(vec![sport("web", 80, IntOrString::String("http".into()))]);
        let pods = [
            named_pod("a", "10.0.0.1", 8080),
            named_pod("b", "10.0.0.2", 9090),
            pod("c", "10.0.0.3", true),
        ];
        let plan = run(&s, &pods, &[]);
        // c has no such port: its own slice with no ports, as upstream groups by port set
        assert_eq!(plan.create.len(), 3);
        let mut seen: Vec<(Option<i32>, String)> = plan
            .create
            .iter()
            .map(|sl| {
                (
                    sl.ports
                        .as_ref()
                        .and_then(|p| p.first())
                        .and_then(|p| p.port),
                    sl.endpoints[0]
                        .target_ref
                        .as_ref()
                        .unwrap()
                        .name
                        .clone()
                        .unwrap(),
                )
            })
            .collect();
        seen.sort();
        assert_eq!(
            seen,
            vec![
                (None, "c".into()),
                (Some(8080), "a".into()),
                (Some(9090), "b".into())
            ]
        );
    }

    fn many(n: usize) -> Vec<Pod> {
        (0..n)
            .map(|i| {
                pod(
                    &format!("p{i:03}"),
                    &format!("10.0.{}.{}", i / 250, i % 250 + 1),
                    true,
                )
            })
            .collect()
    }

    #[test]
    fn many_pods_split_and_second_pass_is_empty() {
        let s = http_svc();
        let pods = many(250);
        let mut store = Vec::new();
        let mut counter = 0;
        let plan = run(&s, &pods, &store);
        let mut sizes: Vec<usize> = plan.create.iter().map(|s| s.endpoints.len()).collect();
        sizes.sort();
        assert_eq!(sizes, vec![50, 100, 100]);
        apply(&mut store, &plan, &mut counter);
        let again = run(&s, &pods, &store);
        assert!(again.is_empty(), "{again:?}");

        // removing one pod updates only its slice
        let victim = store[1].endpoints[10]
            .target_ref
            .as_ref()
            .unwrap()
            .name
            .clone()
            .unwrap();
        let fewer: Vec<Pod> = pods
            .iter()
            .filter(|p| p.metadata.name.as_ref() != Some(&victim))
            .cloned()
            .collect();
        let plan = run(&s, &fewer, &store);
        assert!(plan.create.is_empty() && plan.delete.is_empty());
        assert_eq!(plan.update.len(), 1);
        assert_eq!(plan.update[0].metadata.name, store[1].metadata.name);
        assert_eq!(
            plan.update[0].metadata.resource_version.as_deref(),
            Some("1")
        );
        assert_eq!(plan.update[0].endpoints.len(), 99);
        apply(&mut store, &plan, &mut counter);
        assert!(run(&s, &fewer, &store).is_empty());

        // a pod turning unready rewrites only its slice
        let mut changed = fewer.clone();
        changed[0]
            .status
            .as_mut()
            .unwrap()
            .conditions
            .as_mut()
            .unwrap()[0]
            .status = "False".into();
        let plan = run(&s, &changed, &store);
        assert_eq!(
            (plan.create.len(), plan.update.len(), plan.delete.len()),
            (0, 1, 0)
        );

        // a new pod goes into the unchanged slice it fills most closely (the 99 one) instead
        // of a new slice
        let mut more = fewer.clone();
        more.push(pod("zzz", "10.9.9.9", true));
        let plan = run(&s, &more, &store);
        assert_eq!(
            (plan.create.len(), plan.update.len(), plan.delete.len()),
            (0, 1, 0)
        );
        assert_eq!(plan.update[0].metadata.name, store[1].metadata.name);
        assert_eq!(plan.update[0].endpoints.len(), 100);
    }

    #[test]
    fn no_endpoints_keeps_one_placeholder() {
        let s = http_svc();
        let mut store = Vec::new();
        let mut counter = 0;
        let plan = run(&s, &[], &store);
        assert_eq!(plan.create.len(), 1);
        assert!(plan.create[0].endpoints.is_empty());
        assert!(plan.create[0].ports.is_none());
        apply(&mut store, &plan, &mut counter);
        assert!(run(&s, &[], &store).is_empty());
        // pods come: the placeholder is reused (its port set differs, so delete+create become
        // an update of the same object)
        let pods = [pod("a", "10.0.0.1", true)];
        let plan = run(&s, &pods, &store);
        assert_eq!(
            (plan.create.len(), plan.update.len(), plan.delete.len()),
            (0, 1, 0)
        );
        assert_eq!(plan.update[0].metadata.name.as_deref(), Some("web-1"));
        assert_eq!(plan.update[0].endpoints.len(), 1);
        apply(&mut store, &plan, &mut counter);
        assert!(run(&s, &pods, &store).is_empty());
        // and go: back to the placeholder in the same object
        let plan = run(&s, &[], &store);
        assert_eq!(
            (plan.create.len(), plan.update.len(), plan.delete.len()),
            (0, 1, 0)
        );
        assert!(plan.update[0].endpoints.is_empty());
        apply(&mut store, &plan, &mut counter);
        assert!(run(&s, &[], &store).is_empty());
        // Endpoints with no subsets
        let ep = plan_endpoints(&s, &[], None).unwrap();
        assert_eq!(ep.subsets, None);
        assert_eq!(ep.metadata.name.as_deref(), Some("web"));
    }

    #[test]
    fn emptied_slices_are_deleted_but_one_remains() {
        let s = http_svc();
        let pods = many(150);
        let mut store = Vec::new();
        let mut counter = 0;
        let first = run(&s, &pods, &store);
        apply(&mut store, &first, &mut counter);
        assert_eq!(store.len(), 2);
        // only the first 40 pods stay: the 50-slice empties and goes
        let plan = run(&s, &pods[..40], &store);
        assert_eq!(plan.delete.len(), 1);
        assert_eq!(plan.update.len(), 1);
        apply(&mut store, &plan, &mut counter);
        assert_eq!(store.len(), 1);
        assert!(run(&s, &pods[..40], &store).is_empty());
    }

    #[test]
    fn services_without_selector_or_external_name_are_left_alone() {
        let mut s = http_svc();
        s.spec.as_mut().unwrap().selector = None;
        let pods = [pod("a", "10.0.0.1", true)];
        assert!(run(&s, &pods, &[]).is_empty());
        assert_eq!(plan_endpoints(&s, &[&pods[0]], None), None);
        let mut s = http_svc();
        s.spec.as_mut().unwrap().type_ = Some("ExternalName".into());
        assert!(run(&s, &pods, &[]).is_empty());
    }

    #[test]
    fn dual_stack() {
        let mut s = http_svc();
        s.spec.as_mut().unwrap().ip_families = Some(vec!["IPv6".into(), "IPv4".into()]);
        let pods = [
            pod("a", "10.0.0.1,fd00::1", true),
            pod("b", "10.0.0.2", true),
        ];
        let plan = run(&s, &pods, &[]);
        assert_eq!(plan.create.len(), 2);
        let v6 = plan
            .create
            .iter()
            .find(|s| s.address_type == "IPv6")
            .unwrap();
        let v4 = plan
            .create
            .iter()
            .find(|s| s.address_type == "IPv4")
            .unwrap();
        assert_eq!(v6.endpoints.len(), 1);
        assert_eq!(v6.endpoints[0].addresses, vec!["fd00::1".to_string()]);
        assert_eq!(v4.endpoints.len(), 2);
        // single stack again: the IPv6 slice goes
        let mut store = Vec::new();
        let mut counter = 0;
        apply(&mut store, &plan, &mut counter);
        s.spec.as_mut().unwrap().ip_families = Some(vec!["IPv4".into()]);
        let plan = run(&s, &pods, &store);
        assert_eq!(plan.delete, vec![v6_name(&store)]);
        assert!(plan.create.is_empty() && plan.update.is_empty());
        // Endpoints use the primary family only
        s.spec.as_mut().unwrap().ip_families = Some(vec!["IPv6".into(), "IPv4".into()]);
        let ep = plan_endpoints(&s, &[&pods[0], &pods[1]], None).unwrap();
        let subsets = ep.subsets.unwrap();
        assert_eq!(subsets.len(), 1);
        assert_eq!(subsets[0].addresses.as_ref().unwrap()[0].ip, "fd00::1");
    }

    fn v6_name(store: &[EndpointSlice]) -> String {
        store
            .iter()
            .find(|s| s.address_type == "IPv6")
            .unwrap()
            .metadata
            .name
            .clone()
            .unwrap()
    }

    #[test]
    fn foreign_slices_are_replaced_and_labels_follow_the_service() {
        let s = http_svc();
        let pods = [pod("a", "10.0.0.1", true)];
        let mut store = Vec::new();
        let mut counter = 0;
        let first = run(&s, &pods, &store);
        apply(&mut store, &first, &mut counter);
        let mut relabelled = s.clone();
        relabelled.metadata.labels = Some(BTreeMap::from([("team".into(), "b".into())]));
        let plan = run(&relabelled, &pods, &store);
        assert_eq!(plan.update.len(), 1);
        assert_eq!(
            plan.update[0]
                .metadata
                .labels
                .as_ref()
                .unwrap()
                .get("team")
                .map(String::as_str),
            Some("b")
        );
        // a slice owned by an older Service of the same name
        store[0].metadata.owner_references.as_mut().unwrap()[0].uid = "old".into();
        let plan = run(&s, &pods, &store);
        assert_eq!(
            (plan.create.len(), plan.update.len(), plan.delete.len()),
            (1, 0, 1)
        );
    }

    #[test]
    fn endpoints_subsets() {
        let s = svc(vec![
            sport("web", 80, IntOrString::String("http".into())),
            sport("metrics", 9100, IntOrString::Int(9100)),
        ]);
        let a = named_pod("a", "10.0.0.1", 8080);
        let b = named_pod("b", "10.0.0.2", 8080);
        let mut c = named_pod("c", "10.0.0.3", 9090);
        c.status.as_mut().unwrap().conditions.as_mut().unwrap()[0].status = "False".into();
        let mut dying = named_pod("d", "10.0.0.4", 8080);
        dying.metadata.deletion_timestamp = Some(Time(jiff::Timestamp::UNIX_EPOCH));
        let pods = [&a, &b, &c, &dying];
        let ep = plan_endpoints(&s, &pods, None).unwrap();
        let labels = ep.metadata.labels.as_ref().unwrap();
        assert_eq!(
            labels.get(LABEL_SKIP_MIRROR).map(String::as_str),
            Some("true")
        );
        assert_eq!(labels.get("team").map(String::as_str), Some("a"));
        let subsets = ep.subsets.clone().unwrap();
        let summary: Vec<(Vec<String>, Vec<String>, Vec<i32>)> = subsets
            .iter()
            .map(|s| {
                (
                    s.addresses.iter().flatten().map(|a| a.ip.clone()).collect(),
                    s.not_ready_addresses
                        .iter()
                        .flatten()
                        .map(|a| a.ip.clone())
                        .collect(),
                    s.ports.iter().flatten().map(|p| p.port).collect(),
                )
            })
            .collect();
        assert_eq!(
            summary,
            vec![
                (vec![], vec!["10.0.0.3".into()], vec![9090]),
                (
                    vec!["10.0.0.1".into(), "10.0.0.2".into()],
                    vec![],
                    vec![8080]
                ),
                (
                    vec!["10.0.0.1".into(), "10.0.0.2".into()],
                    vec!["10.0.0.3".into()],
                    vec![9100]
                ),
            ]
        );
        let addr = &subsets[1].addresses.as_ref().unwrap()[0];
        assert_eq!(addr.node_name.as_deref(), Some("n1"));
        assert_eq!(addr.target_ref.as_ref().unwrap().name.as_deref(), Some("a"));
        // unchanged -> None, even with pod resourceVersions moved and another order
        let mut stored = ep.clone();
        stored.metadata.resource_version = Some("5".into());
        for s in stored.subsets.as_mut().unwrap().iter_mut() {
            for a in s.addresses.iter_mut().flatten() {
                a.target_ref.as_mut().unwrap().resource_version = Some("99".into());
            }
            if let Some(a) = s.addresses.as_mut() {
                a.reverse();
            }
        }
        stored.subsets.as_mut().unwrap().reverse();
        assert_eq!(plan_endpoints(&s, &pods, Some(&stored)), None);
        // a change keeps the stored metadata
        let updated = plan_endpoints(&s, &[&a, &b], Some(&stored)).unwrap();
        assert_eq!(updated.metadata.resource_version.as_deref(), Some("5"));
        assert_eq!(updated.subsets.unwrap().len(), 1);
        // publishNotReadyAddresses: terminating and unready pods are ready addresses
        let mut s2 = s.clone();
        s2.spec.as_mut().unwrap().publish_not_ready_addresses = Some(true);
        let ep = plan_endpoints(&s2, &pods, None).unwrap();
        let subsets = ep.subsets.unwrap();
        assert!(subsets.iter().all(|s| s.not_ready_addresses.is_none()));
        let ready: BTreeSet<&str> = subsets
            .iter()
            .flat_map(|s| s.addresses.iter().flatten())
            .map(|a| a.ip.as_str())
            .collect();
        assert_eq!(ready.len(), 4);
    }

    #[test]
    fn headless_without_ports_and_truncation() {
        let mut s = svc(vec![]);
        s.spec.as_mut().unwrap().cluster_ip = Some("None".into());
        let pods = many(1200);
        let refs: Vec<&Pod> = pods.iter().collect();
        let ep = plan_endpoints(&s, &refs, None).unwrap();
        assert_eq!(
            ep.metadata
                .labels
                .as_ref()
                .unwrap()
                .get(LABEL_HEADLESS)
                .map(String::as_str),
            Some("")
        );
        assert_eq!(
            ep.metadata
                .annotations
                .as_ref()
                .unwrap()
                .get(ANN_OVER_CAPACITY)
                .map(String::as_str),
            Some("truncated")
        );
        let subsets = ep.subsets.clone().unwrap();
        assert_eq!(subsets.len(), 1);
        assert_eq!(subsets[0].ports, None);
        assert_eq!(
            subsets[0].addresses.as_ref().unwrap().len(),
            MAX_ENDPOINTS_CAPACITY
        );
        assert_eq!(plan_endpoints(&s, &refs, Some(&ep)), None);
        // headless slices carry the headless label and no ports
        let plan = plan_slices(&s, &refs[..3], &[], &zone);
        // no ipFamilies would mean both types for headless; the test service has IPv4
        assert_eq!(plan.create.len(), 1);
        assert_eq!(plan.create[0].ports, None);
        assert!(
            plan.create[0]
                .metadata
                .labels
                .as_ref()
                .unwrap()
                .contains_key(LABEL_HEADLESS)
        );
    }

    #[test]
    fn hostname_zone_and_sidecar_ports() {
        let s = svc(vec![sport("web", 80, IntOrString::String("side".into()))]);
        let mut p = pod("a", "10.0.0.1", true);
        {
            let spec = p.spec.as_mut().unwrap();
            spec.hostname = Some("a-host".into());
            spec.subdomain = Some("web".into());
            spec.node_name = Some("n2".into());
            spec.init_containers = Some(vec![Container {
                name: "proxy".into(),
                restart_policy: Some("Always".into()),
                ports: Some(vec![ContainerPort {
                    name: Some("side".into()),
                    container_port: 15001,
                    ..Default::default()
                }]),
                ..Default::default()
            }]);
        }
        let plan = run(&s, std::slice::from_ref(&p), &[]);
        let slice = &plan.create[0];
        assert_eq!(slice.ports.as_ref().unwrap()[0].port, Some(15001));
        let e = &slice.endpoints[0];
        assert_eq!(e.hostname.as_deref(), Some("a-host"));
        assert_eq!(e.zone, None, "n2 has no zone");
        let ep = plan_endpoints(&s, &[&p], None).unwrap();
        let subsets = ep.subsets.unwrap();
        let addr = &subsets[0].addresses.as_ref().unwrap()[0];
        assert_eq!(addr.hostname.as_deref(), Some("a-host"));
        assert_eq!(addr.node_name.as_deref(), Some("n2"));
    }
}
