//! The CSI v1 messages and services (crate `ferro-csi-proto`).

pub use csi_proto::csi::*;
