#![allow(clippy::unwrap_used)]

use super::*;
use serde_json::json;

fn ts(s: i64) -> Timestamp {
    Timestamp::from_second(1_800_000_000 + s).unwrap()
}

fn job(spec: serde_json::Value) -> Job {
    let mut base = json!({
        "selector": {"matchLabels": {"batch.kubernetes.io/controller-uid": "job-uid"}},
        "parallelism": 1, "backoffLimit": 6, "completionMode": "NonIndexed",
        "template": {
            "metadata": {"labels": {"batch.kubernetes.io/controller-uid": "job-uid", "batch.kubernetes.io/job-name": "pi", "app": "pi"}},
            "spec": {"restartPolicy": "Never", "containers": [{"name": "main", "image": "busybox"}]}
        }
    });
    for (k, v) in spec.as_object().unwrap() {
        base[k] = v.clone();
    }
    serde_json::from_value(json!({"metadata": {"name": "pi", "namespace": "ns", "uid": "job-uid"}, "spec": base})).unwrap()
}

/// A simulated world: the Job and its pods, advanced by applying plans as the executor would.
struct World {
    job: Job,
    pods: Vec<Pod>,
    backoff: BackoffRecord,
    next: u32,
    now: Timestamp,
}

impl World {
    fn new(job: Job) -> World {
        World { job, pods: Vec::new(), backoff: BackoffRecord::default(), next: 0, now: ts(0) }
    }

    fn plan(&self) -> JobPlan {
        let refs: Vec<&Pod> = self.pods.iter().collect();
        plan(
            &self.job,
            &Observed { pods: &refs, now: self.now, expectations_satisfied: true, expected_removals: &BTreeSet::new(), backoff: self.backoff },
        )
    }

    /// Plans and applies one pass; returns the plan.
    fn step(&mut self) -> JobPlan {
        let p = self.plan();
        self.apply(&p);
        p
    }

    fn apply(&mut self, p: &JobPlan) {
        for d in &p.delete {
            let pod = self.pods.iter_mut().find(|x| name(x) == d.name).unwrap();
            if d.remove_finalizer {
                pod.metadata.finalizers = None;
            }
            pod.metadata.deletion_timestamp = Some(Time(self.now));
        }
        for c in &p.create {
            let mut pod = c.clone();
            pod.metadata.name = Some(format!("{}{}", c.metadata.generate_name.clone().unwrap(), self.next));
            pod.metadata.uid = Some(format!("uid-{}", self.next));
            pod.metadata.creation_timestamp = Some(Time(self.now));
            pod.status = Some(serde_json::from_value(json!({"phase": "Pending"})).unwrap());
            self.next += 1;
            self.pods.push(pod);
        }
        if let Some(s) = &p.interim_status {
            self.job.status = Some(s.clone());
        }
        for (n, _) in &p.remove_finalizers {
            if let Some(pod) = self.pods.iter_mut().find(|x| name(x) == n) {
                pod.metadata.finalizers = None;
            }
        }
        if let Some(s) = &p.status {
            self.job.status = Some(s.clone());
        }
        self.backoff = p.backoff;
        self.collect();
    }

    /// Deleted pods are gone once stopped and without finalizers.
    fn collect(&mut self) {
        self.pods.retain(|x| x.metadata.deletion_timestamp.is_none() || has_finalizer(x) || !matches!(phase(x), "Succeeded" | "Failed"));
    }

    /// The kubelet stops every terminating pod.
    fn stop_terminating(&mut self) {
        let names: Vec<String> = self.pods.iter().filter(|p| is_terminating(p)).map(|p| name(p).to_string()).collect();
        for n in names {
            self.exit(&n, 143);
        }
        self.collect();
    }

    fn pod_mut(&mut self, n: &str) -> &mut Pod {
        let names = self.names();
        self.pods.iter_mut().find(|x| name(x) == n).unwrap_or_else(|| panic!("no pod {n} in {names:?}"))
    }

    fn running(&mut self, n: &str) {
        let now = self.now;
        let p = self.pod_mut(n);
        p.spec.as_mut().unwrap().node_name = Some("n1".into());
        p.status = Some(
            serde_json::from_value(json!({"phase": "Running",
                "conditions": [{"type": "Ready", "status": "True", "lastTransitionTime": now.to_string()}]}))
            .unwrap(),
        );
    }

