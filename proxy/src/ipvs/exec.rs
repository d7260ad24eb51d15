//! The narrow trait IPVS mode applies its plan through, the real kernel behind it (IPVS over
//! generic netlink, ipsets over nfnetlink, the dummy's addresses with one `ip -batch`), and a
//! recording fake that keeps the state the operations would leave.

use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use super::ipset::Ipset;
use super::netlink::{self, Ipvs};
pub use super::plan::VirtualServers;
use super::plan::{Op, SetEntry, SetKind, DUMMY};
use crate::error::IpvsError;
use crate::exec::Runner;
use crate::model::Family;

/// What IPVS mode needs from the kernel.
pub trait IpvsKernel: Send + 'static {
    /// Creates the dummy link (if missing) and sets it up.
    fn ensure_dummy(&mut self) -> Result<(), IpvsError>;
    /// The addresses on the dummy.
    fn bound_addresses(&mut self) -> Result<BTreeSet<IpAddr>, IpvsError>;
    /// Every virtual server of the namespace.
    fn virtual_servers(&mut self) -> Result<VirtualServers, IpvsError>;
    /// Makes set `name` hold exactly `entries`, atomically for the rules matching it.
    fn replace_set(&mut self, name: &str, kind: SetKind, family: Family, entries: &BTreeSet<SetEntry>) -> Result<(), IpvsError>;
    /// Applies `ops` in order, stopping at the first the kernel refuses.
    fn apply(&mut self, ops: &[Op]) -> Result<(), IpvsError>;
}

/// The real kernel of one network namespace.
pub struct Kernel<R: Runner> {
    runner: R,
    ipvs: Ipvs,
    ipset: Ipset,
}

impl<R: Runner> Kernel<R> {
    /// `netns`: the namespace's path for the netlink sockets (None: this process's); `runner`
    /// runs `ip` in the same namespace.
    pub fn new(runner: R, netns: Option<PathBuf>) -> Kernel<R> {
        Kernel {
            runner,
            ipvs: Ipvs::new(netns.clone()),
            ipset: Ipset::new(netns),
        }
    }

    fn addresses(&mut self, ops: &[&Op]) -> Result<(), IpvsError> {
        let mut batch = String::new();
        for op in ops {
            match op {
                Op::BindAddress(ip) => batch.push_str(&format!("address replace {ip}/{} dev {DUMMY}\n", host_bits(ip))),
                Op::UnbindAddress(ip) => batch.push_str(&format!("address del {ip}/{} dev {DUMMY}\n", host_bits(ip))),
                _ => {}
            }
        }
        self.runner.run("ip", &["-batch", "-"], Some(&batch))?;
        Ok(())
    }
}

fn host_bits(ip: &IpAddr) -> u8 {
    if ip.is_ipv4() {
        32
    } else {
        128
    }
}

impl<R: Runner> IpvsKernel for Kernel<R> {
    fn ensure_dummy(&mut self) -> Result<(), IpvsError> {
        if self.runner.run("ip", &["-o", "link", "show", DUMMY], None).is_err() {
            self.runner.run("ip", &["link", "add", DUMMY, "type", "dummy"], None)?;
        }
        self.runner.run("ip", &["link", "set", DUMMY, "up"], None)?;
        Ok(())
    }

    fn bound_addresses(&mut self) -> Result<BTreeSet<IpAddr>, IpvsError> {
        let out = self.runner.run("ip", &["-o", "addr", "show", "dev", DUMMY], None)?;
        Ok(crate::iptables::backend::local_addresses(&out).into_iter().collect())
    }

    fn virtual_servers(&mut self) -> Result<VirtualServers, IpvsError> {
        self.ipvs.list()
    }

    fn replace_set(&mut self, name: &str, kind: SetKind, family: Family, entries: &BTreeSet<SetEntry>) -> Result<(), IpvsError> {
        self.ipset.replace(name, kind, family, entries)
    }

    fn apply(&mut self, ops: &[Op]) -> Result<(), IpvsError> {
        let mut i = 0;
        while i < ops.len() {
            // consecutive address changes go to `ip` in one batch
            let run = ops[i..]
                .iter()
                .take_while(|o| matches!(o, Op::BindAddress(_) | Op::UnbindAddress(_)))
                .count();
            if run > 0 {
                let batch: Vec<&Op> = ops[i..i + run].iter().collect();
                self.addresses(&batch)?;
                i += run;
                continue;
            }
            match &ops[i] {
                Op::CreateSet { name, kind, family } => self.ipset.create(name, *kind, *family)?,
                Op::AddEntry { set, entry } => self.ipset.add(set, entry)?,
                Op::DelEntry { set, entry } => self.ipset.del(set, entry)?,
                Op::NewVirtual(k, v) => self.ipvs.service(netlink::CMD_NEW_SERVICE, k, Some(v))?,
                Op::EditVirtual(k, v) => self.ipvs.service(netlink::CMD_SET_SERVICE, k, Some(v))?,
                Op::DelVirtual(k) => self.ipvs.service(netlink::CMD_DEL_SERVICE, k, None)?,
                Op::NewReal(k, r, w) => self.ipvs.dest(netlink::CMD_NEW_DEST, k, r, Some(*w))?,
                Op::EditReal(k, r, w) => self.ipvs.dest(netlink::CMD_SET_DEST, k, r, Some(*w))?,
                Op::DelReal(k, r) => self.ipvs.dest(netlink::CMD_DEL_DEST, k, r, None)?,
                Op::BindAddress(_) | Op::UnbindAddress(_) => {}
            }
            i += 1;
        }
        Ok(())
    }
}

