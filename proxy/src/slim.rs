//! What ferro-proxy keeps of the objects it watches: the informers pass every Service,
//! EndpointSlice and Node through these transforms before caching them
//! ([`ferro_runtime::Informer::with_transform`]), so that at 10,000 Services and 100,000
//! endpoints the caches hold the fields the model reads and nothing else — no managedFields,
//! no targetRef of every endpoint, no selector, no annotations of other tools. Every field
//! [`crate::model`] and the controller read is kept; the tests below build the model from an
//! object before and after its transform and compare.

use k8s_openapi::api::core::v1::{Node, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use std::collections::BTreeMap;

use crate::model::{LABEL_HEADLESS, LABEL_SERVICE_NAME, LABEL_SERVICE_PROXY_NAME, LABEL_ZONE};

/// The Service annotations the model reads.
const SERVICE_ANNOTATIONS: &[&str] = &[
    "service.kubernetes.io/topology-mode",
    "service.kubernetes.io/topology-aware-hints",
    "service.beta.kubernetes.io/load-balancer-source-ranges",
];

/// The EndpointSlice annotation the controller reads (network programming latency).
const SLICE_ANNOTATIONS: &[&str] = &["endpoints.kubernetes.io/last-change-trigger-time"];

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

/// A Service as the model reads it.
pub fn service(svc: &mut Service) {
    slim_meta(&mut svc.metadata, &[LABEL_SERVICE_PROXY_NAME], SERVICE_ANNOTATIONS);
    if let Some(spec) = &mut svc.spec {
        spec.selector = None;
        spec.ip_families = None;
        spec.ip_family_policy = None;
        spec.allocate_load_balancer_node_ports = None;
        spec.load_balancer_class = None;
        spec.load_balancer_ip = None;
        spec.publish_not_ready_addresses = None;
        spec.external_name = None;
        for p in spec.ports.iter_mut().flatten() {
            p.app_protocol = None;
            p.target_port = None;
        }
    }
    if let Some(status) = &mut svc.status {
        status.conditions = None;
        for ing in status.load_balancer.iter_mut().flat_map(|l| l.ingress.iter_mut().flatten()) {
            ing.hostname = None;
            ing.ports = None;
        }
    }
}

/// An EndpointSlice as the model reads it: of each endpoint its first address (the only one
/// that counts), conditions, node name, zone and zone hints.
pub fn endpoint_slice(slice: &mut EndpointSlice) {
    slim_meta(&mut slice.metadata, &[LABEL_SERVICE_NAME, LABEL_SERVICE_PROXY_NAME, LABEL_HEADLESS], SLICE_ANNOTATIONS);
    for ep in &mut slice.endpoints {
        ep.addresses.truncate(1);
        ep.addresses.shrink_to_fit();
        ep.target_ref = None;
        ep.hostname = None;
        ep.deprecated_topology = None;
        if let Some(h) = &mut ep.hints {
            h.for_nodes = None;
        }
    }
    for p in slice.ports.iter_mut().flatten() {
        p.app_protocol = None;
    }
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

    fn full_slice(family: &str, addrs: &[&str]) -> EndpointSlice {
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
        serde_json::from_value(json!({
            "metadata": {"namespace": "ns", "name": format!("web-{family}"), "resourceVersion": "9", "uid": "s-1",
                "labels": {"kubernetes.io/service-name": "web", "endpointslice.kubernetes.io/managed-by": "x"},
                "annotations": {"endpoints.kubernetes.io/last-change-trigger-time": "2026-11-28T00:00:00Z", "other": "1"},
                "ownerReferences": [{"apiVersion": "v1", "kind": "Service", "name": "web", "uid": "u-1"}],
                "managedFields": [{"manager": "ctl", "operation": "Update", "fieldsType": "FieldsV1", "fieldsV1": {"f:endpoints": {}}}]},
            "addressType": family,
            "ports": [{"name": "http", "port": 8080, "protocol": "TCP", "appProtocol": "http"},
                      {"name": "dns", "port": 5353, "protocol": "UDP"}],
            "endpoints": eps,
        }))
        .unwrap()
    }

    #[test]
    fn the_slim_objects_give_the_same_model() {
        let svc = full_service();
        let slices = [full_slice("IPv4", &["10.1.0.1", "10.1.0.2", "not-an-ip"]), full_slice("IPv6", &["fd00::1", "10.1.0.9"])];
        let mut slim_svc = svc.clone();
        service(&mut slim_svc);
        let slim_slices: Vec<EndpointSlice> = slices
            .iter()
            .map(|s| {
                let mut s = s.clone();
                endpoint_slice(&mut s);
                s
            })
            .collect();
        for node_zone in [None, Some("z1".to_string())] {
            let node = NodeInfo { name: "node-a".into(), zone: node_zone };
            for family in [Family::V4, Family::V6] {
                let full = model::build(family, &[Arc::new(svc.clone())], &slices.iter().cloned().map(Arc::new).collect::<Vec<_>>(), &node);
                let slim = model::build(family, &[Arc::new(slim_svc.clone())], &slim_slices.iter().cloned().map(Arc::new).collect::<Vec<_>>(), &node);
                assert_eq!(full, slim, "{family:?}");
                assert!(!full.0.services.is_empty());
            }
        }
        // and what went
        assert!(slim_svc.metadata.managed_fields.is_none() && slim_svc.spec.as_ref().unwrap().selector.is_none());
        assert_eq!(slim_svc.metadata.uid.as_deref(), Some("u-1"));
        assert_eq!(slim_svc.metadata.labels, None);
        assert_eq!(slim_svc.metadata.annotations.as_ref().unwrap().len(), 2);
        let s = &slim_slices[0];
        assert!(s.metadata.managed_fields.is_none() && s.metadata.owner_references.is_none());
        assert_eq!(s.metadata.labels.as_ref().unwrap().len(), 1);
        assert_eq!(s.metadata.annotations.as_ref().unwrap().len(), 1);
        assert!(s.endpoints.iter().all(|e| e.target_ref.is_none() && e.addresses.len() == 1));
        assert_eq!(s.metadata.resource_version.as_deref(), Some("9"));
    }

    #[test]
    fn the_labels_that_exclude_an_object_stay() {
        let mut svc = full_service();
        svc.metadata.labels = Some([(LABEL_SERVICE_PROXY_NAME.to_string(), "other".to_string())].into());
        service(&mut svc);
        assert!(!model::is_proxied(&svc));
        let mut slice = full_slice("IPv4", &["10.1.0.1"]);
        slice.metadata.labels.as_mut().unwrap().insert(LABEL_HEADLESS.into(), String::new());
        endpoint_slice(&mut slice);
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