    fn exit(&mut self, n: &str, code: i32) {
        let now = self.now;
        let p = self.pod_mut(n);
        p.status = Some(
            serde_json::from_value(json!({
                "phase": if code == 0 { "Succeeded" } else { "Failed" },
                "conditions": [{"type": "Ready", "status": "False", "lastTransitionTime": now.to_string()}],
                "containerStatuses": [{"name": "main", "image": "busybox", "imageID": "", "ready": false, "restartCount": 0,
                    "state": {"terminated": {"exitCode": code, "finishedAt": now.to_string()}}}]}))
            .unwrap(),
        );
    }

    fn names(&self) -> Vec<String> {
        self.pods.iter().map(|p| name(p).to_string()).collect()
    }

    fn active_names(&self) -> Vec<String> {
        self.pods.iter().filter(|p| is_active(p)).map(|p| name(p).to_string()).collect()
    }

    fn status(&self) -> JobStatus {
        self.job.status.clone().unwrap_or_default()
    }

    fn condition(&self, t: &str) -> Option<JobCondition> {
        self.status().conditions.unwrap_or_default().into_iter().find(|c| c.type_ == t)
    }

    fn condition_types(&self) -> Vec<String> {
        self.status().conditions.unwrap_or_default().into_iter().map(|c| c.type_).collect()
    }

    fn advance(&mut self, secs: i64) {
        self.now = self.now.checked_add(jiff::SignedDuration::from_secs(secs)).unwrap();
    }
}

fn events(p: &JobPlan) -> Vec<(String, String)> {
    p.events.iter().map(|e| (e.reason.clone(), e.message.clone())).collect()
}

#[test]
fn creates_parallelism_pods_from_the_template() {
    let mut w = World::new(job(json!({"parallelism": 3, "completions": 5})));
    let p = w.step();
    assert_eq!(p.create.len(), 3);
    let pod = &p.create[0];
    assert_eq!(pod.metadata.generate_name.as_deref(), Some("pi-"));
    assert_eq!(pod.metadata.finalizers.as_deref(), Some(&[TRACKING_FINALIZER.to_string()][..]));
    let owner = &pod.metadata.owner_references.as_ref().unwrap()[0];
    assert_eq!((owner.kind.as_str(), owner.uid.as_str(), owner.controller, owner.block_owner_deletion), ("Job", "job-uid", Some(true), Some(true)));
    assert_eq!(pod.metadata.labels.as_ref().unwrap()["batch.kubernetes.io/job-name"], "pi");
    assert!(pod.spec.as_ref().unwrap().hostname.is_none());
    let s = w.status();
    assert_eq!((s.active, s.ready, s.terminating), (Some(3), Some(0), Some(0)), "{s:?}");
    assert_eq!(s.start_time, Some(Time(ts(0))));
    // nothing more to do
    let again = w.step();
    assert!(again.create.is_empty() && again.status.is_none(), "{again:?}");
}

#[test]
fn never_more_active_pods_than_remaining_completions() {
    let mut w = World::new(job(json!({"parallelism": 3, "completions": 4})));
    w.step();
    for n in ["pi-0", "pi-1", "pi-2"] {
        w.running(n);
    }
    w.exit("pi-0", 0);
    w.exit("pi-1", 0);
    let p = w.step();
    // two succeeded: interim status carries their uids, then they are counted
    let interim = p.interim_status.clone().unwrap();
    assert_eq!(interim.uncounted_terminated_pods.unwrap().succeeded, Some(vec!["uid-0".into(), "uid-1".into()]));
    assert_eq!(p.remove_finalizers.len(), 2);
    assert_eq!(p.create.len(), 1, "4 - 2 = 2 wanted, 1 still running");
    assert_eq!(w.status().succeeded, Some(2));
    assert_eq!(w.status().uncounted_terminated_pods.unwrap().succeeded, None);
    assert_eq!(w.status().active, Some(2));
    assert!(w.step().create.is_empty());
}

#[test]
fn completes_with_upstream_conditions_and_events() {
    let mut w = World::new(job(json!({"completions": 2, "parallelism": 2})));
    w.step();
    w.exit("pi-0", 0);
    w.exit("pi-1", 0);
    w.advance(5);
    let p = w.step();
    assert_eq!(w.condition_types(), ["SuccessCriteriaMet", "Complete"]);
    let c = w.condition("Complete").unwrap();
    assert_eq!(c.reason.as_deref(), Some("CompletionsReached"));
    assert_eq!(c.message.as_deref(), Some("Reached expected number of succeeded pods"));
    assert_eq!(w.status().completion_time, Some(Time(ts(5))));
    assert_eq!(w.status().succeeded, Some(2));
    assert_eq!(events(&p), [("Completed".into(), "Job completed".into())]);
    assert!(is_finished(&w.job));
    assert_eq!(finish_time(&w.job), Some(ts(5)));
    // a finished Job does nothing more
    let after = w.step();
    let waiting = vec!["the Job has finished: only the tracking finalizers of its pods are removed".to_string()];
    assert_eq!(after, JobPlan { waiting, ..JobPlan::default() });
}

