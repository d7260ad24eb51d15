//! ferro-agent running pods in the lab: real ferro-control-plane (scheduler included), real
//! containerd 1.6 + runc, real ferro-cni, driven by kubectl. Needs root and the lab's Debian
//! packages; fails, never skips, without them.
#![allow(clippy::unwrap_used)]

mod lab;

use std::time::Duration;

use lab::{Lab, BUSYBOX, NODE};
use serde_json::Value;

const MIN: Duration = Duration::from_secs(60);

fn phase(p: &Value) -> &str {
    p["status"]["phase"].as_str().unwrap_or("")
}

fn condition<'a>(p: &'a Value, t: &str) -> Option<&'a str> {
    p["status"]["conditions"].as_array()?.iter().find(|c| c["type"] == t)?["status"].as_str()
}

fn container_status<'a>(p: &'a Value, name: &str) -> Option<&'a Value> {
    p["status"]["containerStatuses"].as_array()?.iter().find(|c| c["name"] == name)
}

fn init_status<'a>(p: &'a Value, name: &str) -> Option<&'a Value> {
    p["status"]["initContainerStatuses"].as_array()?.iter().find(|c| c["name"] == name)
}

fn waiting_reason<'a>(p: &'a Value, name: &str) -> Option<&'a str> {
    container_status(p, name)?["state"]["waiting"]["reason"].as_str()
}

fn pod_yaml(name: &str, body: &str) -> String {
    format!("apiVersion: v1\nkind: Pod\nmetadata:\n  name: {name}\nspec:\n  terminationGracePeriodSeconds: 5\n{body}")
}

