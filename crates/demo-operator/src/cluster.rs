//! The narrow interface between the operator's decisions and the API: observe a Website's
//! Deployment and Service, apply one [`Op`]. [`KubeCluster`] is the real one (a kube client);
//! [`FakeCluster`] keeps objects in memory and records every op, for tests that need nothing
//! running.

use std::collections::BTreeMap;
use std::sync::Mutex;

use async_trait::async_trait;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::Service;
use kube::api::{Patch, PatchParams, PostParams};
use kube::Api;
use serde_json::json;

use crate::plan::{Observed, Op};
use crate::website::Website;

/// The field manager named in the operator's writes.
pub const FIELD_MANAGER: &str = "ferro-demo-operator";

/// Every request the operator makes, as RBAC sees it: (API group, resource, verbs). The
/// controller lists and watches Websites and (by label) Deployments and Services;
/// [`KubeCluster`] gets, creates and patches those two and patches `websites/status`. The
/// ClusterRole in deploy/demo-operator/operator.yaml grants exactly this (a test checks).
pub const PERMISSIONS: &[(&str, &str, &[&str])] = &[
    ("demo.ferro.dev", "websites", &["list", "watch"]),
    ("demo.ferro.dev", "websites/status", &["patch"]),
    (
        "apps",
        "deployments",
        &["get", "list", "watch", "create", "patch"],
    ),
    ("", "services", &["get", "list", "watch", "create", "patch"]),
];

#[derive(Debug, thiserror::Error)]
pub enum ClusterError {
    #[error("get {kind} {namespace}/{name}: {source}")]
    Get {
        kind: &'static str,
        namespace: String,
        name: String,
        #[source]
        source: kube::Error,
    },
    #[error("{op} {namespace}/{name}: {source}")]
    Write {
        op: &'static str,
        namespace: String,
        name: String,
        #[source]
        source: kube::Error,
    },
}

/// Reads and writes of one Website's objects.
#[async_trait]
pub trait Cluster: Send + Sync + 'static {
    /// The Deployment and Service named `name` in `namespace` (None: not found).
    async fn observe(&self, namespace: &str, name: &str) -> Result<Observed, ClusterError>;
    /// Applies `op` for the Website `name` in `namespace`.
    async fn apply(&self, namespace: &str, name: &str, op: &Op) -> Result<(), ClusterError>;
}

/// The real cluster, through a kube client.
#[derive(Clone)]
pub struct KubeCluster {
    client: kube::Client,
}

impl KubeCluster {
    pub fn new(client: kube::Client) -> Self {
        Self { client }
    }
}

#[async_trait]
impl Cluster for KubeCluster {
    async fn observe(&self, namespace: &str, name: &str) -> Result<Observed, ClusterError> {
        let get = |kind, source| ClusterError::Get {
            kind,
            namespace: namespace.to_string(),
            name: name.to_string(),
            source,
        };
        let deployments: Api<Deployment> = Api::namespaced(self.client.clone(), namespace);
        let services: Api<Service> = Api::namespaced(self.client.clone(), namespace);
        Ok(Observed {
            deployment: deployments
                .get_opt(name)
                .await
                .map_err(|e| get("deployment", e))?,
            service: services
                .get_opt(name)
                .await
                .map_err(|e| get("service", e))?,
        })
    }

    async fn apply(&self, namespace: &str, name: &str, op: &Op) -> Result<(), ClusterError> {
        let write = |op, source| ClusterError::Write {
            op,
            namespace: namespace.to_string(),
            name: name.to_string(),
            source,
        };
        let post = PostParams {
            field_manager: Some(FIELD_MANAGER.into()),
            ..PostParams::default()
        };
        let patch = PatchParams {
            field_manager: Some(FIELD_MANAGER.into()),
            ..PatchParams::default()
        };
        let deployments: Api<Deployment> = Api::namespaced(self.client.clone(), namespace);
        let services: Api<Service> = Api::namespaced(self.client.clone(), namespace);
        let websites: Api<Website> = Api::namespaced(self.client.clone(), namespace);
        match op {
            Op::CreateDeployment(d) => deployments
                .create(&post, d)
                .await
                .map(drop)
                .map_err(|e| write("create deployment", e)),
            Op::PatchDeployment { name, patch: body } => deployments
                .patch(name, &patch, &Patch::Merge(body))
                .await
                .map(drop)
                .map_err(|e| write("patch deployment", e)),
            Op::CreateService(s) => services
                .create(&post, s)
                .await
                .map(drop)
                .map_err(|e| write("create service", e)),
            Op::PatchService { name, patch: body } => services
                .patch(name, &patch, &Patch::Merge(body))
                .await
                .map(drop)
                .map_err(|e| write("patch service", e)),
            Op::UpdateStatus(status) => websites
                .patch_status(name, &patch, &Patch::Merge(json!({ "status": status })))
                .await
                .map(drop)
                .map_err(|e| write("update website status", e)),
        }
    }
}

/// An in-memory cluster: objects by `<namespace>/<name>`, every applied op recorded. Creates
/// store the object as given; patches and status writes are recorded only (the tests look at
/// the ops, and set what the next observation returns themselves).
#[derive(Default)]
pub struct FakeCluster {
    pub objects: Mutex<BTreeMap<String, Observed>>,
    pub applied: Mutex<Vec<(String, Op)>>,
}

impl FakeCluster {
    /// Sets what `observe` returns for `<namespace>/<name>`.
    pub fn set(&self, key: &str, observed: Observed) {
        self.lock_objects().insert(key.to_string(), observed);
    }

    /// The ops applied so far, with the Website's key, and forgets them.
    pub fn take_applied(&self) -> Vec<(String, Op)> {
        std::mem::take(&mut *self.applied.lock().unwrap_or_else(|e| e.into_inner()))
    }

    fn lock_objects(&self) -> std::sync::MutexGuard<'_, BTreeMap<String, Observed>> {
        self.objects.lock().unwrap_or_else(|e| e.into_inner())
    }
}

#[async_trait]
impl Cluster for FakeCluster {
    async fn observe(&self, namespace: &str, name: &str) -> Result<Observed, ClusterError> {
        Ok(self
            .lock_objects()
            .get(&format!("{namespace}/{name}"))
            .cloned()
            .unwrap_or_default())
    }

    async fn apply(&self, namespace: &str, name: &str, op: &Op) -> Result<(), ClusterError> {
        let key = format!("{namespace}/{name}");
        {
            let mut objects = self.lock_objects();
            let entry = objects.entry(key.clone()).or_default();
            match op {
                Op::CreateDeployment(d) => entry.deployment = Some((**d).clone()),
                Op::CreateService(s) => entry.service = Some((**s).clone()),
                Op::PatchDeployment { .. } | Op::PatchService { .. } | Op::UpdateStatus(_) => {}
            }
        }
        self.applied
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push((key, op.clone()));
        Ok(())
    }
}
