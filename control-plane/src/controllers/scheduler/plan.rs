//! The scheduling algorithm: a pure function from a pending pod and the cached nodes (with the
//! aggregates of the pods bound or assumed on them) to a node, or to an upstream-style
//! "0/N nodes are available: ..." message.
//!
//! Shape follows kube-scheduler's default profile, reduced to what ferro needs:
//!
//! * PreFilter (once per pod): volume claims (`persistentvolumeclaim "x" not found`,
//!   `pod has unbound immediate PersistentVolumeClaims`), which fail the pod on every node.
//! * Filter (per node, in upstream's plugin order; the first failing plugin gives the node's
//!   reasons, and one plugin can give several, e.g. `Insufficient cpu` and
//!   `Insufficient memory`): NodeUnschedulable, node readiness (ferro's addition, see
//!   below), TaintToleration, NodeAffinity, NodePorts, NodeResourcesFit, VolumeBinding.
//! * Score (per feasible node, every plugin 0-100 and weight 1): LeastAllocated,
//!   BalancedAllocation, preferred node affinity, TaintToleration (PreferNoSchedule) and
//!   ImageLocality. The highest sum wins; ties go to the node with the fewest pods, then to
//!   the lexicographically smallest name, so the result is deterministic and still spreads
//!   identical pods over identical nodes (upstream picks a random node among the best).
//!
//! The plugins live in [`super::filter`] and [`super::score`], one function each under
//! upstream's plugin name; this module holds the framework around them: what is known about
//! the pod and the nodes, the pre-filter, the loop over the nodes, the choice and the message.
//!
//! The Kubernetes rules the plugins apply (a pod's effective requests, resource fit, taints
//! and tolerations, node selector terms, node affinity, topology terms) are those of
//! `k8s_semantics::resources` and `k8s_semantics::scheduling`; the plugins only arrange them
//! into filters and scores.
//!
//! Per-pod work is O(nodes x (containers + taints + ports + claims)): everything about the
//! pod is computed once, and [`NodeInfo`] keeps the per-node sums incrementally.
//!
//! Readiness: upstream relies on the `node.kubernetes.io/not-ready` and
//! `node.kubernetes.io/unreachable` taints that the node lifecycle controller adds. ferro also
//! filters nodes whose `Ready` condition is not `True` (`node(s) were not ready`), unless the
//! pod tolerates the taint upstream would have put there (`not-ready` for False or a missing
//! condition, `unreachable` for Unknown, effect NoSchedule), so that CNI and other DaemonSet
//! pods that tolerate everything still land on nodes that wait for them.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use k8s_openapi::api::core::v1::{
    Node, PersistentVolume, PersistentVolumeClaim, Pod, Taint, Toleration,
};
use k8s_openapi::api::storage::v1::{CSIDriver, CSIStorageCapacity, StorageClass};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_semantics::resources::{
    is_restartable_init_container, pod_non_zero_requests, pod_requests, Resources,
};
use k8s_semantics::scheduling::{
    match_topology_selector_terms, NodeSelector, PreferredSchedulingTerms, RequiredNodeAffinity,
    NO_SCHEDULE,
};

use super::{filter, score};
use crate::controllers::quantity::{of, Milli};
use crate::selector::LabelSelector;

/// The scheduler name a pod gets when `spec.schedulerName` is empty.
pub const DEFAULT_SCHEDULER_NAME: &str = "default-scheduler";
/// The annotation that tells a provisioner (or ferro's volume binder) which node a
/// WaitForFirstConsumer claim's volume must be reachable from.
pub const SELECTED_NODE_ANNOTATION: &str = "volume.kubernetes.io/selected-node";

const TAINT_NOT_READY: &str = "node.kubernetes.io/not-ready";
const TAINT_UNREACHABLE: &str = "node.kubernetes.io/unreachable";
const NO_PROVISIONER: &str = "kubernetes.io/no-provisioner";

// reasons, as upstream prints them
const REASON_VOLUME_NODE_CONFLICT: &str = "node(s) had volume node affinity conflict";
const REASON_VOLUME_BIND_CONFLICT: &str =
    "node(s) didn't find available persistent volumes to bind";
const REASON_PV_NOT_EXIST: &str =
    "node(s) unavailable due to one or more pvc(s) bound to non-existent pv(s)";
const REASON_IMMEDIATE_CLAIMS: &str = "pod has unbound immediate PersistentVolumeClaims";
const REASON_NOT_ENOUGH_SPACE: &str = "node(s) did not have enough free storage";
const PREEMPTION_NOT_HELPFUL: &str = "Preemption is not helpful for scheduling";
const PREEMPTION_NO_VICTIMS: &str = "No preemption victims found for incoming pod";

static NO_LABELS: BTreeMap<String, String> = BTreeMap::new();

// ---------------------------------------------------------------------------
// requests
// ---------------------------------------------------------------------------

/// What a pod takes from its node: its effective requests (`k8s_semantics::pod_requests`:
/// init containers, sidecars, overhead, limits standing in for missing requests) and one pod.
fn pod_usage(pod: &Pod) -> Resources {
    let mut r = pod_requests(pod);
    r.pods = Milli(1000);
    r
}

/// cpu and memory requested, with upstream's scoring defaults for containers that set none.
fn non_zero_usage(pod: &Pod) -> (Milli, Milli) {
    let r = pod_non_zero_requests(pod);
    (r.cpu, r.memory)
}

// ---------------------------------------------------------------------------
// host ports
// ---------------------------------------------------------------------------

/// A used or wanted host port: protocol (default TCP), host IP (default 0.0.0.0), port.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub(super) struct HostPort {
    protocol: String,
    ip: String,
    port: i32,
}

const ANY_IP: &str = "0.0.0.0";

/// The host ports of the containers and sidecars (upstream reads the containers).
fn host_ports(pod: &Pod) -> Vec<HostPort> {
    let Some(spec) = pod.spec.as_ref() else {
        return Vec::new();
    };
    let sidecars = spec
        .init_containers
        .iter()
        .flatten()
        .filter(|c| is_restartable_init_container(c));
    let mut out = Vec::new();
    for c in spec.containers.iter().chain(sidecars) {
        for p in c.ports.iter().flatten() {
            let Some(port) = p.host_port.filter(|p| *p > 0) else {
                continue;
            };
            let protocol = p
                .protocol
                .clone()
                .filter(|s| !s.is_empty())
                .unwrap_or_else(|| "TCP".into());
            let ip = p
                .host_ip
                .clone()
                .filter(|s| !s.is_empty())
                .unwrap_or_else(|| ANY_IP.into());
            out.push(HostPort { protocol, ip, port });
        }
    }
    out
}

// ---------------------------------------------------------------------------
// images
// ---------------------------------------------------------------------------

/// Normalizes an image reference to the fully qualified form a container runtime reports
/// (`nginx` -> `docker.io/library/nginx:latest`, `foo/bar:1` -> `docker.io/foo/bar:1`), so that
/// pod images match `node.status.images` names. With a digest, the tag is dropped.
/// (Upstream only appends `:latest`; the domain completion is ferro's addition, since
/// containerd reports fully qualified names.)
pub fn normalize_image(name: &str) -> String {
    let (named, digest) = match name.split_once('@') {
        Some((n, d)) => (n, Some(d)),
        None => (name, None),
    };
    let last_slash = named.rfind('/');
    let (repo, tag) = match named.rfind(':') {
        Some(i) if last_slash.is_none_or(|s| i > s) => (&named[..i], Some(&named[i + 1..])),
        _ => (named, None),
    };
    let repo = match repo.split_once('/') {
        None => format!("docker.io/library/{repo}"),
        Some((first, rest))
            if first.contains('.') || first.contains(':') || first == "localhost" =>
        {
            if (first == "docker.io" || first == "index.docker.io") && !rest.contains('/') {
                format!("docker.io/library/{rest}")
            } else if first == "index.docker.io" {
                format!("docker.io/{rest}")
            } else {
                repo.to_string()
            }
        }
        Some(_) => format!("docker.io/{repo}"),
    };
    match (digest, tag) {
        (Some(d), _) => format!("{repo}@{d}"),
        (None, Some(t)) => format!("{repo}:{t}"),
        (None, None) => format!("{repo}:latest"),
    }
}

fn pod_images(pod: &Pod) -> Vec<String> {
    let Some(spec) = pod.spec.as_ref() else {
        return Vec::new();
    };
    spec.init_containers
        .iter()
        .flatten()
        .chain(spec.containers.iter())
        .filter_map(|c| c.image.as_deref())
        .filter(|i| !i.is_empty())
        .map(normalize_image)
        .collect()
}

// ---------------------------------------------------------------------------
// NodeInfo
// ---------------------------------------------------------------------------

/// Aggregates of one node: the node object and what its (non-terminal) pods use. The executor
/// keeps one per node, calls [`NodeInfo::add_pod`] for each bound or assumed pod and
/// [`NodeInfo::remove_pod`] when it goes away or ends (with the same pod object it added, or
/// one with the same spec).
#[derive(Clone, Debug)]
pub struct NodeInfo {
    /// The node as last observed.
    pub node: Arc<Node>,
    name: String,
    pub(super) allocatable: Resources,
    /// None when the Ready condition is True; otherwise the taint upstream would have added.
    pub(super) not_ready_taint: Option<Taint>,
    /// Normalized image name -> size in bytes.
    pub(super) images: HashMap<String, i128>,
    pub(super) requested: Resources,
    non_zero_cpu: Milli,
    non_zero_memory: Milli,
    ports: HashMap<HostPort, u32>,
    /// (protocol, port) -> uses on any IP, for wildcard conflicts.
    ports_any_ip: HashMap<(String, i32), u32>,
}

impl NodeInfo {
    /// A node with no pods.
    pub fn new(node: Arc<Node>) -> NodeInfo {
        let mut info = NodeInfo {
            node: node.clone(),
            name: String::new(),
            allocatable: Resources::default(),
            not_ready_taint: None,
            images: HashMap::new(),
            requested: Resources::default(),
            non_zero_cpu: Milli(0),
            non_zero_memory: Milli(0),
            ports: HashMap::new(),
            ports_any_ip: HashMap::new(),
        };
        info.set_node(node);
        info
    }

