//! Privileged: stale UDP flows are deleted through ctnetlink after the rules change, in a node
//! namespace with the real backends. A UDP client in a pod keeps sending from a fixed source
//! port (as a resolver or a statsd client does); its datagrams must reach the Service's
//! endpoint of the moment. The same scenarios with the recording fake instead of ctnetlink
//! show the flow staying pinned where its first packet went: the tests can fail.
#![allow(clippy::unwrap_used)]

mod common;

use std::net::{IpAddr, SocketAddr, UdpSocket};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use common::{World, CLUSTER_CIDR};
use ferro_proxy::conntrack::netlink::Ctnetlink;
use ferro_proxy::conntrack::{self, Conntrack, Flows, Recorder, Reply};
use ferro_proxy::controller::Backend;
use ferro_proxy::iptables::backend::IptablesBackend;
use ferro_proxy::model::{self, Family, FamilyModel, NodeInfo};
use ferro_proxy::nftables::backend::NftBackend;
use ferro_proxy::slim::Service;
use ferro_proxy::slim::EndpointSlice;
use serde_json::json;

const SERVICE_PORT: u16 = 53;
const TARGET_PORT: u16 = 5353;
const CLIENT_PORT: u16 = 40053;
const VIP: &str = "10.96.0.53";
/// The Service's external IP; outside the node (the client namespace owns it).
const EXTERNAL_IP: &str = "192.0.2.53";

fn node() -> NodeInfo {
    NodeInfo {
        name: "node-a".into(),
        zone: None,
    }
}

fn enter(netns: &Path) -> std::io::Result<()> {
    let f = std::fs::File::open(netns)?;
    nix::sched::setns(f, nix::sched::CloneFlags::CLONE_NEWNET).map_err(std::io::Error::from)
}

