//! The shared vocabulary of the pod lifecycle: what the agent observed in the runtime (CRI) for
//! one pod, the labels and annotations it puts on sandboxes and containers so that it can
//! rebuild that view after a restart, the ConfigMaps/Secrets a pod refers to, and the pod's
//! QoS class. Pure: no I/O.
//!
//! The label and annotation keys are the upstream kubelet's, so `crictl` and operators see the
//! names they know.

use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::api::core::v1::{ConfigMap, Container, Pod, Secret};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;

pub const LABEL_POD_NAME: &str = "io.kubernetes.pod.name";
pub const LABEL_POD_NAMESPACE: &str = "io.kubernetes.pod.namespace";
pub const LABEL_POD_UID: &str = "io.kubernetes.pod.uid";
pub const LABEL_CONTAINER_NAME: &str = "io.kubernetes.container.name";
/// Marks sandboxes and containers ferro-agent created; it never touches others.
pub const LABEL_MANAGED_BY: &str = "ferro.dev/managed-by";
pub const MANAGED_BY: &str = "ferro-agent";

/// Annotation: the hash of the container's spec ([`crate::pod::plan::container_hash`]).
pub const ANN_CONTAINER_HASH: &str = "io.kubernetes.container.hash";
/// Annotation: the container's restart count when it was created.
pub const ANN_RESTART_COUNT: &str = "io.kubernetes.container.restartCount";
pub const ANN_TERMINATION_MESSAGE_PATH: &str = "io.kubernetes.container.terminationMessagePath";
pub const ANN_TERMINATION_MESSAGE_POLICY: &str = "io.kubernetes.container.terminationMessagePolicy";
/// Annotation: the pod's terminationGracePeriodSeconds (on sandboxes and containers).
pub const ANN_TERMINATION_GRACE: &str = "io.kubernetes.pod.terminationGracePeriod";
/// Annotation on containers: "init" for init containers, "app" otherwise.
pub const ANN_CONTAINER_TYPE: &str = "ferro.dev/container-type";

/// The state of a pod sandbox as CRI reports it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SandboxState {
    Ready,
    NotReady,
}

/// One pod sandbox of the pod, as observed in the runtime.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Sandbox {
    pub id: String,
    /// PodSandboxMetadata.attempt.
    pub attempt: u32,
    pub state: SandboxState,
    /// Unix nanoseconds.
    pub created_at: i64,
    /// The sandbox's primary IP (PodSandboxStatus.network.ip), if it has a network.
    pub ip: Option<String>,
    /// Further IPs (dual stack).
    pub additional_ips: Vec<String>,
}

/// The state of a container as CRI reports it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ContainerState {
    Created,
    Running,
    Exited,
    Unknown,
}

/// Whether a container is one of the pod's init containers or an app container.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ContainerKind {
    Init,
    App,
}

/// One container of the pod, as observed in the runtime (all attempts, also exited ones).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ContainerObs {
    pub id: String,
    pub sandbox_id: String,
    /// The container's name in the pod spec (label io.kubernetes.container.name).
    pub name: String,
    pub kind: ContainerKind,
    /// ContainerMetadata.attempt.
    pub attempt: u32,
    pub state: ContainerState,
    /// Unix nanoseconds; 0 when not known (not started, not finished).
    pub created_at: i64,
    pub started_at: i64,
    pub finished_at: i64,
    pub exit_code: i32,
    /// The runtime's reason (e.g. "OOMKilled", "Completed", "Error") and message. For an exited
    /// container the message may hold the termination message the runtime read.
    pub reason: String,
    pub message: String,
    /// The image as the pod spec named it (ContainerConfig.image) and the resolved reference
    /// (ContainerStatus.image_ref, used for imageID).
    pub image: String,
    pub image_ref: String,
    /// The spec hash annotation; 0 when missing.
    pub hash: u64,
    /// The restart count annotation.
    pub restart_count: u32,
}

/// Everything the runtime holds for one pod (by UID).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PodRuntime {
    pub uid: String,
    pub name: String,
    pub namespace: String,
    /// Newest first (by created_at).
    pub sandboxes: Vec<Sandbox>,
    /// Newest first (by created_at), every attempt of every container.
    pub containers: Vec<ContainerObs>,
}

impl PodRuntime {
    /// The newest sandbox.
    pub fn sandbox(&self) -> Option<&Sandbox> {
        self.sandboxes.first()
    }

    /// The newest attempt of container `name` of `kind`.
    pub fn latest(&self, kind: ContainerKind, name: &str) -> Option<&ContainerObs> {
        self.containers.iter().find(|c| c.kind == kind && c.name == name)
    }

    /// The attempt before the newest one of container `name` (for lastState).
    pub fn previous(&self, kind: ContainerKind, name: &str) -> Option<&ContainerObs> {
        self.containers.iter().filter(|c| c.kind == kind && c.name == name).nth(1)
    }

