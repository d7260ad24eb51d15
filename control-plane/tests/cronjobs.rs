//! The CronJob loop against the real API server, on a manual clock (no test waits for real
//! minutes): runs happen at their scheduled minute, Forbid holds a run back while the previous
//! one is active and starts it once that one completed, and two controller instances at once
//! (a restart that overlaps, or two replicas) never run a minute twice. Bad input: 422s.
#![allow(clippy::unwrap_used)]

mod common;

use common::fake::eventually;
use common::Server;
use ferro_control_plane::controllers::clock::Clock;
use ferro_control_plane::controllers::manager;
use jiff::Timestamp;
use k8s_openapi::api::batch::v1::{CronJob, Job};
use k8s_openapi::api::core::v1::Event;
use kube::api::{Api, ListParams, Patch, PatchParams, PostParams};
use serde_json::json;

fn minute_after(t: Timestamp) -> Timestamp {
    Timestamp::from_second((t.as_second().div_euclid(60) + 1) * 60).unwrap()
}

fn plus(t: Timestamp, secs: i64) -> Timestamp {
    t.checked_add(jiff::SignedDuration::from_secs(secs)).unwrap()
}

async fn run_names(jobs: &Api<Job>) -> Vec<String> {
    let mut names: Vec<String> = jobs.list(&ListParams::default()).await.unwrap().items.into_iter().filter_map(|j| j.metadata.name).collect();
    names.sort();
    names
}