    /// Replaces the node object (it was updated); the pod aggregates are kept.
    pub fn set_node(&mut self, node: Arc<Node>) {
        self.name = node.metadata.name.clone().unwrap_or_default();
        let status = node.status.as_ref();
        self.allocatable = status
            .and_then(|s| s.allocatable.as_ref())
            .map(Resources::from_list)
            .unwrap_or_default();
        let ready = status
            .and_then(|s| s.conditions.as_ref())
            .and_then(|cs| cs.iter().find(|c| c.type_ == "Ready"))
            .map(|c| c.status.as_str());
        self.not_ready_taint = match ready {
            Some("True") => None,
            Some("Unknown") => Some(no_schedule_taint(TAINT_UNREACHABLE)),
            _ => Some(no_schedule_taint(TAINT_NOT_READY)),
        };
        self.images.clear();
        for image in status.and_then(|s| s.images.as_ref()).into_iter().flatten() {
            let size = i128::from(image.size_bytes.unwrap_or(0).max(0));
            for name in image.names.iter().flatten() {
                self.images.insert(normalize_image(name), size);
            }
        }
        self.node = node;
    }

    /// Adds a bound or assumed pod (the caller makes sure each pod is added once).
    pub fn add_pod(&mut self, pod: &Pod) {
        self.requested.add(&pod_usage(pod));
        let (cpu, memory) = non_zero_usage(pod);
        self.non_zero_cpu += cpu;
        self.non_zero_memory += memory;
        for p in host_ports(pod) {
            *self
                .ports_any_ip
                .entry((p.protocol.clone(), p.port))
                .or_default() += 1;
            *self.ports.entry(p).or_default() += 1;
        }
    }

    /// Removes a pod added before.
    pub fn remove_pod(&mut self, pod: &Pod) {
        self.requested.sub(&pod_usage(pod));
        let (cpu, memory) = non_zero_usage(pod);
        self.non_zero_cpu -= cpu;
        self.non_zero_memory -= memory;
        for p in host_ports(pod) {
            let key = (p.protocol.clone(), p.port);
            if let Some(n) = self.ports_any_ip.get_mut(&key) {
                *n -= 1;
                if *n == 0 {
                    self.ports_any_ip.remove(&key);
                }
            }
            if let Some(n) = self.ports.get_mut(&p) {
                *n -= 1;
                if *n == 0 {
                    self.ports.remove(&p);
                }
            }
        }
    }

    /// The node's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The sum of the requests of the node's pods (`pods` is 1000 per pod).
    pub fn requested(&self) -> &Resources {
        &self.requested
    }

    /// The node's allocatable resources.
    pub fn allocatable(&self) -> &Resources {
        &self.allocatable
    }

    /// How many pods the node holds.
    pub fn pod_count(&self) -> usize {
        usize::try_from(self.requested.pods.0 / 1000).unwrap_or(0)
    }

    /// cpu and memory requested, with the scoring defaults for containers that set none.
    pub fn non_zero_requested(&self) -> (Milli, Milli) {
        (self.non_zero_cpu, self.non_zero_memory)
    }

    pub(super) fn labels(&self) -> &BTreeMap<String, String> {
        self.node.metadata.labels.as_ref().unwrap_or(&NO_LABELS)
    }

    pub(super) fn taints(&self) -> &[Taint] {
        self.node
            .spec
            .as_ref()
            .and_then(|s| s.taints.as_deref())
            .unwrap_or(&[])
    }

    pub(super) fn port_conflicts(&self, p: &HostPort) -> bool {
        if p.ip == ANY_IP {
            return self
                .ports_any_ip
                .contains_key(&(p.protocol.clone(), p.port));
        }
        let wildcard = HostPort {
            ip: ANY_IP.to_string(),
            ..p.clone()
        };
        self.ports.contains_key(p) || self.ports.contains_key(&wildcard)
    }
}

// ---------------------------------------------------------------------------
// taints
// ---------------------------------------------------------------------------

/// A NoSchedule taint without a value, as the node lifecycle controller adds for a node
/// condition or a cordon.
pub(super) fn no_schedule_taint(key: &str) -> Taint {
    Taint {
        key: key.to_string(),
        effect: NO_SCHEDULE.to_string(),
        value: None,
        time_added: None,
    }
}

// ---------------------------------------------------------------------------
// volumes
// ---------------------------------------------------------------------------

/// What the scheduler needs to know about volumes for a pod (built by the executor from the
/// PVC, PV and StorageClass informers).
pub struct VolumeView<'a> {
    /// Looks a claim up by namespace and name.
    pub claims: &'a dyn Fn(&str, &str) -> Option<Arc<PersistentVolumeClaim>>,
    /// All persistent volumes.
    pub volumes: &'a [Arc<PersistentVolume>],
    /// Looks a storage class up by name.
    pub class: &'a dyn Fn(&str) -> Option<Arc<StorageClass>>,
    /// Looks a CSIDriver up by name (its `storageCapacity` makes provisioning depend on the
    /// published capacity).
    pub driver: &'a dyn Fn(&str) -> Option<Arc<CSIDriver>>,
    /// Every CSIStorageCapacity object.
    pub capacities: &'a [Arc<CSIStorageCapacity>],
}

/// A claim of the pod, as the volume filter sees it.
pub(super) enum ClaimState {
    /// Bound to a volume (None: the volume does not exist).
    Bound(Option<Arc<PersistentVolume>>),
    /// Unbound with a WaitForFirstConsumer class.
    Delayed {
        claim: Arc<PersistentVolumeClaim>,
        class: Arc<StorageClass>,
    },
}

/// A claim's storage class: `spec.storageClassName`, else the beta annotation.
fn claim_class(claim: &PersistentVolumeClaim) -> &str {
    if let Some(c) = claim
        .spec
        .as_ref()
        .and_then(|s| s.storage_class_name.as_deref())
    {
        return c;
    }
    claim
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get("volume.beta.kubernetes.io/storage-class"))
        .map(String::as_str)
        .unwrap_or("")
}

fn pv_class(pv: &PersistentVolume) -> &str {
    if let Some(c) = pv
        .spec
        .as_ref()
        .and_then(|s| s.storage_class_name.as_deref())
    {
        return c;
    }
    pv.metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get("volume.beta.kubernetes.io/storage-class"))
        .map(String::as_str)
        .unwrap_or("")
}

/// Whether a PV's `spec.nodeAffinity.required` admits the node (no affinity admits all).
fn pv_fits_node(pv: &PersistentVolume, node: &NodeInfo) -> bool {
    match pv
        .spec
        .as_ref()
        .and_then(|s| s.node_affinity.as_ref())
        .and_then(|a| a.required.as_ref())
    {
        None => true,
        Some(sel) => NodeSelector::new(sel).matches(node.name(), node.labels()),
    }
}

fn storage_of(list: Option<&BTreeMap<String, Quantity>>) -> Milli {
    list.and_then(|l| l.get("storage"))
        .map(of)
        .unwrap_or_default()
}

/// Whether the PV is reserved for the claim (`spec.claimRef` names it).
fn prebound_to(pv: &PersistentVolume, claim: &PersistentVolumeClaim) -> Option<bool> {
    let r = pv.spec.as_ref()?.claim_ref.as_ref()?;
    let same = r.name.as_deref() == claim.metadata.name.as_deref()
        && r.namespace.as_deref() == claim.metadata.namespace.as_deref()
        && match (r.uid.as_deref(), claim.metadata.uid.as_deref()) {
            (Some(a), Some(b)) if !a.is_empty() && !b.is_empty() => a == b,
            _ => true,
        };
    Some(same)
}

/// The smallest available PV that can back the claim on the node, skipping `taken` ones (a
/// volume reserved for the claim through its claimRef wins). Upstream `FindMatchingVolume`.
fn find_volume<'v>(
    claim: &PersistentVolumeClaim,
    volumes: &'v [Arc<PersistentVolume>],
    node: &NodeInfo,
    taken: &[&str],
) -> Option<&'v Arc<PersistentVolume>> {
    let spec = claim.spec.as_ref();
    let class = claim_class(claim);
    let want = storage_of(
        spec.and_then(|s| s.resources.as_ref())
            .and_then(|r| r.requests.as_ref()),
    );
    let modes = spec.and_then(|s| s.access_modes.as_deref()).unwrap_or(&[]);
    let mode = spec
        .and_then(|s| s.volume_mode.as_deref())
        .unwrap_or("Filesystem");
    let selector = spec
        .and_then(|s| s.selector.as_ref())
        .map(LabelSelector::from_api);
    let mut best: Option<(&Arc<PersistentVolume>, Milli)> = None;
    for pv in volumes {
        let name = pv.metadata.name.as_deref().unwrap_or("");
        if pv.metadata.deletion_timestamp.is_some() || taken.contains(&name) {
            continue;
        }
        let Some(pspec) = pv.spec.as_ref() else {
            continue;
        };
        if pspec.volume_mode.as_deref().unwrap_or("Filesystem") != mode {
            continue;
        }
        match prebound_to(pv, claim) {
            Some(true) => {
                if pv_fits_node(pv, node) {
                    return Some(pv);
                }
                continue;
            }
            Some(false) => continue,
            None => {}
        }
        if pv.status.as_ref().and_then(|s| s.phase.as_deref()) != Some("Available")
            || pv_class(pv) != class
        {
            continue;
        }
        let labels = pv.metadata.labels.as_ref().unwrap_or(&NO_LABELS);
        let selected = match &selector {
            None => true,
            Some(Ok(sel)) => sel.matches(labels),
            Some(Err(_)) => false,
        };
        if !selected {
            continue;
        }
        let pv_modes = pspec.access_modes.as_deref().unwrap_or(&[]);
        if !modes.iter().all(|m| pv_modes.contains(m)) {
            continue;
        }
        let size = storage_of(pspec.capacity.as_ref());
        if size < want || best.is_some_and(|(_, s)| s <= size) {
            continue;
        }
        if !pv_fits_node(pv, node) {
            continue;
        }
        best = Some((pv, size));
    }
    best.map(|(pv, _)| pv)
}

