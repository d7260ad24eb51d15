//! The pure answer function: a query's bytes and the [`Index`] -> what to send back, or that
//! the query must go to the upstream resolver. No I/O here; [`crate::handler`] does the
//! forwarding the outcome asks for.
//!
//! Rules (RFC 1035, 2308, 6891 and the Kubernetes DNS specification):
//! - fewer than 12 bytes, or a message with QR set: dropped (nothing to answer to);
//! - a header that parses with a body that does not (bad labels, pointers, counts): FORMERR;
//! - an opcode other than QUERY: NOTIMP; not exactly one question: FORMERR; EDNS version
//!   above 0: BADVERS;
//! - names in the cluster domain (and the reverse names of Service and endpoint addresses)
//!   are answered here, authoritatively: records, CNAME for ExternalName Services (followed
//!   inside the zone, chased through the upstream outside it), NODATA for a name that exists
//!   without records of the type, NXDOMAIN for one that does not; both negative answers carry
//!   the zone's SOA in the authority section, whose TTL is the negative TTL;
//! - zone transfers are refused; other names are forwarded, or REFUSED when forwarding is off;
//! - over UDP a response larger than 512 bytes, or than the client's EDNS payload size (at most
//!   [`MAX_UDP_PAYLOAD`]), is sent truncated (TC set, no records) so the client asks over TCP.

use hickory_proto::op::{Edns, Header, Message, MessageType, OpCode, Query, ResponseCode};
use hickory_proto::rr::rdata::CNAME;
use hickory_proto::rr::{DNSClass, Name, RData, Record, RecordType};
use hickory_proto::serialize::binary::{BinDecodable as _, BinDecoder};

use crate::model::Index;

/// The largest UDP response sent, and the payload size advertised in our OPT record.
pub const MAX_UDP_PAYLOAD: u16 = 4096;
/// The UDP limit without EDNS (RFC 1035).
pub const MIN_UDP_PAYLOAD: usize = 512;
/// CNAMEs followed inside the zone before giving up (a loop of ExternalName Services).
const MAX_CNAME_CHAIN: usize = 8;

/// How the query came in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Transport {
    Udp,
    Tcp,
}

/// Server behaviour the answers depend on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Options {
    /// Names outside the zone go to the upstream resolver (else REFUSED). Also sets RA.
    pub forward: bool,
}

/// What to do with a query.
#[derive(Debug)]
pub enum Outcome {
    /// Send these bytes.
    Reply(Vec<u8>),
    /// Send the query to the upstream resolver and relay its answer.
    Forward,
    /// The answer so far ends in a CNAME to a name outside the zone: ask the upstream for the
    /// target and finish with [`finish_chase`].
    Chase(Box<Chase>),
    /// Send nothing.
    Drop,
}

/// A CNAME answer waiting for the records of its target.
#[derive(Debug)]
pub struct Chase {
    pub response: Message,
    pub target: Name,
    pub qtype: RecordType,
    pub limit: usize,
}

/// An empty response with `id` and `op`.
pub fn new_response(id: u16, op: OpCode) -> Message {
    let mut m = Message::new();
    m.set_id(id).set_message_type(MessageType::Response).set_op_code(op);
    m
}

fn response_to(req: &Header, rcode: ResponseCode, forward: bool) -> Message {
    let mut m = new_response(req.id(), req.op_code());
    m.set_recursion_desired(req.recursion_desired())
        .set_recursion_available(forward)
        .set_checking_disabled(req.checking_disabled())
        .set_response_code(rcode);
    m
}

fn our_edns() -> Edns {
    let mut e = Edns::new();
    e.set_max_payload(MAX_UDP_PAYLOAD);
    e.set_version(0);
    e
}

/// The message as bytes, truncated (TC, question and OPT only) when longer than `limit`.
pub fn encode(resp: &Message, limit: usize) -> Vec<u8> {
    match resp.to_vec() {
        Ok(b) if b.len() <= limit => b,
        Ok(_) => {
            let mut t = Message::new();
            t.set_header(*resp.header());
            t.set_truncated(true);
            t.add_queries(resp.queries().iter().cloned());
            if let Some(e) = resp.extensions().clone() {
                t.set_edns(e);
            }
            t.to_vec().unwrap_or_default()
        }
        Err(e) => {
            tracing::warn!(error = %e, "encoding a response failed; answering SERVFAIL");
            let mut f = new_response(resp.id(), resp.op_code());
            f.set_response_code(ResponseCode::ServFail);
            f.add_queries(resp.queries().iter().cloned());
            f.to_vec().unwrap_or_default()
        }
    }
}

