//! The background scrape, as metrics-server's: every resolution (15 s) the `/metrics/resource`
//! of every Ready node's agent, all nodes at once, each within [`SCRAPE_TIMEOUT`]; the round's
//! batches replace the stored ones ([`super::store::Store::store`]). A node that does not
//! answer is left out of the round (its metrics disappear until it answers again).
//!
//! Which nodes and where ([`targets`]) is pure; the request goes through [`Scrape`], whose real
//! implementation ([`AgentScraper`]) uses the server's kubelet client certificate, and whose
//! fake in the tests answers from text.

use std::collections::BTreeMap;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use serde_json::Value;
use tracing::Instrument as _;

use super::parse::{self, Batch};
use super::Metrics;
use crate::api::{Api, ListOptions};
use crate::proxy::{kubelet_address, KubeletClient};
use crate::resources;

/// metrics-server's default --metric-resolution.
pub const RESOLUTION: Duration = Duration::from_secs(15);
/// metrics-server's default --kubelet-request-timeout.
pub const SCRAPE_TIMEOUT: Duration = Duration::from_secs(10);
/// The largest answer read from an agent.
const MAX_BODY: usize = 32 * 1024 * 1024;

#[derive(Debug, thiserror::Error)]
pub enum ScrapeError {
    #[error("{0}")]
    Connect(String),
    #[error("request failed, status: {0}")]
    Status(u16),
    #[error("reading the answer: {0}")]
    Body(String),
    #[error("timed out after {0:?}")]
    Timeout(Duration),
}

/// A node to scrape: its name and its agent's address.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Target {
    pub node: String,
    pub host: String,
    pub port: u16,
}

/// The Ready nodes with an address, sorted by name.
pub fn targets(nodes: &[Value]) -> Vec<Target> {
    let mut out: Vec<Target> = nodes
        .iter()
        .filter(|n| {
            n.pointer("/status/conditions")
                .and_then(Value::as_array)
                .is_some_and(|cs| cs.iter().any(|c| c["type"] == "Ready" && c["status"] == "True"))
        })
        .filter_map(|n| {
            let name = n.pointer("/metadata/name")?.as_str()?.to_string();
            match kubelet_address(n) {
                Some((host, port)) => Some(Target { node: name, host, port }),
                None => {
                    tracing::debug!(node = %name, "no address to scrape");
                    None
                }
            }
        })
        .collect();
    out.sort_by(|a, b| a.node.cmp(&b.node));
    out
}

/// Fetches an agent's `/metrics/resource`.
pub trait Scrape: Send + Sync + 'static {
    fn scrape(&self, host: &str, port: u16) -> impl Future<Output = Result<String, ScrapeError>> + Send;
}

/// The real scraper: HTTPS with the server's kubelet client certificate.
#[derive(Clone)]
pub struct AgentScraper(pub KubeletClient);

impl Scrape for AgentScraper {
    async fn scrape(&self, host: &str, port: u16) -> Result<String, ScrapeError> {
        use http_body_util::BodyExt as _;
        let req = http::Request::get("/metrics/resource")
            .header(http::header::HOST, format!("{host}:{port}"))
            .body(http_body_util::Empty::<bytes::Bytes>::new())
            .map_err(|e| ScrapeError::Connect(e.to_string()))?;
        let resp = self.0.send(host, port, req).await.map_err(|e| ScrapeError::Connect(e.message))?;
        if resp.status() != http::StatusCode::OK {
            return Err(ScrapeError::Status(resp.status().as_u16()));
        }
        let body = http_body_util::Limited::new(resp.into_body(), MAX_BODY)
            .collect()
            .await
            .map_err(|e| ScrapeError::Body(e.to_string()))?
            .to_bytes();
        Ok(String::from_utf8_lossy(&body).into_owned())
    }
}

/// Scrapes one node (a span per node); `None` when it did not answer.
async fn scrape_node<S: Scrape>(scraper: &S, t: &Target) -> Option<Batch> {
    let span = tracing::debug_span!("scrape_node", node = %t.node);
    async {
        match tokio::time::timeout(SCRAPE_TIMEOUT, scraper.scrape(&t.host, t.port)).await {
            Ok(Ok(text)) => {
                let batch = parse::parse(&text);
                tracing::debug!(pods = batch.pods.len(), node_point = batch.node.is_some(), "scraped");
                Some(batch)
            }
            Ok(Err(e)) => {
                tracing::warn!(host = %t.host, port = t.port, error = %e, "failed to scrape node");
                None
            }
            Err(_) => {
                tracing::warn!(host = %t.host, port = t.port, error = %ScrapeError::Timeout(SCRAPE_TIMEOUT), "failed to scrape node");
                None
            }
        }
    }
    .instrument(span)
    .await
}