fn can_provision(class: &StorageClass, node: &NodeInfo) -> bool {
    !class.provisioner.is_empty()
        && class.provisioner != NO_PROVISIONER
        && match_topology_selector_terms(
            class.allowed_topologies.as_deref().unwrap_or(&[]),
            node.labels(),
        )
}

/// Upstream's hasEnoughCapacity: when the class's CSI driver publishes storage capacity
/// (`storageCapacity: true`), some CSIStorageCapacity of the class whose node topology
/// selects the node must hold the claim (its maximumVolumeSize when set, else its capacity);
/// drivers that publish none are not checked.
fn has_enough_capacity(claim: &PersistentVolumeClaim, class: &StorageClass, node: &NodeInfo, view: &VolumeView) -> bool {
    let tracks = (view.driver)(&class.provisioner)
        .is_some_and(|d| d.spec.storage_capacity == Some(true));
    if !tracks {
        return true;
    }
    let size = storage_of(claim.spec.as_ref().and_then(|s| s.resources.as_ref()).and_then(|r| r.requests.as_ref()));
    let class_name = class.metadata.name.as_deref().unwrap_or("");
    view.capacities.iter().any(|c| {
        if c.storage_class_name != class_name {
            return false;
        }
        // A missing or invalid topology selects no node.
        let selects = c
            .node_topology
            .as_ref()
            .and_then(|t| LabelSelector::from_api(t).ok())
            .is_some_and(|sel| sel.matches(node.labels()));
        let room = c.maximum_volume_size.as_ref().or(c.capacity.as_ref());
        selects && room.is_some_and(|q| of(q) >= size)
    })
}



/// The VolumeBinding PreFilter: resolves the pod's claims, or fails the whole pod.
fn resolve_claims(pod: &Pod, view: &VolumeView) -> Result<Vec<ClaimState>, String> {
    let ns = pod.metadata.namespace.as_deref().unwrap_or("default");
    let pod_name = pod.metadata.name.as_deref().unwrap_or("");
    let mut out = Vec::new();
    let mut immediate = false;
    for v in pod
        .spec
        .as_ref()
        .and_then(|s| s.volumes.as_ref())
        .into_iter()
        .flatten()
    {
        let (name, ephemeral) = if let Some(src) = v.persistent_volume_claim.as_ref() {
            (src.claim_name.clone(), false)
        } else if v.ephemeral.is_some() {
            (format!("{pod_name}-{}", v.name), true)
        } else {
            continue;
        };
        let Some(claim) = (view.claims)(ns, &name) else {
            return Err(if ephemeral {
                format!("waiting for ephemeral volume controller to create the persistentvolumeclaim \"{name}\"")
            } else {
                format!("persistentvolumeclaim \"{name}\" not found")
            });
        };
        if claim.metadata.deletion_timestamp.is_some() {
            return Err(format!("persistentvolumeclaim \"{name}\" is being deleted"));
        }
        if ephemeral {
            let owned = claim.metadata.owner_references.iter().flatten().any(|r| {
                r.controller == Some(true)
                    && pod.metadata.uid.as_deref().is_some_and(|u| u == r.uid)
            });
            if !owned {
                return Err(format!(
                    "PVC {ns}/{name} was not created for pod {ns}/{pod_name} (pod is not owner)"
                ));
            }
        }
        let bound = claim
            .spec
            .as_ref()
            .and_then(|s| s.volume_name.as_deref())
            .filter(|n| !n.is_empty());
        if let Some(pv_name) = bound {
            let pv = view
                .volumes
                .iter()
                .find(|pv| pv.metadata.name.as_deref() == Some(pv_name))
                .cloned();
            out.push(ClaimState::Bound(pv));
            continue;
        }
        let class_name = claim_class(&claim);
        let class = if class_name.is_empty() {
            None
        } else {
            (view.class)(class_name)
        };
        match class {
            Some(class) if class.volume_binding_mode.as_deref() == Some("WaitForFirstConsumer") => {
                out.push(ClaimState::Delayed { claim, class });
            }
            // Immediate, no class, or a class not (yet) known: the PV controller binds it
            _ => immediate = true,
        }
    }
    if immediate {
        return Err(REASON_IMMEDIATE_CLAIMS.to_string());
    }
    Ok(out)
}

/// The result of the volume filter on one node.
#[derive(Default)]
pub(super) struct VolumePlan {
    pub(super) reasons: Vec<&'static str>,
    /// (claim, pv) for delayed claims that an existing volume can back.
    static_bindings: Vec<(String, String)>,
}

pub(super) fn plan_volumes(
    claims: &[ClaimState],
    view: &VolumeView,
    node: &NodeInfo,
) -> VolumePlan {
    let mut plan = VolumePlan::default();
    let mut missing_pv = false;
    let mut conflict = false;
    let mut unbindable = false;
    let mut no_space = false;
    let mut taken: Vec<&str> = Vec::new();
    for c in claims {
        match c {
            ClaimState::Bound(None) => missing_pv = true,
            ClaimState::Bound(Some(pv)) => {
                if !pv_fits_node(pv, node) {
                    conflict = true;
                }
            }
            ClaimState::Delayed { claim, class } => {
                if let Some(pv) = find_volume(claim, view.volumes, node, &taken) {
                    let pv_name = pv.metadata.name.as_deref().unwrap_or("");
                    taken.push(pv_name);
                    plan.static_bindings.push((
                        claim.metadata.name.clone().unwrap_or_default(),
                        pv_name.to_string(),
                    ));
                } else if !can_provision(class, node) {
                    unbindable = true;
                } else if !has_enough_capacity(claim, class, node, view) {
                    no_space = true;
                }
            }
        }
    }
    if missing_pv {
        plan.reasons.push(REASON_PV_NOT_EXIST);
    }
    if conflict {
        plan.reasons.push(REASON_VOLUME_NODE_CONFLICT);
    }
    if unbindable {
        plan.reasons.push(REASON_VOLUME_BIND_CONFLICT);
    }
    if no_space {
        plan.reasons.push(REASON_NOT_ENOUGH_SPACE);
    }
    plan
}

// ---------------------------------------------------------------------------
// schedule
// ---------------------------------------------------------------------------

/// A claim the scheduler found an existing volume for.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StaticBinding {
    /// The claim's name (in the pod's namespace).
    pub claim: String,
    /// The persistent volume that can back it on the chosen node.
    pub volume: String,
}

/// Where the pod goes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Decision {
    /// The chosen node.
    pub node: String,
    /// Claims (names, in the pod's namespace) that are unbound with a WaitForFirstConsumer
    /// class and must get the annotation `volume.kubernetes.io/selected-node=<node>`, in the
    /// order of the pod's volumes.
    pub select_node_for_claims: Vec<String>,
    /// The subset of `select_node_for_claims` that an existing Available volume can back on the
    /// chosen node, with that volume (upstream's scheduler binds these itself by setting the
    /// volume's claimRef; a binder that matches volumes by the selected node finds the same
    /// ones). The other claims need dynamic provisioning.
    pub static_bindings: Vec<StaticBinding>,
}

/// Why no node fits.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Unschedulable {
    /// The message upstream puts in the PodScheduled condition and the FailedScheduling event.
    pub message: String,
    /// How many nodes failed for each reason (a node can count toward several reasons of the
    /// same filter; a pre-filter failure, e.g. a missing claim, is one reason for all nodes).
    pub reasons: BTreeMap<String, usize>,
}

/// Whether the pod waits for this scheduler: no `spec.nodeName`, `spec.schedulerName`
/// (default `default-scheduler`) matches, not terminating, not Succeeded or Failed.
pub fn is_pending(pod: &Pod, scheduler_name: &str) -> bool {
    let Some(spec) = pod.spec.as_ref() else {
        return false;
    };
    let name = spec
        .scheduler_name
        .as_deref()
        .filter(|n| !n.is_empty())
        .unwrap_or(DEFAULT_SCHEDULER_NAME);
    spec.node_name.as_deref().is_none_or(str::is_empty)
        && name == scheduler_name
        && pod.metadata.deletion_timestamp.is_none()
        && !matches!(
            pod.status.as_ref().and_then(|s| s.phase.as_deref()),
            Some("Succeeded" | "Failed")
        )
}

/// Everything about the pod, computed once per decision.
pub(super) struct PodFacts<'a> {
    pub(super) requests: Resources,
    pub(super) non_zero: (Milli, Milli),
    pub(super) tolerations: &'a [Toleration],
    pub(super) required: RequiredNodeAffinity,
    pub(super) preferred: PreferredSchedulingTerms,
    pub(super) ports: Vec<HostPort>,
    pub(super) claims: Vec<ClaimState>,
    pub(super) images: Vec<String>,
}

