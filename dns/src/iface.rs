//! The listen addresses' home: a dummy interface in the node's network namespace holding them
//! as /32 and /128 host addresses (as upstream's NodeLocal DNSCache does with its link-local
//! address), so pods reach the server through their default route to the node and nothing is
//! NATed. The narrow [`Interface`] trait has the rtnetlink implementation and a recording fake.

use std::net::IpAddr;
use std::sync::Mutex;

use futures::TryStreamExt as _;
use netlink_packet_route::address::AddressAttribute;
use netlink_packet_route::link::LinkFlags;
use rtnetlink::{LinkBridge, LinkDummy, LinkUnspec};

use crate::error::InterfaceError;

/// Makes sure a dummy link `name` exists (a port-less bridge where the kernel has no dummy
/// driver), is up and holds `addrs`.
#[async_trait::async_trait]
pub trait Interface: Send + Sync {
    async fn ensure(&self, name: &str, addrs: &[IpAddr]) -> Result<(), InterfaceError>;
}

const EEXIST: i32 = 17;
const ENODEV: i32 = 19;
const EOPNOTSUPP: i32 = 95;

fn errno(e: &rtnetlink::Error) -> Option<i32> {
    match e {
        rtnetlink::Error::NetlinkError(m) => Some(-m.raw_code()),
        _ => None,
    }
}

fn nl(context: String) -> impl FnOnce(rtnetlink::Error) -> InterfaceError {
    move |source| InterfaceError::Netlink { context, source }
}

/// rtnetlink in the current network namespace.
pub struct Netlink {
    h: rtnetlink::Handle,
}

impl Netlink {
    /// Opens the netlink socket; call inside a tokio runtime.
    pub fn new() -> Result<Netlink, InterfaceError> {
        let (conn, h, _) = rtnetlink::new_connection().map_err(InterfaceError::Open)?;
        tokio::spawn(conn);
        Ok(Netlink { h })
    }

    async fn link(&self, name: &str) -> Result<Option<netlink_packet_route::link::LinkMessage>, InterfaceError> {
        match self.h.link().get().match_name(name.to_string()).execute().try_next().await {
            Ok(m) => Ok(m),
            Err(e) if errno(&e) == Some(ENODEV) => Ok(None),
            Err(e) => Err(nl(format!("get link {name}"))(e)),
        }
    }
}

#[async_trait::async_trait]
impl Interface for Netlink {
    async fn ensure(&self, name: &str, addrs: &[IpAddr]) -> Result<(), InterfaceError> {
        let mut link = self.link(name).await?;
        if link.is_none() {
            let mut r = self.h.link().add(LinkDummy::new(name).build()).execute().await;
            if matches!(&r, Err(e) if errno(e) == Some(EOPNOTSUPP)) {
                // A kernel without the dummy driver: a bridge without ports holds local
                // addresses just as well (up, carrier on, nothing attached).
                tracing::info!(link = name, "no dummy driver in this kernel; a port-less bridge instead");
                r = self.h.link().add(LinkBridge::new(name).build()).execute().await;
            }
            match r {
                Err(e) if errno(&e) != Some(EEXIST) => return Err(nl(format!("create link {name}"))(e)),
                _ => tracing::info!(link = name, "created the listen link"),
            }
            link = self.link(name).await?;
        }
        let link = link.ok_or_else(|| InterfaceError::Vanished(name.to_string()))?;
        let index = link.header.index;
        if !link.header.flags.contains(LinkFlags::Up) {
            self.h.link().set(LinkUnspec::new_with_index(index).up().build()).execute().await.map_err(nl(format!("set {name} up")))?;
        }
        let mut have = Vec::new();
        let mut list = self.h.address().get().set_link_index_filter(index).execute();
        while let Some(a) = list.try_next().await.map_err(nl(format!("list addresses of {name}")))? {
            if a.header.index != index {
                continue;
            }
            for attr in &a.attributes {
                if let AddressAttribute::Local(ip) | AddressAttribute::Address(ip) = attr {
                    have.push(*ip);
                }
            }
        }
        for ip in addrs {
            if have.contains(ip) {
                continue;
            }
            let prefix = if ip.is_ipv4() { 32 } else { 128 };
            match self.h.address().add(index, *ip, prefix).execute().await {
                Err(e) if errno(&e) != Some(EEXIST) => return Err(nl(format!("add {ip}/{prefix} to {name}"))(e)),
                _ => tracing::info!(link = name, address = %ip, "added listen address"),
            }
        }
        Ok(())
    }
}

/// Records the calls (tests of the wiring).
#[derive(Default)]
pub struct FakeInterface {
    pub calls: Mutex<Vec<(String, Vec<IpAddr>)>>,
}

#[async_trait::async_trait]
impl Interface for FakeInterface {
    async fn ensure(&self, name: &str, addrs: &[IpAddr]) -> Result<(), InterfaceError> {
        self.calls.lock().unwrap_or_else(|p| p.into_inner()).push((name.to_string(), addrs.to_vec()));
        Ok(())
    }
}

/// Puts the listen addresses on interface `name` when one is asked for; the wildcard and
/// loopback addresses need no interface and are left out.
pub async fn prepare(iface: &dyn Interface, name: Option<&str>, listen: &[IpAddr]) -> Result<(), InterfaceError> {
    let Some(name) = name else { return Ok(()) };
    let addrs: Vec<IpAddr> = listen.iter().copied().filter(|a| !a.is_unspecified() && !a.is_loopback()).collect();
    if addrs.is_empty() {
        return Ok(());
    }
    iface.ensure(name, &addrs).await
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn only_real_addresses_go_on_the_interface() {
        let f = FakeInterface::default();
        let listen: Vec<IpAddr> = ["169.254.20.10", "0.0.0.0", "127.0.0.1", "fd00::10"].iter().map(|s| s.parse().unwrap()).collect();
        prepare(&f, None, &listen).await.unwrap();
        assert!(f.calls.lock().unwrap().is_empty());
        prepare(&f, Some("ferro-dns0"), &listen[1..3]).await.unwrap();
        assert!(f.calls.lock().unwrap().is_empty());
        prepare(&f, Some("ferro-dns0"), &listen).await.unwrap();
        assert_eq!(*f.calls.lock().unwrap(), [("ferro-dns0".to_string(), vec![listen[0], listen[3]])]);
    }
}