/// A SERVFAIL for `request` (the upstream failed), if it can be answered at all.
pub fn servfail(request: &[u8], opts: &Options) -> Option<Vec<u8>> {
    let msg = Message::from_vec(request).ok()?;
    let mut r = response_to(msg.header(), ResponseCode::ServFail, opts.forward);
    r.add_queries(msg.queries().iter().cloned());
    if msg.extensions().is_some() {
        r.set_edns(our_edns());
    }
    Some(encode(&r, MIN_UDP_PAYLOAD))
}

/// Answers `request` from `index`.
pub fn answer(index: &Index, request: &[u8], transport: Transport, opts: &Options) -> Outcome {
    if request.len() < 12 {
        return Outcome::Drop;
    }
    let Ok(header) = Header::read(&mut BinDecoder::new(request)) else { return Outcome::Drop };
    if header.message_type() == MessageType::Response {
        return Outcome::Drop;
    }
    let msg = match Message::from_vec(request) {
        Ok(m) => m,
        Err(e) => {
            tracing::debug!(error = %e, id = header.id(), "malformed query: FORMERR");
            return Outcome::Reply(encode(&response_to(&header, ResponseCode::FormErr, opts.forward), MIN_UDP_PAYLOAD));
        }
    };
    let mut resp = response_to(msg.header(), ResponseCode::NoError, opts.forward);
    if let Some(q) = msg.queries().first() {
        resp.add_query(q.clone());
    }
    if let Some(e) = &msg.extensions() {
        resp.set_edns(our_edns());
        if e.version() > 0 {
            resp.set_response_code(ResponseCode::BADVERS);
            return Outcome::Reply(encode(&resp, MIN_UDP_PAYLOAD));
        }
    }
    if msg.op_code() != OpCode::Query {
        resp.set_response_code(ResponseCode::NotImp);
        return Outcome::Reply(encode(&resp, MIN_UDP_PAYLOAD));
    }
    if msg.queries().len() != 1 || !msg.answers().is_empty() || !msg.name_servers().is_empty() {
        resp.set_response_code(ResponseCode::FormErr);
        return Outcome::Reply(encode(&resp, MIN_UDP_PAYLOAD));
    }
    let limit = match transport {
        Transport::Tcp => usize::from(u16::MAX),
        Transport::Udp => msg
            .extensions()
            .as_ref()
            .map(|e| usize::from(e.max_payload()).clamp(MIN_UDP_PAYLOAD, usize::from(MAX_UDP_PAYLOAD)))
            .unwrap_or(MIN_UDP_PAYLOAD),
    };
    let q: &Query = &msg.queries()[0];
    let qname = q.name();
    let ours = index.in_zone(qname) || index.records(qname).is_some();
    if !ours {
        if opts.forward {
            return Outcome::Forward;
        }
        resp.set_response_code(ResponseCode::Refused);
        return Outcome::Reply(encode(&resp, limit));
    }
    if !matches!(q.query_class(), DNSClass::IN | DNSClass::ANY) || matches!(q.query_type(), RecordType::AXFR | RecordType::IXFR) {
        resp.set_response_code(ResponseCode::Refused);
        return Outcome::Reply(encode(&resp, limit));
    }
    resp.set_authoritative(true);
    match lookup(index, qname, q.query_type(), &mut resp) {
        None => Outcome::Reply(encode(&resp, limit)),
        Some(target) if opts.forward => Outcome::Chase(Box::new(Chase { response: resp, target, qtype: q.query_type(), limit })),
        // No upstream: the CNAME alone.
        Some(_) => Outcome::Reply(encode(&resp, limit)),
    }
}