/// Pods run, get addresses on the node's pod CIDR, reach each other, run init containers in
/// order, and report the upstream statuses.
#[test]
#[ignore = "privileged: needs root and containerd; run by scripts/test.sh"]
fn pods_run_network_init_and_status() {
    let lab = Lab::start("run");
    // A web server pod.
    lab.apply(&pod_yaml(
        "web",
        &format!(
            "  containers:\n  - name: web\n    image: {BUSYBOX}\n    command: [\"sh\", \"-c\", \"echo web starting; mkdir -p /www && echo hello-from-web > /www/index.html && exec httpd -f -p 8080 -h /www\"]\n    ports:\n    - containerPort: 8080\n"
        ),
    ));
    let web = lab.wait_pod("web", "Running and Ready", MIN, |p| phase(p) == "Running" && condition(p, "Ready") == Some("True"));
    let ip = web["status"]["podIP"].as_str().unwrap().to_string();
    assert!(ip.starts_with("10.88.0."), "pod IP {ip} not in the node's pod CIDR");
    assert_eq!(web["spec"]["nodeName"], NODE);
    assert_eq!(web["status"]["hostIP"], "127.0.0.1");
    assert_eq!(web["status"]["qosClass"], "BestEffort");
    let cs = container_status(&web, "web").unwrap();
    assert!(cs["containerID"].as_str().unwrap().starts_with("containerd://"), "{cs}");
    assert_eq!(cs["ready"], true);
    // The ServiceAccount admission gave the pod its kube-api-access volume; the agent filled
    // it: a token bound to the pod (from TokenRequest), the cluster CA and the namespace.
    let sa_dir = "/var/run/secrets/kubernetes.io/serviceaccount";
    assert_eq!(lab.kubectl_ok(&["exec", "web", "--", "cat", &format!("{sa_dir}/namespace")]), "default");
    let ca = lab.kubectl_ok(&["exec", "web", "--", "cat", &format!("{sa_dir}/ca.crt")]);
    let published = lab.kubectl_ok(&["get", "configmap", "kube-root-ca.crt", "-o", "jsonpath={.data.ca\\.crt}"]);
    assert!(ca.starts_with("-----BEGIN CERTIFICATE-----") && ca == published, "{ca}");
    let token = lab.kubectl_ok(&["exec", "web", "--", "cat", &format!("{sa_dir}/token")]);
    let review = serde_json::json!({"apiVersion": "authentication.k8s.io/v1", "kind": "TokenReview", "spec": {"token": token}});
    let out = lab.kubectl_stdin(&["create", "--validate=false", "-f", "-", "-o", "json"], &review.to_string());
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let status = &serde_json::from_slice::<serde_json::Value>(&out.stdout).unwrap()["status"];
    assert_eq!(status["user"]["username"], "system:serviceaccount:default:default", "{status}");
    assert_eq!(status["user"]["extra"]["authentication.kubernetes.io/pod-name"], serde_json::json!(["web"]), "{status}");
    assert_eq!(status["user"]["extra"]["authentication.kubernetes.io/node-name"], serde_json::json!([NODE]), "{status}");
    assert_eq!(cs["started"], true);
    assert_eq!(cs["restartCount"], 0);
    assert!(cs["state"]["running"]["startedAt"].is_string(), "{cs}");
    for t in ["PodScheduled", "Initialized", "ContainersReady", "PodReadyToStartContainers"] {
        assert_eq!(condition(&web, t), Some("True"), "{t}: {}", web["status"]);
    }

    // Logs and exec through kubectl -> ferro-control-plane -> the agent's :10250 -> containerd.
    let logs = lab.kubectl_ok(&["logs", "web"]);
    assert!(logs.contains("web starting"), "kubectl logs: {logs:?}");
    let prev = lab.kubectl(&["logs", "web", "--previous"]);
    let err = String::from_utf8_lossy(&prev.stderr);
    assert!(!prev.status.success() && err.contains("previous terminated container \"web\" in pod \"web\" not found"), "{err}");
    let page = lab.kubectl_ok(&["exec", "web", "--", "cat", "/www/index.html"]);
    assert_eq!(page.trim(), "hello-from-web");

    // The lab's busybox image is shaped as the one users know (no entrypoint, Cmd ["sh"], every
    // applet): `kubectl run -i -- sh -c ...` runs the command with kubectl's stdin attached
    // (the command waits for its input, so it is still running when kubectl attaches), and
    // `kubectl cp` finds tar.
    let run = lab.kubectl_stdin(
        &["run", "hi", "-i", "--restart=Never", "--image", BUSYBOX, "--", "sh", "-c", "read x; echo hi-from-run-$x"],
        "stdin\n",
    );
    let out = String::from_utf8_lossy(&run.stdout);
    assert!(
        run.status.success() && out.contains("hi-from-run-stdin"),
        "kubectl run -i: {out:?} {:?}\nlogs: {}\npod: {}",
        String::from_utf8_lossy(&run.stderr),
        String::from_utf8_lossy(&lab.kubectl(&["logs", "hi"]).stdout),
        lab.kubectl_ok(&["get", "pod", "hi", "-o", "json"])
    );
    let local = lab.dir.path().join("cp-in.txt");
    std::fs::write(&local, "copied by kubectl cp\n").unwrap();
    lab.kubectl_ok(&["cp", local.to_str().unwrap(), "web:/tmp/cp-in.txt"]);
    assert_eq!(lab.kubectl_ok(&["exec", "web", "--", "cat", "/tmp/cp-in.txt"]), "copied by kubectl cp\n");
    let back = lab.dir.path().join("cp-out.txt");
    lab.kubectl_ok(&["cp", "web:/tmp/cp-in.txt", back.to_str().unwrap()]);
    assert_eq!(std::fs::read_to_string(&back).unwrap(), "copied by kubectl cp\n");
    lab.kubectl_ok(&["delete", "pod", "hi", "--wait=false"]);

    // A second pod fetches from the first over the bridge and completes.
    lab.apply(&pod_yaml(
        "client",
        &format!(
            "  restartPolicy: Never\n  containers:\n  - name: get\n    image: {BUSYBOX}\n    command: [\"sh\", \"-c\", \"wget -q -O - http://{ip}:8080/ | grep -q hello-from-web && echo fetched > /dev/termination-log\"]\n"
        ),
    ));
    let client = lab.wait_pod("client", "Succeeded", MIN, |p| matches!(phase(p), "Succeeded" | "Failed"));
    assert_eq!(phase(&client), "Succeeded", "{}", client["status"]);
    let cs = container_status(&client, "get").unwrap();
    assert_eq!(cs["state"]["terminated"]["reason"], "Completed");
    assert_eq!(cs["state"]["terminated"]["exitCode"], 0);
    assert_eq!(cs["state"]["terminated"]["message"].as_str().map(str::trim), Some("fetched"), "{cs}");
    assert_eq!(condition(&client, "Ready"), Some("False"));

    // Init containers run in order, before the app container, sharing an emptyDir.
    lab.apply(&pod_yaml(
        "init",
        &format!(
            "  restartPolicy: Never\n  volumes:\n  - name: work\n    emptyDir: {{}}\n  initContainers:\n  - name: one\n    image: {BUSYBOX}\n    command: [\"sh\", \"-c\", \"echo one >> /work/log\"]\n    volumeMounts: [{{name: work, mountPath: /work}}]\n  - name: two\n    image: {BUSYBOX}\n    command: [\"sh\", \"-c\", \"echo two >> /work/log\"]\n    volumeMounts: [{{name: work, mountPath: /work}}]\n  containers:\n  - name: check\n    image: {BUSYBOX}\n    command: [\"sh\", \"-c\", \"test \\\"$(cat /work/log | tr '\\\\n' ' ')\\\" = 'one two '\"]\n    volumeMounts: [{{name: work, mountPath: /work}}]\n"
        ),
    ));
    let init = lab.wait_pod("init", "finished", MIN, |p| matches!(phase(p), "Succeeded" | "Failed"));
    assert_eq!(phase(&init), "Succeeded", "{}", init["status"]);
    let inits = init["status"]["initContainerStatuses"].as_array().unwrap();
    assert_eq!(inits.len(), 2);
    for i in inits {
        assert_eq!(i["state"]["terminated"]["reason"], "Completed", "{i}");
    }
    let one_done = inits[0]["state"]["terminated"]["finishedAt"].as_str().unwrap();
    let two_start = inits[1]["state"]["terminated"]["startedAt"].as_str().unwrap();
    assert!(one_done <= two_start, "init two started ({two_start}) before one finished ({one_done})");

    // Deleting: containers stop, the pod object goes away, the sandbox and IP are released.
    lab.kubectl_ok(&["delete", "pod", "web", "client", "init", "--wait=true", "--timeout=60s"]);
    lab.wait_nothing_left();
}

