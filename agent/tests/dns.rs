//! Cluster DNS between real pods in the lab: ferro-control-plane (EndpointSlice controller
//! included), containerd + runc with ferro-cni, ferro-agent with clusterDNS 169.254.20.10, and
//! ferro-dns (the real binary) in the node's network namespace holding that address on its own
//! link. The "outside" resolver is a dnsmasq this test starts on 127.0.0.1:5353 inside the
//! lab's namespace, serving one test name: no query leaves the namespace.
//! A pod resolves a Service by its full name and by its short name (search domains), a
//! headless Service's pods and one pod by its hostname, an outside name through forwarding;
//! a malformed name gets FORMERR, a missing one NXDOMAIN.
//! Needs root; everything lives in the lab's network namespace.
#![allow(clippy::unwrap_used)]

mod lab;

use std::process::Stdio;
use std::time::Duration;

use lab::{Lab, Proc, BUSYBOX, NO_IMAGE_GC};

const MIN: Duration = Duration::from_secs(60);
const DNS_IP: &str = "169.254.20.10";

/// dnsmasq on 127.0.0.1:5353 in the lab namespace: `www.outside.test` -> 192.0.2.7, nothing
/// else (no upstream of its own).
fn start_outside_resolver(lab: &Lab) -> Proc {
    ferro_lab::require_bin("dnsmasq", "dnsmasq-base").unwrap();
    let log = std::fs::File::create(lab.dir.path().join("dnsmasq.log")).unwrap();
    let child = lab
        .ns
        .command("dnsmasq")
        .args(["--keep-in-foreground", "--no-resolv", "--no-hosts", "--bind-interfaces", "--listen-address=127.0.0.1", "--port=5353"])
        .args(["--pid-file=", "--user=root", "--host-record=www.outside.test,192.0.2.7", "--log-queries", "--log-facility=-"])
        .stdout(Stdio::null())
        .stderr(log)
        .spawn()
        .unwrap();
    Proc(Some(child))
}

/// ferro-dns in the lab namespace, answering on 169.254.20.10:53 (its own link), forwarding to
/// the test's dnsmasq.
fn start_dns(lab: &Lab) -> Proc {
    let log = std::fs::File::create(lab.dir.path().join("dns.log")).unwrap();
    let child = lab
        .ns
        .command(lab::sibling_bin("ferro-dns").to_str().unwrap())
        .arg("--kubeconfig")
        .arg(lab.admin_kubeconfig())
        .args(["--listen-address", DNS_IP, "--setup-interface", "ferro-dns0", "--upstream", "127.0.0.1:5353"])
        .env("RUST_LOG", "info,ferro_dns=debug")
        .stdout(Stdio::null())
        .stderr(log)
        .spawn()
        .unwrap();
    Proc(Some(child))
}

fn dns_log(lab: &Lab) -> String {
    std::fs::read_to_string(lab.dir.path().join("dns.log")).unwrap_or_default()
}

/// `nslookup` in the client pod: (exit ok, stdout + stderr).
fn lookup(lab: &Lab, args: &[&str]) -> (bool, String) {
    let mut a = vec!["exec", "client", "--", "timeout", "10", "nslookup"];
    a.extend_from_slice(args);
    let out = lab.kubectl(&a);
    (out.status.success(), format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr)))
}

/// Waits until `nslookup name` in the client pod prints every one of `want`.
fn wait_resolves(lab: &Lab, name: &str, want: &[&str]) -> String {
    let deadline = std::time::Instant::now() + MIN;
    loop {
        let (_, out) = lookup(lab, &[name]);
        if want.iter().all(|w| out.contains(&format!("Address: {w}"))) {
            return out;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "{name} did not resolve to {want:?}; last answer:\n{out}\nferro-dns log:\n{}\n{}",
            dns_log(lab),
            lab.logs()
        );
        std::thread::sleep(Duration::from_millis(500));
    }
}

