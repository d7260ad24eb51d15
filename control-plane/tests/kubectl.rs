//! kubectl, the one on the machine, against the real ferro-control-plane binary.
#![allow(clippy::unwrap_used)]

mod common;

use common::Server;
use serde_json::Value;

const DEPLOYMENT: &str = r#"
apiVersion: apps/v1
kind: Deployment
metadata:
  name: web
  labels: {app: web}
spec:
  replicas: 2
  selector:
    matchLabels: {app: web}
  template:
    metadata:
      labels: {app: web}
    spec:
      containers:
      - name: app
        image: registry.local/busybox:1.36
        ports:
        - containerPort: 80
        env:
        - {name: A, value: "1"}
"#;

const SERVICE: &str = r#"
apiVersion: v1
kind: Service
metadata:
  name: web
spec:
  type: NodePort
  selector: {app: web}
  ports:
  - name: http
    port: 80
    targetPort: 8080
"#;

const CONFIGMAP: &str = r#"
apiVersion: v1
kind: ConfigMap
metadata:
  name: settings
data:
  a: "1"
"#;

const NODE: &str = r#"
apiVersion: v1
kind: Node
metadata:
  name: node-a
  labels: {kubernetes.io/hostname: node-a}
"#;

fn json(s: &str) -> Value {
    serde_json::from_str(s).unwrap()
}

#[test]
fn apply_create_then_update_and_get_in_every_format() {
    let s = Server::start();
    assert!(s.apply(DEPLOYMENT).contains("deployment.apps/web created"));
    assert!(s.apply(SERVICE).contains("service/web created"));
    assert!(s.apply(CONFIGMAP).contains("configmap/settings created"));
    assert!(s.apply(NODE).contains("node/node-a created"));

    // update through apply: image and env change, a port is added
    let updated = DEPLOYMENT.replace("busybox:1.36", "busybox:1.37").replace("value: \"1\"", "value: \"2\"");
    assert!(s.apply(&updated).contains("deployment.apps/web configured"));
    assert!(s.apply(&updated).contains("deployment.apps/web unchanged"));
    let d = json(&s.ok(&["get", "deployment", "web", "-o", "json"]));
    assert_eq!(d["spec"]["template"]["spec"]["containers"][0]["image"], "registry.local/busybox:1.37");
    assert_eq!(d["spec"]["template"]["spec"]["containers"][0]["env"][0]["value"], "2");
    assert_eq!(d["metadata"]["generation"], 2);
    assert!(d["metadata"]["annotations"]["kubectl.kubernetes.io/last-applied-configuration"].is_string());
    assert_eq!(d["spec"]["strategy"]["type"], "RollingUpdate");

    let svc = json(&s.ok(&["get", "svc", "web", "-o", "json"]));
    let ip = svc["spec"]["clusterIP"].as_str().unwrap();
    assert!(ip.starts_with("10.9") || ip.starts_with("10.1"), "{ip}");
    let np = svc["spec"]["ports"][0]["nodePort"].as_i64().unwrap();
    assert!((30000..=30100).contains(&np));

    let yaml = s.ok(&["get", "configmap", "settings", "-o", "yaml"]);
    assert!(yaml.contains("kind: ConfigMap") && yaml.contains("a: \"1\""), "{yaml}");

    // server-side printing: the columns upstream prints
    let table = s.ok(&["get", "deployments"]);
    assert!(table.starts_with("NAME"), "{table}");
    assert!(table.contains("READY") && table.contains("UP-TO-DATE") && table.contains("web"), "{table}");
    let wide = s.ok(&["get", "svc", "web", "-o", "wide"]);
    assert!(wide.contains("SELECTOR") && wide.contains("app=web") && wide.contains(&format!("80:{np}/TCP")), "{wide}");
    let nodes = s.ok(&["get", "nodes"]);
    assert!(nodes.contains("node-a"), "{nodes}");

    let desc = s.ok(&["describe", "deployment", "web"]);
    assert!(desc.contains("Name:") && desc.contains("web") && desc.contains("registry.local/busybox:1.37"), "{desc}");
    let desc = s.ok(&["describe", "service", "web"]);
    assert!(desc.contains("NodePort"), "{desc}");
}

