//! The upstream resolver: names outside the cluster domain are sent there as they came (a
//! fresh message ID on the wire, the client's restored in the answer), over the transport
//! the client used. The narrow [`Upstream`] trait has the real [`Forwarder`] and, for tests,
//! [`FakeUpstream`], which records what it was asked.

use std::net::{IpAddr, SocketAddr};
use std::sync::Mutex;
use std::time::Duration;

use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};

use crate::error::ForwardError;

/// Sends a query to the upstream resolver and returns its answer, with the query's ID.
#[async_trait::async_trait]
pub trait Upstream: Send + Sync + 'static {
    async fn exchange(&self, query: &[u8], tcp: bool) -> Result<Vec<u8>, ForwardError>;
}

/// The nameservers of a resolv.conf (`nameserver` lines), in order.
pub fn resolv_conf_servers(text: &str) -> Vec<IpAddr> {
    text.lines()
        .filter_map(|l| {
            let mut w = l.split_whitespace();
            (w.next() == Some("nameserver")).then(|| w.next()).flatten()
        })
        // an IPv6 link-local with a zone (fe80::1%eth0) is not supported: skipped
        .filter_map(|a| a.parse().ok())
        .collect()
}

/// Parses `ip`, `ip:port` or `[v6]:port` (port 53 when absent).
pub fn parse_upstream(s: &str) -> Result<SocketAddr, String> {
    if let Ok(sa) = s.parse::<SocketAddr>() {
        return Ok(sa);
    }
    s.trim_start_matches('[')
        .trim_end_matches(']')
        .parse::<IpAddr>()
        .map(|ip| SocketAddr::new(ip, 53))
        .map_err(|_| format!("{s:?} is not an address (ip, ip:port or [ipv6]:port)"))
}

/// The upstream servers, tried in order until one answers.
#[derive(Debug, Clone)]
pub struct Forwarder {
    pub servers: Vec<SocketAddr>,
    /// How long one server may take.
    pub timeout: Duration,
}

impl Forwarder {
    async fn udp(&self, server: SocketAddr, query: &[u8]) -> Result<Vec<u8>, ForwardError> {
        let io = |e: std::io::Error| ForwardError::Io { server, source: e };
        let bind: SocketAddr = if server.is_ipv4() { ([0, 0, 0, 0], 0).into() } else { (std::net::Ipv6Addr::UNSPECIFIED, 0).into() };
        let sock = tokio::net::UdpSocket::bind(bind).await.map_err(io)?;
        sock.connect(server).await.map_err(io)?;
        let (wire, id) = with_new_id(query);
        sock.send(&wire).await.map_err(io)?;
        let mut buf = vec![0u8; 65535];
        let deadline = tokio::time::Instant::now() + self.timeout;
        loop {
            let n = tokio::time::timeout_at(deadline, sock.recv(&mut buf))
                .await
                .map_err(|_| ForwardError::Timeout { server })?
                .map_err(io)?;
            // a stray datagram (an old answer) is skipped
            if n >= 12 && buf[0..2] == id.to_be_bytes() && buf[2] & 0x80 != 0 {
                return Ok(restore_id(&buf[..n], query));
            }
        }
    }

    async fn tcp(&self, server: SocketAddr, query: &[u8]) -> Result<Vec<u8>, ForwardError> {
        let io = |e: std::io::Error| ForwardError::Io { server, source: e };
        let work = async {
            let mut s = tokio::net::TcpStream::connect(server).await.map_err(io)?;
            let (wire, id) = with_new_id(query);
            let len = u16::try_from(wire.len()).map_err(|_| ForwardError::TooLong)?;
            let mut out = Vec::with_capacity(wire.len() + 2);
            out.extend(len.to_be_bytes());
            out.extend(&wire);
            s.write_all(&out).await.map_err(io)?;
            let n = s.read_u16().await.map_err(io)?;
            let mut buf = vec![0u8; usize::from(n)];
            s.read_exact(&mut buf).await.map_err(io)?;
            if buf.len() < 12 || buf[0..2] != id.to_be_bytes() {
                return Err(ForwardError::Mismatch { server });
            }
            Ok(restore_id(&buf, query))
        };
        tokio::time::timeout(self.timeout, work).await.map_err(|_| ForwardError::Timeout { server })?
    }
}

/// The query with a random ID, and that ID.
fn with_new_id(query: &[u8]) -> (Vec<u8>, u16) {
    let id: u16 = rand::random();
    let mut wire = query.to_vec();
    if wire.len() >= 2 {
        wire[0..2].copy_from_slice(&id.to_be_bytes());
    }
    (wire, id)
}

/// The answer with the client's query ID.
fn restore_id(answer: &[u8], query: &[u8]) -> Vec<u8> {
    let mut a = answer.to_vec();
    if a.len() >= 2 && query.len() >= 2 {
        a[0..2].copy_from_slice(&query[0..2]);
    }
    a
}

#[async_trait::async_trait]
impl Upstream for Forwarder {
    async fn exchange(&self, query: &[u8], tcp: bool) -> Result<Vec<u8>, ForwardError> {
        let mut last = ForwardError::NoServers;
        for s in &self.servers {
            let r = if tcp { self.tcp(*s, query).await } else { self.udp(*s, query).await };
            match r {
                Ok(a) => return Ok(a),
                Err(e) => {
                    tracing::debug!(server = %s, error = %e, "upstream failed; trying the next");
                    last = e;
                }
            }
        }
        Err(last)
    }
}

/// How a [`FakeUpstream`] answers a query (None: it fails).
pub type FakeAnswer = Box<dyn Fn(&[u8]) -> Option<Vec<u8>> + Send + Sync>;

/// A fake upstream for tests: answers with `answer(query)` and records the queries.
pub struct FakeUpstream {
    pub answer: FakeAnswer,
    pub asked: Mutex<Vec<(Vec<u8>, bool)>>,
}

#[async_trait::async_trait]
impl Upstream for FakeUpstream {
    async fn exchange(&self, query: &[u8], tcp: bool) -> Result<Vec<u8>, ForwardError> {
        self.asked.lock().unwrap_or_else(|p| p.into_inner()).push((query.to_vec(), tcp));
        (self.answer)(query).ok_or(ForwardError::NoServers)
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn resolv_conf_nameservers_in_order() {
        let t = "# comment\nsearch example.com\nnameserver 10.0.0.2\nnameserver  fd00::53\nnameserver fe80::1%eth0\noptions ndots:2\nnameserver\n";
        assert_eq!(resolv_conf_servers(t), ["10.0.0.2".parse::<IpAddr>().unwrap(), "fd00::53".parse().unwrap()]);
    }

    #[test]
    fn upstream_addresses() {
        assert_eq!(parse_upstream("10.0.0.2").unwrap(), "10.0.0.2:53".parse().unwrap());
        assert_eq!(parse_upstream("127.0.0.1:5353").unwrap(), "127.0.0.1:5353".parse().unwrap());
        assert_eq!(parse_upstream("[fd00::53]:54").unwrap(), "[fd00::53]:54".parse().unwrap());
        assert_eq!(parse_upstream("fd00::53").unwrap(), "[fd00::53]:53".parse().unwrap());
        assert!(parse_upstream("dns.example").is_err());
    }

    #[test]
    fn ids_are_replaced_on_the_wire_and_restored() {
        let q = [0xab, 0xcd, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0];
        let (w, id) = with_new_id(&q);
        assert_eq!(w[0..2], id.to_be_bytes());
        assert_eq!(w[2..], q[2..]);
        let a = restore_id(&w, &q);
        assert_eq!(a, q);
    }
}