#[test]
fn a_work_queue_job_stops_creating_after_the_first_success() {
    let mut w = World::new(job(json!({"parallelism": 3})));
    w.step();
    assert_eq!(w.names().len(), 3);
    w.exit("pi-0", 0);
    let p = w.step();
    assert!(p.create.is_empty());
    assert!(!is_finished(&w.job), "two pods still run");
    w.exit("pi-1", 0);
    w.exit("pi-2", 0);
    w.step();
    assert!(w.condition("Complete").is_some());
    assert_eq!(w.status().succeeded, Some(3));
}

#[test]
fn failed_pods_are_replaced_after_the_back_off() {
    let mut w = World::new(job(json!({"completions": 1, "backoffLimit": 3})));
    w.step();
    w.exit("pi-0", 1);
    let p = w.step();
    assert!(p.create.is_empty(), "back-off: 10 s before the first replacement");
    assert_eq!(p.requeue_after, Some(Duration::from_secs(10)));
    assert_eq!(w.status().failed, Some(1));
    assert!(!has_finalizer(w.pod_mut("pi-0")), "the failed pod was counted");
    assert_eq!(p.waiting, ["new pods wait for the failure back-off: 10s left"]);
    w.advance(4);
    let p = w.step();
    assert_eq!(p.requeue_after, Some(Duration::from_secs(6)));
    assert_eq!(p.waiting, ["new pods wait for the failure back-off: 6s left"]);
    w.advance(6);
    assert_eq!(w.step().create.len(), 1);
    // the second failure waits 20 s
    w.exit("pi-1", 1);
    let p = w.step();
    assert_eq!(p.requeue_after, Some(Duration::from_secs(20)));
    w.advance(20);
    assert_eq!(w.step().create.len(), 1);
    // a success resets the back-off
    w.exit("pi-2", 0);
    w.step();
    assert!(w.condition("Complete").is_some());
    assert_eq!((w.status().succeeded, w.status().failed), (Some(1), Some(2)));
}

#[test]
fn backoff_limit_exceeded_fails_the_job_after_its_pods_are_gone() {
    let mut w = World::new(job(json!({"completions": 3, "parallelism": 2, "backoffLimit": 1})));
    w.step();
    w.running("pi-0");
    w.exit("pi-1", 2);
    w.step();
    w.advance(10);
    w.step();
    assert_eq!(w.active_names(), ["pi-0", "pi-2"]);
    w.exit("pi-2", 2);
    let p = w.step();
    // failed = 2 > backoffLimit 1: FailureTarget first; the running pod is deleted, keeping its
    // finalizer so it is counted too
    assert_eq!(p.delete, [PodDeletion { name: "pi-0".into(), remove_finalizer: false, ready: true }]);
    let target = w.condition("FailureTarget").unwrap();
    assert_eq!(target.reason.as_deref(), Some("BackoffLimitExceeded"));
    assert_eq!(target.message.as_deref(), Some("Job has reached the specified backoff limit"));
    assert!(w.condition("Failed").is_none(), "a pod is still terminating");
    assert_eq!(w.status().terminating, Some(1));
    // the kubelet stops it
    w.exit("pi-0", 137);
    let p = w.step();
    let failed = w.condition("Failed").unwrap();
    assert_eq!(failed.reason.as_deref(), Some("BackoffLimitExceeded"));
    assert_eq!(w.status().failed, Some(3));
    assert_eq!(w.status().completion_time, None, "only a Complete Job has a completion time");
    assert_eq!(events(&p), [("BackoffLimitExceeded".into(), "Job has reached the specified backoff limit".into())]);
    assert_eq!(w.condition_types(), ["FailureTarget", "Failed"]);
}

