//! Issue 16's proof in the lab: an operator written with kube-rs (crates/demo-operator), built
//! static and packaged offline as an image, runs in a pod with the in-cluster configuration
//! and nothing mounted by hand: the ServiceAccount admission's kube-api-access volume (token,
//! CA, namespace) and KUBERNETES_SERVICE_HOST/PORT, the `kubernetes` Service reached through
//! ferro-proxy's rules, its rights from the ClusterRole and binding of
//! deploy/demo-operator/operator.yaml (RBAC). A Website becomes a Deployment and a Service
//! owned by it whose pods serve its message, its status reports ready replicas, a changed spec
//! is followed (patch and the scale subresource), a deleted Website takes its objects with it
//! (the garbage collector), and a Website violating the schema is refused with 422 naming the
//! field. Needs root; everything lives in the lab's network namespace.
#![allow(clippy::unwrap_used)]

mod lab;

use std::path::PathBuf;
use std::time::Duration;

use lab::{Lab, BUSYBOX};
use serde_json::Value;

const MIN: Duration = Duration::from_secs(60);
const OPERATOR_NS: &str = "ferro-demo";

fn manifest(name: &str) -> String {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../deploy/demo-operator").join(name);
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

fn website(name: &str, spec: &str) -> String {
    format!("apiVersion: demo.ferro.dev/v1\nkind: Website\nmetadata:\n  name: {name}\n  namespace: default\nspec:\n{spec}")
}

fn json(lab: &Lab, args: &[&str]) -> Option<Value> {
    let mut a = vec!["get"];
    a.extend_from_slice(args);
    a.extend_from_slice(&["-o", "json"]);
    let out = lab.kubectl(&a);
    out.status.success().then(|| serde_json::from_slice(&out.stdout).unwrap())
}

/// The operator pod's name and log (all of its containers' runs), for failure messages.
fn operator_log(lab: &Lab) -> String {
    let out = lab.kubectl(&["logs", "-n", OPERATOR_NS, "deployment/ferro-demo-operator", "--tail", "60"]);
    format!("--- operator log ---\n{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr))
}

/// Waits until `f` finds what it wants, failing with the operator's log and the lab's.
fn wait_for<T>(lab: &Lab, what: &str, limit: Duration, mut f: impl FnMut(&Lab) -> Option<T>) -> T {
    let deadline = std::time::Instant::now() + limit;
    loop {
        if let Some(v) = f(lab) {
            return v;
        }
        assert!(std::time::Instant::now() < deadline, "timed out waiting for {what}\n{}\n{}", operator_log(lab), lab.logs());
        std::thread::sleep(Duration::from_millis(250));
    }
}

fn ready_condition(site: &Value) -> Option<&Value> {
    site["status"]["conditions"].as_array()?.iter().find(|c| c["type"] == "Ready")
}

/// Waits until the Website's status reports `n` ready replicas, Ready=True, for its current
/// generation.
fn wait_ready(lab: &Lab, name: &str, n: i64) -> Value {
    wait_for(lab, &format!("website {name}: {n} ready replicas, Ready=True"), 2 * MIN, |l| {
        let site = json(l, &["website", name])?;
        let generation = site["metadata"]["generation"].clone();
        let cond = ready_condition(&site)?;
        (site["status"]["readyReplicas"] == n
            && site["status"]["observedGeneration"] == generation
            && cond["status"] == "True"
            && cond["reason"] == "Available")
            .then_some(site)
    })
}

/// The page the Website's Service serves, fetched by the client pod (empty on failure).
fn page(lab: &Lab, ip: &str) -> String {
    let out = lab.kubectl(&["exec", "client", "--", "timeout", "5", "wget", "-qO-", &format!("http://{ip}/")]);
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

/// The object's ownerReferences must name the Website as its controller.
fn assert_owned(obj: &Value, site: &Value) {
    let refs = obj["metadata"]["ownerReferences"].as_array().unwrap_or_else(|| panic!("no ownerReferences: {obj}"));
    assert_eq!(refs.len(), 1, "{obj}");
    let r = &refs[0];
    assert_eq!(r["apiVersion"], "demo.ferro.dev/v1", "{r}");
    assert_eq!(r["kind"], "Website", "{r}");
    assert_eq!(r["name"], site["metadata"]["name"], "{r}");
    assert_eq!(r["uid"], site["metadata"]["uid"], "{r}");
    assert_eq!(r["controller"], true, "{r}");
}

#[test]
#[ignore = "privileged: needs root, containerd and kubectl; run by scripts/test.sh"]
fn a_kube_rs_operator_in_a_pod_reconciles_websites() {
    // The static binary first (cargo's cache makes it quick after the first build).
    let operator_bin = ferro_lab::images::build_static_demo_operator().unwrap();
    let lab = Lab::start("op");
    let _proxy = lab.start_proxy("iptables");
    lab.import_demo_operator(&operator_bin);

    // The CRD, established.
    lab.apply(&manifest("crd.yaml"));
    lab.wait("the Website CRD established", MIN, |l| {
        let out = l.kubectl(&["get", "crd", "websites.demo.ferro.dev", "-o", "jsonpath={.status.conditions[?(@.type==\"Established\")].status}"]);
        (String::from_utf8_lossy(&out.stdout) == "True").then_some(())
    });

    // Bad input: a Website violating the schema is refused with 422 naming the field, nothing
    // stored.
    let out = lab.kubectl_stdin(&["create", "-v=6", "-f", "-"], &website("bad", &format!("  replicas: -1\n  image: {BUSYBOX}\n")));
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("status=\"422 Unprocessable Entity\""), "{err}");
    assert!(err.contains("The Website \"bad\" is invalid"), "{err}");
    assert!(err.contains("spec.replicas: Invalid value: -1: spec.replicas in body should be greater than or equal to 0"), "{err}");
    let out = lab.kubectl_stdin(&["create", "-f", "-"], &website("bad", "  replicas: 1\n"));
    assert!(String::from_utf8_lossy(&out.stderr).contains("spec.image: Required value"), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(!lab.kubectl(&["get", "website", "bad"]).status.success(), "nothing stored");

    // The operator: namespace, service account, ClusterRole, binding, Deployment.
    lab.apply(&manifest("operator.yaml"));
    let pod = wait_for(&lab, "the operator pod running", 2 * MIN, |l| {
        let pods = json(l, &["pods", "-n", OPERATOR_NS, "-l", "app.kubernetes.io/name=ferro-demo-operator"])?;
        pods["items"].as_array()?.iter().find(|p| p["status"]["phase"] == "Running").cloned()
    });
    // In-cluster configuration only: the volume the ServiceAccount admission added, no other.
    let volumes: Vec<&str> = pod["spec"]["volumes"].as_array().unwrap().iter().map(|v| v["name"].as_str().unwrap()).collect();
    assert!(volumes.len() == 1 && volumes[0].starts_with("kube-api-access-"), "{volumes:?}");
    assert_eq!(pod["spec"]["serviceAccountName"], "ferro-demo-operator");
    wait_for(&lab, "the operator started", MIN, |l| operator_log(l).contains("ferro-demo-operator starting").then_some(()));

    // A client pod to fetch the website through its Service.
    lab.apply(&format!(
        "apiVersion: v1\nkind: Pod\nmetadata:\n  name: client\nspec:\n  terminationGracePeriodSeconds: 1\n  containers:\n  - name: c\n    image: {BUSYBOX}\n    command: [sleep, '3600']\n"
    ));

    // A Website: its Deployment and Service appear, owned by it; its pods serve the message;
    // its status reports them ready.
    lab.apply(&website("hello", &format!("  replicas: 2\n  image: {BUSYBOX}\n  message: hello from a Website\n")));
    let site = json(&lab, &["website", "hello"]).unwrap();
    assert_eq!(site["spec"]["port"], 8080, "defaulted from the schema: {site}");
    let deployment = wait_for(&lab, "deployment hello", MIN, |l| json(l, &["deployment", "hello"]));
    assert_owned(&deployment, &site);
    assert_eq!(deployment["spec"]["replicas"], 2);
    let service = wait_for(&lab, "service hello", MIN, |l| json(l, &["service", "hello"]));
    assert_owned(&service, &site);
    let site = wait_ready(&lab, "hello", 2);
    assert_eq!(site["status"]["replicas"], 2);
    assert_eq!(ready_condition(&site).unwrap()["message"], "2 of 2 pods ready");
    let table = lab.kubectl_ok(&["get", "ws"]);
    let rows: Vec<Vec<&str>> = table.lines().map(|l| l.split_whitespace().collect()).collect();
    assert_eq!(rows[0], ["NAME", "REPLICAS", "READY", "STATUS", "AGE"], "{table}");
    assert_eq!(rows[1][..4], ["hello", "2", "2", "Available"], "{table}");
    lab.wait_pod("client", "Running", MIN, |p| p["status"]["phase"] == "Running");
    let ip = service["spec"]["clusterIP"].as_str().unwrap().to_string();
    wait_for(&lab, "the website's page through its Service", MIN, |l| (page(l, &ip) == "hello from a Website").then_some(()));

    // A changed spec is followed: one replica with a new page (a rollout) ...
    lab.kubectl_ok(&["patch", "website", "hello", "--type", "merge", "-p", r#"{"spec":{"replicas":1,"message":"changed"}}"#]);
    wait_for(&lab, "deployment hello scaled to 1", MIN, |l| (json(l, &["deployment", "hello"])?["spec"]["replicas"] == 1).then_some(()));
    let site = wait_ready(&lab, "hello", 1);
    assert_eq!(site["status"]["observedGeneration"], 2);
    wait_for(&lab, "the new page", MIN, |l| (page(l, &ip) == "changed").then_some(()));
    // ... and so is the scale subresource (kubectl scale).
    lab.kubectl_ok(&["scale", "website", "hello", "--replicas", "3"]);
    wait_ready(&lab, "hello", 3);
    let out = lab.kubectl_ok(&["get", "--raw", "/apis/demo.ferro.dev/v1/namespaces/default/websites/hello/scale"]);
    let scale: Value = serde_json::from_str(&out).unwrap();
    assert_eq!((scale["spec"]["replicas"].clone(), scale["status"]["replicas"].clone()), (3.into(), 3.into()), "{scale}");

    // Deleted: the garbage collector removes its Deployment and Service (and so the pods).
    lab.kubectl_ok(&["delete", "website", "hello"]);
    wait_for(&lab, "deployment and service hello collected", MIN, |l| {
        (!l.kubectl(&["get", "deployment", "hello"]).status.success() && !l.kubectl(&["get", "service", "hello"]).status.success()).then_some(())
    });
    wait_for(&lab, "the website's pods gone", MIN, |l| {
        let pods = json(l, &["pods", "-l", "app.kubernetes.io/instance=hello"])?;
        pods["items"].as_array()?.is_empty().then_some(())
    });

    // The operator never fell back to anything but its own rights, and never failed for long.
    let log = operator_log(&lab);
    assert!(!log.contains("panicked"), "{log}");
    // (a 403 as a status code, not the digits of a timestamp such as 13:48:49.384038Z)
    let refused = lab::plain(&log).lines().any(|l| {
        let message = l.split_once(' ').map_or(l, |(_time, rest)| rest);
        message.contains("Forbidden") || message.split(|c: char| !c.is_ascii_digit()).any(|n| n == "403")
    });
    assert!(!refused, "{log}");
}