/// Fills `resp` for `qname`/`qtype` from the index; returns the target of a CNAME that leaves
/// the zone (to be chased upstream).
fn lookup(index: &Index, qname: &Name, qtype: RecordType, resp: &mut Message) -> Option<Name> {
    let ttl = index.zone.ttl;
    let mut name = qname.clone();
    for _ in 0..MAX_CNAME_CHAIN {
        let Some(records) = index.records(&name) else {
            if !index.exists(&name) {
                // NXDOMAIN also after a CNAME into the zone that leads nowhere (RFC 6604).
                resp.set_response_code(ResponseCode::NXDomain);
            }
            resp.add_name_server(index.soa().clone());
            return None;
        };
        let cname = if matches!(qtype, RecordType::CNAME | RecordType::ANY) {
            None
        } else {
            records.iter().find_map(|d| match d {
                RData::CNAME(c) => Some(c.0.clone()),
                _ => None,
            })
        };
        if let Some(target) = cname {
            resp.add_answer(Record::from_rdata(name.clone(), ttl, RData::CNAME(CNAME(target.clone()))));
            if index.in_zone(&target) {
                name = target;
                continue;
            }
            return Some(target);
        }
        let before = resp.answers().len();
        for d in index.lookup(&name, qtype) {
            resp.add_answer(Record::from_rdata(name.clone(), ttl, d.clone()));
        }
        if resp.answers().len() == before {
            // NODATA
            resp.add_name_server(index.soa().clone());
            return None;
        }
        additionals(index, resp, before);
        return None;
    }
    tracing::debug!(name = %qname, "CNAME chain too long");
    resp.set_response_code(ResponseCode::ServFail);
    None
}

/// The addresses of SRV and NS targets in the zone, in the additional section.
fn additionals(index: &Index, resp: &mut Message, from: usize) {
    let ttl = index.zone.ttl;
    let mut targets: Vec<Name> = Vec::new();
    for r in &resp.answers()[from..] {
        let t = match &r.data() {
            RData::SRV(s) => s.target().clone(),
            RData::NS(n) => n.0.clone(),
            _ => continue,
        };
        if !targets.contains(&t) {
            targets.push(t);
        }
    }
    for t in targets {
        for d in index.lookup(&t, RecordType::A).chain(index.lookup(&t, RecordType::AAAA)) {
            resp.add_additional(Record::from_rdata(t.clone(), ttl, d.clone()));
        }
    }
}

/// The query the upstream is asked for a CNAME's target.
pub fn chase_query(chase: &Chase) -> Message {
    let mut q = Message::new();
    q.set_id(rand::random());
    q.set_recursion_desired(true);
    q.add_query(Query::query(chase.target.clone(), chase.qtype));
    q.set_edns(our_edns());
    q
}

