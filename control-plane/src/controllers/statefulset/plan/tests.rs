#![allow(clippy::unwrap_used)]

use super::revision::{new_revision, patch_of, template_of};
use super::*;
use k8s_openapi::api::apps::v1::{
    RollingUpdateStatefulSetStrategy, StatefulSetPersistentVolumeClaimRetentionPolicy, StatefulSetSpec,
    StatefulSetUpdateStrategy,
};
use k8s_openapi::api::core::v1::{Container, PodCondition, PodSpec, PodStatus};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector as ApiSelector, ObjectMeta};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use serde_json::json;

fn ts(secs: i64) -> Timestamp {
    Timestamp::from_second(1_800_000_000 + secs).unwrap()
}

fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
    pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()
}

fn set(replicas: i32, image: &str) -> StatefulSet {
    StatefulSet {
        metadata: ObjectMeta {
            name: Some("web".into()),
            namespace: Some("ns".into()),
            uid: Some("set-uid".into()),
            generation: Some(1),
            ..Default::default()
        },
        spec: Some(StatefulSetSpec {
            replicas: Some(replicas),
            service_name: Some("nginx".into()),
            selector: ApiSelector { match_labels: Some(labels(&[("app", "web")])), ..Default::default() },
            template: k8s_openapi::api::core::v1::PodTemplateSpec {
                metadata: Some(ObjectMeta { labels: Some(labels(&[("app", "web")])), ..Default::default() }),
                spec: Some(PodSpec {
                    containers: vec![Container { name: "c".into(), image: Some(image.into()), ..Default::default() }],
                    ..Default::default()
                }),
            },
            update_strategy: Some(StatefulSetUpdateStrategy {
                type_: Some("RollingUpdate".into()),
                rolling_update: Some(RollingUpdateStatefulSetStrategy { partition: Some(0), max_unavailable: None }),
            }),
            ..Default::default()
        }),
        status: None,
    }
}

fn parallel(mut s: StatefulSet) -> StatefulSet {
    s.spec.as_mut().unwrap().pod_management_policy = Some(PARALLEL.into());
    s
}

fn with_claims(mut s: StatefulSet, when_deleted: &str, when_scaled: &str) -> StatefulSet {
    let spec = s.spec.as_mut().unwrap();
    spec.volume_claim_templates = Some(vec![serde_json::from_value(json!({
        "metadata": {"name": "data", "labels": {"kind": "db"}},
        "spec": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "1Gi"}}}
    }))
    .unwrap()]);
    spec.persistent_volume_claim_retention_policy = Some(StatefulSetPersistentVolumeClaimRetentionPolicy {
        when_deleted: Some(when_deleted.into()),
        when_scaled: Some(when_scaled.into()),
    });
    s
}

/// The set's revision (number `n`) and the set with its status pointing at it.
fn revised(mut s: StatefulSet, n: i64) -> (StatefulSet, ControllerRevision) {
    let r = new_revision(&s, n, 0);
    let name = r.metadata.name.clone().unwrap();
    s.status = Some(StatefulSetStatus {
        current_revision: Some(name.clone()),
        update_revision: Some(name),
        ..Default::default()
    });
    (s, r)
}

fn rev_name(r: &ControllerRevision) -> String {
    r.metadata.name.clone().unwrap()
}

/// A pod of ordinal `ord` at revision `rev`, running and ready since `ready_since`.
fn pod(ord: i32, rev: &str) -> Pod {
    let s = set(1, "x");
    let mut p = new_pod(&s, &s.spec.as_ref().unwrap().template, rev, ord);
    p.metadata.uid = Some(format!("uid-{ord}"));
    p.status = Some(PodStatus {
        phase: Some("Running".into()),
        conditions: Some(vec![PodCondition {
            type_: "Ready".into(),
            status: "True".into(),
            last_transition_time: Some(Time(ts(0))),
            ..Default::default()
        }]),
        ..Default::default()
    });
    p
}

fn not_ready(mut p: Pod) -> Pod {
    p.status.as_mut().unwrap().conditions.as_mut().unwrap()[0].status = "False".into();
    p
}

fn terminating(mut p: Pod) -> Pod {
    p.metadata.deletion_timestamp = Some(Time(ts(1)));
    p
}

fn with_phase(mut p: Pod, phase: &str) -> Pod {
    p.status.as_mut().unwrap().phase = Some(phase.into());
    p
}

fn run(s: &StatefulSet, pods: &[Pod], claims: &[PersistentVolumeClaim], revs: &[&ControllerRevision]) -> Plan {
    let pods: Vec<&Pod> = pods.iter().collect();
    let claims: Vec<&PersistentVolumeClaim> = claims.iter().collect();
    plan(s, &pods, &claims, revs, ts(100))
}

