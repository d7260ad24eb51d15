//! What ferro-proxy keeps of the objects it watches, so that at 10,000 Services and 100,000
//! endpoints its caches hold the fields the model reads and nothing else — no managedFields,
//! no targetRef of every endpoint, no selector, no annotations of other tools:
//!
//! - EndpointSlices and Services are read from the API into [`EndpointSlice`] and
//!   [`Service`], types of ferro-proxy's own with the API's JSON shape and only the fields the
//!   model reads: each endpoint ~90 bytes with no allocation of its own (its first address
//!   parsed, node and zone names shared), where k8s-openapi's type takes ~450 bytes and three
//!   allocations; a Service's enumerated strings (type, policies) shared, not one copy each.
//! - The informers pass every object through the transforms below before caching it
//!   ([`ferro_runtime::Informer::with_transform`]): the metadata, spec and status fields
//!   nobody reads go.
//!
//! Every field [`crate::model`] and the controller read is kept; the tests below build the
//! model from a full object and from what is kept of it, and compare.

use std::borrow::Cow;
use std::collections::{BTreeMap, HashSet};
use std::fmt;
use std::net::IpAddr;
use std::sync::{Arc, Mutex, OnceLock};

use k8s_openapi::api::core::v1::Node;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use serde::de::{Deserializer, IgnoredAny, SeqAccess, Visitor};
use serde::Deserialize;

use crate::model::{LABEL_HEADLESS, LABEL_SERVICE_NAME, LABEL_SERVICE_PROXY_NAME, LABEL_ZONE};

/// The Service annotations the model reads.
const SERVICE_ANNOTATIONS: &[&str] = &[
    "service.kubernetes.io/topology-mode",
    "service.kubernetes.io/topology-aware-hints",
    "service.beta.kubernetes.io/load-balancer-source-ranges",
];

/// The EndpointSlice annotation the controller reads (network programming latency).
pub const TRIGGER_TIME: &str = "endpoints.kubernetes.io/last-change-trigger-time";

fn keep_keys(map: &mut Option<BTreeMap<String, String>>, keep: &[&str]) {
    if let Some(m) = map {
        m.retain(|k, _| keep.contains(&k.as_str()));
        if m.is_empty() {
            *map = None;
        }
    }
}

/// The metadata every kind keeps: namespace, name, resourceVersion (the cache's key and its
/// relist comparison), uid (Events name the object by it), deletionTimestamp, and the labels
/// and annotations listed.
fn slim_meta(meta: &mut ObjectMeta, labels: &[&str], annotations: &[&str]) {
    let ObjectMeta { name, namespace, resource_version, uid, deletion_timestamp, labels: l, annotations: a, .. } =
        std::mem::take(meta);
    *meta = ObjectMeta { name, namespace, resource_version, uid, deletion_timestamp, labels: l, annotations: a, ..ObjectMeta::default() };
    keep_keys(&mut meta.labels, labels);
    keep_keys(&mut meta.annotations, annotations);
}

/// Makes a type of this module an API object kube can watch: k8s-openapi's `Resource` and
/// `Metadata` (kube's `Resource` follows from those).
macro_rules! api_object {
    ($t:ty, $api_version:literal, $group:literal, $kind:literal, $version:literal, $plural:literal, $scope:ty) => {
        impl k8s_openapi::Resource for $t {
            const API_VERSION: &'static str = $api_version;
            const GROUP: &'static str = $group;
            const KIND: &'static str = $kind;
            const VERSION: &'static str = $version;
            const URL_PATH_SEGMENT: &'static str = $plural;
            type Scope = $scope;
        }

        impl k8s_openapi::Metadata for $t {
            type Ty = ObjectMeta;

            fn metadata(&self) -> &ObjectMeta {
                &self.metadata
            }

            fn metadata_mut(&mut self) -> &mut ObjectMeta {
                &mut self.metadata
            }
        }
    };
}

