//! The StatefulSet planner: from a StatefulSet, the pods and claims of its namespace and its
//! ControllerRevisions to the revision to create, the pods and claims to create, delete or
//! patch, the status to write and the revisions to let go (upstream
//! `pkg/controller/statefulset`: `getStatefulSetRevisions`, `updateStatefulSet`,
//! `processReplica`, `processCondemned`, `updateStatefulSetAfterInvariantEstablished`,
//! `truncateHistory`, `completeRollingUpdate`).
//!
//! Pure: no I/O, no clock. The executor applies [`Plan::revision`] first, then
//! [`Plan::actions`] in order, stopping at the first failure; then it writes the status when it
//! changed and deletes [`Plan::delete_revisions`].
//!
//! Differences from upstream, deliberate:
//! - a pod whose volumes do not match the claim templates is not updated (a pod's volumes are
//!   immutable; upstream's update would be refused too); its missing claims are created;
//! - `maxUnavailable` is honoured whenever it is set (upstream's MaxUnavailableStatefulSet
//!   gate); without it the update follows upstream's one-at-a-time path;
//! - a claim being deleted, or still owned by an earlier pod of the same name (whenScaled
//!   Delete), holds the pod's creation back and the set is looked at again after a second.

pub mod identity;
pub mod revision;
#[cfg(test)]
mod tests;

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use jiff::Timestamp;
use k8s_openapi::api::apps::v1::{ControllerRevision, StatefulSet, StatefulSetStatus};
use k8s_openapi::api::core::v1::{PersistentVolumeClaim, Pod, PodTemplateSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{OwnerReference, Time};

use self::identity::*;
use self::revision::{Revision, RevisionStep};
use crate::controllers::deployment::plan::scaled_value;
use crate::controllers::history;
use crate::controllers::replicaset::plan::{controller_of, is_pod_available, is_pod_ready};
use crate::selector::LabelSelector;

pub const PARALLEL: &str = "Parallel";
pub const ON_DELETE: &str = "OnDelete";

/// Why a pod is deleted (the executor logs it; the event is the same).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Why {
    /// Failed or Succeeded: it is recreated.
    Finished,
    /// Its ordinal is out of range.
    ScaleDown,
    /// It runs another revision than the update revision.
    Update,
}

/// One step of a sync, applied in order.
#[derive(Clone, Debug, PartialEq)]
pub enum Action {
    /// An orphan pod of this set's names and selector: add the controller reference.
    Adopt { name: String },
    /// An owned pod that stopped matching the selector: drop the set's reference.
    Release { name: String },
    /// A claim of a pod, created before the pod (an existing claim is fine).
    CreateClaim { claim: Box<PersistentVolumeClaim>, pod: String },
    CreatePod(Box<Pod>),
    /// Delete a pod (with its uid as precondition).
    DeletePod { name: String, uid: String, why: Why },
    /// Give an existing pod its identity labels back.
    PatchPodLabels { name: String, labels: BTreeMap<String, String> },
    /// Set a claim's ownerReferences for the retention policy (guarded by its resourceVersion).
    SetClaimOwners { name: String, owners: Vec<OwnerReference>, resource_version: Option<String> },
    Event { type_: &'static str, reason: &'static str, message: String },
}

impl Action {
    /// The action in words (explanations).
    pub fn describe(&self) -> String {
        match self {
            Action::Adopt { name } => format!("adopt orphan Pod {name}"),
            Action::Release { name } => format!("release Pod {name}: it no longer matches the selector"),
            Action::CreateClaim { claim, pod } => {
                format!("create PersistentVolumeClaim {} for Pod {pod}", claim.metadata.name.as_deref().unwrap_or_default())
            }
            Action::CreatePod(p) => {
                let rev = p.metadata.labels.as_ref().and_then(|l| l.get(REVISION_LABEL)).map(String::as_str).unwrap_or_default();
                format!("create Pod {} at revision {rev}", p.metadata.name.as_deref().unwrap_or_default())
            }
            Action::DeletePod { name, why, .. } => {
                let why = match why {
                    Why::Finished => "it finished; it is recreated",
                    Why::ScaleDown => "its ordinal is beyond the replicas",
                    Why::Update => "it runs an old revision; it comes back at the update revision",
                };
                format!("delete Pod {name}: {why}")
            }
            Action::PatchPodLabels { name, .. } => format!("give Pod {name} its identity labels back"),
            Action::SetClaimOwners { name, owners, .. } => {
                let o: Vec<String> = owners.iter().map(|o| format!("{} {}", o.kind, o.name)).collect();
                format!("set the owners of PersistentVolumeClaim {name} to [{}] (persistentVolumeClaimRetentionPolicy)", o.join(", "))
            }
            Action::Event { type_, reason, message } => format!("record {type_} event {reason}: {message}"),
        }
    }
}