fn created(p: &Plan) -> Vec<String> {
    p.actions
        .iter()
        .filter_map(|a| match a {
            Action::CreatePod(p) => p.metadata.name.clone(),
            _ => None,
        })
        .collect()
}

fn deleted(p: &Plan) -> Vec<String> {
    p.actions
        .iter()
        .filter_map(|a| match a {
            Action::DeletePod { name, .. } => Some(name.clone()),
            _ => None,
        })
        .collect()
}

#[test]
fn ordered_scale_up_creates_one_pod_at_a_time_once_its_predecessors_are_ready() {
    let (s, r) = revised(set(3, "nginx:1"), 1);
    let rv = rev_name(&r);
    let p = run(&s, &[], &[], &[&r]);
    assert_eq!(created(&p), ["web-0"]);
    assert_eq!(p.revision, None, "the revision exists already");
    let p = run(&s, &[pod(0, &rv)], &[], &[&r]);
    assert_eq!(created(&p), ["web-1"]);
    // web-1 not ready yet: wait
    let p = run(&s, &[pod(0, &rv), not_ready(pod(1, &rv))], &[], &[&r]);
    assert!(p.actions.is_empty(), "{:?}", p.actions);
    // a missing predecessor is created first
    let p = run(&s, &[pod(1, &rv)], &[], &[&r]);
    assert_eq!(created(&p), ["web-0"]);
    let p = run(&s, &[pod(0, &rv), pod(1, &rv)], &[], &[&r]);
    assert_eq!(created(&p), ["web-2"]);
}

#[test]
fn ordered_scale_down_deletes_the_highest_ordinal_first_one_at_a_time() {
    let (s, r) = revised(set(1, "nginx:1"), 1);
    let rv = rev_name(&r);
    let p = run(&s, &[pod(0, &rv), pod(1, &rv), pod(2, &rv)], &[], &[&r]);
    assert_eq!(deleted(&p), ["web-2"]);
    assert!(created(&p).is_empty());
    // while web-2 terminates, nothing else goes
    let p = run(&s, &[pod(0, &rv), pod(1, &rv), terminating(pod(2, &rv))], &[], &[&r]);
    assert!(deleted(&p).is_empty());
    let p = run(&s, &[pod(0, &rv), pod(1, &rv)], &[], &[&r]);
    assert_eq!(deleted(&p), ["web-1"]);
    // an unhealthy replica blocks scale-down; an unhealthy condemned pod that is the first
    // unhealthy one does not
    let p = run(&s, &[not_ready(pod(0, &rv)), pod(1, &rv)], &[], &[&r]);
    assert!(deleted(&p).is_empty());
    let p = run(&s, &[pod(0, &rv), pod(1, &rv), not_ready(pod(2, &rv))], &[], &[&r]);
    assert_eq!(deleted(&p), ["web-2"]);
    // a condemned pod that is unhealthy waits for the first unhealthy one (lower) to go
    let p = run(&s, &[pod(0, &rv), not_ready(pod(1, &rv)), not_ready(pod(2, &rv))], &[], &[&r]);
    assert!(deleted(&p).is_empty(), "web-2 waits for the unhealthy web-1");
    // a healthy condemned pod goes even when a lower condemned one is unhealthy (upstream)
    let p = run(&s, &[pod(0, &rv), not_ready(pod(1, &rv)), pod(2, &rv)], &[], &[&r]);
    assert_eq!(deleted(&p), ["web-2"]);
}

#[test]
fn parallel_creates_and_deletes_all_at_once() {
    let (s, r) = revised(parallel(set(3, "nginx:1")), 1);
    let rv = rev_name(&r);
    let p = run(&s, &[], &[], &[&r]);
    assert_eq!(created(&p), ["web-0", "web-1", "web-2"]);
    let p = run(&s, &[not_ready(pod(1, &rv))], &[], &[&r]);
    assert_eq!(created(&p), ["web-0", "web-2"]);
    let (s, r) = revised(parallel(set(1, "nginx:1")), 1);
    let p = run(&s, &[pod(0, &rv), not_ready(pod(1, &rv)), terminating(pod(2, &rv)), pod(3, &rv)], &[], &[&r]);
    assert_eq!(deleted(&p), ["web-3", "web-1"]);
}