    /// Containers currently running (any kind).
    pub fn running(&self) -> impl Iterator<Item = &ContainerObs> {
        self.containers.iter().filter(|c| c.state == ContainerState::Running)
    }
}

/// Whether init container `c` is a sidecar (KEP-753: an init container with `restartPolicy:
/// Always`): it is started in order with the other init containers, counts as done once it has
/// started, keeps running next to the app containers and is restarted whenever it exits.
pub fn is_sidecar(c: &Container) -> bool {
    c.restart_policy.as_deref() == Some("Always")
}

/// Why a container is waiting, as the last sync left it (image pull failure, config error,
/// crash-loop backoff...). Keyed by container name in the maps the status computation takes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Waiting {
    /// Upstream reason: ErrImagePull, ImagePullBackOff, CrashLoopBackOff,
    /// CreateContainerConfigError, CreateContainerError, RunContainerError, InvalidImageName,
    /// ContainerCreating, PodInitializing.
    pub reason: String,
    pub message: String,
}

/// Probe results for the pod's current containers (the newest attempt of each app container
/// and sidecar init container), by container name, as the probe workers last reported them.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ProbeResults {
    /// Readiness: an entry only for containers with a readiness probe that has a result; true
    /// when the last result succeeded. A container with a readiness probe and no entry is not
    /// ready yet.
    pub readiness: BTreeMap<String, bool>,
    /// Startup: an entry only for containers with a startup probe that has succeeded (true).
    /// A container with a startup probe and no entry (or false) has not started.
    pub startup: BTreeMap<String, bool>,
    /// Containers whose liveness or startup probe failed failureThreshold times: the container
    /// is to be killed and restarted per restartPolicy. The value is the message upstream
    /// records (e.g. "Container app failed liveness probe, will be restarted").
    pub failed: BTreeMap<String, String>,
    /// The failed probe's `terminationGracePeriodSeconds`, when it sets one: the grace period
    /// of the kill instead of the pod's (upstream's probe-level grace, KEP-2238).
    pub failed_grace: BTreeMap<String, i64>,
}

/// The ConfigMaps and Secrets (names in the pod's namespace) a pod refers to, in volumes
/// (configMap, secret, projected sources), env (valueFrom) and envFrom. `optional` references
/// are included too.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Refs {
    pub config_maps: BTreeSet<String>,
    pub secrets: BTreeSet<String>,
}

/// The referenced objects as fetched for one sync: a name missing from a map does not exist.
#[derive(Debug, Clone, Default)]
pub struct Objects {
    pub config_maps: BTreeMap<String, ConfigMap>,
    pub secrets: BTreeMap<String, Secret>,
    /// The Services whose environment variables the containers get (upstream's service links:
    /// those of the pod's namespace when enableServiceLinks is not false, and the `kubernetes`
    /// Service of `default` always).
    pub services: Vec<k8s_openapi::api::core::v1::Service>,
    /// A bound service account token for projected serviceAccountToken sources, when the
    /// agent could obtain one (TokenRequest); None makes such a projection an error.
    pub service_account_token: Option<String>,
}

/// The names of ConfigMaps and Secrets `pod` refers to.
pub fn references(pod: &Pod) -> Refs {
    let mut r = Refs::default();
    let Some(spec) = pod.spec.as_ref() else {
        return r;
    };
    for v in spec.volumes.iter().flatten() {
        if let Some(n) = v.config_map.as_ref().map(|c| c.name.clone()) {
            r.config_maps.insert(n);
        }
        if let Some(n) = v.secret.as_ref().and_then(|s| s.secret_name.clone()) {
            r.secrets.insert(n);
        }
        for src in v.projected.iter().flat_map(|p| p.sources.iter().flatten()) {
            if let Some(n) = src.config_map.as_ref().map(|c| c.name.clone()) {
                r.config_maps.insert(n);
            }
            if let Some(n) = src.secret.as_ref().map(|s| s.name.clone()) {
                r.secrets.insert(n);
            }
        }
    }
    let containers = spec.containers.iter().chain(spec.init_containers.iter().flatten());
    for c in containers {
        for e in c.env.iter().flatten() {
            if let Some(vf) = e.value_from.as_ref() {
                if let Some(k) = vf.config_map_key_ref.as_ref() {
                    r.config_maps.insert(k.name.clone());
                }
                if let Some(k) = vf.secret_key_ref.as_ref() {
                    r.secrets.insert(k.name.clone());
                }
            }
        }
        for f in c.env_from.iter().flatten() {
            if let Some(n) = f.config_map_ref.as_ref().map(|c| c.name.clone()) {
                r.config_maps.insert(n);
            }
            if let Some(n) = f.secret_ref.as_ref().map(|s| s.name.clone()) {
                r.secrets.insert(n);
            }
        }
    }
    r
}

/// The pod's QoS class, as upstream computes it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum QosClass {
    Guaranteed,
    Burstable,
    BestEffort,
}