/// What the StatefulSet controller should do for one set.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Plan {
    /// A revision to create or renumber before anything else.
    pub revision: Option<RevisionStep>,
    pub actions: Vec<Action>,
    /// The status after this sync (assuming the actions succeed).
    pub status: StatefulSetStatus,
    pub status_changed: bool,
    /// Revisions beyond revisionHistoryLimit, oldest first.
    pub delete_revisions: Vec<String>,
    /// Look again after this long (a pod becoming available, a claim being let go).
    pub requeue_after: Option<Duration>,
    /// Why the sync goes no further now, in words (explanations).
    pub waiting: Vec<String>,
}

fn phase(p: &Pod) -> &str {
    p.status.as_ref().and_then(|s| s.phase.as_deref()).unwrap_or_default()
}
fn is_created(p: &Pod) -> bool {
    !phase(p).is_empty()
}
fn is_terminating(p: &Pod) -> bool {
    p.metadata.deletion_timestamp.is_some()
}
fn running_and_ready(p: &Pod) -> bool {
    phase(p) == "Running" && is_pod_ready(p)
}
fn running_and_available(p: &Pod, min_ready: i32, now: Timestamp) -> bool {
    running_and_ready(p) && is_pod_available(p, min_ready, now)
}
fn healthy(p: &Pod) -> bool {
    running_and_ready(p) && !is_terminating(p)
}
fn revision_of(p: &Pod) -> &str {
    p.metadata.labels.as_ref().and_then(|l| l.get(REVISION_LABEL)).map(String::as_str).unwrap_or_default()
}
fn name_of(p: &Pod) -> String {
    p.metadata.name.clone().unwrap_or_default()
}
fn uid_of(p: &Pod) -> String {
    p.metadata.uid.clone().unwrap_or_default()
}

/// A pod's state in words: its phase, or Terminating, or not created by a node yet.
pub fn pod_state(p: &Pod) -> String {
    if is_terminating(p) {
        return "Terminating".into();
    }
    match phase(p) {
        "" => "not yet seen by a node".into(),
        "Running" if !is_pod_ready(p) => "Running, not Ready".into(),
        ph => ph.to_string(),
    }
}

/// How long until a ready pod becomes available, `None` when not ready or already available.
fn time_to_available(p: &Pod, min_ready: i32, now: Timestamp) -> Option<Duration> {
    if min_ready <= 0 || !running_and_ready(p) || is_pod_available(p, min_ready, now) {
        return None;
    }
    let since = p
        .status
        .as_ref()?
        .conditions
        .iter()
        .flatten()
        .find(|c| c.type_ == "Ready")
        .and_then(|c| c.last_transition_time.as_ref())
        .map(|Time(t)| *t);
    let min = Duration::from_secs(u64::try_from(min_ready).unwrap_or(0));
    let elapsed = since.map(|s| Duration::try_from(now.duration_since(s)).unwrap_or(Duration::ZERO)).unwrap_or(Duration::ZERO);
    Some(min.saturating_sub(elapsed) + Duration::from_secs(1))
}

/// A slot of the ordinal range: the pod there, or one this sync creates.
#[derive(Clone, Copy)]
enum Slot<'a> {
    Pod(&'a Pod),
    New,
}

impl Slot<'_> {
    fn healthy(&self) -> bool {
        matches!(self, Slot::Pod(p) if healthy(p))
    }
    fn available(&self, min_ready: i32, now: Timestamp) -> bool {
        matches!(self, Slot::Pod(p) if running_and_available(p, min_ready, now))
    }
}