#[test]
fn spec_ordinals_start_shifts_the_names() {
    let (mut s, r) = revised(set(2, "nginx:1"), 1);
    s.spec.as_mut().unwrap().ordinals = Some(k8s_openapi::api::apps::v1::StatefulSetOrdinals { start: Some(5) });
    let rv = rev_name(&r);
    assert_eq!(created(&run(&s, &[], &[], &[&r])), ["web-5"]);
    assert_eq!(created(&run(&s, &[pod(5, &rv)], &[], &[&r])), ["web-6"]);
    // web-0 is out of range now
    assert_eq!(deleted(&run(&s, &[pod(0, &rv), pod(5, &rv), pod(6, &rv)], &[], &[&r])), ["web-0"]);
}

#[test]
fn the_pod_has_its_identity() {
    let s = with_claims(set(1, "nginx:1"), RETAIN, RETAIN);
    let p = new_pod(&s, &s.spec.as_ref().unwrap().template, "web-abc", 2);
    assert_eq!(p.metadata.name.as_deref(), Some("web-2"));
    assert_eq!(p.metadata.namespace.as_deref(), Some("ns"));
    let l = p.metadata.labels.as_ref().unwrap();
    assert_eq!(l.get("statefulset.kubernetes.io/pod-name").map(String::as_str), Some("web-2"));
    assert_eq!(l.get("apps.kubernetes.io/pod-index").map(String::as_str), Some("2"));
    assert_eq!(l.get("controller-revision-hash").map(String::as_str), Some("web-abc"));
    assert_eq!(l.get("app").map(String::as_str), Some("web"));
    let spec = p.spec.as_ref().unwrap();
    assert_eq!(spec.hostname.as_deref(), Some("web-2"));
    assert_eq!(spec.subdomain.as_deref(), Some("nginx"));
    let v = &spec.volumes.as_ref().unwrap()[0];
    assert_eq!((v.name.as_str(), v.persistent_volume_claim.as_ref().unwrap().claim_name.as_str()), ("data", "data-web-2"));
    let owner = &p.metadata.owner_references.as_ref().unwrap()[0];
    assert_eq!((owner.kind.as_str(), owner.uid.as_str(), owner.controller), ("StatefulSet", "set-uid", Some(true)));
    assert!(identity_matches(&s, &p, 2));
    assert_eq!(parent_and_ordinal("my-web-12"), Some(("my-web", 12)));
    assert_eq!(parent_and_ordinal("web-x"), None);
    assert_eq!(parent_and_ordinal("web-"), None);
}