#[test]
fn restarts_count_against_the_limit_with_restart_policy_on_failure() {
    let mut j = job(json!({"backoffLimit": 2}));
    j.spec.as_mut().unwrap().template.spec.as_mut().unwrap().restart_policy = Some("OnFailure".into());
    let mut w = World::new(j);
    w.step();
    w.running("pi-0");
    w.pod_mut("pi-0").status.as_mut().unwrap().container_statuses =
        Some(vec![serde_json::from_value(json!({"name": "main", "image": "b", "imageID": "", "ready": false, "restartCount": 2})).unwrap()]);
    w.step();
    assert_eq!(w.condition("FailureTarget").unwrap().reason.as_deref(), Some("BackoffLimitExceeded"));
}

#[test]
fn pod_failure_policy_fail_job_ignore_and_count() {
    let mut w = World::new(job(json!({"completions": 2, "parallelism": 2, "podReplacementPolicy": "Failed", "podFailurePolicy": {"rules": [
        {"action": "FailJob", "onExitCodes": {"containerName": "main", "operator": "In", "values": [42]}},
        {"action": "Ignore", "onPodConditions": [{"type": "DisruptionTarget", "status": "True"}]},
        {"action": "Count", "onExitCodes": {"operator": "In", "values": [1]}}]}})));
    w.step();
    // an ignored failure: not counted, replaced at once (no back-off for ignored pods... the
    // record still sees a failure, as upstream's does)
    w.exit("pi-0", 137);
    w.pod_mut("pi-0").status.as_mut().unwrap().conditions =
        Some(vec![serde_json::from_value(json!({"type": "DisruptionTarget", "status": "True"})).unwrap()]);
    w.step();
    assert_eq!(w.status().failed, None, "ignored");
    w.advance(10);
    assert_eq!(w.step().create.len(), 1);
    // exit code 42 fails the Job with upstream's message
    w.exit("pi-1", 42);
    w.step();
    let t = w.condition("FailureTarget").unwrap();
    assert_eq!(t.reason.as_deref(), Some("PodFailurePolicy"));
    assert_eq!(t.message.as_deref(), Some("Container main for pod ns/pi-1 failed with exit code 42 matching FailJob rule at index 0"));
    w.exit("pi-2", 137);
    w.step();
    assert_eq!(w.condition("Failed").unwrap().reason.as_deref(), Some("PodFailurePolicy"));
}

#[test]
fn terminating_pods_are_not_replaced_with_pod_replacement_policy_failed() {
    let mut w = World::new(job(json!({"parallelism": 2, "completions": 4, "podReplacementPolicy": "Failed"})));
    w.step();
    w.pod_mut("pi-0").metadata.deletion_timestamp = Some(Time(ts(0)));
    let p = w.step();
    assert!(p.create.is_empty(), "the terminating pod is not replaced before it failed");
    assert_eq!(w.status().terminating, Some(1));
    w.exit("pi-0", 1);
    w.advance(10);
    let p = w.step();
    assert_eq!(w.status().failed, Some(1));
    assert_eq!(p.create.len(), 1);
}

#[test]
fn active_deadline_fails_the_job() {
    let mut w = World::new(job(json!({"activeDeadlineSeconds": 30})));
    let p = w.step();
    assert_eq!(p.requeue_after, Some(Duration::from_secs(30)));
    w.running("pi-0");
    w.advance(30);
    let p = w.step();
    assert_eq!(p.delete.len(), 1);
    let t = w.condition("FailureTarget").unwrap();
    assert_eq!((t.reason.as_deref(), t.message.as_deref()), (Some("DeadlineExceeded"), Some("Job was active longer than specified deadline")));
    w.exit("pi-0", 143);
    w.step();
    assert_eq!(w.condition("Failed").unwrap().reason.as_deref(), Some("DeadlineExceeded"));
}

#[test]
fn suspend_deletes_active_pods_and_resume_resets_the_start_time() {
    let mut w = World::new(job(json!({"parallelism": 2, "completions": 4})));
    w.step();
    w.running("pi-0");
    w.job.spec.as_mut().unwrap().suspend = Some(true);
    w.advance(5);
    let p = w.step();
    assert_eq!(p.delete.iter().map(|d| (d.name.as_str(), d.remove_finalizer)).collect::<Vec<_>>(), [("pi-1", true), ("pi-0", true)]);
    assert!(p.create.is_empty());
    let c = w.condition("Suspended").unwrap();
    assert_eq!((c.status.as_str(), c.reason.as_deref(), c.message.as_deref()), ("True", Some("JobSuspended"), Some("Job suspended")));
    assert_eq!(events(&p), [("Suspended".into(), "Job suspended".into())]);
    assert_eq!(w.status().active, None);
    assert_eq!(w.status().terminating, Some(2));
    w.stop_terminating();
    w.step();
    assert_eq!(w.status().failed, None, "pods removed by suspension are not failures");
    assert_eq!(w.status().terminating, Some(0));
    assert!(w.names().is_empty());
    // nothing more while suspended
    let again = w.step();
    assert!(again.events.is_empty() && again.create.is_empty());
    w.job.spec.as_mut().unwrap().suspend = Some(false);
    w.advance(100);
    let p = w.step();
    assert_eq!(p.create.len(), 2);
    let c = w.condition("Suspended").unwrap();
    assert_eq!((c.status.as_str(), c.reason.as_deref()), ("False", Some("JobResumed")));
    assert_eq!(events(&p), [("Resumed".into(), "Job resumed".into())]);
    assert_eq!(w.status().start_time, Some(Time(ts(105))));
}

