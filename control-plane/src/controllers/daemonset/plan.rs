//! The DaemonSet planner (upstream `pkg/controller/daemon`): which nodes should run a daemon
//! pod, the pods to create (one per node, bound through a required node affinity on the node's
//! name so the scheduler places them), the pods to delete (failed, surplus, misscheduled, on
//! nodes that are gone, and the old pods a RollingUpdate replaces), the status numbers, and the
//! ControllerRevisions that record each template.
//!
//! Pure: no I/O, no clock. The executor keeps the failed-pod back-off and the expectations and
//! passes the back-off in as a lookup.
//!
//! Differences from upstream, all deliberate:
//! - nodes and pods are visited in name order (upstream iterates a Go map): the plan is
//!   deterministic;
//! - without the `deprecated.daemonset.template.generation` annotation (an upstream API server
//!   sets it; ferro-control-plane does not yet), the `pod-template-generation` label carries the
//!   DaemonSet's `metadata.generation`; a pod counts as updated by its revision hash alone then;
//! - revision names, hashes and equality are the shared `controllers::history` ones (canonical
//!   JSON of the revision's data, not the bytes a Go encoder wrote).

use std::cmp::Ordering;
use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use jiff::Timestamp;
use k8s_openapi::api::apps::v1::{ControllerRevision, DaemonSet, DaemonSetStatus};
use k8s_openapi::api::core::v1::{
    Affinity, Node, NodeAffinity, NodeSelector, NodeSelectorRequirement, NodeSelectorTerm, Pod,
    PodSpec, PodTemplateSpec, Toleration,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};
use k8s_openapi::apimachinery::pkg::runtime::RawExtension;
use k8s_semantics::scheduling::{
    find_untolerated_taint, RequiredNodeAffinity, NODE_FIELD_NAME, NO_EXECUTE, NO_SCHEDULE,
};
use serde_json::{json, Value};

use crate::controllers::deployment::plan::scaled_value;
use crate::controllers::history;
use crate::controllers::replicaset::plan::{controller_of, is_pod_available, is_pod_ready};
use crate::selector::LabelSelector;

/// The label carrying the revision hash of a daemon pod and of its ControllerRevision.
pub const REVISION_HASH_LABEL: &str = "controller-revision-hash";
/// The label carrying the template generation a daemon pod was made from.
pub const TEMPLATE_GENERATION_LABEL: &str = "pod-template-generation";
/// The annotation an upstream API server keeps the template generation in.
pub const TEMPLATE_GENERATION_ANNOTATION: &str = "deprecated.daemonset.template.generation";
/// Upstream's `burstReplicas`: at most this many pods are created or deleted per sync.
pub const BURST_REPLICAS: usize = 250;

/// The taints daemon pods tolerate automatically (upstream `AddOrUpdateDaemonPodTolerations`).
pub const TAINT_NOT_READY: &str = "node.kubernetes.io/not-ready";
pub const TAINT_UNREACHABLE: &str = "node.kubernetes.io/unreachable";
pub const TAINT_DISK_PRESSURE: &str = "node.kubernetes.io/disk-pressure";
pub const TAINT_MEMORY_PRESSURE: &str = "node.kubernetes.io/memory-pressure";
pub const TAINT_PID_PRESSURE: &str = "node.kubernetes.io/pid-pressure";
pub const TAINT_UNSCHEDULABLE: &str = "node.kubernetes.io/unschedulable";
pub const TAINT_NETWORK_UNAVAILABLE: &str = "node.kubernetes.io/network-unavailable";

// ---------------------------------------------------------------------------
// the daemon pod
// ---------------------------------------------------------------------------

fn exists_toleration(key: &str, effect: &str) -> Toleration {
    Toleration {
        key: Some(key.to_string()),
        operator: Some("Exists".to_string()),
        effect: Some(effect.to_string()),
        ..Toleration::default()
    }
}

/// Upstream `Toleration.MatchToleration`: same key, operator, value and effect.
fn same_toleration(a: &Toleration, b: &Toleration) -> bool {
    a.key == b.key && a.operator == b.operator && a.value == b.value && a.effect == b.effect
}

/// Upstream `AddOrUpdateTolerationInPodSpec`: replaces a toleration with the same key,
/// operator, value and effect, else appends.
fn add_or_update_toleration(spec: &mut PodSpec, t: Toleration) {
    let list = spec.tolerations.get_or_insert_with(Vec::new);
    match list.iter_mut().find(|x| same_toleration(x, &t)) {
        Some(existing) => *existing = t,
        None => list.push(t),
    }
}

/// Upstream `AddOrUpdateDaemonPodTolerations`: not-ready and unreachable NoExecute without
/// tolerationSeconds (the node lifecycle controller never evicts daemon pods), the node
/// condition taints NoSchedule, and network-unavailable for host-network pods.
pub fn add_daemon_tolerations(spec: &mut PodSpec) {
    add_or_update_toleration(spec, exists_toleration(TAINT_NOT_READY, NO_EXECUTE));
    add_or_update_toleration(spec, exists_toleration(TAINT_UNREACHABLE, NO_EXECUTE));
    for key in [TAINT_DISK_PRESSURE, TAINT_MEMORY_PRESSURE, TAINT_PID_PRESSURE, TAINT_UNSCHEDULABLE] {
        add_or_update_toleration(spec, exists_toleration(key, NO_SCHEDULE));
    }
    if spec.host_network == Some(true) {
        add_or_update_toleration(spec, exists_toleration(TAINT_NETWORK_UNAVAILABLE, NO_SCHEDULE));
    }
}

/// Upstream `ReplaceDaemonSetPodNodeNameNodeAffinity`: the required node affinity becomes the
/// single term `metadata.name In [node]` (the node was checked against the old terms already);
/// preferred terms stay.
pub fn replace_node_name_affinity(affinity: Option<Affinity>, node: &str) -> Affinity {
    let selector = NodeSelector {
        node_selector_terms: vec![NodeSelectorTerm {
            match_fields: Some(vec![NodeSelectorRequirement {
                key: NODE_FIELD_NAME.to_string(),
                operator: "In".to_string(),
                values: Some(vec![node.to_string()]),
            }]),
            match_expressions: None,
        }],
    };
    let mut affinity = affinity.unwrap_or_default();
    let na = affinity.node_affinity.get_or_insert_with(NodeAffinity::default);
    na.required_during_scheduling_ignored_during_execution = Some(selector);
    affinity
}

/// The node a daemon pod is for (upstream `GetTargetNodeName`): its nodeName, or the
/// `metadata.name In [node]` field requirement of its required node affinity.
pub fn target_node(pod: &Pod) -> Option<String> {
    let spec = pod.spec.as_ref()?;
    if let Some(n) = spec.node_name.as_deref().filter(|n| !n.is_empty()) {
        return Some(n.to_string());
    }
    let terms = &spec
        .affinity
        .as_ref()?
        .node_affinity
        .as_ref()?
        .required_during_scheduling_ignored_during_execution
        .as_ref()?
        .node_selector_terms;
    terms.iter().flat_map(|t| t.match_fields.iter().flatten()).find_map(|r| {
        if r.key == NODE_FIELD_NAME && r.operator == "In" {
            match r.values.as_deref() {
                Some([v]) => Some(v.clone()),
                _ => None,
            }
        } else {
            None
        }
    })
}

/// The template generation of a DaemonSet: the annotation an upstream API server keeps, else
/// `metadata.generation` (see the module documentation).
pub fn template_generation(ds: &DaemonSet) -> Option<i64> {
    match ds.metadata.annotations.as_ref().and_then(|a| a.get(TEMPLATE_GENERATION_ANNOTATION)) {
        Some(v) => v.parse().ok(),
        None => ds.metadata.generation,
    }
}

fn template(ds: &DaemonSet) -> PodTemplateSpec {
    ds.spec.as_ref().map(|s| s.template.clone()).unwrap_or_default()
}

/// The pod the predicates look at (upstream `NewPod`): the template with the daemon
/// tolerations, bound to the node.
fn predicate_pod(ds: &DaemonSet, node: &str) -> Pod {
    let t = template(ds);
    let mut spec = t.spec.unwrap_or_default();
    spec.node_name = Some(node.to_string());
    add_daemon_tolerations(&mut spec);
    Pod { metadata: t.metadata.unwrap_or_default(), spec: Some(spec), status: None }
}

