//! The table of served resources: names, scope, subresources and typed decoding.

use api_ext::snapshot;
use k8s_openapi::api::{apps, batch, certificates, coordination, core, discovery, policy, rbac, storage};
use serde_json::Value;

/// A subresource served under a resource.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Sub {
    Status,
    Scale,
    Binding,
    Eviction,
    Log,
    Exec,
    Attach,
    PortForward,
    Finalize,
    /// serviceaccounts/token: the TokenRequest API.
    Token,
    /// certificatesigningrequests/approval: the Approved/Denied conditions.
    Approval,
}

impl Sub {
    pub fn name(self) -> &'static str {
        match self {
            Sub::Status => "status",
            Sub::Scale => "scale",
            Sub::Binding => "binding",
            Sub::Eviction => "eviction",
            Sub::Log => "log",
            Sub::Exec => "exec",
            Sub::Attach => "attach",
            Sub::PortForward => "portforward",
            Sub::Finalize => "finalize",
            Sub::Token => "token",
            Sub::Approval => "approval",
        }
    }
}

/// Decodes JSON into the typed object and encodes it back: the result has exactly the shape an
/// upstream server stores (unknown fields dropped, nulls removed).
pub type Normalize = fn(Value) -> Result<Value, serde_json::Error>;

pub struct Resource {
    pub group: &'static str,
    pub version: &'static str,
    pub kind: &'static str,
    pub plural: &'static str,
    pub singular: &'static str,
    pub namespaced: bool,
    pub short_names: &'static [&'static str],
    pub categories: &'static [&'static str],
    pub subresources: &'static [Sub],
    /// metadata.generation is maintained (bumped on spec changes).
    pub generation: bool,
    pub normalize: Normalize,
    /// Set for kinds served from a CustomResourceDefinition (crate::crd).
    pub custom: Option<&'static crate::crd::Custom>,
}

impl Resource {
    pub fn api_version(&self) -> String {
        if self.group.is_empty() {
            self.version.to_string()
        } else {
            format!("{}/{}", self.group, self.version)
        }
    }

    /// Whether this is the built-in resource with this plural (a custom resource may share
    /// a built-in's plural in another group).
    pub fn is(&self, plural: &str) -> bool {
        self.custom.is_none() && self.plural == plural
    }

    /// The kind of a list of these (`spec.names.listKind` for custom resources).
    pub fn list_kind(&self) -> String {
        match self.custom {
            Some(c) => c.list_kind.to_string(),
            None => format!("{}List", self.kind),
        }
    }

    pub fn has(&self, sub: Sub) -> bool {
        self.subresources.contains(&sub)
    }

    /// `group/resource` as upstream writes it in messages ("deployments.apps", "pods").
    pub fn group_resource(&self) -> String {
        if self.group.is_empty() {
            self.plural.to_string()
        } else {
            format!("{}.{}", self.plural, self.group)
        }
    }

    /// The store key prefix of this resource in a namespace (or across all namespaces).
    pub fn prefix(&self, namespace: Option<&str>) -> String {
        let group = if self.group.is_empty() { "core" } else { self.group };
        match namespace {
            Some(ns) if self.namespaced => format!("/{group}/{}/{ns}/", self.plural),
            _ => format!("/{group}/{}/", self.plural),
        }
    }

    pub fn key(&self, namespace: Option<&str>, name: &str) -> String {
        let mut k = self.prefix(namespace);
        k.push_str(name);
        k
    }
}

fn roundtrip<T: serde::de::DeserializeOwned + serde::Serialize>(
    v: Value,
) -> Result<Value, serde_json::Error> {
    let typed: T = serde_json::from_value(v)?;
    serde_json::to_value(typed)
}

use Sub::*;

