//! The sockets, kept thin: UDP on blocking threads (a datagram in, the local answer out, no
//! task or allocation beyond the answer's; forwarded queries move to the tokio runtime; each
//! thread remembers its answers per index, see [`AnswerCache`]), TCP
//! on tokio (RFC 7766: two-byte length prefix, several queries per connection, an idle
//! timeout, the connection closed after a FORMERR since the stream may be out of step).

use std::collections::HashMap;
use std::net::{SocketAddr, UdpSocket};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::TcpListener;

use crate::answer::{self, Outcome, Transport};
use crate::handler::Handler;
use crate::model::Index;

/// Answers a UDP thread gave from one index, by the query's bytes after its ID: the answer is a
/// pure function of those bytes and the index, so a repeated query (the common case: clients
/// ask the same few names again and again) skips decoding and encoding and only gets its ID
/// patched in. Emptied when a new index is published, and when full.
#[derive(Default)]
pub struct AnswerCache {
    index: Option<Arc<Index>>,
    map: HashMap<Box<[u8]>, Box<[u8]>>,
}

/// Entries one thread keeps at most (queries are at most a few hundred bytes).
const CACHE_ENTRIES: usize = 16384;

impl AnswerCache {
    /// The answer to `request` from `index`, from the cache when it was seen before.
    pub fn answer(&mut self, index: &Arc<Index>, request: &[u8], opts: &answer::Options) -> Outcome {
        if !self.index.as_ref().is_some_and(|i| Arc::ptr_eq(i, index)) {
            self.map.clear();
            self.index = Some(index.clone());
        }
        if request.len() >= 12 {
            if let Some(r) = self.map.get(&request[2..]) {
                let mut out = r.to_vec();
                out[0..2].copy_from_slice(&request[0..2]);
                return Outcome::Reply(out);
            }
        }
        let o = answer::answer(index, request, Transport::Udp, opts);
        if let Outcome::Reply(b) = &o {
            if request.len() >= 12 && b.len() >= 2 {
                if self.map.len() >= CACHE_ENTRIES {
                    self.map.clear();
                }
                self.map.insert(request[2..].into(), b.as_slice().into());
            }
        }
        o
    }
}

/// How long a TCP connection may sit idle between queries.
pub const TCP_IDLE: Duration = Duration::from_secs(10);
/// TCP connections served at once (more wait in the accept queue).
pub const MAX_TCP_CONNECTIONS: usize = 256;

/// Serves UDP on `threads` threads until `stop` is set (checked at least every 200 ms).
pub fn spawn_udp(
    sock: UdpSocket,
    threads: usize,
    handler: Arc<Handler>,
    rt: tokio::runtime::Handle,
    stop: Arc<AtomicBool>,
) -> std::io::Result<Vec<std::thread::JoinHandle<()>>> {
    sock.set_read_timeout(Some(Duration::from_millis(200)))?;
    let sock = Arc::new(sock);
    let mut out = Vec::new();
    for i in 0..threads.max(1) {
        let (sock, handler, rt, stop) = (sock.clone(), handler.clone(), rt.clone(), stop.clone());
        out.push(std::thread::Builder::new().name(format!("dns-udp-{i}")).spawn(move || udp_loop(&sock, &handler, &rt, &stop))?);
    }
    Ok(out)
}

fn udp_loop(sock: &Arc<UdpSocket>, handler: &Arc<Handler>, rt: &tokio::runtime::Handle, stop: &AtomicBool) {
    // EDNS clients may send up to their buffer size; 64 KiB holds any datagram
    let mut buf = vec![0u8; 65535];
    let mut cache = AnswerCache::default();
    while !stop.load(Ordering::Relaxed) {
        let (n, peer) = match sock.recv_from(&mut buf) {
            Ok(x) => x,
            Err(e) if matches!(e.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut | std::io::ErrorKind::Interrupted) => continue,
            Err(e) => {
                tracing::warn!(error = %e, "udp receive failed");
                continue;
            }
        };
        let request = &buf[..n];
        match cache.answer(&handler.index.load(), request, &handler.opts) {
            Outcome::Reply(b) => send(sock, &b, peer),
            Outcome::Drop => {}
            other => {
                let (sock, handler, request) = (sock.clone(), handler.clone(), request.to_vec());
                rt.spawn(async move {
                    if let Some(b) = handler.complete(&request, Transport::Udp, other).await {
                        send(&sock, &b, peer);
                    }
                });
            }
        }
    }
}

