use super::*;

fn now() -> Timestamp {
    "2024-05-01T12:00:00Z".parse().unwrap()
}

/// RFC 3339 time `secs` seconds before `now()`.
fn ago(secs: i64) -> String {
    let ts = now().checked_sub(jiff::SignedDuration::from_secs(secs)).unwrap();
    ts.strftime("%Y-%m-%dT%H:%M:%SZ").to_string()
}

fn meta(name: &str) -> Value {
    json!({"name": name, "namespace": "default", "uid": "u-1", "resourceVersion": "42",
           "creationTimestamp": ago(5 * 86400)})
}

fn cells_of(resource: &str, obj: &Value) -> Vec<Value> {
    let out = cells(resource, obj, now());
    assert_eq!(out.len(), columns(resource).len(), "{resource}: one cell per column");
    out
}

fn names(resource: &str) -> Vec<(&'static str, &'static str, i32)> {
    columns(resource).iter().map(|c| (c.name, c.type_, c.priority)).collect()
}

// --- durations -------------------------------------------------------------------------

#[test]
fn human_duration_boundaries() {
    let cases: &[(u64, &str)] = &[
        (0, "0s"),
        (1, "1s"),
        (119, "119s"),
        (120, "2m"),
        (150, "2m30s"),
        (599, "9m59s"),
        (600, "10m"),
        (3 * 3600 - 1, "179m"),
        (3 * 3600, "3h"),
        (3 * 3600 + 30 * 60, "3h30m"),
        (8 * 3600 - 1, "7h59m"),
        (8 * 3600, "8h"),
        (48 * 3600 - 1, "47h"),
        (48 * 3600, "2d"),
        (49 * 3600, "2d1h"),
        (8 * 86400 - 1, "7d23h"),
        (8 * 86400, "8d"),
        (730 * 86400 - 1, "729d"),
        (730 * 86400, "2y"),
        (731 * 86400, "2y1d"),
        (8 * 365 * 86400 - 1, "7y364d"),
        (8 * 365 * 86400, "8y"),
        (20 * 365 * 86400, "20y"),
    ];
    for (secs, want) in cases {
        assert_eq!(human_duration(Duration::from_secs(*secs)), *want, "{secs}s");
    }
    assert_eq!(human_duration(Duration::from_millis(1999)), "1s");
}

#[test]
fn future_timestamps_and_unknown() {
    assert_eq!(human_duration_nanos(-1_500_000_000), "0s");
    assert_eq!(human_duration_nanos(-1_999_999_999), "0s");
    assert_eq!(human_duration_nanos(-2_000_000_000), "<invalid>");
    let future = json!("2024-05-01T12:00:01Z");
    assert_eq!(translate_timestamp_since(Some(&future), now()), "0s");
    let far = json!("2024-05-01T12:00:10Z");
    assert_eq!(translate_timestamp_since(Some(&far), now()), "<invalid>");
    assert_eq!(translate_timestamp_since(None, now()), "<unknown>");
    assert_eq!(translate_timestamp_since(Some(&json!("0001-01-01T00:00:00Z")), now()), "<unknown>");
    assert_eq!(translate_timestamp_since(Some(&json!("2024-05-01T11:59:30.123456Z")), now()), "29s");
}

// --- helpers ---------------------------------------------------------------------------

#[test]
fn quantities_print_canonically() {
    let cases = [
        ("10Gi", "10Gi"),
        ("1024Mi", "1Gi"),
        ("1536Mi", "1536Mi"),
        ("1.5Gi", "1536Mi"),
        ("2048Ki", "2Mi"),
        ("1000", "1k"),
        ("1000M", "1G"),
        ("1500M", "1500M"),
        ("1.5G", "1500M"),
        ("0.5", "500m"),
        ("100m", "100m"),
        ("0", "0"),
        ("0Gi", "0"),
        ("512", "512"),
        ("0.5Ki", "512"),
        ("1e3", "1e3"),
        ("1E", "1E"),
        ("-2Gi", "-2Gi"),
        ("1n", "1n"),
        ("0.1n", "1n"),
        ("5", "5"),
        ("12345", "12345"),
    ];
    for (input, want) in cases {
        assert_eq!(canonical_quantity(input).as_deref(), Some(want), "{input}");
    }
    assert_eq!(canonical_quantity("abc"), None);
    assert_eq!(quantity(None), "0");
    assert_eq!(quantity(Some(&json!(2048))), "2048");
}

#[test]
fn label_selectors_format_like_upstream() {
    let sel = json!({
        "matchLabels": {"b": "2", "a": "1"},
        "matchExpressions": [
            {"key": "tier", "operator": "In", "values": ["web", "api"]},
            {"key": "env", "operator": "NotIn", "values": ["dev"]},
            {"key": "canary", "operator": "DoesNotExist"},
            {"key": "zone", "operator": "Exists"}
        ]
    });
    assert_eq!(
        format_label_selector(Some(&sel)),
        "a=1,b=2,!canary,env notin (dev),tier in (api,web),zone"
    );
    assert_eq!(format_label_selector(None), "<none>");
    assert_eq!(format_label_selector(Some(&json!({}))), "<none>");
    let bad = json!({"matchExpressions": [{"key": "x", "operator": "In", "values": []}]});
    assert_eq!(format_label_selector(Some(&bad)), "<error>");
    assert_eq!(format_labels(Some(&json!({"z": "1", "app": "web"}))), "app=web,z=1");
    assert_eq!(format_labels(None), "<none>");
}

// --- pods ------------------------------------------------------------------------------

fn running_pod() -> Value {
    json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": meta("web-7d4b9c8f5-x2x9q"),
        "spec": {"nodeName": "node-1", "containers": [{"name": "web", "image": "nginx:1.25"}, {"name": "log", "image": "busybox"}]},
        "status": {
            "phase": "Running",
            "podIP": "10.244.1.5",
            "podIPs": [{"ip": "10.244.1.5"}, {"ip": "fd00::5"}],
            "conditions": [{"type": "Initialized", "status": "True"}, {"type": "Ready", "status": "True"}],
            "containerStatuses": [
                {"name": "web", "ready": true, "restartCount": 0, "state": {"running": {"startedAt": ago(3600)}}},
                {"name": "log", "ready": true, "restartCount": 0, "state": {"running": {"startedAt": ago(3600)}}}
            ]
        }
    })
}

#[test]
fn pod_columns() {
    assert_eq!(
        names("pods"),
        vec![
            ("Name", "string", 0),
            ("Ready", "string", 0),
            ("Status", "string", 0),
            ("Restarts", "string", 0),
            ("Age", "string", 0),
            ("IP", "string", 1),
            ("Node", "string", 1),
            ("Nominated Node", "string", 1),
            ("Readiness Gates", "string", 1),
        ]
    );
    assert_eq!(columns("pods")[0].format, "name");
    assert_eq!(columns("pods")[1].format, "");
}

#[test]
fn pod_running() {
    assert_eq!(
        cells_of("pods", &running_pod()),
        vec![
            json!("web-7d4b9c8f5-x2x9q"),
            json!("2/2"),
            json!("Running"),
            json!("0"),
            json!("5d"),
            json!("10.244.1.5"),
            json!("node-1"),
            json!("<none>"),
            json!("<none>"),
        ]
    );
}

