//! Two ferro-control-plane replicas on one etcd (Debian's etcd-server on loopback): both serve
//! the API and see each other's writes, exactly one runs the loops (the one holding the leader
//! Lease), the other takes over after a kill -9 of the leader, and Services created at once
//! through both get distinct ClusterIPs and NodePorts; on a 3-member etcd cluster, a member
//! killed with -9 in a stream of writes loses no acknowledged write. Needs etcd installed, so these tests are
//! in the tier scripts/test.sh runs (--include-ignored); without etcd they fail, never skip.
#![allow(clippy::unwrap_used)]

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use common::etcd::{Etcd, EtcdCluster};
use common::fake::eventually;
use common::Server;
use k8s_openapi::api::apps::v1::{Deployment, ReplicaSet};
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{ConfigMap, Pod, Service};
use kube::api::{DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube::Api;
use serde_json::json;

/// Short timings so a takeover does not take 15 s; the rule is the same.
const ELECTION: &[&str] = &[
    "--leader-elect-lease-duration",
    "6s",
    "--leader-elect-renew-deadline",
    "4s",
    "--leader-elect-retry-period",
    "1s",
];
const LEASE: &str = "ferro-control-plane";

/// The server's log without terminal colour codes.
fn plain_log(s: &Server) -> String {
    let log = s.log();
    let mut out = String::with_capacity(log.len());
    let mut chars = log.chars();
    while let Some(c) = chars.next() {
        if c == '\u{1b}' {
            for c in chars.by_ref() {
                if c.is_ascii_alphabetic() {
                    break;
                }
            }
        } else {
            out.push(c);
        }
    }
    out
}

/// The election identity a replica logged (`<hostname>_<uuid>`; its latest process's).
fn identity(s: &Server) -> String {
    let log = plain_log(s);
    let line = log.lines().rev().find(|l| l.contains("attempting to acquire the leader lease")).unwrap_or_else(|| panic!("no election in the log: {log}"));
    line.split_whitespace().find_map(|w| w.strip_prefix("identity=")).unwrap().to_string()
}

async fn holder(leases: &Api<Lease>) -> Option<(String, i32)> {
    let spec = leases.get_opt(LEASE).await.ok()??.spec?;
    let h = spec.holder_identity.filter(|h| !h.is_empty())?;
    Some((h, spec.lease_transitions.unwrap_or(0)))
}

/// The ports of the `kubernetes` Endpoints (one subset per replica here: they share 127.0.0.1)
/// when its EndpointSlices say the same.
async fn kubernetes_ports(client: &kube::Client) -> Option<Vec<i32>> {
    use k8s_openapi::api::core::v1::Endpoints;
    use k8s_openapi::api::discovery::v1::EndpointSlice;
    let ep = Api::<Endpoints>::namespaced(client.clone(), "default").get("kubernetes").await.ok()?;
    let mut ports: Vec<i32> = ep.subsets.unwrap_or_default().iter().flat_map(|s| s.ports.clone().unwrap_or_default()).map(|p| p.port).collect();
    ports.sort();
    let slices = Api::<EndpointSlice>::namespaced(client.clone(), "default")
        .list(&ListParams::default().labels("kubernetes.io/service-name=kubernetes"))
        .await
        .ok()?;
    let mut slice_ports: Vec<i32> = slices.items.iter().flat_map(|s| s.ports.clone().unwrap_or_default()).filter_map(|p| p.port).collect();
    slice_ports.sort();
    (ports == slice_ports).then_some(ports)
}

fn cm(name: &str) -> ConfigMap {
    serde_json::from_value(json!({"metadata": {"name": name}, "data": {"k": "v"}})).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "privileged: needs etcd (Debian etcd-server), run by scripts/test.sh"]
async fn two_replicas_serve_one_leads_the_loops_and_the_other_takes_over_after_kill_9() {
    let etcd = Etcd::start();
    let mut a = Server::replica(&etcd, None, ELECTION);
    let mut b = Server::replica(&etcd, Some(&a), ELECTION);
    let ca = a.client().await;
    let cb = b.client().await;

    // (a) both serve, with one CA and one token file, and see each other's writes
    Api::<ConfigMap>::namespaced(ca.clone(), "default").create(&PostParams::default(), &cm("from-a")).await.unwrap();
    Api::<ConfigMap>::namespaced(cb.clone(), "default").create(&PostParams::default(), &cm("from-b")).await.unwrap();
    for (client, name) in [(&cb, "from-a"), (&ca, "from-b")] {
        let cms: Api<ConfigMap> = Api::namespaced(client.clone(), "default");
        eventually(&format!("{name} through the other replica"), || async { cms.get_opt(name).await.ok()? }).await;
    }
    // a service account token one replica signed (the shared sa.key) authenticates at the other
    a.ok(&["create", "serviceaccount", "app"]);
    let token = a.ok(&["create", "token", "app"]).trim().to_string();
    let review = json!({"apiVersion": "authentication.k8s.io/v1", "kind": "TokenReview", "spec": {"token": token}}).to_string();
    eventually("B to authenticate A's token", || async {
        let out = b.kubectl_stdin(&["create", "--validate=false", "-f", "-", "-o", "json"], Some(&review));
        let st: serde_json::Value = serde_json::from_slice(&out.stdout).ok()?;
        (st["status"]["authenticated"] == true && st["status"]["user"]["username"] == "system:serviceaccount:default:app").then_some(())
    })
    .await;

    // (b) exactly one replica leads: the Lease names it, its log says it started the loops, and
    // the other found the lease held (proof that it looked) and started nothing
    let leases: Api<Lease> = Api::namespaced(cb.clone(), "kube-system");
    let (leader_id, _) = eventually("a leader", || holder(&leases)).await;
    let (ia, ib) = (identity(&a), identity(&b));
    assert_ne!(ia, ib);
    assert!(leader_id == ia || leader_id == ib, "the lease holder {leader_id} is neither {ia} nor {ib}");
    let a_leads = leader_id == ia;
    let (leader, follower) = if a_leads { (&a, &b) } else { (&b, &a) };
    eventually("the follower to find the lease held", || async {
        plain_log(follower).contains(&format!("the leader lease is held by another replica; waiting for it to expire holder={leader_id}")).then_some(())
    })
    .await;
    // the Lease is written before the loops start and log it: wait for the line
    eventually("the leader to start its loops", || async { plain_log(leader).contains("controller loops started").then_some(()) }).await;
    assert!(!plain_log(follower).contains("controller loops started"), "{}", plain_log(follower));

    // the kubernetes Service's endpoints name every live replica (each one's lease)
    let (port_a, port_b) = (i32::from(a.port), i32::from(b.port));
    eventually("both replicas in the kubernetes endpoints", || async { (kubernetes_ports(&cb).await? == vec![port_a.min(port_b), port_a.max(port_b)]).then_some(()) }).await;

    // a Deployment created through B gets its ReplicaSet from whichever leads
    let deploy = json!({
        "metadata": {"name": "web"},
        "spec": {"replicas": 2, "selector": {"matchLabels": {"app": "web"}},
                 "template": {"metadata": {"labels": {"app": "web"}}, "spec": {"containers": [{"name": "c", "image": "busybox:1"}]}}}
    });
    let deps_b: Api<Deployment> = Api::namespaced(cb.clone(), "default");
    deps_b.create(&PostParams::default(), &serde_json::from_value(deploy).unwrap()).await.unwrap();
    let rss_b: Api<ReplicaSet> = Api::namespaced(cb.clone(), "default");
    eventually("the ReplicaSet of web", || async {
        let rs = rss_b.list(&ListParams::default()).await.ok()?.items;
        (rs.len() == 1 && rs[0].spec.as_ref()?.replicas == Some(2)).then_some(())
    })
    .await;

    // (c) kill -9 of the leader: the other takes the lease, and a Deployment scaled afterwards
    // converges with one ReplicaSet
    let (survivor_id, survivor, killed) = if a_leads {
        a.kill9();
        (ib, &mut b, &mut a)
    } else {
        b.kill9();
        (ia, &mut a, &mut b)
    };
    let cs = survivor.client().await;
    let leases: Api<Lease> = Api::namespaced(cs.clone(), "kube-system");
    let (_, transitions) = eventually("the survivor to take the lease", || async {
        holder(&leases).await.filter(|(h, _)| *h == survivor_id)
    })
    .await;
    assert!(transitions >= 1, "a takeover counts as a transition");
    // the killed replica leaves the kubernetes endpoints once its lease runs out
    let survivor_port = i32::from(survivor.port);
    eventually("the killed replica out of the kubernetes endpoints", || async { (kubernetes_ports(&cs).await? == vec![survivor_port]).then_some(()) }).await;
    // ... and its lease is deleted once gone for two lease durations (upstream's apiserver lease
    // garbage collector), the survivor's stays
    let killed_port = killed.port.to_string();
    let api_leases = || async {
        let list = leases.list(&ListParams::default().labels("apiserver.kubernetes.io/identity=kube-apiserver")).await.ok()?;
        Some(list.items.iter().filter_map(|l| l.metadata.annotations.as_ref()?.get("ferro.dev/apiserver-port").cloned()).collect::<Vec<_>>())
    };
    eventually("the killed replica's apiserver lease collected", || async { api_leases().await.filter(|ports| !ports.contains(&killed_port)) }).await;
    assert_eq!(api_leases().await.unwrap(), vec![survivor_port.to_string()]);
    eventually("the survivor to start its loops", || async { plain_log(survivor).contains("controller loops started").then_some(()) }).await;
    let deps: Api<Deployment> = Api::namespaced(cs.clone(), "default");
    deps.patch("web", &PatchParams::default(), &Patch::Merge(json!({"spec": {"replicas": 4}}))).await.unwrap();
    eventually("web scaled to 4 by the new leader", || async {
        let d = deps.get("web").await.ok()?;
        let st = d.status?;
        (st.observed_generation == d.metadata.generation && st.replicas == Some(4)).then_some(())
    })
    .await;
    let rss: Api<ReplicaSet> = Api::namespaced(cs.clone(), "default");
    let rs = rss.list(&ListParams::default()).await.unwrap().items;
    assert_eq!(rs.len(), 1, "no duplicate ReplicaSet after the takeover");
    assert_eq!(rs[0].spec.as_ref().unwrap().replicas, Some(4));
    let pods: Api<Pod> = Api::namespaced(cs.clone(), "default");
    assert_eq!(pods.list(&ListParams::default().labels("app=web")).await.unwrap().items.len(), 4, "no duplicate pod");

    // the killed replica comes back as a candidate; a SIGTERM of the leader (systemd stopping
    // it) gives the Lease back and the candidate takes it
    killed.spawn();
    let back_id = identity(killed);
    eventually("the restarted replica to find the lease held", || async {
        plain_log(killed).contains(&format!("the leader lease is held by another replica; waiting for it to expire holder={survivor_id}")).then_some(())
    })
    .await;
    let status = survivor.terminate();
    assert!(status.success(), "a clean stop exits 0: {status}");
    assert!(plain_log(survivor).contains("released the leader lease"), "{}", plain_log(survivor));
    let leases: Api<Lease> = Api::namespaced(killed.client().await, "kube-system");
    let (_, after) = eventually("the restarted replica to take the released lease", || async {
        holder(&leases).await.filter(|(h, _)| *h == back_id)
    })
    .await;
    assert_eq!(after, transitions + 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "privileged: needs etcd (Debian etcd-server), run by scripts/test.sh"]
async fn services_created_at_once_through_two_replicas_get_distinct_ips_and_node_ports() {
    let etcd = Etcd::start();
    let a = Server::replica(&etcd, None, ELECTION);
    let b = Server::replica(&etcd, Some(&a), ELECTION);
    let clients = [a.client().await, b.client().await];
    let mut tasks = Vec::new();
    for i in 0..50 {
        let svcs: Api<Service> = Api::namespaced(clients[i % 2].clone(), "default");
        tasks.push(tokio::spawn(async move {
            let svc = json!({"metadata": {"name": format!("s{i}")}, "spec": {"type": "NodePort", "ports": [{"port": 80}]}});
            svcs.create(&PostParams::default(), &serde_json::from_value(svc).unwrap()).await.unwrap()
        }));
    }
    let mut ips = BTreeSet::new();
    let mut ports = BTreeSet::new();
    for t in tasks {
        let svc = t.await.unwrap();
        let spec = svc.spec.unwrap();
        ips.insert(spec.cluster_ip.unwrap());
        ports.insert(spec.ports.unwrap()[0].node_port.unwrap());
    }
    assert_eq!((ips.len(), ports.len()), (50, 50), "distinct addresses and ports");
    // each one is claimed in etcd once (plus the `kubernetes` Service's address)
    let keys = |prefix: &str| etcd.ok(&["get", "--prefix", "--keys-only", prefix]).lines().filter(|l| !l.is_empty()).count();
    assert_eq!(keys("/registry/ipaddresses/"), 51);
    assert_eq!(keys("/registry/servicenodeports/"), 50);

    // deleting them gives everything back
    let svcs: Api<Service> = Api::namespaced(clients[1].clone(), "default");
    for i in 0..50 {
        svcs.delete(&format!("s{i}"), &DeleteParams::default()).await.unwrap();
    }
    assert_eq!(keys("/registry/ipaddresses/"), 1);
    assert_eq!(keys("/registry/servicenodeports/"), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "privileged: needs etcd (Debian etcd-server), run by scripts/test.sh"]
async fn a_replica_finds_the_free_address_the_other_left_whatever_it_knew() {
    // 10.96.0.0/29: 6 addresses, the first the `kubernetes` Service's
    let etcd = Etcd::start();
    let args: Vec<&str> = ELECTION.iter().copied().chain(["--service-cluster-ip-range", "10.96.0.0/29"]).collect();
    let a = Server::replica(&etcd, None, &args);
    let b = Server::replica(&etcd, Some(&a), &args);
    let (via_a, via_b): (Api<Service>, Api<Service>) =
        (Api::namespaced(a.client().await, "default"), Api::namespaced(b.client().await, "default"));
    let create = |api: &Api<Service>, name: &str| {
        let (api, svc) = (api.clone(), json!({"metadata": {"name": name}, "spec": {"ports": [{"port": 80}]}}));
        async move { api.create(&PostParams::default(), &serde_json::from_value(svc).unwrap()).await }
    };
    let ip = |s: &Service| s.spec.as_ref().unwrap().cluster_ip.clone().unwrap();
    // a takes four of the five free addresses; b, which knew of none of them, takes the
    // fifth (its picks of a's addresses are refused by etcd and it picks again)
    let mut ips = BTreeSet::new();
    for i in 0..4 {
        ips.insert(ip(&create(&via_a, &format!("a{i}")).await.unwrap()));
    }
    ips.insert(ip(&create(&via_b, "b0").await.unwrap()));
    assert_eq!(ips.len(), 5, "{ips:?}");
    // the range is full, for both
    for api in [&via_a, &via_b] {
        let e = create(api, "over").await.unwrap_err();
        assert!(matches!(&e, kube::Error::Api(st) if st.code >= 400), "{e}");
    }
    // b gives one back; a, which knew the range full, finds it
    let freed = ip(&via_b.get("a2").await.unwrap());
    via_b.delete("a2", &DeleteParams::default()).await.unwrap();
    let again = create(&via_a, "a4").await.unwrap();
    assert_eq!(ip(&again), freed);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "privileged: needs etcd (Debian etcd-server), run by scripts/test.sh"]
async fn acknowledged_writes_survive_an_etcd_member_killed_mid_stream() {
    let mut cluster = EtcdCluster::start(3);
    // the API servers alone (no loops): this is about the store
    let a = Server::replica_with(cluster.flags(), None, &["--controllers="]);
    let b = Server::replica_with(cluster.flags(), Some(&a), &["--controllers="]);
    let clients = [a.client().await, b.client().await];
    let acked = Arc::new(Mutex::new(Vec::<(String, String)>::new()));
    let stop = Arc::new(AtomicBool::new(false));
    let mut writers = Vec::new();
    for w in 0..8 {
        let cms: Api<ConfigMap> = Api::namespaced(clients[w % 2].clone(), "default");
        let (acked, stop) = (acked.clone(), stop.clone());
        writers.push(tokio::spawn(async move {
            let mut failed = 0;
            for i in 0.. {
                if stop.load(Ordering::Relaxed) {
                    break;
                }
                let name = format!("w{w}-{i}");
                match cms.create(&PostParams::default(), &cm(&name)).await {
                    Ok(c) => acked.lock().unwrap().push((name, c.metadata.resource_version.unwrap())),
                    // not acknowledged: it may or may not be there, both are right
                    Err(_) => failed += 1,
                }
            }
            failed
        }));
    }
    let count = || acked.lock().unwrap().len();
    eventually("writes before the kill", || async { (count() >= 100).then_some(()) }).await;
    cluster.kill9(0);
    let at_kill = count();
    eventually("writes with one member down", || async { (count() >= at_kill + 100).then_some(()) }).await;
    tokio::task::block_in_place(|| cluster.restart(0));
    let at_restart = count();
    eventually("writes after the restart", || async { (count() >= at_restart + 100).then_some(()) }).await;
    stop.store(true, Ordering::Relaxed);
    let mut failed = 0;
    for w in writers {
        failed += w.await.unwrap();
    }
    let acked: BTreeMap<String, String> = acked.lock().unwrap().iter().cloned().collect();
    eprintln!("{} writes acknowledged, {failed} failed", acked.len());

    // every acknowledged write is there with its resourceVersion, through both replicas
    for (i, client) in clients.iter().enumerate() {
        let cms: Api<ConfigMap> = Api::namespaced(client.clone(), "default");
        let missing = eventually(&format!("every acknowledged write through replica {i}"), || async {
            let have: BTreeMap<String, String> = cms
                .list(&ListParams::default())
                .await
                .ok()?
                .items
                .into_iter()
                .map(|c| (c.metadata.name.unwrap(), c.metadata.resource_version.unwrap()))
                .collect();
            let missing: Vec<_> = acked.iter().filter(|(n, rv)| have.get(*n) != Some(*rv)).collect();
            missing.is_empty().then_some(missing.len())
        })
        .await;
        assert_eq!(missing, 0);
    }
    // the restarted member caught up: its own (serializable) read has every key
    eventually("the restarted member to have every acknowledged write", || async {
        let out = cluster.etcdctl_member(0, &["get", "--prefix", "--keys-only", "--consistency=s", "/registry/configmaps/default/"]);
        let keys: BTreeSet<String> = String::from_utf8_lossy(&out.stdout).lines().filter(|l| !l.is_empty()).map(str::to_string).collect();
        acked.keys().all(|n| keys.contains(&format!("/registry/configmaps/default/{n}"))).then_some(())
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "privileged: needs etcd (Debian etcd-server), run by scripts/test.sh"]
async fn without_etcd_quorum_writes_fail_with_a_5xx_and_reads_keep_answering() {
    let mut cluster = EtcdCluster::start(3);
    let a = Server::replica_with(cluster.flags(), None, &["--controllers="]);
    let client = a.client_without_retries().await;
    let cms: Api<ConfigMap> = Api::namespaced(client.clone(), "default");
    cms.create(&PostParams::default(), &cm("before")).await.unwrap();
    tokio::task::block_in_place(|| {
        cluster.kill9(1);
        cluster.kill9(2);
    });
    // reads are served from the watch cache
    let got = cms.get("before").await.unwrap();
    assert_eq!(got.data.unwrap()["k"], "v");
    assert!(cms.list(&ListParams::default()).await.unwrap().items.iter().any(|c| c.metadata.name.as_deref() == Some("before")));
    // a write fails with a 5xx Status saying why (within the request timeout)
    let err = cms.create(&PostParams::default(), &cm("during")).await.unwrap_err();
    match &err {
        kube::Error::Api(s) => {
            assert!(s.code >= 500, "{s:?}");
            assert!(s.message.contains("etcd"), "{s:?}");
        }
        other => panic!("not a Status: {other:?}"),
    }
    // quorum back: writes succeed again, and the failed one is there whole or not at all
    tokio::task::block_in_place(|| {
        cluster.restart(1);
        cluster.restart(2);
    });
    eventually("writes with quorum again", || async { cms.create(&PostParams::default(), &cm("after")).await.ok() }).await;
    // a member may not be listening yet: a consistent read asks another
    if let Some(c) = cms.get_opt("during").await.unwrap() {
        assert_eq!(c.data.unwrap()["k"], "v");
    }
    assert!(cms.get_opt("after").await.unwrap().is_some());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "privileged: needs etcd (Debian etcd-server), run by scripts/test.sh"]
async fn consistent_reads_never_fail_while_a_quorum_of_etcd_members_answers() {
    let mut cluster = EtcdCluster::start(3);
    let a = Server::replica_with(cluster.flags(), None, &["--controllers="]);
    let client = a.client_without_retries().await;
    let cms: Api<ConfigMap> = Api::namespaced(client.clone(), "default");
    cms.create(&PostParams::default(), &cm("x")).await.unwrap();
    // a follower: the leader's death leaves no leader for about a second, when falling back
    // to the cache is the designed answer (the quorum test covers that)
    let follower = eventually("a member that is not the leader", || async {
        tokio::task::block_in_place(|| (0..3).find(|&i| !cluster.is_leader(i) && (0..3).any(|j| cluster.is_leader(j))))
    })
    .await;
    tokio::task::block_in_place(|| cluster.kill9(follower));
    // consistent reads (no resourceVersion) between writes: each asks etcd for its revision,
    // some find the cache behind and read from etcd; the client keeps picking the dead member
    let mut writes_failed = 0;
    for i in 0..60 {
        if cms.create(&PostParams::default(), &cm(&format!("y{i}"))).await.is_err() {
            // a write in flight when the leader died is not retried (it may have been applied)
            writes_failed += 1;
        }
        assert_eq!(cms.get("x").await.unwrap().data.unwrap()["k"], "v", "read {i}");
        let names: BTreeSet<String> = cms.list(&ListParams::default()).await.unwrap().items.into_iter().filter_map(|c| c.metadata.name).collect();
        assert!(names.contains("x"), "list {i}: {names:?}");
    }
    eprintln!("{writes_failed} of 60 writes failed");
    // and none of them settled for the cache because a member refused the revision probe
    let log = plain_log(&a);
    assert!(!log.contains("etcd did not tell its revision"), "{log}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "privileged: needs etcd (Debian etcd-server), run by scripts/test.sh"]
async fn a_rollout_in_flight_finishes_after_the_leader_dies_and_a_watch_through_the_survivor_has_no_gap() {
    use futures::StreamExt as _;
    use kube::api::{WatchEvent, WatchParams};
    let cluster = EtcdCluster::start(3);
    let mut a = Server::replica_with(cluster.flags(), None, ELECTION);
    let mut b = Server::replica_with(cluster.flags(), Some(&a), ELECTION);
    let leases: Api<Lease> = Api::namespaced(a.client().await, "kube-system");
    let (leader_id, _) = eventually("a leader", || holder(&leases)).await;
    let a_leads = leader_id == identity(&a);
    let (leader, survivor) = if a_leads { (&mut a, &mut b) } else { (&mut b, &mut a) };
    let cs = survivor.client().await;
    let _nodes = common::fake::FakeNodes::start(cs.clone(), &["n1", "n2"], "8", "16Gi").await;

    let deploy = json!({
        "metadata": {"name": "web"},
        "spec": {"replicas": 4, "selector": {"matchLabels": {"app": "web"}},
                 "strategy": {"rollingUpdate": {"maxSurge": 1, "maxUnavailable": 0}},
                 "template": {"metadata": {"labels": {"app": "web"}}, "spec": {"containers": [{"name": "c", "image": "busybox:1"}]}}}
    });
    let deps: Api<Deployment> = Api::namespaced(cs.clone(), "default");
    deps.create(&PostParams::default(), &serde_json::from_value(deploy).unwrap()).await.unwrap();
    let complete = |image: &'static str| {
        let deps = deps.clone();
        move || {
            let deps = deps.clone();
            async move {
                let d = deps.get("web").await.ok()?;
                let st = d.status?;
                let img = d.spec?.template.spec?.containers[0].image.clone()?;
                (img == image
                    && st.observed_generation == d.metadata.generation
                    && st.updated_replicas == Some(4)
                    && st.replicas == Some(4)
                    && st.available_replicas == Some(4))
                    .then_some(())
            }
        }
    };
    eventually("web available", complete("busybox:1")).await;

    // a watch on the pods through the survivor, from a list
    let pods: Api<Pod> = Api::namespaced(cs.clone(), "default");
    let lp = ListParams::default().labels("app=web");
    let list = pods.list(&lp).await.unwrap();
    let mut seen: BTreeMap<String, String> =
        list.items.iter().map(|p| (p.metadata.name.clone().unwrap(), p.metadata.resource_version.clone().unwrap())).collect();
    let mut stream = pods.watch(&WatchParams::default().labels("app=web").timeout(290), &list.metadata.resource_version.unwrap()).await.unwrap().boxed();

    // the rollout starts and the leader dies at once
    deps.patch("web", &PatchParams::default(), &Patch::Merge(json!({"spec": {"template": {"spec": {"containers": [{"name": "c", "image": "busybox:2"}]}}}})))
        .await
        .unwrap();
    leader.kill9();
    eventually("the rollout finished by the new leader", complete("busybox:2")).await;
    let rss: Api<ReplicaSet> = Api::namespaced(cs.clone(), "default");
    let mut sizes: Vec<i32> = rss.list(&ListParams::default()).await.unwrap().items.iter().map(|r| r.spec.as_ref().unwrap().replicas.unwrap()).collect();
    sizes.sort();
    assert_eq!(sizes, vec![0, 4], "two ReplicaSets, the old one scaled down, none duplicated");
    let now = pods.list(&lp).await.unwrap();
    let live: BTreeMap<String, String> = now.items.iter().filter(|p| p.metadata.deletion_timestamp.is_none()).map(|p| (p.metadata.name.clone().unwrap(), p.metadata.resource_version.clone().unwrap())).collect();
    assert_eq!(live.len(), 4, "no duplicated pod: {live:?}");
    let want: BTreeMap<String, String> =
        now.items.iter().map(|p| (p.metadata.name.clone().unwrap(), p.metadata.resource_version.clone().unwrap())).collect();

    // the watch, replayed over the first list, arrives at the same state as a fresh list: no
    // event was lost across the takeover (a 410 would be allowed: the client relists)
    let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(60);
    while seen != want {
        let next = tokio::time::timeout_at(deadline, stream.next()).await.unwrap_or_else(|_| panic!("the watch stopped short: {seen:?} vs {want:?}"));
        match next {
            Some(Ok(WatchEvent::Added(p) | WatchEvent::Modified(p))) => {
                seen.insert(p.metadata.name.unwrap(), p.metadata.resource_version.unwrap());
            }
            Some(Ok(WatchEvent::Deleted(p))) => {
                seen.remove(&p.metadata.name.unwrap());
            }
            Some(Ok(WatchEvent::Bookmark(_))) => {}
            Some(Ok(WatchEvent::Error(e))) => {
                assert_eq!(e.code, 410, "a watch error other than 410: {e:?}");
                return;
            }
            Some(Err(e)) => panic!("watch failed: {e}"),
            None => panic!("the watch ended before reaching the state of a fresh list: {seen:?} vs {want:?}"),
        }
    }
}

/// What a node binary given `--api-servers <a>,<b>` does when replica a dies: its client
/// (ferro_runtime::apiclient, the one every node binary builds) loses at most the request in
/// flight, then its Lease renewals and its pod watch carry on through b.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "privileged: needs etcd (Debian etcd-server), run by scripts/test.sh"]
async fn a_node_client_given_both_replicas_fails_over_when_the_one_it_uses_dies() {
    use futures::StreamExt as _;
    use kube::runtime::{watcher, WatchStreamExt as _};

    let etcd = Etcd::start();
    let mut a = Server::replica(&etcd, None, ELECTION);
    let b = Server::replica(&etcd, Some(&a), ELECTION);
    // a node's own credentials (Node authorizer), both replicas, a first
    let kubeconfig = a.cert_kubeconfig("system:node:n1", &["system:nodes"]);
    let servers = ferro_runtime::apiclient::parse_servers(&format!("https://127.0.0.1:{},https://127.0.0.1:{}", a.port, b.port)).unwrap();
    let node = ferro_runtime::apiclient::client(Some(&kubeconfig), &servers).await.unwrap();
    let admin_b = b.client().await;

    // the node's Lease, through a
    let leases: Api<Lease> = Api::namespaced(node.clone(), "kube-node-lease");
    let lease = |t: &str| -> Lease {
        serde_json::from_value(json!({"metadata": {"name": "n1"}, "spec": {"holderIdentity": "n1", "leaseDurationSeconds": 40, "renewTime": t}})).unwrap()
    };
    leases.create(&PostParams::default(), &lease("2026-01-01T00:00:00.000000Z")).await.unwrap();

    // the node's pod watch, through a
    let seen: Arc<Mutex<BTreeSet<String>>> = Arc::default();
    let watch = {
        let seen = seen.clone();
        let pods: Api<Pod> = Api::all(node.clone());
        tokio::spawn(async move {
            let mut stream = watcher(pods, watcher::Config::default()).default_backoff().applied_objects().boxed();
            while let Some(ev) = stream.next().await {
                if let Ok(p) = ev {
                    seen.lock().unwrap().insert(p.metadata.name.unwrap_or_default());
                }
            }
        })
    };
    let pod = |name: &str| -> Pod {
        serde_json::from_value(json!({"metadata": {"name": name}, "spec": {"containers": [{"name": "c", "image": "busybox"}]}})).unwrap()
    };
    let pods_b: Api<Pod> = Api::namespaced(admin_b.clone(), "default");
    pods_b.create(&PostParams::default(), &pod("before")).await.unwrap();
    eventually("the node's watch sees the pod made before the kill", || async { seen.lock().unwrap().contains("before").then_some(()) }).await;

    a.kill9();

    // renewals: at most the request in flight is lost, the next goes to b
    let mut failures = 0;
    let mut renewed = 0;
    for i in 0..5 {
        let patch = json!({"spec": {"renewTime": format!("2026-01-01T00:00:0{i}.000000Z")}});
        match leases.patch("n1", &PatchParams::default(), &Patch::Merge(&patch)).await {
            Ok(_) => renewed += 1,
            Err(e) => {
                assert!(!matches!(e, kube::Error::Api(_)), "an HTTP answer, not a lost server: {e}");
                failures += 1;
            }
        }
    }
    assert!(failures <= 1 && renewed >= 4, "{failures} failed renewals, {renewed} renewed");
    let got = Api::<Lease>::namespaced(admin_b.clone(), "kube-node-lease").get("n1").await.unwrap();
    assert_eq!(got.spec.unwrap().renew_time.unwrap().0.to_string(), "2026-01-01T00:00:04Z", "the last renewal is stored");

    // the watch resumed through b: a pod made after the kill reaches it
    pods_b.create(&PostParams::default(), &pod("after")).await.unwrap();
    eventually("the node's watch sees the pod made after the kill, through b", || async { seen.lock().unwrap().contains("after").then_some(()) }).await;
    watch.abort();
}

/// Reads through one replica see every write acknowledged by another before them (upstream's
/// consistent reads from the watch cache): a get and a list through b right after each create
/// through a find the object, every time.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "privileged: needs etcd (Debian etcd-server), run by scripts/test.sh"]
async fn reads_through_one_replica_see_writes_acknowledged_by_the_other() {
    let etcd = Etcd::start();
    let a = Server::replica(&etcd, None, ELECTION);
    let b = Server::replica(&etcd, Some(&a), ELECTION);
    let (ca, cb) = (a.client().await, b.client().await);
    let on_a: Api<ConfigMap> = Api::namespaced(ca, "default");
    let on_b: Api<ConfigMap> = Api::namespaced(cb, "default");
    let mut stale = Vec::new();
    for i in 0..300 {
        let made = on_a.create(&PostParams::default(), &cm(&format!("c{i}"))).await.unwrap();
        let rv: i64 = made.metadata.resource_version.unwrap().parse().unwrap();
        match on_b.get_opt(&format!("c{i}")).await.unwrap() {
            Some(got) => assert_eq!(got.metadata.uid, made.metadata.uid),
            None => stale.push(format!("get c{i}")),
        }
        if i % 10 == 0 {
            let list = on_b.list(&ListParams::default()).await.unwrap();
            let list_rv: i64 = list.metadata.resource_version.unwrap().parse().unwrap();
            if list_rv < rv || !list.items.iter().any(|c| c.metadata.name.as_deref() == Some(&format!("c{i}"))) {
                stale.push(format!("list after c{i}: at {list_rv}, the create at {rv}"));
            }
        }
    }
    assert!(stale.is_empty(), "reads through b older than writes acknowledged by a: {stale:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "privileged: needs etcd (Debian etcd-server), run by scripts/test.sh"]
async fn writes_through_one_replica_find_objects_just_created_through_the_other() {
    let etcd = Etcd::start();
    let a = Server::replica(&etcd, None, ELECTION);
    let b = Server::replica(&etcd, Some(&a), ELECTION);
    let on_a: Api<ConfigMap> = Api::namespaced(a.client().await, "default");
    let on_b: Api<ConfigMap> = Api::namespaced(b.client().await, "default");
    let mut failed = Vec::new();
    // each write through b right after the create through a, before any read through b: b's
    // cache may not hold the object yet
    for i in 0..300 {
        let name = format!("c{i}");
        let made = on_a.create(&PostParams::default(), &cm(&name)).await.unwrap();
        let outcome = match i % 3 {
            0 => on_b.delete(&name, &DeleteParams::default()).await.map(|_| ()),
            1 => on_b
                .patch(&name, &PatchParams::default(), &Patch::Merge(json!({"metadata": {"labels": {"seen": "b"}}})))
                .await
                .map(|_| ()),
            _ => {
                let mut update = made.clone();
                update.data = Some(BTreeMap::from([("by".to_string(), "b".to_string())]));
                on_b.replace(&name, &PostParams::default(), &update).await.map(|_| ())
            }
        };
        if let Err(e) = outcome {
            failed.push(format!("{name}: {e}"));
        }
    }
    // objects created through b in a namespace created through a a moment before
    use k8s_openapi::api::core::v1::Namespace;
    let namespaces: Api<Namespace> = Api::all(a.client().await);
    let cb = b.client().await;
    for i in 0..30 {
        let ns = format!("team{i}");
        namespaces.create(&PostParams::default(), &serde_json::from_value(json!({"metadata": {"name": ns}})).unwrap()).await.unwrap();
        if let Err(e) = Api::<ConfigMap>::namespaced(cb.clone(), &ns).create(&PostParams::default(), &cm("x")).await {
            failed.push(format!("configmap in {ns}: {e}"));
        }
    }
    assert!(failed.is_empty(), "writes through b that did not find what a had acknowledged: {failed:?}");
    // and they took effect
    let left = on_a.list(&ListParams::default()).await.unwrap();
    assert_eq!(left.items.iter().filter(|c| c.metadata.name.as_deref().is_some_and(|n| n.starts_with('c'))).count(), 200);
    assert_eq!(left.items.iter().filter(|c| c.metadata.labels.as_ref().and_then(|l| l.get("seen")).map(String::as_str) == Some("b")).count(), 100);
    assert_eq!(left.items.iter().filter(|c| c.data.as_ref().and_then(|d| d.get("by")).map(String::as_str) == Some("b")).count(), 100);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "privileged: needs etcd (Debian etcd-server), run by scripts/test.sh"]
async fn a_list_continued_through_the_other_replica_is_the_list_at_its_revision() {
    let etcd = Etcd::start();
    let a = Server::replica(&etcd, None, ELECTION);
    let b = Server::replica(&etcd, Some(&a), ELECTION);
    let on_a: Api<ConfigMap> = Api::namespaced(a.client().await, "default");
    let on_b: Api<ConfigMap> = Api::namespaced(b.client().await, "default");
    for i in 0..25 {
        on_a.create(&PostParams::default(), &cm(&format!("p{i:02}"))).await.unwrap();
    }
    let first = on_a.list(&ListParams::default().limit(10)).await.unwrap();
    let rv = first.metadata.resource_version.clone().unwrap();
    // the store moves on after the first page
    on_a.create(&PostParams::default(), &cm("p99")).await.unwrap();
    on_a.delete("p20", &DeleteParams::default()).await.unwrap();
    // the rest through b, which never saw the first page (behind a load balancer)
    let mut names: Vec<String> = first.items.iter().filter_map(|c| c.metadata.name.clone()).collect();
    let mut token = first.metadata.continue_.clone().filter(|t| !t.is_empty());
    let mut pages = 1;
    while let Some(t) = token {
        let page = on_b.list(&ListParams::default().limit(10).continue_token(&t)).await.expect("a continued list through the other replica");
        assert_eq!(page.metadata.resource_version.as_deref(), Some(rv.as_str()), "every page is of the first page's revision");
        names.extend(page.items.iter().filter_map(|c| c.metadata.name.clone()));
        token = page.metadata.continue_.clone().filter(|t| !t.is_empty());
        pages += 1;
    }
    let ours: Vec<String> = names.into_iter().filter(|n| n.starts_with('p')).collect();
    let expected: Vec<String> = (0..25).map(|i| format!("p{i:02}")).collect();
    assert_eq!(ours, expected, "the list as it was at {rv}: p20 in it, p99 not");
    assert!(pages >= 3, "{pages} pages");
}
