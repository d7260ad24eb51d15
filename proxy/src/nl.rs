//! Netlink plumbing shared by the hand-written executors (ipset over nfnetlink, IPVS over
//! generic netlink): a message builder, an attribute walker, request/acknowledge over a socket
//! opened in this process's network namespace or another one.

use std::io;
use std::path::Path;

use netlink_sys::{Socket, SocketAddr};

pub const NLMSG_ERROR: u16 = 2;
pub const NLMSG_DONE: u16 = 3;
pub const NLM_F_REQUEST: u16 = 1;
pub const NLM_F_MULTI: u16 = 2;
pub const NLM_F_ACK: u16 = 4;
pub const NLM_F_EXCL: u16 = 0x200;
pub const NLM_F_CREATE: u16 = 0x400;
pub const NLM_F_DUMP: u16 = 0x300;
pub const NLA_F_NESTED: u16 = 0x8000;
pub const NLA_F_NET_BYTEORDER: u16 = 0x4000;
pub const NLA_TYPE_MASK: u16 = 0x3fff;

/// A netlink message under construction: nlmsghdr, the family's fixed header, attributes.
#[derive(Debug, Clone)]
pub struct Msg(Vec<u8>);

impl Msg {
    pub fn new(kind: u16, flags: u16, seq: u32, header: &[u8]) -> Msg {
        let mut b = Vec::with_capacity(128);
        b.extend_from_slice(&[0; 4]); // length, set by finish
        b.extend_from_slice(&kind.to_ne_bytes());
        b.extend_from_slice(&flags.to_ne_bytes());
        b.extend_from_slice(&seq.to_ne_bytes());
        b.extend_from_slice(&0u32.to_ne_bytes());
        b.extend_from_slice(header);
        let mut m = Msg(b);
        m.pad();
        m
    }

    fn pad(&mut self) {
        while !self.0.len().is_multiple_of(4) {
            self.0.push(0);
        }
    }

    pub fn attr(&mut self, kind: u16, data: &[u8]) -> &mut Msg {
        self.0.extend_from_slice(&((4 + data.len()) as u16).to_ne_bytes());
        self.0.extend_from_slice(&kind.to_ne_bytes());
        self.0.extend_from_slice(data);
        self.pad();
        self
    }

    /// An attribute exactly as the kernel sent it (header included).
    pub fn raw(&mut self, bytes: &[u8]) -> &mut Msg {
        self.0.extend_from_slice(bytes);
        self.pad();
        self
    }

    pub fn u8(&mut self, kind: u16, v: u8) -> &mut Msg {
        self.attr(kind, &[v])
    }

    pub fn u16(&mut self, kind: u16, v: u16) -> &mut Msg {
        self.attr(kind, &v.to_ne_bytes())
    }

    pub fn u32(&mut self, kind: u16, v: u32) -> &mut Msg {
        self.attr(kind, &v.to_ne_bytes())
    }

    /// A NUL-terminated string.
    pub fn str(&mut self, kind: u16, s: &str) -> &mut Msg {
        let mut v = s.as_bytes().to_vec();
        v.push(0);
        self.attr(kind, &v)
    }

    pub fn nest(&mut self, kind: u16, inner: impl FnOnce(&mut Msg)) -> &mut Msg {
        let at = self.0.len();
        self.0.extend_from_slice(&[0, 0]);
        self.0.extend_from_slice(&(kind | NLA_F_NESTED).to_ne_bytes());
        inner(self);
        let len = (self.0.len() - at) as u16;
        self.0[at..at + 2].copy_from_slice(&len.to_ne_bytes());
        self
    }

    pub fn finish(mut self) -> Vec<u8> {
        let len = self.0.len() as u32;
        self.0[..4].copy_from_slice(&len.to_ne_bytes());
        self.0
    }
}

pub fn bad(what: &str) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, format!("malformed netlink message: {what}"))
}

/// An attribute: (type without flags, payload).
pub type Attr<'a> = (u16, &'a [u8]);

/// The attributes in `b`.
pub fn attrs(mut b: &[u8]) -> io::Result<Vec<Attr<'_>>> {
    let mut out = Vec::new();
    while b.len() >= 4 {
        let len = u16::from_ne_bytes([b[0], b[1]]) as usize;
        let kind = u16::from_ne_bytes([b[2], b[3]]) & NLA_TYPE_MASK;
        if len < 4 || len > b.len() {
            return Err(bad("attribute length"));
        }
        out.push((kind, &b[4..len]));
        let next = (len + 3) & !3;
        b = if next >= b.len() { &[] } else { &b[next..] };
    }
    Ok(out)
}

/// The payload of attribute `kind` in `list`.
pub fn find<'a>(list: &[Attr<'a>], kind: u16) -> Option<&'a [u8]> {
    list.iter().find(|(k, _)| *k == kind).map(|(_, v)| *v)
}

