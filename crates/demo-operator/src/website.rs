//! The `Website` custom resource (group `demo.ferro.dev`, version `v1`, namespaced): what a user
//! asks for (a static page served by `replicas` pods of `image` on `port`) and what the operator
//! reports back (ready replicas, a `Ready` condition).
//!
//! The CustomResourceDefinition is derived from these types (`Website::crd()`, kube's
//! `CustomResource` macro with schemars); `deploy/demo-operator/crd.yaml` is that definition
//! printed by `ferro-demo-operator crd`, and a test keeps the two equal.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// The API group of the Website kind.
pub const GROUP: &str = "demo.ferro.dev";
/// The condition type the operator maintains.
pub const READY: &str = "Ready";

/// A website: `replicas` pods of `image` serving `message` as their page on `port`, behind a
/// Service on port 80.
// kube's `printcolumn(...)` repeats `type_ = ...` per column, which clippy takes for a
// duplicated attribute.
#[allow(clippy::duplicated_attributes)]
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[kube(
    group = "demo.ferro.dev",
    version = "v1",
    kind = "Website",
    namespaced,
    status = "WebsiteStatus",
    derive = "PartialEq",
    shortname = "ws",
    category = "ferro-demo",
    doc = "A static website: a Deployment of pods serving spec.message over HTTP and a Service in front of them, kept by ferro-demo-operator",
    scale(
        spec_replicas_path = ".spec.replicas",
        status_replicas_path = ".status.replicas"
    ),
    printcolumn(
        name = "Replicas",
        type_ = "integer",
        json_path = ".spec.replicas",
        description = "pods asked for"
    ),
    printcolumn(
        name = "Ready",
        type_ = "integer",
        json_path = ".status.readyReplicas",
        description = "pods ready"
    ),
    printcolumn(
        name = "Status",
        type_ = "string",
        json_path = ".status.conditions[?(@.type==\"Ready\")].reason",
        description = "why the website is (not) ready"
    ),
    printcolumn(
        name = "Image",
        type_ = "string",
        json_path = ".spec.image",
        priority = 1
    ),
    printcolumn(
        name = "Age",
        type_ = "date",
        json_path = ".metadata.creationTimestamp"
    )
)]
#[serde(rename_all = "camelCase")]
pub struct WebsiteSpec {
    /// How many pods serve the page.
    #[serde(default = "default_replicas")]
    #[schemars(range(min = 0, max = 20))]
    pub replicas: i32,
    /// The image the pods run; it must provide `sh` and busybox's `httpd` (e.g. busybox).
    #[schemars(length(min = 1, max = 512))]
    pub image: String,
    /// The port the pods listen on (the Service's target port).
    #[serde(default = "default_port")]
    #[schemars(range(min = 1, max = 65535))]
    pub port: i32,
    /// The page the pods serve.
    #[serde(default)]
    #[schemars(length(max = 1024))]
    pub message: String,
}

fn default_replicas() -> i32 {
    1
}

fn default_port() -> i32 {
    8080
}

/// What the operator observed.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct WebsiteStatus {
    /// The Website's metadata.generation this status was computed from.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    /// Pods of the website's Deployment (any revision).
    #[serde(default)]
    pub replicas: i32,
    /// Pods of the website's Deployment that are ready.
    #[serde(default)]
    pub ready_replicas: i32,
    /// `Ready`: True when every pod asked for is ready and up to date.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["type"]))]
    pub conditions: Vec<Condition>,
}

impl Website {
    /// `<namespace>/<name>`, for logs and spans.
    pub fn key(&self) -> String {
        format!(
            "{}/{}",
            self.metadata.namespace.as_deref().unwrap_or(""),
            self.metadata.name.as_deref().unwrap_or("")
        )
    }
}