struct Planner<'a> {
    set: &'a StatefulSet,
    claims: BTreeMap<&'a str, &'a PersistentVolumeClaim>,
    current: &'a Revision,
    update: &'a Revision,
    min_ready: i32,
    now: Timestamp,
    actions: Vec<Action>,
    /// Pods deleted because they finished (they no longer count in the status).
    replaced: BTreeSet<String>,
    deleted_for_update: i32,
    retry_soon: bool,
    waiting: Vec<String>,
    /// Whether anything follows the last ordinal (pods to condemn or to update).
    more_after_last: bool,
}

impl<'a> Planner<'a> {
    fn event(&mut self, type_: &'static str, reason: &'static str, message: String) {
        self.actions.push(Action::Event { type_, reason, message });
    }

    /// The revision and template a new pod of `ordinal` gets (upstream
    /// `newVersionedStatefulSetPod`): below `start + partition` the current revision.
    fn versioned(&self, ordinal: i32) -> (&'a str, &'a PodTemplateSpec) {
        let spec = self.set.spec.as_ref();
        let strategy = spec.and_then(|s| s.update_strategy.as_ref());
        let partition = strategy.and_then(|s| s.rolling_update.as_ref()).map(|r| r.partition.unwrap_or(0));
        let rolling = strategy.and_then(|s| s.type_.as_deref()).unwrap_or("RollingUpdate") == "RollingUpdate";
        let start = start_ordinal(self.set);
        let current = match partition {
            Some(p) => ordinal < start + p,
            None => rolling && ordinal < start,
        };
        if current {
            (&self.current.name, &self.current.template)
        } else {
            (&self.update.name, &self.update.template)
        }
    }

    /// Claims for a pod about to be created: missing ones are created; false when a claim
    /// holds the creation back (being deleted, or still another pod's).
    fn claims_for_new_pod(&mut self, ordinal: i32) -> bool {
        let pod = pod_name(self.set, ordinal);
        let mut create = Vec::new();
        for claim in claims_for(self.set, ordinal) {
            let cname = claim.metadata.name.clone().unwrap_or_default();
            match self.claims.get(cname.as_str()) {
                None => create.push(Action::CreateClaim { claim: Box::new(claim), pod: pod.clone() }),
                Some(c) if c.metadata.deletion_timestamp.is_some() || claim_is_stale(self.set, c, &pod, None) => {
                    self.retry_soon = true;
                    let why = if c.metadata.deletion_timestamp.is_some() {
                        "to finish its deletion"
                    } else {
                        "to be let go by the earlier pod of that name (whenScaled: Delete)"
                    };
                    self.waiting.push(format!("{pod} waits for its claim {cname} {why}"));
                    return false;
                }
                Some(_) => {}
            }
        }
        self.actions.extend(create);
        true
    }

    /// Missing claims of an existing pod (upstream `createMissingPersistentVolumeClaims`).
    fn missing_claims(&mut self, ordinal: i32, pod: &str) {
        for claim in claims_for(self.set, ordinal) {
            let cname = claim.metadata.name.clone().unwrap_or_default();
            if !self.claims.contains_key(cname.as_str()) {
                self.actions.push(Action::CreateClaim { claim: Box::new(claim), pod: pod.to_string() });
            }
        }
    }

    /// Claim owner references per the retention policy (upstream `UpdatePodClaimForRetentionPolicy`).
    fn fix_claim_owners(&mut self, ordinal: i32, pod: &Pod) {
        let (name, uid) = (name_of(pod), uid_of(pod));
        for (_, cname) in claim_names(self.set, ordinal) {
            let Some(c) = self.claims.get(cname.as_str()) else { continue };
            if c.metadata.deletion_timestamp.is_some() {
                continue;
            }
            let current = c.metadata.owner_references.clone().unwrap_or_default();
            let want = claim_owners(self.set, &current, ordinal, Some((&name, &uid)));
            if want != current {
                self.actions.push(Action::SetClaimOwners {
                    name: cname,
                    owners: want,
                    resource_version: c.metadata.resource_version.clone(),
                });
            }
        }
    }

    fn delete(&mut self, pod: &Pod, why: Why) {
        self.actions.push(Action::DeletePod { name: name_of(pod), uid: uid_of(pod), why });
    }

