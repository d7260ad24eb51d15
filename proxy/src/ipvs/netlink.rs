//! IPVS through generic netlink (family "IPVS", version 1), written by hand: the messages
//! `ipvsadm` sends to add, edit, delete and list virtual and real servers.
//!
//! The family id is looked up with CTRL_CMD_GETFAMILY; a kernel without ip_vs has no such
//! family, which is reported as [`IpvsError::NoIpvs`] at the first sync (this machine's kernel
//! is one: these messages are tested as bytes, never against a kernel here).

use std::collections::BTreeMap;
use std::io;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::path::PathBuf;

use netlink_sys::protocols::NETLINK_GENERIC;
use netlink_sys::Socket;

use super::plan::{RealKey, VirtualKey, VirtualServer, VirtualServers};
use crate::error::IpvsError;
use crate::model::Protocol;
use crate::nl::{self, Msg, NLM_F_ACK, NLM_F_DUMP, NLM_F_REQUEST};

const GENL_ID_CTRL: u16 = 0x10;
const CTRL_CMD_GETFAMILY: u8 = 3;
const CTRL_ATTR_FAMILY_ID: u16 = 1;
const CTRL_ATTR_FAMILY_NAME: u16 = 2;
const IPVS_GENL_NAME: &str = "IPVS";
const IPVS_GENL_VERSION: u8 = 1;

pub const CMD_NEW_SERVICE: u8 = 1;
pub const CMD_SET_SERVICE: u8 = 2;
pub const CMD_DEL_SERVICE: u8 = 3;
pub const CMD_GET_SERVICE: u8 = 4;
pub const CMD_NEW_DEST: u8 = 5;
pub const CMD_SET_DEST: u8 = 6;
pub const CMD_DEL_DEST: u8 = 7;
pub const CMD_GET_DEST: u8 = 8;

const CMD_ATTR_SERVICE: u16 = 1;
const CMD_ATTR_DEST: u16 = 2;

const SVC_ATTR_AF: u16 = 1;
const SVC_ATTR_PROTOCOL: u16 = 2;
const SVC_ATTR_ADDR: u16 = 3;
const SVC_ATTR_PORT: u16 = 4;
const SVC_ATTR_SCHED_NAME: u16 = 6;
const SVC_ATTR_FLAGS: u16 = 7;
const SVC_ATTR_TIMEOUT: u16 = 8;
const SVC_ATTR_NETMASK: u16 = 9;

const DEST_ATTR_ADDR: u16 = 1;
const DEST_ATTR_PORT: u16 = 2;
const DEST_ATTR_FWD_METHOD: u16 = 3;
const DEST_ATTR_WEIGHT: u16 = 4;
const DEST_ATTR_U_THRESH: u16 = 5;
const DEST_ATTR_L_THRESH: u16 = 6;
const DEST_ATTR_ADDR_FAMILY: u16 = 11;

/// IP_VS_SVC_F_PERSISTENT.
const F_PERSISTENT: u32 = 0x1;
/// IP_VS_CONN_F_MASQ: NAT to the real server, as upstream.
const FWD_MASQ: u32 = 0;

const AF_INET: u16 = 2;
const AF_INET6: u16 = 10;

fn af(ip: &IpAddr) -> u16 {
    match ip {
        IpAddr::V4(_) => AF_INET,
        IpAddr::V6(_) => AF_INET6,
    }
}

fn ipproto(p: Protocol) -> u16 {
    match p {
        Protocol::Tcp => 6,
        Protocol::Udp => 17,
        Protocol::Sctp => 132,
    }
}

fn protocol_of(n: u16) -> Option<Protocol> {
    match n {
        6 => Some(Protocol::Tcp),
        17 => Some(Protocol::Udp),
        132 => Some(Protocol::Sctp),
        _ => None,
    }
}

fn ip_bytes(ip: &IpAddr) -> Vec<u8> {
    match ip {
        IpAddr::V4(v4) => v4.octets().to_vec(),
        IpAddr::V6(v6) => v6.octets().to_vec(),
    }
}