#[test]
fn pod_pending_unscheduled() {
    let pod = json!({
        "metadata": meta("p"),
        "spec": {"containers": [{"name": "c", "image": "i"}]},
        "status": {"phase": "Pending"}
    });
    assert_eq!(
        cells_of("pods", &pod),
        vec![json!("p"), json!("0/1"), json!("Pending"), json!("0"), json!("5d"), json!("<none>"), json!("<none>"), json!("<none>"), json!("<none>")]
    );
}

fn status_of(pod: &Value) -> (Value, Value, Value) {
    let c = cells("pods", pod, now());
    (c[1].clone(), c[2].clone(), c[3].clone())
}

#[test]
fn pod_container_creating_and_image_pull_backoff() {
    let mut pod = running_pod();
    pod["status"]["phase"] = json!("Pending");
    pod["status"]["containerStatuses"][0] =
        json!({"name": "web", "ready": false, "restartCount": 0, "state": {"waiting": {"reason": "ContainerCreating"}}});
    assert_eq!(status_of(&pod), (json!("1/2"), json!("ContainerCreating"), json!("0")));
    pod["status"]["containerStatuses"][1] =
        json!({"name": "log", "ready": false, "restartCount": 0, "state": {"waiting": {"reason": "ImagePullBackOff", "message": "Back-off pulling image"}}});
    // The first container's state wins (statuses are walked last to first).
    assert_eq!(status_of(&pod), (json!("0/2"), json!("ContainerCreating"), json!("0")));
    pod["status"]["containerStatuses"][0] =
        json!({"name": "web", "ready": true, "restartCount": 0, "state": {"running": {}}});
    assert_eq!(status_of(&pod), (json!("1/2"), json!("ImagePullBackOff"), json!("0")));
}

#[test]
fn pod_crash_loop_with_last_restart() {
    let mut pod = running_pod();
    pod["status"]["containerStatuses"][0] = json!({
        "name": "web", "ready": false, "restartCount": 5,
        "state": {"waiting": {"reason": "CrashLoopBackOff", "message": "back-off 2m40s"}},
        "lastState": {},
        "lastTerminationState": {"terminated": {"exitCode": 1, "reason": "Error", "finishedAt": ago(180)}}
    });
    pod["status"]["containerStatuses"][1]["restartCount"] = json!(1);
    pod["status"]["containerStatuses"][1]["lastTerminationState"] =
        json!({"terminated": {"exitCode": 137, "reason": "OOMKilled", "finishedAt": ago(4000)}});
    assert_eq!(status_of(&pod), (json!("1/2"), json!("CrashLoopBackOff"), json!("6 (3m ago)")));
}

#[test]
fn pod_terminated_without_reason() {
    let mut pod = running_pod();
    pod["status"]["containerStatuses"][0] =
        json!({"name": "web", "ready": false, "restartCount": 0, "state": {"terminated": {"exitCode": 137, "signal": 9}}});
    assert_eq!(status_of(&pod).1, json!("Signal:9"));
    pod["status"]["containerStatuses"][0] =
        json!({"name": "web", "ready": false, "restartCount": 0, "state": {"terminated": {"exitCode": 2}}});
    assert_eq!(status_of(&pod).1, json!("ExitCode:2"));
}

#[test]
fn pod_completed_and_failed() {
    let pod = json!({
        "metadata": meta("job-abc"),
        "spec": {"nodeName": "n1", "containers": [{"name": "main", "image": "busybox"}]},
        "status": {
            "phase": "Succeeded", "podIP": "10.0.0.9",
            "conditions": [{"type": "Ready", "status": "False", "reason": "PodCompleted"}],
            "containerStatuses": [{"name": "main", "ready": false, "restartCount": 0,
                "state": {"terminated": {"exitCode": 0, "reason": "Completed", "finishedAt": ago(60)}}}]
        }
    });
    assert_eq!(
        cells_of("pods", &pod),
        vec![json!("job-abc"), json!("0/1"), json!("Completed"), json!("0"), json!("5d"), json!("10.0.0.9"), json!("n1"), json!("<none>"), json!("<none>")]
    );
    let evicted = json!({
        "metadata": meta("ev"),
        "spec": {"containers": [{"name": "c", "image": "i"}]},
        "status": {"phase": "Failed", "reason": "Evicted", "message": "The node was low on resource: memory."}
    });
    assert_eq!(status_of(&evicted).1, json!("Evicted"));
}

#[test]
fn pod_completed_container_with_another_running() {
    let mut pod = running_pod();
    pod["status"]["containerStatuses"][0] =
        json!({"name": "web", "ready": false, "restartCount": 0, "state": {"terminated": {"exitCode": 0, "reason": "Completed"}}});
    // "log" (walked first) is running and ready; "web" (walked last) completed.
    assert_eq!(status_of(&pod).1, json!("Running"));
    pod["status"]["conditions"][1]["status"] = json!("False");
    assert_eq!(status_of(&pod).1, json!("NotReady"));
}

#[test]
fn pod_terminating_and_node_lost() {
    let mut pod = running_pod();
    pod["metadata"]["deletionTimestamp"] = json!(ago(10));
    assert_eq!(status_of(&pod).1, json!("Terminating"));
    pod["status"]["reason"] = json!("NodeLost");
    assert_eq!(status_of(&pod).1, json!("Unknown"));
    // Finished pods keep their terminal status while being deleted.
    let mut done = running_pod();
    done["metadata"]["deletionTimestamp"] = json!(ago(10));
    done["status"]["phase"] = json!("Succeeded");
    done["status"]["containerStatuses"] = json!([
        {"name": "web", "ready": false, "restartCount": 0, "state": {"terminated": {"exitCode": 0, "reason": "Completed"}}},
        {"name": "log", "ready": false, "restartCount": 0, "state": {"terminated": {"exitCode": 0, "reason": "Completed"}}}
    ]);
    assert_eq!(status_of(&done).1, json!("Completed"));
}

fn init_pod(init_statuses: Value) -> Value {
    json!({
        "metadata": meta("init"),
        "spec": {
            "initContainers": [{"name": "migrate", "image": "m"}, {"name": "seed", "image": "s"}],
            "containers": [{"name": "app", "image": "a"}]
        },
        "status": {
            "phase": "Pending",
            "conditions": [{"type": "Initialized", "status": "False"}],
            "initContainerStatuses": init_statuses,
            "containerStatuses": [{"name": "app", "ready": false, "restartCount": 0, "state": {"waiting": {"reason": "PodInitializing"}}}]
        }
    })
}