#[test]
fn a_pod_that_lost_its_identity_labels_gets_them_back() {
    let (s, r) = revised(set(1, "nginx:1"), 1);
    let mut p0 = pod(0, &rev_name(&r));
    p0.metadata.labels.as_mut().unwrap().remove(POD_INDEX_LABEL);
    let p = run(&s, &[p0], &[], &[&r]);
    match &p.actions[..] {
        [Action::PatchPodLabels { name, labels }] => {
            assert_eq!(name, "web-0");
            assert_eq!(labels.get(POD_INDEX_LABEL).map(String::as_str), Some("0"));
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn claims_are_created_before_their_pod_and_never_deleted_with_it() {
    let (s, r) = revised(with_claims(set(2, "nginx:1"), RETAIN, RETAIN), 1);
    let rv = rev_name(&r);
    let p = run(&s, &[], &[], &[&r]);
    match &p.actions[..] {
        [Action::CreateClaim { claim, pod }, Action::CreatePod(created)] => {
            assert_eq!(claim.metadata.name.as_deref(), Some("data-web-0"));
            assert_eq!(pod, "web-0");
            assert_eq!(claim.metadata.labels, Some(labels(&[("app", "web"), ("kind", "db")])));
            assert_eq!(claim.metadata.owner_references, Some(vec![]), "Retain: no owner");
            assert_eq!(created.metadata.name.as_deref(), Some("web-0"));
        }
        other => panic!("{other:?}"),
    }
    // an existing claim is reused
    let claim0 = claims_for(&s, 0).remove(0);
    let claim1 = claims_for(&s, 1).remove(0);
    let p = run(&s, &[pod(0, &rv)], &[claim0.clone(), claim1.clone()], &[&r]);
    assert_eq!(p.actions.len(), 1, "{:?}", p.actions);
    // a pending pod without its claim gets it
    let p = run(&s, &[with_phase(pod(0, &rv), "Pending")], &[], &[&r]);
    assert!(matches!(&p.actions[..], [Action::CreateClaim { claim, .. }] if claim.metadata.name.as_deref() == Some("data-web-0")));
    // scale down: the pod goes, the claim stays (no action on it)
    let (s1, r1) = revised(with_claims(set(1, "nginx:1"), RETAIN, RETAIN), 1);
    let p = run(&s1, &[pod(0, &rv), pod(1, &rv)], &[claim0, claim1], &[&r1]);
    assert_eq!(p.actions, vec![Action::DeletePod { name: "web-1".into(), uid: "uid-1".into(), why: Why::ScaleDown }]);
}

#[test]
fn retention_policy_sets_owner_references_on_claims() {
    // whenDeleted Delete: the set owns the claims from the start
    let (s, r) = revised(with_claims(set(1, "nginx:1"), DELETE, RETAIN), 1);
    let rv = rev_name(&r);
    let claim = claims_for(&s, 0).remove(0);
    let owners = claim.metadata.owner_references.clone().unwrap();
    assert_eq!(owners.len(), 1);
    assert_eq!((owners[0].kind.as_str(), owners[0].uid.as_str()), ("StatefulSet", "set-uid"));
    // an existing claim without the reference gets it
    let mut bare = claim.clone();
    bare.metadata.owner_references = None;
    let p = run(&s, &[pod(0, &rv)], &[bare], &[&r]);
    assert!(matches!(&p.actions[..], [Action::SetClaimOwners { name, owners, .. }] if name == "data-web-0" && owners.len() == 1));

    // whenScaled Delete: a condemned pod's claim gets the pod as owner before the pod goes
    let (s, r) = revised(with_claims(set(1, "nginx:1"), RETAIN, DELETE), 1);
    let claims = vec![claims_for(&s, 0).remove(0), claims_for(&s, 1).remove(0)];
    let p = run(&s, &[pod(0, &rv), pod(1, &rv)], &claims, &[&r]);
    match &p.actions[..] {
        [Action::SetClaimOwners { name, owners, .. }, Action::DeletePod { name: victim, .. }] => {
            assert_eq!(name, "data-web-1");
            assert_eq!((owners[0].kind.as_str(), owners[0].name.as_str(), owners[0].uid.as_str()), ("Pod", "web-1", "uid-1"));
            assert_eq!(victim, "web-1");
        }
        other => panic!("{other:?}"),
    }
    // scaled up again before the garbage collector removed it: the stale claim holds web-1 back
    let (s2, r2) = revised(with_claims(set(2, "nginx:1"), RETAIN, DELETE), 1);
    let mut stale = claims_for(&s2, 1).remove(0);
    stale.metadata.owner_references = Some(claim_owners(&s, &[], 1, Some(("web-1", "uid-1"))));
    let p = run(&s2, &[pod(0, &rv)], &[claims_for(&s2, 0).remove(0), stale], &[&r2]);
    assert!(created(&p).is_empty());
    assert_eq!(p.requeue_after, Some(Duration::from_secs(1)));

    // Delete/Delete: set while in range, pod once scaled down
    let (s, _) = revised(with_claims(set(1, "nginx:1"), DELETE, DELETE), 1);
    let in_range = claim_owners(&s, &[], 0, Some(("web-0", "uid-0")));
    assert_eq!(in_range.iter().map(|r| r.kind.as_str()).collect::<Vec<_>>(), ["StatefulSet"]);
    let out = claim_owners(&s, &in_range, 1, Some(("web-1", "uid-1")));
    assert_eq!(out.iter().map(|r| r.kind.as_str()).collect::<Vec<_>>(), ["Pod"]);
    // Retain/Retain removes both, keeps a stranger's
    let (s, _) = revised(with_claims(set(1, "nginx:1"), RETAIN, RETAIN), 1);
    let stranger = OwnerReference { kind: "ConfigMap".into(), name: "x".into(), uid: "x".into(), ..Default::default() };
    let mut current = out.clone();
    current.push(stranger.clone());
    assert_eq!(claim_owners(&s, &current, 1, Some(("web-1", "uid-1"))), vec![stranger]);
}

#[test]
fn a_failed_pod_is_deleted_and_recreated() {
    let (s, r) = revised(set(2, "nginx:1"), 1);
    let rv = rev_name(&r);
    let p = run(&s, &[pod(0, &rv), with_phase(pod(1, &rv), "Failed")], &[], &[&r]);
    match &p.actions[..] {
        [Action::Event { type_: "Warning", reason: "RecreatingFailedPod", message }, Action::DeletePod { name, why: Why::Finished, .. }, Action::CreatePod(new)] => {
            assert_eq!(message, "StatefulSet ns/web is recreating failed Pod web-1");
            assert_eq!(name, "web-1");
            assert_eq!(new.metadata.name.as_deref(), Some("web-1"));
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(p.status.replicas, 1, "the failed pod no longer counts");
    let p = run(&s, &[pod(0, &rv), with_phase(pod(1, &rv), "Succeeded")], &[], &[&r]);
    assert!(matches!(&p.actions[0], Action::Event { type_: "Normal", reason: "RecreatingTerminatedPod", .. }));
}

/// A set at revision 1 ("nginx:1", all pods there) whose template moved to "nginx:2".
fn updating(replicas: i32) -> (StatefulSet, ControllerRevision, ControllerRevision) {
    let (old, r1) = revised(set(replicas, "nginx:1"), 1);
    let mut s = set(replicas, "nginx:2");
    s.status = old.status.clone();
    s.metadata.generation = Some(2);
    let r2 = new_revision(&s, 2, 0);
    (s, r1, r2)
}

#[test]
fn a_template_change_creates_a_revision_and_rolls_in_reverse_ordinal_order() {
    let (s, r1, r2) = updating(3);
    let (v1, v2) = (rev_name(&r1), rev_name(&r2));
    // the first pass creates revision 2
    let p = run(&s, &[pod(0, &v1), pod(1, &v1), pod(2, &v1)], &[], &[&r1]);
    match &p.revision {
        Some(RevisionStep::Create(cr)) => {
            assert_eq!(cr.metadata.name.as_deref(), Some(v2.as_str()));
            assert_eq!(cr.revision, 2);
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(deleted(&p), ["web-2"]);
    assert_eq!(p.status.current_revision.as_deref(), Some(v1.as_str()));
    assert_eq!(p.status.update_revision.as_deref(), Some(v2.as_str()));
    assert_eq!(p.status.current_replicas, Some(2), "the deleted pod is no longer current");
    // web-2 gone: recreated at the update revision
    let p = run(&s, &[pod(0, &v1), pod(1, &v1)], &[], &[&r1, &r2]);
    assert_eq!(p.revision, None);
    let new = match &p.actions[..] {
        [Action::CreatePod(new)] => new.clone(),
        other => panic!("{other:?}"),
    };
    assert_eq!(new.metadata.labels.as_ref().unwrap().get(REVISION_LABEL), Some(&v2));
    assert_eq!(new.spec.as_ref().unwrap().containers[0].image.as_deref(), Some("nginx:2"));
    // web-2 updated but not ready: wait
    let p = run(&s, &[pod(0, &v1), pod(1, &v1), not_ready(pod(2, &v2))], &[], &[&r1, &r2]);
    assert!(p.actions.is_empty());
    let p = run(&s, &[pod(0, &v1), pod(1, &v1), pod(2, &v2)], &[], &[&r1, &r2]);
    assert_eq!(deleted(&p), ["web-1"]);
    // all updated and ready: the update revision becomes current
    let p = run(&s, &[pod(0, &v2), pod(1, &v2), pod(2, &v2)], &[], &[&r1, &r2]);
    assert!(p.actions.is_empty());
    assert_eq!(p.status.current_revision.as_deref(), Some(v2.as_str()));
    assert_eq!(
        (p.status.replicas, p.status.ready_replicas, p.status.current_replicas, p.status.updated_replicas),
        (3, Some(3), Some(3), Some(3))
    );
    assert_eq!(p.status.observed_generation, Some(2));
}

#[test]
fn a_partition_keeps_lower_ordinals_at_the_current_revision() {
    let (mut s, r1, r2) = updating(3);
    s.spec.as_mut().unwrap().update_strategy.as_mut().unwrap().rolling_update.as_mut().unwrap().partition = Some(2);
    let (v1, v2) = (rev_name(&r1), rev_name(&r2));
    let p = run(&s, &[pod(0, &v1), pod(1, &v1), pod(2, &v2)], &[], &[&r1, &r2]);
    assert!(p.actions.is_empty(), "web-1 is below the partition: {:?}", p.actions);
    assert_eq!(p.status.current_revision.as_deref(), Some(v1.as_str()));
    assert_eq!(p.status.updated_replicas, Some(1));
    // a pod below the partition comes back at the current revision, one above at the update one
    let p = run(&s, &[pod(0, &v1), pod(2, &v2)], &[], &[&r1, &r2]);
    match &p.actions[..] {
        [Action::CreatePod(new)] => {
            assert_eq!(new.metadata.labels.as_ref().unwrap().get(REVISION_LABEL), Some(&v1));
            assert_eq!(new.spec.as_ref().unwrap().containers[0].image.as_deref(), Some("nginx:1"));
        }
        other => panic!("{other:?}"),
    }
    let p = run(&s, &[pod(0, &v1), pod(1, &v1)], &[], &[&r1, &r2]);
    match &p.actions[..] {
        [Action::CreatePod(new)] => assert_eq!(new.metadata.labels.as_ref().unwrap().get(REVISION_LABEL), Some(&v2)),
        other => panic!("{other:?}"),
    }
}

#[test]
fn max_unavailable_updates_several_pods_at_once() {
    let (mut s, r1, r2) = updating(4);
    let ru = s.spec.as_mut().unwrap().update_strategy.as_mut().unwrap().rolling_update.as_mut().unwrap();
    ru.max_unavailable = Some(IntOrString::Int(2));
    let (v1, v2) = (rev_name(&r1), rev_name(&r2));
    let all_old = [pod(0, &v1), pod(1, &v1), pod(2, &v1), pod(3, &v1)];
    assert_eq!(deleted(&run(&s, &all_old, &[], &[&r1, &r2])), ["web-3", "web-2"]);
    // OrderedReady waits for the recreated pods to be ready before going on
    let p = run(&s, &[pod(0, &v1), pod(1, &v1), pod(2, &v1), not_ready(pod(3, &v2))], &[], &[&r1, &r2]);
    assert!(deleted(&p).is_empty());
    // Parallel: one unavailable already, so one more
    let s = parallel(s);
    let p = run(&s, &[pod(0, &v1), pod(1, &v1), pod(2, &v1), not_ready(pod(3, &v2))], &[], &[&r1, &r2]);
    assert_eq!(deleted(&p), ["web-2"]);
    let p = run(&s, &[pod(0, &v1), pod(1, &v1), not_ready(pod(2, &v2)), not_ready(pod(3, &v2))], &[], &[&r1, &r2]);
    assert!(deleted(&p).is_empty(), "two unavailable: the budget is spent");
    // 50 % of 4
    let (mut s, ..) = updating(4);
    let ru = s.spec.as_mut().unwrap().update_strategy.as_mut().unwrap().rolling_update.as_mut().unwrap();
    ru.max_unavailable = Some(IntOrString::String("50%".into()));
    assert_eq!(deleted(&run(&s, &all_old, &[], &[&r1, &r2])).len(), 2);
}

#[test]
fn on_delete_waits_for_the_user_to_delete_pods() {
    let (mut s, r1, r2) = updating(2);
    s.spec.as_mut().unwrap().update_strategy = Some(StatefulSetUpdateStrategy { type_: Some(ON_DELETE.into()), rolling_update: None });
    let (v1, v2) = (rev_name(&r1), rev_name(&r2));
    let p = run(&s, &[pod(0, &v1), pod(1, &v1)], &[], &[&r1, &r2]);
    assert!(p.actions.is_empty());
    assert_eq!(p.status.updated_replicas, Some(0));
    // a pod the user deleted comes back at the update revision
    let p = run(&s, &[pod(0, &v1)], &[], &[&r1, &r2]);
    match &p.actions[..] {
        [Action::CreatePod(new)] => assert_eq!(new.metadata.labels.as_ref().unwrap().get(REVISION_LABEL), Some(&v2)),
        other => panic!("{other:?}"),
    }
    // OnDelete never completes a rolling update by itself
    let p = run(&s, &[pod(0, &v2), pod(1, &v2)], &[], &[&r1, &r2]);
    assert_eq!(p.status.current_revision.as_deref(), Some(v1.as_str()));
}

#[test]
fn revisions_hold_the_template_as_kubectl_expects_and_rollback_renumbers() {
    let (s, r1, r2) = updating(1);
    let data = patch_of(&s);
    assert_eq!(data["spec"]["template"]["$patch"], "replace");
    assert_eq!(data["spec"]["template"]["spec"]["containers"][0]["image"], "nginx:2");
    assert_eq!(data.as_object().unwrap().len(), 1);
    assert_eq!(data["spec"].as_object().unwrap().len(), 1);
    assert_eq!(template_of(&r2).unwrap(), s.spec.as_ref().unwrap().template);
    let l = r2.metadata.labels.as_ref().unwrap();
    assert_eq!(l.get("app").map(String::as_str), Some("web"), "the selector finds the revisions");
    assert!(rev_name(&r2).starts_with("web-"));
    // rolled back to nginx:1 (kubectl patches the template back): revision 1 becomes revision 3
    let (mut back, ..) = updating(1);
    back.spec.as_mut().unwrap().template = set(1, "nginx:1").spec.unwrap().template;
    let p = run(&back, &[pod(0, &rev_name(&r2))], &[], &[&r1, &r2]);
    assert_eq!(p.revision, Some(RevisionStep::Renumber { name: rev_name(&r1), revision: 3 }));
    assert_eq!(p.status.update_revision.as_deref(), Some(rev_name(&r1).as_str()));
    assert_eq!(deleted(&p), ["web-0"]);
    // the same template twice is one revision
    let p = run(&s, &[pod(0, &rev_name(&r2))], &[], &[&r1, &r2]);
    assert_eq!(p.revision, None);
    // a hash collision: the collision count changes the name
    let mut bumped = s.clone();
    bumped.status.as_mut().unwrap().collision_count = Some(1);
    assert_ne!(new_revision(&bumped, 2, 1).metadata.name, r2.metadata.name);
}

#[test]
fn history_is_truncated_to_the_limit_keeping_live_revisions() {
    let sets: Vec<StatefulSet> = (1..=5).map(|i| set(1, &format!("nginx:{i}"))).collect();
    let revs: Vec<ControllerRevision> = sets.iter().zip(1..).map(|(s, n)| new_revision(s, n, 0)).collect();
    let refs: Vec<&ControllerRevision> = revs.iter().collect();
    let mut s = sets[4].clone();
    s.spec.as_mut().unwrap().revision_history_limit = Some(1);
    s.status = Some(StatefulSetStatus { current_revision: Some(rev_name(&revs[4])), ..Default::default() });
    // a pod still runs revision 2
    let p = run(&s, &[pod(0, &rev_name(&revs[1]))], &[], &refs);
    assert_eq!(p.delete_revisions, [rev_name(&revs[0]), rev_name(&revs[2])]);
}

#[test]
fn min_ready_seconds_holds_the_next_pod_back_and_requeues() {
    let (mut s, r) = revised(set(2, "nginx:1"), 1);
    s.spec.as_mut().unwrap().min_ready_seconds = Some(200);
    let rv = rev_name(&r);
    // ready at ts(0), now ts(100): 100 s to go
    let p = run(&s, &[pod(0, &rv)], &[], &[&r]);
    assert!(created(&p).is_empty());
    assert_eq!(p.requeue_after, Some(Duration::from_secs(101)));
    assert_eq!((p.status.ready_replicas, p.status.available_replicas), (Some(1), Some(0)));
    s.spec.as_mut().unwrap().min_ready_seconds = Some(50);
    assert_eq!(created(&run(&s, &[pod(0, &rv)], &[], &[&r])), ["web-1"]);
}

#[test]
fn orphans_are_adopted_and_strangers_ignored() {
    let (s, r) = revised(set(2, "nginx:1"), 1);
    let rv = rev_name(&r);
    let mut orphan = pod(0, &rv);
    orphan.metadata.owner_references = None;
    let mut other_name = pod(1, &rv);
    other_name.metadata.name = Some("db-1".into());
    other_name.metadata.owner_references = None;
    let mut relabelled = pod(1, &rv);
    relabelled.metadata.labels.as_mut().unwrap().insert("app".into(), "debug".into());
    let p = run(&s, &[orphan, other_name, relabelled], &[], &[&r]);
    assert_eq!(p.actions[0], Action::Adopt { name: "web-0".into() });
    assert_eq!(p.actions[1], Action::Release { name: "web-1".into() });
    assert_eq!(created(&p), ["web-1"]);
}

#[test]
fn a_deleted_set_only_updates_its_status_and_the_status_is_written_once() {
    let (mut s, r) = revised(set(3, "nginx:1"), 1);
    let rv = rev_name(&r);
    s.metadata.deletion_timestamp = Some(Time(ts(1)));
    let p = run(&s, &[pod(0, &rv)], &[], &[&r]);
    assert!(p.actions.is_empty());
    assert!(p.status_changed);
    let mut again = s.clone();
    again.status = Some(p.status.clone());
    assert!(!run(&again, &[pod(0, &rv)], &[], &[&r]).status_changed);
}

#[test]
fn orphan_revisions_matching_the_selector_are_adopted() {
    let (s, r) = revised(set(1, "nginx:1"), 1);
    let mut orphan = r.clone();
    orphan.metadata.owner_references = None;
    let mut stranger = orphan.clone();
    stranger.metadata.name = Some("db-1".into());
    stranger.metadata.labels = Some(labels(&[("app", "db")]));
    assert_eq!(super::revision::orphans_to_adopt(&s, &[&r, &orphan, &stranger]), [rev_name(&r)]);
    let mut deleting = s.clone();
    deleting.metadata.deletion_timestamp = Some(Time(ts(1)));
    assert!(super::revision::orphans_to_adopt(&deleting, &[&orphan]).is_empty());
}

#[test]
fn the_plan_says_in_words_why_it_waits() {
    let (s, r) = revised(set(3, "nginx:1"), 1);
    let rv = rev_name(&r);
    // a pod just created holds the next one back
    let p = run(&s, &[], &[], &[&r]);
    assert_eq!(p.waiting, ["web-1 waits for web-0 to be created, Running and Ready (OrderedReady)"]);
    let p = run(&s, &[pod(0, &rv), not_ready(pod(1, &rv))], &[], &[&r]);
    assert_eq!(p.waiting, ["web-2 waits for web-1 to be Running and Ready (it is Running, not Ready) (OrderedReady)"]);
    let p = run(&s, &[pod(0, &rv), terminating(pod(1, &rv))], &[], &[&r]);
    assert_eq!(p.waiting, ["web-2 waits for web-1 to finish terminating and come back (OrderedReady)"]);
    // all there and ready: nothing to wait for
    assert!(run(&s, &[pod(0, &rv), pod(1, &rv), pod(2, &rv)], &[], &[&r]).waiting.is_empty());
    // minReadySeconds
    let (mut s2, r2) = revised(set(2, "nginx:1"), 1);
    s2.spec.as_mut().unwrap().min_ready_seconds = Some(200);
    let p = run(&s2, &[pod(0, &rev_name(&r2))], &[], &[&r2]);
    assert_eq!(p.waiting, ["web-1 waits for web-0 to stay Ready for minReadySeconds (200s) (OrderedReady)"]);
    // scale-down: one at a time
    let (s1, r1) = revised(set(1, "nginx:1"), 1);
    let v = rev_name(&r1);
    let p = run(&s1, &[pod(0, &v), pod(1, &v), pod(2, &v)], &[], &[&r1]);
    assert_eq!(p.waiting, ["the rest of the scale-down waits for web-2 to be gone (OrderedReady)"]);
    let p = run(&s1, &[pod(0, &v), pod(1, &v), terminating(pod(2, &v))], &[], &[&r1]);
    assert_eq!(p.waiting, ["the scale-down waits for web-2 to finish terminating (OrderedReady)"]);
}

#[test]
fn the_plan_names_pods_held_at_their_revision_and_the_rolling_update_it_waits_for() {
    let (mut s, r1, r2) = updating(3);
    s.spec.as_mut().unwrap().update_strategy.as_mut().unwrap().rolling_update.as_mut().unwrap().partition = Some(2);
    let (v1, v2) = (rev_name(&r1), rev_name(&r2));
    let p = run(&s, &[pod(0, &v1), pod(1, &v1), pod(2, &v2)], &[], &[&r1, &r2]);
    assert_eq!(p.waiting, [format!("web-0, web-1 stay at revision {v1} below the partition (2)")]);
    // without a partition: the deleted pod comes back at the update revision first
    let (s, ..) = updating(3);
    let p = run(&s, &[pod(0, &v1), pod(1, &v1), pod(2, &v1)], &[], &[&r1, &r2]);
    assert_eq!(p.waiting, [format!("the rolling update waits for web-2 to come back at revision {v2}")]);
    // OnDelete
    let (mut s, ..) = updating(2);
    s.spec.as_mut().unwrap().update_strategy = Some(StatefulSetUpdateStrategy { type_: Some(ON_DELETE.into()), rolling_update: None });
    let p = run(&s, &[pod(0, &v1), pod(1, &v1)], &[], &[&r1, &r2]);
    assert_eq!(p.waiting, ["web-0, web-1 keep their revision until they are deleted (updateStrategy OnDelete)"]);
    // maxUnavailable spent (Parallel)
    let (mut s, ..) = updating(4);
    let ru = s.spec.as_mut().unwrap().update_strategy.as_mut().unwrap().rolling_update.as_mut().unwrap();
    ru.max_unavailable = Some(IntOrString::Int(2));
    let s = parallel(s);
    let p = run(&s, &[pod(0, &v1), pod(1, &v1), not_ready(pod(2, &v2)), not_ready(pod(3, &v2))], &[], &[&r1, &r2]);
    assert_eq!(p.waiting, ["the rolling update waits: 2 of 4 pods are unavailable and maxUnavailable is 2"]);
}

#[test]
fn a_claim_being_deleted_holds_its_pod_back_and_says_so() {
    let (s, r) = revised(with_claims(set(1, "nginx:1"), "Retain", "Retain"), 1);
    let mut claim: PersistentVolumeClaim = claims_for(&s, 0).remove(0);
    claim.metadata.deletion_timestamp = Some(Time(ts(1)));
    let p = run(&s, &[], &[claim], &[&r]);
    assert!(created(&p).is_empty());
    assert_eq!(p.waiting, ["web-0 waits for its claim data-web-0 to finish its deletion"]);
}