async fn reasons(events: &Api<Event>) -> Vec<String> {
    events.list(&ListParams::default()).await.unwrap().items.into_iter().filter_map(|e| e.reason).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cron_job_runs_each_minute_once_and_forbid_waits_for_the_running_job() {
    // No job loop: the test plays the Jobs' completion itself.
    let s = Server::start_with(&["--controllers", "garbagecollector"]);
    let client = s.client().await;
    let clock = Clock::manual(Timestamp::now());
    let opts = manager::Options { controllers: vec!["cronjob".into()], clock: clock.clone(), ..Default::default() };
    manager::start(client.clone(), &opts);

    let cjs: Api<CronJob> = Api::namespaced(client.clone(), "default");
    let jobs: Api<Job> = Api::namespaced(client.clone(), "default");
    let events: Api<Event> = Api::namespaced(client.clone(), "default");
    let cj: CronJob = serde_json::from_value(json!({
        "metadata": {"name": "tick"},
        "spec": {"schedule": "* * * * *", "concurrencyPolicy": "Forbid",
                 "jobTemplate": {"spec": {"template": {"spec": {"containers": [{"name": "c", "image": "busybox"}], "restartPolicy": "Never"}}}}},
    }))
    .unwrap();
    let created = cjs.create(&PostParams::default(), &cj).await.unwrap();
    let created_at = created.metadata.creation_timestamp.unwrap().0;

    // Before the first scheduled minute: nothing.
    let m1 = minute_after(created_at);
    clock.set(plus(m1, -1));
    // The first minute: one run, named by its minute, recorded in the status.
    clock.set(plus(m1, 1));
    let first = format!("tick-{}", m1.as_second() / 60);
    eventually("the first run", || async { (run_names(&jobs).await == [first.clone()]).then_some(()) }).await;
    eventually("the status to list it", || async {
        let st = cjs.get("tick").await.unwrap().status?;
        let active: Vec<String> = st.active?.into_iter().filter_map(|r| r.name).collect();
        (active == [first.clone()] && st.last_schedule_time.map(|t| t.0) == Some(m1)).then_some(())
    })
    .await;

    // A second controller instance from here on (an overlapping restart, or a second replica).
    manager::start(client.clone(), &opts);

    // The next minute while the first run is active: Forbid holds it back.
    let m2 = plus(m1, 60);
    clock.set(plus(m2, 1));
    eventually("JobAlreadyActive", || async { reasons(&events).await.iter().any(|r| r == "JobAlreadyActive").then_some(()) }).await;
    assert_eq!(run_names(&jobs).await, std::slice::from_ref(&first));

    // The first run completes: the held-back run starts (late, as upstream), once.
    let done = json!({"status": {"conditions": [{"type": "SuccessCriteriaMet", "status": "True"}, {"type": "Complete", "status": "True"}],
                                 "startTime": m1.to_string(), "completionTime": plus(m1, 30).to_string(), "succeeded": 1}});
    jobs.patch_status(&first, &PatchParams::default(), &Patch::Merge(&done)).await.unwrap();
    let second = format!("tick-{}", m2.as_second() / 60);
    eventually("the held-back run", || async { (run_names(&jobs).await == [first.clone(), second.clone()]).then_some(()) }).await;
    eventually("lastSuccessfulTime and SawCompletedJob", || async {
        let st = cjs.get("tick").await.unwrap().status?;
        (st.last_successful_time.is_some() && reasons(&events).await.iter().any(|r| r == "SawCompletedJob")).then_some(())
    })
    .await;

    // Three more minutes with nothing active in between: one run each, never two.
    let mut expected = vec![first.clone(), second.clone()];
    for k in 3..=5 {
        let mk = plus(m1, 60 * (k - 1));
        for name in run_names(&jobs).await {
            jobs.patch_status(&name, &PatchParams::default(), &Patch::Merge(&done)).await.unwrap();
        }
        clock.set(plus(mk, 1));
        expected.push(format!("tick-{}", mk.as_second() / 60));
        // The history limit (3 successful) deletes the oldest finished runs.
        eventually("the run of the minute", || async {
            run_names(&jobs).await.contains(expected.last().unwrap()).then_some(())
        })
        .await;
    }
    // Events are posted after the create returns: wait until the last run's is there.
    let created: Vec<Event> = eventually("a SuccessfulCreate event for every run", || async {
        let created: Vec<Event> = events
            .list(&ListParams::default())
            .await
            .unwrap()
            .items
            .into_iter()
            .filter(|e| e.reason.as_deref() == Some("SuccessfulCreate"))
            .collect();
        let told = |run: &String| created.iter().any(|e| e.message.as_deref().is_some_and(|m| m.contains(run.as_str())));
        expected.iter().all(told).then_some(created)
    })
    .await;
    let created_runs: Vec<String> = created.iter().filter_map(|e| e.message.clone()).collect();
    // The event recorder folds repeats into a count: one event per distinct run name.
    let mut distinct = created_runs.clone();
    distinct.sort();
    distinct.dedup();
    assert_eq!(distinct.len(), expected.len(), "{created_runs:?}");
    let total: i32 = created.iter().map(|e| e.count.unwrap_or(1)).sum();
    assert_eq!(usize::try_from(total).unwrap(), expected.len(), "a minute ran twice: {created_runs:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_cron_jobs_are_refused_with_field_causes() {
    let s = Server::start_with(&["--controllers", "garbagecollector"]);
    let bad = |schedule: &str, tz: &str| {
        format!(
            "apiVersion: batch/v1\nkind: CronJob\nmetadata:\n  name: bad\nspec:\n  schedule: {schedule:?}\n{tz}  jobTemplate:\n    spec:\n      template:\n        spec:\n          restartPolicy: Never\n          containers:\n          - name: c\n            image: busybox\n"
        )
    };
    let out = s.kubectl_stdin(&["apply", "-f", "-"], Some(&bad("61 * * * *", "")));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && err.contains("spec.schedule: Invalid value: \"61 * * * *\": end of range (61) above maximum (59): 61"), "{err}");
    let out = s.kubectl_stdin(&["apply", "-f", "-"], Some(&bad("0 * * * *", "  timeZone: Mars/Olympus\n")));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && err.contains("spec.timeZone: Invalid value: \"Mars/Olympus\": unknown time zone Mars/Olympus"), "{err}");
    assert!(!s.kubectl(&["get", "cronjob", "bad"]).status.success(), "nothing stored");
    // kubectl create cronjob works and prints upstream's columns.
    s.ok(&["create", "cronjob", "nightly", "--image=busybox", "--schedule=0 3 * * *"]);
    let table = String::from_utf8_lossy(&s.kubectl(&["get", "cronjobs"]).stdout).to_string();
    assert!(table.starts_with("NAME") && table.contains("SCHEDULE") && table.contains("0 3 * * *"), "{table}");
}

