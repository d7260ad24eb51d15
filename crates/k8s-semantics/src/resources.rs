//! A pod's effective resource requests, exactly as upstream's `resourcehelper.PodRequests`
//! (`k8s.io/component-helpers/resource`), and the per-resource amounts the scheduler adds up
//! (upstream's `framework.Resource`).
//!
//! - [`pod_requests`]: the app containers' requests summed, plus every restartable init
//!   container (a sidecar, `restartPolicy: Always`: it keeps running next to the app
//!   containers); that total against each init container's requests plus the sidecars declared
//!   before it (they are already running while it runs), the larger per resource; then
//!   `spec.overhead` added.
//! - [`pod_non_zero_requests`]: the same with upstream's scoring defaults (100m cpu, 200Mi
//!   memory) for a container that requests no cpu or no memory at all (`GetNonzeroRequests` /
//!   `NonMissingContainerRequests`); an explicit zero stays zero.
//!
//! A container resource with a limit but no request counts the limit: the API server defaults
//! requests from limits (`SetDefaults_Pod`, for every resource), so objects read back from an
//! API server always carry the request and this changes nothing for them; objects that skipped
//! defaulting (a static pod file, a test fixture) get the value defaulting would have given.
//! The scheduler and the node agent's admission both count this way.
//!
//! Pod-level resources (`spec.resources`, the PodLevelResources feature, off by default in
//! Kubernetes 1.33) are not read.
//!
//! Values are [`Milli`] (thousandths of the unit: millicores, milli-bytes), exact for every
//! quantity of milli precision; use [`Milli::value`] for whole bytes.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{Container, Pod};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity as ApiQuantity;

use crate::quantity::{parse_milli, Milli};
use crate::scheduling::is_qualified_name;

pub const CPU: &str = "cpu";
pub const MEMORY: &str = "memory";
pub const EPHEMERAL_STORAGE: &str = "ephemeral-storage";
pub const PODS: &str = "pods";

/// The cpu a container without a cpu request counts for scoring (upstream
/// `DefaultMilliCPURequest`, 100m).
pub const DEFAULT_MILLI_CPU_REQUEST: Milli = Milli(100);
/// The memory a container without a memory request counts for scoring (upstream
/// `DefaultMemoryRequest`, 200Mi), in milli-bytes.
pub const DEFAULT_MEMORY_REQUEST: Milli = Milli(200 * 1024 * 1024 * 1000);

/// Amounts of the resources the scheduler accounts for (upstream `framework.Resource`): a
/// pod's requests, a node's allocatable, or the sum of the requests of a node's pods. All in
/// thousandths; `pods` is 1000 per pod.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Resources {
    /// Millicores.
    pub cpu: Milli,
    /// Milli-bytes.
    pub memory: Milli,
    /// Milli-bytes.
    pub ephemeral_storage: Milli,
    /// 1000 per pod.
    pub pods: Milli,
    /// Extended resources, hugepages and other scalar resources (upstream
    /// `IsScalarResourceName`); zero entries are dropped.
    pub scalar: BTreeMap<String, Milli>,
}

impl Resources {
    /// Reads a resource list (requests, limits, overhead or allocatable) as upstream's
    /// `Resource.Add(ResourceList)`: cpu, memory, ephemeral-storage, pods and the scalar
    /// resources; any other name (`storage`, a name without a domain) is ignored. A quantity
    /// that does not parse counts 0 (the API server validated it).
    pub fn from_list(list: &BTreeMap<String, ApiQuantity>) -> Resources {
        let mut r = Resources::default();
        for (name, q) in list {
            r.set(name, parse_milli(&q.0).unwrap_or_default());
        }
        r
    }

    /// The amount of one resource (0 when absent or not accounted).
    pub fn get(&self, name: &str) -> Milli {
        match name {
            CPU => self.cpu,
            MEMORY => self.memory,
            EPHEMERAL_STORAGE => self.ephemeral_storage,
            PODS => self.pods,
            other => self.scalar.get(other).copied().unwrap_or_default(),
        }
    }