/// What decides where a DaemonSet's pods run, read once from its template: the template's
/// nodeName, the pod's required node affinity (nodeSelector and affinity) and its tolerations
/// with the daemon ones.
pub struct Eligibility {
    template_node: String,
    required: RequiredNodeAffinity,
    tolerations: Vec<Toleration>,
}

impl Eligibility {
    pub fn of(ds: &DaemonSet) -> Eligibility {
        let pod = predicate_pod(ds, "");
        let spec = pod.spec.as_ref();
        Eligibility {
            template_node: template(ds).spec.and_then(|s| s.node_name).unwrap_or_default(),
            required: RequiredNodeAffinity::of(&pod),
            tolerations: spec.and_then(|s| s.tolerations.clone()).unwrap_or_default(),
        }
    }

    /// Upstream `NodeShouldRunDaemonPod`: (should run, should continue running). The node
    /// name, the nodeSelector and the required node affinity must fit; an untolerated
    /// NoSchedule or NoExecute taint keeps new pods off, and only an untolerated NoExecute
    /// taint stops a running one.
    pub fn check(&self, node: &Node) -> (bool, bool) {
        let name = node.metadata.name.as_deref().unwrap_or_default();
        if !self.template_node.is_empty() && self.template_node != name {
            return (false, false);
        }
        if !self.required.matches_node(node) {
            return (false, false);
        }
        let taints = node.spec.as_ref().and_then(|s| s.taints.as_deref()).unwrap_or(&[]);
        let blocks = find_untolerated_taint(taints, &self.tolerations, |t| t.effect == NO_SCHEDULE || t.effect == NO_EXECUTE);
        if blocks.is_none() {
            return (true, true);
        }
        let evicts = find_untolerated_taint(taints, &self.tolerations, |t| t.effect == NO_EXECUTE);
        (false, evicts.is_none())
    }

    /// Why a daemon pod does not run on a node, in words; `None` when it should.
    pub fn why_not(&self, node: &Node) -> Option<String> {
        let name = node.metadata.name.as_deref().unwrap_or_default();
        if !self.template_node.is_empty() && self.template_node != name {
            return Some(format!("the template's nodeName is {}", self.template_node));
        }
        if !self.required.matches_node(node) {
            return Some("the node does not match the nodeSelector or the required node affinity".into());
        }
        let taints = node.spec.as_ref().and_then(|s| s.taints.as_deref()).unwrap_or(&[]);
        let t = find_untolerated_taint(taints, &self.tolerations, |t| t.effect == NO_SCHEDULE || t.effect == NO_EXECUTE)?;
        let value = t.value.as_deref().map(|v| format!("={v}")).unwrap_or_default();
        Some(format!("the node has the taint {}{value}:{} the pods do not tolerate", t.key, t.effect))
    }
}

/// [`Eligibility::check`] for one node.
pub fn should_run(node: &Node, ds: &DaemonSet) -> (bool, bool) {
    Eligibility::of(ds).check(node)
}

/// The controller ownerReference of the DaemonSet's pods and revisions.
pub fn controller_ref(ds: &DaemonSet) -> OwnerReference {
    OwnerReference {
        api_version: "apps/v1".to_string(),
        kind: "DaemonSet".to_string(),
        name: ds.metadata.name.clone().unwrap_or_default(),
        uid: ds.metadata.uid.clone().unwrap_or_default(),
        controller: Some(true),
        block_owner_deletion: Some(true),
    }
}

/// The pod to create on a node (upstream `CreatePodTemplate` then
/// `ReplaceDaemonSetPodNodeNameNodeAffinity`): generateName `"<ds>-"`, the template's labels
/// plus `controller-revision-hash` and `pod-template-generation`, the daemon tolerations, and a
/// required node affinity on the node's name, so the scheduler binds it.
pub fn daemon_pod(ds: &DaemonSet, node: &str, hash: &str) -> Pod {
    let t = template(ds);
    let tmeta = t.metadata.unwrap_or_default();
    let mut labels = tmeta.labels.unwrap_or_default();
    if let Some(g) = template_generation(ds) {
        labels.insert(TEMPLATE_GENERATION_LABEL.to_string(), g.to_string());
    }
    if !hash.is_empty() {
        labels.insert(REVISION_HASH_LABEL.to_string(), hash.to_string());
    }
    let mut spec = t.spec.unwrap_or_default();
    add_daemon_tolerations(&mut spec);
    spec.affinity = Some(replace_node_name_affinity(spec.affinity.take(), node));
    Pod {
        metadata: ObjectMeta {
            generate_name: Some(format!("{}-", ds.metadata.name.as_deref().unwrap_or_default())),
            namespace: ds.metadata.namespace.clone(),
            labels: Some(labels),
            annotations: tmeta.annotations,
            finalizers: tmeta.finalizers,
            owner_references: Some(vec![controller_ref(ds)]),
            ..ObjectMeta::default()
        },
        spec: Some(spec),
        status: None,
    }
}

// ---------------------------------------------------------------------------
// pods
// ---------------------------------------------------------------------------

fn phase(pod: &Pod) -> &str {
    pod.status.as_ref().and_then(|s| s.phase.as_deref()).unwrap_or("")
}

fn is_terminal(pod: &Pod) -> bool {
    matches!(phase(pod), "Succeeded" | "Failed")
}

fn name(meta: &ObjectMeta) -> String {
    meta.name.clone().unwrap_or_default()
}

fn label<'a>(meta: &'a ObjectMeta, key: &str) -> Option<&'a str> {
    meta.labels.as_ref().and_then(|l| l.get(key)).map(String::as_str)
}

/// Upstream `IsPodUpdated`: the pod carries the current revision hash, or the template
/// generation the DaemonSet's annotation names.
pub fn is_pod_updated(pod: &Pod, hash: &str, ds: &DaemonSet) -> bool {
    let generation = ds
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(TEMPLATE_GENERATION_ANNOTATION))
        .and_then(|v| v.parse::<i64>().ok());
    let by_generation = generation.is_some_and(|g| label(&pod.metadata, TEMPLATE_GENERATION_LABEL) == Some(g.to_string().as_str()));
    let by_hash = !hash.is_empty() && label(&pod.metadata, REVISION_HASH_LABEL) == Some(hash);
    by_hash || by_generation
}

/// Upstream `podByCreationTimestampAndPhase`: scheduled pods first, then oldest, then by name.
fn by_creation_and_phase(a: &&Pod, b: &&Pod) -> Ordering {
    let scheduled = |p: &Pod| p.spec.as_ref().and_then(|s| s.node_name.as_deref()).is_some_and(|n| !n.is_empty());
    scheduled(b)
        .cmp(&scheduled(a))
        .then_with(|| a.metadata.creation_timestamp.as_ref().map(|t| t.0).cmp(&b.metadata.creation_timestamp.as_ref().map(|t| t.0)))
        .then_with(|| a.metadata.name.cmp(&b.metadata.name))
}

/// The pods of a DaemonSet after claiming (upstream `ClaimPods`): owned and matching ones,
/// plus orphans to adopt; owned ones that stopped matching are released.
#[derive(Debug, Default)]
struct Claim<'a> {
    pods: Vec<&'a Pod>,
    adopt: Vec<String>,
    release: Vec<String>,
}

fn claim<'a>(ds: &DaemonSet, selector: &LabelSelector, pods: &[&'a Pod]) -> Claim<'a> {
    let uid = ds.metadata.uid.as_deref().unwrap_or_default();
    let deleting = ds.metadata.deletion_timestamp.is_some();
    let ns = ds.metadata.namespace.as_deref().unwrap_or_default();
    let mut c = Claim::default();
    for &pod in pods {
        if pod.metadata.namespace.as_deref().unwrap_or_default() != ns {
            continue;
        }
        let matches = selector.matches(&pod.metadata.labels.clone().unwrap_or_default());
        match controller_of(&pod.metadata) {
            Some(owner) if !uid.is_empty() && owner.uid == uid => {
                if matches {
                    c.pods.push(pod);
                } else if !deleting {
                    c.release.push(name(&pod.metadata));
                }
            }
            Some(_) => {}
            None => {
                if matches && !deleting && !uid.is_empty() && pod.metadata.deletion_timestamp.is_none() {
                    c.adopt.push(name(&pod.metadata));
                    c.pods.push(pod);
                }
            }
        }
    }
    c
}