/// Scrapes every target at once; the batches of those that answered.
pub async fn scrape_all<S: Scrape>(scraper: &S, targets: &[Target]) -> BTreeMap<String, Batch> {
    let results = futures::future::join_all(targets.iter().map(|t| async move { (t.node.clone(), scrape_node(scraper, t).await) })).await;
    results.into_iter().filter_map(|(n, b)| Some((n, b?))).collect()
}

/// Runs rounds every `period` until the task is dropped.
pub async fn run<S: Scrape>(api: Arc<Api>, scraper: S, metrics: Arc<Metrics>, period: Duration) {
    let mut tick = tokio::time::interval(period);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        let Some(nodes_res) = resources::find("", "v1", "nodes") else { return };
        let nodes: Vec<Value> = match api.list(nodes_res, None, &ListOptions::default()).await {
            Ok(page) => page.records.iter().filter_map(|r| r.json().ok()).collect(),
            Err(e) => {
                tracing::warn!(error = %e.message, "listing nodes to scrape failed");
                continue;
            }
        };
        let round = scrape_all(&scraper, &targets(&nodes)).await;
        metrics.store(&round);
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use serde_json::json;
    use std::sync::Mutex;

    fn node(name: &str, ready: &str, addr: Option<&str>) -> Value {
        let addresses: Vec<Value> = addr.map(|a| json!({"type": "InternalIP", "address": a})).into_iter().collect();
        json!({"metadata": {"name": name}, "status": {
            "conditions": [{"type": "Ready", "status": ready}],
            "addresses": addresses,
            "daemonEndpoints": {"kubeletEndpoint": {"Port": 10250}},
        }})
    }

    #[test]
    fn ready_nodes_with_an_address() {
        let nodes = [node("b", "True", Some("10.0.0.2")), node("a", "True", Some("10.0.0.1")), node("c", "False", Some("10.0.0.3")), node("d", "True", None)];
        assert_eq!(
            targets(&nodes),
            vec![
                Target { node: "a".into(), host: "10.0.0.1".into(), port: 10250 },
                Target { node: "b".into(), host: "10.0.0.2".into(), port: 10250 },
            ]
        );
    }

    /// Answers from text per host, recording the hosts asked.
    struct Fake {
        answers: BTreeMap<String, Result<String, u16>>,
        asked: Mutex<Vec<String>>,
    }

    impl Scrape for Fake {
        async fn scrape(&self, host: &str, _port: u16) -> Result<String, ScrapeError> {
            self.asked.lock().unwrap().push(host.to_string());
            match self.answers.get(host) {
                Some(Ok(t)) => Ok(t.clone()),
                Some(Err(code)) => Err(ScrapeError::Status(*code)),
                None => Err(ScrapeError::Connect(format!("dial tcp {host}: connection refused"))),
            }
        }
    }

    #[tokio::test]
    async fn a_round_keeps_the_nodes_that_answered() {
        let fake = Fake {
            answers: BTreeMap::from([
                ("10.0.0.1".to_string(), Ok("node_cpu_usage_seconds_total 1 1000\nnode_memory_working_set_bytes 5 1000\n".to_string())),
                ("10.0.0.2".to_string(), Err(403)),
            ]),
            asked: Mutex::new(Vec::new()),
        };
        let ts = [
            Target { node: "a".into(), host: "10.0.0.1".into(), port: 10250 },
            Target { node: "b".into(), host: "10.0.0.2".into(), port: 10250 },
            // refuses the connection
            Target { node: "c".into(), host: "10.0.0.3".into(), port: 10250 },
        ];
        let round = scrape_all(&fake, &ts).await;
        assert_eq!(round.keys().collect::<Vec<_>>(), ["a"]);
        assert_eq!(round["a"].node.unwrap().memory, 5);
        let mut asked = fake.asked.lock().unwrap().clone();
        asked.sort();
        assert_eq!(asked, ["10.0.0.1", "10.0.0.2", "10.0.0.3"]);
    }
}