    /// Sets one resource; names that are not accounted are ignored.
    pub fn set(&mut self, name: &str, v: Milli) {
        match name {
            CPU => self.cpu = v,
            MEMORY => self.memory = v,
            EPHEMERAL_STORAGE => self.ephemeral_storage = v,
            PODS => self.pods = v,
            other if is_scalar_resource_name(other) => {
                if v == Milli(0) {
                    self.scalar.remove(other);
                } else {
                    self.scalar.insert(other.to_string(), v);
                }
            }
            _ => {}
        }
    }

    fn combine(&mut self, o: &Resources, f: impl Fn(Milli, Milli) -> Milli) {
        self.cpu = f(self.cpu, o.cpu);
        self.memory = f(self.memory, o.memory);
        self.ephemeral_storage = f(self.ephemeral_storage, o.ephemeral_storage);
        self.pods = f(self.pods, o.pods);
        for (k, v) in &o.scalar {
            let e = self.scalar.entry(k.clone()).or_default();
            *e = f(*e, *v);
            if *e == Milli(0) {
                self.scalar.remove(k);
            }
        }
    }

    /// Adds `o` resource by resource.
    pub fn add(&mut self, o: &Resources) {
        self.combine(o, |a, b| a + b);
    }

    /// Subtracts `o` resource by resource (saturating).
    pub fn sub(&mut self, o: &Resources) {
        self.combine(o, |a, b| a - b);
    }

    /// The larger of the two, resource by resource (upstream `maxResourceList`).
    pub fn max_with(&mut self, o: &Resources) {
        self.combine(o, Milli::max);
    }

    /// Whether nothing but `pods` is set (upstream's early return in `fitsRequest`).
    pub fn is_zero(&self) -> bool {
        self.cpu == Milli(0)
            && self.memory == Milli(0)
            && self.ephemeral_storage == Milli(0)
            && self.scalar.is_empty()
    }

    /// The resources a pod with these requests lacks on a node with `allocatable`, of which
    /// `requested` is already taken (upstream `fitsRequest`, without ignored extended
    /// resources): `pods` first when one more pod does not fit (`self.pods` is the pod's count,
    /// normally 1000), then cpu, memory, ephemeral-storage and the scalar resources in name
    /// order, each only when requested (> 0) and more than what is free.
    pub fn insufficient(&self, allocatable: &Resources, requested: &Resources) -> Vec<&str> {
        let mut out = Vec::new();
        if requested.pods + self.pods > allocatable.pods {
            out.push(PODS);
        }
        if self.is_zero() {
            return out;
        }
        for (name, want) in [
            (CPU, self.cpu),
            (MEMORY, self.memory),
            (EPHEMERAL_STORAGE, self.ephemeral_storage),
        ]
        .into_iter()
        .chain(self.scalar.iter().map(|(k, v)| (k.as_str(), *v)))
        {
            if want > Milli(0) && want > allocatable.get(name) - requested.get(name) {
                out.push(name);
            }
        }
        out
    }

    /// Whether the requests fit (see [`Resources::insufficient`]).
    pub fn fits(&self, allocatable: &Resources, requested: &Resources) -> bool {
        self.insufficient(allocatable, requested).is_empty()
    }
}

/// Upstream `IsScalarResourceName`: an extended resource (a domain-qualified name outside
/// `kubernetes.io/`, not `requests.*`), hugepages (`hugepages-*`), a prefixed native resource
/// (`*kubernetes.io/*`) or an attachable volume count (`attachable-volumes-*`).
pub fn is_scalar_resource_name(name: &str) -> bool {
    name.starts_with("hugepages-")
        || name.starts_with("attachable-volumes-")
        || name.contains("kubernetes.io/")
        || is_extended_resource_name(name)
}

/// Upstream `IsExtendedResourceName`: not native (native names have no `/` or are under
/// `kubernetes.io/`), not `requests.*`, and `requests.<name>` a qualified name.
pub fn is_extended_resource_name(name: &str) -> bool {
    name.contains('/')
        && !name.contains("kubernetes.io/")
        && !name.starts_with("requests.")
        && is_qualified_name(&format!("requests.{name}"))
}