/// A Service (v1) as ferro-proxy reads it from the API: the spec and status fields the model
/// reads (field names as k8s-openapi's), the metadata cut by [`service`] in the informer.
#[derive(Clone, Debug, Default, PartialEq, Deserialize)]
pub struct Service {
    #[serde(default)]
    pub metadata: ObjectMeta,
    #[serde(default)]
    pub spec: Option<ServiceSpec>,
    #[serde(default)]
    pub status: Option<ServiceStatus>,
}

#[derive(Clone, Debug, Default, PartialEq, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ServiceSpec {
    #[serde(default, rename = "type", deserialize_with = "shared_name")]
    pub type_: Option<Arc<str>>,
    #[serde(default, rename = "clusterIP")]
    pub cluster_ip: Option<String>,
    #[serde(default, rename = "clusterIPs")]
    pub cluster_ips: Option<Vec<String>>,
    #[serde(default, rename = "externalIPs")]
    pub external_ips: Option<Vec<String>>,
    #[serde(default)]
    pub load_balancer_source_ranges: Option<Vec<String>>,
    #[serde(default, deserialize_with = "shared_name")]
    pub session_affinity: Option<Arc<str>>,
    #[serde(default)]
    pub session_affinity_config: Option<Box<SessionAffinityConfig>>,
    #[serde(default, deserialize_with = "shared_name")]
    pub external_traffic_policy: Option<Arc<str>>,
    #[serde(default, deserialize_with = "shared_name")]
    pub internal_traffic_policy: Option<Arc<str>>,
    #[serde(default)]
    pub health_check_node_port: Option<i32>,
    #[serde(default, deserialize_with = "shared_name")]
    pub traffic_distribution: Option<Arc<str>>,
    #[serde(default)]
    pub ports: Option<Vec<Port>>,
}

/// One port of a Service's spec.
#[derive(Clone, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Port {
    #[serde(default)]
    pub name: Option<String>,
    #[serde(default, deserialize_with = "shared_name")]
    pub protocol: Option<Arc<str>>,
    #[serde(default)]
    pub port: i32,
    #[serde(default)]
    pub node_port: Option<i32>,
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SessionAffinityConfig {
    #[serde(default, rename = "clientIP")]
    pub client_ip: Option<ClientIpConfig>,
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ClientIpConfig {
    #[serde(default)]
    pub timeout_seconds: Option<i32>,
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ServiceStatus {
    #[serde(default)]
    pub load_balancer: Option<LoadBalancerStatus>,
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Deserialize)]
pub struct LoadBalancerStatus {
    #[serde(default)]
    pub ingress: Option<Vec<LoadBalancerIngress>>,
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct LoadBalancerIngress {
    #[serde(default)]
    pub ip: Option<String>,
    #[serde(default, deserialize_with = "shared_name")]
    pub ip_mode: Option<Arc<str>>,
}

api_object!(Service, "v1", "", "Service", "v1", "services", k8s_openapi::NamespaceResourceScope);

/// A Service's metadata as the model and the Events read it.
pub fn service(svc: &mut Service) {
    slim_meta(&mut svc.metadata, &[LABEL_SERVICE_PROXY_NAME], SERVICE_ANNOTATIONS);
}

/// An EndpointSlice (discovery.k8s.io/v1) as ferro-proxy reads it from the API: the API's
/// JSON, of each endpoint its first address (the only one that counts, as upstream),
/// conditions, node name, zone and zone hints; the metadata's labels and annotations cut to
/// those read by [`endpoint_slice`] in the informer.
#[derive(Clone, Debug, Default, PartialEq, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct EndpointSlice {
    #[serde(default)]
    pub metadata: ObjectMeta,
    /// The `kubernetes.io/service-name` label, moved here by [`endpoint_slice`] (a label map
    /// costs a B-tree node per object).
    #[serde(skip)]
    pub service_name: Option<Box<str>>,
    /// The `endpoints.kubernetes.io/last-change-trigger-time` annotation, parsed and moved
    /// here by [`endpoint_slice`].
    #[serde(skip)]
    pub trigger_time: Option<jiff::Timestamp>,
    #[serde(default)]
    pub address_type: String,
    #[serde(default, deserialize_with = "null_is_empty")]
    pub endpoints: Vec<Endpoint>,
    #[serde(default)]
    pub ports: Option<Vec<EndpointPort>>,
}

/// One endpoint of an [`EndpointSlice`].
#[derive(Clone, Debug, Default, PartialEq, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Endpoint {
    /// The first of its addresses, parsed (None: the list was empty).
    #[serde(rename = "addresses", default, deserialize_with = "first_address")]
    pub address: Option<Address>,
    #[serde(default)]
    pub conditions: Option<Conditions>,
    #[serde(default, deserialize_with = "shared_name")]
    pub node_name: Option<Arc<str>>,
    #[serde(default, deserialize_with = "shared_name")]
    pub zone: Option<Arc<str>>,
    #[serde(default)]
    pub hints: Option<Box<Hints>>,
}

