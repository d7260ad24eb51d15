//! Services between real pods in the lab: ferro-control-plane (scheduler, controllers incl. the
//! EndpointSlice one), containerd + runc with ferro-cni, ferro-agent running the pods, and
//! ferro-proxy (the real binary) in the node's network namespace, in iptables and then nftables
//! mode. A client pod reaches a Deployment's pods through their Service's ClusterIP; a pod
//! that stops being ready leaves the Service; the Service deleted, its address refuses.
//! Needs root; everything lives in the lab's network namespace.
#![allow(clippy::unwrap_used)]

mod lab;

use std::collections::BTreeSet;
use std::time::Duration;

use lab::{Lab, BUSYBOX};

const MIN: Duration = Duration::from_secs(60);

/// The proxy's log, the node's NAT rules and the client's view, for a failure message.
fn diag(lab: &Lab, url: &str) -> String {
    let log = lab.proxy_log();
    let nat = lab.ns.command("iptables-save").args(["-t", "nat"]).output().map(|o| String::from_utf8_lossy(&o.stdout).into_owned()).unwrap_or_default();
    let nft = lab.ns.command("nft").args(["list", "ruleset"]).output().map(|o| String::from_utf8_lossy(&o.stdout).into_owned()).unwrap_or_default();
    let sysctl = lab.ns.command("sysctl").arg("net.ipv4.ip_forward").output().map(|o| String::from_utf8_lossy(&o.stdout).into_owned()).unwrap_or_default();
    let w = lab.kubectl(&["exec", "client", "--", "timeout", "5", "wget", "-qO-", url]);
    let slices = lab.kubectl(&["get", "endpointslices", "-o", "yaml"]);
    format!(
        "proxy log:\n{log}\nnat:\n{nat}\nnft:\n{nft}\nlab ns {sysctl}\nwget: {}\nslices:\n{}",
        String::from_utf8_lossy(&w.stderr),
        String::from_utf8_lossy(&slices.stdout)
    )
}

/// What the client pod gets from `url` (empty on failure), with the exit code. (`timeout`, not
/// wget's `-T`: Debian's static busybox wget dies of SIGSEGV with `-T`.)
fn fetch(lab: &Lab, url: &str) -> (bool, String) {
    let out = lab.kubectl(&["exec", "client", "--", "timeout", "5", "wget", "-qO-", url]);
    (out.status.success(), String::from_utf8_lossy(&out.stdout).trim().to_string())
}

#[test]
#[ignore = "privileged: needs root and containerd; run by scripts/test.sh"]
fn a_pod_reaches_a_deployment_through_its_service_in_both_proxy_modes() {
    let lab = Lab::start("svc");
    // Two web pods answering their own name, a readiness file to take one out.
    lab.apply(&format!(
        "apiVersion: apps/v1\nkind: Deployment\nmetadata:\n  name: web\nspec:\n  replicas: 2\n  selector:\n    matchLabels: {{app: web}}\n  template:\n    metadata:\n      labels: {{app: web}}\n    spec:\n      terminationGracePeriodSeconds: 2\n      containers:\n      - name: web\n        image: {BUSYBOX}\n        command: [sh, -c, 'mkdir -p /www && hostname > /www/index.html && touch /tmp/ready && exec httpd -f -p 8080 -h /www']\n        readinessProbe:\n          exec: {{command: [cat, /tmp/ready]}}\n          periodSeconds: 1\n"
    ));
    lab.apply("apiVersion: v1\nkind: Service\nmetadata:\n  name: web\nspec:\n  selector: {app: web}\n  ports:\n  - port: 80\n    targetPort: 8080\n");
    lab.apply(&format!(
        "apiVersion: v1\nkind: Pod\nmetadata:\n  name: client\nspec:\n  terminationGracePeriodSeconds: 1\n  containers:\n  - name: c\n    image: {BUSYBOX}\n    command: [sleep, '3600']\n"
    ));
    lab.wait_pod("client", "Running", MIN, |p| p["status"]["phase"] == "Running");
    let names: BTreeSet<String> = lab.wait("both web pods ready", MIN, |l| {
        let out = l.kubectl_ok(&["get", "pods", "-l", "app=web", "-o", "jsonpath={range .items[*]}{.metadata.name} {.status.conditions[?(@.type==\"Ready\")].status}{\"\\n\"}{end}"]);
        let ready: BTreeSet<String> =
            out.lines().filter_map(|l| l.strip_suffix(" True")).map(str::to_string).collect();
        (ready.len() == 2).then_some(ready)
    });
    let ip = lab.kubectl_ok(&["get", "svc", "web", "-o", "jsonpath={.spec.clusterIP}"]);
    let url = format!("http://{ip}/");

    for mode in ["iptables", "nftables"] {
        let proxy = lab.start_proxy(mode);
        // Both endpoints answer through the ClusterIP.
        let mut seen = BTreeSet::new();
        let deadline = std::time::Instant::now() + MIN;
        while seen != names {
            assert!(std::time::Instant::now() < deadline, "{mode}: both pods answering through {url}: saw {seen:?}\n{}", diag(&lab, &url));
            let (ok, body) = fetch(&lab, &url);
            if ok {
                seen.insert(body);
            }
        }
        // One pod not ready: it leaves the EndpointSlice and the rules; only the other answers.
        let (out_pod, kept) = (names.iter().next().unwrap().clone(), names.iter().nth(1).unwrap().clone());
        lab.kubectl_ok(&["exec", &out_pod, "--", "rm", "/tmp/ready"]);
        lab.wait(&format!("{mode}: {out_pod} out of the Service"), MIN, |l| {
            let answers: Vec<String> = (0..6).map(|_| fetch(l, &url).1).collect();
            answers.iter().all(|a| *a == kept).then_some(())
        });
        lab.kubectl_ok(&["exec", &out_pod, "--", "touch", "/tmp/ready"]);
        lab.wait(&format!("{mode}: {out_pod} back"), MIN, |l| fetch(l, &url).1.eq(&out_pod).then_some(()));
        drop(proxy);
        // Leave no rules of this mode for the next (as upstream's mode switch does).
        let cleanup = lab
            .ns
            .command(lab::sibling_bin("ferro-proxy").to_str().unwrap())
            .arg("--cleanup")
            .output()
            .unwrap();
        assert!(cleanup.status.success(), "{}", String::from_utf8_lossy(&cleanup.stderr));
    }

    // The Service deleted (nftables mode running): its address no longer answers.
    let _proxy = lab.start_proxy("nftables");
    assert!(fetch(&lab, &url).0, "the Service answers before its deletion");
    lab.kubectl_ok(&["delete", "svc", "web"]);
    lab.wait("the deleted Service's address refused", MIN, |l| (!fetch(l, &url).0).then_some(()));
    let log = lab.proxy_log();
    assert!(!log.contains("ERROR"), "{log}");
}
