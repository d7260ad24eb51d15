//! The Job and TTL-after-finished loops against the real binary, with fake nodes whose
//! stand-in kubelet runs Job pods to completion (`fake.ferro.dev/exit-code`,
//! `fake.ferro.dev/fail-first`): many completions with failures under a backoffLimit, a Job
//! failing on its backoffLimit, an Indexed Job, suspend and resume, ttlSecondsAfterFinished,
//! and bad input.
#![allow(clippy::unwrap_used)]

mod common;

use common::fake::{eventually, FakeNodes};
use common::Server;
use k8s_openapi::api::batch::v1::{Job, JobCondition};
use k8s_openapi::api::core::v1::{Event, Pod};
use kube::api::{Api, ListParams, Patch, PatchParams};
use kube::ResourceExt as _;
use serde_json::json;

fn condition(job: &Job, type_: &str) -> Option<JobCondition> {
    job.status.as_ref()?.conditions.as_ref()?.iter().find(|c| c.type_ == type_ && c.status == "True").cloned()
}

fn condition_types(job: &Job) -> Vec<String> {
    job.status.as_ref().and_then(|s| s.conditions.clone()).unwrap_or_default().into_iter().map(|c| c.type_).collect()
}

async fn job_pods(pods: &Api<Pod>, job: &str) -> Vec<Pod> {
    pods.list(&ListParams::default().labels(&format!("batch.kubernetes.io/job-name={job}"))).await.unwrap().items
}