/// Upstream `IsRestartableInitContainer`: an init container with `restartPolicy: Always` (a
/// sidecar), which keeps running next to the app containers.
pub fn is_restartable_init_container(c: &Container) -> bool {
    c.restart_policy.as_deref() == Some("Always")
}

/// A container's requests, a resource with a limit but no request counting the limit (the API
/// server's defaulting; see the module documentation). `pods` is never read.
pub fn container_requests(c: &Container) -> Resources {
    container_requests_with(c, false)
}

fn container_requests_with(c: &Container, non_zero: bool) -> Resources {
    let res = c.resources.as_ref();
    let requests = res.and_then(|r| r.requests.as_ref());
    let limits = res.and_then(|r| r.limits.as_ref());
    let has = |name: &str| {
        requests.is_some_and(|l| l.contains_key(name))
            || limits.is_some_and(|l| l.contains_key(name))
    };
    let mut out = Resources::default();
    // limits first, so that a request overrides its limit
    for list in [limits, requests].into_iter().flatten() {
        for (name, q) in list {
            if name != PODS {
                out.set(name, parse_milli(&q.0).unwrap_or_default());
            }
        }
    }
    if non_zero {
        if !has(CPU) {
            out.cpu = DEFAULT_MILLI_CPU_REQUEST;
        }
        if !has(MEMORY) {
            out.memory = DEFAULT_MEMORY_REQUEST;
        }
    }
    out
}

/// Upstream `AggregateContainerRequests` plus the overhead (`PodRequests`).
fn aggregate(pod: &Pod, non_zero: bool) -> Resources {
    let mut reqs = Resources::default();
    let Some(spec) = pod.spec.as_ref() else {
        return reqs;
    };
    for c in &spec.containers {
        reqs.add(&container_requests_with(c, non_zero));
    }
    let mut sidecars = Resources::default();
    let mut init_max = Resources::default();
    for c in spec.init_containers.iter().flatten() {
        let mut r = container_requests_with(c, non_zero);
        if is_restartable_init_container(c) {
            reqs.add(&r);
            sidecars.add(&r);
            r = sidecars.clone();
        } else {
            r.add(&sidecars);
        }
        init_max.max_with(&r);
    }
    reqs.max_with(&init_max);
    if let Some(overhead) = spec.overhead.as_ref() {
        let mut o = Resources::from_list(overhead);
        o.pods = Milli(0);
        reqs.add(&o);
    }
    reqs
}

/// A pod's effective requests (upstream `PodRequests`): the app containers and sidecars
/// summed, at least the largest init container plus the sidecars declared before it, plus the
/// overhead. Nothing requested counts 0 (a BestEffort pod); `pods` is 0.
pub fn pod_requests(pod: &Pod) -> Resources {
    aggregate(pod, false)
}

/// [`pod_requests`] with upstream's scoring defaults: a container that requests no cpu counts
/// [`DEFAULT_MILLI_CPU_REQUEST`], one that requests no memory [`DEFAULT_MEMORY_REQUEST`] (the
/// scheduler's `NonMissingContainerRequests`); explicit zeros stay zero.
pub fn pod_non_zero_requests(pod: &Pod) -> Resources {
    aggregate(pod, true)
}

/// What a `resourceFieldRef` reads for a limit the container does not set (upstream's
/// defaultPodLimitsForDownwardAPI: the node's allocatable).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NodeAllocatable {
    pub cpu_milli: i64,
    pub memory: i64,
    /// None when the node does not know it.
    pub ephemeral_storage: Option<i64>,
}

/// Why a `resourceFieldRef` has no value.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ResourceFieldError {
    #[error("unsupported container resource {0:?}")]
    Unsupported(String),
    /// A request, limit or divisor that does not parse, or is negative.
    #[error("invalid quantity {quantity:?} for {field}")]
    InvalidQuantity { field: String, quantity: String },
    #[error("the node's allocatable {0} is not known")]
    UnknownNodeValue(&'static str),
}