/// An endpoint's address: an IP, or the text that is not one (reported, not programmed).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Address {
    Ip(IpAddr),
    Invalid(Box<str>),
}

impl fmt::Display for Address {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Address::Ip(ip) => write!(f, "{ip}"),
            Address::Invalid(s) => f.write_str(s),
        }
    }
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Deserialize)]
pub struct Conditions {
    #[serde(default)]
    pub ready: Option<bool>,
    #[serde(default)]
    pub serving: Option<bool>,
    #[serde(default)]
    pub terminating: Option<bool>,
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Hints {
    #[serde(default)]
    pub for_zones: Option<Vec<ForZone>>,
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Deserialize)]
pub struct ForZone {
    #[serde(default)]
    pub name: String,
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct EndpointPort {
    #[serde(default)]
    pub name: Option<String>,
    #[serde(default)]
    pub port: Option<i32>,
    #[serde(default)]
    pub protocol: Option<String>,
}

impl EndpointSlice {
    /// The Service it belongs to (its `kubernetes.io/service-name` label).
    pub fn service_name(&self) -> Option<&str> {
        self.service_name
            .as_deref()
            .or_else(|| self.metadata.labels.as_ref()?.get(LABEL_SERVICE_NAME).map(String::as_str))
    }

    /// When the change it reflects happened (its last-change-trigger-time annotation).
    pub fn trigger_time(&self) -> Option<jiff::Timestamp> {
        self.trigger_time.or_else(|| self.metadata.annotations.as_ref()?.get(TRIGGER_TIME)?.parse().ok())
    }
}

api_object!(EndpointSlice, "discovery.k8s.io/v1", "discovery.k8s.io", "EndpointSlice", "v1", "endpointslices", k8s_openapi::NamespaceResourceScope);

fn null_is_empty<'de, D: Deserializer<'de>, T: Deserialize<'de>>(d: D) -> Result<Vec<T>, D::Error> {
    Ok(Option::<Vec<T>>::deserialize(d)?.unwrap_or_default())
}

/// The first string of a list, parsed as an IP; the others are skipped unread.
fn first_address<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Address>, D::Error> {
    struct First;
    impl<'de> Visitor<'de> for First {
        type Value = Option<Address>;

        fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.write_str("a list of addresses")
        }

        fn visit_unit<E: serde::de::Error>(self) -> Result<Self::Value, E> {
            Ok(None)
        }

        fn visit_none<E: serde::de::Error>(self) -> Result<Self::Value, E> {
            Ok(None)
        }

        fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
            let first: Option<Cow<'de, str>> = seq.next_element::<Borrowed<'de>>()?.map(|b| b.0);
            while seq.next_element::<IgnoredAny>()?.is_some() {}
            Ok(first.map(|s| match s.parse::<IpAddr>() {
                Ok(ip) => Address::Ip(ip),
                Err(_) => Address::Invalid(s.into()),
            }))
        }
    }
    d.deserialize_any(First)
}

