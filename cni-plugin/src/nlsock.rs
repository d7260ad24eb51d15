//! A blocking rtnetlink client for the `ferro-cni` process: one socket per network namespace,
//! no async runtime. A CNI call is a short-lived process that sends a handful of requests in a
//! fixed order, so a runtime to build, an epoll set and a wake-up per answer are pure cost
//! there. Requests that do not depend on each other's answers go out in one datagram
//! ([`NlSocket::batch`]); the kernel handles them in order and acknowledges each.
//!
//! Messages are built with the same `netlink-packet-route` types (and rtnetlink's builders)
//! as ferro-netd's async client, so only the transport differs.

use std::io;

use netlink_packet_route::link::{LinkAttribute, LinkMessage};
use netlink_packet_route::RouteNetlinkMessage;
use rtnetlink::packet_core::{
    NetlinkHeader, NetlinkMessage, NetlinkPayload, NLM_F_ACK, NLM_F_DUMP, NLM_F_REQUEST,
};
use rtnetlink::sys::{protocols::NETLINK_ROUTE, Socket, SocketAddr};

use crate::netlink::ENODEV;

/// Room for one answer datagram; the kernel sizes dump datagrams to at most 32 KiB.
const RECV_BUF: usize = 64 * 1024;

/// A failed netlink request.
#[derive(Debug, thiserror::Error)]
pub enum NlError {
    /// The kernel refused the request with this errno.
    #[error("{}", io::Error::from_raw_os_error(*.0))]
    Kernel(i32),
    /// The socket failed.
    #[error(transparent)]
    Io(#[from] io::Error),
    /// An answer could not be decoded.
    #[error("undecodable netlink answer: {0}")]
    Decode(String),
}

impl NlError {
    /// The kernel's errno (None for socket and decoding failures).
    pub fn errno(&self) -> Option<i32> {
        match self {
            NlError::Kernel(e) => Some(*e),
            _ => None,
        }
    }

    /// As an `io::Error`, for [`crate::CniError::io`].
    pub fn into_io(self) -> io::Error {
        match self {
            NlError::Kernel(e) => io::Error::from_raw_os_error(e),
            NlError::Io(e) => e,
            NlError::Decode(m) => io::Error::new(io::ErrorKind::InvalidData, m),
        }
    }
}

/// One request of a batch: the message and its `NLM_F_*` flags (`NLM_F_REQUEST` is always
/// added, and `NLM_F_ACK` unless the request is answered by a single reply).
pub struct Request {
    pub message: RouteNetlinkMessage,
    pub flags: u16,
    /// Answered by exactly one message or an error (a GET of one object): no ACK is asked
    /// for, the reply completes it.
    single_reply: bool,
}

impl Request {
    pub fn new(message: RouteNetlinkMessage, flags: u16) -> Request {
        Request {
            message,
            flags,
            single_reply: false,
        }
    }

    /// A GET of one object: its one reply (or error) is the answer.
    pub fn get(message: RouteNetlinkMessage) -> Request {
        Request {
            message,
            flags: 0,
            single_reply: true,
        }
    }
}

/// A route-netlink socket bound to the network namespace the thread was in when it was opened.
pub struct NlSocket {
    sock: Socket,
    seq: u32,
    buf: Vec<u8>,
}

impl NlSocket {
    /// Opens a socket in the calling thread's current network namespace.
    pub fn open() -> io::Result<NlSocket> {
        let mut sock = Socket::new(NETLINK_ROUTE)?;
        sock.bind_auto()?;
        sock.connect(&SocketAddr::new(0, 0))?;
        // Acknowledgements without a copy of the request.
        sock.set_cap_ack(true)?;
        Ok(NlSocket {
            sock,
            seq: 0,
            buf: Vec::with_capacity(RECV_BUF),
        })
    }

