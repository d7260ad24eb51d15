//! The CSI v1 services (package `csi.v1`) and kubelet's plugin registration service (package
//! `pluginregistration`), generated from this crate's own .proto files. Shared by ferro-csi
//! (which serves both) and ferro-agent (which calls both).
#![allow(clippy::all, missing_docs)]

pub mod csi {
    tonic::include_proto!("csi.v1");
}

pub mod registration {
    tonic::include_proto!("pluginregistration");
}
