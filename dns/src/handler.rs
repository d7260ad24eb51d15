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

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use crate::forward::FakeUpstream;
    use crate::model::{service_records, Zone};
    use hickory_proto::op::{Message, Query, ResponseCode};
    use hickory_proto::rr::{Name, RData, Record, RecordType};
    use std::sync::Mutex;

    fn handler(upstream: Option<Arc<FakeUpstream>>) -> Handler {
        let zone = Zone::new("cluster.local", 5, vec![]).unwrap();
        let svc = serde_json::from_value(serde_json::json!({"metadata": {"name": "ext", "namespace": "ns1"},
            "spec": {"type": "ExternalName", "externalName": "www.example.test"}}))
        .unwrap();
        let idx = Index::build(&zone, 1, [&service_records(&zone, &svc, &[]).unwrap()]);
        Handler {
            index: Arc::new(Published::new(idx)),
            opts: answer::Options { forward: upstream.is_some() },
            upstream: upstream.map(|u| u as Arc<dyn Upstream>),
        }
    }

    /// Answers every query with 192.0.2.7 for its name, except names starting with "down".
    fn fake() -> Arc<FakeUpstream> {
        Arc::new(FakeUpstream {
            answer: Box::new(|q: &[u8]| {
                let m = Message::from_vec(q).ok()?;
                let name = m.queries()[0].name().clone();
                if name.to_ascii().starts_with("down") {
                    return None;
                }
                let mut r = answer::new_response(m.id(), m.op_code());
                r.add_query(m.queries()[0].clone());
                r.add_answer(Record::from_rdata(name, 60, RData::A("192.0.2.7".parse::<std::net::Ipv4Addr>().unwrap().into())));
                r.to_vec().ok()
            }),
            asked: Mutex::new(Vec::new()),
        })
    }

    fn query(name: &str) -> Vec<u8> {
        let mut m = Message::new();
        m.set_id(77).set_recursion_desired(true);
        m.add_query(Query::query(Name::from_ascii(name).unwrap(), RecordType::A));
        m.to_vec().unwrap()
    }

    #[tokio::test]
    async fn forwards_chases_and_answers_servfail_when_the_upstream_fails() {
        let up = fake();
        let h = handler(Some(up.clone()));
        let r = Message::from_vec(&h.handle(&query("www.outside.test."), Transport::Udp).await.unwrap()).unwrap();
        assert_eq!(r.answers()[0].data().to_string(), "192.0.2.7");
        // the query went as received, over the client's transport
        assert_eq!(up.asked.lock().unwrap()[0], (query("www.outside.test."), false));
        h.handle(&query("www.outside.test."), Transport::Tcp).await.unwrap();
        assert!(up.asked.lock().unwrap()[1].1, "TCP stays TCP");
        let r = Message::from_vec(&h.handle(&query("ext.ns1.svc.cluster.local."), Transport::Udp).await.unwrap()).unwrap();
        let answers: Vec<String> = r.answers().iter().map(|a| a.data().to_string()).collect();
        assert_eq!(answers, ["www.example.test.", "192.0.2.7"]);
        let r = Message::from_vec(&h.handle(&query("down.outside.test."), Transport::Udp).await.unwrap()).unwrap();
        assert_eq!(r.response_code(), ResponseCode::ServFail);
        assert_eq!(r.id(), 77);
        assert_eq!(up.asked.lock().unwrap().len(), 4);
    }

    #[tokio::test]
    async fn without_an_upstream_outside_names_are_refused_and_cnames_stand_alone() {
        let h = handler(None);
        let r = Message::from_vec(&h.handle(&query("www.outside.test."), Transport::Udp).await.unwrap()).unwrap();
        assert_eq!(r.response_code(), ResponseCode::Refused);
        let r = Message::from_vec(&h.handle(&query("ext.ns1.svc.cluster.local."), Transport::Udp).await.unwrap()).unwrap();
        assert_eq!(r.answers().len(), 1);
    }
}