/// Upstream `getNodesToDaemonPods(ds, false)`: the claimed pods by target node, leaving out
/// terminal pods that are already being deleted (and pods with no target node).
fn by_node<'a>(claimed: &[&'a Pod]) -> BTreeMap<String, Vec<&'a Pod>> {
    let mut m: BTreeMap<String, Vec<&'a Pod>> = BTreeMap::new();
    for &pod in claimed {
        if is_terminal(pod) && pod.metadata.deletion_timestamp.is_some() {
            continue;
        }
        if let Some(node) = target_node(pod) {
            m.entry(node).or_default().push(pod);
        }
    }
    m
}

// ---------------------------------------------------------------------------
// strategy
// ---------------------------------------------------------------------------

fn rolling_update(ds: &DaemonSet) -> Option<&k8s_openapi::api::apps::v1::RollingUpdateDaemonSet> {
    let s = ds.spec.as_ref()?.update_strategy.as_ref()?;
    if s.type_.as_deref().unwrap_or("RollingUpdate") != "RollingUpdate" {
        return None;
    }
    s.rolling_update.as_ref()
}

/// Whether the update strategy is RollingUpdate (the API's default).
pub fn is_rolling_update(ds: &DaemonSet) -> bool {
    ds.spec
        .as_ref()
        .and_then(|s| s.update_strategy.as_ref())
        .and_then(|s| s.type_.as_deref())
        .unwrap_or("RollingUpdate")
        == "RollingUpdate"
}

/// Upstream `SurgeCount`: maxSurge of `n` nodes, rounded up; 0 without RollingUpdate.
pub fn surge_count(ds: &DaemonSet, n: i32) -> i32 {
    rolling_update(ds).and_then(|r| r.max_surge.as_ref()).map_or(0, |v| scaled_value(v, n, true).max(0))
}

/// Upstream `UnavailableCount`: maxUnavailable of `n` nodes, rounded up; 0 without
/// RollingUpdate.
pub fn unavailable_count(ds: &DaemonSet, n: i32) -> i32 {
    rolling_update(ds).and_then(|r| r.max_unavailable.as_ref()).map_or(0, |v| scaled_value(v, n, true).max(0))
}

/// Upstream `AllowsSurge`.
pub fn allows_surge(ds: &DaemonSet) -> bool {
    surge_count(ds, 1) != 0
}

fn min_ready(ds: &DaemonSet) -> i32 {
    ds.spec.as_ref().and_then(|s| s.min_ready_seconds).unwrap_or(0)
}

// ---------------------------------------------------------------------------
// the plan
// ---------------------------------------------------------------------------

/// What one sync of a DaemonSet does.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct DsPlan {
    /// Orphan pods to adopt (patch in [`controller_ref`]).
    pub adopt: Vec<String>,
    /// Owned pods that stopped matching the selector: drop the ownerReference.
    pub release: Vec<String>,
    /// Nodes that get a new daemon pod ([`daemon_pod`]), at most [`BURST_REPLICAS`].
    pub create_on: Vec<String>,
    /// Pods to delete, at most [`BURST_REPLICAS`].
    pub delete: Vec<String>,
    /// Failed pods among `delete` as (pod, node): a `FailedDaemonPod` event each, and the
    /// node's back-off steps forward.
    pub failed: Vec<(String, String)>,
    /// The status to write when `status_changed`.
    pub status: DaemonSetStatus,
    pub status_changed: bool,
    /// Sync again after this long (a failed pod's back-off, minReadySeconds).
    pub requeue_after: Option<Duration>,
    /// Why the sync goes no further now, in words (explanations).
    pub waiting: Vec<String>,
}

/// Everything the planner looks at.
pub struct Input<'a> {
    pub ds: &'a DaemonSet,
    /// Every node.
    pub nodes: &'a [&'a Node],
    /// Every pod of the DaemonSet's namespace.
    pub pods: &'a [&'a Pod],
    /// The current revision's hash ([`HistoryPlan::hash`]).
    pub hash: &'a str,
    pub now: Timestamp,
    /// Whether this DaemonSet's pod creations and deletions were all seen: otherwise only the
    /// status is planned, without observedGeneration (upstream's expectations check).
    pub expectations_satisfied: bool,
    /// The failed-pod back-off of a node: Some(delay) while a failed pod there must wait.
    pub backoff: &'a dyn Fn(&str) -> Option<Duration>,
}

/// Node name -> (should run, should continue running).
type Answers = BTreeMap<String, (bool, bool)>;

fn min_some(a: Option<Duration>, b: Option<Duration>) -> Option<Duration> {
    match (a, b) {
        (Some(x), Some(y)) => Some(x.min(y)),
        (x, None) => x,
        (None, y) => y,
    }
}

/// Plans one sync (upstream `syncDaemonSet`: `manage`, then `rollingUpdate` when manage had
/// nothing to do, then the status). A DaemonSet with an empty or invalid selector or being
/// deleted plans nothing but its status.
pub fn plan(input: &Input<'_>) -> DsPlan {
    let ds = input.ds;
    let spec_selector = ds.spec.as_ref().map(|s| s.selector.clone()).unwrap_or_default();
    let selector = LabelSelector::from_api(&spec_selector).ok().filter(|s| !s.is_empty());
    let Some(selector) = selector else {
        return DsPlan {
            status: ds.status.clone().unwrap_or_default(),
            waiting: vec!["spec.selector is empty or cannot be parsed: the DaemonSet is left alone".into()],
            ..DsPlan::default()
        };
    };
    let claimed = claim(ds, &selector, input.pods);
    let mut node_pods = by_node(&claimed.pods);
    let mut p = DsPlan { adopt: claimed.adopt, release: claimed.release, ..DsPlan::default() };
    let eligibility = Eligibility::of(ds);
    let nodes: Answers = input.nodes.iter().map(|n| (n.metadata.name.clone().unwrap_or_default(), eligibility.check(n))).collect();

    if ds.metadata.deletion_timestamp.is_none() && input.expectations_satisfied {
        manage(input, &nodes, &node_pods, &mut p);
        if p.create_on.is_empty() && p.delete.is_empty() && is_rolling_update(ds) {
            roll(input, &nodes, &mut node_pods, &mut p);
        }
        if p.create_on.len() > BURST_REPLICAS || p.delete.len() > BURST_REPLICAS {
            p.waiting.push(format!("at most {BURST_REPLICAS} creations and deletions per sync: the rest follow in the next one"));
        }
        p.create_on.truncate(BURST_REPLICAS);
        p.delete.truncate(BURST_REPLICAS);
    } else if ds.metadata.deletion_timestamp.is_some() {
        p.waiting.push("the DaemonSet is being deleted: its pods are left to the garbage collector".into());
    }

    let (status, wait) = status(input, &nodes, &node_pods);
    p.requeue_after = min_some(p.requeue_after, wait);
    let current = ds.status.clone().unwrap_or_default();
    p.status_changed = normalize(&current) != normalize(&status);
    p.status = status;
    p
}