/// Writes the clock file a control plane started with `--controllers-clock-file` follows
/// (whole, by rename, so it never reads half a time).
fn set_clock(file: &std::path::Path, t: Timestamp) {
    let tmp = file.with_extension("new");
    std::fs::write(&tmp, t.to_string()).unwrap();
    std::fs::rename(&tmp, file).unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_kill_9_of_the_control_plane_mid_schedule_neither_misses_nor_doubles_a_run() {
    let clock_dir = tempfile::tempdir().unwrap();
    let clock = clock_dir.path().join("now");
    set_clock(&clock, Timestamp::now());
    // The whole control plane in one process (API server, store and the cronjob loop), on the
    // test's clock; no job loop: Jobs stay active, so every run shows.
    let mut s = Server::start_with(&["--controllers", "cronjob,garbagecollector", "--controllers-clock-file", clock.to_str().unwrap()]);
    let client = s.client().await;
    let cjs: Api<CronJob> = Api::namespaced(client.clone(), "default");
    let cj: CronJob = serde_json::from_value(json!({
        "metadata": {"name": "tick"},
        "spec": {"schedule": "* * * * *", "successfulJobsHistoryLimit": 10,
                 "jobTemplate": {"spec": {"template": {"spec": {"containers": [{"name": "c", "image": "busybox"}], "restartPolicy": "Never"}}}}},
    }))
    .unwrap();
    let created_at = cjs.create(&PostParams::default(), &cj).await.unwrap().metadata.creation_timestamp.unwrap().0;
    let first = minute_after(created_at);
    let name = |t: Timestamp| format!("tick-{}", t.as_second() / 60);

    // Three crashes at three points of a run: before the loop saw the new minute, after the
    // Job was created, after the status recorded it. Each time the restarted control plane
    // ends with exactly one Job per minute and lastScheduleTime at the latest.
    let mut want: Vec<String> = Vec::new();
    for (i, when) in ["at once", "after the job", "after the status"].into_iter().enumerate() {
        let minute = plus(first, 60 * i as i64);
        set_clock(&clock, minute);
        want.push(name(minute));
        let client = s.client().await;
        let jobs: Api<Job> = Api::namespaced(client.clone(), "default");
        let cjs: Api<CronJob> = Api::namespaced(client.clone(), "default");
        match when {
            "after the job" => {
                eventually("the run's job", || async { run_names(&jobs).await.contains(&name(minute)).then_some(()) }).await;
            }
            "after the status" => {
                eventually("the run in the status", || async {
                    let st = cjs.get("tick").await.ok()?.status?;
                    (st.last_schedule_time.map(|t| t.0) == Some(minute)).then_some(())
                })
                .await;
            }
            _ => {}
        }
        s.restart();
        let client = s.client().await;
        let jobs: Api<Job> = Api::namespaced(client.clone(), "default");
        let cjs: Api<CronJob> = Api::namespaced(client.clone(), "default");
        eventually(&format!("one run per minute after a crash {when}"), || async {
            let st = cjs.get("tick").await.ok()?.status?;
            (st.last_schedule_time.map(|t| t.0) == Some(minute) && st.active.as_ref().map(Vec::len) == Some(want.len()))
                .then_some(())
        })
        .await;
        assert_eq!(run_names(&jobs).await, want, "crash {when}");
    }

    // Down across two scheduled minutes: upstream's rule, only the latest missed run starts.
    s.kill9();
    let late = plus(first, 60 * 4 + 30);
    set_clock(&clock, late);
    s.spawn();
    let client = s.client().await;
    let jobs: Api<Job> = Api::namespaced(client.clone(), "default");
    let cjs: Api<CronJob> = Api::namespaced(client.clone(), "default");
    let latest = plus(first, 60 * 4);
    want.push(name(latest));
    eventually("the latest missed run", || async {
        let st = cjs.get("tick").await.ok()?.status?;
        (st.last_schedule_time.map(|t| t.0) == Some(latest)).then_some(())
    })
    .await;
    assert_eq!(run_names(&jobs).await, want);
}