#[test]
fn pod_init_containers() {
    let waiting = json!({"waiting": {"reason": "PodInitializing"}});
    let pod = init_pod(json!([
        {"name": "migrate", "ready": false, "restartCount": 0, "state": {"running": {}}},
        {"name": "seed", "ready": false, "restartCount": 0, "state": waiting}
    ]));
    assert_eq!(status_of(&pod), (json!("0/1"), json!("Init:0/2"), json!("0")));

    let pod = init_pod(json!([
        {"name": "migrate", "ready": true, "restartCount": 0, "state": {"terminated": {"exitCode": 0, "reason": "Completed"}}},
        {"name": "seed", "ready": false, "restartCount": 0, "state": {"running": {}}}
    ]));
    assert_eq!(status_of(&pod).1, json!("Init:1/2"));

    let pod = init_pod(json!([
        {"name": "migrate", "ready": false, "restartCount": 3, "state": {"terminated": {"exitCode": 1, "reason": "Error"}},
         "lastTerminationState": {"terminated": {"exitCode": 1, "reason": "Error", "finishedAt": ago(30)}}},
        {"name": "seed", "ready": false, "restartCount": 0, "state": waiting}
    ]));
    assert_eq!(status_of(&pod), (json!("0/1"), json!("Init:Error"), json!("3 (30s ago)")));

    let pod = init_pod(json!([
        {"name": "migrate", "ready": false, "restartCount": 4, "state": {"waiting": {"reason": "CrashLoopBackOff"}}},
        {"name": "seed", "ready": false, "restartCount": 0, "state": waiting}
    ]));
    assert_eq!(status_of(&pod), (json!("0/1"), json!("Init:CrashLoopBackOff"), json!("4")));

    let pod = init_pod(json!([
        {"name": "migrate", "ready": false, "restartCount": 0, "state": {"terminated": {"exitCode": 3}}},
        {"name": "seed", "ready": false, "restartCount": 0, "state": waiting}
    ]));
    assert_eq!(status_of(&pod).1, json!("Init:ExitCode:3"));

    let pod = init_pod(json!([
        {"name": "migrate", "ready": false, "restartCount": 0, "state": {"terminated": {"exitCode": 143, "signal": 15}}},
        {"name": "seed", "ready": false, "restartCount": 0, "state": waiting}
    ]));
    assert_eq!(status_of(&pod).1, json!("Init:Signal:15"));
}

#[test]
fn pod_with_sidecar_init_container() {
    let pod = json!({
        "metadata": meta("sidecar"),
        "spec": {
            "initContainers": [{"name": "proxy", "image": "envoy", "restartPolicy": "Always"}],
            "containers": [{"name": "app", "image": "a"}]
        },
        "status": {
            "phase": "Running",
            "conditions": [{"type": "Initialized", "status": "True"}, {"type": "Ready", "status": "True"}],
            "initContainerStatuses": [{"name": "proxy", "ready": true, "started": true, "restartCount": 2,
                "state": {"running": {}},
                "lastTerminationState": {"terminated": {"exitCode": 1, "finishedAt": ago(7200)}}}],
            "containerStatuses": [{"name": "app", "ready": true, "restartCount": 0, "state": {"running": {}}}]
        }
    });
    assert_eq!(status_of(&pod), (json!("2/2"), json!("Running"), json!("2 (120m ago)")));
}

#[test]
fn pod_scheduling_gated_and_readiness_gates() {
    let pod = json!({
        "metadata": meta("gated"),
        "spec": {"containers": [{"name": "c", "image": "i"}], "schedulingGates": [{"name": "g"}]},
        "status": {"phase": "Pending", "conditions": [{"type": "PodScheduled", "status": "False", "reason": "SchedulingGated"}]}
    });
    assert_eq!(status_of(&pod).1, json!("SchedulingGated"));

    let mut pod = running_pod();
    pod["spec"]["readinessGates"] = json!([{"conditionType": "example.com/lb"}, {"conditionType": "example.com/dns"}]);
    pod["status"]["conditions"] = json!([
        {"type": "Ready", "status": "True"},
        {"type": "example.com/lb", "status": "True"},
        {"type": "example.com/dns", "status": "False"}
    ]);
    pod["status"]["nominatedNodeName"] = json!("node-2");
    let c = cells_of("pods", &pod);
    assert_eq!(c[7], json!("node-2"));
    assert_eq!(c[8], json!("1/2"));
}

// --- nodes -----------------------------------------------------------------------------

fn node() -> Value {
    json!({
        "metadata": {"name": "cp-1", "creationTimestamp": ago(40 * 86400),
            "labels": {"node-role.kubernetes.io/control-plane": "", "node-role.kubernetes.io/etcd": "true",
                       "kubernetes.io/role": "master", "kubernetes.io/hostname": "cp-1"}},
        "spec": {},
        "status": {
            "conditions": [{"type": "MemoryPressure", "status": "False"}, {"type": "Ready", "status": "True"}],
            "addresses": [{"type": "Hostname", "address": "cp-1"}, {"type": "InternalIP", "address": "192.168.1.10"}],
            "nodeInfo": {"kubeletVersion": "v1.33.1", "osImage": "Ubuntu 24.04 LTS", "kernelVersion": "6.8.0-31-generic",
                         "containerRuntimeVersion": "containerd://1.7.12"}
        }
    })
}

#[test]
fn node_ready() {
    assert_eq!(
        cells_of("nodes", &node()),
        vec![
            json!("cp-1"),
            json!("Ready"),
            json!("control-plane,etcd,master"),
            json!("40d"),
            json!("v1.33.1"),
            json!("192.168.1.10"),
            json!("<none>"),
            json!("Ubuntu 24.04 LTS"),
            json!("6.8.0-31-generic"),
            json!("containerd://1.7.12"),
        ]
    );
}

#[test]
fn node_status_variants() {
    let mut n = node();
    n["spec"]["unschedulable"] = json!(true);
    assert_eq!(cells_of("nodes", &n)[1], json!("Ready,SchedulingDisabled"));
    n["status"]["conditions"][1]["status"] = json!("Unknown");
    assert_eq!(cells_of("nodes", &n)[1], json!("NotReady,SchedulingDisabled"));
    n["status"]["conditions"] = json!([]);
    assert_eq!(cells_of("nodes", &n)[1], json!("Unknown,SchedulingDisabled"));
    let bare = json!({"metadata": {"name": "w", "creationTimestamp": ago(10)}, "status": {}});
    assert_eq!(
        cells_of("nodes", &bare),
        vec![json!("w"), json!("Unknown"), json!("<none>"), json!("10s"), json!(""), json!("<none>"), json!("<none>"),
             json!("<unknown>"), json!("<unknown>"), json!("<unknown>")]
    );
}

// --- services --------------------------------------------------------------------------

#[test]
fn service_cluster_ip() {
    let svc = json!({
        "metadata": meta("web"),
        "spec": {"type": "ClusterIP", "clusterIP": "10.96.12.4", "clusterIPs": ["10.96.12.4"],
                 "ports": [{"name": "http", "port": 80, "protocol": "TCP", "targetPort": 8080},
                           {"name": "dns", "port": 53, "protocol": "UDP"}],
                 "selector": {"app": "web", "tier": "front"}}
    });
    assert_eq!(
        cells_of("services", &svc),
        vec![json!("web"), json!("ClusterIP"), json!("10.96.12.4"), json!("<none>"), json!("80/TCP,53/UDP"), json!("5d"), json!("app=web,tier=front")]
    );
}