fn ip_of(af: u16, b: &[u8]) -> io::Result<IpAddr> {
    match af {
        AF_INET => {
            let o: [u8; 4] = b.get(..4).and_then(|b| b.try_into().ok()).ok_or_else(|| nl::bad("IPv4 address"))?;
            Ok(IpAddr::V4(Ipv4Addr::from(o)))
        }
        AF_INET6 => {
            let o: [u8; 16] = b.get(..16).and_then(|b| b.try_into().ok()).ok_or_else(|| nl::bad("IPv6 address"))?;
            Ok(IpAddr::V6(Ipv6Addr::from(o)))
        }
        _ => Err(nl::bad("address family")),
    }
}

/// CTRL_CMD_GETFAMILY "IPVS".
pub fn family_request(seq: u32) -> Vec<u8> {
    let mut m = Msg::new(GENL_ID_CTRL, NLM_F_REQUEST | NLM_F_ACK, seq, &[CTRL_CMD_GETFAMILY, 1, 0, 0]);
    m.str(CTRL_ATTR_FAMILY_NAME, IPVS_GENL_NAME);
    m.finish()
}

/// The family id in a CTRL_CMD_NEWFAMILY answer body.
pub fn parse_family_answer(body: &[u8]) -> io::Result<u16> {
    let a = nl::attrs(body.get(4..).ok_or_else(|| nl::bad("genlmsghdr"))?)?;
    nl::get_u16(&a, CTRL_ATTR_FAMILY_ID).ok_or_else(|| nl::bad("family answer without an id"))
}

fn ipvs_msg(family_id: u16, cmd: u8, flags: u16, seq: u32) -> Msg {
    Msg::new(family_id, NLM_F_REQUEST | flags, seq, &[cmd, IPVS_GENL_VERSION, 0, 0])
}

fn service_identity(m: &mut Msg, key: &VirtualKey) {
    m.u16(SVC_ATTR_AF, af(&key.addr))
        .u16(SVC_ATTR_PROTOCOL, ipproto(key.protocol))
        .attr(SVC_ATTR_ADDR, &ip_bytes(&key.addr))
        .attr(SVC_ATTR_PORT, &key.port.to_be_bytes());
}

/// NEW_SERVICE / SET_SERVICE with every field the kernel wants for a full entry, or
/// DEL_SERVICE (`vs` None) with the identity only.
pub fn service_request(family_id: u16, cmd: u8, key: &VirtualKey, vs: Option<&VirtualServer>, seq: u32) -> Vec<u8> {
    let mut m = ipvs_msg(family_id, cmd, NLM_F_ACK, seq);
    m.nest(CMD_ATTR_SERVICE, |m| {
        service_identity(m, key);
        if let Some(vs) = vs {
            let flags: u32 = if vs.persistent.is_some() { F_PERSISTENT } else { 0 };
            let mut fl = flags.to_ne_bytes().to_vec();
            fl.extend_from_slice(&u32::MAX.to_ne_bytes()); // mask: every flag is set as given
            let netmask: u32 = match key.addr {
                IpAddr::V4(_) => u32::MAX,
                IpAddr::V6(_) => 128,
            };
            m.str(SVC_ATTR_SCHED_NAME, &vs.scheduler)
                .attr(SVC_ATTR_FLAGS, &fl)
                .u32(SVC_ATTR_TIMEOUT, vs.persistent.unwrap_or(0))
                .u32(SVC_ATTR_NETMASK, netmask);
        }
    });
    m.finish()
}

/// NEW_DEST / SET_DEST (`weight` Some) or DEL_DEST of one real server of `key`.
pub fn dest_request(family_id: u16, cmd: u8, key: &VirtualKey, real: &RealKey, weight: Option<u32>, seq: u32) -> Vec<u8> {
    let mut m = ipvs_msg(family_id, cmd, NLM_F_ACK, seq);
    m.nest(CMD_ATTR_SERVICE, |m| service_identity(m, key));
    m.nest(CMD_ATTR_DEST, |m| {
        m.attr(DEST_ATTR_ADDR, &ip_bytes(&real.addr))
            .attr(DEST_ATTR_PORT, &real.port.to_be_bytes())
            .u16(DEST_ATTR_ADDR_FAMILY, af(&real.addr));
        if let Some(w) = weight {
            m.u32(DEST_ATTR_FWD_METHOD, FWD_MASQ)
                .u32(DEST_ATTR_WEIGHT, w)
                .u32(DEST_ATTR_U_THRESH, 0)
                .u32(DEST_ATTR_L_THRESH, 0);
        }
    });
    m.finish()
}