pub fn get_u16(list: &[Attr<'_>], kind: u16) -> Option<u16> {
    find(list, kind).and_then(|v| v.get(..2)).map(|v| u16::from_ne_bytes([v[0], v[1]]))
}

pub fn get_u32(list: &[Attr<'_>], kind: u16) -> Option<u32> {
    find(list, kind)
        .and_then(|v| v.get(..4))
        .map(|v| u32::from_ne_bytes([v[0], v[1], v[2], v[3]]))
}

/// One message of an answer: (type, flags, body after nlmsghdr).
pub type Message<'a> = (u16, u16, &'a [u8]);

/// The messages of one datagram.
pub fn messages(buf: &[u8]) -> io::Result<Vec<Message<'_>>> {
    let mut out = Vec::new();
    let mut off = 0;
    while off + 16 <= buf.len() {
        let len = u32::from_ne_bytes([buf[off], buf[off + 1], buf[off + 2], buf[off + 3]]) as usize;
        let kind = u16::from_ne_bytes([buf[off + 4], buf[off + 5]]);
        let flags = u16::from_ne_bytes([buf[off + 6], buf[off + 7]]);
        if len < 16 || off + len > buf.len() {
            return Err(bad("message length"));
        }
        out.push((kind, flags, &buf[off + 16..off + len]));
        off += (len + 3) & !3;
    }
    Ok(out)
}

/// The errno of an NLMSG_ERROR body (0: an acknowledgement).
pub fn error_code(body: &[u8]) -> io::Result<i32> {
    let e: [u8; 4] = body.get(..4).and_then(|b| b.try_into().ok()).ok_or_else(|| bad("error message"))?;
    Ok(-i32::from_ne_bytes(e))
}

/// A socket of `protocol`, opened in the network namespace at `netns` (a thread enters it
/// just to open the socket) or in this process's.
pub fn socket(protocol: isize, netns: Option<&Path>) -> io::Result<Socket> {
    let open = || -> io::Result<Socket> {
        let mut sock = Socket::new(protocol)?;
        sock.bind_auto()?;
        sock.connect(&SocketAddr::new(0, 0))?;
        Ok(sock)
    };
    match netns {
        None => open(),
        Some(path) => std::thread::scope(|s| {
            s.spawn(|| {
                let f = std::fs::File::open(path)?;
                nix::sched::setns(f, nix::sched::CloneFlags::CLONE_NEWNET).map_err(io::Error::from)?;
                open()
            })
            .join()
            .unwrap_or_else(|_| Err(io::Error::other("namespace thread panicked")))
        }),
    }
}

/// Sends `msg` and collects the answer's messages (other than errors and DONE) until the
/// acknowledgement, the end of a dump, or an error (returned as the errno).
pub fn request(sock: &Socket, msg: &[u8]) -> io::Result<Result<Vec<Vec<u8>>, i32>> {
    sock.send(msg, 0)?;
    let mut buf = vec![0u8; 64 * 1024];
    let mut out = Vec::new();
    loop {
        let n = sock.recv(&mut &mut buf[..], 0)?;
        for (kind, _flags, body) in messages(&buf[..n])? {
            match kind {
                NLMSG_DONE => return Ok(Ok(out)),
                NLMSG_ERROR => {
                    let code = error_code(body)?;
                    return Ok(if code == 0 { Ok(out) } else { Err(code) });
                }
                _ => {
                    // keep the whole message: header fields the caller may need are in the
                    // body's family header
                    out.push(body.to_vec());
                }
            }
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn messages_are_built_padded_and_walked_back() {
        let mut m = Msg::new(0x0601, NLM_F_REQUEST | NLM_F_ACK, 7, &[2, 0, 0, 0]);
        m.u8(1, 7).str(2, "KUBE-CLUSTER-IP").nest(7, |m| {
            m.u16(4 | NLA_F_NET_BYTEORDER, 80u16.to_be());
        });
        let b = m.finish();
        assert_eq!(b.len() % 4, 0);
        let msgs = messages(&b).unwrap();
        assert_eq!(msgs.len(), 1);
        let (kind, flags, body) = msgs[0];
        assert_eq!((kind, flags), (0x0601, NLM_F_REQUEST | NLM_F_ACK));
        let top = attrs(&body[4..]).unwrap();
        assert_eq!(top.iter().map(|a| a.0).collect::<Vec<_>>(), [1, 2, 7]);
        assert_eq!(find(&top, 2).unwrap(), b"KUBE-CLUSTER-IP\0");
        let inner = attrs(find(&top, 7).unwrap()).unwrap();
        assert_eq!(inner, [(4, &80u16.to_be_bytes()[..])], "flags are masked off the type");
        assert!(attrs(&[8, 0, 1, 0, 0]).is_err(), "an attribute longer than the buffer is refused");
    }
}
