//! snapshot.storage.k8s.io: the volume snapshot API of the CSI external-snapshotter.

pub mod v1;
