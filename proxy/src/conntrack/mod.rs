//! Conntrack clean-up of stale UDP flows: when a UDP service port's endpoints change, the
//! kernel's connection tracking keeps sending a flow's packets where its first packet went
//! (an endpoint that is gone, or nowhere when the Service had no endpoint), because the NAT
//! rules are only consulted for a flow's first packet. A UDP client that keeps its source port
//! (DNS resolvers, statsd senders, SIP) would stay pinned to the old endpoint for as long as it
//! keeps sending. After each successful sync of the rules (rules first, as upstream) the
//! controller deletes exactly those flows.
//!
//! [`plan`] is pure: (models before, models after) -> the [`Flows`] to delete. [`Conntrack`] is
//! the narrow executor: the real one speaks ctnetlink ([`netlink::Ctnetlink`]); tests use the
//! recording [`Recorder`].

pub mod netlink;
pub mod plan;

use std::collections::BTreeSet;
use std::fmt;
use std::net::IpAddr;
use std::sync::{Arc, Mutex};

use crate::error::ConntrackError;
use crate::model::{Family, Protocol};

pub use plan::{plan, plan_changes};

/// Which reply source (the address the flow was DNATed to, or the original destination when it
/// was not DNATed) a deletion selects.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Reply {
    /// Only flows answered by this address (an endpoint that went away).
    From(IpAddr),
    /// Every flow except those answered by one of these (the endpoints now in use): flows that
    /// were not DNATed at all (sent while the Service had no endpoint) or DNATed elsewhere.
    NotFrom(BTreeSet<IpAddr>),
}

/// A set of conntrack entries to delete: protocol, original destination (port, and address
/// unless it is a node port, which any node address answers) and reply source.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Flows {
    pub family: Family,
    pub protocol: Protocol,
    /// The original destination address; None: any (node ports).
    pub dst: Option<IpAddr>,
    pub dst_port: u16,
    pub reply: Reply,
}

impl Flows {
    /// Whether an entry with this original destination and reply source is selected.
    pub fn matches(&self, protocol: Protocol, dst: IpAddr, dst_port: u16, reply_src: IpAddr) -> bool {
        protocol == self.protocol
            && Family::of(&dst) == self.family
            && dst_port == self.dst_port
            && self.dst.is_none_or(|d| d == dst)
            && match &self.reply {
                Reply::From(ip) => *ip == reply_src,
                Reply::NotFrom(keep) => !keep.contains(&reply_src),
            }
    }
}

impl fmt::Display for Flows {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} orig-dst ", self.protocol.lower())?;
        match self.dst {
            Some(IpAddr::V6(ip)) => write!(f, "[{ip}]")?,
            Some(ip) => write!(f, "{ip}")?,
            None => write!(f, "*")?,
        }
        write!(f, ":{} reply-src ", self.dst_port)?;
        match &self.reply {
            Reply::From(ip) => write!(f, "{ip}"),
            Reply::NotFrom(keep) if keep.is_empty() => write!(f, "any"),
            Reply::NotFrom(keep) => {
                let keep: Vec<String> = keep.iter().map(ToString::to_string).collect();
                write!(f, "not {}", keep.join(","))
            }
        }
    }
}

/// Deletes conntrack entries. Injected into the controller from `main`; tests use [`Recorder`].
pub trait Conntrack: Send + 'static {
    /// Deletes the entries `flows` selects; returns how many were deleted.
    fn delete(&mut self, flows: &Flows) -> Result<usize, ConntrackError>;
}

impl Conntrack for Box<dyn Conntrack> {
    fn delete(&mut self, flows: &Flows) -> Result<usize, ConntrackError> {
        (**self).delete(flows)
    }
}

/// A recording fake: keeps every deletion asked for and deletes nothing. `fail` makes every
/// call fail (as a kernel without ctnetlink would).
#[derive(Clone, Default)]
pub struct Recorder {
    pub log: Arc<Mutex<Vec<Flows>>>,
    pub fail: Arc<std::sync::atomic::AtomicBool>,
}