#[test]
#[ignore = "privileged: needs root and containerd; run by scripts/test.sh"]
fn pods_resolve_services_headless_pods_and_outside_names() {
    let lab = Lab::start_with("dns", &format!("clusterDNS: [{DNS_IP}]\nclusterDomain: cluster.local\n{NO_IMAGE_GC}"));
    let _outside = start_outside_resolver(&lab);
    let _dns = start_dns(&lab);

    // A ClusterIP Service (no pod needed: DNS answers from the Service), a headless Service
    // with two pods, one of them with a hostname in it (subdomain = the Service).
    lab.apply("apiVersion: v1\nkind: Service\nmetadata:\n  name: web\nspec:\n  selector: {app: web}\n  ports:\n  - {name: http, port: 80, targetPort: 8080}\n");
    lab.apply("apiVersion: v1\nkind: Service\nmetadata:\n  name: db\nspec:\n  clusterIP: None\n  selector: {app: db}\n  ports:\n  - {name: pg, port: 5432}\n");
    for (name, host) in [("db-a", Some("db-0")), ("db-b", None)] {
        let hostname = host.map(|h| format!("  hostname: {h}\n  subdomain: db\n")).unwrap_or_default();
        lab.apply(&format!(
            "apiVersion: v1\nkind: Pod\nmetadata:\n  name: {name}\n  labels: {{app: db}}\nspec:\n{hostname}  terminationGracePeriodSeconds: 1\n  containers:\n  - name: c\n    image: {BUSYBOX}\n    command: [sleep, '3600']\n"
        ));
    }
    lab.apply(&format!(
        "apiVersion: v1\nkind: Pod\nmetadata:\n  name: client\nspec:\n  terminationGracePeriodSeconds: 1\n  containers:\n  - name: c\n    image: {BUSYBOX}\n    command: [sleep, '3600']\n"
    ));
    lab.wait_pod("client", "Running", MIN, |p| p["status"]["phase"] == "Running");
    let ips: Vec<String> = ["db-a", "db-b"]
        .iter()
        .map(|n| lab.wait_pod(n, "Running with an address", MIN, |p| p["status"]["podIP"].is_string())["status"]["podIP"].as_str().unwrap().to_string())
        .collect();
    let web_ip = lab.kubectl_ok(&["get", "svc", "web", "-o", "jsonpath={.spec.clusterIP}"]);

    // The agent gave the pod ferro-dns as its nameserver, with the cluster's search domains.
    let resolv = lab.kubectl_ok(&["exec", "client", "--", "cat", "/etc/resolv.conf"]);
    assert!(resolv.contains(&format!("nameserver {DNS_IP}")), "{resolv}");
    assert!(resolv.contains("search default.svc.cluster.local svc.cluster.local cluster.local"), "{resolv}");

    // The Service: full name, then the short name through the search domains.
    wait_resolves(&lab, "web.default.svc.cluster.local", &[&web_ip]);
    let out = wait_resolves(&lab, "web", &[&web_ip]);
    assert!(out.contains("web.default.svc.cluster.local"), "{out}");
    // The headless Service: both ready pods; one by its hostname.
    wait_resolves(&lab, "db.default.svc.cluster.local", &[&ips[0], &ips[1]]);
    wait_resolves(&lab, "db-0.db.default.svc.cluster.local", &[&ips[0]]);
    // `<hostname>.<svc>` through the search domains (ndots:5): busybox nslookup tries the
    // search list only for names without a dot, so through the libc resolver (ping)
    let out = lab.kubectl(&["exec", "client", "--", "ping", "-c", "1", "-W", "2", "db-0.db"]);
    let text = String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    assert!(text.contains(&format!("PING db-0.db ({})", ips[0])), "{text}");
    // SRV of the named port, PTR of the Service's address.
    let (_, srv) = lookup(&lab, &["-type=srv", "_http._tcp.web.default.svc.cluster.local"]);
    assert!(srv.contains("80 web.default.svc.cluster.local"), "{srv}");
    let rev: Vec<&str> = web_ip.split('.').rev().collect();
    let (_, ptr) = lookup(&lab, &["-type=ptr", &format!("{}.in-addr.arpa", rev.join("."))]);
    assert!(ptr.contains("web.default.svc.cluster.local"), "{ptr}");
    // An outside name, through ferro-dns to the test's resolver.
    wait_resolves(&lab, "www.outside.test", &["192.0.2.7"]);
    let dnsmasq = std::fs::read_to_string(lab.dir.path().join("dnsmasq.log")).unwrap_or_default();
    assert!(dnsmasq.contains("www.outside.test"), "the outside resolver was asked: {dnsmasq}");
    assert!(!dnsmasq.contains("svc.cluster.local"), "cluster names never leave ferro-dns: {dnsmasq}");

    // A name that does not exist: NXDOMAIN.
    let (ok, out) = lookup(&lab, &["nope.default.svc.cluster.local"]);
    assert!(!ok && out.contains("NXDOMAIN"), "{out}");
    // A malformed name (a 64-byte label, over TCP with its length prefix): FORMERR (RCODE 1
    // in the low bits of the reply's fourth byte), then the server closes the connection.
    // printf octal escapes: length 82, id 0x1234, RD, one question, a 0x40 label type
    let mut q = String::from("\\000\\122\\022\\064\\001\\000\\000\\001\\000\\000\\000\\000\\000\\000\\100");
    q.push_str(&"a".repeat(64));
    q.push_str("\\000\\000\\001\\000\\001");
    let script = format!("printf '{q}' | nc {DNS_IP} 53 | od -An -tx1");
    let out = lab.kubectl_ok(&["exec", "client", "--", "timeout", "10", "sh", "-c", &script]);
    let bytes: Vec<u8> = out.split_whitespace().filter_map(|b| u8::from_str_radix(b, 16).ok()).collect();
    // length prefix, id 0x1234, QR set, RCODE 1
    assert!(bytes.len() >= 6, "no answer to the malformed query: {out:?}\n{}", dns_log(&lab));
    assert_eq!(&bytes[2..4], &[0x12, 0x34], "{out}");
    assert_eq!(bytes[4] & 0x80, 0x80, "{out}");
    assert_eq!(bytes[5] & 0x0f, 1, "FORMERR expected: {out}");

    // A new endpoint shows up in the answers (the EndpointSlice watch).
    lab.apply(&format!(
        "apiVersion: v1\nkind: Pod\nmetadata:\n  name: db-c\n  labels: {{app: db}}\nspec:\n  terminationGracePeriodSeconds: 1\n  containers:\n  - name: c\n    image: {BUSYBOX}\n    command: [sleep, '3600']\n"
    ));
    let ip_c = lab.wait_pod("db-c", "Running with an address", MIN, |p| p["status"]["podIP"].is_string())["status"]["podIP"].as_str().unwrap().to_string();
    wait_resolves(&lab, "db", &[&ips[0], &ips[1], &ip_c]);
    let log = dns_log(&lab);
    assert!(!log.contains("ERROR") && !log.contains("panicked"), "{log}");
    for p in ["client", "db-a", "db-b", "db-c"] {
        lab.kubectl_ok(&["delete", "pod", p, "--wait=true"]);
    }
    lab.wait_nothing_left();
}
