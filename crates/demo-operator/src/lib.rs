//! ferro-demo-operator: a small operator written with kube-rs, the proof that an operator built
//! with a standard client library runs unchanged in a pod on a ferro cluster (issue 16).
//!
//! It owns the custom resource `Website` (`demo.ferro.dev/v1`, [`website`]) and reconciles each
//! into a Deployment and a Service it controls, then reports the Deployment's ready replicas
//! and a `Ready` condition through the status subresource. The shape is ferro's:
//! - [`plan`]: pure decisions (desired objects, the ops that get there, the status);
//! - [`cluster`]: the narrow trait the ops go through, the kube client behind it and a
//!   recording fake;
//! - [`controller`]: kube-runtime's `Controller` with a named `reconcile` in a span per
//!   Website and an error policy.
//!
//! In a pod it uses the in-cluster configuration (`kube::Client::try_default()`: the service
//! account's token and CA under /var/run/secrets/kubernetes.io/serviceaccount and
//! `KUBERNETES_SERVICE_HOST`/`KUBERNETES_SERVICE_PORT`). Manifests: `deploy/demo-operator/`;
//! design: docs/design/demo-operator.md.

pub mod cluster;
pub mod controller;
pub mod plan;
pub mod website;