async fn reasons(events: &Api<Event>, name: &str) -> Vec<String> {
    let l = events.list(&ListParams::default().fields(&format!("involvedObject.name={name}"))).await.unwrap().items;
    l.into_iter().filter_map(|e| e.reason).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn twenty_completions_at_parallelism_five_with_failures_complete() {
    let s = Server::start();
    let client = s.client().await;
    let _nodes = FakeNodes::start(client.clone(), &["n1", "n2"], "8", "16Gi").await;
    s.apply(
        r#"apiVersion: batch/v1
kind: Job
metadata: {name: batch}
spec:
  completions: 20
  parallelism: 5
  backoffLimit: 4
  template:
    metadata: {annotations: {fake.ferro.dev/fail-first: "3"}}
    spec:
      restartPolicy: Never
      containers: [{name: work, image: busybox}]
"#,
    );
    s.wait_explained("condition=complete", "job/batch", "job", "240s");
    let jobs: Api<Job> = Api::namespaced(client.clone(), "default");
    let job = jobs.get("batch").await.unwrap();
    let st = job.status.clone().unwrap();
    assert_eq!((st.succeeded, st.failed, st.active.unwrap_or(0)), (Some(20), Some(3), 0), "{st:?}");
    assert_eq!(condition_types(&job), ["SuccessCriteriaMet", "Complete"]);
    let complete = condition(&job, "Complete").unwrap();
    assert_eq!(complete.reason.as_deref(), Some("CompletionsReached"));
    assert_eq!(complete.message.as_deref(), Some("Reached expected number of succeeded pods"));
    assert!(st.completion_time.is_some() && st.start_time.is_some());
    let uncounted = st.uncounted_terminated_pods.unwrap_or_default();
    assert!(uncounted.succeeded.unwrap_or_default().is_empty() && uncounted.failed.unwrap_or_default().is_empty());

    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
    let all = eventually("every pod counted and without its tracking finalizer", || async {
        let l = job_pods(&pods, "batch").await;
        l.iter().all(|p| p.finalizers().is_empty()).then_some(l)
    })
    .await;
    assert_eq!(all.len(), 23, "20 successes and 3 failures, no extra pod");
    let uid = job.uid().unwrap();
    for p in &all {
        assert_eq!(p.metadata.generate_name.as_deref(), Some("batch-"));
        let owner = p.owner_references().iter().find(|r| r.controller == Some(true)).unwrap();
        assert_eq!((owner.kind.as_str(), owner.name.as_str(), owner.uid.as_str()), ("Job", "batch", uid.as_str()));
        let labels = p.labels();
        assert_eq!(labels["batch.kubernetes.io/controller-uid"], uid);
        assert_eq!(labels["controller-uid"], uid);
        assert_eq!(labels["job-name"], "batch");
    }
    let events: Api<Event> = Api::namespaced(client.clone(), "default");
    let seen = eventually("SuccessfulCreate and Completed events", || async {
        let r = reasons(&events, "batch").await;
        (r.iter().any(|r| r == "SuccessfulCreate") && r.iter().any(|r| r == "Completed")).then_some(r)
    })
    .await;
    assert!(!seen.iter().any(|r| r == "BackoffLimitExceeded"));
    // kubectl shows the Job complete
    let out = s.ok(&["get", "job", "batch"]);
    assert!(out.contains("20/20"), "{out}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_job_fails_once_its_backoff_limit_is_exceeded() {
    let s = Server::start();
    let client = s.client().await;
    let _nodes = FakeNodes::start(client.clone(), &["n1"], "8", "16Gi").await;
    s.apply(
        r#"apiVersion: batch/v1
kind: Job
metadata: {name: doomed}
spec:
  backoffLimit: 1
  template:
    metadata: {annotations: {fake.ferro.dev/exit-code: "3"}}
    spec:
      restartPolicy: Never
      containers: [{name: work, image: busybox}]
"#,
    );
    s.wait_explained("condition=failed", "job/doomed", "job", "240s");
    let jobs: Api<Job> = Api::namespaced(client.clone(), "default");
    let job = jobs.get("doomed").await.unwrap();
    let failed = condition(&job, "Failed").unwrap();
    assert_eq!(failed.reason.as_deref(), Some("BackoffLimitExceeded"));
    assert_eq!(failed.message.as_deref(), Some("Job has reached the specified backoff limit"));
    assert_eq!(condition_types(&job), ["FailureTarget", "Failed"]);
    let st = job.status.unwrap();
    assert_eq!((st.failed, st.succeeded.unwrap_or(0)), (Some(2), 0));
    assert!(st.completion_time.is_none());
    let events: Api<Event> = Api::namespaced(client.clone(), "default");
    eventually("a BackoffLimitExceeded warning", || async {
        reasons(&events, "doomed").await.iter().any(|r| r == "BackoffLimitExceeded").then_some(())
    })
    .await;
    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
    assert_eq!(job_pods(&pods, "doomed").await.len(), 2, "no pod after the limit");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_indexed_job_runs_every_index_once() {
    let s = Server::start();
    let client = s.client().await;
    let _nodes = FakeNodes::start(client.clone(), &["n1", "n2"], "8", "16Gi").await;
    s.apply(
        r#"apiVersion: batch/v1
kind: Job
metadata: {name: idx}
spec:
  completions: 4
  parallelism: 2
  completionMode: Indexed
  template:
    metadata: {annotations: {fake.ferro.dev/exit-code: "0"}}
    spec:
      restartPolicy: Never
      containers: [{name: work, image: busybox}]
"#,
    );
    s.wait_explained("condition=complete", "job/idx", "job", "240s");
    let jobs: Api<Job> = Api::namespaced(client.clone(), "default");
    let st = jobs.get("idx").await.unwrap().status.unwrap();
    assert_eq!(st.completed_indexes.as_deref(), Some("0-3"));
    assert_eq!(st.succeeded, Some(4));
    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
    let mut seen: Vec<String> = Vec::new();
    for p in job_pods(&pods, "idx").await {
        let ix = p.annotations()["batch.kubernetes.io/job-completion-index"].clone();
        assert_eq!(p.labels()["batch.kubernetes.io/job-completion-index"], ix);
        let spec = p.spec.unwrap();
        assert_eq!(spec.hostname, Some(format!("idx-{ix}")));
        assert!(p.metadata.generate_name.unwrap().starts_with(&format!("idx-{ix}-")));
        let env = spec.containers[0].env.clone().unwrap();
        assert!(env.iter().any(|e| e.name == "JOB_COMPLETION_INDEX"));
        seen.push(ix);
    }
    seen.sort();
    assert_eq!(seen, ["0", "1", "2", "3"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_suspended_job_waits_and_a_finished_one_expires_after_its_ttl() {
    let s = Server::start();
    let client = s.client().await;
    let _nodes = FakeNodes::start(client.clone(), &["n1"], "8", "16Gi").await;
    s.apply(
        r#"apiVersion: batch/v1
kind: Job
metadata: {name: later}
spec:
  suspend: true
  completions: 2
  ttlSecondsAfterFinished: 300
  template:
    metadata: {annotations: {fake.ferro.dev/exit-code: "0"}}
    spec:
      restartPolicy: Never
      containers: [{name: work, image: busybox}]
"#,
    );
    let jobs: Api<Job> = Api::namespaced(client.clone(), "default");
    let suspended = eventually("the JobSuspended condition", || async { condition(&jobs.get("later").await.unwrap(), "Suspended") }).await;
    assert_eq!(suspended.reason.as_deref(), Some("JobSuspended"));
    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
    assert!(job_pods(&pods, "later").await.is_empty(), "a suspended Job has no pods");
    assert!(jobs.get("later").await.unwrap().status.unwrap().start_time.is_none());
    jobs.patch("later", &PatchParams::default(), &Patch::Merge(&json!({"spec": {"suspend": false}}))).await.unwrap();
    s.wait_explained("condition=complete", "job/later", "job", "240s");
    let job = jobs.get("later").await.unwrap();
    let resumed = job.status.as_ref().unwrap().conditions.as_ref().unwrap().iter().find(|c| c.type_ == "Suspended").cloned().unwrap();
    assert_eq!((resumed.status.as_str(), resumed.reason.as_deref()), ("False", Some("JobResumed")));
    assert!(!job_pods(&pods, "later").await.is_empty(), "kept while its TTL runs");
    // a shorter TTL (the field may change after the Job finished): the Job goes, its pods with it
    jobs.patch("later", &PatchParams::default(), &Patch::Merge(&json!({"spec": {"ttlSecondsAfterFinished": 1}}))).await.unwrap();
    eventually("the finished Job deleted after its TTL", || async { jobs.get_opt("later").await.unwrap().is_none().then_some(()) }).await;
    eventually("its pods deleted", || async { job_pods(&pods, "later").await.is_empty().then_some(()) }).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pod_failure_policy_rule_fails_the_job_and_deleting_a_job_releases_its_pods() {
    let s = Server::start();
    let client = s.client().await;
    let _nodes = FakeNodes::start(client.clone(), &["n1"], "8", "16Gi").await;
    s.apply(
        r#"apiVersion: batch/v1
kind: Job
metadata: {name: fatal}
spec:
  backoffLimit: 6
  podFailurePolicy:
    rules:
    - {action: FailJob, onExitCodes: {containerName: work, operator: In, values: [42]}}
  template:
    metadata: {annotations: {fake.ferro.dev/exit-code: "42"}}
    spec:
      restartPolicy: Never
      containers: [{name: work, image: busybox}]
---
apiVersion: batch/v1
kind: Job
metadata: {name: forever}
spec:
  parallelism: 2
  completions: 4
  template:
    spec:
      restartPolicy: Never
      containers: [{name: work, image: busybox}]
"#,
    );
    s.wait_explained("condition=failed", "job/fatal", "job", "240s");
    let jobs: Api<Job> = Api::namespaced(client.clone(), "default");
    let job = jobs.get("fatal").await.unwrap();
    let failed = condition(&job, "Failed").unwrap();
    assert_eq!(failed.reason.as_deref(), Some("PodFailurePolicy"));
    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
    let pod = job_pods(&pods, "fatal").await.pop().unwrap();
    assert_eq!(
        failed.message,
        Some(format!("Container work for pod default/{} failed with exit code 42 matching FailJob rule at index 0", pod.name_any()))
    );
    assert_eq!(job.status.unwrap().failed, Some(1), "one pod, no retry");

    // a running Job deleted the way kubectl does: its pods lose the tracking finalizer and go
    eventually("two running pods", || async {
        let running = job_pods(&pods, "forever").await.into_iter().filter(|p| p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running"));
        (running.count() == 2).then_some(())
    })
    .await;
    s.ok(&["delete", "job", "forever"]);
    eventually("the deleted Job's pods gone", || async { job_pods(&pods, "forever").await.is_empty().then_some(()) }).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_job_specs_are_refused() {
    let s = Server::start();
    let out = s.kubectl_stdin(
        &["apply", "-f", "-"],
        Some(
            r#"apiVersion: batch/v1
kind: Job
metadata: {name: negative}
spec:
  parallelism: -1
  template:
    spec:
      restartPolicy: Never
      containers: [{name: work, image: busybox}]
"#,
        ),
    );
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("spec.parallelism: Invalid value: -1: must be greater than or equal to 0"), "{err}");
    // the API's answer is a 422 Status
    let client = s.client().await;
    let jobs: Api<Job> = Api::namespaced(client, "default");
    let job: Job = serde_json::from_value(json!({"metadata": {"name": "negative"}, "spec": {"parallelism": -1,
        "template": {"spec": {"restartPolicy": "Never", "containers": [{"name": "work", "image": "busybox"}]}}}}))
    .unwrap();
    match jobs.create(&Default::default(), &job).await {
        Err(kube::Error::Api(status)) => assert_eq!(status.code, 422),
        other => panic!("expected a 422: {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn status_writes_that_describe_no_possible_job_or_go_backwards_are_refused() {
    // no job loop: the test writes the status as another controller (spec.managedBy) would
    let s = Server::start_with(&["--controllers=*,-job"]);
    let client = s.client_without_retries().await;
    s.apply(
        r#"apiVersion: batch/v1
kind: Job
metadata: {name: ext}
spec:
  managedBy: example.com/queue
  template:
    spec: {restartPolicy: Never, containers: [{name: c, image: "busybox:1"}]}
"#,
    );
    let jobs: Api<Job> = Api::namespaced(client, "default");
    let write = |status: serde_json::Value| {
        let jobs = jobs.clone();
        async move { jobs.patch_status("ext", &PatchParams::default(), &Patch::Merge(&json!({"status": status}))).await }
    };
    let refused = |r: Result<Job, kube::Error>| match r {
        Err(kube::Error::Api(e)) if e.code == 422 => e.message,
        other => panic!("expected a 422, got {other:?}"),
    };
    let start = "2026-01-01T00:00:00Z";
    write(json!({"startTime": start, "active": 1})).await.unwrap();
    let msg = refused(write(json!({"conditions": [{"type": "Complete", "status": "True"}], "active": 0})).await);
    assert!(msg.contains("status.completionTime: Required value: completionTime is required for Complete jobs"), "{msg}");
    let msg = refused(write(json!({"completionTime": "2025-12-31T23:00:00Z"})).await);
    assert!(msg.contains("cannot set completionTime when there is no Complete=True condition"), "{msg}");
    let msg = refused(write(json!({"startTime": "2026-01-01T00:00:05Z"})).await);
    assert!(msg.contains("status.startTime: Required value: startTime cannot be removed for unsuspended job"), "{msg}");
    // the right way: criteria met, then complete
    write(json!({"active": 0, "succeeded": 1, "conditions": [{"type": "SuccessCriteriaMet", "status": "True"}]})).await.unwrap();
    write(json!({"completionTime": "2026-01-01T00:01:00Z", "conditions": [
        {"type": "SuccessCriteriaMet", "status": "True"}, {"type": "Complete", "status": "True"}]})).await.unwrap();
    // and no way back
    let msg = refused(write(json!({"conditions": [{"type": "SuccessCriteriaMet", "status": "True"}], "succeeded": 0})).await);
    assert!(msg.contains("cannot disable the terminal Complete=True condition"), "{msg}");
    assert!(msg.contains("status.succeeded: Invalid value: 0: cannot decrease the succeeded counter"), "{msg}");
    let msg = refused(write(json!({"completionTime": "2026-01-01T00:02:00Z"})).await);
    assert!(msg.contains("completionTime cannot be mutated"), "{msg}");
    let job = jobs.get("ext").await.unwrap();
    assert_eq!(job.status.unwrap().succeeded, Some(1), "nothing of the refused writes stored");
}