macro_rules! res {
    ($group:expr, $version:expr, $kind:expr, $plural:expr, $singular:expr, $ns:expr, $ty:ty,
     short: [$($short:expr),*], cat: [$($cat:expr),*], sub: [$($sub:expr),*], gen: $gen:expr) => {
        Resource {
            group: $group,
            version: $version,
            kind: $kind,
            plural: $plural,
            singular: $singular,
            namespaced: $ns,
            short_names: &[$($short),*],
            categories: &[$($cat),*],
            subresources: &[$($sub),*],
            generation: $gen,
            normalize: roundtrip::<$ty>,
            custom: None,
        }
    };
}

pub static RESOURCES: &[Resource] = &[
    res!("", "v1", "Namespace", "namespaces", "namespace", false, core::v1::Namespace,
        short: ["ns"], cat: [], sub: [Status, Finalize], gen: false),
    res!("", "v1", "Node", "nodes", "node", false, core::v1::Node,
        short: ["no"], cat: [], sub: [Status], gen: false),
    res!("", "v1", "Pod", "pods", "pod", true, core::v1::Pod,
        short: ["po"], cat: ["all"], sub: [Status, Binding, Eviction, Log, Exec, Attach, PortForward], gen: true),
    res!("", "v1", "Service", "services", "service", true, core::v1::Service,
        short: ["svc"], cat: ["all"], sub: [Status], gen: false),
    res!("", "v1", "Endpoints", "endpoints", "endpoints", true, core::v1::Endpoints,
        short: ["ep"], cat: [], sub: [], gen: false),
    res!("", "v1", "ConfigMap", "configmaps", "configmap", true, core::v1::ConfigMap,
        short: ["cm"], cat: [], sub: [], gen: false),
    res!("", "v1", "Secret", "secrets", "secret", true, core::v1::Secret,
        short: [], cat: [], sub: [], gen: false),
    res!("", "v1", "ServiceAccount", "serviceaccounts", "serviceaccount", true, core::v1::ServiceAccount,
        short: ["sa"], cat: [], sub: [Token], gen: false),
    res!("", "v1", "Event", "events", "event", true, core::v1::Event,
        short: ["ev"], cat: [], sub: [], gen: false),
    res!("", "v1", "PersistentVolume", "persistentvolumes", "persistentvolume", false, core::v1::PersistentVolume,
        short: ["pv"], cat: [], sub: [Status], gen: false),
    res!("", "v1", "PersistentVolumeClaim", "persistentvolumeclaims", "persistentvolumeclaim", true, core::v1::PersistentVolumeClaim,
        short: ["pvc"], cat: [], sub: [Status], gen: false),
    res!("discovery.k8s.io", "v1", "EndpointSlice", "endpointslices", "endpointslice", true, discovery::v1::EndpointSlice,
        short: [], cat: [], sub: [], gen: true),
    res!("coordination.k8s.io", "v1", "Lease", "leases", "lease", true, coordination::v1::Lease,
        short: [], cat: [], sub: [], gen: false),
    res!("storage.k8s.io", "v1", "StorageClass", "storageclasses", "storageclass", false, storage::v1::StorageClass,
        short: ["sc"], cat: [], sub: [], gen: false),
    res!("storage.k8s.io", "v1", "CSIDriver", "csidrivers", "csidriver", false, storage::v1::CSIDriver,
        short: [], cat: [], sub: [], gen: false),
    res!("storage.k8s.io", "v1", "CSINode", "csinodes", "csinode", false, storage::v1::CSINode,
        short: [], cat: [], sub: [], gen: false),
    res!("storage.k8s.io", "v1", "VolumeAttachment", "volumeattachments", "volumeattachment", false, storage::v1::VolumeAttachment,
        short: [], cat: [], sub: [Status], gen: false),
    res!("storage.k8s.io", "v1", "CSIStorageCapacity", "csistoragecapacities", "csistoragecapacity", true, storage::v1::CSIStorageCapacity,
        short: [], cat: [], sub: [], gen: false),
    // Upstream serves these from the external-snapshotter's CustomResourceDefinitions.
    res!("snapshot.storage.k8s.io", "v1", "VolumeSnapshotClass", "volumesnapshotclasses", "volumesnapshotclass", false, snapshot::v1::VolumeSnapshotClass,
        short: ["vsclass", "vsclasses"], cat: [], sub: [], gen: true),
    res!("snapshot.storage.k8s.io", "v1", "VolumeSnapshot", "volumesnapshots", "volumesnapshot", true, snapshot::v1::VolumeSnapshot,
        short: ["vs"], cat: [], sub: [Status], gen: true),
    res!("snapshot.storage.k8s.io", "v1", "VolumeSnapshotContent", "volumesnapshotcontents", "volumesnapshotcontent", false, snapshot::v1::VolumeSnapshotContent,
        short: ["vsc", "vscs"], cat: [], sub: [Status], gen: true),
    res!("apps", "v1", "Deployment", "deployments", "deployment", true, apps::v1::Deployment,
        short: ["deploy"], cat: ["all"], sub: [Status, Scale], gen: true),
    res!("apps", "v1", "ReplicaSet", "replicasets", "replicaset", true, apps::v1::ReplicaSet,
        short: ["rs"], cat: ["all"], sub: [Status, Scale], gen: true),
    res!("apps", "v1", "DaemonSet", "daemonsets", "daemonset", true, apps::v1::DaemonSet,
        short: ["ds"], cat: ["all"], sub: [Status], gen: true),
    res!("apps", "v1", "StatefulSet", "statefulsets", "statefulset", true, apps::v1::StatefulSet,
        short: ["sts"], cat: ["all"], sub: [Status, Scale], gen: true),
    res!("apps", "v1", "ControllerRevision", "controllerrevisions", "controllerrevision", true, apps::v1::ControllerRevision,
        short: [], cat: [], sub: [], gen: false),
    res!("batch", "v1", "Job", "jobs", "job", true, batch::v1::Job,
        short: [], cat: ["all"], sub: [Status], gen: true),
    res!("batch", "v1", "CronJob", "cronjobs", "cronjob", true, batch::v1::CronJob,
        short: ["cj"], cat: ["all"], sub: [Status], gen: true),
    res!("apiextensions.k8s.io", "v1", "CustomResourceDefinition", "customresourcedefinitions", "customresourcedefinition", false,
        k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition,
        short: ["crd", "crds"], cat: ["api-extensions"], sub: [Status], gen: true),
    res!("policy", "v1", "PodDisruptionBudget", "poddisruptionbudgets", "poddisruptionbudget", true, policy::v1::PodDisruptionBudget,
        short: ["pdb"], cat: [], sub: [Status], gen: true),
    res!("certificates.k8s.io", "v1", "CertificateSigningRequest", "certificatesigningrequests", "certificatesigningrequest", false, certificates::v1::CertificateSigningRequest,
        short: ["csr"], cat: [], sub: [Status, Approval], gen: false),
    res!("rbac.authorization.k8s.io", "v1", "ClusterRole", "clusterroles", "clusterrole", false, rbac::v1::ClusterRole,
        short: [], cat: [], sub: [], gen: false),
    res!("rbac.authorization.k8s.io", "v1", "ClusterRoleBinding", "clusterrolebindings", "clusterrolebinding", false, rbac::v1::ClusterRoleBinding,
        short: [], cat: [], sub: [], gen: false),
    res!("rbac.authorization.k8s.io", "v1", "Role", "roles", "role", true, rbac::v1::Role,
        short: [], cat: [], sub: [], gen: false),
    res!("rbac.authorization.k8s.io", "v1", "RoleBinding", "rolebindings", "rolebinding", true, rbac::v1::RoleBinding,
        short: [], cat: [], sub: [], gen: false),
];