impl Recorder {
    pub fn deletions(&self) -> Vec<Flows> {
        self.log.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }
}

impl Conntrack for Recorder {
    fn delete(&mut self, flows: &Flows) -> Result<usize, ConntrackError> {
        self.log.lock().unwrap_or_else(|p| p.into_inner()).push(flows.clone());
        if self.fail.load(std::sync::atomic::Ordering::SeqCst) {
            return Err(ConntrackError::Socket(std::io::Error::from_raw_os_error(93)));
        }
        Ok(0)
    }
}

/// What one clean-up did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Outcome {
    /// Entries deleted.
    pub deleted: usize,
    /// Deletions that failed (logged; the sync itself stands).
    pub failed: usize,
}

/// Runs `deletions` through `ct`, logging each failure; never fails as a whole.
pub fn execute(ct: &mut dyn Conntrack, deletions: &[Flows]) -> Outcome {
    let mut out = Outcome::default();
    for flows in deletions {
        match ct.delete(flows) {
            Ok(n) => {
                out.deleted += n;
                tracing::debug!(flows = %flows, deleted = n, "stale conntrack entries deleted");
            }
            Err(e) => {
                out.failed += 1;
                tracing::warn!(flows = %flows, error = %e, source = ?std::error::Error::source(&e).map(ToString::to_string), "deleting stale conntrack entries failed");
            }
        }
    }
    out
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    #[test]
    fn matching_follows_the_selectors() {
        let gone = Flows {
            family: Family::V4,
            protocol: Protocol::Udp,
            dst: Some(ip("10.96.0.10")),
            dst_port: 53,
            reply: Reply::From(ip("10.244.0.5")),
        };
        assert!(gone.matches(Protocol::Udp, ip("10.96.0.10"), 53, ip("10.244.0.5")));
        assert!(!gone.matches(Protocol::Tcp, ip("10.96.0.10"), 53, ip("10.244.0.5")));
        assert!(!gone.matches(Protocol::Udp, ip("10.96.0.11"), 53, ip("10.244.0.5")));
        assert!(!gone.matches(Protocol::Udp, ip("10.96.0.10"), 54, ip("10.244.0.5")));
        assert!(!gone.matches(Protocol::Udp, ip("10.96.0.10"), 53, ip("10.244.0.6")));
        let stuck = Flows {
            family: Family::V4,
            protocol: Protocol::Udp,
            dst: None,
            dst_port: 30053,
            reply: Reply::NotFrom([ip("10.244.0.6")].into()),
        };
        assert!(stuck.matches(Protocol::Udp, ip("192.168.1.1"), 30053, ip("192.168.1.1")));
        assert!(!stuck.matches(Protocol::Udp, ip("192.168.1.1"), 30053, ip("10.244.0.6")));
        assert!(
            !stuck.matches(Protocol::Udp, ip("fd00::1"), 30053, ip("fd00::1")),
            "other family"
        );
        assert_eq!(stuck.to_string(), "udp orig-dst *:30053 reply-src not 10.244.0.6");
        assert_eq!(gone.to_string(), "udp orig-dst 10.96.0.10:53 reply-src 10.244.0.5");
    }

    #[test]
    fn execute_counts_and_never_fails() {
        let mut rec = Recorder::default();
        let f = Flows {
            family: Family::V4,
            protocol: Protocol::Udp,
            dst: None,
            dst_port: 1,
            reply: Reply::NotFrom(BTreeSet::new()),
        };
        assert_eq!(
            execute(&mut rec, &[f.clone(), f.clone()]),
            Outcome { deleted: 0, failed: 0 }
        );
        rec.fail.store(true, std::sync::atomic::Ordering::SeqCst);
        assert_eq!(
            execute(&mut rec, std::slice::from_ref(&f)),
            Outcome { deleted: 0, failed: 1 }
        );
        assert_eq!(rec.deletions().len(), 3);
    }
}
