//! The multi-node lab (ferro_lab::cluster): a control plane and three nodes, each a network
//! namespace with its own containerd, ferro-agent, ferro-netd, ferro-proxy and ferro-csi,
//! joined by an underlay bridge. Pods on different nodes talk over the VXLAN overlay; a
//! Service balances over pods on every node, by its ClusterIP from a pod and by its NodePort
//! from outside the nodes; a node that fails loses its pods to the others and rejoins; a
//! StatefulSet's claim lands on the node with room for it. Needs root; run by scripts/test.sh.
#![allow(clippy::unwrap_used)]

use std::collections::BTreeSet;
use std::time::Duration;

use ferro_lab::images::BUSYBOX_IMAGE;
use ferro_lab::cluster::{httpd_deployment, httpd_pod, node_ip, node_name, pod_ready, sleeper_pod, Cluster, PodView};
use serde_json::Value;

const NODES: usize = 3;
/// ferro-csi's pool on each node: only the third has room for a 300Mi claim.
const POOLS: [&str; NODES] = ["100Mi", "100Mi", "600Mi"];
const MIN: Duration = Duration::from_secs(60);

fn pod(c: &Cluster, name: &str) -> Value {
    serde_json::from_str(&c.kubectl_ok(&["get", "pod", name, "-o", "json"]).unwrap()).unwrap()
}

/// `Cluster::fetch` from the pod `client` until it answers; on timeout the last failure is in
/// the panic.
fn client_reaches(c: &Cluster, what: &str, url: &str) -> String {
    let mut last = String::new();
    c.wait(what, MIN, |c| match c.fetch("client", url, 3) {
        Ok(body) => Some(body),
        Err(e) => {
            last = e;
            None
        }
    })
    .unwrap_or_else(|e| panic!("{e}\nlast failure: {last}"))
}

/// Requests `fetch` until every name in `want` answered (each answer is a pod name).
fn until_all_answer(c: &Cluster, what: &str, want: &BTreeSet<String>, mut fetch: impl FnMut() -> Option<String>) -> BTreeSet<String> {
    let mut seen = BTreeSet::new();
    c.wait(what, MIN, |_| {
        if let Some(answer) = fetch() {
            let answer = answer.trim().to_string();
            assert!(want.contains(&answer), "{what}: unexpected answer {answer:?}");
            seen.insert(answer);
        }
        (&seen == want).then_some(())
    })
    .unwrap_or_else(|e| panic!("{e}\nanswered so far: {seen:?}"));
    seen
}

/// One cluster, three acts (a cluster takes a while to start on 2 cores):
/// 1. pods pinned to each node talk across nodes over the overlay; a NodePort Service over
///    them answers from every node's pod by its ClusterIP from a pod and by its NodePort on
///    each node from the underlay;
/// 2. a Deployment's node loses its agent and netd: the node goes Unknown, its pods are
///    evicted (their tolerationSeconds) and replaced on the other nodes, the Service follows
///    them; the node comes back, ends the pods deleted meanwhile and runs new ones;
/// 3. a StatefulSet with a 300Mi WaitForFirstConsumer claim: the scheduler places its pod on
///    the one node whose CSI pool has room (published CSIStorageCapacity), the volume is
///    provisioned there, holds data, and goes with the claim.
#[test]
#[ignore = "privileged: needs root, containerd and network namespaces; run by scripts/test.sh"]
fn three_nodes_overlay_services_and_a_node_that_fails_and_returns() {
    let mut c = Cluster::start("svc", &POOLS, "10s").unwrap_or_else(|e| panic!("{e:#}"));
    // every node has a podCIDR of its own from the control plane
    let cidrs: BTreeSet<String> = (0..NODES)
        .map(|i| c.kubectl_ok(&["get", "node", &node_name(i), "-o", "jsonpath={.spec.podCIDR}"]).unwrap())
        .collect();
    assert_eq!(cidrs.len(), NODES, "{cidrs:?}");
    // every agent joined with the bootstrap token: one signed CSR each, asked by the token
    let csrs = c.kubectl_ok(&["get", "csr", "-o", "jsonpath={range .items[*]}{.spec.username} {.status.certificate}{\"\\n\"}{end}"]).unwrap();
    let joined: Vec<&str> = csrs.lines().filter(|l| l.starts_with("system:bootstrap:") && l.split(' ').nth(1).is_some_and(|cert| !cert.is_empty())).collect();
    assert_eq!(joined.len(), NODES, "{csrs}");

    for i in 0..NODES {
        c.apply(&httpd_pod(&format!("web-{}", node_name(i)), Some("web"), &node_name(i))).unwrap();
    }
    c.apply(&sleeper_pod("client", "node1")).unwrap();
    c.apply("apiVersion: v1\nkind: Service\nmetadata:\n  name: web\nspec:\n  type: NodePort\n  selector: {app: web}\n  ports:\n  - {port: 80, targetPort: 8080}\n").unwrap();
    let want: BTreeSet<String> = (0..NODES).map(|i| format!("web-{}", node_name(i))).collect();
    let mut ips = Vec::new();
    for (i, name) in want.iter().enumerate() {
        let p = c.wait(&format!("{name} ready"), Duration::from_secs(120), |c| Some(pod(c, name)).filter(pod_ready)).unwrap();
        assert_eq!(p["spec"]["nodeName"], node_name(i), "{name} runs where its nodeSelector says");
        ips.push(p["status"]["podIP"].as_str().unwrap().to_string());
    }
    c.wait("client running", Duration::from_secs(120), |c| (pod(c, "client")["status"]["phase"] == "Running").then_some(())).unwrap();

    // pod to pod, across nodes: node1's client reaches each web pod by its address
    for (name, ip) in want.iter().zip(&ips) {
        let answer = client_reaches(&c, &format!("client -> {name} ({ip})"), &format!("http://{ip}:8080/"));
        assert_eq!(&answer, name);
    }

    // the ClusterIP from a pod: every endpoint answers, on every node
    let cluster_ip = c.kubectl_ok(&["get", "service", "web", "-o", "jsonpath={.spec.clusterIP}"]).unwrap();
    until_all_answer(&c, "the ClusterIP to reach the pods of every node", &want, || c.fetch("client", &format!("http://{cluster_ip}/"), 3).ok());

    // the NodePort from outside the nodes (the underlay), through each node in turn
    let node_port = c.kubectl_ok(&["get", "service", "web", "-o", "jsonpath={.spec.ports[0].nodePort}"]).unwrap();
    for i in 0..NODES {
        let url = format!("http://{}:{node_port}/", node_ip(i));
        until_all_answer(&c, &format!("the NodePort of {} to reach the pods of every node", node_name(i)), &want, || {
            let out = c.under.command("curl").args(["-fsS", "--max-time", "3", &url]).output().ok()?;
            out.status.success().then(|| String::from_utf8_lossy(&out.stdout).into_owned())
        });
    }

    let mut delete = vec!["delete", "pod", "client", "--wait=true", "--timeout=60s"];
    let names: Vec<&str> = want.iter().map(String::as_str).collect();
    delete.extend(names);
    c.kubectl_ok(&delete).unwrap();
    c.kubectl_ok(&["delete", "service", "web"]).unwrap();
    for n in &c.nodes {
        c.wait(&format!("{}'s containers to go", n.name), MIN, |_| n.ctrd.ctr(&["containers", "ls", "-q"]).ok().filter(|o| o.trim().is_empty()))
            .unwrap();
    }

    node_fails_and_returns(&mut c);
    a_claim_lands_on_the_node_with_room(&c);
}