/// Every served resource: the built-in ones, then those of CustomResourceDefinitions.
pub fn all() -> Vec<&'static Resource> {
    let custom = crate::crd::registry::served();
    RESOURCES.iter().chain(custom.iter().copied()).collect()
}

/// Looks a resource up by group, version and plural name.
pub fn find(group: &str, version: &str, plural: &str) -> Option<&'static Resource> {
    RESOURCES
        .iter()
        .find(|r| r.group == group && r.version == version && r.plural == plural)
        .or_else(|| crate::crd::registry::served().iter().copied().find(|r| r.group == group && r.version == version && r.plural == plural))
}

/// The resource of a kind: for a custom kind served in several versions, the storage version.
pub fn by_kind(group: &str, kind: &str) -> Option<&'static Resource> {
    RESOURCES.iter().find(|r| r.group == group && r.kind == kind).or_else(|| {
        let custom = crate::crd::registry::served();
        let mut matching = custom.iter().copied().filter(|r| r.group == group && r.kind == kind);
        let first = matching.next()?;
        Some(std::iter::once(first).chain(matching).find(|r| r.custom.is_some_and(|c| c.storage_version == r.version)).unwrap_or(first))
    })
}

/// The group/versions served, in discovery order (core "v1" first).
pub fn group_versions() -> Vec<(&'static str, &'static str)> {
    let mut out: Vec<(&'static str, &'static str)> = Vec::new();
    for r in all() {
        if !out.contains(&(r.group, r.version)) {
            out.push((r.group, r.version));
        }
    }
    out
}

