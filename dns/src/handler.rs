//! Between the sockets and the pure answer function: the published [`Index`] (swapped whole
//! when the model changes), the local answer, and the upstream round trips that a
//! [`Outcome::Forward`] or [`Outcome::Chase`] asks for.

use std::sync::{Arc, RwLock};

use hickory_proto::op::Message;

use crate::answer::{self, Outcome, Transport};
use crate::forward::Upstream;
use crate::model::Index;

/// The index queries are answered from; readers take a snapshot (an `Arc`), a rebuild
/// replaces it whole.
pub struct Published(RwLock<Arc<Index>>);

impl Published {
    pub fn new(index: Index) -> Self {
        Published(RwLock::new(Arc::new(index)))
    }

    pub fn load(&self) -> Arc<Index> {
        self.0.read().unwrap_or_else(|p| p.into_inner()).clone()
    }

    pub fn store(&self, index: Index) {
        *self.0.write().unwrap_or_else(|p| p.into_inner()) = Arc::new(index);
    }
}

/// Answers queries: locally, or through the upstream.
pub struct Handler {
    pub index: Arc<Published>,
    pub opts: answer::Options,
    pub upstream: Option<Arc<dyn Upstream>>,
}

impl Handler {
    /// The answer from the index alone (the fast path the UDP threads run).
    pub fn local(&self, request: &[u8], transport: Transport) -> Outcome {
        answer::answer(&self.index.load(), request, transport, &self.opts)
    }

    /// Finishes what [`Handler::local`] could not: forwarding and CNAME chasing.
    pub async fn complete(&self, request: &[u8], transport: Transport, outcome: Outcome) -> Option<Vec<u8>> {
        match outcome {
            Outcome::Reply(b) => Some(b),
            Outcome::Drop => None,
            Outcome::Forward => {
                let Some(up) = &self.upstream else { return answer::servfail(request, &self.opts) };
                match up.exchange(request, transport == Transport::Tcp).await {
                    Ok(a) => Some(a),
                    Err(e) => {
                        tracing::debug!(error = %e, "forwarding failed: SERVFAIL");
                        answer::servfail(request, &self.opts)
                    }
                }
            }
            Outcome::Chase(chase) => {
                let mut upstream = None;
                if let Some(up) = &self.upstream {
                    if let Ok(q) = answer::chase_query(&chase).to_vec() {
                        let mut r = up.exchange(&q, false).await;
                        // truncated over UDP: again over TCP
                        if matches!(&r, Ok(a) if a.len() > 2 && a[2] & 0x02 != 0) {
                            r = up.exchange(&q, true).await;
                        }
                        match r.map(|a| Message::from_vec(&a)) {
                            Ok(Ok(m)) => upstream = Some(m),
                            Ok(Err(e)) => tracing::debug!(error = %e, target = %chase.target, "upstream answer unreadable"),
                            Err(e) => tracing::debug!(error = %e, target = %chase.target, "chasing a CNAME failed"),
                        }
                    }
                }
                Some(answer::finish_chase(chase, upstream))
            }
        }
    }

    /// Answers one query, with the upstream when needed.
    pub async fn handle(&self, request: &[u8], transport: Transport) -> Option<Vec<u8>> {
        let o = self.local(request, transport);
        self.complete(request, transport, o).await
    }
}