/// Sidecar containers (init containers with restartPolicy Always): a sidecar serving on the pod's
/// loopback, started (startup probe) before the next init container, which needs it; Running and
/// Ready with the sidecar running next to the app container; a sidecar that exits is restarted
/// while the app container keeps running; deletion stops the app container before the sidecar.
/// A restartPolicy Never pod whose app container completes: the sidecar is stopped (after its
/// preStop hook), Succeeded.
#[test]
#[ignore = "privileged: needs root and containerd; run by scripts/test.sh"]
fn sidecar_containers() {
    let lab = Lab::start("side");
    // The sidecar serves /shared over http on 8081 and writes /shared/s once it answers.
    let sidecar = format!(
        "  - name: side\n    image: {BUSYBOX}\n    restartPolicy: Always\n    command: [\"sh\", \"-c\", \"trap 'exit 0' TERM; echo idx > /shared/index.html; httpd -f -p 8081 -h /shared & until wget -q -O /dev/null http://127.0.0.1:8081/; do sleep 0.2; done; echo up > /shared/s; wait\"]\n    startupProbe:\n      exec: {{command: [cat, /shared/s]}}\n      periodSeconds: 1\n      failureThreshold: 30\n    volumeMounts: [{{name: shared, mountPath: /shared}}]\n"
    );
    let app = "    command: [\"sh\", \"-c\", \"trap 'exit 0' TERM; sleep 3600 & wait\"]\n";
    lab.apply(&pod_yaml(
        "sc",
        &format!(
            "  volumes:\n  - name: shared\n    emptyDir: {{}}\n  initContainers:\n{sidecar}  - name: check\n    image: {BUSYBOX}\n    command: [\"sh\", \"-c\", \"wget -q -O - http://127.0.0.1:8081/s | grep -q up\"]\n  containers:\n  - name: app\n    image: {BUSYBOX}\n{app}"
        ),
    ));
    let p = lab
        .wait_pod("sc", "Running and Ready", MIN, |p| phase(p) == "Running" && condition(p, "Ready") == Some("True"));
    assert_eq!(condition(&p, "Initialized"), Some("True"), "{}", p["status"]);
    let side = init_status(&p, "side").unwrap();
    assert!(side["state"]["running"]["startedAt"].is_string(), "{side}");
    assert_eq!(
        (&side["started"], &side["ready"], &side["restartCount"]),
        (&Value::Bool(true), &Value::Bool(true), &Value::from(0)),
        "{side}"
    );
    // The regular init container found the sidecar serving at its first attempt.
    let check = init_status(&p, "check").unwrap();
    assert_eq!(check["state"]["terminated"]["reason"], "Completed", "{check}");
    assert_eq!(check["restartCount"], 0, "{check}");
    let app_id = container_status(&p, "app").unwrap()["containerID"].as_str().unwrap().to_string();

    // The sidecar exits: restarted (no backoff on a first restart), the app container untouched.
    // The exec'd shell may itself be killed with the container (137) before kubectl hears it
    // exit: either answer is fine, the restart below is what counts.
    let out = lab.kubectl(&["exec", "sc", "-c", "side", "--", "sh", "-c", "kill 1"]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success() || stderr.contains("exit code 137"), "kubectl exec kill 1: {stderr}");
    let p = lab.wait_pod("sc", "sidecar restarted", MIN, |p| {
        init_status(p, "side").is_some_and(|s| s["restartCount"] == 1 && s["started"] == true)
    });
    let side = init_status(&p, "side").unwrap();
    assert!(side["state"]["running"].is_object(), "{side}");
    assert_eq!(side["lastState"]["terminated"]["exitCode"], 0, "{side}");
    let app = container_status(&p, "app").unwrap();
    assert_eq!(
        (app["containerID"].as_str().unwrap(), &app["restartCount"]),
        (app_id.as_str(), &Value::from(0)),
        "{app}"
    );
    assert_eq!(phase(&p), "Running");
    assert_eq!(condition(&p, "Initialized"), Some("True"));
    let p = lab.wait_pod("sc", "Ready again", MIN, |p| condition(p, "Ready") == Some("True"));
    assert_eq!(init_status(&p, "check").unwrap()["restartCount"], 0, "init container ran again: {}", p["status"]);

    // A Job-like pod: the app container completes, the sidecar is stopped (its preStop hook
    // first, which leaves the container's termination message), the pod Succeeded.
    let sidecar_with_hook = format!(
        "{sidecar}    lifecycle:\n      preStop:\n        exec: {{command: [\"sh\", \"-c\", \"echo prestop-ran > /dev/termination-log\"]}}\n"
    );
    lab.apply(&pod_yaml(
        "job",
        &format!(
            "  restartPolicy: Never\n  volumes:\n  - name: shared\n    emptyDir: {{}}\n  initContainers:\n{sidecar_with_hook}  containers:\n  - name: work\n    image: {BUSYBOX}\n    command: [\"sh\", \"-c\", \"wget -q -O - http://127.0.0.1:8081/s | grep -q up && sleep 1\"]\n"
        ),
    ));
    let job = lab.wait_pod("job", "finished", MIN, |p| matches!(phase(p), "Succeeded" | "Failed"));
    assert_eq!(phase(&job), "Succeeded", "{}", job["status"]);
    let work = container_status(&job, "work").unwrap();
    assert_eq!(work["state"]["terminated"]["exitCode"], 0, "{work}");
    let side = init_status(&job, "side").unwrap();
    assert!(side["state"]["terminated"].is_object(), "sidecar not stopped: {side}");
    assert_eq!(side["state"]["terminated"]["message"], "prestop-ran\n", "the sidecar's preStop hook did not run: {side}");
    assert_eq!(side["restartCount"], 0, "{side}");

    // Deletion: the app container is stopped before the sidecar; nothing is left behind.
    lab.kubectl_ok(&["delete", "pod", "sc", "job", "--wait=true", "--timeout=60s"]);
    let log = lab.agent_log();
    let stops: Vec<&str> = log
        .lines()
        .filter(|l| l.contains("stopping container") && l.contains("default/sc"))
        .map(|l| if l.contains("side") { "side" } else { "app" })
        .collect();
    assert_eq!(stops, ["app", "side"], "{log}");
    lab.wait_nothing_left();
}

