//! CustomResourceDefinitions (apiextensions.k8s.io/v1): the kinds users add.
//!
//! - [`definition`]: validation of a CRD object (names, versions, schemas, printer columns,
//!   subresources) and the served [`Resource`]s it defines;
//! - [`schema`]: structural schemas (validation, pruning, defaulting of custom objects);
//! - [`registry`]: the custom resources this API server serves now (shared by every request);
//! - [`controller`]: the loop in every API server that keeps the registry in step with the
//!   stored CRDs, writes their status (NamesAccepted, Established, storedVersions) and deletes
//!   the custom objects of a CRD being deleted before letting it go;
//! - [`objects`]: what happens to a custom object on write (decode, defaults, validation) and
//!   on read through a version other than the storage version.

pub mod controller;
pub mod definition;
pub mod objects;
pub mod registry;
pub mod schema;

use crate::resources::Resource;

/// The finalizer upstream puts on every CRD: its custom objects are deleted before it goes.
pub const CLEANUP_FINALIZER: &str = "customresourcecleanup.apiextensions.k8s.io";

/// What the API server knows of a custom resource's version beyond [`Resource`].
#[derive(Debug)]
pub struct Custom {
    /// The CRD's name (`<plural>.<group>`).
    pub crd: &'static str,
    /// The version objects are stored in (conversion None: only apiVersion differs).
    pub storage_version: &'static str,
    pub schema: schema::Schema,
    /// The version's openAPIV3Schema as written (served in OpenAPI for `kubectl explain`).
    pub raw_schema: serde_json::Value,
    pub scale: Option<ScalePaths>,
    pub columns: Vec<Column>,
    /// The `list` kind (`spec.names.listKind`).
    pub list_kind: &'static str,
}

/// spec.versions[].subresources.scale.
#[derive(Debug, Clone)]
pub struct ScalePaths {
    pub spec_replicas: String,
    pub status_replicas: String,
    pub label_selector: Option<String>,
}

/// spec.versions[].additionalPrinterColumns[].
#[derive(Debug, Clone)]
pub struct Column {
    pub name: String,
    pub ty: String,
    pub format: String,
    pub description: String,
    pub priority: i64,
    pub json_path: String,
}

/// The apiextensions.k8s.io CRD resource.
pub fn crd_resource() -> Option<&'static Resource> {
    crate::resources::find("apiextensions.k8s.io", "v1", "customresourcedefinitions")
}

/// A JSON pointer (`/spec/replicas`) of a simple JSONPath (`.spec.replicas`) as scale paths use.
pub fn pointer_of(path: &str) -> String {
    path.split('.').filter(|s| !s.is_empty()).fold(String::new(), |mut acc, seg| {
        acc.push('/');
        acc.push_str(&seg.replace('~', "~0").replace('/', "~1"));
        acc
    })
}