/// The state a recording fake holds: what the kernel would have after the operations.
#[derive(Debug, Default, Clone)]
pub struct FakeState {
    pub dummy: bool,
    pub addresses: BTreeSet<IpAddr>,
    pub virtual_servers: VirtualServers,
    pub sets: BTreeMap<String, (SetKind, BTreeSet<SetEntry>)>,
    /// Every call, as text ("apply: add KUBE-CLUSTER-IP 10.0.0.1,tcp:80", "replace KUBE-X 3").
    pub log: Vec<String>,
    /// The next `apply` fails at the operation whose text starts with this.
    pub refuse: Option<String>,
}

/// A recording fake of the kernel (shared, so a test keeps a handle while the backend owns
/// the other).
#[derive(Debug, Default, Clone)]
pub struct Recording(pub Arc<Mutex<FakeState>>);

impl Recording {
    pub fn state(&self) -> FakeState {
        self.0.lock().map(|s| s.clone()).unwrap_or_default()
    }

    fn with<T>(&self, f: impl FnOnce(&mut FakeState) -> T) -> T {
        let mut g = self.0.lock().unwrap_or_else(|p| p.into_inner());
        f(&mut g)
    }
}

impl IpvsKernel for Recording {
    fn ensure_dummy(&mut self) -> Result<(), IpvsError> {
        self.with(|s| {
            s.log.push("ensure dummy".into());
            s.dummy = true;
        });
        Ok(())
    }

    fn bound_addresses(&mut self) -> Result<BTreeSet<IpAddr>, IpvsError> {
        Ok(self.with(|s| s.addresses.clone()))
    }

    fn virtual_servers(&mut self) -> Result<VirtualServers, IpvsError> {
        Ok(self.with(|s| s.virtual_servers.clone()))
    }

    fn replace_set(&mut self, name: &str, kind: SetKind, _family: Family, entries: &BTreeSet<SetEntry>) -> Result<(), IpvsError> {
        self.with(|s| {
            s.log.push(format!("replace {name} {}", entries.len()));
            s.sets.insert(name.to_string(), (kind, entries.clone()));
        });
        Ok(())
    }

    fn apply(&mut self, ops: &[Op]) -> Result<(), IpvsError> {
        self.with(|s| {
            for op in ops {
                let text = op.to_string();
                if s.refuse.as_deref().is_some_and(|r| text.starts_with(r)) {
                    s.refuse = None;
                    return Err(IpvsError::Kernel {
                        op: text,
                        source: std::io::Error::from_raw_os_error(22),
                    });
                }
                s.log.push(format!("apply: {text}"));
                match op {
                    Op::CreateSet { name, kind, .. } => {
                        s.sets.entry(name.clone()).or_insert((*kind, BTreeSet::new()));
                    }
                    Op::AddEntry { set, entry } => {
                        s.sets.entry(set.clone()).or_insert((SetKind::Ip, BTreeSet::new())).1.insert(entry.clone());
                    }
                    Op::DelEntry { set, entry } => {
                        if let Some((_, e)) = s.sets.get_mut(set) {
                            e.remove(entry);
                        }
                    }
                    Op::BindAddress(ip) => {
                        s.addresses.insert(*ip);
                    }
                    Op::UnbindAddress(ip) => {
                        s.addresses.remove(ip);
                    }
                    Op::NewVirtual(k, v) | Op::EditVirtual(k, v) => {
                        s.virtual_servers.entry(*k).or_insert_with(|| (v.clone(), BTreeMap::new())).0 = v.clone();
                    }
                    Op::DelVirtual(k) => {
                        s.virtual_servers.remove(k);
                    }
                    Op::NewReal(k, r, w) | Op::EditReal(k, r, w) => {
                        if let Some((_, reals)) = s.virtual_servers.get_mut(k) {
                            reals.insert(*r, *w);
                        }
                    }
                    Op::DelReal(k, r) => {
                        if let Some((_, reals)) = s.virtual_servers.get_mut(k) {
                            reals.remove(r);
                        }
                    }
                }
            }
            Ok(())
        })
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use crate::exec;

    #[test]
    fn address_changes_go_to_ip_in_one_batch() {
        let r = exec::Recording::new();
        let mut k = Kernel::new(r.clone(), None);
        k.apply(&[
            Op::BindAddress("172.30.0.10".parse().unwrap()),
            Op::BindAddress("fd00:30::10".parse().unwrap()),
            Op::UnbindAddress("172.30.0.11".parse().unwrap()),
        ])
        .unwrap();
        let calls = r.calls();
        assert_eq!(calls.len(), 1);
        assert_eq!(calls[0].line(), "ip -batch -");
        assert_eq!(
            calls[0].stdin.as_deref().unwrap(),
            "address replace 172.30.0.10/32 dev kube-ipvs0\naddress replace fd00:30::10/128 dev kube-ipvs0\naddress del 172.30.0.11/32 dev kube-ipvs0\n"
        );
    }

    #[test]
    fn the_dummy_is_created_only_when_missing() {
        let r = exec::Recording::new();
        r.answer(|c| {
            (c.args.first().map(String::as_str) == Some("-o")).then(|| {
                Err(crate::error::ExecError::Failed {
                    program: "ip".into(),
                    status: "exit 1".into(),
                    stderr: "Device \"kube-ipvs0\" does not exist.".into(),
                })
            })
        });
        let mut k = Kernel::new(r.clone(), None);
        k.ensure_dummy().unwrap();
        let lines: Vec<String> = r.calls().iter().map(|c| c.line()).collect();
        assert_eq!(lines, ["ip -o link show kube-ipvs0", "ip link add kube-ipvs0 type dummy", "ip link set kube-ipvs0 up"]);
    }
}