fn send(sock: &UdpSocket, b: &[u8], peer: SocketAddr) {
    if let Err(e) = sock.send_to(b, peer) {
        tracing::debug!(error = %e, %peer, "udp send failed");
    }
}

/// Serves TCP connections until the task is dropped.
pub async fn serve_tcp(listener: TcpListener, handler: Arc<Handler>) {
    let slots = Arc::new(tokio::sync::Semaphore::new(MAX_TCP_CONNECTIONS));
    loop {
        let Ok(permit) = slots.clone().acquire_owned().await else { return };
        let (stream, peer) = match listener.accept().await {
            Ok(x) => x,
            Err(e) => {
                tracing::warn!(error = %e, "tcp accept failed");
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        let handler = handler.clone();
        tokio::spawn(async move {
            if let Err(e) = tcp_conn(stream, &handler).await {
                tracing::debug!(error = %e, %peer, "tcp connection ended");
            }
            drop(permit);
        });
    }
}

async fn tcp_conn(mut s: tokio::net::TcpStream, handler: &Handler) -> std::io::Result<()> {
    loop {
        let len = match tokio::time::timeout(TCP_IDLE, s.read_u16()).await {
            Ok(Ok(n)) => usize::from(n),
            // idle, or the client closed
            Ok(Err(_)) | Err(_) => return Ok(()),
        };
        let mut buf = vec![0u8; len];
        tokio::time::timeout(TCP_IDLE, s.read_exact(&mut buf))
            .await
            .map_err(|_| std::io::Error::new(std::io::ErrorKind::TimedOut, "query incomplete"))??;
        let Some(resp) = handler.handle(&buf, Transport::Tcp).await else { return Ok(()) };
        let Ok(n) = u16::try_from(resp.len()) else { return Ok(()) };
        let mut out = Vec::with_capacity(resp.len() + 2);
        out.extend(n.to_be_bytes());
        out.extend(&resp);
        s.write_all(&out).await?;
        // FORMERR: the stream may be out of step; close it (RFC 7766 section 6.2.4 allows it)
        if resp.len() >= 4 && resp[3] & 0x0f == 1 {
            s.shutdown().await?;
            return Ok(());
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use crate::model::{service_records, Zone};
    use hickory_proto::op::{Message, Query};
    use hickory_proto::rr::{Name, RecordType};

    fn index(ip: &str) -> Arc<Index> {
        let zone = Zone::new("cluster.local", 5, vec![]).unwrap();
        let svc = serde_json::from_value(serde_json::json!({"metadata": {"name": "web", "namespace": "ns1"}, "spec": {"clusterIP": ip}})).unwrap();
        Arc::new(Index::build(&zone, 1, [&service_records(&zone, &svc, &[]).unwrap()]))
    }

    fn query(id: u16, name: &str) -> Vec<u8> {
        let mut m = Message::new();
        m.set_id(id).set_recursion_desired(true);
        m.add_query(Query::query(Name::from_ascii(name).unwrap(), RecordType::A));
        m.to_vec().unwrap()
    }

    fn bytes(o: Outcome) -> Vec<u8> {
        match o {
            Outcome::Reply(b) => b,
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn cached_answers_equal_fresh_ones_with_the_querys_id_and_follow_a_new_index() {
        let opts = answer::Options { forward: false };
        let mut c = AnswerCache::default();
        let a = index("10.96.0.5");
        let first = bytes(c.answer(&a, &query(1, "web.ns1.svc.cluster.local."), &opts));
        assert_eq!(c.map.len(), 1);
        let again = bytes(c.answer(&a, &query(2, "web.ns1.svc.cluster.local."), &opts));
        assert_eq!(again, bytes(answer::answer(&a, &query(2, "web.ns1.svc.cluster.local."), Transport::Udp, &opts)));
        assert_eq!(again[2..], first[2..]);
        assert_eq!(again[0..2], 2u16.to_be_bytes());
        // another case of the name is another entry, answered with its own case
        let upper = bytes(c.answer(&a, &query(3, "WEB.ns1.svc.cluster.local."), &opts));
        assert_eq!(Message::from_vec(&upper).unwrap().queries()[0].name().to_ascii(), "WEB.ns1.svc.cluster.local.");
        assert_eq!(c.map.len(), 2);
        // a new index: forgotten, answered from the new one
        let b = index("10.96.0.6");
        let fresh = Message::from_vec(&bytes(c.answer(&b, &query(4, "web.ns1.svc.cluster.local."), &opts))).unwrap();
        assert_eq!(fresh.answers()[0].data().to_string(), "10.96.0.6");
        assert_eq!(c.map.len(), 1);
    }
}