#[test]
fn a_job_created_suspended_has_no_start_time() {
    let mut w = World::new(job(json!({"suspend": true})));
    w.step();
    assert_eq!(w.status().start_time, None);
    assert!(w.names().is_empty());
    assert_eq!(w.condition("Suspended").unwrap().status, "True");
}

#[test]
fn indexed_pods_carry_their_index() {
    let mut w = World::new(job(json!({"completionMode": "Indexed", "completions": 3, "parallelism": 2})));
    let p = w.step();
    assert_eq!(p.create.len(), 2);
    let pod = &p.create[1];
    assert_eq!(pod.metadata.generate_name.as_deref(), Some("pi-1-"));
    assert_eq!(pod.metadata.annotations.as_ref().unwrap()[COMPLETION_INDEX], "1");
    assert_eq!(pod.metadata.labels.as_ref().unwrap()[COMPLETION_INDEX], "1");
    let spec = pod.spec.as_ref().unwrap();
    assert_eq!(spec.hostname.as_deref(), Some("pi-1"));
    let env = &spec.containers[0].env.as_ref().unwrap()[0];
    assert_eq!(env.name, "JOB_COMPLETION_INDEX");
    assert_eq!(
        env.value_from.as_ref().unwrap().field_ref.as_ref().unwrap().field_path,
        "metadata.labels['batch.kubernetes.io/job-completion-index']"
    );
    w.exit("pi-1-1", 0);
    let p = w.step();
    assert_eq!(w.status().completed_indexes.as_deref(), Some("1"));
    assert_eq!(w.status().succeeded, Some(1));
    assert_eq!(p.create[0].metadata.annotations.as_ref().unwrap()[COMPLETION_INDEX], "2");
    w.exit("pi-0-0", 0);
    w.exit("pi-2-2", 0);
    w.step();
    assert_eq!(w.status().completed_indexes.as_deref(), Some("0-2"));
    assert!(w.condition("Complete").is_some());
}

#[test]
fn duplicate_and_out_of_range_indexes_are_removed() {
    let mut w = World::new(job(json!({"completionMode": "Indexed", "completions": 2, "parallelism": 2})));
    w.step();
    let mut dup = w.pods[0].clone();
    dup.metadata.name = Some("dup".into());
    dup.metadata.uid = Some("uid-dup".into());
    let mut stray = w.pods[1].clone();
    stray.metadata.name = Some("stray".into());
    stray.metadata.uid = Some("uid-stray".into());
    stray.metadata.annotations.as_mut().unwrap().insert(COMPLETION_INDEX.into(), "7".into());
    w.pods.push(dup);
    w.pods.push(stray);
    w.running("pi-0-0");
    let p = w.step();
    let mut gone: Vec<&str> = p.delete.iter().map(|d| d.name.as_str()).collect();
    gone.sort();
    assert_eq!(gone, ["dup", "stray"], "the running pod of index 0 stays");
}