impl<'a> PodFacts<'a> {
    fn new(pod: &'a Pod, claims: Vec<ClaimState>) -> PodFacts<'a> {
        let spec = pod.spec.as_ref();
        PodFacts {
            requests: pod_usage(pod),
            non_zero: non_zero_usage(pod),
            tolerations: spec.and_then(|s| s.tolerations.as_deref()).unwrap_or(&[]),
            required: RequiredNodeAffinity::of(pod),
            // upstream fails the scoring of a pod with an invalid preferred term (validation
            // refuses one); ferro scores such a pod without preferences
            preferred: PreferredSchedulingTerms::of(pod).unwrap_or_default(),
            ports: host_ports(pod),
            claims,
            images: pod_images(pod),
        }
    }
}

/// Builds upstream's `FitError` text: sorted "count reason" strings.
fn histogram(counts: &BTreeMap<String, usize>) -> String {
    let mut parts: Vec<String> = counts.iter().map(|(r, n)| format!("{n} {r}")).collect();
    parts.sort();
    parts.join(", ")
}

fn unschedulable(
    total: usize,
    reasons: BTreeMap<String, usize>,
    prefilter: Option<String>,
    preemption: &BTreeMap<String, usize>,
) -> Unschedulable {
    let head = match &prefilter {
        Some(msg) => msg.clone(),
        None => histogram(&reasons),
    };
    let message = format!(
        "0/{total} nodes are available: {head}. preemption: 0/{total} nodes are available: {}.",
        histogram(preemption)
    );
    Unschedulable { message, reasons }
}

/// Picks a node for a pending pod among `nodes`, or explains why none fits in upstream's
/// words. See the module documentation for the filters, scores and tie-breaking.
pub fn schedule(
    pod: &Pod,
    nodes: &[&NodeInfo],
    volumes: &VolumeView,
) -> Result<Decision, Unschedulable> {
    let total = nodes.len();
    if total == 0 {
        return Err(Unschedulable {
            message: "0/0 nodes are available: no nodes available to schedule pods.".to_string(),
            reasons: BTreeMap::new(),
        });
    }
    let claims = match resolve_claims(pod, volumes) {
        Ok(c) => c,
        Err(msg) => {
            let reasons = BTreeMap::from([(msg.clone(), total)]);
            let preemption = BTreeMap::from([(PREEMPTION_NOT_HELPFUL.to_string(), total)]);
            return Err(unschedulable(total, reasons, Some(msg), &preemption));
        }
    };
    let facts = PodFacts::new(pod, claims);

    let mut feasible: Vec<&NodeInfo> = Vec::with_capacity(total);
    let mut reasons: BTreeMap<String, usize> = BTreeMap::new();
    let mut preemption: BTreeMap<String, usize> = BTreeMap::new();
    for node in nodes {
        match filter::run(&facts, node, volumes) {
            Ok(()) => feasible.push(node),
            Err(f) => {
                for r in f.reasons {
                    *reasons.entry(r).or_default() += 1;
                }
                let p = if f.resolvable {
                    PREEMPTION_NO_VICTIMS
                } else {
                    PREEMPTION_NOT_HELPFUL
                };
                *preemption.entry(p.to_string()).or_default() += 1;
            }
        }
    }
    if feasible.is_empty() {
        return Err(unschedulable(total, reasons, None, &preemption));
    }

    let best = if feasible.len() == 1 {
        feasible[0]
    } else {
        best_node(&facts, &feasible, nodes)
    };
    let mut decision = Decision {
        node: best.name().to_string(),
        select_node_for_claims: Vec::new(),
        static_bindings: Vec::new(),
    };
    if facts
        .claims
        .iter()
        .any(|c| matches!(c, ClaimState::Delayed { .. }))
    {
        decision.select_node_for_claims = facts
            .claims
            .iter()
            .filter_map(|c| match c {
                ClaimState::Delayed { claim, .. } => {
                    Some(claim.metadata.name.clone().unwrap_or_default())
                }
                ClaimState::Bound(_) => None,
            })
            .collect();
        decision.static_bindings = plan_volumes(&facts.claims, volumes, best)
            .static_bindings
            .into_iter()
            .map(|(claim, volume)| StaticBinding { claim, volume })
            .collect();
    }
    Ok(decision)
}

/// Each node's filter verdict for a pod, in node order (explanations): `Ok` with the failing
/// reasons per node (empty when the node fits), or `Err` with a pre-filter failure such as a
/// missing claim.
pub fn filter_each(pod: &Pod, nodes: &[&NodeInfo], volumes: &VolumeView) -> Result<Vec<(String, Vec<String>)>, String> {
    let facts = PodFacts::new(pod, resolve_claims(pod, volumes)?);
    Ok(nodes
        .iter()
        .map(|n| {
            let reasons = match filter::run(&facts, n, volumes) {
                Ok(()) => Vec::new(),
                Err(f) => f.reasons,
            };
            (n.name().to_string(), reasons)
        })
        .collect())
}

/// Picks among the feasible nodes by their total score ([`score::scores`]); ties go to the
/// fewest pods, then the smallest name.
fn best_node<'n>(facts: &PodFacts, feasible: &[&'n NodeInfo], all: &[&NodeInfo]) -> &'n NodeInfo {
    let totals = score::scores(facts, feasible, all);
    let mut best = 0;
    for i in 1..feasible.len() {
        let (a, b) = (feasible[i], feasible[best]);
        let better = totals[i]
            .cmp(&totals[best])
            .then_with(|| b.pod_count().cmp(&a.pod_count()))
            .then_with(|| b.name().cmp(a.name()));
        if better == std::cmp::Ordering::Greater {
            best = i;
        }
    }
    feasible[best]
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use crate::controllers::scheduler::score::MB;
    use k8s_semantics::resources::{DEFAULT_MEMORY_REQUEST, DEFAULT_MILLI_CPU_REQUEST};
    use serde_json::{json, Value};

    fn from<T: serde::de::DeserializeOwned>(v: Value) -> T {
        serde_json::from_value(v).unwrap()
    }

    /// A Ready node with 4 cpu, 8Gi memory, 110 pods and the given extra fields merged in.
    fn node_json(name: &str) -> Value {
        json!({
            "metadata": {"name": name, "labels": {"kubernetes.io/hostname": name}},
            "spec": {},
            "status": {
                "allocatable": {"cpu": "4", "memory": "8Gi", "pods": "110", "ephemeral-storage": "10Gi"},
                "conditions": [{"type": "Ready", "status": "True"}]
            }
        })
    }

    fn merge(a: &mut Value, b: Value) {
        match (a, b) {
            (Value::Object(a), Value::Object(b)) => {
                for (k, v) in b {
                    merge(a.entry(k).or_insert(Value::Null), v);
                }
            }
            (a, b) => *a = b,
        }
    }

    fn node_with(name: &str, extra: Value) -> NodeInfo {
        let mut n = node_json(name);
        merge(&mut n, extra);
        NodeInfo::new(Arc::new(from(n)))
    }

    fn node(name: &str) -> NodeInfo {
        node_with(name, json!({}))
    }

    fn pod_with(extra: Value) -> Pod {
        let mut p = json!({
            "metadata": {"name": "p", "namespace": "default", "uid": "pod-uid"},
            "spec": {"containers": [{"name": "c", "image": "nginx"}]}
        });
        merge(&mut p, extra);
        from(p)
    }

    fn pod_requesting(cpu: &str, memory: &str) -> Pod {
        pod_with(json!({"spec": {"containers": [
            {"name": "c", "image": "nginx", "resources": {"requests": {"cpu": cpu, "memory": memory}}}
        ]}}))
    }

    struct Volumes {
        claims: Vec<Arc<PersistentVolumeClaim>>,
        volumes: Vec<Arc<PersistentVolume>>,
        classes: Vec<Arc<StorageClass>>,
        drivers: Vec<Arc<CSIDriver>>,
        capacities: Vec<Arc<CSIStorageCapacity>>,
    }

    impl Volumes {
        fn none() -> Volumes {
            Volumes {
                claims: vec![],
                volumes: vec![],
                classes: vec![],
                drivers: vec![],
                capacities: vec![],
            }
        }

        fn run<R>(&self, f: impl FnOnce(&VolumeView) -> R) -> R {
            let claims = |ns: &str, name: &str| {
                self.claims
                    .iter()
                    .find(|c| {
                        c.metadata.namespace.as_deref() == Some(ns)
                            && c.metadata.name.as_deref() == Some(name)
                    })
                    .cloned()
            };
            let class = |name: &str| {
                self.classes
                    .iter()
                    .find(|c| c.metadata.name.as_deref() == Some(name))
                    .cloned()
            };
            let driver = |name: &str| {
                self.drivers
                    .iter()
                    .find(|d| d.metadata.name.as_deref() == Some(name))
                    .cloned()
            };
            f(&VolumeView {
                claims: &claims,
                volumes: &self.volumes,
                class: &class,
                driver: &driver,
                capacities: &self.capacities,
            })
        }
    }

    fn sched(pod: &Pod, nodes: &[&NodeInfo]) -> Result<Decision, Unschedulable> {
        Volumes::none().run(|v| schedule(pod, nodes, v))
    }

    fn sched_vol(
        pod: &Pod,
        nodes: &[&NodeInfo],
        vols: &Volumes,
    ) -> Result<Decision, Unschedulable> {
        vols.run(|v| schedule(pod, nodes, v))
    }

    fn fits(pod: &Pod, node: &NodeInfo) -> bool {
        sched(pod, &[node]).is_ok()
    }

    fn reasons_of(pod: &Pod, node: &NodeInfo) -> Vec<String> {
        sched(pod, &[node])
            .unwrap_err()
            .reasons
            .into_keys()
            .collect()
    }

    // ---- requests

    #[test]
    fn requests_take_the_larger_of_init_and_app_containers_plus_overhead() {
        let pod = pod_with(json!({"spec": {
            "initContainers": [
                {"name": "i1", "resources": {"requests": {"cpu": "2", "memory": "100Mi"}}},
                {"name": "i2", "resources": {"requests": {"cpu": "500m", "memory": "1Gi"}}}
            ],
            "containers": [
                {"name": "a", "resources": {"requests": {"cpu": "250m", "memory": "200Mi"}}},
                {"name": "b", "resources": {"requests": {"cpu": "250m", "memory": "200Mi", "example.com/gpu": "1"}}}
            ],
            "overhead": {"cpu": "100m", "memory": "10Mi"}
        }}));
        let r = pod_usage(&pod);
        assert_eq!(r.cpu, Milli(2100));
        assert_eq!(r.memory, Milli((1024 + 10) * MB * 1000));
        assert_eq!(r.pods, Milli(1000));
        assert_eq!(r.get("example.com/gpu"), Milli(1000));
    }

    #[test]
    fn sidecars_add_to_the_app_containers_and_to_later_init_containers() {
        let pod = pod_with(json!({"spec": {
            "initContainers": [
                {"name": "side", "restartPolicy": "Always", "resources": {"requests": {"cpu": "1"}}},
                {"name": "init", "resources": {"requests": {"cpu": "2"}}}
            ],
            "containers": [{"name": "a", "resources": {"requests": {"cpu": "500m"}}}]
        }}));
        // app 0.5 + sidecar 1 = 1.5; init 2 + sidecar 1 = 3
        assert_eq!(pod_usage(&pod).cpu, Milli(3000));
    }

    #[test]
    fn limits_stand_in_for_missing_requests() {
        let pod = pod_with(json!({"spec": {"containers": [
            {"name": "a", "resources": {"limits": {"cpu": "1", "memory": "1Gi"}, "requests": {"memory": "512Mi"}}}
        ]}}));
        let r = pod_usage(&pod);
        assert_eq!(r.cpu, Milli(1000));
        assert_eq!(r.memory, Milli(512 * MB * 1000));
    }

    #[test]
    fn best_effort_pod_requests_nothing_but_counts_as_a_pod() {
        let pod = pod_with(json!({}));
        let r = pod_usage(&pod);
        assert_eq!(r.cpu, Milli(0));
        assert_eq!(r.memory, Milli(0));
        assert_eq!(r.pods, Milli(1000));
        assert_eq!(
            non_zero_usage(&pod),
            (DEFAULT_MILLI_CPU_REQUEST, DEFAULT_MEMORY_REQUEST)
        );
        let mut n = node_with("n", json!({"status": {"allocatable": {"pods": "1"}}}));
        assert!(fits(&pod, &n));
        n.add_pod(&pod);
        assert_eq!(n.pod_count(), 1);
        assert_eq!(reasons_of(&pod, &n), vec!["Too many pods"]);
    }

    #[test]
    fn explicit_zero_requests_are_not_defaulted_for_scoring() {
        let pod = pod_requesting("0", "0");
        assert_eq!(non_zero_usage(&pod), (Milli(0), Milli(0)));
    }

    // ---- resource fit

    #[test]
    fn resource_fit_accepts_and_rejects_each_resource() {
        let n = node_with(
            "n",
            json!({"status": {"allocatable": {"example.com/gpu": "1"}}}),
        );
        assert!(fits(&pod_requesting("4", "8Gi"), &n));
        assert_eq!(
            reasons_of(&pod_requesting("4001m", "1Gi"), &n),
            vec!["Insufficient cpu"]
        );
        assert_eq!(
            reasons_of(&pod_requesting("1", "9Gi"), &n),
            vec!["Insufficient memory"]
        );
        // several reasons of one filter all count
        assert_eq!(
            reasons_of(&pod_requesting("5", "9Gi"), &n),
            vec!["Insufficient cpu", "Insufficient memory"]
        );
        let eph = pod_with(json!({"spec": {"containers": [
            {"name": "a", "resources": {"requests": {"ephemeral-storage": "11Gi"}}}
        ]}}));
        assert_eq!(reasons_of(&eph, &n), vec!["Insufficient ephemeral-storage"]);
        let gpu = |q: &str| {
            pod_with(json!({"spec": {"containers": [
                {"name": "a", "resources": {"requests": {"example.com/gpu": q}, "limits": {"example.com/gpu": q}}}
            ]}}))
        };
        assert!(fits(&gpu("1"), &n));
        assert_eq!(
            reasons_of(&gpu("2"), &n),
            vec!["Insufficient example.com/gpu"]
        );
        // an extended resource the node does not have at all
        let other = pod_with(json!({"spec": {"containers": [
            {"name": "a", "resources": {"requests": {"vendor.io/fpga": "1"}}}
        ]}}));
        assert_eq!(reasons_of(&other, &n), vec!["Insufficient vendor.io/fpga"]);
    }

    #[test]
    fn resource_fit_counts_the_pods_already_on_the_node() {
        let mut n = node("n");
        n.add_pod(&pod_requesting("3", "1Gi"));
        assert!(fits(&pod_requesting("1", "1Gi"), &n));
        assert_eq!(
            reasons_of(&pod_requesting("1001m", "1Gi"), &n),
            vec!["Insufficient cpu"]
        );
        // a pod that requests no cpu fits even on a full node
        n.add_pod(&pod_requesting("1", "0"));
        assert!(fits(&pod_requesting("0", "1Gi"), &n));
    }

    #[test]
    fn init_container_larger_than_app_containers_decides_the_fit() {
        let n = node("n");
        let pod = pod_with(json!({"spec": {
            "initContainers": [{"name": "i", "resources": {"requests": {"cpu": "5"}}}],
            "containers": [{"name": "a", "resources": {"requests": {"cpu": "1"}}}]
        }}));
        assert_eq!(reasons_of(&pod, &n), vec!["Insufficient cpu"]);
    }

    #[test]
    fn overhead_counts_toward_the_fit() {
        let n = node("n");
        let pod = pod_with(json!({"spec": {
            "containers": [{"name": "a", "resources": {"requests": {"cpu": "3900m"}}}],
            "overhead": {"cpu": "200m"}
        }}));
        assert_eq!(reasons_of(&pod, &n), vec!["Insufficient cpu"]);
    }

    #[test]
    fn node_without_allocatable_fits_nothing() {
        let n = NodeInfo::new(Arc::new(from(json!({
            "metadata": {"name": "bare"},
            "status": {"conditions": [{"type": "Ready", "status": "True"}]}
        }))));
        assert_eq!(reasons_of(&pod_with(json!({})), &n), vec!["Too many pods"]);
    }

    // ---- NodeInfo

    #[test]
    fn node_info_add_then_remove_restores_the_aggregates() {
        let mut n = node("n");
        let empty_requested = n.requested().clone();
        let empty_ports = n.ports.clone();
        let pods = [
            pod_with(
                json!({"spec": {"containers": [{"name": "a", "ports": [{"containerPort": 80, "hostPort": 8080}],
                "resources": {"requests": {"cpu": "1", "example.com/gpu": "1"}}}]}}),
            ),
            pod_with(
                json!({"spec": {"containers": [{"name": "a", "ports": [{"containerPort": 80, "hostPort": 8080, "hostIP": "10.0.0.1"}]}]}}),
            ),
            pod_requesting("250m", "64Mi"),
        ];
        for p in &pods {
            n.add_pod(p);
        }
        assert_eq!(n.pod_count(), 3);
        assert_eq!(n.requested().cpu, Milli(1250));
        assert_eq!(n.non_zero_requested().0, Milli(1000 + 100 + 250));
        assert!(n.port_conflicts(&HostPort {
            protocol: "TCP".into(),
            ip: "10.0.0.2".into(),
            port: 8080
        }));
        for p in pods.iter().rev() {
            n.remove_pod(p);
        }
        assert_eq!(n.requested(), &empty_requested);
        assert_eq!(n.non_zero_requested(), (Milli(0), Milli(0)));
        assert_eq!(n.ports, empty_ports);
        assert!(n.ports_any_ip.is_empty());
        assert!(n.requested().scalar.is_empty());
    }

    #[test]
    fn set_node_keeps_the_pods() {
        let mut n = node("n");
        n.add_pod(&pod_requesting("1", "1Gi"));
        let mut updated = node_json("n");
        merge(
            &mut updated,
            json!({"status": {"allocatable": {"cpu": "8"}}}),
        );
        n.set_node(Arc::new(from(updated)));
        assert_eq!(n.pod_count(), 1);
        assert_eq!(n.allocatable().cpu, Milli(8000));
        assert_eq!(n.requested().cpu, Milli(1000));
    }

    // ---- node state filters

    #[test]
    fn unschedulable_node_is_rejected_unless_tolerated() {
        let n = node_with("n", json!({"spec": {"unschedulable": true}}));
        assert_eq!(
            reasons_of(&pod_with(json!({})), &n),
            vec!["node(s) were unschedulable"]
        );
        let tolerant = pod_with(json!({"spec": {"tolerations": [
            {"key": "node.kubernetes.io/unschedulable", "operator": "Exists", "effect": "NoSchedule"}
        ]}}));
        assert!(fits(&tolerant, &n));
        assert!(fits(
            &pod_with(json!({})),
            &node_with("m", json!({"spec": {"unschedulable": false}}))
        ));
    }

    #[test]
    fn not_ready_node_is_rejected_unless_the_pod_tolerates_the_condition_taint() {
        let not_ready = node_with(
            "n",
            json!({"status": {"conditions": [{"type": "Ready", "status": "False"}]}}),
        );
        let unknown = node_with(
            "u",
            json!({"status": {"conditions": [{"type": "Ready", "status": "Unknown"}]}}),
        );
        let no_condition = node_with("x", json!({"status": {"conditions": []}}));
        let pod = pod_with(json!({}));
        for n in [&not_ready, &unknown, &no_condition] {
            assert_eq!(reasons_of(&pod, n), vec!["node(s) were not ready"]);
        }
        let cni = pod_with(json!({"spec": {"tolerations": [{"operator": "Exists"}]}}));
        for n in [&not_ready, &unknown, &no_condition] {
            assert!(fits(&cni, n));
        }
        let not_ready_only = pod_with(json!({"spec": {"tolerations": [
            {"key": "node.kubernetes.io/not-ready", "operator": "Exists", "effect": "NoSchedule"}
        ]}}));
        assert!(fits(&not_ready_only, &not_ready));
        assert!(!fits(&not_ready_only, &unknown));
    }

    // ---- taints

    #[test]
    fn untolerated_no_schedule_and_no_execute_taints_reject_prefer_no_schedule_does_not() {
        let cp = node_with(
            "cp",
            json!({"spec": {"taints": [
                {"key": "node-role.kubernetes.io/control-plane", "effect": "NoSchedule"}
            ]}}),
        );
        assert_eq!(
            reasons_of(&pod_with(json!({})), &cp),
            vec!["node(s) had untolerated taint {node-role.kubernetes.io/control-plane: }"]
        );
        let gone = node_with(
            "g",
            json!({"spec": {"taints": [
                {"key": "node.kubernetes.io/unreachable", "effect": "NoExecute"}
            ]}}),
        );
        assert_eq!(
            reasons_of(&pod_with(json!({})), &gone),
            vec!["node(s) had untolerated taint {node.kubernetes.io/unreachable: }"]
        );
        let valued = node_with(
            "v",
            json!({"spec": {"taints": [{"key": "dedicated", "value": "gpu", "effect": "NoSchedule"}]}}),
        );
        assert_eq!(
            reasons_of(&pod_with(json!({})), &valued),
            vec!["node(s) had untolerated taint {dedicated: gpu}"]
        );
        let wrong_value =
            pod_with(json!({"spec": {"tolerations": [{"key": "dedicated", "value": "db"}]}}));
        assert!(!fits(&wrong_value, &valued));
        let right_value = pod_with(
            json!({"spec": {"tolerations": [{"key": "dedicated", "operator": "Equal", "value": "gpu", "effect": "NoSchedule"}]}}),
        );
        assert!(fits(&right_value, &valued));
        let soft = node_with(
            "s",
            json!({"spec": {"taints": [{"key": "x", "effect": "PreferNoSchedule"}]}}),
        );
        assert!(fits(&pod_with(json!({})), &soft));
    }

    // ---- node affinity

    fn affinity_pod(terms: Value) -> Pod {
        pod_with(json!({"spec": {"affinity": {"nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": terms}
        }}}}))
    }

    fn expr(key: &str, op: &str, values: &[&str]) -> Value {
        json!([{"matchExpressions": [{"key": key, "operator": op, "values": values}]}])
    }

    #[test]
    fn node_selector_accepts_and_rejects() {
        let n = node_with("n", json!({"metadata": {"labels": {"disk": "ssd"}}}));
        assert!(fits(
            &pod_with(json!({"spec": {"nodeSelector": {"disk": "ssd"}}})),
            &n
        ));
        assert_eq!(
            reasons_of(
                &pod_with(json!({"spec": {"nodeSelector": {"disk": "hdd"}}})),
                &n
            ),
            vec!["node(s) didn't match Pod's node affinity/selector"]
        );
        assert!(!fits(
            &pod_with(json!({"spec": {"nodeSelector": {"disk": "ssd", "zone": "a"}}})),
            &n
        ));
    }

    #[test]
    fn node_affinity_operators() {
        let n = node_with(
            "n",
            json!({"metadata": {"labels": {"zone": "a", "cores": "8", "name": "x"}}}),
        );
        let ok = |terms: Value| fits(&affinity_pod(terms), &n);
        assert!(ok(expr("zone", "In", &["a", "b"])));
        assert!(!ok(expr("zone", "In", &["b"])));
        assert!(ok(expr("zone", "NotIn", &["b"])));
        assert!(!ok(expr("zone", "NotIn", &["a"])));
        assert!(ok(expr("missing", "NotIn", &["a"])));
        assert!(ok(expr("zone", "Exists", &[])));
        assert!(!ok(expr("missing", "Exists", &[])));
        assert!(ok(expr("missing", "DoesNotExist", &[])));
        assert!(!ok(expr("zone", "DoesNotExist", &[])));
        assert!(ok(expr("cores", "Gt", &["4"])));
        assert!(!ok(expr("cores", "Gt", &["8"])));
        assert!(ok(expr("cores", "Lt", &["9"])));
        assert!(!ok(expr("cores", "Lt", &["8"])));
        // non-numeric label or value, or a missing label: no match
        assert!(!ok(expr("name", "Gt", &["1"])));
        assert!(!ok(expr("cores", "Gt", &["many"])));
        assert!(!ok(expr("missing", "Lt", &["100"])));
        // unknown operator
        assert!(!ok(expr("zone", "Like", &["a"])));
        // matchFields on metadata.name
        let field = |op: &str, v: &str| json!([{"matchFields": [{"key": "metadata.name", "operator": op, "values": [v]}]}]);
        assert!(ok(field("In", "n")));
        assert!(!ok(field("In", "m")));
        assert!(ok(field("NotIn", "m")));
        assert!(!ok(
            json!([{"matchFields": [{"key": "metadata.uid", "operator": "In", "values": ["n"]}]}])
        ));
        // expressions within a term are ANDed, terms are ORed
        assert!(!ok(json!([{"matchExpressions": [
            {"key": "zone", "operator": "In", "values": ["a"]},
            {"key": "cores", "operator": "Gt", "values": ["10"]}
        ]}])));
        assert!(ok(json!([
            {"matchExpressions": [{"key": "zone", "operator": "In", "values": ["z"]}]},
            {"matchExpressions": [{"key": "cores", "operator": "Gt", "values": ["2"]}]}
        ])));
        // an invalid term does not spoil a valid one
        assert!(ok(json!([
            {"matchExpressions": [{"key": "cores", "operator": "Gt", "values": ["x"]}]},
            {"matchExpressions": [{"key": "zone", "operator": "Exists"}]}
        ])));
        // no terms, or only an empty term: nothing matches
        assert!(!ok(json!([])));
        assert!(!ok(json!([{}])));
        // nodeSelector and affinity must both hold
        let both = pod_with(
            json!({"spec": {"nodeSelector": {"zone": "b"}, "affinity": {"nodeAffinity": {
                "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": expr("zone", "Exists", &[])}
            }}}}),
        );
        assert!(!fits(&both, &n));
    }

    // ---- host ports

    fn port_pod(port: i32, ip: Option<&str>, protocol: Option<&str>) -> Pod {
        let mut p = json!({"containerPort": 80, "hostPort": port});
        if let Some(ip) = ip {
            p["hostIP"] = json!(ip);
        }
        if let Some(proto) = protocol {
            p["protocol"] = json!(proto);
        }
        pod_with(json!({"spec": {"containers": [{"name": "c", "ports": [p]}]}}))
    }

    #[test]
    fn host_port_conflicts() {
        let mut n = node("n");
        n.add_pod(&port_pod(8080, None, None)); // 0.0.0.0 TCP
        n.add_pod(&port_pod(9090, Some("10.0.0.1"), Some("UDP")));
        let conflict =
            vec!["node(s) didn't have free ports for the requested pod ports".to_string()];
        // wildcard in use: every IP conflicts on TCP 8080
        assert_eq!(
            reasons_of(&port_pod(8080, Some("10.0.0.9"), None), &n),
            conflict
        );
        assert_eq!(
            reasons_of(&port_pod(8080, Some("0.0.0.0"), Some("TCP")), &n),
            conflict
        );
        // other protocol or port: free
        assert!(fits(&port_pod(8080, None, Some("UDP")), &n));
        assert!(fits(&port_pod(8081, None, None), &n));
        // specific IP in use: the wildcard conflicts, the same IP conflicts, another IP does not
        assert_eq!(reasons_of(&port_pod(9090, None, Some("UDP")), &n), conflict);
        assert_eq!(
            reasons_of(&port_pod(9090, Some("10.0.0.1"), Some("UDP")), &n),
            conflict
        );
        assert!(fits(&port_pod(9090, Some("10.0.0.2"), Some("UDP")), &n));
        assert!(fits(&port_pod(9090, Some("10.0.0.1"), Some("TCP")), &n));
        // containerPort without hostPort uses nothing on the host
        let plain = pod_with(
            json!({"spec": {"containers": [{"name": "c", "ports": [{"containerPort": 8080}]}]}}),
        );
        assert!(fits(&plain, &n));
    }

    // ---- messages

    #[test]
    fn mixed_failure_message_matches_upstream() {
        let small = node_with("small", json!({"status": {"allocatable": {"cpu": "500m"}}}));
        let cp1 = node_with(
            "cp1",
            json!({"spec": {"taints": [{"key": "node-role.kubernetes.io/control-plane", "effect": "NoSchedule"}]}}),
        );
        let cp2 = node_with(
            "cp2",
            json!({"spec": {"taints": [{"key": "node-role.kubernetes.io/control-plane", "effect": "NoSchedule"}]}}),
        );
        let err = sched(&pod_requesting("1", "1Gi"), &[&small, &cp1, &cp2]).unwrap_err();
        assert_eq!(
            err.message,
            "0/3 nodes are available: 1 Insufficient cpu, 2 node(s) had untolerated taint \
             {node-role.kubernetes.io/control-plane: }. preemption: 0/3 nodes are available: \
             1 No preemption victims found for incoming pod, 2 Preemption is not helpful for scheduling."
        );
        assert_eq!(err.reasons.get("Insufficient cpu"), Some(&1));
    }

    #[test]
    fn unresolvable_only_message() {
        let cordoned = node_with("a", json!({"spec": {"unschedulable": true}}));
        let labelled = node("b");
        let pod = pod_with(json!({"spec": {"nodeSelector": {"gpu": "yes"}}}));
        let err = sched(&pod, &[&cordoned, &labelled]).unwrap_err();
        assert_eq!(
            err.message,
            "0/2 nodes are available: 1 node(s) didn't match Pod's node affinity/selector, \
             1 node(s) were unschedulable. preemption: 0/2 nodes are available: \
             2 Preemption is not helpful for scheduling."
        );
    }

    #[test]
    fn reasons_sort_as_upstream_strings_with_counts() {
        let mut counts = BTreeMap::new();
        counts.insert("Insufficient cpu".to_string(), 3);
        counts.insert("node(s) were unschedulable".to_string(), 2);
        counts.insert("Too many pods".to_string(), 10);
        assert_eq!(
            histogram(&counts),
            "10 Too many pods, 2 node(s) were unschedulable, 3 Insufficient cpu"
        );
    }

    #[test]
    fn no_nodes_message() {
        let err = sched(&pod_with(json!({})), &[]).unwrap_err();
        assert_eq!(
            err.message,
            "0/0 nodes are available: no nodes available to schedule pods."
        );
    }

    // ---- scheduling and scoring

    #[test]
    fn identical_pods_spread_over_identical_nodes() {
        for pod in [pod_requesting("100m", "128Mi"), pod_with(json!({}))] {
            let mut nodes = [node("a"), node("b"), node("c")];
            for _ in 0..10 {
                let refs: Vec<&NodeInfo> = nodes.iter().collect();
                let d = sched(&pod, &refs).unwrap();
                nodes
                    .iter_mut()
                    .find(|n| n.name() == d.node)
                    .unwrap()
                    .add_pod(&pod);
            }
            let mut counts: Vec<usize> = nodes.iter().map(NodeInfo::pod_count).collect();
            counts.sort();
            assert_eq!(counts, vec![3, 3, 4]);
        }
    }

    #[test]
    fn ties_go_to_the_fewest_pods_then_the_name() {
        let a = node("a");
        let b = node("b");
        assert_eq!(sched(&pod_with(json!({})), &[&b, &a]).unwrap().node, "a");
    }

    #[test]
    fn least_allocated_prefers_the_emptier_node() {
        let mut busy = node("a");
        busy.add_pod(&pod_requesting("3", "6Gi"));
        let idle = node("z");
        assert_eq!(
            sched(&pod_requesting("100m", "100Mi"), &[&busy, &idle])
                .unwrap()
                .node,
            "z"
        );
    }

    #[test]
    fn preferred_affinity_and_prefer_no_schedule_taints_steer_the_choice() {
        let plain = node("a");
        let ssd = node_with("b", json!({"metadata": {"labels": {"disk": "ssd"}}}));
        let pod = pod_with(json!({"spec": {"affinity": {"nodeAffinity": {
            "preferredDuringSchedulingIgnoredDuringExecution": [
                {"weight": 10, "preference": {"matchExpressions": [{"key": "disk", "operator": "In", "values": ["ssd"]}]}}
            ]
        }}}}));
        assert_eq!(sched(&pod, &[&plain, &ssd]).unwrap().node, "b");

        let soft = node_with(
            "a",
            json!({"spec": {"taints": [{"key": "spot", "effect": "PreferNoSchedule"}]}}),
        );
        let clean = node("b");
        assert_eq!(
            sched(&pod_with(json!({})), &[&soft, &clean]).unwrap().node,
            "b"
        );
        let tolerant = pod_with(
            json!({"spec": {"tolerations": [{"key": "spot", "operator": "Exists", "effect": "PreferNoSchedule"}]}}),
        );
        assert_eq!(sched(&tolerant, &[&soft, &clean]).unwrap().node, "a");
    }

    #[test]
    fn image_locality_prefers_the_node_with_the_image() {
        let with_image = node_with(
            "b",
            json!({"status": {"images": [
                {"names": ["docker.io/library/postgres:16", "docker.io/library/postgres@sha256:abc"], "sizeBytes": 400_000_000}
            ]}}),
        );
        let without = node("a");
        let pod =
            pod_with(json!({"spec": {"containers": [{"name": "db", "image": "postgres:16"}]}}));
        assert_eq!(sched(&pod, &[&without, &with_image]).unwrap().node, "b");
        // a small image (under 23MB after spreading) does not matter: the tie-break picks "a"
        let tiny = node_with(
            "b",
            json!({"status": {"images": [{"names": ["docker.io/library/busybox:1"], "sizeBytes": 4_000_000}]}}),
        );
        let pod = pod_with(json!({"spec": {"containers": [{"name": "c", "image": "busybox:1"}]}}));
        assert_eq!(sched(&pod, &[&without, &tiny]).unwrap().node, "a");
    }

    #[test]
    fn image_names_normalize_like_a_runtime_reports_them() {
        assert_eq!(normalize_image("nginx"), "docker.io/library/nginx:latest");
        assert_eq!(
            normalize_image("nginx:1.25"),
            "docker.io/library/nginx:1.25"
        );
        assert_eq!(
            normalize_image("bitnami/redis"),
            "docker.io/bitnami/redis:latest"
        );
        assert_eq!(
            normalize_image("docker.io/nginx"),
            "docker.io/library/nginx:latest"
        );
        assert_eq!(
            normalize_image("registry.k8s.io/pause:3.9"),
            "registry.k8s.io/pause:3.9"
        );
        assert_eq!(
            normalize_image("localhost:5000/app"),
            "localhost:5000/app:latest"
        );
        assert_eq!(
            normalize_image("nginx@sha256:abc"),
            "docker.io/library/nginx@sha256:abc"
        );
        assert_eq!(
            normalize_image("nginx:1@sha256:abc"),
            "docker.io/library/nginx@sha256:abc"
        );
    }

    #[test]
    fn is_pending_cases() {
        assert!(is_pending(&pod_with(json!({})), "default-scheduler"));
        assert!(!is_pending(&pod_with(json!({})), "other"));
        assert!(is_pending(
            &pod_with(json!({"spec": {"schedulerName": "other"}})),
            "other"
        ));
        assert!(!is_pending(
            &pod_with(json!({"spec": {"nodeName": "n"}})),
            "default-scheduler"
        ));
        assert!(!is_pending(
            &pod_with(json!({"metadata": {"deletionTimestamp": "2026-01-01T00:00:00Z"}})),
            "default-scheduler"
        ));
        assert!(!is_pending(
            &pod_with(json!({"status": {"phase": "Succeeded"}})),
            "default-scheduler"
        ));
        assert!(!is_pending(
            &pod_with(json!({"status": {"phase": "Failed"}})),
            "default-scheduler"
        ));
        assert!(is_pending(
            &pod_with(json!({"status": {"phase": "Pending"}})),
            "default-scheduler"
        ));
    }

    // ---- volumes

    fn claim_pod(claims: &[&str]) -> Pod {
        let volumes: Vec<Value> = claims
            .iter()
            .map(|c| json!({"name": format!("v-{c}"), "persistentVolumeClaim": {"claimName": c}}))
            .collect();
        pod_with(json!({"spec": {"volumes": volumes}}))
    }

    fn pvc(name: &str, class: &str, volume: Option<&str>) -> Arc<PersistentVolumeClaim> {
        let mut spec = json!({"storageClassName": class, "accessModes": ["ReadWriteOnce"],
            "resources": {"requests": {"storage": "1Gi"}}});
        if let Some(v) = volume {
            spec["volumeName"] = json!(v);
        }
        Arc::new(from(
            json!({"metadata": {"name": name, "namespace": "default", "uid": format!("uid-{name}")}, "spec": spec}),
        ))
    }

    fn local_pv(name: &str, class: &str, host: &str, size: &str) -> Arc<PersistentVolume> {
        Arc::new(from(json!({
            "metadata": {"name": name},
            "spec": {
                "storageClassName": class,
                "accessModes": ["ReadWriteOnce"],
                "capacity": {"storage": size},
                "local": {"path": "/mnt/disk"},
                "nodeAffinity": {"required": {"nodeSelectorTerms": [{"matchExpressions": [
                    {"key": "kubernetes.io/hostname", "operator": "In", "values": [host]}
                ]}]}}
            },
            "status": {"phase": "Available"}
        })))
    }

    fn class(name: &str, provisioner: &str, mode: &str, topologies: Value) -> Arc<StorageClass> {
        Arc::new(from(json!({
            "metadata": {"name": name},
            "provisioner": provisioner,
            "volumeBindingMode": mode,
            "allowedTopologies": topologies
        })))
    }

    fn driver(name: &str, capacity: bool) -> Arc<CSIDriver> {
        Arc::new(from(json!({"metadata": {"name": name}, "spec": {"storageCapacity": capacity}})))
    }

    fn capacity(class: &str, node: &str, capacity: &str, max: Option<&str>) -> Arc<CSIStorageCapacity> {
        let mut c = json!({
            "metadata": {"name": format!("csisc-{node}-{class}"), "namespace": "kube-system"},
            "storageClassName": class,
            "nodeTopology": {"matchLabels": {"topology.example.com/node": node}},
            "capacity": capacity,
        });
        if let Some(m) = max {
            c["maximumVolumeSize"] = json!(m);
        }
        Arc::new(from(c))
    }

    #[test]
    fn provisioning_needs_published_capacity_when_the_driver_tracks_it() {
        let labelled = |n: &str| node_with(n, json!({"metadata": {"labels": {"topology.example.com/node": n}}}));
        let (a, b) = (labelled("a"), labelled("b"));
        let wffc = || vec![class("fast", "csi.example.com", "WaitForFirstConsumer", json!(null))];
        // The claim asks 1Gi. a has 512Mi left, b 4Gi: only b.
        let vols = Volumes {
            claims: vec![pvc("data", "fast", None)],
            classes: wffc(),
            drivers: vec![driver("csi.example.com", true)],
            capacities: vec![capacity("fast", "a", "512Mi", None), capacity("fast", "b", "4Gi", None)],
            ..Volumes::none()
        };
        let d = sched_vol(&claim_pod(&["data"]), &[&a, &b], &vols).unwrap();
        assert_eq!((d.node.as_str(), d.select_node_for_claims.clone()), ("b", vec!["data".to_string()]));
        let err = sched_vol(&claim_pod(&["data"]), &[&a], &vols).unwrap_err();
        assert_eq!(err.reasons.into_keys().collect::<Vec<_>>(), vec!["node(s) did not have enough free storage"]);
        // maximumVolumeSize rules over capacity; another class's capacity does not count.
        let vols = Volumes {
            capacities: vec![capacity("fast", "b", "4Gi", Some("256Mi")), capacity("slow", "a", "8Gi", None)],
            ..vols
        };
        assert!(sched_vol(&claim_pod(&["data"]), &[&a, &b], &vols).is_err());
        // No capacity published at all: nowhere.
        let none = Volumes { capacities: vec![], ..vols };
        assert!(sched_vol(&claim_pod(&["data"]), &[&a, &b], &none).is_err());
        // A driver that does not track capacity (or no CSIDriver object): not checked.
        let untracked = Volumes { drivers: vec![driver("csi.example.com", false)], ..none };
        assert!(sched_vol(&claim_pod(&["data"]), &[&a], &untracked).is_ok());
        let nodriver = Volumes { drivers: vec![], ..untracked };
        assert!(sched_vol(&claim_pod(&["data"]), &[&a], &nodriver).is_ok());
    }

    #[test]
    fn missing_claim_fails_the_whole_pod() {
        let (a, b) = (node("a"), node("b"));
        let err = sched(&claim_pod(&["data"]), &[&a, &b]).unwrap_err();
        assert_eq!(
            err.message,
            "0/2 nodes are available: persistentvolumeclaim \"data\" not found. preemption: \
             0/2 nodes are available: 2 Preemption is not helpful for scheduling."
        );
    }

    #[test]
    fn unbound_immediate_claim_fails_the_pod() {
        let a = node("a");
        let vols = Volumes {
            claims: vec![pvc("data", "fast", None)],
            volumes: vec![],
            classes: vec![class("fast", "csi.example.com", "Immediate", json!(null))],
            ..Volumes::none()
        };
        let err = sched_vol(&claim_pod(&["data"]), &[&a], &vols).unwrap_err();
        assert_eq!(
            err.message,
            "0/1 nodes are available: pod has unbound immediate PersistentVolumeClaims. preemption: \
             0/1 nodes are available: 1 Preemption is not helpful for scheduling."
        );
    }

    #[test]
    fn ephemeral_volume_claim_must_exist_and_be_owned_by_the_pod() {
        let a = node("a");
        let pod = pod_with(
            json!({"spec": {"volumes": [{"name": "scratch", "ephemeral": {"volumeClaimTemplate": {
                "spec": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "1Gi"}}}
            }}}]}}),
        );
        let err = sched(&pod, &[&a]).unwrap_err();
        assert!(err.message.contains("waiting for ephemeral volume controller to create the persistentvolumeclaim \"p-scratch\""));
        let mut claim: PersistentVolumeClaim = (*pvc("p-scratch", "local", Some("pv1"))).clone();
        let vols = |claim: PersistentVolumeClaim| Volumes {
            claims: vec![Arc::new(claim)],
            volumes: vec![local_pv("pv1", "local", "a", "1Gi")],
            classes: vec![],
            ..Volumes::none()
        };
        let err = sched_vol(&pod, &[&a], &vols(claim.clone())).unwrap_err();
        assert!(
            err.message.contains("(pod is not owner)"),
            "{}",
            err.message
        );
        claim.metadata.owner_references = Some(vec![from(json!({
            "apiVersion": "v1", "kind": "Pod", "name": "p", "uid": "pod-uid", "controller": true
        }))]);
        assert_eq!(sched_vol(&pod, &[&a], &vols(claim)).unwrap().node, "a");
    }

    #[test]
    fn bound_claim_restricts_the_pod_to_the_volume_nodes() {
        let (a, b) = (node("a"), node("b"));
        let vols = Volumes {
            claims: vec![pvc("data", "local", Some("pv-b"))],
            volumes: vec![local_pv("pv-b", "local", "b", "1Gi")],
            classes: vec![],
            ..Volumes::none()
        };
        let d = sched_vol(&claim_pod(&["data"]), &[&a, &b], &vols).unwrap();
        assert_eq!(d.node, "b");
        assert!(d.select_node_for_claims.is_empty());
        let err = sched_vol(&claim_pod(&["data"]), &[&a], &vols).unwrap_err();
        assert_eq!(
            err.reasons.into_keys().collect::<Vec<_>>(),
            vec!["node(s) had volume node affinity conflict"]
        );
        // bound to a volume that does not exist
        let vols = Volumes {
            volumes: vec![],
            ..vols
        };
        let err = sched_vol(&claim_pod(&["data"]), &[&a], &vols).unwrap_err();
        assert_eq!(
            err.reasons.into_keys().collect::<Vec<_>>(),
            vec!["node(s) unavailable due to one or more pvc(s) bound to non-existent pv(s)"]
        );
    }

    #[test]
    fn wait_for_first_consumer_with_a_matching_local_volume() {
        let (a, b) = (node("a"), node("b"));
        let vols = Volumes {
            claims: vec![pvc("data", "local", None)],
            volumes: vec![
                local_pv("too-small", "local", "a", "500Mi"),
                local_pv("pv-b", "local", "b", "2Gi"),
                local_pv("other-class", "slow", "a", "2Gi"),
            ],
            classes: vec![class(
                "local",
                NO_PROVISIONER,
                "WaitForFirstConsumer",
                json!(null),
            )],
            ..Volumes::none()
        };
        let d = sched_vol(&claim_pod(&["data"]), &[&a, &b], &vols).unwrap();
        assert_eq!(d.node, "b");
        assert_eq!(d.select_node_for_claims, vec!["data"]);
        assert_eq!(
            d.static_bindings,
            vec![StaticBinding {
                claim: "data".into(),
                volume: "pv-b".into()
            }]
        );
        let err = sched_vol(&claim_pod(&["data"]), &[&a], &vols).unwrap_err();
        assert_eq!(
            err.message,
            "0/1 nodes are available: 1 node(s) didn't find available persistent volumes to bind. \
             preemption: 0/1 nodes are available: 1 Preemption is not helpful for scheduling."
        );
    }

    #[test]
    fn wait_for_first_consumer_picks_the_smallest_fit_and_never_one_volume_twice() {
        let a = node("a");
        let mut second = (*pvc("logs", "local", None)).clone();
        second.metadata.uid = Some("uid-logs".into());
        let vols = Volumes {
            claims: vec![pvc("data", "local", None), Arc::new(second)],
            volumes: vec![
                local_pv("big", "local", "a", "10Gi"),
                local_pv("small", "local", "a", "1Gi"),
            ],
            classes: vec![class(
                "local",
                NO_PROVISIONER,
                "WaitForFirstConsumer",
                json!(null),
            )],
            ..Volumes::none()
        };
        let d = sched_vol(&claim_pod(&["data", "logs"]), &[&a], &vols).unwrap();
        assert_eq!(
            d.static_bindings,
            vec![
                StaticBinding {
                    claim: "data".into(),
                    volume: "small".into()
                },
                StaticBinding {
                    claim: "logs".into(),
                    volume: "big".into()
                },
            ]
        );
        // one volume for two claims: no fit
        let vols = Volumes {
            volumes: vec![local_pv("only", "local", "a", "10Gi")],
            ..vols
        };
        assert!(sched_vol(&claim_pod(&["data", "logs"]), &[&a], &vols).is_err());
    }

    #[test]
    fn wait_for_first_consumer_with_a_provisioner_and_allowed_topologies() {
        let a = node_with(
            "a",
            json!({"metadata": {"labels": {"topology.kubernetes.io/zone": "z1"}}}),
        );
        let b = node_with(
            "b",
            json!({"metadata": {"labels": {"topology.kubernetes.io/zone": "z2"}}}),
        );
        let vols = Volumes {
            claims: vec![pvc("data", "csi", None)],
            volumes: vec![],
            classes: vec![class(
                "csi",
                "csi.example.com",
                "WaitForFirstConsumer",
                json!(null),
            )],
            ..Volumes::none()
        };
        let d = sched_vol(&claim_pod(&["data"]), &[&a, &b], &vols).unwrap();
        assert_eq!(d.node, "a");
        assert_eq!(d.select_node_for_claims, vec!["data"]);
        assert!(d.static_bindings.is_empty());
        let zoned = Volumes {
            classes: vec![class(
                "csi",
                "csi.example.com",
                "WaitForFirstConsumer",
                json!([
                    {"matchLabelExpressions": [{"key": "topology.kubernetes.io/zone", "values": ["z2"]}]}
                ]),
            )],
            ..vols
        };
        assert_eq!(
            sched_vol(&claim_pod(&["data"]), &[&a, &b], &zoned)
                .unwrap()
                .node,
            "b"
        );
        assert!(sched_vol(&claim_pod(&["data"]), &[&a], &zoned).is_err());
    }

    #[test]
    fn prebound_volume_is_used_for_its_claim_only() {
        let a = node("a");
        let mut pv: PersistentVolume = (*local_pv("reserved", "local", "a", "1Gi")).clone();
        pv.spec.as_mut().unwrap().claim_ref =
            Some(from(json!({"namespace": "default", "name": "other"})));
        let vols = Volumes {
            claims: vec![pvc("data", "local", None)],
            volumes: vec![Arc::new(pv.clone())],
            classes: vec![class(
                "local",
                NO_PROVISIONER,
                "WaitForFirstConsumer",
                json!(null),
            )],
            ..Volumes::none()
        };
        assert!(sched_vol(&claim_pod(&["data"]), &[&a], &vols).is_err());
        pv.spec.as_mut().unwrap().claim_ref =
            Some(from(json!({"namespace": "default", "name": "data"})));
        let vols = Volumes {
            volumes: vec![Arc::new(pv)],
            ..vols
        };
        let d = sched_vol(&claim_pod(&["data"]), &[&a], &vols).unwrap();
        assert_eq!(d.static_bindings[0].volume, "reserved");
    }

    #[test]
    fn only_the_first_failing_filter_reports() {
        let n = node_with(
            "n",
            json!({"spec": {"unschedulable": true, "taints": [{"key": "a", "effect": "NoSchedule"}]},
                   "status": {"allocatable": {"cpu": "1"}}}),
        );
        assert_eq!(
            reasons_of(&pod_requesting("2", "0"), &n),
            vec!["node(s) were unschedulable"]
        );
    }

    #[test]
    fn no_execute_taint_tolerated_for_a_while_still_admits_the_pod() {
        let n = node_with(
            "n",
            json!({"spec": {"taints": [{"key": "maintenance", "effect": "NoExecute"}]}}),
        );
        let pod = pod_with(json!({"spec": {"tolerations": [
            {"key": "maintenance", "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 30}
        ]}}));
        assert!(fits(&pod, &n));
    }

    #[test]
    fn claims_being_deleted_fail_the_pod_and_other_volumes_are_ignored() {
        let a = node("a");
        let mut claim: PersistentVolumeClaim = (*pvc("data", "local", Some("pv1"))).clone();
        claim.metadata.deletion_timestamp = Some(from(json!("2026-01-01T00:00:00Z")));
        let vols = Volumes {
            claims: vec![Arc::new(claim)],
            volumes: vec![local_pv("pv1", "local", "a", "1Gi")],
            classes: vec![],
            ..Volumes::none()
        };
        let err = sched_vol(&claim_pod(&["data"]), &[&a], &vols).unwrap_err();
        assert!(
            err.message.starts_with(
                "0/1 nodes are available: persistentvolumeclaim \"data\" is being deleted."
            ),
            "{}",
            err.message
        );
        let scratch = pod_with(json!({"spec": {"volumes": [
            {"name": "tmp", "emptyDir": {}},
            {"name": "cfg", "configMap": {"name": "x"}}
        ]}}));
        let d = sched(&scratch, &[&a]).unwrap();
        assert!(d.select_node_for_claims.is_empty() && d.static_bindings.is_empty());
    }

    #[test]
    fn one_node_can_report_several_volume_reasons() {
        let a = node("a");
        let vols = Volumes {
            claims: vec![
                pvc("bound", "local", Some("pv-b")),
                pvc("waiting", "local", None),
            ],
            volumes: vec![local_pv("pv-b", "local", "b", "1Gi")],
            classes: vec![class(
                "local",
                NO_PROVISIONER,
                "WaitForFirstConsumer",
                json!(null),
            )],
            ..Volumes::none()
        };
        let err = sched_vol(&claim_pod(&["bound", "waiting"]), &[&a], &vols).unwrap_err();
        assert_eq!(
            err.message,
            "0/1 nodes are available: 1 node(s) didn't find available persistent volumes to bind, \
             1 node(s) had volume node affinity conflict. preemption: 0/1 nodes are available: \
             1 Preemption is not helpful for scheduling."
        );
    }
}