/// GET_SERVICE dump: every virtual server of the namespace.
pub fn dump_services_request(family_id: u16, seq: u32) -> Vec<u8> {
    ipvs_msg(family_id, CMD_GET_SERVICE, NLM_F_DUMP | NLM_F_ACK, seq).finish()
}

/// GET_DEST dump: the real servers of `key`.
pub fn dump_dests_request(family_id: u16, key: &VirtualKey, seq: u32) -> Vec<u8> {
    let mut m = ipvs_msg(family_id, CMD_GET_DEST, NLM_F_DUMP | NLM_F_ACK, seq);
    m.nest(CMD_ATTR_SERVICE, |m| service_identity(m, key));
    m.finish()
}

/// One virtual server of a GET_SERVICE answer body (None: a firewall-mark service, not
/// ferro's).
pub fn parse_service(body: &[u8]) -> io::Result<Option<(VirtualKey, VirtualServer)>> {
    let top = nl::attrs(body.get(4..).ok_or_else(|| nl::bad("genlmsghdr"))?)?;
    let svc = nl::attrs(nl::find(&top, CMD_ATTR_SERVICE).ok_or_else(|| nl::bad("service without attributes"))?)?;
    let (Some(af), Some(proto), Some(addr), Some(port)) = (
        nl::get_u16(&svc, SVC_ATTR_AF),
        nl::get_u16(&svc, SVC_ATTR_PROTOCOL),
        nl::find(&svc, SVC_ATTR_ADDR),
        nl::find(&svc, SVC_ATTR_PORT),
    ) else {
        return Ok(None);
    };
    let Some(protocol) = protocol_of(proto) else {
        return Ok(None);
    };
    let port = u16::from_be_bytes(port.get(..2).and_then(|p| p.try_into().ok()).ok_or_else(|| nl::bad("port"))?);
    let sched = nl::find(&svc, SVC_ATTR_SCHED_NAME).unwrap_or_default();
    let scheduler = String::from_utf8_lossy(sched.split(|b| *b == 0).next().unwrap_or_default()).into_owned();
    let flags = nl::get_u32(&svc, SVC_ATTR_FLAGS).unwrap_or(0);
    let timeout = nl::get_u32(&svc, SVC_ATTR_TIMEOUT).unwrap_or(0);
    Ok(Some((
        VirtualKey {
            addr: ip_of(af, addr)?,
            port,
            protocol,
        },
        VirtualServer {
            scheduler,
            persistent: (flags & F_PERSISTENT != 0).then_some(timeout),
        },
    )))
}

/// One real server of a GET_DEST answer body, with its weight.
pub fn parse_dest(body: &[u8], family_of_service: IpAddr) -> io::Result<(RealKey, u32)> {
    let top = nl::attrs(body.get(4..).ok_or_else(|| nl::bad("genlmsghdr"))?)?;
    let d = nl::attrs(nl::find(&top, CMD_ATTR_DEST).ok_or_else(|| nl::bad("destination without attributes"))?)?;
    let af = nl::get_u16(&d, DEST_ATTR_ADDR_FAMILY).unwrap_or(af(&family_of_service));
    let addr = ip_of(af, nl::find(&d, DEST_ATTR_ADDR).ok_or_else(|| nl::bad("destination address"))?)?;
    let port = nl::find(&d, DEST_ATTR_PORT)
        .and_then(|p| p.get(..2))
        .map(|p| u16::from_be_bytes([p[0], p[1]]))
        .ok_or_else(|| nl::bad("destination port"))?;
    Ok((RealKey { addr, port }, nl::get_u32(&d, DEST_ATTR_WEIGHT).unwrap_or(0)))
}

/// The kernel's IPVS table in one network namespace.
pub struct Ipvs {
    netns: Option<PathBuf>,
    sock: Option<(Socket, u16)>,
    seq: u32,
}

impl Ipvs {
    pub fn new(netns: Option<PathBuf>) -> Ipvs {
        Ipvs { netns, sock: None, seq: 1 }
    }

    fn next(&mut self) -> u32 {
        self.seq = self.seq.wrapping_add(1);
        self.seq
    }

