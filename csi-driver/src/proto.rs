//! The CSI v1 messages and services, generated from proto/csi.proto by build.rs.
#![allow(clippy::all, missing_docs)]

tonic::include_proto!("csi.v1");