/// The value of a container's `resourceFieldRef` (env or downwardAPI volume), as upstream's
/// ExtractContainerResourceValue with defaultPodLimitsForDownwardAPI: `limits.` or `requests.`
/// of cpu, memory, ephemeral-storage or hugepages-*; divided by the divisor and rounded up (cpu
/// in millicores against the divisor in millicores, the others in bytes; an absent or zero
/// divisor is 1); an unset request is the limit when that is set (API defaulting), else 0; an
/// unset cpu, memory or ephemeral-storage limit is the node's allocatable, other unset limits
/// 0.
pub fn container_resource_value(
    c: &Container,
    resource: &str,
    divisor: Option<&str>,
    node: &NodeAllocatable,
) -> Result<String, ResourceFieldError> {
    let unsupported = || ResourceFieldError::Unsupported(resource.to_string());
    let (which, name) = resource.split_once('.').ok_or_else(unsupported)?;
    let limits = match which {
        "limits" => true,
        "requests" => false,
        _ => return Err(unsupported()),
    };
    if !matches!(name, CPU | MEMORY | EPHEMERAL_STORAGE) && !name.starts_with("hugepages-") {
        return Err(unsupported());
    }
    let scale: i128 = if name == CPU { 1000 } else { 1 };
    let read = |field: &str, q: &str| {
        crate::quantity::scaled(q, scale)
            .filter(|v| *v >= 0)
            .ok_or_else(|| ResourceFieldError::InvalidQuantity { field: field.to_string(), quantity: q.to_string() })
    };
    let res = c.resources.as_ref();
    let get = |lim: bool| {
        res.and_then(|r| if lim { r.limits.as_ref() } else { r.requests.as_ref() }).and_then(|m| m.get(name)).map(|q| q.0.as_str())
    };
    let value = if limits {
        match get(true) {
            Some(q) => read(&format!("limits.{name}"), q)?,
            None => match name {
                CPU => i128::from(node.cpu_milli),
                MEMORY => i128::from(node.memory),
                EPHEMERAL_STORAGE => i128::from(node.ephemeral_storage.ok_or(ResourceFieldError::UnknownNodeValue(EPHEMERAL_STORAGE))?),
                _ => 0,
            },
        }
    } else {
        match (get(false), get(true)) {
            (Some(q), _) => read(&format!("requests.{name}"), q)?,
            (None, Some(q)) => read(&format!("limits.{name}"), q)?,
            (None, None) => 0,
        }
    };
    // The divisor in the same unit as the value: "1" is 1000 millicores for cpu.
    let d = match divisor {
        Some(d) => read("divisor", d)?,
        None => 0,
    };
    let d = if d == 0 { scale } else { d };
    Ok(value.div_euclid(d).saturating_add(i128::from(value.rem_euclid(d) != 0)).to_string())
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use serde_json::json;

    const MI: i128 = 1024 * 1024 * 1000;

    fn pod(spec: serde_json::Value) -> Pod {
        serde_json::from_value(json!({"metadata": {"name": "p"}, "spec": spec})).unwrap()
    }

    fn c(name: &str, requests: serde_json::Value) -> serde_json::Value {
        json!({"name": name, "resources": {"requests": requests}})
    }

    fn sidecar(name: &str, requests: serde_json::Value) -> serde_json::Value {
        json!({"name": name, "restartPolicy": "Always", "resources": {"requests": requests}})
    }

    #[test]
    fn pod_requests_with_init_containers_sidecars_and_overhead() {
        // (case, spec, cpu millicores, memory MiB)
        let cases = [
            (
                "apps only",
                json!({"containers": [c("a", json!({"cpu": "100m", "memory": "64Mi"})), c("b", json!({"cpu": "200m"}))]}),
                300,
                64,
            ),
            (
                "an init container larger than the apps decides",
                json!({"initContainers": [c("i", json!({"cpu": "500m"}))],
                       "containers": [c("a", json!({"cpu": "100m"})), c("b", json!({"cpu": "100m"}))]}),
                500,
                0,
            ),
            (
                "init containers run one at a time: the largest, not the sum",
                json!({"initContainers": [c("i1", json!({"cpu": "2", "memory": "100Mi"})), c("i2", json!({"cpu": "500m", "memory": "1Gi"}))],
                       "containers": [c("a", json!({"cpu": "250m", "memory": "200Mi"}))]}),
                2000,
                1024,
            ),
            (
                "a sidecar runs with the apps; an init container declared before it runs alone",
                // apps 2x100m + sidecar 50m = 250m; init (before the sidecar) 500m alone
                json!({"initContainers": [c("i", json!({"cpu": "500m"})), sidecar("s", json!({"cpu": "50m"}))],
                       "containers": [c("a", json!({"cpu": "100m"})), c("b", json!({"cpu": "100m"}))]}),
                500,
                0,
            ),
            (
                "an init container declared after a sidecar runs with it",
                // apps 250m; init 500m + sidecar 50m = 550m
                json!({"initContainers": [sidecar("s", json!({"cpu": "50m"})), c("i", json!({"cpu": "500m"}))],
                       "containers": [c("a", json!({"cpu": "100m"})), c("b", json!({"cpu": "100m"}))]}),
                550,
                0,
            ),
            (
                "sidecars add up and count in the init phase cumulatively",
                // apps 100m + sidecars 1 + 2 = 3100m; i1 (after s1) 1 + 1.5 = 2500m;
                // i2 (after both) 3 + 500m = 3500m
                json!({"initContainers": [sidecar("s1", json!({"cpu": "1"})), c("i1", json!({"cpu": "1500m"})),
                                          sidecar("s2", json!({"cpu": "2"})), c("i2", json!({"cpu": "500m"}))],
                       "containers": [c("a", json!({"cpu": "100m"}))]}),
                3500,
                0,
            ),
            (
                "a sidecar alone in the init phase does not exceed the apps plus it",
                json!({"initContainers": [sidecar("s", json!({"memory": "1Gi"}))],
                       "containers": [c("a", json!({"memory": "1Gi"}))]}),
                0,
                2048,
            ),
            (
                "overhead is added after the max",
                json!({"initContainers": [c("i", json!({"cpu": "2"}))],
                       "containers": [c("a", json!({"cpu": "1"}))],
                       "overhead": {"cpu": "100m", "memory": "10Mi"}}),
                2100,
                10,
            ),
            (
                "per resource max: cpu from the init container, memory from the apps",
                json!({"initContainers": [c("i", json!({"cpu": "2", "memory": "1Mi"}))],
                       "containers": [c("a", json!({"cpu": "1", "memory": "1Gi"}))]}),
                2000,
                1024,
            ),
            (
                "no containers request anything",
                json!({"containers": [{"name": "a"}]}),
                0,
                0,
            ),
        ];
        for (case, spec, cpu, memory) in cases {
            let r = pod_requests(&pod(spec));
            assert_eq!(r.cpu, Milli(cpu), "{case}: cpu");
            assert_eq!(r.memory, Milli(memory * MI), "{case}: memory");
            assert_eq!(r.pods, Milli(0), "{case}: pods");
        }
    }

    #[test]
    fn limits_stand_in_for_missing_requests() {
        let p = pod(json!({"containers": [
            {"name": "a", "resources": {"limits": {"cpu": "1", "memory": "1Gi", "example.com/gpu": "2"},
                                         "requests": {"memory": "512Mi"}}}
        ]}));
        let r = pod_requests(&p);
        assert_eq!(r.cpu, Milli(1000), "limit defaults the request");
        assert_eq!(r.memory, Milli(512 * MI), "a request wins over its limit");
        assert_eq!(r.get("example.com/gpu"), Milli(2000), "for every resource");
        // the scoring variant: a limit counts as a request, so no default
        let n = pod_non_zero_requests(&p);
        assert_eq!((n.cpu, n.memory), (Milli(1000), Milli(512 * MI)));
    }

    #[test]
    fn non_zero_requests_default_missing_cpu_and_memory_per_container() {
        // (case, spec, cpu, memory in MiB)
        let cases = [
            (
                "best effort",
                json!({"containers": [{"name": "a"}]}),
                100,
                200,
            ),
            (
                "two containers, each defaulted",
                json!({"containers": [{"name": "a"}, {"name": "b"}]}),
                200,
                400,
            ),
            (
                "explicit zeros stay zero",
                json!({"containers": [c("a", json!({"cpu": "0", "memory": "0"}))]}),
                0,
                0,
            ),
            (
                "only the missing one is defaulted",
                json!({"containers": [c("a", json!({"cpu": "1"}))]}),
                1000,
                200,
            ),
            (
                "init containers and overhead as in pod_requests",
                json!({"initContainers": [{"name": "i"}], "containers": [c("a", json!({"cpu": "50m", "memory": "1Mi"}))],
                       "overhead": {"cpu": "10m"}}),
                110,
                200,
            ),
        ];
        for (case, spec, cpu, memory) in cases {
            let r = pod_non_zero_requests(&pod(spec));
            assert_eq!(r.cpu, Milli(cpu), "{case}: cpu");
            assert_eq!(r.memory, Milli(memory * MI), "{case}: memory");
        }
        assert_eq!(
            pod_requests(&pod(json!({"containers": [{"name": "a"}]}))),
            Resources::default()
        );
    }

    #[test]
    fn resource_lists_read_the_accounted_names_only() {
        let list: BTreeMap<String, ApiQuantity> = [
            ("cpu", "4"),
            ("memory", "8Gi"),
            ("pods", "110"),
            ("ephemeral-storage", "10Gi"),
            ("storage", "1Ti"),
            ("example.com/gpu", "2"),
            ("hugepages-2Mi", "1Gi"),
            ("nvidia.com/gpu", "0"),
            ("foo", "1"),
            ("requests.example.com/x", "1"),
            ("bad", "x"),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), ApiQuantity(v.to_string())))
        .collect();
        let r = Resources::from_list(&list);
        assert_eq!(r.cpu, Milli(4000));
        assert_eq!(r.memory, Milli(8 * 1024 * MI));
        assert_eq!(r.pods, Milli(110_000));
        assert_eq!(r.ephemeral_storage, Milli(10 * 1024 * MI));
        assert_eq!(
            r.scalar.keys().collect::<Vec<_>>(),
            ["example.com/gpu", "hugepages-2Mi"],
            "storage, names without a domain, requests.* and zeros are not scalar amounts"
        );
        for (name, scalar) in [
            ("example.com/gpu", true),
            ("hugepages-1Gi", true),
            ("attachable-volumes-csi-x", true),
            ("kubernetes.io/batch", true),
            ("foo", false),
            ("cpu", false),
            ("requests.example.com/x", false),
            ("example.com/", false),
            ("-bad.com/x", false),
        ] {
            assert_eq!(is_scalar_resource_name(name), scalar, "{name}");
        }
    }

    #[test]
    fn arithmetic_drops_zero_scalars_and_saturates() {
        let mut a = Resources::default();
        let mut gpu = Resources::default();
        gpu.set("example.com/gpu", Milli(1000));
        gpu.cpu = Milli(500);
        a.add(&gpu);
        a.add(&gpu);
        assert_eq!(a.get("example.com/gpu"), Milli(2000));
        a.sub(&gpu);
        a.sub(&gpu);
        assert_eq!(
            a,
            Resources::default(),
            "add then sub restores, no zero entries left"
        );
        let mut m = Resources {
            cpu: Milli(700),
            ..Resources::default()
        };
        m.max_with(&gpu);
        assert_eq!((m.cpu, m.get("example.com/gpu")), (Milli(700), Milli(1000)));
        assert!(Resources::default().is_zero());
        assert!(!gpu.is_zero());
    }

    #[test]
    fn fit_reports_each_insufficient_resource_in_upstream_order() {
        let alloc = Resources::from_list(
            &[
                ("cpu", "4"),
                ("memory", "8Gi"),
                ("pods", "2"),
                ("example.com/gpu", "1"),
            ]
            .into_iter()
            .map(|(k, v)| (k.to_string(), ApiQuantity(v.to_string())))
            .collect(),
        );
        let mut used = Resources {
            cpu: Milli(3000),
            ..Resources::default()
        };
        let want = |cpu: i128, memory: i128, gpu: i128| {
            let mut r = Resources {
                cpu: Milli(cpu),
                memory: Milli(memory),
                pods: Milli(1000),
                ..Resources::default()
            };
            r.set("example.com/gpu", Milli(gpu));
            r
        };
        // (case, request, used pods, insufficient)
        let cases: [(&str, Resources, i128, &[&str]); 6] = [
            ("fits exactly", want(1000, 8 * 1024 * MI, 1000), 1000, &[]),
            ("cpu", want(1001, 0, 0), 1000, &["cpu"]),
            (
                "cpu and memory",
                want(2000, 9 * 1024 * MI, 0),
                1000,
                &["cpu", "memory"],
            ),
            ("scalar", want(0, 0, 2000), 1000, &["example.com/gpu"]),
            (
                "too many pods, nothing else requested",
                want(0, 0, 0),
                2000,
                &["pods"],
            ),
            (
                "too many pods first",
                want(5000, 0, 0),
                2000,
                &["pods", "cpu"],
            ),
        ];
        for (case, req, pods, expect) in cases {
            used.pods = Milli(pods);
            assert_eq!(req.insufficient(&alloc, &used), expect, "{case}");
            assert_eq!(req.fits(&alloc, &used), expect.is_empty(), "{case}");
        }
        // a resource the node does not have at all
        let mut fpga = Resources::default();
        fpga.set("vendor.io/fpga", Milli(1000));
        assert_eq!(
            fpga.insufficient(&alloc, &Resources::default()),
            ["vendor.io/fpga"]
        );
    }

    #[test]
    fn sidecars_are_init_containers_with_restart_policy_always() {
        let c = |v: serde_json::Value| -> Container { serde_json::from_value(v).unwrap() };
        assert!(is_restartable_init_container(&c(
            json!({"name": "s", "restartPolicy": "Always"})
        )));
        assert!(!is_restartable_init_container(&c(json!({"name": "i"}))));
        assert!(!is_restartable_init_container(&c(
            json!({"name": "i", "restartPolicy": "Never"})
        )));
    }

    #[test]
    fn resource_field_values_as_the_downward_api_reads_them() {
        let c: Container = serde_json::from_value(serde_json::json!({"name": "c", "resources": {
            "limits": {"cpu": "1500m", "memory": "64Mi", "hugepages-2Mi": "4Mi"},
            "requests": {"cpu": "250m"}}}))
        .unwrap();
        let node = NodeAllocatable { cpu_milli: 4000, memory: 8 << 30, ephemeral_storage: None };
        let v = |r: &str, d: Option<&str>| container_resource_value(&c, r, d, &node);
        assert_eq!(v("limits.cpu", None).unwrap(), "2", "1.5 cores rounded up to whole cores");
        assert_eq!(v("limits.cpu", Some("1m")).unwrap(), "1500");
        assert_eq!(v("requests.cpu", Some("1m")).unwrap(), "250");
        assert_eq!(v("requests.cpu", Some("0")).unwrap(), "1", "a zero divisor is 1");
        assert_eq!(v("limits.memory", Some("1Mi")).unwrap(), "64");
        assert_eq!(v("requests.memory", None).unwrap(), "67108864", "the limit stands in for the request");
        assert_eq!(v("limits.hugepages-2Mi", Some("1Mi")).unwrap(), "4");
        assert_eq!(v("requests.ephemeral-storage", None).unwrap(), "0");
        let bare = Container { name: "b".into(), ..Default::default() };
        let b = |r: &str| container_resource_value(&bare, r, None, &node);
        assert_eq!(b("limits.cpu").unwrap(), "4", "unset limits are the node's allocatable");
        assert_eq!(b("limits.memory").unwrap(), (8u64 << 30).to_string());
        assert_eq!(b("limits.ephemeral-storage"), Err(ResourceFieldError::UnknownNodeValue("ephemeral-storage")));
        assert_eq!(b("limits.hugepages-1Gi").unwrap(), "0");
        assert_eq!(b("limits.gpu"), Err(ResourceFieldError::Unsupported("limits.gpu".into())));
        assert_eq!(b("status.cpu"), Err(ResourceFieldError::Unsupported("status.cpu".into())));
        assert_eq!(
            v("limits.cpu", Some("lots")),
            Err(ResourceFieldError::InvalidQuantity { field: "divisor".into(), quantity: "lots".into() })
        );
    }
}