/// Probes: readiness flips the Ready condition both ways; a failing liveness probe restarts
/// the container (its preStop hook first), with the crash-loop backoff between restarts.
#[test]
#[ignore = "privileged: needs root and containerd; run by scripts/test.sh"]
fn probes_readiness_and_liveness() {
    let lab = Lab::start("probe");
    lab.apply(&pod_yaml(
        "ready",
        &format!(
            "  containers:\n  - name: app\n    image: {BUSYBOX}\n    command: [\"sleep\", \"3600\"]\n    readinessProbe:\n      exec: {{command: [cat, /tmp/ready]}}\n      periodSeconds: 1\n"
        ),
    ));
    // The probe's file is made and removed by the test once it saw the state before, so no
    // step depends on how fast the machine is.
    let p = lab.wait_pod("ready", "Running", MIN, |p| phase(p) == "Running");
    assert_eq!(condition(&p, "Ready"), Some("False"), "ready before the probe passed: {}", p["status"]);
    lab.kubectl_ok(&["exec", "ready", "--", "touch", "/tmp/ready"]);
    lab.wait_pod("ready", "Ready", MIN, |p| condition(p, "Ready") == Some("True"));
    lab.kubectl_ok(&["exec", "ready", "--", "rm", "/tmp/ready"]);
    let p = lab.wait_pod("ready", "not Ready again", MIN, |p| condition(p, "Ready") == Some("False"));
    assert_eq!(container_status(&p, "app").unwrap()["ready"], false);
    assert_eq!(container_status(&p, "app").unwrap()["restartCount"], 0);

    lab.apply(&pod_yaml(
        "live",
        &format!(
            "  containers:\n  - name: app\n    image: {BUSYBOX}\n    command: [\"sleep\", \"3600\"]\n    livenessProbe:\n      exec: {{command: [cat, /tmp/healthy]}}\n      periodSeconds: 1\n      failureThreshold: 2\n    lifecycle:\n      preStop:\n        exec: {{command: [\"sh\", \"-c\", \"echo prestop-ran > /dev/termination-log\"]}}\n"
        ),
    ));
    let p = lab.wait_pod("live", "restarted twice", Duration::from_secs(120), |p| {
        container_status(p, "app").and_then(|c| c["restartCount"].as_i64()).unwrap_or(0) >= 2
    });
    let cs = container_status(&p, "app").unwrap();
    let last = &cs["lastState"]["terminated"];
    assert!(last["finishedAt"].is_string(), "{cs}");
    // As upstream, the kill for a failed liveness probe runs the preStop hook first.
    assert_eq!(last["message"], "prestop-ran\n", "preStop did not run before the liveness kill: {cs}");
    assert!(lab.agent_log().contains("failed liveness probe"), "{}", lab.logs());
    let events = lab.kubectl_ok(&["get", "events", "-o", "json"]);
    let events: Value = serde_json::from_str(&events).unwrap();
    let unhealthy = events["items"].as_array().unwrap().iter().any(|e| {
        e["involvedObject"]["name"] == "live"
            && e["reason"] == "Unhealthy"
            && e["message"].as_str().unwrap_or("").starts_with("Liveness probe failed:")
    });
    assert!(unhealthy, "no Unhealthy event for the liveness failures: {events}");
    // The second restart waited for the backoff (10 s) after the first restart's container died.
    // (restartCount 2: the container of the second restart started >= 10 s after the first
    // restarted one was killed; timestamps have a resolution of one second.)
    if let Some(started) = cs["state"]["running"]["startedAt"].as_str() {
        let s: jiff::Timestamp = started.parse().unwrap();
        let f: jiff::Timestamp = last["finishedAt"].as_str().unwrap().parse().unwrap();
        let gap = s.duration_since(f).as_secs();
        assert!(gap >= 9, "restarted {gap}s after the previous exit: {cs}");
    }
}

/// A missing image: ErrImagePull / ImagePullBackOff, then Running once the image exists.
/// An env var from a missing ConfigMap key: CreateContainerConfigError, then Running when the
/// key appears. A command that does not exist: a clear error on the container.
#[test]
#[ignore = "privileged: needs root and containerd; run by scripts/test.sh"]
fn image_and_config_errors_recover() {
    let lab = Lab::start("err");
    let missing = "registry.ferro.test/late:1";
    lab.apply(&pod_yaml("late", &format!("  containers:\n  - name: app\n    image: {missing}\n    command: [\"sleep\", \"3600\"]\n")));
    lab.wait_pod("late", "ErrImagePull or ImagePullBackOff", MIN, |p| {
        matches!(waiting_reason(p, "app"), Some("ErrImagePull" | "ImagePullBackOff"))
    });
    lab.wait_pod("late", "ImagePullBackOff", MIN, |p| waiting_reason(p, "app") == Some("ImagePullBackOff"));
    lab.ctrd.ctr(&["images", "tag", BUSYBOX, missing]).unwrap();
    lab.wait_pod("late", "Running after the image appeared", Duration::from_secs(120), |p| phase(p) == "Running");

    lab.apply(
        "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: settings\ndata:\n  other: x\n",
    );
    lab.apply(&pod_yaml(
        "envcm",
        &format!(
            "  containers:\n  - name: app\n    image: {BUSYBOX}\n    command: [\"sh\", \"-c\", \"echo $MODE; exec sleep 3600\"]\n    env:\n    - name: MODE\n      valueFrom:\n        configMapKeyRef: {{name: settings, key: mode}}\n"
        ),
    ));
    let p = lab.wait_pod("envcm", "CreateContainerConfigError", MIN, |p| waiting_reason(p, "app") == Some("CreateContainerConfigError"));
    let msg = container_status(&p, "app").unwrap()["state"]["waiting"]["message"].as_str().unwrap_or("").to_string();
    assert!(msg.contains("mode") && msg.contains("settings"), "{msg}");
    lab.apply("apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: settings\ndata:\n  mode: fast\n");
    lab.wait_pod("envcm", "Running once the key exists", MIN, |p| phase(p) == "Running");

    lab.apply(&pod_yaml("nocmd", &format!("  containers:\n  - name: app\n    image: {BUSYBOX}\n    command: [\"/no/such/binary\"]\n")));
    let p = lab.wait_pod("nocmd", "a start error", MIN, |p| {
        let cs = container_status(p, "app");
        let waiting = waiting_reason(p, "app").unwrap_or("");
        let term = cs.and_then(|c| c["lastState"]["terminated"]["reason"].as_str().or(c["state"]["terminated"]["reason"].as_str())).unwrap_or("");
        matches!(waiting, "RunContainerError" | "CrashLoopBackOff" | "StartError") || term == "StartError" || term == "ContainerCannotRun"
    });
    let text = p["status"].to_string();
    assert!(text.contains("/no/such/binary"), "the error does not name the command: {text}");
}