impl QosClass {
    /// status.qosClass.
    pub fn as_str(self) -> &'static str {
        match self {
            QosClass::Guaranteed => "Guaranteed",
            QosClass::Burstable => "Burstable",
            QosClass::BestEffort => "BestEffort",
        }
    }
}

fn is_zero(q: &Quantity) -> bool {
    k8s_semantics::Quantity::parse(&q.0).is_ok_and(|q| q.is_zero())
}

/// Upstream's GetPodQOS: Guaranteed when every container (init included) sets cpu and memory
/// limits and requests equal to them; BestEffort when no container sets any cpu/memory request
/// or limit; Burstable otherwise.
pub fn qos_class(pod: &Pod) -> QosClass {
    let Some(spec) = pod.spec.as_ref() else {
        return QosClass::BestEffort;
    };
    let all: Vec<&Container> = spec.containers.iter().chain(spec.init_containers.iter().flatten()).collect();
    let mut any = false;
    let mut guaranteed = true;
    for c in all {
        let res = c.resources.as_ref();
        let requests = res.and_then(|r| r.requests.as_ref());
        let limits = res.and_then(|r| r.limits.as_ref());
        for name in ["cpu", "memory"] {
            let req = requests.and_then(|m| m.get(name)).filter(|q| !is_zero(q));
            // A limit without a request defaults the request to the limit (API defaulting).
            let lim = limits.and_then(|m| m.get(name)).filter(|q| !is_zero(q));
            if req.is_some() || lim.is_some() {
                any = true;
            }
            match (req, lim) {
                (_, None) => guaranteed = false,
                (Some(r), Some(l)) if !k8s_semantics::quantity::same_value(&r.0, &l.0) => guaranteed = false,
                _ => {}
            }
        }
    }
    if !any {
        QosClass::BestEffort
    } else if guaranteed {
        QosClass::Guaranteed
    } else {
        QosClass::Burstable
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn pod(json: serde_json::Value) -> Pod {
        serde_json::from_value(json).unwrap()
    }

    #[test]
    fn qos_classes() {
        let be = pod(serde_json::json!({"spec":{"containers":[{"name":"a"}]}}));
        assert_eq!(qos_class(&be), QosClass::BestEffort);
        let g = pod(serde_json::json!({"spec":{"containers":[{"name":"a","resources":{
            "limits":{"cpu":"1","memory":"1Gi"},"requests":{"cpu":"1000m","memory":"1Gi"}}}]}}));
        assert_eq!(qos_class(&g), QosClass::Guaranteed);
        let limits_only = pod(serde_json::json!({"spec":{"containers":[{"name":"a","resources":{
            "limits":{"cpu":"1","memory":"1Gi"}}}]}}));
        assert_eq!(qos_class(&limits_only), QosClass::Guaranteed);
        let b = pod(serde_json::json!({"spec":{"containers":[{"name":"a","resources":{
            "requests":{"cpu":"100m"}}}]}}));
        assert_eq!(qos_class(&b), QosClass::Burstable);
        let mixed = pod(serde_json::json!({"spec":{"containers":[
            {"name":"a","resources":{"limits":{"cpu":"1","memory":"1Gi"}}},{"name":"b"}]}}));
        assert_eq!(qos_class(&mixed), QosClass::Burstable);
    }

    #[test]
    fn guaranteed_compares_quantities_by_value() {
        // "1" and "1000m", "1Gi" and "1073741824" are the same value written differently
        let g = pod(serde_json::json!({"spec":{"containers":[{"name":"a","resources":{
            "limits":{"cpu":"1","memory":"1Gi"},"requests":{"cpu":"1000m","memory":"1073741824"}}}]}}));
        assert_eq!(qos_class(&g), QosClass::Guaranteed);
        // a nanocore apart is not the same value
        let b = pod(serde_json::json!({"spec":{"containers":[{"name":"a","resources":{
            "limits":{"cpu":"1","memory":"1Gi"},"requests":{"cpu":"999999999n","memory":"1Gi"}}}]}}));
        assert_eq!(qos_class(&b), QosClass::Burstable);
    }

    #[test]
    fn refs_from_volumes_and_env() {
        let p = pod(serde_json::json!({"spec":{
            "volumes":[{"name":"v","configMap":{"name":"cm1"}},{"name":"s","secret":{"secretName":"s1"}},
              {"name":"p","projected":{"sources":[{"configMap":{"name":"cm2"}},{"secret":{"name":"s2"}}]}}],
            "initContainers":[{"name":"i","envFrom":[{"configMapRef":{"name":"cm3"}}]}],
            "containers":[{"name":"a","env":[{"name":"X","valueFrom":{"secretKeyRef":{"name":"s3","key":"k"}}}]}]}}));
        let r = references(&p);
        assert_eq!(r.config_maps.into_iter().collect::<Vec<_>>(), ["cm1", "cm2", "cm3"]);
        assert_eq!(r.secrets.into_iter().collect::<Vec<_>>(), ["s1", "s2", "s3"]);
    }
}
