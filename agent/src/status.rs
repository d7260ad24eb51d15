//! The executors: Node registration, the node Lease and node status posting.
//!
//! Each loop keeps retrying with backoff while the API server is unreachable and never exits.

use std::time::Duration;

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::api::core::v1::{Node, NodeStatus};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta, OwnerReference, Time};
use kube::api::{Patch, PatchParams, PostParams};
use kube::Api;
use tokio::sync::watch;

use crate::node::{self, HostFacts, NodeInput};

pub const LEASE_NAMESPACE: &str = "kube-node-lease";

/// Exponential backoff: 200 ms doubling up to `max`.
#[derive(Debug, Clone)]
pub struct Backoff {
    next: Duration,
    max: Duration,
}

impl Backoff {
    pub fn new(max: Duration) -> Self {
        Backoff { next: Duration::from_millis(200), max }
    }
    pub fn next_delay(&mut self) -> Duration {
        let d = self.next;
        self.next = (self.next * 2).min(self.max);
        d
    }
}

fn now() -> Time {
    Time(jiff::Timestamp::now())
}

fn is_status(e: &kube::Error, code: u16) -> bool {
    matches!(e, kube::Error::Api(s) if s.code == code)
}

/// Registers the Node: create, or on AlreadyExists update labels and status as upstream does on
/// re-registration. Retries until it succeeds; returns the Node's uid.
pub async fn register(client: kube::Client, desired: &Node) -> Option<String> {
    let api: Api<Node> = Api::all(client);
    let name = desired.metadata.name.clone().unwrap_or_default();
    let mut backoff = Backoff::new(Duration::from_secs(7));
    loop {
        match try_register(&api, &name, desired).await {
            Ok(uid) => {
                tracing::info!(node = %name, "node registered");
                return uid;
            }
            Err(e) => {
                let d = backoff.next_delay();
                tracing::warn!(node = %name, error = %e, retry_in = ?d, "unable to register node");
                tokio::time::sleep(d).await;
            }
        }
    }
}

async fn try_register(api: &Api<Node>, name: &str, desired: &Node) -> Result<Option<String>, kube::Error> {
    match api.create(&PostParams::default(), desired).await {
        Ok(created) => {
            // The create drops status as upstream; post it through the subresource.
            let status = serde_json::json!({ "status": desired.status });
            api.patch_status(name, &PatchParams::default(), &Patch::Merge(&status)).await?;
            Ok(created.metadata.uid)
        }
        Err(e) if is_status(&e, 409) => {
            tracing::info!(node = %name, "node already exists, updating it");
            let labels = serde_json::json!({ "metadata": { "labels": desired.metadata.labels } });
            let existing = api.patch(name, &PatchParams::default(), &Patch::Merge(&labels)).await?;
            let status = serde_json::json!({ "status": desired.status });
            api.patch_status(name, &PatchParams::default(), &Patch::Strategic(&status)).await?;
            Ok(existing.metadata.uid)
        }
        Err(e) => Err(e),
    }
}

/// The Lease for `node` renewed at `now`, keeping the existing object's metadata.
pub fn renewed_lease(existing: Option<Lease>, node: &str, duration_seconds: i32, node_uid: Option<&str>, now: MicroTime) -> Lease {
    let mut lease = existing.unwrap_or_else(|| Lease {
        metadata: ObjectMeta {
            name: Some(node.to_string()),
            namespace: Some(LEASE_NAMESPACE.to_string()),
            ..Default::default()
        },
        spec: None,
    });
    if let Some(uid) = node_uid {
        if lease.metadata.owner_references.as_ref().is_none_or(|o| o.is_empty()) {
            lease.metadata.owner_references = Some(vec![OwnerReference {
                api_version: "v1".into(),
                kind: "Node".into(),
                name: node.to_string(),
                uid: uid.to_string(),
                ..Default::default()
            }]);
        }
    }
    let spec = lease.spec.get_or_insert_with(LeaseSpec::default);
    spec.holder_identity = Some(node.to_string());
    spec.lease_duration_seconds = Some(duration_seconds);
    spec.renew_time = Some(now);
    lease
}

/// Creates or renews the node Lease every `interval`, forever.
pub async fn lease_loop(client: kube::Client, node: String, duration_seconds: i32, interval: Duration, node_uid: Option<String>) {
    let api: Api<Lease> = Api::namespaced(client, LEASE_NAMESPACE);
    let mut backoff = Backoff::new(Duration::from_secs(7));
    loop {
        match renew_once(&api, &node, duration_seconds, node_uid.as_deref()).await {
            Ok(()) => {
                backoff = Backoff::new(Duration::from_secs(7));
                tokio::time::sleep(interval).await;
            }
            Err(e) => {
                let d = backoff.next_delay().min(interval);
                tracing::warn!(node = %node, error = %e, retry_in = ?d, "failed to renew the node lease");
                tokio::time::sleep(d).await;
            }
        }
    }
}