#[test]
fn service_node_port_load_balancer_external_name() {
    let svc = json!({
        "metadata": meta("np"),
        "spec": {"type": "NodePort", "clusterIPs": ["10.96.0.20"], "externalIPs": ["1.2.3.4"],
                 "ports": [{"port": 80, "nodePort": 30080, "protocol": "TCP"}, {"port": 443, "nodePort": 30443}]}
    });
    assert_eq!(
        cells_of("services", &svc),
        vec![json!("np"), json!("NodePort"), json!("10.96.0.20"), json!("1.2.3.4"), json!("80:30080/TCP,443:30443/TCP"), json!("5d"), json!("<none>")]
    );

    let mut lb = json!({
        "metadata": meta("lb"),
        "spec": {"type": "LoadBalancer", "clusterIPs": ["10.96.0.30"], "ports": [{"port": 443, "nodePort": 31000, "protocol": "TCP"}]},
        "status": {"loadBalancer": {}}
    });
    assert_eq!(cells_of("services", &lb)[3], json!("<pending>"));
    lb["status"]["loadBalancer"]["ingress"] =
        json!([{"ip": "203.0.113.9"}, {"hostname": "a-very-long-hostname.elb.example.com"}, {"ip": "203.0.113.7"}]);
    assert_eq!(cells_of("services", &lb)[3], json!("203.0.113.7,203.0.113.9,a-very-long-hostname.elb.example.com"));
    lb["spec"]["externalIPs"] = json!(["198.51.100.1"]);
    assert_eq!(
        cells_of("services", &lb)[3],
        json!("203.0.113.7,203.0.113.9,a-very-long-hostname.elb.example.com,198.51.100.1")
    );

    let ext = json!({"metadata": meta("ext"), "spec": {"type": "ExternalName", "externalName": "db.example.com"}});
    assert_eq!(
        cells_of("services", &ext),
        vec![json!("ext"), json!("ExternalName"), json!("<none>"), json!("db.example.com"), json!("<none>"), json!("5d"), json!("<none>")]
    );

    let headless = json!({"metadata": meta("h"), "spec": {"clusterIP": "None", "clusterIPs": ["None"], "ports": [{"port": 5432}]}});
    assert_eq!(cells_of("services", &headless)[1..5], [json!("ClusterIP"), json!("None"), json!("<none>"), json!("5432/TCP")]);
}

// --- workloads -------------------------------------------------------------------------

fn template() -> Value {
    json!({"metadata": {"labels": {"app": "web"}},
           "spec": {"containers": [{"name": "web", "image": "nginx:1.25"}, {"name": "sidecar", "image": "envoy:v1.30"}],
                    "nodeSelector": {"kubernetes.io/os": "linux"}}})
}

#[test]
fn deployment() {
    let d = json!({
        "metadata": meta("web"),
        "spec": {"replicas": 3, "selector": {"matchLabels": {"app": "web"}}, "template": template()},
        "status": {"replicas": 3, "updatedReplicas": 2, "readyReplicas": 1, "availableReplicas": 1}
    });
    assert_eq!(
        names("deployments"),
        vec![("Name", "string", 0), ("Ready", "string", 0), ("Up-to-date", "string", 0), ("Available", "string", 0),
             ("Age", "string", 0), ("Containers", "string", 1), ("Images", "string", 1), ("Selector", "string", 1)]
    );
    assert_eq!(
        cells_of("deployments", &d),
        vec![json!("web"), json!("1/3"), json!(2), json!(1), json!("5d"), json!("web,sidecar"), json!("nginx:1.25,envoy:v1.30"), json!("app=web")]
    );
    let fresh = json!({"metadata": meta("new"), "spec": {"template": template()}});
    assert_eq!(
        cells_of("deployments", &fresh),
        vec![json!("new"), json!("0/1"), json!(0), json!(0), json!("5d"), json!("web,sidecar"), json!("nginx:1.25,envoy:v1.30"), json!("")]
    );
}

#[test]
fn replica_set() {
    let rs = json!({
        "metadata": meta("web-7d4b9c8f5"),
        "spec": {"replicas": 3, "selector": {"matchLabels": {"app": "web", "pod-template-hash": "7d4b9c8f5"}}, "template": template()},
        "status": {"replicas": 3, "readyReplicas": 2}
    });
    assert_eq!(
        cells_of("replicasets", &rs),
        vec![json!("web-7d4b9c8f5"), json!(3), json!(3), json!(2), json!("5d"), json!("web,sidecar"),
             json!("nginx:1.25,envoy:v1.30"), json!("app=web,pod-template-hash=7d4b9c8f5")]
    );
    assert_eq!(names("replicasets")[1], ("Desired", "integer", 0));
}

#[test]
fn daemon_set() {
    let ds = json!({
        "metadata": meta("kube-proxy"),
        "spec": {"selector": {"matchLabels": {"k8s-app": "kube-proxy"}}, "template": template()},
        "status": {"desiredNumberScheduled": 3, "currentNumberScheduled": 3, "numberReady": 2, "updatedNumberScheduled": 3, "numberAvailable": 2}
    });
    assert_eq!(
        names("daemonsets").iter().map(|c| c.0).collect::<Vec<_>>(),
        vec!["Name", "Desired", "Current", "Ready", "Up-to-date", "Available", "Node Selector", "Age", "Containers", "Images", "Selector"]
    );
    assert_eq!(
        cells_of("daemonsets", &ds),
        vec![json!("kube-proxy"), json!(3), json!(3), json!(2), json!(3), json!(2), json!("kubernetes.io/os=linux"), json!("5d"),
             json!("web,sidecar"), json!("nginx:1.25,envoy:v1.30"), json!("k8s-app=kube-proxy")]
    );
}

#[test]
fn stateful_set() {
    let sts = json!({
        "metadata": meta("db"),
        "spec": {"replicas": 3, "serviceName": "db", "selector": {"matchLabels": {"app": "db"}}, "template": template()},
        "status": {"replicas": 3, "readyReplicas": 3}
    });
    assert_eq!(
        cells_of("statefulsets", &sts),
        vec![json!("db"), json!("3/3"), json!("5d"), json!("web,sidecar"), json!("nginx:1.25,envoy:v1.30")]
    );
}

#[test]
fn replication_controller_job_cron_job() {
    let rc = json!({"metadata": meta("rc"), "spec": {"replicas": 2, "selector": {"app": "web"}, "template": template()},
                    "status": {"replicas": 2, "readyReplicas": 1}});
    assert_eq!(
        cells_of("replicationcontrollers", &rc),
        vec![json!("rc"), json!(2), json!(2), json!(1), json!("5d"), json!("web,sidecar"), json!("nginx:1.25,envoy:v1.30"), json!("app=web")]
    );

    let job = json!({
        "metadata": meta("pi"),
        "spec": {"completions": 3, "parallelism": 1, "selector": {"matchLabels": {"batch.kubernetes.io/controller-uid": "abc"}},
                 "template": {"spec": {"containers": [{"name": "pi", "image": "perl:5.34"}]}}},
        "status": {"succeeded": 1, "startTime": ago(150)}
    });
    assert_eq!(
        cells_of("jobs", &job),
        vec![json!("pi"), json!("Running"), json!("1/3"), json!("2m30s"), json!("5d"), json!("pi"), json!("perl:5.34"),
             json!("batch.kubernetes.io/controller-uid=abc")]
    );
    let done = json!({
        "metadata": meta("once"),
        "spec": {"parallelism": 4, "template": {"spec": {"containers": []}}},
        "status": {"succeeded": 1, "startTime": ago(100), "completionTime": ago(55),
                   "conditions": [{"type": "SuccessCriteriaMet", "status": "True"}, {"type": "Complete", "status": "True"}]}
    });
    let c = cells_of("jobs", &done);
    assert_eq!(c[1..4], [json!("Complete"), json!("1/1 of 4"), json!("45s")]);

    let cj = json!({
        "metadata": meta("hourly"),
        "spec": {"schedule": "0 * * * *", "jobTemplate": {"spec": {"template": {"spec": {"containers": [{"name": "c", "image": "busybox"}]}}}}},
        "status": {"active": [{"name": "hourly-1"}], "lastScheduleTime": ago(600)}
    });
    assert_eq!(
        cells_of("cronjobs", &cj),
        vec![json!("hourly"), json!("0 * * * *"), json!("<none>"), json!("False"), json!(1), json!("10m"), json!("5d"),
             json!("c"), json!("busybox"), json!("<none>")]
    );
}