fn read(path: &std::path::Path) -> Option<String> {
    std::fs::read_to_string(path).ok().map(|s| s.trim().to_string())
}

/// configMap volume updates reach a running container; graceful deletion runs preStop and
/// SIGTERM within the grace period; pods beyond allocatable and unknown volume types are
/// rejected with a clear status.
#[test]
#[ignore = "privileged: needs root and containerd; run by scripts/test.sh"]
fn volumes_graceful_deletion_and_admission() {
    let lab = Lab::start("vol");
    let host = lab.host_dir();
    lab.apply("apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: cfg\ndata:\n  color: blue\n");
    let requests_before = lab.api_requests();
    lab.apply(&pod_yaml(
        "cmpod",
        &format!(
            "  volumes:\n  - name: cfg\n    configMap: {{name: cfg}}\n  - name: host\n    hostPath: {{path: {}, type: Directory}}\n  containers:\n  - name: app\n    image: {BUSYBOX}\n    command: [\"sh\", \"-c\", \"while true; do cat /etc/cfg/color > /host/color.tmp && mv /host/color.tmp /host/color; sleep 1; done\"]\n    volumeMounts:\n    - {{name: cfg, mountPath: /etc/cfg}}\n    - {{name: host, mountPath: /host}}\n",
            host.display()
        ),
    ));
    lab.wait("the container to see color=blue", MIN, |_| (read(&host.join("color")).as_deref() == Some("blue")).then_some(()));
    // The agent read the ConfigMap from a watch of it (upstream's default Watch strategy), not
    // a GET per sync: nothing but the agent touched ConfigMaps since the apply above.
    let requests = lab.api_requests();
    let count = |k: &str| requests.get(k).copied().unwrap_or(0.0);
    assert!(count("WATCH configmaps") >= 1.0, "{requests:?}");
    assert_eq!(count("GET configmaps"), requests_before.get("GET configmaps").copied().unwrap_or(0.0), "{requests:?}");
    lab.apply("apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: cfg\ndata:\n  color: green\n");
    // Refreshed at the pod's next periodic sync (60 s, upstream's syncFrequency).
    lab.wait("the updated ConfigMap inside the running container", Duration::from_secs(150), |_| {
        (read(&host.join("color")).as_deref() == Some("green")).then_some(())
    });
    let p = lab.pod("cmpod").unwrap();
    assert_eq!(container_status(&p, "app").unwrap()["restartCount"], 0, "the update restarted the container");

    // Graceful deletion: preStop, then SIGTERM (the trap writes a marker and exits).
    lab.apply(&pod_yaml(
        "graceful",
        &format!(
            "  volumes:\n  - name: host\n    hostPath: {{path: {}, type: Directory}}\n  containers:\n  - name: app\n    image: {BUSYBOX}\n    command: [\"sh\", \"-c\", \"trap 'echo term > /host/term; exit 0' TERM; echo trapped > /host/trapped; while true; do sleep 1; done\"]\n    lifecycle:\n      preStop:\n        exec: {{command: [\"sh\", \"-c\", \"echo prestop > /host/prestop\"]}}\n    volumeMounts:\n    - {{name: host, mountPath: /host}}\n",
            host.display()
        ),
    ));
    lab.wait_pod("graceful", "Running", MIN, |p| phase(p) == "Running");
    // The shell has set its trap once it wrote the marker.
    lab.wait("the TERM trap set", MIN, |_| (read(&host.join("trapped")).as_deref() == Some("trapped")).then_some(()));
    let t = std::time::Instant::now();
    lab.kubectl_ok(&["delete", "pod", "graceful", "--wait=true", "--timeout=60s"]);
    let took = t.elapsed();
    assert_eq!(read(&host.join("prestop")).as_deref(), Some("prestop"), "preStop did not run\n{}", lab.logs());
    assert_eq!(read(&host.join("term")).as_deref(), Some("term"), "SIGTERM was not delivered\n{}", lab.logs());
    assert!(took < Duration::from_secs(30), "deletion took {took:?} with a 5 s grace period");

    // Admission: a pod bound straight to the node asking for more cpu than it has.
    lab.apply(&format!(
        "apiVersion: v1\nkind: Pod\nmetadata:\n  name: huge\nspec:\n  nodeName: {NODE}\n  containers:\n  - name: app\n    image: {BUSYBOX}\n    command: [sleep, \"3600\"]\n    resources:\n      requests: {{cpu: \"1000\"}}\n"
    ));
    let p = lab.wait_pod("huge", "rejected", MIN, |p| phase(p) == "Failed");
    assert_eq!(p["status"]["reason"], "OutOfcpu", "{}", p["status"]);
    assert!(p["status"]["message"].as_str().unwrap().contains("cpu"), "{}", p["status"]);

    // A volume of an unknown type: kubectl's strict field validation against the API server
    // names the field, nothing is created (a volume with no source at all is defaulted to an
    // emptyDir by the API, as upstream).
    let unknown = format!(
        "{{\"apiVersion\":\"v1\",\"kind\":\"Pod\",\"metadata\":{{\"name\":\"unknownvol\"}},\"spec\":{{\"nodeName\":\"{NODE}\",\"volumes\":[{{\"name\":\"x\",\"fooVolume\":{{}}}}],\"containers\":[{{\"name\":\"c\",\"image\":\"{BUSYBOX}\"}}]}}}}"
    );
    let path = lab.dir.path().join("unknownvol.json");
    std::fs::write(&path, unknown).unwrap();
    let out = lab.kubectl(&["apply", "-f", path.to_str().unwrap()]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && err.contains("fooVolume"), "{err}");
    assert!(lab.pod("unknownvol").is_none());

    // A volume of a type the agent does not support: rejected, nothing started.
    lab.apply(&format!(
        "apiVersion: v1\nkind: Pod\nmetadata:\n  name: nfs\nspec:\n  nodeName: {NODE}\n  volumes:\n  - name: data\n    nfs: {{server: nfs.example, path: /}}\n  containers:\n  - name: app\n    image: {BUSYBOX}\n    command: [sleep, \"3600\"]\n"
    ));
    let p = lab.wait_pod("nfs", "rejected", MIN, |p| phase(p) == "Failed");
    assert!(p["status"]["message"].as_str().unwrap().contains("nfs volumes are not supported"), "{}", p["status"]);
    // An inline CSI volume of a driver without a CSIDriver object (so, as upstream, without
    // the Ephemeral mode): the pod waits in ContainerCreating, saying why.
    lab.apply(&format!(
        "apiVersion: v1\nkind: Pod\nmetadata:\n  name: inline\nspec:\n  nodeName: {NODE}\n  volumes:\n  - name: data\n    csi: {{driver: some.csi.example}}\n  containers:\n  - name: app\n    image: {BUSYBOX}\n    command: [sleep, \"3600\"]\n"
    ));
    let p = lab.wait_pod("inline", "waiting for an Ephemeral-capable driver", MIN, |p| {
        container_status(p, "app").and_then(|c| c["state"]["waiting"]["message"].as_str()).is_some_and(|m| {
            m.contains("volume mode \"Ephemeral\" not supported by driver some.csi.example (no CSIDriver object)")
        })
    });
    assert_eq!(waiting_reason(&p, "app"), Some("ContainerCreating"), "{}", p["status"]);
    assert_eq!(phase(&p), "Pending");
    // A claim that does not exist: the pod waits in ContainerCreating, saying why.
    lab.apply(&format!(
        "apiVersion: v1\nkind: Pod\nmetadata:\n  name: pvc\nspec:\n  nodeName: {NODE}\n  volumes:\n  - name: data\n    persistentVolumeClaim: {{claimName: nothing}}\n  containers:\n  - name: app\n    image: {BUSYBOX}\n    command: [sleep, \"3600\"]\n"
    ));
    let p = lab.wait_pod("pvc", "waiting for its claim", MIN, |p| {
        container_status(p, "app").and_then(|c| c["state"]["waiting"]["message"].as_str()).is_some_and(|m| m.contains("persistentvolumeclaim \"nothing\" not found"))
    });
    assert_eq!(waiting_reason(&p, "app"), Some("ContainerCreating"), "{}", p["status"]);
    assert_eq!(phase(&p), "Pending");
    // activeDeadlineSeconds: the pod is stopped and Failed with DeadlineExceeded.
    lab.apply(&pod_yaml("deadline", &format!("  activeDeadlineSeconds: 3\n  containers:\n  - name: app\n    image: {BUSYBOX}\n    command: [sleep, \"3600\"]\n")));
    let p = lab.wait_pod("deadline", "DeadlineExceeded", MIN, |p| phase(p) == "Failed");
    assert_eq!(p["status"]["reason"], "DeadlineExceeded", "{}", p["status"]);
    lab.kubectl_ok(&["delete", "pod", "cmpod", "huge", "nfs", "inline", "pvc", "deadline", "--wait=true", "--timeout=60s"]);
    lab.wait("no containers left", MIN, |l| l.ctrd.ctr(&["containers", "ls", "-q"]).unwrap().trim().is_empty().then_some(()));
    // The agent removes a pod's directory after its containers and sandbox (a moment later).
    let pods_dir = lab.dir.path().join("agent/pods");
    lab.wait("no pod dirs left behind", MIN, |_| {
        (std::fs::read_dir(&pods_dir).map(|d| d.flatten().count()).unwrap_or(0) == 0).then_some(())
    });
}