    /// The socket and the IPVS family id (looked up once).
    fn open(&mut self) -> Result<(), IpvsError> {
        if self.sock.is_some() {
            return Ok(());
        }
        let sock = nl::socket(NETLINK_GENERIC, self.netns.as_deref())
            .map_err(|source| IpvsError::Socket { what: "generic", source })?;
        let seq = self.next();
        let answer = nl::request(&sock, &family_request(seq)).map_err(|source| IpvsError::Kernel {
            op: "looking up the IPVS netlink family".into(),
            source,
        })?;
        let id = match answer {
            Err(2) => return Err(IpvsError::NoIpvs),
            Err(errno) => {
                return Err(IpvsError::Kernel {
                    op: "looking up the IPVS netlink family".into(),
                    source: io::Error::from_raw_os_error(errno),
                })
            }
            Ok(bodies) => bodies
                .first()
                .ok_or(IpvsError::NoIpvs)
                .and_then(|b| parse_family_answer(b).map_err(|_| IpvsError::NoIpvs))?,
        };
        self.sock = Some((sock, id));
        Ok(())
    }

    fn call(&mut self, op: impl FnOnce() -> String, build: impl FnOnce(u16, u32) -> Vec<u8>) -> Result<Vec<Vec<u8>>, IpvsError> {
        self.open()?;
        let seq = self.next();
        let Some((sock, id)) = &self.sock else {
            return Err(IpvsError::NoIpvs);
        };
        match nl::request(sock, &build(*id, seq)) {
            Ok(Ok(a)) => Ok(a),
            Ok(Err(errno)) => Err(IpvsError::Kernel {
                op: op(),
                source: io::Error::from_raw_os_error(errno),
            }),
            Err(source) => {
                self.sock = None;
                Err(IpvsError::Kernel { op: op(), source })
            }
        }
    }

    /// Checks that the kernel has IPVS ([`IpvsError::NoIpvs`] if not).
    pub fn probe(&mut self) -> Result<(), IpvsError> {
        self.open()
    }

    pub fn service(&mut self, cmd: u8, key: &VirtualKey, vs: Option<&VirtualServer>) -> Result<(), IpvsError> {
        self.call(|| format!("IPVS command {cmd} on {key}"), |id, seq| service_request(id, cmd, key, vs, seq))
            .map(|_| ())
    }

    pub fn dest(&mut self, cmd: u8, key: &VirtualKey, real: &RealKey, weight: Option<u32>) -> Result<(), IpvsError> {
        self.call(
            || format!("IPVS command {cmd} on {key} -> {}:{}", real.addr, real.port),
            |id, seq| dest_request(id, cmd, key, real, weight, seq),
        )
        .map(|_| ())
    }