// --- config & storage ------------------------------------------------------------------

#[test]
fn namespace_configmap_secret_serviceaccount() {
    let ns = json!({"metadata": {"name": "kube-system", "creationTimestamp": ago(90 * 86400)}, "status": {"phase": "Active"}});
    assert_eq!(cells_of("namespaces", &ns), vec![json!("kube-system"), json!("Active"), json!("90d")]);
    let mut gone = ns.clone();
    gone["status"]["phase"] = json!("Terminating");
    assert_eq!(cells_of("namespaces", &gone)[1], json!("Terminating"));

    let cm = json!({"metadata": meta("cfg"), "data": {"a": "1", "b": "2"}, "binaryData": {"c": "AA=="}});
    assert_eq!(cells_of("configmaps", &cm), vec![json!("cfg"), json!(3), json!("5d")]);
    assert_eq!(cells_of("configmaps", &json!({"metadata": meta("empty")})), vec![json!("empty"), json!(0), json!("5d")]);

    let secret = json!({"metadata": meta("tls"), "type": "kubernetes.io/tls", "data": {"tls.crt": "", "tls.key": ""}});
    assert_eq!(cells_of("secrets", &secret), vec![json!("tls"), json!("kubernetes.io/tls"), json!(2), json!("5d")]);
    assert_eq!(names("secrets").iter().map(|c| c.0).collect::<Vec<_>>(), vec!["Name", "Type", "Data", "Age"]);

    let sa = json!({"metadata": meta("default"), "secrets": [{"name": "default-token"}]});
    assert_eq!(cells_of("serviceaccounts", &sa), vec![json!("default"), json!(1), json!("5d")]);
    assert_eq!(cells_of("serviceaccounts", &json!({"metadata": meta("x")}))[1], json!(0));
}

#[test]
fn persistent_volume() {
    let pv = json!({
        "metadata": meta("pv-data"),
        "spec": {"capacity": {"storage": "10240Mi"}, "accessModes": ["ReadWriteMany", "ReadWriteOnce"],
                 "persistentVolumeReclaimPolicy": "Delete", "storageClassName": "fast",
                 "claimRef": {"kind": "PersistentVolumeClaim", "namespace": "apps", "name": "data"},
                 "volumeMode": "Filesystem", "hostPath": {"path": "/data"}},
        "status": {"phase": "Bound"}
    });
    assert_eq!(
        names("persistentvolumes").iter().map(|c| (c.0, c.2)).collect::<Vec<_>>(),
        vec![("Name", 0), ("Capacity", 0), ("Access Modes", 0), ("Reclaim Policy", 0), ("Status", 0), ("Claim", 0),
             ("StorageClass", 0), ("VolumeAttributesClass", 0), ("Reason", 0), ("Age", 0), ("VolumeMode", 1)]
    );
    assert_eq!(
        cells_of("persistentvolumes", &pv),
        vec![json!("pv-data"), json!("10Gi"), json!("RWO,RWX"), json!("Delete"), json!("Bound"), json!("apps/data"),
             json!("fast"), json!("<unset>"), json!(""), json!("5d"), json!("Filesystem")]
    );
    let mut released = pv.clone();
    released["metadata"]["deletionTimestamp"] = json!(ago(1));
    released["metadata"]["annotations"] = json!({"volume.beta.kubernetes.io/storage-class": "legacy"});
    released["spec"]["accessModes"] = json!(["ReadWriteOncePod", "ReadOnlyMany"]);
    released["spec"]["volumeMode"] = json!("Block");
    released["spec"]["volumeAttributesClassName"] = json!("gold");
    let c = cells_of("persistentvolumes", &released);
    assert_eq!(c[2], json!("ROX,RWOP"));
    assert_eq!(c[4], json!("Terminating"));
    assert_eq!(c[6], json!("legacy"));
    assert_eq!(c[7], json!("gold"));
    assert_eq!(c[10], json!("Block"));
}

#[test]
fn persistent_volume_claim() {
    let bound = json!({
        "metadata": meta("data"),
        "spec": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "5Gi"}},
                 "storageClassName": "standard", "volumeName": "pvc-1234", "volumeMode": "Filesystem"},
        "status": {"phase": "Bound", "accessModes": ["ReadWriteOnce"], "capacity": {"storage": "8Gi"}}
    });
    assert_eq!(
        cells_of("persistentvolumeclaims", &bound),
        vec![json!("data"), json!("Bound"), json!("pvc-1234"), json!("8Gi"), json!("RWO"), json!("standard"),
             json!("<unset>"), json!("5d"), json!("Filesystem")]
    );
    let pending = json!({
        "metadata": meta("wait"),
        "spec": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "5Gi"}}},
        "status": {"phase": "Pending"}
    });
    assert_eq!(
        cells_of("persistentvolumeclaims", &pending),
        vec![json!("wait"), json!("Pending"), json!(""), json!(""), json!(""), json!(""), json!("<unset>"), json!("5d"), json!("Filesystem")]
    );
}

#[test]
fn storage_class() {
    let sc = json!({
        "metadata": {"name": "standard", "creationTimestamp": ago(3 * 86400),
                     "annotations": {"storageclass.kubernetes.io/is-default-class": "true"}},
        "provisioner": "rancher.io/local-path", "reclaimPolicy": "Delete", "volumeBindingMode": "WaitForFirstConsumer"
    });
    assert_eq!(
        names("storageclasses").iter().map(|c| c.0).collect::<Vec<_>>(),
        vec!["Name", "Provisioner", "ReclaimPolicy", "VolumeBindingMode", "AllowVolumeExpansion", "Age"]
    );
    assert_eq!(
        cells_of("storageclasses", &sc),
        vec![json!("standard (default)"), json!("rancher.io/local-path"), json!("Delete"), json!("WaitForFirstConsumer"), json!(false), json!("3d")]
    );
    let plain = json!({"metadata": {"name": "fast", "creationTimestamp": ago(60)}, "provisioner": "ebs.csi.aws.com",
                       "reclaimPolicy": "Retain", "allowVolumeExpansion": true});
    assert_eq!(
        cells_of("storageclasses", &plain),
        vec![json!("fast"), json!("ebs.csi.aws.com"), json!("Retain"), json!("Immediate"), json!(true), json!("60s")]
    );
}