async fn renew_once(api: &Api<Lease>, node: &str, duration_seconds: i32, uid: Option<&str>) -> Result<(), kube::Error> {
    // A 409 means someone else wrote it in between: re-read and retry at once, a few times.
    let mut attempt = 0;
    loop {
        attempt += 1;
        let existing = api.get_opt(node).await?;
        let create = existing.is_none();
        let lease = renewed_lease(existing, node, duration_seconds, uid, MicroTime(jiff::Timestamp::now()));
        let res = if create {
            api.create(&PostParams::default(), &lease).await
        } else {
            api.replace(node, &PostParams::default(), &lease).await
        };
        match res {
            Ok(_) => return Ok(()),
            Err(e) if is_status(&e, 409) && attempt < 5 => continue,
            Err(e) => return Err(e),
        }
    }
}

/// Everything the status loop needs to compute the node status.
pub struct StatusSource {
    pub input: NodeInput,
    pub facts: HostFacts,
    /// The current health; the main loop updates it.
    pub health: watch::Receiver<node::Health>,
}

/// Posts the node status when it changes (checked every `update_every`) and at least every
/// `report_every`, forever.
pub async fn status_loop(client: kube::Client, src: StatusSource, update_every: Duration, report_every: Duration) {
    let arch = node::go_arch(std::env::consts::ARCH);
    let name = src.input.name.clone();
    let api = Api::<Node>::all(client);
    let mut last_posted: Option<(NodeStatus, tokio::time::Instant)> = None;
    let mut backoff = Backoff::new(Duration::from_secs(7));
    loop {
        let status = {
            let s = &src;
            let health = s.health.borrow().clone();
            let previous = last_posted
                .as_ref()
                .and_then(|(st, _)| st.conditions.clone())
                .unwrap_or_default();
            node::build_status(&s.input, &s.facts, arch, &health, &previous, &now())
        };
        let due = match &last_posted {
            None => true,
            Some((old, at)) => node::status_changed(old, &status) || at.elapsed() >= report_every,
        };
        if !due {
            tokio::time::sleep(update_every).await;
            continue;
        }
        let body = serde_json::json!({ "status": status });
        match api.patch_status(&name, &PatchParams::default(), &Patch::Strategic(&body)).await {
            Ok(_) => {
                tracing::info!(node = %name, "node status posted");
                last_posted = Some((status, tokio::time::Instant::now()));
                backoff = Backoff::new(Duration::from_secs(7));
                tokio::time::sleep(update_every).await;
            }
            Err(e) => {
                let d = backoff.next_delay();
                tracing::warn!(node = %name, error = %e, retry_in = ?d, "error updating node status");
                tokio::time::sleep(d).await;
            }
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn backoff_doubles_to_max() {
        let mut b = Backoff::new(Duration::from_secs(1));
        let v: Vec<_> = (0..5).map(|_| b.next_delay().as_millis()).collect();
        assert_eq!(v, vec![200, 400, 800, 1000, 1000]);
    }

    #[test]
    fn lease_renewal_keeps_metadata() {
        let t0 = MicroTime("2026-01-01T00:00:00Z".parse().unwrap());
        let fresh = renewed_lease(None, "n1", 40, Some("uid-1"), t0.clone());
        assert_eq!(fresh.metadata.name.as_deref(), Some("n1"));
        assert_eq!(fresh.metadata.namespace.as_deref(), Some(LEASE_NAMESPACE));
        assert_eq!(fresh.metadata.owner_references.as_ref().unwrap()[0].uid, "uid-1");
        let spec = fresh.spec.clone().unwrap();
        assert_eq!(spec.holder_identity.as_deref(), Some("n1"));
        assert_eq!(spec.lease_duration_seconds, Some(40));
        assert_eq!(spec.renew_time, Some(t0));
        let mut existing = fresh;
        existing.metadata.resource_version = Some("7".into());
        let t1 = MicroTime("2026-01-01T00:00:10Z".parse().unwrap());
        let renewed = renewed_lease(Some(existing), "n1", 8, None, t1.clone());
        assert_eq!(renewed.metadata.resource_version.as_deref(), Some("7"));
        assert_eq!(renewed.metadata.owner_references.as_ref().unwrap()[0].uid, "uid-1");
        assert_eq!(renewed.spec.unwrap().renew_time, Some(t1));
    }
}