    /// Every virtual server with its real servers.
    pub fn list(&mut self) -> Result<VirtualServers, IpvsError> {
        let bad = |source| IpvsError::Kernel {
            op: "listing IPVS virtual servers".into(),
            source,
        };
        let bodies = self.call(|| "listing IPVS virtual servers".into(), dump_services_request)?;
        let mut out = BTreeMap::new();
        for b in bodies {
            if let Some((key, vs)) = parse_service(&b).map_err(bad)? {
                let dests = self.call(|| format!("listing the real servers of {key}"), |id, seq| dump_dests_request(id, &key, seq))?;
                let mut reals = BTreeMap::new();
                for d in dests {
                    let (r, w) = parse_dest(&d, key.addr).map_err(bad)?;
                    reals.insert(r, w);
                }
                out.insert(key, (vs, reals));
            }
        }
        Ok(out)
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn key() -> VirtualKey {
        VirtualKey {
            addr: "172.30.0.10".parse().unwrap(),
            port: 80,
            protocol: Protocol::Tcp,
        }
    }

    #[test]
    fn family_lookup_asks_for_ipvs_by_name() {
        let b = family_request(1);
        let m = nl::messages(&b).unwrap();
        assert_eq!(m[0].0, GENL_ID_CTRL);
        assert_eq!(m[0].2[0], CTRL_CMD_GETFAMILY);
        let a = nl::attrs(&m[0].2[4..]).unwrap();
        assert_eq!(nl::find(&a, CTRL_ATTR_FAMILY_NAME).unwrap(), b"IPVS\0");
        // an answer: genlmsghdr + FAMILY_ID 0x25
        let mut ans = vec![1, 2, 0, 0];
        ans.extend_from_slice(&6u16.to_ne_bytes());
        ans.extend_from_slice(&CTRL_ATTR_FAMILY_ID.to_ne_bytes());
        ans.extend_from_slice(&0x25u16.to_ne_bytes());
        ans.extend_from_slice(&[0, 0]);
        assert_eq!(parse_family_answer(&ans).unwrap(), 0x25);
    }

    #[test]
    fn a_new_service_is_a_full_entry_and_reads_back() {
        let vs = VirtualServer {
            scheduler: "rr".into(),
            persistent: Some(10800),
        };
        let b = service_request(0x25, CMD_NEW_SERVICE, &key(), Some(&vs), 5);
        let m = nl::messages(&b).unwrap();
        assert_eq!(m[0].0, 0x25, "the IPVS family id");
        assert_eq!(&m[0].2[..2], &[CMD_NEW_SERVICE, 1]);
        let top = nl::attrs(&m[0].2[4..]).unwrap();
        let svc = nl::attrs(nl::find(&top, CMD_ATTR_SERVICE).unwrap()).unwrap();
        let kinds: Vec<u16> = svc.iter().map(|a| a.0).collect();
        assert_eq!(
            kinds,
            [SVC_ATTR_AF, SVC_ATTR_PROTOCOL, SVC_ATTR_ADDR, SVC_ATTR_PORT, SVC_ATTR_SCHED_NAME, SVC_ATTR_FLAGS, SVC_ATTR_TIMEOUT, SVC_ATTR_NETMASK],
            "the kernel refuses a new service without scheduler, flags, timeout and netmask"
        );
        assert_eq!(nl::find(&svc, SVC_ATTR_PORT).unwrap(), &[0, 80], "the port in network order");
        assert_eq!(nl::find(&svc, SVC_ATTR_ADDR).unwrap(), &[172, 30, 0, 10]);
        // the same body, as a GET_SERVICE answer, parses back to what was sent
        assert_eq!(parse_service(m[0].2).unwrap(), Some((key(), vs)));

        let del = service_request(0x25, CMD_DEL_SERVICE, &key(), None, 6);
        let m = nl::messages(&del).unwrap();
        let top = nl::attrs(&m[0].2[4..]).unwrap();
        assert_eq!(nl::attrs(nl::find(&top, CMD_ATTR_SERVICE).unwrap()).unwrap().len(), 4, "identity only");
    }

    #[test]
    fn real_servers_are_masqueraded_with_their_weight_and_read_back() {
        let real = RealKey {
            addr: "fd00:10::1".parse().unwrap(),
            port: 8080,
        };
        let v6 = VirtualKey {
            addr: "fd00:30::10".parse().unwrap(),
            port: 80,
            protocol: Protocol::Udp,
        };
        let b = dest_request(0x25, CMD_NEW_DEST, &v6, &real, Some(1), 7);
        let m = nl::messages(&b).unwrap();
        let top = nl::attrs(&m[0].2[4..]).unwrap();
        let d = nl::attrs(nl::find(&top, CMD_ATTR_DEST).unwrap()).unwrap();
        assert_eq!(nl::get_u32(&d, DEST_ATTR_FWD_METHOD), Some(FWD_MASQ));
        assert_eq!(nl::get_u32(&d, DEST_ATTR_WEIGHT), Some(1));
        assert_eq!(nl::find(&d, DEST_ATTR_ADDR).unwrap().len(), 16);
        assert_eq!(parse_dest(m[0].2, v6.addr).unwrap(), (real, 1));
        let svc = nl::attrs(nl::find(&top, CMD_ATTR_SERVICE).unwrap()).unwrap();
        assert_eq!(nl::get_u16(&svc, SVC_ATTR_PROTOCOL), Some(17));

        let del = dest_request(0x25, CMD_DEL_DEST, &v6, &real, None, 8);
        let m = nl::messages(&del).unwrap();
        let top = nl::attrs(&m[0].2[4..]).unwrap();
        let d = nl::attrs(nl::find(&top, CMD_ATTR_DEST).unwrap()).unwrap();
        assert_eq!(d.len(), 3, "address, port and family only");
    }

    #[test]
    fn dumps_are_requested_as_dumps() {
        let b = dump_dests_request(0x25, &key(), 9);
        let m = nl::messages(&b).unwrap();
        assert_eq!(m[0].1 & NLM_F_DUMP, NLM_F_DUMP);
        assert_eq!(m[0].2[0], CMD_GET_DEST);
        assert!(parse_service(&[4, 1, 0, 0]).is_err(), "a service answer without attributes is malformed");
    }
}
