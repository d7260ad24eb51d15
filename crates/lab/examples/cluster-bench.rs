//! The multi-node lab's figures (docs/performance.md): for each run, a fresh cluster of three
//! nodes (ferro_lab::cluster) and
//! - cold start: from nothing to every node Ready with its overlay, proxy and CSI driver (the
//!   test images built and imported into each node's containerd included);
//! - node loss: a Deployment of 3 httpd replicas behind a ClusterIP Service, a client pod on
//!   another node; the agent and netd of a replica's node are killed (SIGKILL) at t=0, then
//!   the time until the node is Unknown, until the lost replicas are replaced (3 ready, none
//!   on that node) and until the Service answers from the new set only (every replica of it
//!   answered, no answer from a lost pod since the last one that came).
//!
//! Prints every run and the p50. Root; build the workspace first (cargo build --workspace
//! --all-targets), then: target/debug/examples/cluster-bench [--runs 5] [--grace 10s]
//! [--toleration 2].

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use ferro_lab::cluster::{httpd_deployment, node_name, sleeper_pod, Cluster};

struct Run {
    cold: Duration,
    unknown: Duration,
    rescheduled: Duration,
    routed: Duration,
}

fn arg(name: &str, default: &str) -> String {
    let args: Vec<String> = std::env::args().collect();
    args.iter().position(|a| a == name).and_then(|i| args.get(i + 1)).cloned().unwrap_or_else(|| default.to_string())
}

fn one(r: usize, grace: &str, toleration: u32) -> Result<Run> {
    let start = Instant::now();
    let mut c = Cluster::start(&format!("b{r}"), &["1Gi"; 3], grace)?;
    let cold = start.elapsed();
    c.apply(&httpd_deployment("app", 3, toleration))?;
    let pods = c.wait("3 ready replicas", Duration::from_secs(120), |c| {
        let p = c.pods("app=app").ok()?;
        (p.len() == 3 && p.iter().all(|p| p.ready)).then_some(p)
    })?;
    let failed = pods[0].node.clone();
    let i = (0..c.nodes.len()).find(|i| node_name(*i) == failed).context("the replica's node")?;
    let other = (0..c.nodes.len()).map(node_name).find(|n| *n != failed).context("another node")?;
    c.apply(&sleeper_pod("client", &other))?;
    let cluster_ip = c.kubectl_ok(&["get", "service", "app", "-o", "jsonpath={.spec.clusterIP}"])?;
    let url = format!("http://{cluster_ip}/");
    let all: BTreeSet<String> = pods.iter().map(|p| p.name.clone()).collect();
    let mut seen = BTreeSet::new();
    c.wait("the Service to answer from every replica", Duration::from_secs(120), |c| {
        if let Ok(a) = c.fetch("client", &url, 2) {
            seen.insert(a);
        }
        (seen == all).then_some(())
    })?;
    let lost: BTreeSet<String> = pods.iter().filter(|p| p.node == failed).map(|p| p.name.clone()).collect();

    let t0 = Instant::now();
    c.nodes[i].agent.kill9();
    c.nodes[i].netd.kill9();
    c.wait("the node Unknown", Duration::from_secs(180), |c| {
        let s = c.kubectl_ok(&["get", "node", &failed, "-o", "jsonpath={.status.conditions[?(@.type==\"Ready\")].status}"]).ok()?;
        (s == "Unknown").then_some(())
    })?;
    let unknown = t0.elapsed();
    let now = c.wait("the replicas replaced", Duration::from_secs(180), |c| {
        let p = c.pods("app=app").ok()?;
        let fine = p.len() == 3 && p.iter().all(|p| p.ready && p.node != failed && !lost.contains(&p.name));
        fine.then(|| p.iter().map(|p| p.name.clone()).collect::<BTreeSet<String>>())
    })?;
    let rescheduled = t0.elapsed();
    let mut seen = BTreeSet::new();
    c.wait("the Service to answer from the new replicas only", Duration::from_secs(180), |c| {
        match c.fetch("client", &url, 2) {
            Ok(a) if now.contains(&a) => {
                seen.insert(a);
            }
            // a lost pod (or a failed request) answered: start again
            _ => seen.clear(),
        }
        (seen == now).then_some(())
    })?;
    let routed = t0.elapsed();
    Ok(Run { cold, unknown, rescheduled, routed })
}

fn p50(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v[v.len() / 2]
}

fn main() -> Result<()> {
    let runs: usize = arg("--runs", "5").parse().context("--runs")?;
    let grace = arg("--grace", "10s");
    let toleration: u32 = arg("--toleration", "2").parse().context("--toleration")?;
    if runs == 0 {
        bail!("--runs must be at least 1");
    }
    println!("cluster-bench: 3 nodes, --node-monitor-grace-period {grace}, tolerationSeconds {toleration}, {runs} runs");
    let mut all = Vec::new();
    for r in 1..=runs {
        let run = one(r, &grace, toleration).with_context(|| format!("run {r}"))?;
        println!(
            "run {r}: cold start {:.1} s; node loss -> Unknown {:.1} s, replicas replaced {:.1} s, Service on the new set only {:.1} s",
            run.cold.as_secs_f64(),
            run.unknown.as_secs_f64(),
            run.rescheduled.as_secs_f64(),
            run.routed.as_secs_f64()
        );
        all.push(run);
    }
    println!(
        "p50: cold start {:.1} s; node loss -> Unknown {:.1} s, replicas replaced {:.1} s, Service on the new set only {:.1} s",
        p50(all.iter().map(|r| r.cold).collect()).as_secs_f64(),
        p50(all.iter().map(|r| r.unknown).collect()).as_secs_f64(),
        p50(all.iter().map(|r| r.rescheduled).collect()).as_secs_f64(),
        p50(all.iter().map(|r| r.routed).collect()).as_secs_f64()
    );
    Ok(())
}