/// `ls -lnd PATH` (or `-lnL`) inside the container: (mode string, uid, gid).
fn ls_n(lab: &Lab, pod: &str, flags: &str, path: &str) -> (String, String, String) {
    let out = lab.kubectl_ok(&["exec", pod, "--", "ls", flags, path]);
    let f: Vec<&str> = out.split_whitespace().collect();
    assert!(f.len() >= 4, "ls {flags} {path}: {out:?}");
    (f[0].to_string(), f[2].to_string(), f[3].to_string())
}

/// Security context and volumes: fsGroup gives an emptyDir and a configMap volume to the group
/// of a container running as uid 1000 (runAsNonRoot satisfied by runAsUser); subPathExpr from
/// the downward API; runAsNonRoot refused for an image that runs as root and satisfied by one
/// whose USER is 1000.
#[test]
#[ignore = "privileged: needs root and containerd; run by scripts/test.sh"]
fn fs_group_sub_path_expr_and_run_as_non_root() {
    let lab = Lab::start("sec");
    lab.apply("apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: cfg\ndata:\n  color: blue\n");
    lab.apply(&pod_yaml(
        "owned",
        &format!(
            "  securityContext: {{runAsUser: 1000, runAsNonRoot: true, fsGroup: 2000}}\n  volumes:\n  - name: scratch\n    emptyDir: {{}}\n  - name: cfg\n    configMap: {{name: cfg, defaultMode: 0400}}\n  containers:\n  - name: app\n    image: {BUSYBOX}\n    command: [\"sh\", \"-c\", \"echo from-$POD_NAME > /mine/f && exec sleep 3600\"]\n    env:\n    - name: POD_NAME\n      valueFrom: {{fieldRef: {{fieldPath: metadata.name}}}}\n    volumeMounts:\n    - {{name: scratch, mountPath: /scratch}}\n    - {{name: scratch, mountPath: /mine, subPathExpr: $(POD_NAME)}}\n    - {{name: cfg, mountPath: /cfg}}\n"
        ),
    ));
    lab.wait_pod("owned", "Running", MIN, |p| phase(p) == "Running");
    assert_eq!(lab.kubectl_ok(&["exec", "owned", "--", "id", "-u"]).trim(), "1000");
    let groups = lab.kubectl_ok(&["exec", "owned", "--", "id", "-G"]);
    assert!(groups.split_whitespace().any(|g| g == "2000"), "fsGroup not among the groups: {groups:?}");
    // The emptyDir: group 2000, group-writable with setgid.
    let (mode, _, gid) = ls_n(&lab, "owned", "-lnd", "/scratch");
    assert_eq!((mode.as_str(), gid.as_str()), ("drwxrwsrwx", "2000"));
    // The configMap volume and its file (0400 + group read).
    assert_eq!(ls_n(&lab, "owned", "-lnd", "/cfg").2, "2000");
    let (mode, _, gid) = ls_n(&lab, "owned", "-lnL", "/cfg/color");
    assert_eq!((mode.as_str(), gid.as_str()), ("-r--r-----", "2000"));
    assert_eq!(lab.kubectl_ok(&["exec", "owned", "--", "cat", "/cfg/color"]).trim(), "blue");
    // uid 1000 writes into the emptyDir; the new file belongs to the group (setgid).
    lab.kubectl_ok(&["exec", "owned", "--", "sh", "-c", "echo w > /scratch/w"]);
    let (_, uid, gid) = ls_n(&lab, "owned", "-ln", "/scratch/w");
    assert_eq!((uid.as_str(), gid.as_str()), ("1000", "2000"));
    // The subPathExpr directory (named after the pod) seen through the whole volume.
    assert_eq!(lab.kubectl_ok(&["exec", "owned", "--", "cat", "/scratch/owned/f"]).trim(), "from-owned");

    // runAsNonRoot without runAsUser: busybox runs as root, so the container is not created.
    lab.apply(&pod_yaml(
        "rooted",
        &format!("  securityContext: {{runAsNonRoot: true}}\n  containers:\n  - name: app\n    image: {BUSYBOX}\n    command: [sleep, \"3600\"]\n"),
    ));
    let p = lab.wait_pod("rooted", "CreateContainerConfigError", MIN, |p| {
        waiting_reason(p, "app") == Some("CreateContainerConfigError")
    });
    let uid = p["metadata"]["uid"].as_str().unwrap();
    let msg = container_status(&p, "app").unwrap()["state"]["waiting"]["message"].as_str().unwrap_or("");
    assert_eq!(
        msg,
        format!("container has runAsNonRoot and image will run as root (pod: \"rooted_default({uid})\", container: app)")
    );
    assert_eq!(phase(&p), "Pending");
    // Two sandboxes and the one container of "owned".
    assert_eq!(lab.ctrd.ctr(&["containers", "ls", "-q"]).unwrap().lines().count(), 3);

    // An image whose config says USER 1000: runAsNonRoot holds without runAsUser, and a
    // container's runAsGroup alone applies to the image's user (the agent passes the image's uid
    // on). (A pod-level runAsGroup alone would also go to the sandbox, which containerd 1.6
    // refuses: "user group ... is specified without user", with upstream's kubelet too.)
    let work = lab.dir.path().join("images");
    let image = "registry.ferro.test/busybox-user:1";
    let rootfs = work.join("busybox-rootfs");
    let tar = ferro_lab::images::image_as(&work, "busybox-user", &rootfs, &[], &["sh"], image, Some("1000")).unwrap();
    lab.ctrd.import(&tar).unwrap();
    lab.apply(&pod_yaml(
        "imageuser",
        &format!("  securityContext: {{runAsNonRoot: true}}\n  containers:\n  - name: app\n    image: {image}\n    command: [sleep, \"3600\"]\n    securityContext: {{runAsGroup: 3000}}\n"),
    ));
    lab.wait_pod("imageuser", "Running", MIN, |p| phase(p) == "Running");
    let ids = lab.kubectl_ok(&["exec", "imageuser", "--", "sh", "-c", "echo $(id -u) $(id -g)"]);
    assert_eq!(ids.trim(), "1000 3000");
}

