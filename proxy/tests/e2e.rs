//! Privileged end to end: ferro-control-plane and the real ferro-proxy binary in a node
//! namespace; Services and EndpointSlices written with kubectl; packets from pods and from a
//! client outside the node.
#![allow(clippy::unwrap_used)]

mod common;

use std::collections::BTreeSet;
use std::time::Duration;

use common::{Cluster, World};

fn spread(c: &Cluster, from_pod: usize, url: &str, n: usize) -> BTreeSet<String> {
    (0..n).filter_map(|_| c.world.get_in_pod(from_pod, url).ok()).collect()
}

fn e2e(mode: &str) {
    let mut c = Cluster::new(&format!("e2e{}", &mode[..3]), 3, mode).unwrap();
    let vip = c.service("web", "  type: NodePort\n", &[(1, true), (2, true)]).unwrap();
    let url = format!("http://{vip}/");
    let both = BTreeSet::from(["pod1".to_string(), "pod2".to_string()]);
    c.wait("both endpoints behind the ClusterIP", Duration::from_secs(30), || spread(&c, 0, &url, 20) == both).unwrap();
    // the NodePort the control plane allocated answers a client outside the node
    let np = c.kubectl(&["get", "service", "web", "-o", "jsonpath={.spec.ports[0].nodePort}"]).unwrap();
    let np_url = format!("http://{}:{}/", common::NODE_IP, np.trim());
    c.wait("the NodePort", Duration::from_secs(30), || c.world.get_in_client(&np_url).is_ok()).unwrap();
    // an endpoint leaves (not ready): gone from the rules
    c.endpoints("web", &[(1, true), (2, false)]).unwrap();
    c.wait("the not-ready endpoint out of the rules", Duration::from_secs(30), || {
        spread(&c, 0, &url, 20) == BTreeSet::from(["pod1".to_string()])
    })
    .unwrap();
    // a Service with no endpoints refuses at once
    let empty = c.service("empty", "", &[]).unwrap();
    c.wait("REJECT for the Service without endpoints", Duration::from_secs(30), || {
        c.world.get_in_pod(0, &format!("http://{empty}/")).is_err_and(|e| e.code == 7)
    })
    .unwrap();
    // metrics with upstream's names, health 200
    let metrics = c.world.get_in_node("http://127.0.0.1:10249/metrics").unwrap();
    assert!(metrics.contains("kubeproxy_sync_proxy_rules_duration_seconds_count"), "{metrics}");
    assert!(c.world.get_in_node("http://127.0.0.1:10256/livez").is_ok());
    // kill -9 and restart: traffic never stops, a Service deleted meanwhile leaves no rule
    c.proxy.kill();
    assert!(spread(&c, 0, &url, 5).contains("pod1"), "rules stay while the proxy is down");
    c.kubectl(&["delete", "service", "empty"]).unwrap();
    c.kubectl(&["delete", "endpointslice", "empty-manual"]).unwrap();
    c.start_proxy(&[]).unwrap();
    c.wait("the deleted Service's rules gone", Duration::from_secs(30), || {
        // refused (REJECT) becomes "no route"/timeout-free failure without the reject rule:
        // the reject rule for it must be gone from the filter table
        !rules_text(&c.world, mode).contains(empty.as_str())
    })
    .unwrap();
    assert!(spread(&c, 0, &url, 5).contains("pod1"));
    // --cleanup removes everything
    c.proxy.kill();
    let out = std::process::Command::new("ip")
        .args(["netns", "exec", c.world.node.name()])
        .arg(env!("CARGO_BIN_EXE_ferro-proxy"))
        .args(["--cleanup"])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let left = rules_text(&c.world, mode);
    assert!(!left.contains("KUBE-"), "{left}");
    assert!(!left.contains("kube-proxy"), "{left}");
}

/// Every rule in the node namespace, as the kernel tools print them.
fn rules_text(w: &World, _mode: &str) -> String {
    let mut s = String::new();
    for args in [&["iptables-save"][..], &["nft", "list", "ruleset"][..]] {
        let out = std::process::Command::new("ip").args(["netns", "exec", w.node.name()]).args(args).output().unwrap();
        s.push_str(&String::from_utf8_lossy(&out.stdout));
    }
    s
}

#[test]
#[ignore = "privileged: needs root, network namespaces, kubectl; run by scripts/test.sh"]
fn iptables_mode_end_to_end() {
    e2e("iptables");
}

#[test]
#[ignore = "privileged: needs root, network namespaces, kubectl; run by scripts/test.sh"]
fn nftables_mode_end_to_end() {
    e2e("nftables");
}