#[test]
fn csi_driver_csi_node_volume_attachment() {
    let driver = json!({"metadata": {"name": "ebs.csi.aws.com", "creationTimestamp": ago(86400)},
                        "spec": {"attachRequired": true, "podInfoOnMount": false, "volumeLifecycleModes": ["Persistent", "Ephemeral"],
                                 "tokenRequests": [{"audience": "sts.amazonaws.com"}, {"audience": "vault"}]}});
    assert_eq!(
        names("csidrivers").iter().map(|c| (c.0, c.1)).collect::<Vec<_>>(),
        vec![("Name", "string"), ("AttachRequired", "boolean"), ("PodInfoOnMount", "boolean"), ("StorageCapacity", "boolean"),
             ("TokenRequests", "string"), ("RequiresRepublish", "boolean"), ("Modes", "string"), ("Age", "string")]
    );
    assert_eq!(
        cells_of("csidrivers", &driver),
        vec![json!("ebs.csi.aws.com"), json!(true), json!(false), json!(false), json!("sts.amazonaws.com,vault"), json!(false),
             json!("Persistent,Ephemeral"), json!("24h")]
    );
    let minimal = json!({"metadata": {"name": "d", "creationTimestamp": ago(86400)}, "spec": {}});
    assert_eq!(
        cells_of("csidrivers", &minimal)[1..7],
        [json!(true), json!(false), json!(false), json!("<unset>"), json!(false), json!("Persistent")]
    );

    let node = json!({"metadata": {"name": "node-1", "creationTimestamp": ago(7200)},
                      "spec": {"drivers": [{"name": "ebs.csi.aws.com", "nodeID": "i-123"}]}});
    assert_eq!(cells_of("csinodes", &node), vec![json!("node-1"), json!(1), json!("120m")]);

    let va = json!({"metadata": {"name": "csi-abc", "creationTimestamp": ago(3600)},
                    "spec": {"attacher": "ebs.csi.aws.com", "nodeName": "node-1", "source": {"persistentVolumeName": "pvc-1"}},
                    "status": {"attached": true}});
    assert_eq!(
        names("volumeattachments"),
        vec![("Name", "string", 0), ("Attacher", "string", 0), ("PV", "string", 0), ("Node", "string", 0),
             ("Attached", "boolean", 0), ("Age", "string", 0)]
    );
    assert_eq!(
        cells_of("volumeattachments", &va),
        vec![json!("csi-abc"), json!("ebs.csi.aws.com"), json!("pvc-1"), json!("node-1"), json!(true), json!("60m")]
    );
}

// --- networking & discovery ------------------------------------------------------------

#[test]
fn endpoints() {
    let ep = json!({
        "metadata": meta("web"),
        "subsets": [
            {"addresses": [{"ip": "10.0.0.1"}, {"ip": "10.0.0.2"}], "notReadyAddresses": [{"ip": "10.0.0.9"}],
             "ports": [{"name": "http", "port": 80}, {"name": "https", "port": 443}]},
            {"addresses": [{"ip": "10.0.1.1"}], "ports": [{"port": 8080}]}
        ]
    });
    assert_eq!(
        cells_of("endpoints", &ep),
        vec![json!("web"), json!("10.0.0.1:80,10.0.0.2:80,10.0.0.1:443 + 2 more..."), json!("5d")]
    );
    let three = json!({"metadata": meta("x"), "subsets": [{"addresses": [{"ip": "fd00::1"}, {"ip": "10.0.0.2"}, {"ip": "10.0.0.3"}], "ports": [{"port": 53}]}]});
    assert_eq!(cells_of("endpoints", &three)[1], json!("[fd00::1]:53,10.0.0.2:53,10.0.0.3:53"));
    let headless = json!({"metadata": meta("h"), "subsets": [{"addresses": [{"ip": "10.0.0.5"}]}]});
    assert_eq!(cells_of("endpoints", &headless)[1], json!("10.0.0.5"));
    assert_eq!(cells_of("endpoints", &json!({"metadata": meta("none")}))[1], json!("<none>"));
    let not_ready = json!({"metadata": meta("nr"), "subsets": [{"notReadyAddresses": [{"ip": "10.0.0.5"}], "ports": [{"port": 80}]}]});
    assert_eq!(cells_of("endpoints", &not_ready)[1], json!(""));
}

#[test]
fn endpoint_slices() {
    let es = json!({
        "metadata": meta("web-abc12"),
        "addressType": "IPv4",
        "ports": [{"name": "http", "port": 80, "protocol": "TCP"}, {"name": "metrics"}, {}, {"port": 9090}],
        "endpoints": [{"addresses": ["10.0.0.1"]}, {"addresses": ["10.0.0.2", "10.0.0.3"]}, {"addresses": ["10.0.0.4"]}]
    });
    assert_eq!(
        cells_of("endpointslices", &es),
        vec![json!("web-abc12"), json!("IPv4"), json!("80,metrics,* + 1 more..."), json!("10.0.0.1,10.0.0.2,10.0.0.3 + 1 more..."), json!("5d")]
    );
    let empty = json!({"metadata": meta("e"), "addressType": "IPv6", "endpoints": []});
    assert_eq!(cells_of("endpointslices", &empty)[1..4], [json!("IPv6"), json!("<unset>"), json!("<unset>")]);
}

#[test]
fn ingress_and_ingress_class_and_network_policy() {
    let ing = json!({
        "metadata": meta("site"),
        "spec": {"ingressClassName": "nginx", "tls": [{"hosts": ["a.example.com"]}],
                 "rules": [{"host": "a.example.com"}, {"host": "b.example.com"}, {}, {"host": "c.example.com"}, {"host": "d.example.com"}]},
        "status": {"loadBalancer": {"ingress": [{"ip": "192.0.2.1"}]}}
    });
    assert_eq!(
        cells_of("ingresses", &ing),
        vec![json!("site"), json!("nginx"), json!("a.example.com,b.example.com,c.example.com + 2 more..."), json!("192.0.2.1"),
             json!("80, 443"), json!("5d")]
    );
    let catch_all = json!({"metadata": meta("all"), "spec": {"defaultBackend": {"service": {"name": "x"}}}});
    assert_eq!(cells_of("ingresses", &catch_all)[1..5], [json!("<none>"), json!("*"), json!(""), json!("80")]);

    let class = json!({"metadata": meta("nginx"), "spec": {"controller": "k8s.io/ingress-nginx",
                       "parameters": {"apiGroup": "k8s.example.com", "kind": "IngressParameters", "name": "external-lb"}}});
    assert_eq!(
        cells_of("ingressclasses", &class),
        vec![json!("nginx"), json!("k8s.io/ingress-nginx"), json!("IngressParameters.k8s.example.com/external-lb"), json!("5d")]
    );

    let np = json!({"metadata": meta("deny"), "spec": {"podSelector": {}, "policyTypes": ["Ingress"]}});
    assert_eq!(cells_of("networkpolicies", &np), vec![json!("deny"), json!("<none>"), json!("5d")]);
}

// --- events ----------------------------------------------------------------------------

#[test]
fn core_event() {
    let ev = json!({
        "apiVersion": "v1", "kind": "Event",
        "metadata": meta("web-1.17c0a1"),
        "involvedObject": {"kind": "Pod", "namespace": "default", "name": "web-1", "fieldPath": "spec.containers{web}"},
        "reason": "Pulled", "message": "Successfully pulled image \"nginx\"\n", "type": "Normal",
        "source": {"component": "kubelet", "host": "node-1"},
        "firstTimestamp": ago(600), "lastTimestamp": ago(90), "count": 3
    });
    assert_eq!(
        names("events").iter().map(|c| (c.0, c.2)).collect::<Vec<_>>(),
        vec![("Last Seen", 0), ("Type", 0), ("Reason", 0), ("Object", 0), ("Subobject", 1), ("Source", 1), ("Message", 0),
             ("First Seen", 1), ("Count", 1), ("Name", 1)]
    );
    assert_eq!(
        cells_of("events", &ev),
        vec![json!("90s"), json!("Normal"), json!("Pulled"), json!("pod/web-1"), json!("spec.containers{web}"),
             json!("kubelet, node-1"), json!("Successfully pulled image \"nginx\""), json!("10m"), json!(3), json!("web-1.17c0a1")]
    );
}