fn a_claim_lands_on_the_node_with_room(c: &Cluster) {
    c.apply("apiVersion: storage.k8s.io/v1\nkind: StorageClass\nmetadata:\n  name: loop\nprovisioner: loop.csi.ferro.dev\nvolumeBindingMode: WaitForFirstConsumer\nreclaimPolicy: Delete\n").unwrap();
    // every node's driver has published what it can hold for the class
    c.wait("a CSIStorageCapacity of class loop per node", MIN, |c| {
        let out = c.kubectl_ok(&["get", "csistoragecapacities", "-A", "-o", "jsonpath={range .items[?(@.storageClassName==\"loop\")]}{.nodeTopology.matchLabels}{\"\\n\"}{end}"]).ok()?;
        (out.lines().filter(|l| !l.trim().is_empty()).count() == NODES).then_some(())
    })
    .unwrap();
    c.apply(&format!(
        "apiVersion: apps/v1\nkind: StatefulSet\nmetadata:\n  name: db\nspec:\n  serviceName: db\n  replicas: 1\n  selector: {{matchLabels: {{app: db}}}}\n  template:\n    metadata: {{labels: {{app: db}}}}\n    spec:\n      terminationGracePeriodSeconds: 1\n      containers:\n      - name: db\n        image: {BUSYBOX_IMAGE}\n        imagePullPolicy: Never\n        command: [sh, -c, 'echo kept > /data/f && sync && exec sleep 3600']\n        volumeMounts: [{{name: data, mountPath: /data}}]\n  volumeClaimTemplates:\n  - metadata: {{name: data}}\n    spec:\n      accessModes: [ReadWriteOnce]\n      storageClassName: loop\n      resources: {{requests: {{storage: 300Mi}}}}\n"
    ))
    .unwrap();
    let db = c.wait("db-0 running", Duration::from_secs(120), |c| Some(pod(c, "db-0")).filter(|p| p["status"]["phase"] == "Running")).unwrap();
    assert_eq!(db["spec"]["nodeName"], node_name(2), "only node3's pool holds 300Mi");
    let pv = c.kubectl_ok(&["get", "pvc", "data-db-0", "-o", "jsonpath={.spec.volumeName}"]).unwrap();
    let pv: Value = serde_json::from_str(&c.kubectl_ok(&["get", "pv", &pv, "-o", "json"]).unwrap()).unwrap();
    let affinity = pv["spec"]["nodeAffinity"].to_string();
    assert!(affinity.contains(&node_name(2)), "the volume is node3's: {affinity}");
    let data = c.kubectl_ok(&["exec", "db-0", "--", "cat", "/data/f"]).unwrap();
    assert_eq!(data.trim(), "kept");
    c.kubectl_ok(&["delete", "statefulset", "db"]).unwrap();
    c.wait("db-0 gone", MIN, |c| {
        let out = c.kubectl(&["get", "pod", "db-0"]).ok()?;
        String::from_utf8_lossy(&out.stderr).contains("NotFound").then_some(())
    })
    .unwrap();
    c.kubectl_ok(&["delete", "pvc", "data-db-0", "--wait=true", "--timeout=60s"]).unwrap();
    let name = pv["metadata"]["name"].as_str().unwrap().to_string();
    c.wait("the volume deleted with its claim", MIN, |c| {
        let out = c.kubectl(&["get", "pv", &name]).ok()?;
        String::from_utf8_lossy(&out.stderr).contains("NotFound").then_some(())
    })
    .unwrap();
    assert!(c.nodes[2].csi_data.loops().is_empty(), "node3's loop devices detached: {:?}", c.nodes[2].csi_data.loops());
}

