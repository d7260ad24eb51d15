//! The serving path over real sockets on loopback (unprivileged): UDP and TCP answers from an
//! index, forwarding to an upstream (a small server of this test on 127.0.0.1), truncation
//! over UDP and the same name whole over TCP, an ExternalName chased through the upstream,
//! FORMERR over TCP closing the connection, and the dummy interface (privileged, in a
//! namespace of the test).
#![allow(clippy::unwrap_used)]

use std::io::{Read as _, Write as _};
use std::net::{SocketAddr, TcpStream, UdpSocket};
use std::sync::atomic::AtomicBool;
use std::sync::Arc;
use std::time::Duration;

use hickory_proto::op::{Message, Query, ResponseCode};
use hickory_proto::rr::{Name, RData, Record, RecordType};
use k8s_openapi::api::core::v1::Service;
use k8s_openapi::api::discovery::v1::EndpointSlice;
use serde_json::json;

use ferro_dns::answer::Options;
use ferro_dns::forward::{Forwarder, Upstream};
use ferro_dns::handler::{Handler, Published};
use ferro_dns::model::{service_records, Index, Zone, LABEL_SERVICE_NAME};

/// An upstream on 127.0.0.1 answering every A query with 192.0.2.7 (and NXDOMAIN for names
/// starting with "nx"), with the count of queries it saw.
async fn upstream() -> (SocketAddr, Arc<std::sync::atomic::AtomicUsize>) {
    let sock = tokio::net::UdpSocket::bind("127.0.0.1:0").await.unwrap();
    let addr = sock.local_addr().unwrap();
    let seen = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let s2 = seen.clone();
    tokio::spawn(async move {
        let mut buf = vec![0u8; 4096];
        loop {
            let (n, peer) = sock.recv_from(&mut buf).await.unwrap();
            s2.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            let q = Message::from_vec(&buf[..n]).unwrap();
            let mut r = ferro_dns::answer::new_response(q.id(), q.op_code());
            r.set_recursion_available(true);
            let qq = q.queries()[0].clone();
            if qq.name().to_ascii().starts_with("nx") {
                r.set_response_code(ResponseCode::NXDomain);
            } else {
                r.add_answer(Record::from_rdata(qq.name().clone(), 60, RData::A("192.0.2.7".parse::<std::net::Ipv4Addr>().unwrap().into())));
            }
            r.add_query(qq);
            sock.send_to(&r.to_vec().unwrap(), peer).await.unwrap();
        }
    });
    (addr, seen)
}

fn index() -> Index {
    let zone = Zone::new("cluster.local", 5, vec![]).unwrap();
    let web: Service = serde_json::from_value(json!({"metadata": {"name": "web", "namespace": "ns1"}, "spec": {"clusterIP": "10.96.0.5"}})).unwrap();
    let ext: Service = serde_json::from_value(json!({"metadata": {"name": "ext", "namespace": "ns1"},
        "spec": {"type": "ExternalName", "externalName": "www.example.test"}}))
    .unwrap();
    let big: Service = serde_json::from_value(json!({"metadata": {"name": "big", "namespace": "ns1"}, "spec": {"clusterIP": "None"}})).unwrap();
    let eps: Vec<serde_json::Value> = (0..100).map(|i| json!({"addresses": [format!("10.89.0.{i}")]})).collect();
    let slice: EndpointSlice = serde_json::from_value(json!({"metadata": {"name": "big-1", "namespace": "ns1", "labels": {LABEL_SERVICE_NAME: "big"}},
        "addressType": "IPv4", "endpoints": eps}))
    .unwrap();
    let recs = [
        service_records(&zone, &web, &[]).unwrap(),
        service_records(&zone, &ext, &[]).unwrap(),
        service_records(&zone, &big, &[Arc::new(slice)]).unwrap(),
    ];
    Index::build(&zone, 1, recs.iter())
}

struct Server {
    udp: SocketAddr,
    tcp: SocketAddr,
    stop: Arc<AtomicBool>,
}

impl Drop for Server {
    fn drop(&mut self) {
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
    }
}

async fn start(up: SocketAddr) -> Server {
    let upstream: Arc<dyn Upstream> = Arc::new(Forwarder { servers: vec![up], timeout: Duration::from_secs(2) });
    let handler = Arc::new(Handler { index: Arc::new(Published::new(index())), opts: Options { forward: true }, upstream: Some(upstream) });
    let sock = UdpSocket::bind("127.0.0.1:0").unwrap();
    let udp = sock.local_addr().unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    ferro_dns::server::spawn_udp(sock, 2, handler.clone(), tokio::runtime::Handle::current(), stop.clone()).unwrap();
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let tcp = l.local_addr().unwrap();
    tokio::spawn(ferro_dns::server::serve_tcp(l, handler));
    Server { udp, tcp, stop }
}

fn query(name: &str, t: RecordType) -> Vec<u8> {
    let mut m = Message::new();
    m.set_id(rand::random());
    m.set_recursion_desired(true);
    m.add_query(Query::query(Name::from_ascii(name).unwrap(), t));
    m.to_vec().unwrap()
}