/// kill -9 of the agent while 20 pods run: after the restart none is restarted or duplicated.
/// Then static pods: one runs with the control plane down, and appears as a mirror pod when it
/// is back; an invalid manifest is only a log line.
#[test]
#[ignore = "privileged: needs root and containerd; run by scripts/test.sh"]
fn agent_restart_and_static_pods() {
    let mut lab = Lab::start("restart");
    lab.kubectl_ok(&["create", "deployment", "many", "--image", BUSYBOX, "--replicas", "20", "--", "sleep", "3600"]);
    let ids = |l: &Lab| -> Option<std::collections::BTreeMap<String, String>> {
        let out = l.kubectl(&["get", "pods", "-l", "app=many", "-o", "json"]);
        let v: Value = serde_json::from_slice(&out.stdout).ok()?;
        let items = v["items"].as_array()?;
        let mut m = std::collections::BTreeMap::new();
        for p in items {
            if phase(p) != "Running" {
                return None;
            }
            let cs = container_status(p, "busybox")?;
            if cs["restartCount"] != 0 {
                return None;
            }
            m.insert(p["metadata"]["name"].as_str()?.to_string(), cs["containerID"].as_str()?.to_string());
        }
        (m.len() == 20).then_some(m)
    };
    let before = lab.wait("20 pods Running", Duration::from_secs(180), ids);
    let count = |l: &Lab| l.ctrd.ctr(&["containers", "ls", "-q"]).unwrap().lines().count();
    assert_eq!(count(&lab), 40, "20 sandboxes + 20 containers");
    lab.agent.kill(); // SIGKILL
    lab.start_agent();
    // Let the restarted agent rebuild its view and sync every pod a few times.
    lab.wait("the restarted agent to sync", MIN, |l| l.agent_log().matches("--- agent restarted ---").next().and_then(|_| {
        let log = l.agent_log();
        let after = log.rsplit("--- agent restarted ---").next().unwrap_or("");
        after.contains("node status posted").then_some(())
    }));
    // Every pod synced twice by the restarted agent (the first sync adopts what runs; the
    // relist after it queues every pod again), each sync leaving a debug line.
    lab.wait("every pod synced twice after the restart", MIN, |l| {
        let log = lab::plain(&l.agent_log());
        let after = log.rsplit("--- agent restarted ---").next().unwrap_or("").to_string();
        let synced: Vec<&str> = after.lines().filter(|x| x.contains("pod synced")).collect();
        before.keys().all(|name| synced.iter().filter(|x| x.contains(&format!("pod=default/{name}"))).count() >= 2).then_some(())
    });
    let after = ids(&lab).unwrap_or_else(|| panic!("pods changed after the restart\n{}", lab.logs()));
    assert_eq!(before, after, "containers were restarted or replaced");
    assert_eq!(count(&lab), 40, "duplicated sandboxes or containers after the restart");
    let restarted = lab.agent_log().rsplit("--- agent restarted ---").next().unwrap_or("").to_string();
    assert!(!restarted.contains("creating pod sandbox") && !restarted.contains("creating container"), "{restarted}");
    lab.kubectl_ok(&["delete", "deployment", "many"]);
    lab.wait("the deployment's containers gone", Duration::from_secs(120), |l| (count(l) == 0).then_some(()));

    // The API server goes away while a pod runs; the pod finishes meanwhile, and its status
    // reaches the API once it is back.
    lab.apply(&pod_yaml("short", &format!("  restartPolicy: Never\n  containers:\n  - name: app\n    image: {BUSYBOX}\n    command: [sleep, \"8\"]\n")));
    lab.wait_pod("short", "Running", MIN, |p| phase(p) == "Running");

    // Static pods: the control plane goes away first.
    lab.cp.kill();
    let manifests = lab.dir.path().join("manifests");
    std::fs::write(manifests.join("broken.yaml"), "metadata: [this is not a pod").unwrap();
    std::fs::write(
        manifests.join("static.yaml"),
        format!("apiVersion: v1\nkind: Pod\nmetadata:\n  name: static\nspec:\n  containers:\n  - name: app\n    image: {BUSYBOX}\n    command: [sleep, \"3600\"]\n"),
    )
    .unwrap();
    lab.wait("the static pod's container running with the API down", Duration::from_secs(90), |l| {
        let out = l.ctrd.ctr(&["containers", "ls"]).unwrap();
        // The static pod's sandbox and container, plus the finished "short" pod's two.
        (count(l) == 4 && out.contains("busybox")).then_some(())
    });
    assert!(lab.agent_log().contains("skipping static pod manifest"), "{}", lab.logs());
    lab.start_cp();
    lab.wait_pod("short", "Succeeded, reported after the API came back", Duration::from_secs(90), |p| phase(p) == "Succeeded");
    let mirror = lab.wait_pod(&format!("static-{NODE}"), "the mirror pod Running", Duration::from_secs(90), |p| phase(p) == "Running");
    assert!(mirror["metadata"]["annotations"]["kubernetes.io/config.mirror"].is_string(), "{mirror}");
    // Removing the manifest stops the pod and removes the mirror.
    std::fs::remove_file(manifests.join("static.yaml")).unwrap();
    lab.wait("the static pod gone", Duration::from_secs(90), |l| {
        (count(l) == 2 && l.pod(&format!("static-{NODE}")).is_none()).then_some(())
    });
}