/// Upstream `manage` (with `podsShouldBeOnNode` per node and
/// `getUnscheduledPodsWithoutNode`).
fn manage(input: &Input<'_>, nodes: &Answers, node_pods: &BTreeMap<String, Vec<&Pod>>, p: &mut DsPlan) {
    let ds = input.ds;
    let surge = allows_surge(ds);
    for (node_name, &(run, keep)) in nodes {
        let pods = node_pods.get(node_name);
        match pods {
            None if run => p.create_on.push(node_name.clone()),
            Some(pods) if keep => {
                let mut running: Vec<&Pod> = Vec::new();
                for &pod in pods {
                    if pod.metadata.deletion_timestamp.is_some() {
                        continue;
                    }
                    match phase(pod) {
                        "Failed" => {
                            if let Some(delay) = (input.backoff)(node_name) {
                                p.requeue_after = min_some(p.requeue_after, Some(delay));
                                p.waiting.push(format!(
                                    "the failed pod {} on node {node_name} is replaced after its back-off ({} left)",
                                    name(&pod.metadata),
                                    crate::controllers::explain::go_duration(delay)
                                ));
                                continue;
                            }
                            p.delete.push(name(&pod.metadata));
                            p.failed.push((name(&pod.metadata), node_name.clone()));
                        }
                        "Succeeded" => p.delete.push(name(&pod.metadata)),
                        _ => running.push(pod),
                    }
                }
                running.sort_by(by_creation_and_phase);
                if !surge {
                    // one pod per node: keep the oldest
                    p.delete.extend(running.iter().skip(1).map(|pod| name(&pod.metadata)));
                    continue;
                }
                if running.is_empty() {
                    if run {
                        p.create_on.push(node_name.clone());
                    }
                    continue;
                }
                // surging: at most the oldest new pod and the oldest old pod; the old one goes
                // once it is not ready or the new one is available
                let mut oldest_new: Option<&Pod> = None;
                let mut oldest_old: Option<&Pod> = None;
                for &pod in &running {
                    let slot = if is_pod_updated(pod, input.hash, ds) { &mut oldest_new } else { &mut oldest_old };
                    if slot.is_none() {
                        *slot = Some(pod);
                    } else {
                        p.delete.push(name(&pod.metadata));
                    }
                }
                if let (Some(new), Some(old)) = (oldest_new, oldest_old) {
                    if !is_pod_ready(old) || is_pod_available(new, min_ready(ds), input.now) {
                        p.delete.push(name(&old.metadata));
                    } else {
                        p.waiting.push(format!(
                            "the old pod {} on node {node_name} goes once the new pod {} is available (maxSurge)",
                            name(&old.metadata),
                            name(&new.metadata)
                        ));
                    }
                }
            }
            Some(pods) if !keep => {
                p.delete.extend(pods.iter().filter(|pod| pod.metadata.deletion_timestamp.is_none()).map(|pod| name(&pod.metadata)));
            }
            _ => {}
        }
    }
    // pods never scheduled, for nodes that do not exist: the scheduler cannot place them and
    // PodGC only collects pods bound to a node
    for (node_name, pods) in node_pods {
        if nodes.contains_key(node_name) {
            continue;
        }
        p.delete.extend(
            pods.iter()
                .filter(|pod| pod.spec.as_ref().and_then(|s| s.node_name.as_deref()).is_none_or(str::is_empty))
                .map(|pod| name(&pod.metadata)),
        );
    }
}

/// Upstream `findUpdatedPodsOnNode`: the node's one new and one old pod (not being deleted),
/// None when it has more of either (the manage step prunes them first).
fn updated_and_old<'a>(ds: &DaemonSet, pods: &[&'a Pod], hash: &str) -> Option<(Option<&'a Pod>, Option<&'a Pod>)> {
    let (mut new, mut old) = (None, None);
    for &pod in pods.iter().filter(|p| p.metadata.deletion_timestamp.is_none()) {
        let slot = if is_pod_updated(pod, hash, ds) { &mut new } else { &mut old };
        if slot.is_some() {
            return None;
        }
        *slot = Some(pod);
    }
    Some((new, old))
}

/// Upstream `rollingUpdate` (with `updatedDesiredNodeCounts`).
fn roll(input: &Input<'_>, nodes: &Answers, node_pods: &mut BTreeMap<String, Vec<&Pod>>, p: &mut DsPlan) {
    let ds = input.ds;
    let mut desired = 0;
    for (n, &(run, _)) in nodes {
        if run {
            desired += 1;
            node_pods.entry(n.clone()).or_default();
        }
    }
    let max_surge = surge_count(ds, desired);
    let mut max_unavailable = unavailable_count(ds, desired);
    if desired > 0 && max_surge == 0 && max_unavailable == 0 {
        max_unavailable = 1;
    }
    let min_ready = min_ready(ds);
    let available = |pod: &Pod| is_pod_available(pod, min_ready, input.now);
    let node_should_run = |n: &str| nodes.get(n).is_some_and(|a| a.0);

    if max_surge == 0 {
        let mut unavailable = 0;
        let mut replace = Vec::new();
        let mut candidates = Vec::new();
        for pods in node_pods.values() {
            let Some((new, old)) = updated_and_old(ds, pods, input.hash) else {
                unavailable += 1;
                continue;
            };
            match (new, old) {
                (None, None) | (Some(_), Some(_)) => unavailable += 1,
                (Some(new), None) => {
                    if !available(new) {
                        unavailable += 1;
                    }
                }
                (None, Some(old)) => {
                    if !available(old) {
                        replace.push(name(&old.metadata));
                        unavailable += 1;
                    } else if unavailable < max_unavailable {
                        candidates.push(name(&old.metadata));
                    }
                }
            }
        }
        let room = usize::try_from((max_unavailable - unavailable).max(0)).unwrap_or(0).min(candidates.len());
        let old_available = node_pods
            .values()
            .filter_map(|pods| updated_and_old(ds, pods, input.hash))
            .filter(|(new, old)| new.is_none() && old.is_some_and(available))
            .count();
        if old_available > room {
            p.waiting.push(format!(
                "the rolling update waits: {unavailable} of {desired} daemon pods are unavailable and maxUnavailable is {max_unavailable}; {} old pods left",
                old_available
            ));
        }
        p.delete.extend(replace);
        p.delete.extend(candidates.into_iter().take(room));
        return;
    }

    let mut surged = 0;
    let mut num_available = 0;
    let mut allowed_new = Vec::new();
    let mut candidate_new = Vec::new();
    let mut should_not_run = Vec::new();
    for (n, pods) in node_pods.iter() {
        let Some((new, old)) = updated_and_old(ds, pods, input.hash) else {
            surged += 1;
            continue;
        };
        if let Some(pod) = old.or(new) {
            if available(pod) {
                num_available += 1;
            }
        }
        match (new, old) {
            (_, None) => {}
            (None, Some(old)) => {
                if !available(old) {
                    if !node_should_run(n) {
                        p.delete.push(name(&old.metadata));
                    } else {
                        allowed_new.push(n.clone());
                    }
                } else if !node_should_run(n) {
                    should_not_run.push(name(&old.metadata));
                } else if surged < max_surge {
                    candidate_new.push(n.clone());
                }
            }
            (Some(new), Some(old)) => {
                if available(new) {
                    p.delete.push(name(&old.metadata));
                } else {
                    surged += 1;
                    p.waiting.push(format!(
                        "the old pod {} on node {n} goes once the new pod {} is available (maxSurge)",
                        name(&old.metadata),
                        name(&new.metadata)
                    ));
                }
            }
        }
    }
    // with surge the owner expects full availability: a pod on a node that should no longer
    // run it goes only once others became available in its place
    let deletable = usize::try_from((num_available - desired).max(0)).unwrap_or(0).min(should_not_run.len());
    p.delete.extend(should_not_run.into_iter().take(deletable));
    let room = usize::try_from((max_surge - surged).max(0)).unwrap_or(0).min(candidate_new.len());
    if candidate_new.len() > room {
        p.waiting.push(format!(
            "the rolling update waits: {surged} nodes run a surge pod and maxSurge is {max_surge}; {} nodes left",
            candidate_new.len() - room
        ));
    }
    p.create_on.extend(allowed_new);
    p.create_on.extend(candidate_new.into_iter().take(room));
}

/// Upstream `updateDaemonSetStatus`: the numbers, and when to look again for minReadySeconds.
fn status(input: &Input<'_>, nodes: &Answers, node_pods: &BTreeMap<String, Vec<&Pod>>) -> (DaemonSetStatus, Option<Duration>) {
    let ds = input.ds;
    let (mut desired, mut current, mut misscheduled, mut ready, mut updated, mut available) = (0, 0, 0, 0, 0, 0);
    for (n, &(run, _)) in nodes {
        let mut pods: Vec<&Pod> = node_pods.get(n).cloned().unwrap_or_default();
        if !run {
            if !pods.is_empty() {
                misscheduled += 1;
            }
            continue;
        }
        desired += 1;
        if pods.is_empty() {
            continue;
        }
        current += 1;
        pods.sort_by(by_creation_and_phase);
        let pod = pods[0];
        if is_pod_ready(pod) {
            ready += 1;
            if is_pod_available(pod, min_ready(ds), input.now) {
                available += 1;
            }
        }
        if is_pod_updated(pod, input.hash, ds) {
            updated += 1;
        }
    }
    let old = ds.status.clone().unwrap_or_default();
    let observed = if input.expectations_satisfied { ds.metadata.generation } else { old.observed_generation };
    let status = DaemonSetStatus {
        desired_number_scheduled: desired,
        current_number_scheduled: current,
        number_misscheduled: misscheduled,
        number_ready: ready,
        updated_number_scheduled: Some(updated),
        number_available: Some(available),
        number_unavailable: Some(desired - available),
        observed_generation: observed,
        collision_count: old.collision_count,
        conditions: old.conditions,
    };
    let m = min_ready(ds);
    let wait = (m > 0 && ready != available).then(|| Duration::from_secs(u64::try_from(m).unwrap_or(0)));
    (status, wait)
}