#[test]
fn new_style_events() {
    // A core/v1 Event written by an events.k8s.io client: eventTime and series, no first/last timestamps.
    let ev = json!({
        "metadata": meta("e1"),
        "involvedObject": {"kind": "Node", "name": "node-1"},
        "reason": "Starting", "message": "", "type": "Normal",
        "eventTime": "2024-05-01T11:50:00.123456Z",
        "series": {"count": 4, "lastObservedTime": "2024-05-01T11:59:00.000000Z"},
        "reportingComponent": "kube-proxy", "reportingInstance": "kube-proxy-node-1", "source": {}
    });
    assert_eq!(
        cells_of("events", &ev),
        vec![json!("60s"), json!("Normal"), json!("Starting"), json!("node/node-1"), json!(""),
             json!("kube-proxy, kube-proxy-node-1"), json!(""), json!("9m59s"), json!(4), json!("e1")]
    );
    // The events.k8s.io/v1 shape of a singleton event.
    let ev = json!({
        "apiVersion": "events.k8s.io/v1", "kind": "Event",
        "metadata": meta("e2"),
        "regarding": {"kind": "Deployment", "name": "web"},
        "reason": "ScalingReplicaSet", "note": " Scaled up replica set web-1 to 3 ", "type": "Normal",
        "eventTime": "2024-05-01T11:58:00.000000Z",
        "reportingController": "deployment-controller", "reportingInstance": ""
    });
    assert_eq!(
        cells_of("events", &ev),
        vec![json!("2m"), json!("Normal"), json!("ScalingReplicaSet"), json!("deployment/web"), json!(""),
             json!("deployment-controller"), json!("Scaled up replica set web-1 to 3"), json!("2m"), json!(1), json!("e2")]
    );
}

// --- other kinds -----------------------------------------------------------------------

#[test]
fn lease() {
    let lease = json!({"metadata": meta("kube-scheduler"), "spec": {"holderIdentity": "cp-1_5a7c", "leaseDurationSeconds": 15}});
    assert_eq!(cells_of("leases", &lease), vec![json!("kube-scheduler"), json!("cp-1_5a7c"), json!("5d")]);
    assert_eq!(cells_of("leases", &json!({"metadata": meta("free"), "spec": {}})), vec![json!("free"), json!(""), json!("5d")]);
}

#[test]
fn rbac_bindings() {
    let rb = json!({
        "metadata": meta("admins"),
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "admin"},
        "subjects": [{"kind": "User", "name": "alice"}, {"kind": "Group", "name": "ops"}, {"kind": "User", "name": "bob"},
                     {"kind": "ServiceAccount", "namespace": "ci", "name": "deployer"}]
    });
    let want = vec![json!("admins"), json!("ClusterRole/admin"), json!("5d"), json!("alice, bob"), json!("ops"), json!("ci/deployer")];
    assert_eq!(cells_of("rolebindings", &rb), want);
    assert_eq!(cells_of("clusterrolebindings", &rb), want);
    assert_eq!(names("clusterrolebindings")[3], ("Users", "string", 1));
}

#[test]
fn misc_printers() {
    let pc = json!({"metadata": meta("high"), "value": 1000000, "globalDefault": false});
    assert_eq!(
        cells_of("priorityclasses", &pc),
        vec![json!("high"), json!(1000000), json!(false), json!("5d"), json!("PreemptLowerPriority")]
    );
    let rc = json!({"metadata": meta("gvisor"), "handler": "runsc"});
    assert_eq!(cells_of("runtimeclasses", &rc), vec![json!("gvisor"), json!("runsc"), json!("5d")]);
    let wh = json!({"metadata": meta("policy"), "webhooks": [{"name": "a.example.com"}, {"name": "b.example.com"}]});
    assert_eq!(cells_of("validatingwebhookconfigurations", &wh), vec![json!("policy"), json!(2), json!("5d")]);
    assert_eq!(cells_of("mutatingwebhookconfigurations", &wh)[1], json!(2));

    let cr = json!({"metadata": {"name": "web-6d9f", "creationTimestamp": ago(30),
                    "ownerReferences": [{"apiVersion": "apps/v1", "kind": "StatefulSet", "name": "web", "controller": true}]},
                    "revision": 2});
    assert_eq!(cells_of("controllerrevisions", &cr), vec![json!("web-6d9f"), json!("statefulset.apps/web"), json!(2), json!("30s")]);

    let pdb = json!({"metadata": meta("web"), "spec": {"minAvailable": "50%"}, "status": {"disruptionsAllowed": 1}});
    assert_eq!(cells_of("poddisruptionbudgets", &pdb), vec![json!("web"), json!("50%"), json!("N/A"), json!(1), json!("5d")]);
    let pdb2 = json!({"metadata": meta("db"), "spec": {"maxUnavailable": 1}, "status": {}});
    assert_eq!(cells_of("poddisruptionbudgets", &pdb2)[1..4], [json!("N/A"), json!("1"), json!(0)]);

    let pt = json!({"metadata": meta("tpl"), "template": template()});
    assert_eq!(
        cells_of("podtemplates", &pt),
        vec![json!("tpl"), json!("web,sidecar"), json!("nginx:1.25,envoy:v1.30"), json!("app=web")]
    );

    let rq = json!({"metadata": meta("quota"),
                    "status": {"hard": {"requests.cpu": "2", "limits.memory": "4096Mi", "pods": "10", "limits.cpu": "4"},
                               "used": {"requests.cpu": "500m", "limits.memory": "1Gi", "pods": "3"}}});
    assert_eq!(
        cells_of("resourcequotas", &rq),
        vec![json!("quota"), json!("pods: 3/10, requests.cpu: 500m/2"), json!("limits.cpu: 0/4, limits.memory: 1Gi/4Gi"), json!("5d")]
    );

    let csr = json!({"metadata": meta("csr-1"),
                     "spec": {"signerName": "kubernetes.io/kube-apiserver-client", "username": "alice", "expirationSeconds": 86400},
                     "status": {"conditions": [{"type": "Approved", "status": "True"}], "certificate": "LS0t"}});
    assert_eq!(
        cells_of("certificatesigningrequests", &csr),
        vec![json!("csr-1"), json!("5d"), json!("kubernetes.io/kube-apiserver-client"), json!("alice"), json!("24h"), json!("Approved,Issued")]
    );

    let cap = json!({"metadata": meta("csisc-1"), "storageClassName": "fast", "capacity": "107374182400"});
    assert_eq!(cells_of("csistoragecapacities", &cap), vec![json!("csisc-1"), json!("fast"), json!("107374182400")]);
    assert_eq!(cells_of("csistoragecapacities", &json!({"metadata": meta("c"), "storageClassName": "x"}))[2], json!("<unset>"));

    let cs = json!({"metadata": {"name": "etcd-0"}, "conditions": [{"type": "Healthy", "status": "True", "message": "ok"}]});
    assert_eq!(cells_of("componentstatuses", &cs), vec![json!("etcd-0"), json!("Healthy"), json!("ok"), json!("")]);
}