    /// Sends `reqs` in one datagram and waits until the kernel has answered every one. Each
    /// request's outcome, in order: the messages it returned (a GET's reply, a dump's entries,
    /// an `NLM_F_ECHO` notification), or the kernel's error. A failed request does not stop
    /// the ones after it. The outer error is a socket or decoding failure.
    pub fn batch(
        &mut self,
        reqs: Vec<Request>,
    ) -> Result<Vec<Result<Vec<RouteNetlinkMessage>, NlError>>, NlError> {
        let first = self.seq.wrapping_add(1);
        let mut out = Vec::new();
        let mut single = Vec::with_capacity(reqs.len());
        for req in reqs {
            self.seq = self.seq.wrapping_add(1);
            single.push(req.single_reply);
            let mut header = NetlinkHeader::default();
            header.flags = NLM_F_REQUEST | req.flags;
            if !req.single_reply {
                header.flags |= NLM_F_ACK;
            }
            header.sequence_number = self.seq;
            let mut msg = NetlinkMessage::new(header, NetlinkPayload::InnerMessage(req.message));
            msg.finalize();
            let at = out.len();
            out.resize(at + msg.buffer_len(), 0);
            msg.serialize(&mut out[at..]);
        }
        let count = self.seq.wrapping_sub(first).wrapping_add(1) as usize;
        self.sock.send(&out, 0)?;
        let mut answers: Vec<Option<Result<Vec<RouteNetlinkMessage>, NlError>>> =
            (0..count).map(|_| None).collect();
        let mut replies: Vec<Vec<RouteNetlinkMessage>> = (0..count).map(|_| Vec::new()).collect();
        let mut pending = count;
        while pending > 0 {
            self.buf.clear();
            let n = self.sock.recv(&mut self.buf, nix::libc::MSG_TRUNC)?;
            if n > self.buf.len() {
                return Err(NlError::Decode(format!("datagram of {n} bytes truncated")));
            }
            let mut off = 0;
            while off + 16 <= self.buf.len() {
                let len = u32::from_ne_bytes([
                    self.buf[off],
                    self.buf[off + 1],
                    self.buf[off + 2],
                    self.buf[off + 3],
                ]) as usize;
                if len < 16 || off + len > self.buf.len() {
                    return Err(NlError::Decode(format!("bad message length {len}")));
                }
                let msg = NetlinkMessage::<RouteNetlinkMessage>::deserialize(
                    &self.buf[off..off + len],
                )
                .map_err(|e| NlError::Decode(e.to_string()))?;
                off += (len + 3) & !3;
                let i = msg.header.sequence_number.wrapping_sub(first) as usize;
                let Some(slot) = answers.get_mut(i) else {
                    continue; // not an answer to this batch
                };
                if slot.is_some() {
                    continue;
                }
                let done = match msg.payload {
                    NetlinkPayload::InnerMessage(m) => {
                        replies[i].push(m);
                        single[i].then(|| Ok(std::mem::take(&mut replies[i])))
                    }
                    NetlinkPayload::Error(e) => match e.code {
                        None => Some(Ok(std::mem::take(&mut replies[i]))),
                        Some(c) => Some(Err(NlError::Kernel(-c.get()))),
                    },
                    NetlinkPayload::Done(_) => Some(Ok(std::mem::take(&mut replies[i]))),
                    _ => None,
                };
                if let Some(d) = done {
                    *slot = Some(d);
                    pending -= 1;
                }
            }
        }
        Ok(answers.into_iter().flatten().collect())
    }

    /// A batch of one: its answer.
    fn one(&mut self, req: Request) -> Result<Vec<RouteNetlinkMessage>, NlError> {
        self.batch(vec![req])?
            .pop()
            .unwrap_or(Err(NlError::Decode("no answer".into())))
    }

    /// One request; its replies, or the kernel's error.
    pub fn request(
        &mut self,
        message: RouteNetlinkMessage,
        flags: u16,
    ) -> Result<Vec<RouteNetlinkMessage>, NlError> {
        self.one(Request::new(message, flags))
    }

    /// A request that only needs its acknowledgement.
    pub fn ack(&mut self, message: RouteNetlinkMessage, flags: u16) -> Result<(), NlError> {
        self.request(message, flags).map(drop)
    }

    /// A dump (`NLM_F_DUMP`): every entry the kernel returns.
    pub fn dump(&mut self, message: RouteNetlinkMessage) -> Result<Vec<RouteNetlinkMessage>, NlError> {
        self.request(message, NLM_F_DUMP)
    }

    /// The link named `name`, `None` when there is none.
    pub fn link_by_name(&mut self, name: &str) -> Result<Option<LinkMessage>, NlError> {
        let mut msg = LinkMessage::default();
        msg.attributes.push(LinkAttribute::IfName(name.to_string()));
        self.get_link(msg)
    }

    /// The link with index `index`, `None` when there is none.
    pub fn link_by_index(&mut self, index: u32) -> Result<Option<LinkMessage>, NlError> {
        let mut msg = LinkMessage::default();
        msg.header.index = index;
        self.get_link(msg)
    }

    fn get_link(&mut self, msg: LinkMessage) -> Result<Option<LinkMessage>, NlError> {
        match self.one(Request::get(RouteNetlinkMessage::GetLink(msg))) {
            Ok(replies) => Ok(replies.into_iter().find_map(|m| match m {
                RouteNetlinkMessage::NewLink(l) => Some(l),
                _ => None,
            })),
            Err(e) if e.errno() == Some(ENODEV) => Ok(None),
            Err(e) => Err(e),
        }
    }
}
