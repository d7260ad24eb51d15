//! Benchmark of leader hand-over between two ferro-control-plane replicas on etcd.
//!
//! cargo build --release -p ferro-control-plane --example leader-bench --bin ferro-control-plane
//! ./target/release/examples/leader-bench [--rounds 5] [--etcd-members 3]
//!
//! Starts an etcd cluster on loopback (Debian's etcd-server) and two replicas with
//! `--leader-elect` and upstream's default timings (lease 15 s, renew deadline 10 s, retry 2 s).
//! Each round waits until one replica leads and the other has seen its Lease, then ends the
//! leader — with SIGKILL (a crash: the Lease must expire) or SIGTERM (a clean stop: the Lease
//! is given back) in turn — and reports the time from the signal to the moment the Lease names
//! the survivor, then to the survivor's "controller loops started". The ended replica comes
//! back as a new candidate for the next round. The Lease is read every 10 ms through the
//! survivor to see the change (the measurement's resolution).
#![allow(clippy::unwrap_used)]

mod common;

use std::time::{Duration, Instant};

use k8s_openapi::api::coordination::v1::Lease;
use kube::Api;

use common::{arg, pct, EtcdCluster, Server};

/// The log without its colour escapes.
fn plain(log: &str) -> String {
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

/// The election identity the replica logged.
async fn identity(s: &Server) -> String {
    loop {
        let log = plain(&s.log());
        if let Some(line) = log.lines().find(|l| l.contains("attempting to acquire the leader lease")) {
            return line.split_whitespace().find_map(|w| w.strip_prefix("identity=")).unwrap().to_string();
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

async fn holder(leases: &Api<Lease>) -> Option<String> {
    leases.get_opt("ferro-control-plane").await.ok()??.spec?.holder_identity.filter(|h| !h.is_empty())
}

#[tokio::main]
async fn main() {
    let rounds = arg("--rounds", 6);
    let members = arg("--etcd-members", 3);
    let etcd = EtcdCluster::start(members);
    let etcd_flag = format!("--etcd-servers={}", etcd.urls.join(","));
    let args = ["--leader-elect", etcd_flag.as_str()];
    println!("leader hand-over: {members} etcd members, 2 replicas, lease 15 s / renew deadline 10 s / retry 2 s (the defaults)");
    let first = Server::start_replica("ferro-leader-bench", &args, None, Some("info")).await;
    let second = Server::start_replica("ferro-leader-bench", &args, Some(&first), Some("info")).await;
    let mut replicas = [first, second];
    let mut crash = Vec::new();
    let mut clean = Vec::new();
    for round in 0..rounds {
        let ids = [identity(&replicas[0]).await, identity(&replicas[1]).await];
        // one leads, the other has seen its Lease held
        let leases: Api<Lease> = Api::namespaced(replicas[0].client.clone(), "kube-system");
        let leader_id = loop {
            if let Some(h) = holder(&leases).await.filter(|h| ids.contains(h)) {
                break h;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        };
        let l = usize::from(leader_id == ids[1]);
        let f = 1 - l;
        while !plain(&replicas[f].log()).contains("the leader lease is held by another replica") {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        // a point between two renewals that differs from round to round
        tokio::time::sleep(Duration::from_millis(500 + 337 * round as u64 % 2000)).await;
        let survivor: Api<Lease> = Api::namespaced(replicas[f].client.clone(), "kube-system");
        let kill = round % 2 == 0;
        let pid = replicas[l].child.id();
        let t0 = Instant::now();
        if kill {
            replicas[l].child.kill().unwrap();
        } else {
            std::process::Command::new("kill").args(["-TERM", &pid.to_string()]).status().unwrap();
        }
        let lease_at = loop {
            if holder(&survivor).await.as_deref() == Some(ids[f].as_str()) {
                break t0.elapsed();
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        };
        while !plain(&replicas[f].log()).contains("controller loops started") {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        let loops_at = t0.elapsed();
        println!(
            "round {round}: {} of the leader: the survivor holds the Lease after {:.2} s, its loops started after {:.2} s",
            if kill { "SIGKILL" } else { "SIGTERM" },
            lease_at.as_secs_f64(),
            loops_at.as_secs_f64()
        );
        if kill { &mut crash } else { &mut clean }.push(lease_at.as_secs_f64());
        let _ = replicas[l].child.wait();
        // the ended replica returns as a candidate
        let back = Server::start_replica("ferro-leader-bench", &args, Some(&replicas[f]), Some("info")).await;
        replicas[l] = back;
    }
    let summary = |name: &str, v: &mut Vec<f64>| {
        let max = v.iter().copied().fold(f64::NAN, f64::max);
        println!("{name} ({} rounds): Lease taken over after p50 {:.2} s, max {max:.2} s", v.len(), pct(v, 0.5));
    };
    summary("SIGKILL", &mut crash);
    summary("SIGTERM", &mut clean);
    drop(replicas);
    drop(etcd);
}
