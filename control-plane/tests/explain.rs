//! Every loop explains itself: `/debug/controllers/<loop>/<namespace>/<name>` through kubectl,
//! against the real binary with fake nodes. The explanations follow the objects as they
//! change (what the planner would do now and why it waits), and bad requests get Status
//! errors.
#![allow(clippy::unwrap_used)]

mod common;

use common::fake::{eventually, FakeNodes};
use common::Server;
use serde_json::{json, Value};

/// GET of a debug path through `kubectl get --raw`: Ok(body) or Err(kubectl's error text).
fn raw(s: &Server, path: &str) -> Result<String, String> {
    let out = s.kubectl(&["get", "--raw", path]);
    if out.status.success() {
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    } else {
        Err(String::from_utf8_lossy(&out.stderr).into_owned())
    }
}

fn explain(s: &Server, what: &str) -> Value {
    serde_json::from_str(&raw(s, &format!("/debug/controllers/{what}")).unwrap()).unwrap()
}

fn strings(v: &Value) -> Vec<String> {
    v.as_array().into_iter().flatten().filter_map(|x| x.as_str().map(str::to_string)).collect()
}

const WEB: &str = r#"apiVersion: apps/v1
kind: StatefulSet
metadata: {name: web}
spec:
  serviceName: web
  replicas: 3
  selector: {matchLabels: {app: web}}
  template:
    metadata:
      labels: {app: web}
      annotations: {fake.ferro.dev/ready: "false"}
    spec: {containers: [{name: c, image: "busybox:1"}]}
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_statefulset_explains_what_it_waits_for() {
    let s = Server::start();
    let client = s.client().await;
    let _nodes = FakeNodes::start(client.clone(), &["n1"], "4", "8Gi").await;
    s.apply(WEB);

    // web-0 runs but is not ready: OrderedReady holds web-1 back
    let want = "web-1 waits for web-0 to be Running and Ready (it is Running, not Ready) (OrderedReady)";
    let e = eventually("web-1 waiting for web-0", || async {
        let e = explain(&s, "statefulset/default/web");
        strings(&e["waiting"]).contains(&want.to_string()).then_some(e)
    })
    .await;
    assert_eq!(e["kind"], "ControllerExplanation");
    assert_eq!(e["apiVersion"], "debug.ferro.dev/v1");
    assert_eq!(e["controller"], "statefulset");
    assert_eq!(e["object"]["kind"], "StatefulSet");
    assert_eq!(e["object"]["name"], "web");
    assert_eq!(e["observed"]["pods"], json!([{"name": "web-0", "state": "Running, not Ready", "revision": e["wants"]["updateRevision"]}]));
    assert_eq!(e["wants"]["replicas"], 3);
    assert_eq!(e["wants"]["pods"], "web-0..web-2");
    assert_eq!(e["wants"]["podManagementPolicy"], "OrderedReady");
    // nothing to write while it waits
    assert_eq!(e["actions"], json!([]), "{e:#}");

    let text = raw(&s, "/debug/controllers/statefulset/default/web?format=text").unwrap();
    assert!(text.starts_with("statefulset default/web (StatefulSet uid "), "{text}");
    assert!(text.contains(&format!("waiting:\n  - {want}\n")), "{text}");
    assert!(text.contains("actions:\n  none: the object is as the loop wants it\n"), "{text}");

    // web-0 becomes ready: the explanation moves on to web-1
    s.ok(&["annotate", "pod", "web-0", "--overwrite", "fake.ferro.dev/ready=true"]);
    let want = "web-2 waits for web-1 to be Running and Ready (it is Running, not Ready) (OrderedReady)";
    eventually("web-2 waiting for web-1", || async {
        let e = explain(&s, "statefulset/default/web");
        strings(&e["waiting"]).contains(&want.to_string()).then_some(())
    })
    .await;

    // a partition keeps web-0 at the old revision; the update waits for the unready pods
    s.ok(&["annotate", "pod", "web-1", "--overwrite", "fake.ferro.dev/ready=true"]);
    s.ok(&["patch", "statefulset", "web", "--type=merge", "-p",
        r#"{"spec":{"updateStrategy":{"rollingUpdate":{"partition":1}},"template":{"metadata":{"labels":{"v":"2"}}}}}"#]);
    let e = eventually("the partition held and the update waiting", || async {
        let e = explain(&s, "statefulset/default/web");
        let w = strings(&e["waiting"]);
        let held = w.iter().any(|m| m.starts_with("web-0 stay at revision ") && m.ends_with(" below the partition (1)"));
        held.then_some(e)
    })
    .await;
    assert_ne!(e["wants"]["currentRevision"], e["wants"]["updateRevision"], "{e:#}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_explain_requests_get_status_errors() {
    let s = Server::start_with(&["--controllers=*,-podgc"]);
    let idx: Value = serde_json::from_str(&raw(&s, "/debug/controllers").unwrap()).unwrap();
    assert_eq!(idx["kind"], "ControllerList");
    assert!(strings(&idx["running"]).contains(&"statefulset".to_string()), "{idx}");
    assert!(!strings(&idx["running"]).contains(&"podgc".to_string()), "{idx}");
    assert!(strings(&idx["explaining"]).contains(&"statefulset".to_string()), "{idx}");

    let err = raw(&s, "/debug/controllers/statefulset/default/nope").unwrap_err();
    assert!(err.contains("(NotFound)") && err.contains("statefulsets.apps \"nope\" not found"), "{err}");
    let err = raw(&s, "/debug/controllers/statefulsets/default/web").unwrap_err();
    assert!(err.contains("controller \"statefulsets\" does not exist; known: scheduler,"), "{err}");
    let err = raw(&s, "/debug/controllers/podgc/default/web").unwrap_err();
    assert!(err.contains("controller \"podgc\" is not running in this process"), "{err}");
    let err = raw(&s, "/debug/controllers/statefulset").unwrap_err();
    assert!(err.contains("(BadRequest)") && err.contains("/debug/controllers/<controller>/<namespace>/<name>"), "{err}");
    // a namespaced kind asked without a namespace is not there
    let err = raw(&s, "/debug/controllers/statefulset/web").unwrap_err();
    assert!(err.contains("(NotFound)") && err.contains("statefulsets.apps \"web\" not found"), "{err}");

    // the admin's only
    let jane = s.cert_kubeconfig("jane", &[]);
    let out = std::process::Command::new("kubectl")
        .args(["--kubeconfig", jane.to_str().unwrap(), "get", "--raw", "/debug/controllers"])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && err.contains("(Forbidden)"), "{err}");
    assert!(err.contains("User \"jane\" cannot get path \"/debug/controllers\""), "{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_other_workload_loops_explain_themselves() {
    let s = Server::start();
    let client = s.client().await;
    let _nodes = FakeNodes::start(client.clone(), &["n1", "n2"], "4", "8Gi").await;
    s.ok(&["taint", "node", "n2", "dedicated=db:NoSchedule"]);
    s.apply(
        r#"apiVersion: apps/v1
kind: DaemonSet
metadata: {name: agent}
spec:
  selector: {matchLabels: {app: agent}}
  template:
    metadata: {labels: {app: agent}}
    spec: {containers: [{name: c, image: "busybox:1"}]}
---
apiVersion: batch/v1
kind: Job
metadata: {name: batch}
spec:
  completions: 4
  parallelism: 2
  template:
    spec: {restartPolicy: Never, containers: [{name: c, image: "busybox:1"}]}
---
apiVersion: apps/v1
kind: Deployment
metadata: {name: front}
spec:
  replicas: 2
  paused: true
  selector: {matchLabels: {app: front}}
  template:
    metadata: {labels: {app: front}}
    spec: {containers: [{name: c, image: "busybox:1"}]}
---
apiVersion: policy/v1
kind: PodDisruptionBudget
metadata: {name: agent}
spec:
  minAvailable: 1
  selector: {matchLabels: {app: agent}}
---
apiVersion: batch/v1
kind: CronJob
metadata: {name: nightly}
spec:
  schedule: "0 3 * * *"
  suspend: true
  jobTemplate:
    spec:
      template:
        spec: {restartPolicy: Never, containers: [{name: c, image: "busybox:1"}]}
"#,
    );

    // the DaemonSet: n1 gets a pod, n2's taint keeps it off, in words
    let e = eventually("the daemon pod on n1", || async {
        let e = explain(&s, "daemonset/default/agent");
        let n1 = e["observed"]["nodes"].as_array()?.iter().find(|n| n["name"] == "n1")?.clone();
        (n1["pods"].as_array()?.len() == 1).then_some(e)
    })
    .await;
    let n2 = e["observed"]["nodes"].as_array().unwrap().iter().find(|n| n["name"] == "n2").unwrap().clone();
    assert_eq!(n2["notEligible"], "the node has the taint dedicated=db:NoSchedule the pods do not tolerate", "{e:#}");
    assert_eq!(e["wants"]["nodes"], json!(["n1"]));

    // the Job: two pods run (its pods never finish here), two completions wait for them
    let want = "2 pods run, as many as parallelism allows; 4 completions still to go";
    let e = eventually("the Job at its parallelism", || async {
        let e = explain(&s, "job/default/batch");
        strings(&e["waiting"]).contains(&want.to_string()).then_some(e)
    })
    .await;
    assert_eq!(e["observed"]["pods"].as_array().unwrap().len(), 2, "{e:#}");
    assert_eq!(e["wants"]["parallelism"], 2);
    // suspending it: the planner would delete both pods, and says why
    s.ok(&["patch", "job", "batch", "--type=merge", "-p", r#"{"spec":{"suspend":true}}"#]);
    eventually("the suspended Job", || async {
        let e = explain(&s, "job/default/batch");
        let suspended = strings(&e["waiting"]).iter().any(|w| w.starts_with("the Job is suspended (spec.suspend)"));
        suspended.then_some(())
    })
    .await;

    // the paused Deployment
    let e = explain(&s, "deployment/default/front");
    assert!(strings(&e["waiting"]).iter().any(|w| w.starts_with("the Deployment is paused")), "{e:#}");
    assert_eq!(e["wants"]["paused"], true);

    // the budget: one healthy daemon pod, one must stay so: evictions are refused
    let e = eventually("the budget's arithmetic", || async {
        let e = explain(&s, "disruption/default/agent");
        (e["wants"]["currentHealthy"] == 1).then_some(e)
    })
    .await;
    assert_eq!(e["wants"]["desiredHealthy"], 1);
    assert_eq!(e["wants"]["disruptionsAllowed"], 0);
    assert!(strings(&e["waiting"]).contains(&"evictions are refused: 1 healthy pods, 1 must stay healthy".to_string()), "{e:#}");

    // the suspended CronJob; resumed, it names its next run
    let e = explain(&s, "cronjob/default/nightly");
    assert!(strings(&e["waiting"]).iter().any(|w| w.starts_with("the CronJob is suspended")), "{e:#}");
    assert_eq!(e["wants"]["schedule"], "0 3 * * *");
    s.ok(&["patch", "cronjob", "nightly", "--type=merge", "-p", r#"{"spec":{"suspend":false}}"#]);
    let e = eventually("the next run named", || async {
        let e = explain(&s, "cronjob/default/nightly");
        strings(&e["waiting"]).iter().any(|w| w.starts_with("the next run is due at ")).then_some(e)
    })
    .await;
    let next = e["wants"]["nextRun"].as_str().unwrap().to_string();
    assert!(next.ends_with("T03:00:00Z"), "{e:#}");

    // a ReplicaSet explains itself too (the Deployment's, once unpaused)
    s.ok(&["rollout", "resume", "deployment/front"]);
    s.ok(&["rollout", "status", "deployment/front", "--timeout=90s"]);
    let rs = s.ok(&["get", "rs", "-l", "app=front", "-o", "jsonpath={.items[0].metadata.name}"]);
    // the loop's explanation follows its last pass, a moment after the status rollout status read
    let e = eventually("the ReplicaSet's loop with nothing left to do", || async {
        let e = explain(&s, &format!("replicaset/default/{}", rs.trim()));
        (e["actions"] == json!([]) && e["observed"]["pods"].as_array().is_some_and(|p| p.len() == 2)).then_some(e)
    })
    .await;
    assert_eq!(e["wants"]["replicas"], 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_scheduler_and_the_cleanup_loops_explain_themselves() {
    let s = Server::start();
    let client = s.client().await;
    let _nodes = FakeNodes::start(client.clone(), &["n1"], "4", "8Gi").await;
    s.apply(
        r#"apiVersion: v1
kind: Pod
metadata: {name: huge}
spec:
  containers: [{name: c, image: "busybox:1", resources: {requests: {cpu: "64"}}}]
---
apiVersion: v1
kind: Pod
metadata: {name: small}
spec:
  containers: [{name: c, image: "busybox:1"}]
---
apiVersion: batch/v1
kind: Job
metadata: {name: once}
spec:
  ttlSecondsAfterFinished: 3600
  template:
    metadata: {annotations: {fake.ferro.dev/exit-code: "0"}}
    spec: {restartPolicy: Never, containers: [{name: c, image: "busybox:1"}]}
"#,
    );
    // a pod that fits nowhere: each node's verdict, and upstream's message
    let e = eventually("the huge pod unschedulable", || async {
        let e = explain(&s, "scheduler/default/huge");
        (!e["waiting"].as_array()?.is_empty()).then_some(e)
    })
    .await;
    assert_eq!(e["observed"]["nodes"], json!([{"name": "n1", "fits": false, "reasons": ["Insufficient cpu"]}]), "{e:#}");
    let w = strings(&e["waiting"]);
    assert!(w[0].starts_with("0/1 nodes are available: 1 Insufficient cpu."), "{w:?}");
    // a bound pod: nothing to do
    let e = eventually("the small pod bound", || async {
        let e = explain(&s, "scheduler/default/small");
        (e["wants"]["nodeName"] == "n1").then_some(e)
    })
    .await;
    assert_eq!(strings(&e["waiting"]), ["nothing to do: the pod is bound to node n1"]);
    // PodGC leaves a running pod alone, and says so
    let e = explain(&s, "podgc/default/small");
    assert_eq!(e["actions"], json!([]));
    assert!(strings(&e["waiting"])[0].starts_with("nothing to do: the pod is neither terminated"), "{e:#}");
    // the finished Job waits for its TTL
    let e = eventually("the Job's TTL running", || async {
        let e = explain(&s, "ttl-after-finished/default/once");
        strings(&e["waiting"]).iter().any(|w| w.starts_with("the Job is deleted when its TTL runs out, in 59m")).then_some(e)
    })
    .await;
    assert_eq!(e["observed"]["finished"], true, "{e:#}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_service_storage_node_and_namespace_loops_explain_themselves() {
    let s = Server::start_with(&["--allocate-node-cidrs", "--cluster-cidr", "10.244.0.0/16"]);
    let client = s.client().await;
    let _nodes = FakeNodes::start(client.clone(), &["n1"], "4", "8Gi").await;
    s.apply(
        r#"apiVersion: v1
kind: Service
metadata: {name: web}
spec:
  selector: {app: web}
  ports: [{port: 80}]
---
apiVersion: v1
kind: Pod
metadata: {name: w1, labels: {app: web}}
spec:
  containers: [{name: c, image: "busybox:1"}]
---
apiVersion: v1
kind: PersistentVolumeClaim
metadata: {name: lonely}
spec:
  accessModes: [ReadWriteOnce]
  storageClassName: manual
  resources: {requests: {storage: 1Gi}}
---
apiVersion: snapshot.storage.k8s.io/v1
kind: VolumeSnapshot
metadata: {name: snap}
spec:
  source: {persistentVolumeClaimName: lonely}
"#,
    );
    // the Service's endpoints follow its ready pod
    let e = eventually("the ready endpoint", || async {
        let e = explain(&s, "endpointslice/default/web");
        let pods = e["observed"]["pods"].as_array()?.clone();
        (pods.len() == 1 && pods[0]["state"] == "ready" && e["actions"] == json!([])).then_some(e)
    })
    .await;
    assert_eq!(e["observed"]["slices"].as_array().unwrap().len(), 1, "{e:#}");
    assert_eq!(e["object"]["kind"], "Service");
    // the claim with no volume and no provisioner
    let e = explain(&s, "persistentvolume-binder/default/lonely");
    assert!(strings(&e["waiting"])[0].starts_with("waits for a matching Available volume"), "{e:#}");
    assert_eq!(e["wants"]["storage"], "1Gi");
    // the snapshot of an unbound claim says what it waits for or fails on
    let e = explain(&s, "volumesnapshot/default/snap");
    assert_eq!(e["object"]["kind"], "VolumeSnapshot");
    assert!(!(e["waiting"].as_array().unwrap().is_empty() && e["actions"].as_array().unwrap().is_empty()), "{e:#}");
    // cluster-scoped objects: /debug/controllers/<loop>/<name>
    let e = explain(&s, "nodelifecycle/n1");
    assert_eq!(e["object"]["kind"], "Node");
    assert!(strings(&e["waiting"])[0].starts_with("the node is marked unreachable if no heartbeat comes within "), "{e:#}");
    let e = eventually("n1's pod CIDR", || async {
        let e = explain(&s, "nodeipam/n1");
        e["observed"]["podCIDR"].is_string().then_some(e)
    })
    .await;
    assert_eq!(strings(&e["waiting"]), ["nothing to do: the node has its pod CIDR"]);
    let e = explain(&s, "namespace/default");
    assert_eq!(strings(&e["waiting"]), ["nothing to do: the namespace is not being deleted"]);
    let e = eventually("the default account", || async {
        let e = explain(&s, "serviceaccount/default");
        (e["observed"]["defaultServiceAccount"] == true).then_some(e)
    })
    .await;
    assert_eq!(e["actions"], json!([]));
    // a namespace being deleted names what is left in it
    s.ok(&["create", "namespace", "gone"]);
    s.ok(&["create", "configmap", "left", "-n", "gone"]);
    s.ok(&["patch", "configmap", "left", "-n", "gone", "--type=merge", "-p", r#"{"metadata":{"finalizers":["example.com/hold"]}}"#]);
    s.ok(&["delete", "namespace", "gone", "--wait=false"]);
    let e = eventually("the held configmap named", || async {
        let e = explain(&s, "namespace/gone");
        strings(&e["waiting"]).iter().any(|w| w.starts_with("configmaps being deleted: left (finalizers example.com/hold)")).then_some(e)
    })
    .await;
    assert_eq!(e["wants"]["phase"], "gone");
    s.ok(&["patch", "configmap", "left", "-n", "gone", "--type=merge", "-p", r#"{"metadata":{"finalizers":null}}"#]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_garbage_collector_explains_an_object_of_any_kind() {
    let s = Server::start();
    s.ok(&["create", "configmap", "parent"]);
    let uid = s.ok(&["get", "configmap", "parent", "-o", "jsonpath={.metadata.uid}"]);
    s.apply(&format!(
        "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: child\n  ownerReferences: [{{apiVersion: v1, kind: ConfigMap, name: parent, uid: {}}}]\n",
        uid.trim()
    ));
    let e = eventually("the child in the graph", || async {
        let out = raw(&s, "/debug/controllers/garbagecollector/default/child?kind=ConfigMap").ok()?;
        let e: Value = serde_json::from_str(&out).ok()?;
        (e["observed"]["owners"][0]["inGraph"] == true).then_some(e)
    })
    .await;
    assert_eq!(e["object"]["kind"], "ConfigMap");
    assert_eq!(strings(&e["waiting"]), ["nothing to do: its owners exist (ConfigMap parent)"]);
    let e = explain(&s, "garbagecollector/default/parent?kind=ConfigMap");
    assert_eq!(e["observed"]["dependents"], json!(["ConfigMap child"]));
    assert_eq!(strings(&e["waiting"]), ["nothing to do: it has no owners"]);
    // the kind is needed, and must be served
    let err = raw(&s, "/debug/controllers/garbagecollector/default/child").unwrap_err();
    assert!(err.contains("(BadRequest)") && err.contains("name one with ?kind=<Kind>"), "{err}");
    let err = raw(&s, "/debug/controllers/garbagecollector/default/child?kind=Widget").unwrap_err();
    assert!(err.contains("no served kind \"Widget\""), "{err}");
    // deleting the parent in the foreground: the parent waits for its child
    s.ok(&["patch", "configmap", "child", "--type=merge", "-p", r#"{"metadata":{"finalizers":["example.com/hold"]}}"#]);
    s.ok(&["delete", "configmap", "parent", "--cascade=foreground", "--wait=false"]);
    eventually("the parent waiting in the foreground", || async {
        let e = explain(&s, "garbagecollector/default/parent?kind=ConfigMap");
        strings(&e["waiting"]).contains(&"the foreground deletion waits for its 1 dependents to be gone".to_string()).then_some(())
    })
    .await;
    s.ok(&["patch", "configmap", "child", "--type=merge", "-p", r#"{"metadata":{"finalizers":null}}"#]);
}
