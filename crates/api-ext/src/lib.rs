//! Kubernetes API kinds that k8s-openapi does not carry (upstream defines them as
//! CustomResourceDefinitions), with the same traits k8s-openapi's kinds implement, so that
//! `kube::Api`, the shared informers and the control plane's typed normalisation take them as
//! they take any built-in kind.
//!
//! - [`snapshot::v1`]: snapshot.storage.k8s.io/v1 VolumeSnapshotClass, VolumeSnapshot,
//!   VolumeSnapshotContent, field for field as the external-snapshotter's v1 API.

pub mod snapshot;