/// A UDP server in a namespace (a thread that entered it) recording the sequence numbers it
/// receives. Stopped and joined on drop.
struct Receiver {
    seen: Arc<Mutex<Vec<u64>>>,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl Receiver {
    fn start(netns: impl Into<PathBuf>, port: u16) -> Receiver {
        let netns: PathBuf = netns.into();
        let seen = Arc::new(Mutex::new(Vec::new()));
        let stop = Arc::new(AtomicBool::new(false));
        let (ready_tx, ready_rx) = std::sync::mpsc::channel();
        let (s, st) = (seen.clone(), stop.clone());
        let thread = std::thread::spawn(move || {
            let sock = enter(&netns).and_then(|()| UdpSocket::bind(("0.0.0.0", port)));
            let sock = match sock.and_then(|s| s.set_read_timeout(Some(Duration::from_millis(50))).map(|()| s)) {
                Ok(s) => {
                    ready_tx.send(Ok(())).unwrap();
                    s
                }
                Err(e) => {
                    ready_tx.send(Err(e)).unwrap();
                    return;
                }
            };
            let mut buf = [0u8; 64];
            while !st.load(Ordering::SeqCst) {
                if let Ok((8, _)) = sock.recv_from(&mut buf) {
                    s.lock().unwrap().push(u64::from_be_bytes(buf[..8].try_into().unwrap()));
                }
            }
        });
        ready_rx.recv().unwrap().unwrap();
        Receiver {
            seen,
            stop,
            thread: Some(thread),
        }
    }

    fn max(&self) -> Option<u64> {
        self.seen.lock().unwrap().iter().copied().max()
    }
}

impl Drop for Receiver {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// A UDP client in a namespace sending numbered datagrams from a fixed source port, every
/// 10 ms (pacing, not synchronisation), errors ignored as a fire-and-forget sender does.
struct Sender {
    sent: Arc<AtomicU64>,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl Sender {
    fn start(netns: impl Into<PathBuf>, src_port: u16, to: SocketAddr) -> Sender {
        let netns: PathBuf = netns.into();
        let sent = Arc::new(AtomicU64::new(0));
        let stop = Arc::new(AtomicBool::new(false));
        let (ready_tx, ready_rx) = std::sync::mpsc::channel();
        let (s, st) = (sent.clone(), stop.clone());
        let thread = std::thread::spawn(move || {
            let sock = match enter(&netns).and_then(|()| UdpSocket::bind(("0.0.0.0", src_port))) {
                Ok(s) => {
                    ready_tx.send(Ok(())).unwrap();
                    s
                }
                Err(e) => {
                    ready_tx.send(Err(e)).unwrap();
                    return;
                }
            };
            let mut seq = 0u64;
            while !st.load(Ordering::SeqCst) {
                seq += 1;
                let _ = sock.send_to(&seq.to_be_bytes(), to);
                s.store(seq, Ordering::SeqCst);
                std::thread::sleep(Duration::from_millis(10));
            }
        });
        ready_rx.recv().unwrap().unwrap();
        Sender {
            sent,
            stop,
            thread: Some(thread),
        }
    }

    /// The last sequence number sent.
    fn sent(&self) -> u64 {
        self.sent.load(Ordering::SeqCst)
    }
}

impl Drop for Sender {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// Polls `cond` every 20 ms until it holds, failing after 20 s with `what`.
fn wait(what: &str, mut cond: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(20);
    while !cond() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// An unrelated TCP Service (its rules make the node track connections) and, unless `pods`
/// is None, the UDP Service (53 -> 5353, ClusterIP and an external IP) with its slice of the
/// given pods.
fn models(w: &World, pods: Option<&[usize]>) -> Vec<FamilyModel> {
    let web: Service = serde_json::from_value(json!({
        "metadata": {"namespace": "default", "name": "web"},
        "spec": {"clusterIP": "10.96.0.80", "ports": [{"name": "http", "port": 80, "targetPort": 8080, "protocol": "TCP"}]},
    }))
    .unwrap();
    let mut services = vec![Arc::new(web)];
    let mut slices = Vec::new();
    let Some(pods) = pods else {
        let (m, _) = model::build(Family::V4, &services, &slices, &node());
        return vec![m];
    };
    let svc: Service = serde_json::from_value(json!({
        "metadata": {"namespace": "default", "name": "dns"},
        "spec": {"clusterIP": VIP, "externalIPs": [EXTERNAL_IP], "ports": [{"name": "dns", "port": SERVICE_PORT, "targetPort": TARGET_PORT, "protocol": "UDP"}]},
    }))
    .unwrap();
    let eps: Vec<_> = pods
        .iter()
        .map(|i| json!({"addresses": [w.pods[*i].ip], "nodeName": "node-a"}))
        .collect();
    let slice: EndpointSlice = serde_json::from_value(json!({
        "metadata": {"namespace": "default", "name": "dns-1", "labels": {"kubernetes.io/service-name": "dns"}},
        "addressType": "IPv4",
        "ports": [{"name": "dns", "port": TARGET_PORT, "protocol": "UDP"}],
        "endpoints": eps,
    }))
    .unwrap();
    services.push(Arc::new(svc));
    slices.push(Arc::new(slice));
    let (m, problems) = model::build(Family::V4, &services, &slices, &node());
    assert!(problems.is_empty(), "{problems:?}");
    vec![m]
}

/// What the controller does for one sync: the rules (a partial sync after the first), then
/// the clean-up planned from what was applied before.
struct Proxy {
    backend: Box<dyn Backend>,
    conntrack: Box<dyn Conntrack>,
    applied: FamilyModel,
}

impl Proxy {
    fn new(w: &World, mode: &str, conntrack: Box<dyn Conntrack>) -> Proxy {
        let cidrs = vec![CLUSTER_CIDR.parse().unwrap()];
        let counter = || Box::new(ferro_proxy::nfcount::Netlink::in_namespace(w.node.path()));
        let backend: Box<dyn Backend> = match mode {
            "iptables" => Box::new(IptablesBackend::new(w.runner(), counter(), cidrs, false, vec![])),
            "nftables" => Box::new(NftBackend::new(w.runner(), counter(), cidrs, false, vec![])),
            m => panic!("no mode {m}"),
        };
        Proxy {
            backend,
            conntrack,
            applied: FamilyModel {
                family: Family::V4,
                services: Default::default(),
            },
        }
    }

    fn sync(&mut self, models: Vec<FamilyModel>) -> conntrack::Outcome {
        self.backend.sync(&models, &node(), false).unwrap();
        let deletions = conntrack::plan(&self.applied, &models[0], &node());
        let out = conntrack::execute(&mut self.conntrack, &deletions);
        assert_eq!(out.failed, 0, "{deletions:?}");
        self.applied = models.into_iter().next().unwrap();
        out
    }
}

fn ip(s: &str) -> IpAddr {
    s.parse().unwrap()
}

/// The endpoint pod is replaced (pod1 -> pod2) while pod0 keeps sending to the Service.
fn endpoint_replaced(mode: &str, clean: bool) {
    let w = World::new(&format!("ct{}{}", &mode[..3], u8::from(clean)), 3).unwrap();
    let old = Receiver::start(w.pods[1].ns.path(), TARGET_PORT);
    let new = Receiver::start(w.pods[2].ns.path(), TARGET_PORT);
    let recorder = Recorder::default();
    let ct: Box<dyn Conntrack> = if clean {
        Box::new(Ctnetlink::in_namespace(w.node.path()))
    } else {
        Box::new(recorder.clone())
    };
    let mut proxy = Proxy::new(&w, mode, ct);
    proxy.sync(models(&w, Some(&[1])));
    let client = Sender::start(w.pods[0].ns.path(), CLIENT_PORT, (ip(VIP), SERVICE_PORT).into());
    wait("the first endpoint to receive", || old.max().is_some());
    assert!(new.max().is_none());

    let out = proxy.sync(models(&w, Some(&[2])));
    let mark = client.sent();
    if clean {
        assert_eq!(out.deleted, 1, "the client's one flow to the old pod");
        wait("the new endpoint to receive the client's datagrams", || {
            new.max().is_some_and(|m| m > mark)
        });
    } else {
        // the fake was asked for the deletion and did nothing: datagrams sent after the change
        // still reach the old pod through the flow's conntrack entry, and none the new one
        let asked = Flows {
            family: Family::V4,
            protocol: model::Protocol::Udp,
            dst: Some(ip(VIP)),
            dst_port: SERVICE_PORT,
            reply: Reply::From(ip(&w.pods[1].ip)),
        };
        assert!(recorder.deletions().contains(&asked), "{:?}", recorder.deletions());
        wait("the old endpoint to receive datagrams sent after the change", || {
            old.max().is_some_and(|m| m > mark + 5)
        });
        assert!(new.max().is_none(), "the flow stayed pinned");
    }
}

/// A client sends to the Service's external IP before the Service has rules: its entry is made
/// without DNAT and sends the datagrams on along the node's default route, here into the
/// client namespace, which owns the external IP (the black hole). Then the Service gets rules
/// without endpoints (REJECT), then one endpoint. (Through a ClusterIP the same stale entry
/// is as stuck, but nftables mode rejects un-DNATed ClusterIP traffic in `cluster-ips-check`,
/// so nothing positive would show where its datagrams go; an external IP shows it in both
/// modes.)
fn zero_to_one_endpoint(mode: &str, clean: bool) {
    let w = World::new(&format!("cz{}{}", &mode[..3], u8::from(clean)), 2).unwrap();
    let mut c = std::process::Command::new("ip");
    c.args([
        "-n",
        w.client.name(),
        "addr",
        "add",
        &format!("{EXTERNAL_IP}/32"),
        "dev",
        "eth0",
    ]);
    ferro_lab::run(&mut c).unwrap();
    let hole = Receiver::start(w.client.path(), SERVICE_PORT);
    let server = Receiver::start(w.pods[1].ns.path(), TARGET_PORT);
    let recorder = Recorder::default();
    let ct: Box<dyn Conntrack> = if clean {
        Box::new(Ctnetlink::in_namespace(w.node.path()))
    } else {
        Box::new(recorder.clone())
    };
    let mut proxy = Proxy::new(&w, mode, ct);
    // rules of another Service: the node tracks connections, none DNATs the external IP yet
    proxy.sync(models(&w, None));
    let client = Sender::start(w.pods[0].ns.path(), CLIENT_PORT, (ip(EXTERNAL_IP), SERVICE_PORT).into());
    wait("the un-NATed flow to reach the black hole", || hole.max().is_some());

    let out = proxy.sync(models(&w, Some(&[])));
    assert_eq!(
        out,
        conntrack::Outcome::default(),
        "no endpoint: nothing to re-resolve to"
    );
    let out = proxy.sync(models(&w, Some(&[1])));
    let mark = client.sent();
    if clean {
        assert_eq!(out.deleted, 1, "the client's blackholed flow");
        wait("the endpoint to receive the client's datagrams", || {
            server.max().is_some_and(|m| m > mark)
        });
    } else {
        let asked = Flows {
            family: Family::V4,
            protocol: model::Protocol::Udp,
            dst: Some(ip(EXTERNAL_IP)),
            dst_port: SERVICE_PORT,
            reply: Reply::NotFrom([ip(&w.pods[1].ip)].into()),
        };
        assert!(recorder.deletions().contains(&asked), "{:?}", recorder.deletions());
        wait("datagrams sent after the change to still reach the black hole", || {
            hole.max().is_some_and(|m| m > mark + 5)
        });
        assert!(server.max().is_none(), "the flow stayed pinned");
    }
}

#[test]
#[ignore = "privileged: needs root and network namespaces; run by scripts/test.sh"]
fn iptables_udp_client_reaches_the_replacement_pod() {
    endpoint_replaced("iptables", true);
}

#[test]
#[ignore = "privileged: needs root and network namespaces; run by scripts/test.sh"]
fn nftables_udp_client_reaches_the_replacement_pod() {
    endpoint_replaced("nftables", true);
}

#[test]
#[ignore = "privileged: needs root and network namespaces; run by scripts/test.sh"]
fn iptables_without_clean_up_the_udp_flow_stays_on_the_old_pod() {
    endpoint_replaced("iptables", false);
}

#[test]
#[ignore = "privileged: needs root and network namespaces; run by scripts/test.sh"]
fn nftables_without_clean_up_the_udp_flow_stays_on_the_old_pod() {
    endpoint_replaced("nftables", false);
}

#[test]
#[ignore = "privileged: needs root and network namespaces; run by scripts/test.sh"]
fn iptables_udp_client_sending_before_any_endpoint_reaches_the_first() {
    zero_to_one_endpoint("iptables", true);
}

#[test]
#[ignore = "privileged: needs root and network namespaces; run by scripts/test.sh"]
fn nftables_udp_client_sending_before_any_endpoint_reaches_the_first() {
    zero_to_one_endpoint("nftables", true);
}

#[test]
#[ignore = "privileged: needs root and network namespaces; run by scripts/test.sh"]
fn iptables_without_clean_up_the_blackholed_flow_stays() {
    zero_to_one_endpoint("iptables", false);
}

#[test]
#[ignore = "privileged: needs root and network namespaces; run by scripts/test.sh"]
fn nftables_without_clean_up_the_blackholed_flow_stays() {
    zero_to_one_endpoint("nftables", false);
}

/// The UDP Service "dns" and its hand-made EndpointSlice of `pods`, through kubectl.
fn apply_dns(c: &common::Cluster, pods: &[usize]) {
    c.apply(&format!(
        "apiVersion: v1\nkind: Service\nmetadata:\n  name: dns\n  namespace: default\nspec:\n  ports:\n  - name: dns\n    port: {SERVICE_PORT}\n    targetPort: {TARGET_PORT}\n    protocol: UDP\n"
    ))
    .unwrap();
    let mut eps = String::new();
    for i in pods {
        eps.push_str(&format!(
            "- addresses: [\"{}\"]\n  conditions: {{ready: true}}\n  nodeName: {}\n",
            c.world.pods[*i].ip,
            common::NODE
        ));
    }
    c.apply(&format!(
        "apiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\nmetadata:\n  name: dns-manual\n  namespace: default\n  labels:\n    kubernetes.io/service-name: dns\n    endpointslice.kubernetes.io/managed-by: ferro-proxy-test\naddressType: IPv4\nports:\n- name: dns\n  port: {TARGET_PORT}\n  protocol: UDP\nendpoints:\n{eps}"
    ))
    .unwrap();
}

/// The ferro-proxy binary against ferro-control-plane: the EndpointSlice change (kubectl) is
/// a partial sync followed by the ctnetlink clean-up that main wires in.
fn binary_cleans_up(mode: &str) {
    let c = common::Cluster::new(&format!("ctb{}", &mode[..3]), 3, mode).unwrap();
    let old = Receiver::start(c.world.pods[1].ns.path(), TARGET_PORT);
    let new = Receiver::start(c.world.pods[2].ns.path(), TARGET_PORT);
    apply_dns(&c, &[1]);
    let vip = c
        .kubectl(&["get", "service", "dns", "-o", "jsonpath={.spec.clusterIP}"])
        .unwrap();
    let client = Sender::start(
        c.world.pods[0].ns.path(),
        CLIENT_PORT,
        (ip(vip.trim()), SERVICE_PORT).into(),
    );
    c.wait("the first endpoint to receive", Duration::from_secs(30), || {
        old.max().is_some()
    })
    .unwrap();
    apply_dns(&c, &[2]);
    c.wait(
        "the replacement pod to receive the client's datagrams",
        Duration::from_secs(30),
        || new.max().is_some(),
    )
    .unwrap();
    assert!(client.sent() > 0);
    // the client's one flow to the old pod, deleted by the binary's ctnetlink clean-up (logged
    // just after the deletion that let the datagrams through)
    c.wait("the clean-up in the proxy's log", Duration::from_secs(30), || {
        c.log("proxy.log")
            .lines()
            .any(|l| l.contains("stale conntrack entries cleaned") && l.contains("deleted=1"))
    })
    .unwrap();
}

#[test]
#[ignore = "privileged: needs root, network namespaces and the workspace binaries; run by scripts/test.sh"]
fn iptables_binary_moves_a_udp_client_to_the_replacement_pod() {
    binary_cleans_up("iptables");
}

#[test]
#[ignore = "privileged: needs root, network namespaces and the workspace binaries; run by scripts/test.sh"]
fn nftables_binary_moves_a_udp_client_to_the_replacement_pod() {
    binary_cleans_up("nftables");
}

/// The executor alone against a real conntrack table (entries made through ctnetlink in a
/// namespace of its own, no traffic): each selection deletes exactly its entries, in both
/// families, for a ClusterIP, a node port and a reply source that is not an endpoint.
#[test]
#[ignore = "privileged: needs root and a network namespace; run by scripts/test.sh"]
fn ctnetlink_deletes_exactly_the_selected_entries() {
    ferro_lab::require_root().unwrap();
    let ns = ferro_lab::netns::NetNs::new(&format!("fpx-ctnl-{}", std::process::id())).unwrap();
    let mut ct = Ctnetlink::in_namespace(ns.path());
    let a = |s: &str| -> SocketAddr { s.parse().unwrap() };
    let udp = model::Protocol::Udp;
    // (protocol, client, original destination, reply source, reply destination)
    let entries = [
        (
            udp,
            "10.244.0.11:40000",
            "10.96.0.10:53",
            "10.244.0.12:5353",
            "10.244.0.11:40000",
        ), // to the old endpoint
        (
            udp,
            "10.244.0.11:40001",
            "10.96.0.10:53",
            "10.244.0.13:5353",
            "10.244.0.11:40001",
        ), // to another one
        (
            udp,
            "192.168.77.2:40002",
            "192.168.77.1:30053",
            "10.244.0.12:5353",
            "10.244.0.1:40002",
        ), // node port
        (
            udp,
            "10.244.0.11:40003",
            "10.96.0.10:53",
            "10.96.0.10:53",
            "10.244.0.11:40003",
        ), // not DNATed
        (
            model::Protocol::Tcp,
            "10.244.0.11:40004",
            "10.96.0.10:53",
            "10.244.0.12:5353",
            "10.244.0.11:40004",
        ),
        (
            udp,
            "[fd00::11]:40000",
            "[fd00::10]:53",
            "[fd00::12]:5353",
            "[fd00::11]:40000",
        ),
        (
            udp,
            "[fd00::11]:40001",
            "[fd00::10]:53",
            "[fd00::13]:5353",
            "[fd00::11]:40001",
        ),
    ];
    for (p, client, dst, rsrc, rdst) in entries {
        ct.insert(p, (a(client), a(dst)), (a(rsrc), a(rdst)), 600).unwrap();
    }
    let flows = |family, dst: Option<&str>, port, reply| Flows {
        family,
        protocol: udp,
        dst: dst.map(ip),
        dst_port: port,
        reply,
    };
    let all_v4 = flows(Family::V4, None, SERVICE_PORT, Reply::NotFrom(Default::default()));
    assert_eq!(
        ct.entries(&all_v4).unwrap().len(),
        3,
        "UDP to port 53: three IPv4 entries"
    );

    let gone = flows(
        Family::V4,
        Some("10.96.0.10"),
        SERVICE_PORT,
        Reply::From(ip("10.244.0.12")),
    );
    assert_eq!(ct.delete(&gone).unwrap(), 1);
    assert_eq!(ct.delete(&gone).unwrap(), 0, "idempotent");
    let node_port = flows(Family::V4, None, 30053, Reply::From(ip("10.244.0.12")));
    assert_eq!(ct.delete(&node_port).unwrap(), 1);
    let stuck = flows(
        Family::V4,
        Some("10.96.0.10"),
        SERVICE_PORT,
        Reply::NotFrom([ip("10.244.0.13")].into()),
    );
    assert_eq!(ct.delete(&stuck).unwrap(), 1);
    let left: Vec<IpAddr> = ct.entries(&all_v4).unwrap().iter().map(|e| e.reply_src).collect();
    assert_eq!(left, [ip("10.244.0.13")]);
    let tcp = Flows {
        protocol: model::Protocol::Tcp,
        ..all_v4.clone()
    };
    assert_eq!(ct.entries(&tcp).unwrap().len(), 1, "TCP untouched");

    let gone6 = flows(Family::V6, Some("fd00::10"), SERVICE_PORT, Reply::From(ip("fd00::12")));
    assert_eq!(ct.delete(&gone6).unwrap(), 1);
    let all_v6 = flows(Family::V6, None, SERVICE_PORT, Reply::NotFrom(Default::default()));
    let left: Vec<IpAddr> = ct.entries(&all_v6).unwrap().iter().map(|e| e.reply_src).collect();
    assert_eq!(left, [ip("fd00::13")]);
}