/// A string, borrowed from the input where it can be.
struct Borrowed<'de>(Cow<'de, str>);

impl<'de> Deserialize<'de> for Borrowed<'de> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = Borrowed<'de>;

            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a string")
            }

            fn visit_borrowed_str<E: serde::de::Error>(self, v: &'de str) -> Result<Self::Value, E> {
                Ok(Borrowed(Cow::Borrowed(v)))
            }

            fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<Self::Value, E> {
                Ok(Borrowed(Cow::Owned(v.to_string())))
            }

            fn visit_string<E: serde::de::Error>(self, v: String) -> Result<Self::Value, E> {
                Ok(Borrowed(Cow::Owned(v)))
            }
        }
        d.deserialize_str(V)
    }
}

/// Node and zone names: a few distinct ones shared by 100,000 endpoints, so each is kept once
/// (names no endpoint holds any more are let go when the set has doubled since).
fn shared_name<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Arc<str>>, D::Error> {
    let Some(s) = Option::<Borrowed<'de>>::deserialize(d)? else { return Ok(None) };
    Ok(Some(intern(&s.0)))
}

struct Names {
    set: HashSet<Arc<str>>,
    /// The set's size after the last sweep.
    swept_at: usize,
}

fn intern(s: &str) -> Arc<str> {
    static NAMES: OnceLock<Mutex<Names>> = OnceLock::new();
    let mut names = NAMES
        .get_or_init(|| Mutex::new(Names { set: HashSet::new(), swept_at: 0 }))
        .lock()
        .unwrap_or_else(|p| p.into_inner());
    if let Some(n) = names.set.get(s) {
        return n.clone();
    }
    if names.set.len() >= 2 * names.swept_at.max(64) {
        names.set.retain(|n| Arc::strong_count(n) > 1);
        names.swept_at = names.set.len();
    }
    let n: Arc<str> = Arc::from(s);
    names.set.insert(n.clone());
    n
}

/// An EndpointSlice's metadata as the model and the controller read it: its Service's name
/// and its trigger time in fields of their own, the labels that exclude it (never there when
/// the informer's label selector did its job) kept.
pub fn endpoint_slice(slice: &mut EndpointSlice) {
    if let Some(name) = slice.metadata.labels.as_mut().and_then(|l| l.remove(LABEL_SERVICE_NAME)) {
        slice.service_name = Some(name.into());
    }
    if let Some(t) = slice.metadata.annotations.as_ref().and_then(|a| a.get(TRIGGER_TIME)).and_then(|t| t.parse().ok()) {
        slice.trigger_time = Some(t);
    }
    slim_meta(&mut slice.metadata, &[LABEL_SERVICE_PROXY_NAME, LABEL_HEADLESS], &[]);
}