#[test]
fn backoff_limit_per_index_fails_indexes_not_the_job() {
    let mut w = World::new(job(json!({"completionMode": "Indexed", "completions": 3, "parallelism": 3,
        "backoffLimitPerIndex": 1, "backoffLimit": i32::MAX})));
    let p = w.step();
    assert_eq!(p.create[0].metadata.annotations.as_ref().unwrap()[INDEX_FAILURE_COUNT], "0");
    w.exit("pi-1-1", 3);
    let p = w.step();
    // the failed pod keeps its finalizer until its replacement exists, which waits 10 s
    assert!(p.remove_finalizers.is_empty());
    assert_eq!(p.requeue_after, Some(Duration::from_secs(10)));
    w.advance(10);
    let p = w.step();
    let again = &p.create[0];
    assert_eq!(again.metadata.annotations.as_ref().unwrap()[COMPLETION_INDEX], "1");
    assert_eq!(again.metadata.annotations.as_ref().unwrap()[INDEX_FAILURE_COUNT], "1");
    // now the old pod's finalizer goes
    w.step();
    assert_eq!(w.status().failed, Some(1));
    assert!(!has_finalizer(w.pod_mut("pi-1-1")));
    // the second failure of index 1 exhausts it
    w.exit("pi-1-3", 3);
    w.step();
    assert_eq!(w.status().failed_indexes.as_deref(), Some("1"));
    assert!(w.condition("FailureTarget").is_none(), "other indexes go on");
    w.exit("pi-0-0", 0);
    w.exit("pi-2-2", 0);
    w.step();
    w.step();
    let f = w.condition("Failed").unwrap();
    assert_eq!((f.reason.as_deref(), f.message.as_deref()), (Some("FailedIndexes"), Some("Job has failed indexes")));
    assert_eq!(w.status().completed_indexes.as_deref(), Some("0,2"));
}

#[test]
fn max_failed_indexes_and_fail_index_action() {
    let mut w = World::new(job(json!({"completionMode": "Indexed", "completions": 4, "parallelism": 4,
        "backoffLimitPerIndex": 3, "maxFailedIndexes": 1, "backoffLimit": i32::MAX,
        "podFailurePolicy": {"rules": [{"action": "FailIndex", "onExitCodes": {"operator": "In", "values": [9]}}]}})));
    w.step();
    w.exit("pi-0-0", 9);
    w.step();
    assert_eq!(w.status().failed_indexes.as_deref(), Some("0"), "FailIndex skips the per-index retries");
    assert!(w.condition("FailureTarget").is_none());
    w.exit("pi-3-3", 9);
    let p = w.step();
    assert_eq!(w.status().failed_indexes.as_deref(), Some("0,3"));
    assert_eq!(w.condition("FailureTarget").unwrap().reason.as_deref(), Some("MaxFailedIndexesExceeded"));
    assert_eq!(p.delete.len(), 2);
}

#[test]
fn success_policy_ends_the_job_early() {
    let mut w = World::new(job(json!({"completionMode": "Indexed", "completions": 5, "parallelism": 5,
        "successPolicy": {"rules": [{"succeededIndexes": "0-1", "succeededCount": 1}]}})));
    w.step();
    w.running("pi-2-2");
    w.exit("pi-1-1", 0);
    let p = w.step();
    let met = w.condition("SuccessCriteriaMet").unwrap();
    assert_eq!((met.reason.as_deref(), met.message.as_deref()), (Some("SuccessPolicy"), Some("Matched rules at index 0")));
    assert_eq!(p.delete.len(), 4, "the other indexes are stopped");
    assert!(w.condition("Complete").is_none(), "pods are still terminating");
    for n in ["pi-0-0", "pi-2-2", "pi-3-3", "pi-4-4"] {
        w.exit(n, 143);
    }
    let p = w.step();
    let done = w.condition("Complete").unwrap();
    assert_eq!(done.reason.as_deref(), Some("SuccessPolicy"));
    assert_eq!(events(&p), [("Completed".into(), "Job completed".into())]);
    assert_eq!(w.status().completed_indexes.as_deref(), Some("1"));
}

#[test]
fn a_count_only_rule_needs_that_many_successes() {
    let j = job(json!({"completionMode": "Indexed", "completions": 5, "successPolicy": {"rules": [{"succeededCount": 2}]}}));
    let spec = j.spec.unwrap();
    assert_eq!(match_success_policy(&spec, 5, &Indexes::parse("3", 5)), None);
    assert_eq!(match_success_policy(&spec, 5, &Indexes::parse("1,3", 5)).as_deref(), Some("Matched rules at index 0"));
}

#[test]
fn expectations_hold_creations_back() {
    let w = World::new(job(json!({"parallelism": 2})));
    let refs: Vec<&Pod> = Vec::new();
    let p = plan(&w.job, &Observed { pods: &refs, now: ts(0), expectations_satisfied: false, expected_removals: &BTreeSet::new(), backoff: BackoffRecord::default() });
    assert!(p.create.is_empty());
}