/// A status with zero counts written as absent, for comparison.
pub fn normalize(s: &DaemonSetStatus) -> DaemonSetStatus {
    let nz = |v: Option<i32>| v.filter(|x| *x != 0);
    DaemonSetStatus {
        updated_number_scheduled: nz(s.updated_number_scheduled),
        number_available: nz(s.number_available),
        number_unavailable: nz(s.number_unavailable),
        conditions: s.conditions.clone().filter(|c| !c.is_empty()),
        ..s.clone()
    }
}

// ---------------------------------------------------------------------------
// revisions
// ---------------------------------------------------------------------------

/// What to do with a DaemonSet's ControllerRevisions before its pods are planned.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct HistoryPlan {
    /// The current revision's hash: the label new pods get.
    pub hash: String,
    /// Orphan revisions matching the selector to adopt, owned ones not matching to release.
    pub adopt: Vec<String>,
    pub release: Vec<String>,
    /// Owned revisions without the hash label: it gets their name (upstream).
    pub label: Vec<String>,
    /// The revision to create when none matches the template ([`snapshot`]).
    pub create: Option<ControllerRevision>,
    /// The current revision gets this revision number (it was rolled back to).
    pub bump: Option<(String, i64)>,
    /// Duplicates of the current revision to delete, and pods to relabel to its hash first.
    pub duplicates: Vec<String>,
    pub relabel: Vec<String>,
    /// Old revisions beyond revisionHistoryLimit, oldest first, none used by a live pod.
    pub cleanup: Vec<String>,
}

/// The revision's data (upstream `getPatch`): a strategic merge patch replacing the template.
pub fn revision_data(ds: &DaemonSet) -> Value {
    let mut t = serde_json::to_value(template(ds)).unwrap_or(Value::Null);
    if let Value::Object(m) = &mut t {
        m.insert("$patch".to_string(), json!("replace"));
    }
    json!({"spec": {"template": t}})
}

/// Upstream `Match`: the revision records the DaemonSet's template (compared in the shared
/// history's canonical form).
pub fn matches_revision(ds: &DaemonSet, cr: &ControllerRevision) -> bool {
    cr.data.as_ref().is_some_and(|d| history::canonical(&d.0) == history::canonical(&revision_data(ds)))
}

/// The hash of the DaemonSet's revision data with its collision count (the shared history's
/// hash; upstream hashes the template with `ComputeHash`).
pub fn template_hash(ds: &DaemonSet) -> String {
    history::hash(&revision_data(ds), ds.status.as_ref().and_then(|s| s.collision_count))
}

/// Upstream `snapshot`: a revision `<ds>-<hash>` of the current template, labelled with the
/// template's labels and the hash, carrying the DaemonSet's annotations.
pub fn snapshot(ds: &DaemonSet, revision: i64) -> ControllerRevision {
    let hash = template_hash(ds);
    let mut labels = template(ds).metadata.and_then(|m| m.labels).unwrap_or_default();
    labels.insert(REVISION_HASH_LABEL.to_string(), hash.clone());
    ControllerRevision {
        metadata: ObjectMeta {
            name: Some(history::name(ds.metadata.name.as_deref().unwrap_or_default(), &hash)),
            namespace: ds.metadata.namespace.clone(),
            labels: Some(labels),
            annotations: ds.metadata.annotations.clone(),
            owner_references: Some(vec![controller_ref(ds)]),
            ..ObjectMeta::default()
        },
        data: Some(RawExtension(revision_data(ds))),
        revision,
    }
}

fn revision_hash(cr: &ControllerRevision) -> String {
    label(&cr.metadata, REVISION_HASH_LABEL).map_or_else(|| name(&cr.metadata), str::to_string)
}

/// Upstream `constructHistory`, `dedupCurHistories` and `cleanupHistory`. `revisions` are the
/// ControllerRevisions of the namespace, `pods` its pods.
pub fn plan_history(ds: &DaemonSet, revisions: &[&ControllerRevision], pods: &[&Pod]) -> HistoryPlan {
    let mut h = HistoryPlan::default();
    let spec_selector = ds.spec.as_ref().map(|s| s.selector.clone()).unwrap_or_default();
    let Some(selector) = LabelSelector::from_api(&spec_selector).ok().filter(|s| !s.is_empty()) else {
        h.hash = template_hash(ds);
        return h;
    };
    let uid = ds.metadata.uid.as_deref().unwrap_or_default();
    let deleting = ds.metadata.deletion_timestamp.is_some();
    let ns = ds.metadata.namespace.as_deref().unwrap_or_default();
    let mut owned: Vec<&ControllerRevision> = Vec::new();
    for &cr in revisions {
        if cr.metadata.namespace.as_deref().unwrap_or_default() != ns {
            continue;
        }
        let matches = selector.matches(&cr.metadata.labels.clone().unwrap_or_default());
        match controller_of(&cr.metadata) {
            Some(o) if !uid.is_empty() && o.uid == uid => {
                if matches {
                    owned.push(cr);
                } else if !deleting {
                    h.release.push(name(&cr.metadata));
                }
            }
            Some(_) => {}
            None => {
                if matches && !deleting && !uid.is_empty() && cr.metadata.deletion_timestamp.is_none() {
                    h.adopt.push(name(&cr.metadata));
                    owned.push(cr);
                }
            }
        }
    }
    h.label = owned.iter().filter(|cr| label(&cr.metadata, REVISION_HASH_LABEL).is_none()).map(|cr| name(&cr.metadata)).collect();
    let (current, mut old): (Vec<&ControllerRevision>, Vec<&ControllerRevision>) = owned.into_iter().partition(|cr| matches_revision(ds, cr));
    let next = history::next_revision(&old);
    match current.iter().copied().reduce(|keep, cr| if cr.revision >= keep.revision { cr } else { keep }) {
        None => {
            let cr = snapshot(ds, next);
            h.hash = revision_hash(&cr);
            h.create = Some(cr);
        }
        Some(keep) => {
            h.hash = revision_hash(keep);
            if keep.revision < next {
                h.bump = Some((name(&keep.metadata), next));
            }
            h.duplicates = current.iter().filter(|cr| cr.metadata.name != keep.metadata.name).map(|cr| name(&cr.metadata)).collect();
            if !h.duplicates.is_empty() {
                let claimed = claim(ds, &selector, pods);
                h.relabel = claimed
                    .pods
                    .iter()
                    .filter(|p| label(&p.metadata, REVISION_HASH_LABEL) != Some(h.hash.as_str()))
                    .map(|p| name(&p.metadata))
                    .collect();
            }
        }
    }
    // cleanup: old revisions beyond the limit, oldest first, skipping any a live pod uses
    let limit = ds.spec.as_ref().and_then(|s| s.revision_history_limit).unwrap_or(10).max(0);
    let mut to_kill = i64::try_from(old.len()).unwrap_or(0) - i64::from(limit);
    if to_kill > 0 {
        let claimed = claim(ds, &selector, pods);
        let live: BTreeSet<&str> = by_node(&claimed.pods)
            .values()
            .flatten()
            .filter_map(|p| label(&p.metadata, REVISION_HASH_LABEL))
            .collect();
        old.sort_by_key(|cr| cr.revision);
        for cr in old {
            if to_kill <= 0 {
                break;
            }
            if live.contains(revision_hash(cr).as_str()) {
                continue;
            }
            h.cleanup.push(name(&cr.metadata));
            to_kill -= 1;
        }
    }
    h
}

