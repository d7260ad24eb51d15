//! ferro-control-plane: a compact Kubernetes API server with an embedded, crash-safe store.

pub mod alloc;
pub mod api;
pub mod auth;
pub mod config;
pub mod controllers;
pub mod crd;
pub mod discovery;
pub mod error;
pub mod job_status;
pub mod leader_election;
pub mod managed;
pub mod pki;
pub mod protobuf;
pub mod proxy;
pub mod resources;
pub mod sa_admission;
pub mod sa_token;
pub mod selector;
pub mod server;
pub mod service_alloc;
pub mod smp;
pub mod store;
pub mod strategy;
pub mod subresources;
pub mod table;
pub mod validation;