#[test]
fn pods_whose_finalizer_removal_is_pending_are_not_counted_twice() {
    let mut w = World::new(job(json!({"completions": 2, "parallelism": 2})));
    w.step();
    w.exit("pi-0", 0);
    let p = w.plan();
    // the executor wrote both statuses; the informer still shows the finalizer
    w.job.status = p.status.clone();
    let refs: Vec<&Pod> = w.pods.iter().collect();
    let expected: BTreeSet<String> = ["uid-0".to_string()].into();
    let again = plan(&w.job, &Observed { pods: &refs, now: ts(0), expectations_satisfied: true, expected_removals: &expected, backoff: p.backoff });
    assert!(again.remove_finalizers.is_empty());
    assert!(again.status.is_none(), "succeeded stays 1: {:?}", again.status);
    assert_eq!(w.status().succeeded, Some(1));
}

#[test]
fn an_interrupted_pass_resumes_from_the_uncounted_list() {
    let mut w = World::new(job(json!({"completions": 3, "parallelism": 2})));
    w.step();
    w.exit("pi-0", 0);
    let p = w.plan();
    // crash after the interim write and the finalizer removal, before the final write
    w.job.status = p.interim_status.clone();
    w.pod_mut("pi-0").metadata.finalizers = None;
    let p = w.step();
    assert!(p.remove_finalizers.is_empty());
    assert_eq!(w.status().succeeded, Some(1));
    assert_eq!(w.status().uncounted_terminated_pods.unwrap().succeeded, None);
}

#[test]
fn orphans_are_adopted_and_strays_released() {
    let mut w = World::new(job(json!({"parallelism": 1})));
    let orphan: Pod = serde_json::from_value(json!({"metadata": {"name": "orphan", "namespace": "ns", "uid": "o",
        "labels": {"batch.kubernetes.io/controller-uid": "job-uid"}}, "spec": {"containers": []}, "status": {"phase": "Running"}})).unwrap();
    let stray: Pod = serde_json::from_value(json!({"metadata": {"name": "stray", "namespace": "ns", "uid": "s", "labels": {"x": "y"},
        "ownerReferences": [{"apiVersion": "batch/v1", "kind": "Job", "name": "pi", "uid": "job-uid", "controller": true}]},
        "spec": {"containers": []}, "status": {"phase": "Running"}})).unwrap();
    let other_ns: Pod = serde_json::from_value(json!({"metadata": {"name": "far", "namespace": "other", "uid": "f",
        "labels": {"batch.kubernetes.io/controller-uid": "job-uid"}}})).unwrap();
    w.pods = vec![orphan, stray, other_ns];
    let p = w.plan();
    assert_eq!(p.adopt, ["orphan"]);
    assert_eq!(p.release, ["stray"]);
    assert!(p.create.is_empty(), "the adopted pod is the one wanted");
}

#[test]
fn a_finished_job_only_drops_leftover_finalizers() {
    let mut w = World::new(job(json!({})));
    w.step();
    w.exit("pi-0", 0);
    w.job.status = Some(serde_json::from_value(json!({"conditions": [{"type": "Complete", "status": "True"}]})).unwrap());
    let p = w.plan();
    assert_eq!(p.remove_finalizers, [("pi-0".to_string(), "uid-0".to_string())]);
    assert!(p.status.is_none() && p.create.is_empty());
}

#[test]
fn jobs_managed_elsewhere_or_with_unknown_modes_are_left_alone() {
    let w = World::new(job(json!({"managedBy": "example.com/other"})));
    let waiting = vec!["spec.managedBy is example.com/other: another controller manages this Job".to_string()];
    assert_eq!(w.plan(), JobPlan { waiting, ..JobPlan::default() });
    let w = World::new(job(json!({"completionMode": "Sideways"})));
    assert_eq!(events(&w.plan()), [("UnknownCompletionMode".into(), "Skipped Job sync because completion mode is unknown".into())]);
}

#[test]
fn orphan_finalizers_go_unless_a_live_job_owns_the_pod() {
    let j = job(json!({}));
    let owned = new_pod(&j, None, None, false);
    assert!(!orphan_finalizer_removable(&owned, Some(&j)));
    assert!(orphan_finalizer_removable(&owned, None), "the Job is gone");
    let mut finished = j.clone();
    finished.status = Some(serde_json::from_value(json!({"conditions": [{"type": "Failed", "status": "True"}]})).unwrap());
    assert!(orphan_finalizer_removable(&owned, Some(&finished)));
    let mut replaced = j.clone();
    replaced.metadata.uid = Some("another".into());
    assert!(orphan_finalizer_removable(&owned, Some(&replaced)));
    let mut no_owner = owned.clone();
    no_owner.metadata.owner_references = None;
    assert!(orphan_finalizer_removable(&no_owner, None));
    let mut rs_pod = owned.clone();
    rs_pod.metadata.owner_references.as_mut().unwrap()[0].kind = "ReplicaSet".into();
    assert!(!orphan_finalizer_removable(&rs_pod, None));
    let mut plain = owned;
    plain.metadata.finalizers = None;
    assert!(!orphan_finalizer_removable(&plain, None));
}