#[test]
fn default_convertor_for_kinds_without_printer() {
    assert!(!has_printer("roles"));
    assert!(has_printer("pods"));
    assert_eq!(names("roles"), vec![("Name", "string", 0), ("Created At", "date", 0)]);
    assert_eq!(columns("roles")[0].format, "name");
    let role = json!({"metadata": {"name": "reader", "creationTimestamp": "2024-04-01T08:30:00Z"}});
    assert_eq!(cells_of("roles", &role), vec![json!("reader"), json!("2024-04-01T08:30:00Z")]);
    let micro = json!({"metadata": {"name": "x", "creationTimestamp": "2024-04-01T08:30:00.5+02:00"}});
    assert_eq!(cells_of("widgets", &micro)[1], json!("2024-04-01T06:30:00Z"));
    assert_eq!(cells_of("widgets", &json!({"metadata": {"name": "y"}}))[1], json!("0001-01-01T00:00:00Z"));
}

// --- the Table -------------------------------------------------------------------------

#[test]
fn table_with_metadata_objects() {
    let pods = vec![running_pod()];
    let t = table("pods", &pods, "Metadata", json!({"resourceVersion": "1234", "continue": "tok", "remainingItemCount": 7}), now());
    assert_eq!(t["kind"], "Table");
    assert_eq!(t["apiVersion"], "meta.k8s.io/v1");
    assert_eq!(t["metadata"], json!({"resourceVersion": "1234", "continue": "tok", "remainingItemCount": 7}));
    let cols = t["columnDefinitions"].as_array().unwrap();
    assert_eq!(cols.len(), 9);
    assert_eq!(
        cols[0],
        json!({"name": "Name", "type": "string", "format": "name", "description": D_NAME, "priority": 0})
    );
    assert_eq!(cols[5]["priority"], 1);
    let rows = t["rows"].as_array().unwrap();
    assert_eq!(rows.len(), 1);
    assert_eq!(rows[0]["cells"][2], "Running");
    assert!(rows[0].get("conditions").is_none());
    assert_eq!(
        rows[0]["object"],
        json!({"kind": "PartialObjectMetadata", "apiVersion": "meta.k8s.io/v1", "metadata": running_pod()["metadata"]})
    );
    // The default includeObject is Metadata.
    assert_eq!(table("pods", &pods, "", json!({}), now())["rows"][0]["object"]["kind"], "PartialObjectMetadata");
}

#[test]
fn table_with_none_and_object() {
    let objs = vec![json!({"metadata": meta("a"), "data": {"k": "v"}}), json!({"metadata": meta("b")})];
    let none = table("configmaps", &objs, "None", json!({"resourceVersion": "9"}), now());
    assert_eq!(none["metadata"], json!({"resourceVersion": "9"}));
    let rows = none["rows"].as_array().unwrap();
    assert_eq!(rows.len(), 2);
    assert_eq!(rows[0], json!({"cells": ["a", 1, "5d"], "object": null}));
    assert_eq!(rows[1], json!({"cells": ["b", 0, "5d"], "object": null}));

    let full = table("configmaps", &objs, "Object", json!({"resourceVersion": "", "continue": ""}), now());
    assert_eq!(full["metadata"], json!({}));
    assert_eq!(full["rows"][0]["object"], objs[0]);
    assert_eq!(
        full["columnDefinitions"].as_array().unwrap().iter().map(|c| c["name"].as_str().unwrap()).collect::<Vec<_>>(),
        vec!["Name", "Data", "Age"]
    );

    let empty = table("nodes", &[], "Metadata", json!({"resourceVersion": "3"}), now());
    assert_eq!(empty["rows"], json!([]));
    assert_eq!(empty["columnDefinitions"].as_array().unwrap().len(), 10);
}

#[test]
fn table_marks_finished_pods() {
    let mut pod = running_pod();
    pod["status"]["phase"] = json!("Succeeded");
    let t = table("pods", &[pod.clone()], "None", json!({}), now());
    assert_eq!(
        t["rows"][0]["conditions"],
        json!([{"type": "Completed", "status": "True", "reason": "Succeeded", "message": "The pod has completed successfully."}])
    );
    pod["status"]["phase"] = json!("Failed");
    let t = table("pods", &[pod], "None", json!({}), now());
    assert_eq!(t["rows"][0]["conditions"][0]["reason"], "Failed");
    assert_eq!(t["rows"][0]["conditions"][0]["message"], "The pod failed.");
}

#[test]
fn include_object_values() {
    for v in ["", "None", "Metadata", "Object"] {
        assert!(valid_include_object(v));
    }
    assert!(!valid_include_object("object"));
}

#[test]
fn volume_snapshots_print_the_crds_printer_columns() {
    let cols: Vec<&str> = columns("volumesnapshots").iter().map(|c| c.name).collect();
    assert_eq!(
        cols,
        ["Name", "ReadyToUse", "SourcePVC", "SourceSnapshotContent", "RestoreSize", "SnapshotClass", "SnapshotContent", "CreationTime", "Age"]
    );
    let s = json!({
        "metadata": meta("s1"),
        "spec": {"source": {"persistentVolumeClaimName": "data"}, "volumeSnapshotClassName": "loop"},
        "status": {"boundVolumeSnapshotContentName": "snapcontent-u-1", "readyToUse": true, "restoreSize": "64Mi",
                   "creationTime": ago(3600)},
    });
    assert_eq!(
        cells_of("volumesnapshots", &s),
        vec![json!("s1"), json!(true), json!("data"), Value::Null, json!("64Mi"), json!("loop"), json!("snapcontent-u-1"), json!("60m"), json!("5d")]
    );
    // Nothing known yet: empty cells, not "<none>" (the CRD convertor's nil).
    let fresh = json!({"metadata": meta("s2"), "spec": {"source": {"volumeSnapshotContentName": "imported"}}});
    let c = cells_of("volumesnapshots", &fresh);
    assert_eq!((&c[1], &c[2], &c[3], &c[7]), (&Value::Null, &Value::Null, &json!("imported"), &Value::Null));

    let content = json!({
        "metadata": meta("snapcontent-u-1"),
        "spec": {"volumeSnapshotRef": {"name": "s1", "namespace": "default"}, "deletionPolicy": "Delete",
                 "driver": "loop.csi.ferro.dev", "volumeSnapshotClassName": "loop", "source": {"volumeHandle": "loop-1"}},
        "status": {"readyToUse": true, "restoreSize": 67_108_864},
    });
    assert_eq!(
        cells_of("volumesnapshotcontents", &content),
        vec![json!("snapcontent-u-1"), json!(true), json!(67_108_864), json!("Delete"), json!("loop.csi.ferro.dev"), json!("loop"), json!("s1"), json!("default"), json!("5d")]
    );
    let class = json!({"metadata": meta("loop"), "driver": "loop.csi.ferro.dev", "deletionPolicy": "Retain"});
    assert_eq!(cells_of("volumesnapshotclasses", &class), vec![json!("loop"), json!("loop.csi.ferro.dev"), json!("Retain"), json!("5d")]);
    assert_eq!(columns("volumesnapshotcontents").iter().find(|c| c.name == "RestoreSize").map(|c| c.type_), Some("integer"));
}