#[test]
fn label_annotate_patch_scale_delete() {
    let s = Server::start();
    s.apply(DEPLOYMENT);
    s.apply(CONFIGMAP);
    s.ok(&["label", "configmap", "settings", "tier=backend"]);
    s.ok(&["annotate", "configmap", "settings", "note=hello"]);
    let cm = json(&s.ok(&["get", "cm", "settings", "-o", "json"]));
    assert_eq!(cm["metadata"]["labels"]["tier"], "backend");
    assert_eq!(cm["metadata"]["annotations"]["note"], "hello");
    // label selector over the API
    assert!(s.ok(&["get", "cm", "-l", "tier=backend", "-o", "name"]).contains("configmap/settings"));
    assert!(!s.ok(&["get", "cm", "-l", "tier!=backend", "-o", "name"]).contains("configmap/settings"));
    s.ok(&["label", "configmap", "settings", "tier-"]);
    let cm = json(&s.ok(&["get", "cm", "settings", "-o", "json"]));
    assert!(cm["metadata"].get("labels").map(|l| l.get("tier").is_none()).unwrap_or(true));

    // the three patch types
    s.ok(&["patch", "cm", "settings", "--type", "merge", "-p", r#"{"data":{"b":"2"}}"#]);
    s.ok(&["patch", "cm", "settings", "--type", "json", "-p", r#"[{"op":"remove","path":"/data/a"}]"#]);
    s.ok(&["patch", "deployment", "web", "-p", r#"{"spec":{"template":{"spec":{"containers":[{"name":"app","image":"x:2"}]}}}}"#]);
    let cm = json(&s.ok(&["get", "cm", "settings", "-o", "json"]));
    assert_eq!(cm["data"], serde_json::json!({"b": "2"}));
    let d = json(&s.ok(&["get", "deploy", "web", "-o", "json"]));
    let c = &d["spec"]["template"]["spec"]["containers"][0];
    assert_eq!(c["image"], "x:2");
    assert_eq!(c["ports"][0]["containerPort"], 80, "strategic merge keeps the other fields");

    s.ok(&["scale", "deployment", "web", "--replicas", "5"]);
    let d = json(&s.ok(&["get", "deploy", "web", "-o", "json"]));
    assert_eq!(d["spec"]["replicas"], 5);
    s.ok(&["set", "image", "deployment/web", "app=x:3"]);
    let d = json(&s.ok(&["get", "deploy", "web", "-o", "json"]));
    assert_eq!(d["spec"]["template"]["spec"]["containers"][0]["image"], "x:3");

    // delete waits for the object to be gone (a watch on metadata.name)
    assert!(s.ok(&["delete", "deployment", "web"]).contains("deleted"));
    assert!(s.ok(&["delete", "configmap", "settings", "--wait=true"]).contains("deleted"));
    let out = s.kubectl(&["get", "deployment", "web"]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("NotFound") || String::from_utf8_lossy(&out.stderr).contains("not found"));
}

#[test]
fn pods_graceful_deletion_and_nodes() {
    let s = Server::start();
    s.apply(NODE);
    let pod = r#"
apiVersion: v1
kind: Pod
metadata: {name: p1, labels: {app: p}}
spec:
  containers: [{name: c, image: busybox}]
"#;
    s.apply(pod);
    let p = json(&s.ok(&["get", "pod", "p1", "-o", "json"]));
    assert_eq!(p["status"]["phase"], "Pending");
    assert_eq!(p["spec"]["restartPolicy"], "Always");
    assert_eq!(p["spec"]["containers"][0]["imagePullPolicy"], "Always");
    let desc = s.ok(&["describe", "pod", "p1"]);
    assert!(desc.contains("Status:") && desc.contains("Pending") && desc.contains("QoS Class:") && desc.contains("BestEffort"), "{desc}");
    let desc = s.ok(&["describe", "node", "node-a"]);
    assert!(desc.contains("Name:") && desc.contains("node-a"), "{desc}");
    let table = s.ok(&["get", "pods", "-o", "wide"]);
    assert!(table.contains("NOMINATED NODE") && table.contains("p1") && table.contains("Pending"), "{table}");
    // an unscheduled pod goes at once
    s.ok(&["delete", "pod", "p1"]);
    assert!(!s.kubectl(&["get", "pod", "p1"]).status.success());

    // a pod bound to a node stays terminating until grace 0
    s.apply(&pod.replace("spec:\n", "spec:\n  nodeName: node-a\n"));
    s.ok(&["delete", "pod", "p1", "--wait=false"]);
    let p = json(&s.ok(&["get", "pod", "p1", "-o", "json"]));
    assert!(p["metadata"]["deletionTimestamp"].is_string());
    assert_eq!(p["metadata"]["deletionGracePeriodSeconds"], 30);
    assert!(s.ok(&["get", "pods"]).contains("Terminating"));
    s.ok(&["delete", "pod", "p1", "--grace-period=0", "--force"]);
    assert!(!s.kubectl(&["get", "pod", "p1"]).status.success());

    s.ok(&["cordon", "node-a"]);
    assert!(s.ok(&["get", "nodes"]).contains("SchedulingDisabled"));
    s.ok(&["delete", "node", "node-a"]);
}

#[test]
fn get_watch_streams_changes() {
    let s = Server::start();
    s.apply(CONFIGMAP);
    let mut watch = std::process::Command::new("kubectl")
        .arg("--kubeconfig")
        .arg(s.kubeconfig())
        .args(["get", "configmaps", "-w", "--output-watch-events", "--request-timeout=30s"])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let stdout = watch.stdout.take().unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        use std::io::BufRead as _;
        for line in std::io::BufReader::new(stdout).lines() {
            if tx.send(line.unwrap()).is_err() {
                break;
            }
        }
    });
    let wait_for = |needle: &str| {
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
        loop {
            let left = deadline.saturating_duration_since(std::time::Instant::now());
            let line = rx.recv_timeout(left).unwrap_or_else(|_| panic!("no watch line with {needle}"));
            if line.contains(needle) {
                return line;
            }
        }
    };
    assert!(wait_for(" settings ").starts_with("ADDED"));
    s.apply(&CONFIGMAP.replace("name: settings", "name: second"));
    assert!(wait_for(" second ").starts_with("ADDED"));
    s.ok(&["label", "cm", "second", "a=b"]);
    assert!(wait_for(" second ").starts_with("MODIFIED"));
    s.ok(&["delete", "cm", "second"]);
    assert!(wait_for(" second ").starts_with("DELETED"));
    let _ = watch.kill();
    let _ = watch.wait();
}

#[test]
fn kubectl_errors_are_upstream_statuses() {
    let s = Server::start();
    let out = s.kubectl(&["get", "pod", "nope"]);
    assert_eq!(String::from_utf8_lossy(&out.stderr).trim(), "Error from server (NotFound): pods \"nope\" not found");
    let out = s.kubectl_stdin(&["apply", "-f", "-"], Some("apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: Bad_Name\n"));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("Invalid") && err.contains("metadata.name"), "{err}");
    let out = s.kubectl_stdin(
        &["apply", "-f", "-"],
        Some("apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: x\nbogusField: 1\n"),
    );
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && err.contains("bogusField"), "{err}");
    let out = s.kubectl(&["get", "widgets"]);
    assert!(!out.status.success());
    let out = s.kubectl(&["get", "pods", "-l", "a in (b"]);
    assert!(String::from_utf8_lossy(&out.stderr).contains("unable to parse requirement") || !out.status.success());
    // the deployment selector must match the template
    let bad = DEPLOYMENT.replace("template:\n    metadata:\n      labels: {app: web}", "template:\n    metadata:\n      labels: {app: other}");
    let out = s.kubectl_stdin(&["apply", "-f", "-"], Some(&bad));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("`selector` does not match template `labels`"), "{err}");
    // immutable selector
    s.apply(DEPLOYMENT);
    let out = s.kubectl(&["patch", "deploy", "web", "--type", "merge", "-p", r#"{"spec":{"selector":{"matchLabels":{"app":"web","x":"y"}}}}"#]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("field is immutable"), "{err}");
}

/// kubectl's typed clients (create configmap/secret/deployment/namespace/service, drain) send
/// their bodies as application/vnd.kubernetes.protobuf.
#[test]
fn typed_creates_send_protobuf_bodies() {
    let s = Server::start();
    assert!(s.ok(&["create", "configmap", "c1", "--from-literal=a=b"]).contains("configmap/c1 created"));
    let c = json(&s.ok(&["get", "configmap", "c1", "-o", "json"]));
    assert_eq!(c["data"], serde_json::json!({"a": "b"}));
    assert_eq!(c["metadata"]["namespace"], "default");

    assert!(s.ok(&["create", "secret", "generic", "s1", "--from-literal=k=v"]).contains("secret/s1 created"));
    let sec = json(&s.ok(&["get", "secret", "s1", "-o", "json"]));
    assert_eq!(sec["data"], serde_json::json!({"k": "dg=="}));
    assert_eq!(sec["type"], "Opaque");

    assert!(s.ok(&["create", "deployment", "web", "--image=nginx:1.21", "--replicas=3"]).contains("deployment.apps/web created"));
    let d = json(&s.ok(&["get", "deployment", "web", "-o", "json"]));
    assert_eq!(d["spec"]["replicas"], 3);
    assert_eq!(d["spec"]["template"]["spec"]["containers"][0]["image"], "nginx:1.21");
    assert_eq!(d["spec"]["selector"]["matchLabels"], serde_json::json!({"app": "web"}));
    assert_eq!(d["metadata"]["generation"], 1);

    assert!(s.ok(&["create", "namespace", "n1"]).contains("namespace/n1 created"));
    let n = json(&s.ok(&["get", "namespace", "n1", "-o", "json"]));
    assert_eq!(n["status"]["phase"], "Active");

    assert!(s.ok(&["create", "service", "clusterip", "s", "--tcp=80:8080"]).contains("service/s created"));
    let svc = json(&s.ok(&["get", "service", "s", "-o", "json"]));
    let port = &svc["spec"]["ports"][0];
    assert_eq!((port["port"].as_i64(), port["targetPort"].as_i64(), port["protocol"].as_str()), (Some(80), Some(8080), Some("TCP")));
    assert!(svc["spec"]["clusterIP"].as_str().is_some_and(|ip| !ip.is_empty()), "{svc}");

    assert!(s.ok(&["create", "serviceaccount", "robot", "-n", "n1"]).contains("serviceaccount/robot created"));
    s.ok(&["get", "serviceaccount", "robot", "-n", "n1"]);

    // kubectl run: a Pod
    assert!(s.ok(&["run", "p1", "--image=busybox", "--restart=Never", "--labels=app=p", "--port=8080"]).contains("pod/p1 created"));
    let p = json(&s.ok(&["get", "pod", "p1", "-o", "json"]));
    assert_eq!(p["spec"]["containers"][0]["ports"][0]["containerPort"], 8080);
    assert_eq!(p["spec"]["restartPolicy"], "Never");

    // a second create of the same name is the upstream AlreadyExists
    let out = s.kubectl(&["create", "configmap", "c1", "--from-literal=a=b"]);
    assert!(String::from_utf8_lossy(&out.stderr).contains("AlreadyExists") || String::from_utf8_lossy(&out.stderr).contains("already exists"));
}

/// kubectl drain evicts through pods/eviction with a protobuf Eviction body.
#[test]
fn drain_evicts_with_protobuf_bodies() {
    let s = Server::start();
    s.apply(NODE);
    let pod = r#"
apiVersion: v1
kind: Pod
metadata: {name: p1}
spec:
  nodeName: node-a
  containers: [{name: c, image: busybox}]
"#;
    s.apply(pod);
    let out = s.ok(&["drain", "node-a", "--force", "--grace-period=0", "--timeout=30s"]);
    assert!(out.contains("evicting pod default/p1") || out.contains("pod/p1 evicted"), "{out}");
    assert!(out.contains("node/node-a drained"), "{out}");
    assert!(!s.kubectl(&["get", "pod", "p1"]).status.success());
    assert!(s.ok(&["get", "nodes"]).contains("SchedulingDisabled"));
}

/// `kubectl create --raw` of a review as `kubeconfig`'s user: (success, stdout or stderr).
fn review(kubeconfig: &std::path::Path, path: &str, body: &Value) -> (bool, String) {
    let mut cmd = std::process::Command::new("kubectl");
    cmd.arg("--kubeconfig").arg(kubeconfig).args(["create", "--raw", path, "-f", "-"]);
    cmd.stdin(std::process::Stdio::piped()).stdout(std::process::Stdio::piped()).stderr(std::process::Stdio::piped());
    let mut child = cmd.spawn().unwrap();
    use std::io::Write as _;
    child.stdin.take().unwrap().write_all(body.to_string().as_bytes()).unwrap();
    let out = child.wait_with_output().unwrap();
    if out.status.success() {
        (true, String::from_utf8_lossy(&out.stdout).into_owned())
    } else {
        (false, String::from_utf8_lossy(&out.stderr).into_owned())
    }
}

#[test]
fn token_and_subject_access_reviews() {
    let s = Server::start();
    let admin = s.kubeconfig();
    let token = std::fs::read_to_string(&admin)
        .unwrap()
        .lines()
        .find_map(|l| l.trim().strip_prefix("token:").map(|t| t.trim().trim_matches('"').to_string()))
        .expect("the admin kubeconfig carries a token");
    const TR: &str = "/apis/authentication.k8s.io/v1/tokenreviews";
    const SAR: &str = "/apis/authorization.k8s.io/v1/subjectaccessreviews";
    let tr = |t: &str| serde_json::json!({"apiVersion": "authentication.k8s.io/v1", "kind": "TokenReview", "spec": {"token": t}});

    // TokenReview, by the admin and by a node (the kubelet's delegated authentication).
    let node = s.cert_kubeconfig("system:node:n1", &["system:nodes"]);
    for who in [&admin, &node] {
        let (ok, out) = review(who, TR, &tr(&token));
        assert!(ok, "{out}");
        let v: Value = serde_json::from_str(&out).unwrap();
        assert_eq!(v["kind"], "TokenReview");
        assert_eq!(v["status"]["authenticated"], true, "{v}");
        assert!(v["status"]["user"]["groups"].as_array().unwrap().contains(&"system:masters".into()), "{v}");
    }
    let (ok, out) = review(&admin, TR, &tr("not-a-token"));
    assert!(ok, "{out}");
    let v: Value = serde_json::from_str(&out).unwrap();
    assert!(v["status"]["authenticated"].is_null(), "{v}");

    // SubjectAccessReview: the admin may use a node's proxy, a node may not.
    let sar = |user: &str, groups: &[&str]| {
        serde_json::json!({"apiVersion": "authorization.k8s.io/v1", "kind": "SubjectAccessReview",
            "spec": {"user": user, "groups": groups,
                     "resourceAttributes": {"verb": "get", "resource": "nodes", "subresource": "proxy", "name": "n1"}}})
    };
    let (ok, out) = review(&node, SAR, &sar("admin", &["system:masters"]));
    assert!(ok, "{out}");
    assert_eq!(serde_json::from_str::<Value>(&out).unwrap()["status"]["allowed"], true, "{out}");
    let (ok, out) = review(&node, SAR, &sar("system:node:n2", &["system:nodes"]));
    assert!(ok, "{out}");
    let v: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v["status"]["allowed"], false, "{v}");
    // as upstream: no authorizer had an opinion, so there is no reason to give
    assert!(v["status"].get("reason").is_none(), "{v}");

    // Bad input and callers that may not review.
    let (ok, out) = review(&admin, SAR, &serde_json::json!({"apiVersion": "authorization.k8s.io/v1", "kind": "SubjectAccessReview", "spec": {"user": "a"}}));
    assert!(!ok && out.contains("exactly one of nonResourceAttributes or resourceAttributes"), "{out}");
    let (ok, out) = review(&admin, TR, &serde_json::json!({"apiVersion": "v1", "kind": "TokenReview", "spec": {"token": "x"}}));
    assert!(!ok && out.contains("does not match the expected API version"), "{out}");
    let jane = s.cert_kubeconfig("jane", &[]);
    let (ok, out) = review(&jane, TR, &tr(&token));
    assert!(!ok && out.contains("forbidden") && out.contains("tokenreviews"), "{out}");
    let out = s.kubectl(&["get", "--raw", TR]);
    assert!(!out.status.success(), "GET of a review is not allowed");
}

/// `kubectl create -f` of a kind whose /openapi/v3 path has no PATCH (the reviews) validates
/// it on the client against /openapi/v2, which kubectl reads in gnostic's protobuf: a valid
/// review goes through, unknown fields and wrong types are refused by kubectl itself (its
/// `ValidationError(...)` messages name our definitions), before anything reaches the server.
#[test]
fn create_only_kinds_are_validated_by_kubectl_against_openapi_v2() {
    let s = Server::start();
    let create = |manifest: &str| s.kubectl_stdin(&["create", "-f", "-", "-o", "json"], Some(manifest));

    let out = create("apiVersion: authentication.k8s.io/v1\nkind: TokenReview\nspec:\n  token: not-a-token\n  audiences: [api]\n");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["kind"], "TokenReview");
    assert!(v["status"]["authenticated"].is_null(), "{v}");

    let out = create("apiVersion: authorization.k8s.io/v1\nkind: SelfSubjectAccessReview\nspec:\n  resourceAttributes: {verb: list, resource: pods, namespace: default}\n");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["status"]["allowed"], true, "{v}");

    // refused by kubectl's own validation, with the definitions' names
    let out = create("apiVersion: authentication.k8s.io/v1\nkind: TokenReview\nspec:\n  tokn: abc\n");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(err.contains("ValidationError(TokenReview.spec)") && err.contains("unknown field \"tokn\""), "{err}");
    assert!(err.contains("io.k8s.api.authentication.v1.TokenReviewSpec"), "{err}");
    let out = create("apiVersion: authentication.k8s.io/v1\nkind: TokenReview\nspec:\n  token: abc\n  audiences: api\n");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(err.contains("ValidationError(TokenReview.spec.audiences)") && err.contains("expected \"array\""), "{err}");
    // --validate=false leaves it to the server, which ignores the unknown field
    let out = s.kubectl_stdin(&["create", "--validate=false", "-f", "-", "-o", "json"], Some("apiVersion: authentication.k8s.io/v1\nkind: TokenReview\nspec:\n  token: abc\n  tokn: abc\n"));
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));

    // the JSON form: Swagger 2.0, the review kinds tagged with their group-version-kind,
    // references into #/definitions that resolve, no paths (kubectl's client-side apply keeps
    // its compiled-in patch strategies)
    let doc: Value = serde_json::from_str(&s.ok(&["get", "--raw", "/openapi/v2"])).unwrap();
    assert_eq!(doc["swagger"], "2.0");
    assert_eq!(doc["paths"], serde_json::json!({}));
    let defs = doc["definitions"].as_object().unwrap();
    assert_eq!(
        defs["io.k8s.api.authentication.v1.TokenReview"]["x-kubernetes-group-version-kind"],
        serde_json::json!([{"group": "authentication.k8s.io", "version": "v1", "kind": "TokenReview"}])
    );
    assert_eq!(defs["io.k8s.api.core.v1.Pod"]["x-kubernetes-group-version-kind"][0]["kind"], "Pod");
    let text = doc.to_string();
    for r in text.split("\"$ref\":\"").skip(1) {
        let target = &r[..r.find('"').unwrap()];
        let name = target.strip_prefix("#/definitions/").unwrap_or_else(|| panic!("a v2 reference: {target}"));
        assert!(defs.contains_key(name), "{target} resolves");
    }
}