/// The Deployment's pods.
fn app_pods(c: &Cluster) -> Vec<PodView> {
    c.pods("app=app").unwrap()
}

fn node_fails_and_returns(c: &mut Cluster) {
    // tolerationSeconds 2 for an unreachable or not-ready node (the default is 300 s)
    c.apply(&httpd_deployment("app", 3, 2)).unwrap();
    let pods = c
        .wait("3 ready replicas", Duration::from_secs(120), |c| {
            let p = app_pods(c);
            (p.len() == 3 && p.iter().all(|p| p.ready)).then_some(p)
        })
        .unwrap();
    // the node of the first replica fails; the client runs on another one
    let failed = pods[0].node.clone();
    let i = (0..NODES).find(|i| node_name(*i) == failed).unwrap();
    let other = (0..NODES).map(node_name).find(|n| *n != failed).unwrap();
    c.apply(&sleeper_pod("client", &other)).unwrap();
    c.wait("client running", Duration::from_secs(120), |c| (pod(c, "client")["status"]["phase"] == "Running").then_some(())).unwrap();
    let cluster_ip = c.kubectl_ok(&["get", "service", "app", "-o", "jsonpath={.spec.clusterIP}"]).unwrap();
    let fetch = |c: &Cluster| c.fetch("client", &format!("http://{cluster_ip}/"), 2).ok();
    let names: BTreeSet<String> = pods.iter().map(|p| p.name.clone()).collect();
    until_all_answer(c, "the Service to reach every replica", &names, || fetch(c));

    // the node's agent and netd go (its containerd and pods stay, as on a machine whose
    // kubelet died): no more lease renewals
    let lost: BTreeSet<String> = pods.iter().filter(|p| p.node == failed).map(|p| p.name.clone()).collect();
    c.nodes[i].agent.kill9();
    c.nodes[i].netd.kill9();
    c.wait(&format!("{failed} to be Unknown"), Duration::from_secs(90), |c| {
        let s = c.kubectl_ok(&["get", "node", &failed, "-o", "jsonpath={.status.conditions[?(@.type==\"Ready\")].status}"]).ok()?;
        (s == "Unknown").then_some(())
    })
    .unwrap();
    let moved = c
        .wait("the lost replicas replaced on the other nodes", Duration::from_secs(120), |c| {
            let p = app_pods(c);
            let fine = p.len() == 3 && p.iter().all(|p| p.ready && p.node != failed && !lost.contains(&p.name));
            fine.then_some(p)
        })
        .unwrap();
    // the Service answers from the replicas that are left and the new ones, and never from
    // a pod of the failed node once the replacements answer
    let now: BTreeSet<String> = moved.iter().map(|p| p.name.clone()).collect();
    until_all_answer(c, "the Service to follow the replicas", &now, || fetch(c));

    // the node returns: Ready again, its deleted pods ended and gone, new pods run there
    c.start_node(i).unwrap();
    c.wait_node_ready(i).unwrap();
    for p in &lost {
        c.wait(&format!("{p} (deleted while its node was away) to be gone"), Duration::from_secs(120), |c| {
            let out = c.kubectl(&["get", "pod", p]).ok()?;
            String::from_utf8_lossy(&out.stderr).contains("NotFound").then_some(())
        })
        .unwrap();
    }
    c.apply(&httpd_pod("back", None, &failed)).unwrap();
    let back = c.wait("a new pod on the returned node", Duration::from_secs(120), |c| Some(pod(c, "back")).filter(pod_ready)).unwrap();
    let ip = back["status"]["podIP"].as_str().unwrap().to_string();
    let answer = client_reaches(c, "the returned node's pod reached over the overlay", &format!("http://{ip}:8080/"));
    assert_eq!(answer, "back");
    c.kubectl_ok(&["delete", "deployment", "app"]).unwrap();
    c.kubectl_ok(&["delete", "pod", "back", "client", "--wait=true", "--timeout=60s"]).unwrap();
    for n in &c.nodes {
        c.wait(&format!("{}'s containers to go", n.name), MIN, |_| n.ctrd.ctr(&["containers", "ls", "-q"]).ok().filter(|o| o.trim().is_empty()))
            .unwrap();
    }
}