/// The status with the collision count one higher (a revision name was taken by a different
/// template).
pub fn with_collision_count_bumped(ds: &DaemonSet) -> DaemonSetStatus {
    let mut s = ds.status.clone().unwrap_or_default();
    s.collision_count = Some(s.collision_count.unwrap_or(0) + 1);
    s
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn from<T: serde::de::DeserializeOwned>(v: Value) -> T {
        serde_json::from_value(v).unwrap()
    }

    fn ts(secs: i64) -> Timestamp {
        Timestamp::from_second(1_700_000_000 + secs).unwrap()
    }

    fn node(name: &str, labels: Value, taints: Value) -> Node {
        from(json!({"metadata": {"name": name, "labels": labels}, "spec": {"taints": taints}}))
    }

    fn plain(name: &str) -> Node {
        node(name, json!({}), json!([]))
    }

    fn ds(spec: Value) -> DaemonSet {
        let mut d: DaemonSet = from(json!({
            "metadata": {"name": "agent", "namespace": "kube-system", "uid": "ds-uid", "generation": 1},
            "spec": {
                "selector": {"matchLabels": {"app": "agent"}},
                "template": {"metadata": {"labels": {"app": "agent"}}, "spec": {"containers": [{"name": "c", "image": "agent:1"}]}},
                "updateStrategy": {"type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": 1, "maxSurge": 0}}
            }
        }));
        merge(&mut d, spec);
        d
    }

    fn merge(d: &mut DaemonSet, patch: Value) {
        let mut v = serde_json::to_value(&*d).unwrap();
        json_patch::merge(&mut v, &patch);
        *d = from(v);
    }

    /// A daemon pod of `agent` on a node, with a revision hash, created at `created`.
    fn pod(name: &str, node: &str, hash: &str, ready: bool, created: i64) -> Pod {
        from(json!({
            "metadata": {"name": name, "namespace": "kube-system", "labels": {"app": "agent", "controller-revision-hash": hash},
                         "creationTimestamp": ts(created).to_string(),
                         "ownerReferences": [{"apiVersion": "apps/v1", "kind": "DaemonSet", "name": "agent", "uid": "ds-uid", "controller": true}]},
            "spec": {"nodeName": node, "containers": [{"name": "c"}]},
            "status": {"phase": "Running", "conditions": [{"type": "Ready", "status": if ready { "True" } else { "False" },
                                                          "lastTransitionTime": ts(0).to_string()}]}
        }))
    }

    fn with_phase(mut p: Pod, phase: &str) -> Pod {
        p.status.as_mut().unwrap().phase = Some(phase.to_string());
        p
    }

    fn no_backoff(_: &str) -> Option<Duration> {
        None
    }

    fn run(d: &DaemonSet, nodes: &[Node], pods: &[Pod], hash: &str) -> DsPlan {
        let nodes: Vec<&Node> = nodes.iter().collect();
        let pods: Vec<&Pod> = pods.iter().collect();
        plan(&Input { ds: d, nodes: &nodes, pods: &pods, hash, now: ts(100), expectations_satisfied: true, backoff: &no_backoff })
    }

    fn taint(key: &str, effect: &str) -> Value {
        json!({"key": key, "effect": effect})
    }

    #[test]
    fn one_pod_per_eligible_node_by_selector_affinity_and_taints() {
        let d = ds(json!({"spec": {"template": {"spec": {
            "nodeSelector": {"role": "worker"},
            "affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
                {"matchExpressions": [{"key": "zone", "operator": "In", "values": ["a", "b"]}]}]}}},
            "tolerations": [{"key": "dedicated", "operator": "Equal", "value": "infra", "effect": "NoSchedule"}]
        }}}}));
        let nodes = [
            node("ok", json!({"role": "worker", "zone": "a"}), json!([])),
            node("wrong-role", json!({"role": "db", "zone": "a"}), json!([])),
            node("wrong-zone", json!({"role": "worker", "zone": "c"}), json!([])),
            node("tolerated", json!({"role": "worker", "zone": "b"}), json!([{"key": "dedicated", "value": "infra", "effect": "NoSchedule"}])),
            node("tainted", json!({"role": "worker", "zone": "b"}), json!([taint("gpu", "NoSchedule")])),
            // the automatic tolerations: a cordoned node, memory pressure, a not-ready node
            node("cordoned", json!({"role": "worker", "zone": "a"}), json!([taint(TAINT_UNSCHEDULABLE, "NoSchedule")])),
            node("pressure", json!({"role": "worker", "zone": "a"}), json!([taint(TAINT_MEMORY_PRESSURE, "NoSchedule"), taint(TAINT_DISK_PRESSURE, "NoSchedule"), taint(TAINT_PID_PRESSURE, "NoSchedule")])),
            node("not-ready", json!({"role": "worker", "zone": "a"}), json!([taint(TAINT_NOT_READY, "NoExecute"), taint(TAINT_UNREACHABLE, "NoExecute")])),
            // network-unavailable only for host-network pods
            node("no-network", json!({"role": "worker", "zone": "a"}), json!([taint(TAINT_NETWORK_UNAVAILABLE, "NoSchedule")])),
        ];
        let p = run(&d, &nodes, &[], "h1");
        assert_eq!(p.create_on, ["cordoned", "not-ready", "ok", "pressure", "tolerated"]);
        assert_eq!(p.status.desired_number_scheduled, 5);
        assert_eq!(p.status.current_number_scheduled, 0);
        assert_eq!(p.status.number_unavailable, Some(5));

        let mut host = d.clone();
        merge(&mut host, json!({"spec": {"template": {"spec": {"hostNetwork": true}}}}));
        assert!(run(&host, &nodes, &[], "h1").create_on.contains(&"no-network".to_string()));

        // and in words, for explanations
        let e = Eligibility::of(&d);
        let why = |n: &str| e.why_not(nodes.iter().find(|x| x.metadata.name.as_deref() == Some(n)).unwrap());
        assert_eq!(why("ok"), None);
        assert_eq!(why("tolerated"), None);
        assert_eq!(why("wrong-role").as_deref(), Some("the node does not match the nodeSelector or the required node affinity"));
        assert_eq!(why("tainted").as_deref(), Some("the node has the taint gpu:NoSchedule the pods do not tolerate"));
    }

    #[test]
    fn the_daemon_pod_carries_tolerations_labels_and_a_node_name_affinity() {
        let d = ds(json!({"spec": {"template": {"spec": {
            "tolerations": [{"key": TAINT_NOT_READY, "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 300}],
            "affinity": {"nodeAffinity": {
                "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [{"matchExpressions": [{"key": "zone", "operator": "In", "values": ["a"]}]}]},
                "preferredDuringSchedulingIgnoredDuringExecution": [{"weight": 1, "preference": {"matchExpressions": [{"key": "ssd", "operator": "Exists"}]}}]}}
        }}}}));
        let pod = daemon_pod(&d, "n1", "h1");
        assert_eq!(pod.metadata.generate_name.as_deref(), Some("agent-"));
        let labels = pod.metadata.labels.clone().unwrap();
        assert_eq!(labels.get(REVISION_HASH_LABEL).map(String::as_str), Some("h1"));
        assert_eq!(labels.get(TEMPLATE_GENERATION_LABEL).map(String::as_str), Some("1"));
        assert_eq!(labels.get("app").map(String::as_str), Some("agent"));
        assert_eq!(controller_of(&pod.metadata).unwrap().kind, "DaemonSet");
        let spec = pod.spec.clone().unwrap();
        assert!(spec.node_name.is_none(), "the scheduler binds it");
        let tol = spec.tolerations.clone().unwrap();
        let keys: Vec<(&str, &str)> = tol.iter().map(|t| (t.key.as_deref().unwrap(), t.effect.as_deref().unwrap())).collect();
        assert_eq!(keys, [
            (TAINT_NOT_READY, "NoExecute"), (TAINT_UNREACHABLE, "NoExecute"), (TAINT_DISK_PRESSURE, "NoSchedule"),
            (TAINT_MEMORY_PRESSURE, "NoSchedule"), (TAINT_PID_PRESSURE, "NoSchedule"), (TAINT_UNSCHEDULABLE, "NoSchedule"),
        ]);
        // the user's not-ready toleration is replaced: daemon pods are never evicted
        assert!(tol[0].toleration_seconds.is_none());
        let na = spec.affinity.as_ref().unwrap().node_affinity.as_ref().unwrap();
        let req = na.required_during_scheduling_ignored_during_execution.as_ref().unwrap();
        assert_eq!(serde_json::to_value(req).unwrap(),
            json!({"nodeSelectorTerms": [{"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["n1"]}]}]}));
        assert_eq!(na.preferred_during_scheduling_ignored_during_execution.as_ref().unwrap().len(), 1);
        assert_eq!(target_node(&pod).as_deref(), Some("n1"));
        // the scheduler's NodeAffinity accepts exactly that node
        let required = RequiredNodeAffinity::of(&pod);
        assert!(required.matches("n1", &BTreeMap::new()));
        assert!(!required.matches("n2", &BTreeMap::new()));
        // the annotation an upstream API server keeps wins over metadata.generation
        let mut annotated = d.clone();
        merge(&mut annotated, json!({"metadata": {"generation": 5, "annotations": {TEMPLATE_GENERATION_ANNOTATION: "3"}}}));
        let labels = daemon_pod(&annotated, "n1", "h1").metadata.labels.unwrap();
        assert_eq!(labels.get(TEMPLATE_GENERATION_LABEL).map(String::as_str), Some("3"));
    }

    #[test]
    fn pods_on_nodes_that_stop_being_eligible_are_deleted() {
        let d = ds(json!({"spec": {"template": {"spec": {"nodeSelector": {"role": "worker"}}}}}));
        let nodes = [
            node("kept", json!({"role": "worker"}), json!([])),
            node("relabelled", json!({"role": "db"}), json!([])),
            // NoSchedule: no new pod, but the running one stays (misscheduled is not counted)
            node("noschedule", json!({"role": "worker"}), json!([taint("maint", "NoSchedule")])),
            node("noexecute", json!({"role": "worker"}), json!([taint("maint", "NoExecute")])),
        ];
        let pods = [
            pod("a", "kept", "h1", true, 0),
            pod("b", "relabelled", "h1", true, 0),
            pod("c", "noschedule", "h1", true, 0),
            pod("d", "noexecute", "h1", true, 0),
        ];
        let p = run(&d, &nodes, &pods, "h1");
        assert!(p.create_on.is_empty());
        assert_eq!(p.delete, ["d", "b"]);
        let s = &p.status;
        assert_eq!((s.desired_number_scheduled, s.current_number_scheduled, s.number_misscheduled), (1, 1, 3));
    }

    #[test]
    fn failed_pods_are_replaced_with_back_off_and_surplus_pods_pruned() {
        let d = ds(json!({}));
        let nodes = [plain("n1"), plain("n2"), plain("n3")];
        let pods = [
            with_phase(pod("failed", "n1", "h1", false, 0), "Failed"),
            with_phase(pod("done", "n2", "h1", false, 0), "Succeeded"),
            pod("old", "n3", "h1", true, 0),
            pod("young", "n3", "h1", true, 10),
        ];
        let p = run(&d, &nodes, &pods, "h1");
        assert_eq!(p.delete, ["failed", "done", "young"]);
        assert_eq!(p.failed, [("failed".to_string(), "n1".to_string())]);
        // the node is in back-off: the failed pod stays, the sync comes back after the delay
        let nodes_ref: Vec<&Node> = nodes.iter().collect();
        let pods_ref: Vec<&Pod> = pods.iter().collect();
        let backoff = |n: &str| (n == "n1").then_some(Duration::from_secs(4));
        let p = plan(&Input { ds: &d, nodes: &nodes_ref, pods: &pods_ref, hash: "h1", now: ts(100), expectations_satisfied: true, backoff: &backoff });
        assert_eq!(p.delete, ["done", "young"]);
        assert!(p.failed.is_empty());
        assert_eq!(p.requeue_after, Some(Duration::from_secs(4)));
    }

    #[test]
    fn claims_adopt_orphans_and_release_pods_that_stopped_matching() {
        let d = ds(json!({}));
        let mut orphan = pod("orphan", "n1", "h1", true, 0);
        orphan.metadata.owner_references = None;
        let mut strayed = pod("strayed", "n2", "h1", true, 0);
        strayed.metadata.labels = Some(BTreeMap::from([("app".to_string(), "other".to_string())]));
        let mut foreign = pod("foreign", "n2", "h1", true, 0);
        foreign.metadata.owner_references.as_mut().unwrap()[0].uid = "someone-else".into();
        let p = run(&d, &[plain("n1"), plain("n2")], &[orphan, strayed, foreign], "h1");
        assert_eq!(p.adopt, ["orphan"]);
        assert_eq!(p.release, ["strayed"]);
        assert_eq!(p.create_on, ["n2"]);
    }

    #[test]
    fn unscheduled_pods_for_nodes_that_are_gone_are_deleted() {
        let d = ds(json!({}));
        let mut pending = daemon_pod(&d, "gone", "h1");
        pending.metadata.name = Some("pending".into());
        let bound = pod("bound", "gone-too", "h1", true, 0);
        let p = run(&d, &[plain("n1")], &[pending, bound], "h1");
        // the bound one is PodGC's
        assert_eq!(p.delete, ["pending"]);
        assert_eq!(p.create_on, ["n1"]);
    }

    #[test]
    fn rolling_update_replaces_max_unavailable_old_pods_at_a_time() {
        let d = ds(json!({"spec": {"updateStrategy": {"rollingUpdate": {"maxUnavailable": 2, "maxSurge": 0}}}}));
        let nodes = [plain("n1"), plain("n2"), plain("n3"), plain("n4")];
        let mut pods = vec![pod("p1", "n1", "old", true, 0), pod("p2", "n2", "old", true, 0), pod("p3", "n3", "old", true, 0), pod("p4", "n4", "old", true, 0)];
        let p = run(&d, &nodes, &pods, "new");
        assert_eq!(p.delete, ["p1", "p2"]);
        assert!(p.create_on.is_empty());
        assert_eq!(p.status.updated_number_scheduled, Some(0));
        // n1 and n2 got new pods, one of them not ready yet: one more old pod may go
        pods[0] = pod("q1", "n1", "new", true, 50);
        pods[1] = pod("q2", "n2", "new", false, 50);
        let p = run(&d, &nodes, &pods, "new");
        assert_eq!(p.delete, ["p3"]);
        assert_eq!(p.status.updated_number_scheduled, Some(2));
        assert_eq!(p.status.number_ready, 3);
        assert_eq!((p.status.number_available, p.status.number_unavailable), (Some(3), Some(1)));
        // an old pod that is not available is replaced regardless of the budget
        pods[1] = pod("q2", "n2", "new", false, 50);
        pods[3] = pod("p4", "n4", "old", false, 0);
        let p = run(&d, &nodes, &pods, "new");
        assert_eq!(p.delete, ["p4"]);
        // a node with no pod yet: the manage step creates first, no update in the same pass
        let p = run(&d, &[plain("n1"), plain("n2"), plain("n3"), plain("n4"), plain("n5")], &pods, "new");
        assert_eq!(p.create_on, ["n5"]);
        assert!(p.delete.is_empty());
        // a percentage rounds up
        let pct = ds(json!({"spec": {"updateStrategy": {"rollingUpdate": {"maxUnavailable": "30%", "maxSurge": 0}}}}));
        let all_old = [pod("p1", "n1", "old", true, 0), pod("p2", "n2", "old", true, 0), pod("p3", "n3", "old", true, 0), pod("p4", "n4", "old", true, 0)];
        assert_eq!(run(&pct, &nodes, &all_old, "new").delete, ["p1", "p2"]);
        // OnDelete: nothing is replaced
        let on_delete = ds(json!({"spec": {"updateStrategy": {"type": "OnDelete", "rollingUpdate": null}}}));
        let p = run(&on_delete, &nodes, &all_old, "new");
        assert!(p.delete.is_empty() && p.create_on.is_empty());
        assert_eq!(p.status.updated_number_scheduled, Some(0));
    }

    #[test]
    fn rolling_update_with_max_surge_starts_new_pods_before_old_ones_go() {
        let d = ds(json!({"spec": {"updateStrategy": {"rollingUpdate": {"maxUnavailable": 0, "maxSurge": 1}}}}));
        let nodes = [plain("n1"), plain("n2"), plain("n3")];
        let mut pods = vec![pod("p1", "n1", "old", true, 0), pod("p2", "n2", "old", true, 0), pod("p3", "n3", "old", true, 0)];
        let p = run(&d, &nodes, &pods, "new");
        assert_eq!(p.create_on, ["n1"]);
        assert!(p.delete.is_empty());
        // the surge pod is not ready yet: nothing more
        pods.push(pod("q1", "n1", "new", false, 50));
        let p = run(&d, &nodes, &pods, "new");
        assert!(p.create_on.is_empty() && p.delete.is_empty(), "{p:?}");
        assert_eq!(p.status.current_number_scheduled, 3);
        // it became available: the old pod on n1 goes (the manage step decides that)
        pods[3] = pod("q1", "n1", "new", true, 50);
        let p = run(&d, &nodes, &pods, "new");
        assert_eq!(p.delete, ["p1"]);
        assert!(p.create_on.is_empty());
        // an old pod that is not ready is replaced at once, beyond maxSurge
        pods.remove(0);
        pods[0] = pod("p2", "n2", "old", false, 0);
        let p = run(&d, &nodes, &pods, "new");
        assert_eq!(p.create_on, ["n2", "n3"]);
    }

    #[test]
    fn surge_keeps_the_oldest_new_and_old_pod_per_node() {
        let d = ds(json!({"spec": {"updateStrategy": {"rollingUpdate": {"maxUnavailable": 0, "maxSurge": "10%"}}}}));
        let pods = [pod("old-a", "n1", "old", true, 0), pod("old-b", "n1", "old", true, 5), pod("new-a", "n1", "new", false, 10), pod("new-b", "n1", "new", false, 20)];
        let p = run(&d, &[plain("n1")], &pods, "new");
        assert_eq!(p.delete, ["old-b", "new-b"]);
    }

    #[test]
    fn status_counts_follow_upstream() {
        let d = ds(json!({"metadata": {"generation": 4}, "spec": {"minReadySeconds": 200, "template": {"spec": {"nodeSelector": {"run": "yes"}}}}}));
        let nodes = [
            node("n1", json!({"run": "yes"}), json!([])),
            node("n2", json!({"run": "yes"}), json!([])),
            node("n3", json!({"run": "yes"}), json!([])),
            node("n4", json!({"run": "no"}), json!([])),
        ];
        // n1: ready since ts(0), not yet available at ts(100) with minReadySeconds 200;
        // n2: not ready; n3: none; n4: misscheduled
        let pods = [pod("a", "n1", "h1", true, 0), pod("b", "n2", "old", false, 0), pod("c", "n4", "h1", true, 0)];
        let nodes_ref: Vec<&Node> = nodes.iter().collect();
        let pods_ref: Vec<&Pod> = pods.iter().collect();
        let p = plan(&Input { ds: &d, nodes: &nodes_ref, pods: &pods_ref, hash: "h1", now: ts(100), expectations_satisfied: false, backoff: &no_backoff });
        assert!(p.create_on.is_empty() && p.delete.is_empty(), "expectations hold the actions back");
        let s = p.status.clone();
        assert_eq!(
            (s.desired_number_scheduled, s.current_number_scheduled, s.number_misscheduled, s.number_ready),
            (3, 2, 1, 1)
        );
        assert_eq!((s.updated_number_scheduled, s.number_available, s.number_unavailable), (Some(1), Some(0), Some(3)));
        assert_eq!(s.observed_generation, None, "not observed while expectations are pending");
        assert_eq!(p.requeue_after, Some(Duration::from_secs(200)));
        let p = plan(&Input { ds: &d, nodes: &nodes_ref, pods: &pods_ref, hash: "h1", now: ts(300), expectations_satisfied: true, backoff: &no_backoff });
        assert_eq!(p.status.observed_generation, Some(4));
        assert_eq!(p.status.number_available, Some(1));
        assert!(p.status_changed);
        // a status already written is not written again
        let mut same = d.clone();
        same.status = Some(p.status.clone());
        let again = plan(&Input { ds: &same, nodes: &nodes_ref, pods: &pods_ref, hash: "h1", now: ts(300), expectations_satisfied: true, backoff: &no_backoff });
        assert!(!again.status_changed);
    }

    #[test]
    fn an_empty_selector_or_a_deleted_daemonset_plans_nothing() {
        let mut d = ds(json!({}));
        d.spec.as_mut().unwrap().selector = Default::default();
        let waiting = vec!["spec.selector is empty or cannot be parsed: the DaemonSet is left alone".to_string()];
        assert_eq!(run(&d, &[plain("n1")], &[], "h"), DsPlan { status: DaemonSetStatus::default(), waiting, ..DsPlan::default() });
        let mut deleting = ds(json!({}));
        deleting.metadata.deletion_timestamp = Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(ts(0)));
        let p = run(&deleting, &[plain("n1")], &[], "h");
        assert!(p.create_on.is_empty());
    }

    fn revision(name: &str, d: &DaemonSet, number: i64) -> ControllerRevision {
        let mut cr = snapshot(d, number);
        cr.metadata.name = Some(name.to_string());
        cr.metadata.labels.as_mut().unwrap().insert(REVISION_HASH_LABEL.into(), name.to_string());
        cr
    }

    #[test]
    fn history_creates_a_revision_per_template_and_reuses_it_on_rollback() {
        let v1 = ds(json!({}));
        let h = plan_history(&v1, &[], &[]);
        let cr = h.create.clone().unwrap();
        assert_eq!(cr.revision, 1);
        assert_eq!(cr.metadata.name.as_deref(), Some(format!("agent-{}", h.hash).as_str()));
        assert_eq!(label(&cr.metadata, REVISION_HASH_LABEL), Some(h.hash.as_str()));
        assert_eq!(label(&cr.metadata, "app"), Some("agent"));
        assert_eq!(cr.data.as_ref().unwrap().0.pointer("/spec/template/$patch"), Some(&json!("replace")));
        assert!(matches_revision(&v1, &cr));
        // the same template finds its revision
        let again = plan_history(&v1, &[&cr], &[]);
        assert_eq!((again.create, again.hash.clone(), again.bump), (None, h.hash.clone(), None));
        // a new template: revision 2
        let mut v2 = v1.clone();
        merge(&mut v2, json!({"spec": {"template": {"spec": {"containers": [{"name": "c", "image": "agent:2"}]}}}}));
        let h2 = plan_history(&v2, &[&cr], &[]);
        let cr2 = h2.create.clone().unwrap();
        assert_eq!(cr2.revision, 2);
        assert_ne!(h2.hash, h.hash);
        // back to the first template (rollout undo): revision 1 is reused and becomes 3
        let h3 = plan_history(&v1, &[&cr, &cr2], &[]);
        assert!(h3.create.is_none());
        assert_eq!(h3.hash, h.hash);
        assert_eq!(h3.bump, Some((cr.metadata.name.clone().unwrap(), 3)));
    }

    #[test]
    fn history_dedups_claims_and_cleans_up_beyond_the_limit() {
        let d = ds(json!({"spec": {"revisionHistoryLimit": 1}}));
        let mut other = d.clone();
        merge(&mut other, json!({"spec": {"template": {"spec": {"containers": [{"name": "c", "image": "agent:0"}]}}}}));
        let mut older = other.clone();
        merge(&mut older, json!({"spec": {"template": {"spec": {"containers": [{"name": "c", "image": "agent:-1"}]}}}}));
        let cur_a = revision("cur-a", &d, 5);
        let cur_b = revision("cur-b", &d, 6);
        let old1 = revision("old1", &older, 1);
        let old2 = revision("old2", &other, 2);
        let old3 = revision("old3", &older, 3);
        let mut orphan = revision("orphan", &other, 4);
        orphan.metadata.owner_references = None;
        // a live pod still runs old2's template
        let pods = [pod("p1", "n1", "old2", true, 0), pod("p2", "n2", "cur-a", true, 0)];
        let pods_ref: Vec<&Pod> = pods.iter().collect();
        let h = plan_history(&d, &[&cur_a, &cur_b, &old1, &old2, &old3, &orphan], &pods_ref);
        assert_eq!(h.hash, "cur-b");
        assert_eq!(h.duplicates, ["cur-a"]);
        assert_eq!(h.relabel, ["p1", "p2"]);
        assert_eq!(h.adopt, ["orphan"]);
        assert_eq!(h.bump, None);
        // four old revisions, one kept: the oldest go, old2 is in use
        assert_eq!(h.cleanup, ["old1", "old3", "orphan"]);
    }

    #[test]
    fn should_run_distinguishes_new_pods_from_running_ones() {
        let d = ds(json!({}));
        assert_eq!(should_run(&plain("n"), &d), (true, true));
        assert_eq!(should_run(&node("n", json!({}), json!([taint("x", "NoSchedule")])), &d), (false, true));
        assert_eq!(should_run(&node("n", json!({}), json!([taint("x", "NoExecute")])), &d), (false, false));
        assert_eq!(should_run(&node("n", json!({}), json!([taint("x", "PreferNoSchedule")])), &d), (true, true));
        let mut pinned = d.clone();
        merge(&mut pinned, json!({"spec": {"template": {"spec": {"nodeName": "other"}}}}));
        assert_eq!(should_run(&plain("n"), &pinned), (false, false));
    }
}