/// The CNAME answer with what the upstream said about its target (its records and its
/// response code, e.g. NXDOMAIN); only the CNAME when the upstream did not answer.
pub fn finish_chase(mut chase: Box<Chase>, upstream: Option<Message>) -> Vec<u8> {
    if let Some(mut up) = upstream {
        chase.response.set_response_code(up.response_code());
        chase.response.add_answers(up.take_answers());
        if chase.response.response_code() != ResponseCode::NoError || chase.response.answers().len() == 1 {
            chase.response.add_name_servers(up.take_name_servers());
        }
    }
    encode(&chase.response, chase.limit)
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use crate::model::{service_records, ServiceRecords, Zone, LABEL_SERVICE_NAME};
    use hickory_proto::op::Query;
    use k8s_openapi::api::core::v1::Service;
    use k8s_openapi::api::discovery::v1::EndpointSlice;
    use serde_json::json;
    use std::sync::Arc;

    const FWD: Options = Options { forward: true };
    const NOFWD: Options = Options { forward: false };

    fn zone() -> Zone {
        Zone::new("cluster.local", 5, vec!["169.254.20.10".parse().unwrap()]).unwrap()
    }

    fn records(svc: serde_json::Value, slices: Vec<serde_json::Value>) -> ServiceRecords {
        let s: Service = serde_json::from_value(svc).unwrap();
        let sl: Vec<Arc<EndpointSlice>> = slices.into_iter().map(|v| Arc::new(serde_json::from_value(v).unwrap())).collect();
        service_records(&zone(), &s, &sl).unwrap()
    }

    /// web (ClusterIP, dual-stack, named port), db (headless, 2 ready + 1 unready, one with a
    /// hostname), ext (ExternalName out of the zone), alias (ExternalName to web), big
    /// (headless with 60 endpoints).
    pub(crate) fn index() -> Index {
        let web = records(
            json!({"metadata": {"name": "web", "namespace": "ns1"},
                "spec": {"clusterIP": "10.96.0.5", "clusterIPs": ["10.96.0.5", "fd00::5"], "ports": [{"name": "http", "port": 80}]}}),
            vec![],
        );
        let db = records(
            json!({"metadata": {"name": "db", "namespace": "ns1"}, "spec": {"clusterIP": "None", "ports": [{"name": "pg", "port": 5432}]}}),
            vec![json!({"metadata": {"name": "db-1", "namespace": "ns1", "labels": {LABEL_SERVICE_NAME: "db"}},
                "addressType": "IPv4", "ports": [{"name": "pg", "port": 5432, "protocol": "TCP"}],
                "endpoints": [{"addresses": ["10.88.0.10"], "hostname": "db-0"}, {"addresses": ["10.88.0.11"]},
                    {"addresses": ["10.88.0.12"], "conditions": {"ready": false}}]})],
        );
        let empty = records(json!({"metadata": {"name": "empty", "namespace": "ns1"}, "spec": {"clusterIP": "None"}}), vec![]);
        let ext = records(json!({"metadata": {"name": "ext", "namespace": "ns1"}, "spec": {"type": "ExternalName", "externalName": "www.example.com"}}), vec![]);
        let alias = records(
            json!({"metadata": {"name": "alias", "namespace": "ns2"}, "spec": {"type": "ExternalName", "externalName": "web.ns1.svc.cluster.local."}}),
            vec![],
        );
        let eps: Vec<serde_json::Value> = (0..60).map(|i| json!({"addresses": [format!("10.89.0.{i}")]})).collect();
        let big = records(
            json!({"metadata": {"name": "big", "namespace": "ns1"}, "spec": {"clusterIP": "None"}}),
            vec![json!({"metadata": {"name": "big-1", "namespace": "ns1", "labels": {LABEL_SERVICE_NAME: "big"}}, "addressType": "IPv4", "endpoints": eps})],
        );
        Index::build(&zone(), 42, [&web, &db, &empty, &ext, &alias, &big])
    }

    fn query(name: &str, t: RecordType) -> Message {
        let mut m = Message::new();
        m.set_id(0x1234);
        m.set_recursion_desired(true);
        m.add_query(Query::query(Name::from_ascii(name).unwrap(), t));
        m
    }

    fn ask_msg(idx: &Index, m: &Message, tr: Transport, opts: &Options) -> Outcome {
        answer(idx, &m.to_vec().unwrap(), tr, opts)
    }

    fn reply(o: Outcome) -> Message {
        match o {
            Outcome::Reply(b) => Message::from_vec(&b).unwrap(),
            other => panic!("expected a reply, got {other:?}"),
        }
    }

    fn ask(idx: &Index, name: &str, t: RecordType) -> Message {
        reply(ask_msg(idx, &query(name, t), Transport::Udp, &FWD))
    }

    fn datas(m: &Message) -> Vec<String> {
        let mut v: Vec<String> = m.answers().iter().map(|r| r.data().to_string()).collect();
        v.sort();
        v
    }

    fn assert_negative(m: &Message, rcode: ResponseCode) {
        assert_eq!(m.response_code(), rcode);
        assert!(m.answers().is_empty());
        assert_eq!(m.name_servers().len(), 1);
        let soa = &m.name_servers()[0];
        assert_eq!(soa.record_type(), RecordType::SOA);
        assert_eq!(soa.name().to_ascii(), "cluster.local.");
        // the negative TTL: min(SOA TTL, SOA minimum)
        let RData::SOA(s) = &soa.data() else { panic!() };
        assert_eq!(soa.ttl().min(s.minimum()), 5);
        assert!(m.authoritative());
    }

    #[test]
    fn a_and_aaaa_of_a_cluster_ip_service() {
        let idx = index();
        let m = ask(&idx, "web.ns1.svc.cluster.local.", RecordType::A);
        assert_eq!(m.response_code(), ResponseCode::NoError);
        assert!(m.authoritative() && m.recursion_available() && m.recursion_desired());
        assert_eq!(m.id(), 0x1234);
        assert_eq!(datas(&m), ["10.96.0.5"]);
        assert_eq!(m.answers()[0].ttl(), 5);
        assert_eq!(datas(&ask(&idx, "web.ns1.svc.cluster.local.", RecordType::AAAA)), ["fd00::5"]);
    }

    #[test]
    fn names_are_case_insensitive_and_the_question_is_echoed() {
        let idx = index();
        let m = ask(&idx, "WeB.NS1.Svc.Cluster.Local.", RecordType::A);
        assert_eq!(datas(&m), ["10.96.0.5"]);
        assert_eq!(m.queries()[0].name().to_ascii(), "WeB.NS1.Svc.Cluster.Local.");
    }

    #[test]
    fn headless_service_and_its_endpoints() {
        let idx = index();
        assert_eq!(datas(&ask(&idx, "db.ns1.svc.cluster.local.", RecordType::A)), ["10.88.0.10", "10.88.0.11"]);
        assert_eq!(datas(&ask(&idx, "db-0.db.ns1.svc.cluster.local.", RecordType::A)), ["10.88.0.10"]);
        assert_eq!(datas(&ask(&idx, "10-88-0-11.db.ns1.svc.cluster.local.", RecordType::A)), ["10.88.0.11"]);
        // the unready endpoint is not published
        assert_negative(&ask(&idx, "10-88-0-12.db.ns1.svc.cluster.local.", RecordType::A), ResponseCode::NXDomain);
        // a headless Service without ready endpoints: NXDOMAIN, as the specification says
        assert_negative(&ask(&idx, "empty.ns1.svc.cluster.local.", RecordType::A), ResponseCode::NXDomain);
        // v4 only: NODATA for AAAA
        assert_negative(&ask(&idx, "db.ns1.svc.cluster.local.", RecordType::AAAA), ResponseCode::NoError);
    }

    #[test]
    fn srv_for_named_ports_with_the_targets_addresses() {
        let idx = index();
        let m = ask(&idx, "_http._tcp.web.ns1.svc.cluster.local.", RecordType::SRV);
        assert_eq!(datas(&m), ["0 100 80 web.ns1.svc.cluster.local."]);
        let add: Vec<String> = m.additionals().iter().map(|r| format!("{} {}", r.name(), r.data())).collect();
        assert_eq!(add.len(), 2, "{add:?}");
        assert!(add.contains(&"web.ns1.svc.cluster.local. 10.96.0.5".to_string()));
        let m = ask(&idx, "_pg._tcp.db.ns1.svc.cluster.local.", RecordType::SRV);
        assert_eq!(datas(&m), ["0 50 5432 10-88-0-11.db.ns1.svc.cluster.local.", "0 50 5432 db-0.db.ns1.svc.cluster.local."]);
        assert_eq!(m.additionals().len(), 2);
        // the protocol's empty non-terminal, an unknown port
        assert_negative(&ask(&idx, "_tcp.web.ns1.svc.cluster.local.", RecordType::SRV), ResponseCode::NoError);
        assert_negative(&ask(&idx, "_nope._tcp.web.ns1.svc.cluster.local.", RecordType::SRV), ResponseCode::NXDomain);
    }

    #[test]
    fn ptr_for_service_and_endpoint_addresses() {
        let idx = index();
        assert_eq!(datas(&ask(&idx, "5.0.96.10.in-addr.arpa.", RecordType::PTR)), ["web.ns1.svc.cluster.local."]);
        assert_eq!(datas(&ask(&idx, "10.0.88.10.in-addr.arpa.", RecordType::PTR)), ["db-0.db.ns1.svc.cluster.local."]);
        let v6 = crate::model::reverse_name("fd00::5".parse().unwrap()).to_ascii();
        assert_eq!(datas(&ask(&idx, &v6, RecordType::PTR)), ["web.ns1.svc.cluster.local."]);
        // an address the cluster does not know is someone else's
        assert!(matches!(ask_msg(&idx, &query("9.9.9.10.in-addr.arpa.", RecordType::PTR), Transport::Udp, &FWD), Outcome::Forward));
    }

    #[test]
    fn external_name_is_a_cname_chased_upstream_or_inside_the_zone() {
        let idx = index();
        let Outcome::Chase(c) = ask_msg(&idx, &query("ext.ns1.svc.cluster.local.", RecordType::A), Transport::Udp, &FWD) else { panic!() };
        assert_eq!(c.target.to_ascii(), "www.example.com.");
        assert_eq!(chase_query(&c).queries()[0].name().to_ascii(), "www.example.com.");
        let mut up = new_response(7, OpCode::Query);
        up.add_answer(Record::from_rdata(Name::from_ascii("www.example.com.").unwrap(), 300, RData::A("192.0.2.53".parse::<std::net::Ipv4Addr>().unwrap().into())));
        let m = Message::from_vec(&finish_chase(c, Some(up))).unwrap();
        assert_eq!(m.answers().len(), 2);
        assert_eq!(m.answers()[0].record_type(), RecordType::CNAME);
        assert_eq!(m.answers()[1].data().to_string(), "192.0.2.53");
        // without forwarding: the CNAME alone
        let m = reply(ask_msg(&idx, &query("ext.ns1.svc.cluster.local.", RecordType::A), Transport::Udp, &NOFWD));
        assert_eq!(datas(&m), ["www.example.com."]);
        // a CNAME query gets the CNAME itself
        assert_eq!(datas(&ask(&idx, "ext.ns1.svc.cluster.local.", RecordType::CNAME)), ["www.example.com."]);
        // into the zone: followed here
        let m = ask(&idx, "alias.ns2.svc.cluster.local.", RecordType::A);
        assert_eq!(datas(&m), ["10.96.0.5", "web.ns1.svc.cluster.local."]);
    }

    #[test]
    fn negative_answers_nxdomain_and_nodata() {
        let idx = index();
        assert_negative(&ask(&idx, "nope.ns1.svc.cluster.local.", RecordType::A), ResponseCode::NXDomain);
        assert_negative(&ask(&idx, "ns1.svc.cluster.local.", RecordType::A), ResponseCode::NoError);
        assert_negative(&ask(&idx, "svc.cluster.local.", RecordType::A), ResponseCode::NoError);
        assert_negative(&ask(&idx, "web.ns1.svc.cluster.local.", RecordType::MX), ResponseCode::NoError);
        assert_negative(&ask(&idx, "nope.cluster.local.", RecordType::A), ResponseCode::NXDomain);
        // no wildcards
        assert_negative(&ask(&idx, "*.ns1.svc.cluster.local.", RecordType::A), ResponseCode::NXDomain);
        assert_negative(&ask(&idx, "x.web.ns1.svc.cluster.local.", RecordType::A), ResponseCode::NXDomain);
    }

    #[test]
    fn zone_apex_version_and_name_server() {
        let idx = index();
        let m = ask(&idx, "cluster.local.", RecordType::SOA);
        assert_eq!(m.answers().len(), 1);
        assert!(m.answers()[0].data().to_string().starts_with("ns.dns.cluster.local. hostmaster.cluster.local. 42 "), "{}", m.answers()[0].data());
        let m = ask(&idx, "dns-version.cluster.local.", RecordType::TXT);
        assert_eq!(datas(&m), ["1.1.0"]);
        let m = ask(&idx, "cluster.local.", RecordType::NS);
        assert_eq!(datas(&m), ["ns.dns.cluster.local."]);
        assert_eq!(m.additionals()[0].data().to_string(), "169.254.20.10");
    }

    #[test]
    fn outside_names_forwarded_or_refused() {
        let idx = index();
        assert!(matches!(ask_msg(&idx, &query("example.com.", RecordType::A), Transport::Udp, &FWD), Outcome::Forward));
        let m = reply(ask_msg(&idx, &query("example.com.", RecordType::A), Transport::Udp, &NOFWD));
        assert_eq!(m.response_code(), ResponseCode::Refused);
        assert!(!m.recursion_available());
        // a zone transfer is refused
        let m = ask(&idx, "cluster.local.", RecordType::AXFR);
        assert_eq!(m.response_code(), ResponseCode::Refused);
    }

    #[test]
    fn bad_queries_formerr_notimp_badvers_and_drops() {
        let idx = index();
        // header only, claiming one question
        let mut b = query("web.ns1.svc.cluster.local.", RecordType::A).to_vec().unwrap();
        b.truncate(12);
        let m = reply(answer(&idx, &b, Transport::Udp, &FWD));
        assert_eq!(m.response_code(), ResponseCode::FormErr);
        assert_eq!(m.id(), 0x1234);
        // a label of 64 bytes (0x40 is no valid label type)
        let mut b = vec![0x12, 0x34, 0x01, 0x00, 0, 1, 0, 0, 0, 0, 0, 0, 0x40];
        b.extend([b'a'; 64]);
        b.extend([0, 0, 1, 0, 1]);
        assert_eq!(reply(answer(&idx, &b, Transport::Tcp, &FWD)).response_code(), ResponseCode::FormErr);
        // a compression pointer pointing at itself
        let b = vec![0x12, 0x34, 0x01, 0x00, 0, 1, 0, 0, 0, 0, 0, 0, 0xc0, 12, 0, 1, 0, 1];
        assert_eq!(reply(answer(&idx, &b, Transport::Udp, &FWD)).response_code(), ResponseCode::FormErr);
        // two questions
        let mut m = query("web.ns1.svc.cluster.local.", RecordType::A);
        m.add_query(Query::query(Name::from_ascii("db.ns1.svc.cluster.local.").unwrap(), RecordType::A));
        assert_eq!(reply(ask_msg(&idx, &m, Transport::Udp, &FWD)).response_code(), ResponseCode::FormErr);
        // no question
        let mut m = query("web.ns1.svc.cluster.local.", RecordType::A);
        m.queries_mut().clear();
        assert_eq!(reply(ask_msg(&idx, &m, Transport::Udp, &FWD)).response_code(), ResponseCode::FormErr);
        // an UPDATE
        let mut m = query("web.ns1.svc.cluster.local.", RecordType::A);
        m.set_op_code(OpCode::Update);
        assert_eq!(reply(ask_msg(&idx, &m, Transport::Udp, &FWD)).response_code(), ResponseCode::NotImp);
        // EDNS version 1
        let mut m = query("web.ns1.svc.cluster.local.", RecordType::A);
        let mut e = Edns::new();
        e.set_version(1);
        m.set_edns(e);
        let r = reply(ask_msg(&idx, &m, Transport::Udp, &FWD));
        // BADVERS and BADSIG share the code 16 (the decoder names it BADSIG)
        assert_eq!(u16::from(r.response_code()), 16);
        assert_eq!(r.extensions().as_ref().unwrap().version(), 0);
        // a response, and a runt: nothing
        let mut m = query("web.ns1.svc.cluster.local.", RecordType::A);
        m.set_message_type(MessageType::Response);
        assert!(matches!(ask_msg(&idx, &m, Transport::Udp, &FWD), Outcome::Drop));
        assert!(matches!(answer(&idx, &[1, 2, 3], Transport::Udp, &FWD), Outcome::Drop));
    }

    #[test]
    fn large_udp_answers_are_truncated_unless_edns_or_tcp_allows_them() {
        let idx = index();
        let q = query("big.ns1.svc.cluster.local.", RecordType::A);
        let m = reply(ask_msg(&idx, &q, Transport::Udp, &FWD));
        assert!(m.truncated());
        assert!(m.answers().is_empty());
        assert_eq!(m.queries().len(), 1);
        let m = reply(ask_msg(&idx, &q, Transport::Tcp, &FWD));
        assert!(!m.truncated());
        assert_eq!(m.answers().len(), 60);
        // EDNS with room for it: whole, and our OPT in the answer
        let mut q2 = q.clone();
        let mut e = Edns::new();
        e.set_max_payload(1232);
        q2.set_edns(e);
        let m = reply(ask_msg(&idx, &q2, Transport::Udp, &FWD));
        assert!(!m.truncated());
        assert_eq!(m.answers().len(), 60);
        assert_eq!(m.extensions().as_ref().unwrap().max_payload(), MAX_UDP_PAYLOAD);
        // EDNS too small for it: truncated
        let mut q3 = q.clone();
        let mut e = Edns::new();
        e.set_max_payload(600);
        q3.set_edns(e);
        assert!(reply(ask_msg(&idx, &q3, Transport::Udp, &FWD)).truncated());
    }

    #[test]
    fn random_bytes_never_crash_and_answers_fit_the_transport() {
        use rand::{Rng as _, SeedableRng as _};
        let idx = index();
        let mut rng = rand::rngs::StdRng::seed_from_u64(0x5eed);
        let good = query("db.ns1.svc.cluster.local.", RecordType::SRV).to_vec().unwrap();
        for i in 0..20_000 {
            let bytes: Vec<u8> = if i % 2 == 0 {
                let len = rng.random_range(0..600);
                (0..len).map(|_| rng.random()).collect()
            } else {
                // a valid query with a few bytes flipped
                let mut b = good.clone();
                for _ in 0..rng.random_range(1..4) {
                    let at = rng.random_range(0..b.len());
                    b[at] = rng.random();
                }
                b
            };
            if let Outcome::Reply(r) = answer(&idx, &bytes, Transport::Udp, &FWD) {
                assert!(r.len() <= usize::from(MAX_UDP_PAYLOAD));
                assert!(r.len() >= 12);
            }
        }
    }
}