/// One UDP exchange on a blocking socket (off the runtime's threads).
async fn udp_ask(server: SocketAddr, q: Vec<u8>) -> Message {
    tokio::task::spawn_blocking(move || {
        let c = UdpSocket::bind("127.0.0.1:0").unwrap();
        c.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        c.send_to(&q, server).unwrap();
        let mut buf = vec![0u8; 65535];
        let (n, _) = c.recv_from(&mut buf).unwrap();
        let m = Message::from_vec(&buf[..n]).unwrap();
        assert_eq!(m.id().to_be_bytes(), q[0..2], "the client's ID comes back");
        m
    })
    .await
    .unwrap()
}

fn tcp_send(s: &mut TcpStream, q: &[u8]) -> Message {
    let mut out = (q.len() as u16).to_be_bytes().to_vec();
    out.extend(q);
    s.write_all(&out).unwrap();
    let mut len = [0u8; 2];
    s.read_exact(&mut len).unwrap();
    let mut buf = vec![0u8; usize::from(u16::from_be_bytes(len))];
    s.read_exact(&mut buf).unwrap();
    Message::from_vec(&buf).unwrap()
}

fn addrs(m: &Message) -> Vec<String> {
    m.answers().iter().map(|r| r.data().to_string()).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn udp_and_tcp_answers_forwarding_and_truncation() {
    let (up, seen) = upstream().await;
    let s = start(up).await;
    // local
    let m = udp_ask(s.udp, query("web.ns1.svc.cluster.local.", RecordType::A)).await;
    assert_eq!(addrs(&m), ["10.96.0.5"]);
    assert!(m.authoritative());
    assert_eq!(seen.load(std::sync::atomic::Ordering::SeqCst), 0);
    // forwarded, and the upstream's NXDOMAIN relayed
    let m = udp_ask(s.udp, query("www.outside.test.", RecordType::A)).await;
    assert_eq!(addrs(&m), ["192.0.2.7"]);
    assert!(!m.authoritative());
    let m = udp_ask(s.udp, query("nx.outside.test.", RecordType::A)).await;
    assert_eq!(m.response_code(), ResponseCode::NXDomain);
    // an ExternalName: the CNAME and the upstream's address for its target
    let m = udp_ask(s.udp, query("ext.ns1.svc.cluster.local.", RecordType::A)).await;
    assert_eq!(addrs(&m), ["www.example.test.", "192.0.2.7"]);
    // 100 addresses do not fit 512 bytes: TC over UDP, whole over TCP
    let m = udp_ask(s.udp, query("big.ns1.svc.cluster.local.", RecordType::A)).await;
    assert!(m.truncated() && m.answers().is_empty());
    let tcp = s.tcp;
    tokio::task::spawn_blocking(move || {
        let mut c = TcpStream::connect(tcp).unwrap();
        c.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        let m = tcp_send(&mut c, &query("big.ns1.svc.cluster.local.", RecordType::A));
        assert_eq!(m.answers().len(), 100);
        // a second query on the same connection, forwarded over TCP... the test upstream
        // serves UDP only: SERVFAIL, the connection stays
        let m = tcp_send(&mut c, &query("web.ns1.svc.cluster.local.", RecordType::A));
        assert_eq!(addrs(&m), ["10.96.0.5"]);
        // a malformed name (a 64-byte label): FORMERR, then the server closes
        let mut bad = vec![0x12, 0x34, 0x01, 0x00, 0, 1, 0, 0, 0, 0, 0, 0, 0x40];
        bad.extend([b'a'; 64]);
        bad.extend([0, 0, 1, 0, 1]);
        let m = tcp_send(&mut c, &bad);
        assert_eq!(m.response_code(), ResponseCode::FormErr);
        assert_eq!(m.id(), 0x1234);
        let mut rest = Vec::new();
        assert_eq!(c.read_to_end(&mut rest).unwrap(), 0, "closed after FORMERR");
    })
    .await
    .unwrap();
}

#[test]
#[ignore = "privileged: needs root for a network namespace; run by scripts/test.sh"]
fn the_listen_interface_is_made_once_and_kept() {
    ferro_lab::require_root().unwrap();
    let ns = ferro_lab::netns::NetNs::new(&ferro_lab::netns::NetNs::unique_name("fdns-if")).unwrap();
    let r = ns
        .spawn_in(|| {
            let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
            rt.block_on(async {
                let nl = ferro_dns::iface::Netlink::new().unwrap();
                let addrs = ["169.254.20.10".parse().unwrap(), "fd00:20::10".parse().unwrap()];
                ferro_dns::iface::prepare(&nl, Some("ferro-dns0"), &addrs).await.unwrap();
                // again: nothing to do, no error
                ferro_dns::iface::prepare(&nl, Some("ferro-dns0"), &addrs).await.unwrap();
            });
            // the address can be bound now
            UdpSocket::bind("169.254.20.10:53").map(|_| ())
        })
        .join()
        .unwrap()
        .unwrap();
    r.unwrap();
    let out = ns.ip(&["-o", "addr", "show", "dev", "ferro-dns0"]).unwrap();
    assert!(out.contains("169.254.20.10/32"), "{out}");
    assert!(out.contains("fd00:20::10/128"), "{out}");
    let link = ns.ip(&["-o", "link", "show", "dev", "ferro-dns0"]).unwrap();
    assert!(link.contains(",UP"), "{link}");
}