/// This node as the controller reads it (its zone label, deletion, taints).
pub fn node(node: &mut Node) {
    slim_meta(&mut node.metadata, &[LABEL_ZONE], &[]);
    if let Some(spec) = &mut node.spec {
        spec.pod_cidr = None;
        spec.pod_cidrs = None;
        spec.provider_id = None;
        spec.config_source = None;
    }
    node.status = None;
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use crate::model::{self, Family, NodeInfo};
    use serde_json::json;
    use std::sync::Arc;

    fn full_service() -> Service {
        serde_json::from_value(json!({
            "metadata": {"namespace": "ns", "name": "web", "uid": "u-1", "resourceVersion": "7",
                "creationTimestamp": "2026-11-28T00:00:00Z", "generation": 3,
                "labels": {"app": "web", "team": "a"},
                "annotations": {"kubectl.kubernetes.io/last-applied-configuration": "{...}",
                    "service.kubernetes.io/topology-mode": "Auto",
                    "service.beta.kubernetes.io/load-balancer-source-ranges": "10.0.0.0/8"},
                "managedFields": [{"manager": "kubectl", "operation": "Apply", "apiVersion": "v1",
                    "fieldsType": "FieldsV1", "fieldsV1": {"f:spec": {"f:ports": {}}}}]},
            "spec": {"type": "LoadBalancer", "clusterIP": "10.96.0.10", "clusterIPs": ["10.96.0.10", "fd00::10"],
                "ipFamilies": ["IPv4", "IPv6"], "ipFamilyPolicy": "PreferDualStack",
                "selector": {"app": "web"}, "externalIPs": ["192.0.2.7"],
                "sessionAffinity": "ClientIP", "sessionAffinityConfig": {"clientIP": {"timeoutSeconds": 60}},
                "externalTrafficPolicy": "Local", "internalTrafficPolicy": "Cluster", "healthCheckNodePort": 31000,
                "ports": [{"name": "http", "port": 80, "targetPort": 8080, "nodePort": 30080, "protocol": "TCP", "appProtocol": "http"},
                          {"name": "dns", "port": 53, "targetPort": "dns", "protocol": "UDP"}]},
            "status": {"loadBalancer": {"ingress": [{"ip": "198.51.100.1", "hostname": "lb.example", "ipMode": "VIP",
                "ports": [{"port": 80, "protocol": "TCP"}]}, {"ip": "198.51.100.2", "ipMode": "Proxy"}]},
                "conditions": []},
        }))
        .unwrap()
    }

    fn slice_json(family: &str, addrs: &[&str]) -> serde_json::Value {
        let eps: Vec<_> = addrs
            .iter()
            .enumerate()
            .map(|(i, a)| {
                json!({"addresses": [a, "192.0.2.200"], "conditions": {"ready": i != 1, "serving": true, "terminating": i == 1},
                    "nodeName": if i == 0 { "node-a" } else { "node-b" }, "zone": "z1", "hostname": "h",
                    "hints": {"forZones": [{"name": "z1"}], "forNodes": [{"name": "node-a"}]},
                    "deprecatedTopology": {"x": "y"},
                    "targetRef": {"kind": "Pod", "namespace": "ns", "name": format!("web-{i}"), "uid": format!("pod-{i}")}})
            })
            .collect();
        json!({
            "apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
            "metadata": {"namespace": "ns", "name": format!("web-{family}"), "resourceVersion": "9", "uid": "s-1",
                "labels": {"kubernetes.io/service-name": "web", "endpointslice.kubernetes.io/managed-by": "x"},
                "annotations": {"endpoints.kubernetes.io/last-change-trigger-time": "2026-11-28T00:00:00Z", "other": "1"},
                "ownerReferences": [{"apiVersion": "v1", "kind": "Service", "name": "web", "uid": "u-1"}],
                "managedFields": [{"manager": "ctl", "operation": "Update", "fieldsType": "FieldsV1", "fieldsV1": {"f:endpoints": {}}}]},
            "addressType": family,
            "ports": [{"name": "http", "port": 8080, "protocol": "TCP", "appProtocol": "http"},
                      {"name": "dns", "port": 5353, "protocol": "UDP"}],
            "endpoints": eps,
        })
    }

    /// As the watch gives it: parsed from the API's bytes, then the informer's transform.
    fn read_slice(v: &serde_json::Value) -> EndpointSlice {
        let bytes = serde_json::to_vec(v).unwrap();
        let mut s: EndpointSlice = serde_json::from_slice(&bytes).unwrap();
        endpoint_slice(&mut s);
        s
    }

    #[test]
    fn the_slim_service_gives_the_same_model() {
        let svc = full_service();
        let slices: Vec<Arc<EndpointSlice>> =
            [slice_json("IPv4", &["10.1.0.1", "10.1.0.2", "not-an-ip"]), slice_json("IPv6", &["fd00::1", "10.1.0.9"])]
                .iter()
                .map(|v| Arc::new(read_slice(v)))
                .collect();
        let mut slim_svc = svc.clone();
        service(&mut slim_svc);
        for node_zone in [None, Some("z1".to_string())] {
            let node = NodeInfo { name: "node-a".into(), zone: node_zone };
            for family in [Family::V4, Family::V6] {
                let full = model::build(family, &[Arc::new(svc.clone())], &slices, &node);
                let slim = model::build(family, &[Arc::new(slim_svc.clone())], &slices, &node);
                assert_eq!(full, slim, "{family:?}");
                assert!(!full.0.services.is_empty());
            }
        }
        // every field the model reads, read from the API's JSON
        let node = NodeInfo { name: "node-a".into(), zone: None };
        let (m, problems) = model::build(Family::V4, &[Arc::new(slim_svc.clone())], &slices, &node);
        assert!(problems.iter().all(|p| p.to_string().contains("not-an-ip")), "{problems:?}");
        let http = m.services.values().find(|e| &*e.port.name.port == "http").unwrap();
        let p = &http.port;
        assert_eq!((p.cluster_ip.to_string().as_str(), p.port, p.node_port, p.health_check_node_port), ("10.96.0.10", 80, 30080, 31000));
        assert_eq!(p.external_ips, ["192.0.2.7".parse::<IpAddr>().unwrap()]);
        assert_eq!(p.load_balancer_ips, ["198.51.100.1".parse::<IpAddr>().unwrap()], "the Proxy-mode ingress is left out");
        assert_eq!(p.load_balancer_source_ranges, ["10.0.0.0/8".parse::<ipnet::IpNet>().unwrap()]);
        assert_eq!(p.affinity_seconds, Some(60));
        assert!(p.external_policy_local && !p.internal_policy_local && p.topology_aware);
        let dns = m.services.values().find(|e| &*e.port.name.port == "dns").unwrap();
        assert_eq!((dns.port.protocol, dns.port.port, dns.port.node_port), (model::Protocol::Udp, 53, 0));
        assert_eq!(http.endpoints.len(), 2);
        let (m6, _) = model::build(Family::V6, &[Arc::new(slim_svc.clone())], &slices, &node);
        assert_eq!(m6.services.values().next().unwrap().port.cluster_ip.to_string(), "fd00::10");
        // and what went
        assert!(slim_svc.metadata.managed_fields.is_none() && slim_svc.metadata.creation_timestamp.is_none());
        assert_eq!(slim_svc.metadata.uid.as_deref(), Some("u-1"));
        assert_eq!(slim_svc.metadata.labels, None);
        assert_eq!(slim_svc.metadata.annotations.as_ref().unwrap().len(), 2);
    }

    #[test]
    fn a_slice_keeps_what_the_model_reads() {
        let node = NodeInfo { name: "node-a".into(), zone: Some("z1".into()) };
        let s = read_slice(&slice_json("IPv4", &["10.1.0.1", "10.1.0.2", "not-an-ip", "fd00::7"]));
        assert!(s.metadata.managed_fields.is_none() && s.metadata.owner_references.is_none());
        assert_eq!((s.metadata.labels.as_ref(), s.metadata.annotations.as_ref()), (None, None));
        assert_eq!(s.service_name(), Some("web"));
        assert_eq!(s.trigger_time(), Some("2026-11-28T00:00:00Z".parse().unwrap()));
        let untransformed: EndpointSlice = serde_json::from_value(slice_json("IPv4", &["10.1.0.1"])).unwrap();
        assert_eq!((untransformed.service_name(), untransformed.trigger_time()), (s.service_name(), s.trigger_time()));
        assert_eq!(s.metadata.resource_version.as_deref(), Some("9"));
        let addrs: Vec<String> = s.endpoints.iter().map(|e| e.address.as_ref().unwrap().to_string()).collect();
        assert_eq!(addrs, ["10.1.0.1", "10.1.0.2", "not-an-ip", "fd00::7"], "the first address of each");
        assert!(matches!(s.endpoints[2].address, Some(Address::Invalid(_))));
        // one copy of each node and zone name
        assert!(Arc::ptr_eq(s.endpoints[1].node_name.as_ref().unwrap(), s.endpoints[2].node_name.as_ref().unwrap()));
        assert!(Arc::ptr_eq(s.endpoints[0].zone.as_ref().unwrap(), s.endpoints[3].zone.as_ref().unwrap()));
        let mut problems = Vec::new();
        let eps = model::slice_endpoints(&s, Family::V4, &node, &mut problems);
        // two addresses x two ports
        assert_eq!(eps.len(), 4);
        let (name, first) = &eps[0];
        assert_eq!(name.to_string(), "ns/web:http");
        assert_eq!((first.ip.to_string().as_str(), first.port, first.ready, first.serving, first.terminating, first.local), ("10.1.0.1", 8080, true, true, false, true));
        assert_eq!(first.zone.as_deref(), Some("z1"));
        assert!(first.zone_hints.contains("z1"));
        let second = &eps[2].1;
        assert_eq!((second.ready, second.serving, second.terminating, second.local), (false, true, true, false));
        let reasons: Vec<String> = problems.iter().map(ToString::to_string).collect();
        assert_eq!(problems.len(), 2, "{reasons:?}");
        assert!(reasons[0].contains("not-an-ip") && reasons[1].contains("fd00::7"), "{reasons:?}");
        // what the API may leave out or send as null
        let bare: EndpointSlice = serde_json::from_value(json!({"metadata": {"name": "x"}, "addressType": "IPv4", "endpoints": null})).unwrap();
        assert!(bare.endpoints.is_empty() && bare.ports.is_none());
        let empty: EndpointSlice =
            serde_json::from_value(json!({"addressType": "IPv4", "endpoints": [{"addresses": []}, {"addresses": ["10.0.0.1"], "nodeName": null}]})).unwrap();
        assert_eq!(empty.endpoints[0].address, None);
        assert_eq!(empty.endpoints[1].node_name, None);
        assert!(serde_json::from_value::<EndpointSlice>(json!({"endpoints": [{"addresses": [7]}]})).is_err());
        assert_eq!(<EndpointSlice as kube::Resource>::plural(&()), "endpointslices");
        assert_eq!(<EndpointSlice as kube::Resource>::api_version(&()), "discovery.k8s.io/v1");
        assert_eq!((<Service as kube::Resource>::plural(&()), <Service as kube::Resource>::api_version(&())), ("services".into(), "v1".into()));
    }

    #[test]
    fn the_labels_that_exclude_an_object_stay() {
        let mut svc = full_service();
        svc.metadata.labels = Some([(LABEL_SERVICE_PROXY_NAME.to_string(), "other".to_string())].into());
        service(&mut svc);
        assert!(!model::is_proxied(&svc));
        let mut v = slice_json("IPv4", &["10.1.0.1"]);
        v["metadata"]["labels"][LABEL_HEADLESS] = json!("");
        let slice = read_slice(&v);
        assert!(slice.metadata.labels.as_ref().unwrap().contains_key(LABEL_HEADLESS));
        let mut n: Node = serde_json::from_value(json!({"metadata": {"name": "n", "resourceVersion": "1",
            "labels": {LABEL_ZONE: "z2", "kubernetes.io/hostname": "n"}, "deletionTimestamp": "2026-11-28T00:00:00Z"},
            "spec": {"podCIDR": "10.244.0.0/24", "taints": [{"key": "ToBeDeletedByClusterAutoscaler", "effect": "NoSchedule"}]},
            "status": {"capacity": {"cpu": "2"}}}))
        .unwrap();
        node(&mut n);
        let (info, eligible) = crate::controller::node_info("n", Some(&n));
        assert_eq!(info.zone.as_deref(), Some("z2"));
        assert!(!eligible);
        assert!(n.status.is_none() && n.spec.as_ref().unwrap().pod_cidr.is_none());
    }
}