#[test]
fn a_twenty_completion_job_at_parallelism_five_with_failures() {
    let mut w = World::new(job(json!({"completions": 20, "parallelism": 5, "backoffLimit": 4})));
    let mut failures = 0;
    for round in 0..200 {
        w.step();
        assert!(w.active_names().len() <= 5, "parallelism respected");
        if w.condition("Complete").is_some() {
            break;
        }
        // every third pod fails, until three have failed
        for n in w.active_names() {
            let code = if failures < 3 && round % 3 == 0 { failures += 1; 1 } else { 0 };
            w.exit(&n, code);
        }
        w.advance(30);
    }
    let s = w.status();
    assert!(w.condition("Complete").is_some(), "{s:?}");
    assert_eq!((s.succeeded, s.failed), (Some(20), Some(3)));
    assert_eq!(s.active, None);
}

#[test]
fn long_job_names_are_cut_to_keep_the_index_in_generated_names() {
    let mut j = job(json!({"completionMode": "Indexed", "completions": 20}));
    j.metadata.name = Some("x".repeat(70));
    let p = new_pod(&j, Some(12), None, false);
    let g = p.metadata.generate_name.unwrap();
    assert_eq!(g.len(), 58);
    assert!(g.ends_with("-12-"));
    assert_eq!(p.spec.unwrap().hostname, Some(format!("{}-12", "x".repeat(70))));
}

#[test]
fn ignored_failures_of_an_index_are_counted_apart() {
    let j = job(json!({"completionMode": "Indexed", "completions": 2, "backoffLimitPerIndex": 1,
        "podFailurePolicy": {"rules": [{"action": "Ignore", "onExitCodes": {"operator": "In", "values": [7]}}]}}));
    let mut w = World::new(j.clone());
    w.step();
    w.exit("pi-0-0", 7);
    let failed = w.pods[0].clone();
    let p = new_pod(&j, Some(0), Some(&failed), true);
    let ann = p.metadata.annotations.unwrap();
    assert_eq!((ann[INDEX_FAILURE_COUNT].as_str(), ann[INDEX_IGNORED_FAILURE_COUNT].as_str()), ("0", "1"));
}

#[test]
fn a_job_being_deleted_releases_every_finalizer_and_creates_nothing() {
    let mut w = World::new(job(json!({"parallelism": 2, "completions": 4})));
    w.step();
    w.running("pi-0");
    w.job.metadata.deletion_timestamp = Some(Time(ts(1)));
    let p = w.plan();
    assert!(p.create.is_empty() && p.delete.is_empty());
    let mut released: Vec<&str> = p.remove_finalizers.iter().map(|(n, _)| n.as_str()).collect();
    released.sort();
    assert_eq!(released, ["pi-0", "pi-1"]);
    assert_eq!(p.status.and_then(|s| s.failed), None, "running pods of a deleted Job are not failures");
}

#[test]
fn the_plan_says_why_no_more_pods_start() {
    let mut w = World::new(job(json!({"parallelism": 2, "completions": 5, "activeDeadlineSeconds": 100})));
    let p = w.step();
    assert_eq!(p.create.len(), 2);
    let p = w.step();
    assert_eq!(
        p.waiting,
        [
            "the Job fails with DeadlineExceeded in 1m40s unless it finishes (activeDeadlineSeconds 100)",
            "2 pods run, as many as parallelism allows; 5 completions still to go"
        ]
    );
    w.job.spec.as_mut().unwrap().suspend = Some(true);
    let p = w.step();
    assert!(p.waiting.iter().any(|m| m.starts_with("the Job is suspended (spec.suspend)")), "{:?}", p.waiting);
    let mut other = World::new(job(json!({"managedBy": "kueue.x-k8s.io/multikueue"})));
    assert_eq!(other.step().waiting, ["spec.managedBy is kueue.x-k8s.io/multikueue: another controller manages this Job"]);
}