/// Splits a key of [`Resource::key`] into (namespace, name) for the resource.
pub fn key_parts<'k>(r: &Resource, key: &'k str) -> (Option<&'k str>, &'k str) {
    let prefix = r.prefix(None);
    let rest = key.strip_prefix(prefix.as_str()).unwrap_or(key);
    if r.namespaced {
        match rest.split_once('/') {
            Some((ns, name)) => (Some(ns), name),
            None => (None, rest),
        }
    } else {
        (None, rest)
    }
}

/// Resource from a store key ("/core/pods/ns/name").
pub fn from_key(key: &str) -> Option<&'static Resource> {
    let mut parts = key.trim_start_matches('/').splitn(3, '/');
    let group = parts.next()?;
    let plural = parts.next()?;
    let group = if group == "core" { "" } else { group };
    RESOURCES.iter().find(|r| r.group == group && r.plural == plural).or_else(|| {
        let custom = crate::crd::registry::served();
        let mut matching = custom.iter().copied().filter(|r| r.group == group && r.plural == plural);
        let first = matching.next()?;
        Some(std::iter::once(first).chain(matching).find(|r| r.custom.is_some_and(|c| c.storage_version == r.version)).unwrap_or(first))
    })
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn keys_and_lookup() {
        let pods = find("", "v1", "pods").unwrap();
        assert_eq!(pods.key(Some("default"), "web"), "/core/pods/default/web");
        assert_eq!(key_parts(pods, "/core/pods/default/web"), (Some("default"), "web"));
        let nodes = find("", "v1", "nodes").unwrap();
        assert_eq!(nodes.key(None, "n1"), "/core/nodes/n1");
        assert_eq!(from_key("/apps/deployments/a/b").unwrap().kind, "Deployment");
        assert_eq!(find("apps", "v1", "deployments").unwrap().group_resource(), "deployments.apps");
    }

    #[test]
    fn normalize_drops_unknown_and_nulls() {
        let pods = find("", "v1", "pods").unwrap();
        let v = (pods.normalize)(serde_json::json!({
            "apiVersion": "v1", "kind": "Pod", "metadata": {"name": "a", "labels": null},
            "spec": {"containers": [{"name": "c", "image": "i", "bogus": 1}]}
        }))
        .unwrap();
        assert_eq!(v["metadata"], serde_json::json!({"name": "a"}));
        assert!(v["spec"]["containers"][0].get("bogus").is_none());
    }
}