    /// Upstream `processReplica`; true: stop this sync (monotonic mode waits).
    fn process_replica(&mut self, slots: &mut [Slot<'a>], i: usize, monotonic: bool) -> bool {
        let ordinal = start_ordinal(self.set) + i32::try_from(i).unwrap_or(i32::MAX);
        if let Slot::Pod(p) = slots[i] {
            if matches!(phase(p), "Failed" | "Succeeded") {
                let (ns, set, pod) = (self.set.metadata.namespace.clone().unwrap_or_default(), set_name(self.set), name_of(p));
                if phase(p) == "Failed" {
                    self.event("Warning", "RecreatingFailedPod", format!("StatefulSet {ns}/{set} is recreating failed Pod {pod}"));
                } else {
                    self.event("Normal", "RecreatingTerminatedPod", format!("StatefulSet {ns}/{set} is recreating terminated Pod {pod}"));
                }
                self.delete(p, Why::Finished);
                self.replaced.insert(pod);
                slots[i] = Slot::New;
            }
        }
        let p = match slots[i] {
            Slot::Pod(p) => p,
            Slot::New => {
                if !self.claims_for_new_pod(ordinal) {
                    return monotonic;
                }
                let (rev, template) = self.versioned(ordinal);
                self.actions.push(Action::CreatePod(Box::new(new_pod(self.set, template, rev, ordinal))));
                if monotonic {
                    self.blocked_after(i, slots.len(), &pod_name(self.set, ordinal), "be created, Running and Ready");
                }
                return monotonic;
            }
        };
        if phase(p) == "Pending" {
            self.missing_claims(ordinal, &name_of(p));
        }
        if monotonic && is_terminating(p) {
            self.blocked_after(i, slots.len(), &name_of(p), "finish terminating and come back");
            return true;
        }
        if monotonic && !running_and_available(p, self.min_ready, self.now) {
            let cond = if running_and_ready(p) {
                format!("stay Ready for minReadySeconds ({}s)", self.min_ready)
            } else {
                format!("be Running and Ready (it is {})", pod_state(p))
            };
            self.blocked_after(i, slots.len(), &name_of(p), &cond);
            return true;
        }
        if !identity_matches(self.set, p, ordinal) {
            let mut labels = p.metadata.labels.clone().unwrap_or_default();
            labels.extend(identity_labels(self.set, ordinal));
            self.actions.push(Action::PatchPodLabels { name: name_of(p), labels });
        }
        self.fix_claim_owners(ordinal, p);
        false
    }

    /// What waits for the pod of slot `i` in OrderedReady mode: the next ordinal, or the
    /// scale-down and rolling update after the last one.
    fn blocked_after(&mut self, i: usize, n: usize, pod: &str, cond: &str) {
        if i + 1 < n {
            let next = pod_name(self.set, start_ordinal(self.set) + i32::try_from(i + 1).unwrap_or(i32::MAX));
            self.waiting.push(format!("{next} waits for {pod} to {cond} (OrderedReady)"));
        } else if self.more_after_last {
            self.waiting.push(format!("the scale-down and rolling update wait for {pod} to {cond} (OrderedReady)"));
        }
    }

    /// Upstream `processCondemned`; true: stop this sync.
    fn process_condemned(&mut self, p: &Pod, first_unhealthy: Option<&str>, monotonic: bool) -> bool {
        if is_terminating(p) {
            if monotonic {
                self.waiting.push(format!("the scale-down waits for {} to finish terminating (OrderedReady)", name_of(p)));
            }
            return monotonic;
        }
        let is_first = first_unhealthy == Some(name_of(p).as_str());
        if monotonic && !running_and_available(p, self.min_ready, self.now) && !is_first {
            let who = first_unhealthy.filter(|s| !s.is_empty()).unwrap_or("every pod");
            self.waiting.push(format!(
                "the scale-down of {} waits for {who} to be Running and Ready, or to be the first unhealthy pod (OrderedReady)",
                name_of(p)
            ));
            return true;
        }
        self.delete(p, Why::ScaleDown);
        if monotonic {
            self.waiting.push(format!("the rest of the scale-down waits for {} to be gone (OrderedReady)", name_of(p)));
        }
        monotonic
    }

    /// Upstream's rolling update: the highest ordinal at or above the partition that is not at
    /// the update revision is deleted (it comes back at the update revision), one at a time
    /// or up to maxUnavailable.
    fn rolling_update(&mut self, slots: &[Slot<'a>]) {
        let strategy = self.set.spec.as_ref().and_then(|s| s.update_strategy.as_ref()).and_then(|s| s.rolling_update.as_ref());
        let partition = usize::try_from(strategy.and_then(|r| r.partition).unwrap_or(0).max(0)).unwrap_or(0);
        let update = self.update.name.clone();
        if let Some(max) = strategy.and_then(|r| r.max_unavailable.as_ref()) {
            let n = i32::try_from(slots.len()).unwrap_or(i32::MAX);
            let max = scaled_value(max, n, false).max(1);
            let unavailable = slots.iter().filter(|s| !s.healthy() || !s.available(self.min_ready, self.now)).count();
            let mut budget = usize::try_from(max).unwrap_or(1).saturating_sub(unavailable);
            for slot in slots.iter().skip(partition).rev() {
                if budget == 0 {
                    if slots.iter().skip(partition).any(|s| matches!(s, Slot::Pod(p) if revision_of(p) != update && !is_terminating(p))) {
                        self.waiting.push(format!(
                            "the rolling update waits: {unavailable} of {n} pods are unavailable and maxUnavailable is {max}"
                        ));
                    }
                    break;
                }
                if let Slot::Pod(p) = slot {
                    if revision_of(p) != update && !is_terminating(p) {
                        self.delete(p, Why::Update);
                        self.deleted_for_update += 1;
                        budget -= 1;
                    }
                }
            }
            return;
        }
        for (i, slot) in slots.iter().enumerate().skip(partition).rev() {
            if let Slot::Pod(p) = slot {
                if revision_of(p) != update && !is_terminating(p) {
                    self.delete(p, Why::Update);
                    self.deleted_for_update += 1;
                    self.waiting.push(format!("the rolling update waits for {} to come back at revision {update}", name_of(p)));
                    return;
                }
            }
            if !slot.healthy() {
                let left = slots[partition..i].iter().any(|s| matches!(s, Slot::Pod(p) if revision_of(p) != update));
                if left {
                    let name = pod_name(self.set, start_ordinal(self.set) + i32::try_from(i).unwrap_or(i32::MAX));
                    self.waiting.push(format!("the rolling update waits for {name} to be Running and Ready"));
                }
                return;
            }
        }
    }

    /// Pods kept at another revision on purpose (partition, OnDelete), in words.
    fn held(&mut self, slots: &[Slot<'a>], on_delete: bool) {
        let update = self.update.name.clone();
        let partition = self
            .set
            .spec
            .as_ref()
            .and_then(|s| s.update_strategy.as_ref())
            .and_then(|s| s.rolling_update.as_ref())
            .and_then(|r| r.partition)
            .unwrap_or(0);
        let limit = if on_delete { slots.len() } else { usize::try_from(partition.max(0)).unwrap_or(0).min(slots.len()) };
        let old: Vec<String> = slots[..limit]
            .iter()
            .filter_map(|s| match s {
                Slot::Pod(p) if revision_of(p) != update => Some(name_of(p)),
                _ => None,
            })
            .collect();
        if old.is_empty() {
            return;
        }
        if on_delete {
            self.waiting.push(format!("{} keep their revision until they are deleted (updateStrategy OnDelete)", old.join(", ")));
        } else {
            self.waiting.push(format!(
                "{} stay at revision {} below the partition ({partition})",
                old.join(", "),
                self.current.name
            ));
        }
    }

    /// Upstream `updateStatefulSet` after the revisions are known.
    fn sync(&mut self, claimed: &[&'a Pod]) {
        let set = self.set;
        let n = usize::try_from(replicas(set)).unwrap_or(0);
        let start = start_ordinal(set);
        let mut slots: Vec<Slot<'a>> = vec![Slot::New; n];
        let mut condemned: Vec<(i32, &'a Pod)> = Vec::new();
        for &p in claimed {
            let Some(ord) = ordinal_of(set, p) else { continue };
            if in_range(set, ord) {
                let i = usize::try_from(ord - start).unwrap_or(0);
                slots[i] = Slot::Pod(p);
            } else {
                condemned.push((ord, p));
            }
        }
        condemned.sort_by_key(|(o, _)| std::cmp::Reverse(*o));
        let first_unhealthy: Option<String> = slots
            .iter()
            .find_map(|s| match s {
                Slot::Pod(p) if !healthy(p) => Some(name_of(p)),
                Slot::New => Some(String::new()),
                _ => None,
            })
            .or_else(|| condemned.iter().rev().find(|(_, p)| !healthy(p)).map(|(_, p)| name_of(p)));
        if set.metadata.deletion_timestamp.is_some() {
            self.waiting.push("the StatefulSet is being deleted: its pods are left to the garbage collector".into());
            return;
        }
        let spec = set.spec.as_ref();
        let monotonic = spec.and_then(|s| s.pod_management_policy.as_deref()) != Some(PARALLEL);
        self.more_after_last =
            !condemned.is_empty() || slots.iter().any(|s| matches!(s, Slot::Pod(p) if revision_of(p) != self.update.name));
        let strategy = spec.and_then(|s| s.update_strategy.as_ref()).and_then(|s| s.type_.as_deref());
        self.held(&slots, strategy == Some(ON_DELETE));
        for i in 0..n {
            if self.process_replica(&mut slots, i, monotonic) {
                return;
            }
        }
        for &(ord, p) in &condemned {
            self.fix_claim_owners(ord, p);
        }
        for &(_, p) in &condemned {
            if self.process_condemned(p, first_unhealthy.as_deref(), monotonic) {
                return;
            }
        }
        if strategy == Some(ON_DELETE) {
            return;
        }
        self.rolling_update(&slots);
    }
}

/// Upstream `ClaimPods` with `isMemberOf`: pods named `<set>-<ordinal>` this set controls and
/// that match its selector, plus orphans to adopt; owned pods that stopped matching are released.
fn claim<'a>(set: &StatefulSet, selector: &LabelSelector, pods: &[&'a Pod]) -> (Vec<&'a Pod>, Vec<Action>) {
    let uid = set.metadata.uid.clone().unwrap_or_default();
    let deleting = set.metadata.deletion_timestamp.is_some();
    let mut claimed = Vec::new();
    let mut actions = Vec::new();
    for &p in pods {
        if p.metadata.namespace != set.metadata.namespace || ordinal_of(set, p).is_none() {
            continue;
        }
        let matches = !selector.is_empty() && selector.matches(&p.metadata.labels.clone().unwrap_or_default());
        match controller_of(&p.metadata) {
            Some(r) if !uid.is_empty() && r.uid == uid => {
                if matches {
                    claimed.push(p);
                } else if !deleting {
                    actions.push(Action::Release { name: name_of(p) });
                }
            }
            Some(_) => {}
            None => {
                if matches && !deleting && !is_terminating(p) && !uid.is_empty() {
                    actions.push(Action::Adopt { name: name_of(p) });
                    claimed.push(p);
                }
            }
        }
    }
    (claimed, actions)
}

/// The status from the pods (upstream `updateStatus` + `completeRollingUpdate`).
fn compute_status(set: &StatefulSet, pods: &[&Pod], current: &str, update: &str, collision: i32, min_ready: i32, now: Timestamp) -> StatefulSetStatus {
    let mut s = StatefulSetStatus {
        observed_generation: set.metadata.generation,
        current_revision: Some(current.to_string()),
        update_revision: Some(update.to_string()),
        collision_count: Some(collision),
        conditions: set.status.as_ref().and_then(|s| s.conditions.clone()),
        ..StatefulSetStatus::default()
    };
    let (mut ready, mut available, mut cur, mut upd) = (0, 0, 0, 0);
    for p in pods {
        if is_created(p) {
            s.replicas += 1;
        }
        if running_and_ready(p) {
            ready += 1;
            if running_and_available(p, min_ready, now) {
                available += 1;
            }
        }
        if is_created(p) && !is_terminating(p) {
            if revision_of(p) == current {
                cur += 1;
            }
            if revision_of(p) == update {
                upd += 1;
            }
        }
    }
    s.ready_replicas = Some(ready);
    s.available_replicas = Some(available);
    s.current_replicas = Some(cur);
    s.updated_replicas = Some(upd);
    s
}

fn complete_rolling_update(set: &StatefulSet, s: &mut StatefulSetStatus) {
    let rolling = set.spec.as_ref().and_then(|x| x.update_strategy.as_ref()).and_then(|x| x.type_.as_deref()) != Some(ON_DELETE);
    if rolling && s.updated_replicas == Some(s.replicas) && s.ready_replicas == Some(s.replicas) {
        s.current_replicas = s.updated_replicas;
        s.current_revision = s.update_revision.clone();
    }
}

/// The status with `None` and zero counted the same, for comparison.
pub fn normalize_status(s: &StatefulSetStatus) -> StatefulSetStatus {
    let nz = |v: Option<i32>| v.filter(|n| *n != 0);
    StatefulSetStatus {
        replicas: s.replicas,
        ready_replicas: nz(s.ready_replicas),
        available_replicas: nz(s.available_replicas),
        current_replicas: nz(s.current_replicas),
        updated_replicas: nz(s.updated_replicas),
        collision_count: nz(s.collision_count),
        observed_generation: s.observed_generation.filter(|n| *n != 0),
        current_revision: s.current_revision.clone().filter(|r| !r.is_empty()),
        update_revision: s.update_revision.clone().filter(|r| !r.is_empty()),
        conditions: s.conditions.clone().filter(|c| !c.is_empty()),
    }
}

/// Plans one sync of a StatefulSet. `pods` and `claims` are those of its namespace,
/// `revisions` the ControllerRevisions it controls. An unparsable selector plans nothing.
pub fn plan(
    set: &StatefulSet,
    pods: &[&Pod],
    claims: &[&PersistentVolumeClaim],
    revisions: &[&ControllerRevision],
    now: Timestamp,
) -> Plan {
    let old_status = set.status.clone().unwrap_or_default();
    let Some(selector) = set.spec.as_ref().and_then(|s| LabelSelector::from_api(&s.selector).ok()) else {
        return Plan {
            status: old_status,
            waiting: vec!["spec.selector cannot be parsed: the set is left alone".into()],
            ..Plan::default()
        };
    };
    let (current, update, step) = revision::revisions(set, revisions);
    let (claimed, adopt_release) = claim(set, &selector, pods);
    let min_ready = set.spec.as_ref().and_then(|s| s.min_ready_seconds).unwrap_or(0);
    let claims_by_name = claims
        .iter()
        .filter(|c| c.metadata.namespace == set.metadata.namespace)
        .filter_map(|c| Some((c.metadata.name.as_deref()?, *c)))
        .collect();
    let mut p = Planner {
        set,
        claims: claims_by_name,
        current: &current,
        update: &update,
        min_ready,
        now,
        actions: adopt_release,
        replaced: BTreeSet::new(),
        deleted_for_update: 0,
        retry_soon: false,
        waiting: Vec::new(),
        more_after_last: false,
    };
    p.sync(&claimed);
    let counted: Vec<&Pod> = claimed.iter().copied().filter(|x| !p.replaced.contains(&name_of(x))).collect();
    let collision = set.status.as_ref().and_then(|s| s.collision_count).unwrap_or(0);
    let mut status = compute_status(set, &counted, &current.name, &update.name, collision, min_ready, now);
    if let Some(c) = status.current_replicas.as_mut() {
        *c -= p.deleted_for_update;
    }
    complete_rolling_update(set, &mut status);
    let status_changed = normalize_status(&status) != normalize_status(&old_status);
    let mut live: BTreeSet<String> = [current.name.clone(), update.name.clone()].into_iter().collect();
    live.extend(claimed.iter().map(|x| revision_of(x).to_string()));
    let limit = set.spec.as_ref().and_then(|s| s.revision_history_limit).unwrap_or(10);
    let delete_revisions = history::to_delete(revisions, &live, limit);
    let mut requeue_after = claimed.iter().filter_map(|x| time_to_available(x, min_ready, now)).min();
    if p.retry_soon {
        requeue_after = Some(requeue_after.map_or(Duration::from_secs(1), |d| d.min(Duration::from_secs(1))));
    }
    Plan { revision: step, actions: p.actions, status, status_changed, delete_revisions, requeue_after, waiting: p.waiting }
}
