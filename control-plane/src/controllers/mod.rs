//! The scheduler and the controllers: informers over the API, work queues, and pure planners
//! from observed objects to actions. Each loop is a folder: `plan.rs` the pure planner, `mod.rs`
//! the executor (`start`: informers -> pure `keys_for_*` mappers -> work queue -> a named
//! `reconcile` per key, in a span carrying the key). Executors only talk to the Kubernetes API
//! through a kube client, so they work against any API server.

pub mod daemonset;
pub mod clock;
pub mod clusterroleaggregation;
pub mod bootstrapsigner;
pub mod cronjob;
pub mod csrapproving;
pub mod csrcleaner;
pub mod csrsigning;
pub mod deployment;
pub mod disruption;
pub mod endpointslice;
pub mod expectations;
pub mod explain;
pub mod gc;
pub mod history;
pub mod job;
pub mod manager;
pub mod namespace;
pub mod nodeipam;
pub mod nodelifecycle;
pub mod podgc;
pub mod pvbinder;
pub mod quantity;
pub mod replicaset;
pub mod rootca;
pub mod satoken;
pub mod scheduler;
pub mod serviceaccount;
pub mod snapshot;
pub mod statefulset;
pub mod tokencleaner;
pub mod ttlafterfinished;

/// Why a reconcile failed; the key is retried with backoff.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error(transparent)]
    Kube(#[from] kube::Error),
    #[error("{0}")]
    Other(String),
}

/// Whether a kube error is the API's 404.
pub fn is_not_found(e: &kube::Error) -> bool {
    matches!(e, kube::Error::Api(s) if s.code == 404)
}

/// Whether a kube error is the API's 409 (conflict or already exists).
pub fn is_conflict(e: &kube::Error) -> bool {
    matches!(e, kube::Error::Api(s) if s.code == 409)
}
