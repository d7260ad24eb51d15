//! The IPVS backend: plans each family, diffs against the state it applied last (partial
//! sync) or against what the kernel holds (full sync: the dummy's addresses and the virtual
//! servers listed, every set replaced whole by a swap), applies the operations, and writes
//! the mode's fixed iptables rules in one `iptables-restore --noflush` when they may have
//! changed (a full sync). A refused operation makes the next sync full.

use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;

use ipnet::IpNet;

use super::exec::IpvsKernel;
use super::plan::{self, Desired, PlanConfig};
use super::rules;
use crate::controller::{Backend, SyncReport};
use crate::error::{IpvsError, SyncError};
use crate::exec::Runner;
use crate::iptables::backend::{canaries_intact, local_addresses, tools};
use crate::iptables::rules::missing_of;
use crate::model::{Family, FamilyModel, NodeInfo};
use crate::nfcount::RuleCounter;

pub struct IpvsBackend<K: IpvsKernel, R: Runner> {
    kernel: K,
    runner: R,
    counter: Box<dyn RuleCounter>,
    cluster_cidrs: Vec<IpNet>,
    masquerade_all: bool,
    nodeport_cidrs: Vec<IpNet>,
    applied: BTreeMap<Family, Desired>,
}

impl<K: IpvsKernel, R: Runner> IpvsBackend<K, R> {
    pub fn new(
        kernel: K,
        runner: R,
        counter: Box<dyn RuleCounter>,
        cluster_cidrs: Vec<IpNet>,
        masquerade_all: bool,
        nodeport_cidrs: Vec<IpNet>,
    ) -> Self {
        IpvsBackend {
            kernel,
            runner,
            counter,
            cluster_cidrs,
            masquerade_all,
            nodeport_cidrs,
            applied: BTreeMap::new(),
        }
    }

    /// The node's addresses node ports are served on (the dummy's are Service addresses).
    fn node_ips(&mut self, family: Family) -> Result<Vec<IpAddr>, IpvsError> {
        let out = self.runner.run("ip", &["-o", "addr", "show"], None)?;
        let own: String = out
            .lines()
            .filter(|l| l.split_whitespace().nth(1).is_none_or(|dev| dev != plan::DUMMY))
            .map(|l| format!("{l}\n"))
            .collect();
        Ok(local_addresses(&own)
            .into_iter()
            .filter(|ip| family.contains(ip) && !ip.is_loopback())
            .filter(|ip| self.nodeport_cidrs.is_empty() || self.nodeport_cidrs.iter().any(|n| n.contains(ip)))
            .collect())
    }

    fn sync_family(&mut self, model: &FamilyModel, node: &NodeInfo, full: bool) -> Result<(bool, usize), IpvsError> {
        let family = model.family;
        let full = full || !self.applied.contains_key(&family);
        let node_ips = self.node_ips(family)?;
        let desired = plan::desired(model, node, &PlanConfig { node_ips: node_ips.clone() });
        let current = if full {
            self.kernel.ensure_dummy()?;
            let bound: BTreeSet<IpAddr> = self.kernel.bound_addresses()?.into_iter().filter(|ip| family.contains(ip)).collect();
            // ours: on the dummy, on a node address (node ports), or planned
            let virtual_servers = self
                .kernel
                .virtual_servers()?
                .into_iter()
                .filter(|(k, _)| {
                    family.contains(&k.addr)
                        && (bound.contains(&k.addr) || node_ips.contains(&k.addr) || desired.virtual_servers.contains_key(k))
                })
                .collect();
            for (name, (kind, entries)) in &desired.sets {
                self.kernel.replace_set(name, *kind, family, entries)?;
            }
            Desired {
                addresses: bound,
                virtual_servers,
                sets: desired.sets.clone(),
            }
        } else {
            self.applied.remove(&family).unwrap_or_default()
        };
        let ops = plan::diff(&current, &desired, family);
        for op in &ops {
            tracing::trace!(?family, %op, "ipvs");
        }
        self.kernel.apply(&ops)?;
        if full {
            let (_, _, restore) = tools(family);
            let jumps = rules::base_jumps();
            let base = crate::iptables::backend::base_chain_rules(&mut self.runner, family, &jumps)?;
            let missing = missing_of(&base, jumps);
            let text = rules::render(family, &self.cluster_cidrs, self.masquerade_all, &missing);
            self.runner.run(restore, &["-w", "--noflush"], Some(&text))?;
        }
        let n = desired.virtual_servers.len();
        self.applied.insert(family, desired);
        Ok((full, n))
    }
}

impl<K: IpvsKernel, R: Runner> Backend for IpvsBackend<K, R> {
    fn sync(&mut self, models: &[FamilyModel], node: &NodeInfo, full: bool) -> Result<SyncReport, SyncError> {
        let mut report = SyncReport {
            full: true,
            rules: Vec::new(),
        };
        for m in models {
            match self.sync_family(m, node, full) {
                Ok((was_full, n)) => {
                    report.full &= was_full;
                    let suffix = if m.family == Family::V6 { "6" } else { "" };
                    report.rules.push((format!("ipvs-virtual-servers{suffix}"), n as u64));
                }
                Err(source) => {
                    // what the kernel holds now is unknown: read it again next time
                    self.applied.remove(&m.family);
                    return Err(SyncError::Ipvs { family: m.family, source });
                }
            }
        }
        Ok(report)
    }

    fn drifted(&mut self) -> bool {
        let families: Vec<Family> = self.applied.keys().copied().collect();
        for family in families {
            if !canaries_intact(self.counter.as_mut(), family) {
                self.applied.remove(&family);
                return true;
            }
        }
        false
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use std::sync::Arc;

    use crate::slim::Service;
    use crate::slim::EndpointSlice;
    use serde_json::json;

    use super::*;
    use crate::exec;
    use crate::ipvs::exec::Recording;
    use crate::ipvs::plan::{RealKey, VirtualKey};
    use crate::model::{self, Protocol};

    fn node() -> NodeInfo {
        NodeInfo {
            name: "node-a".into(),
            zone: None,
        }
    }

    fn model(eps: &[&str], node_port: bool) -> FamilyModel {
        let mut spec = json!({"clusterIP": "172.30.0.10", "ports": [{"name": "p", "port": 80, "targetPort": 8080, "protocol": "TCP"}]});
        if node_port {
            spec["type"] = json!("NodePort");
            spec["ports"][0]["nodePort"] = json!(30080);
        }
        let svc: Arc<Service> = Arc::new(serde_json::from_value(json!({"metadata": {"namespace": "ns", "name": "web"}, "spec": spec})).unwrap());
        let eps: Vec<serde_json::Value> = eps.iter().map(|a| json!({"addresses": [a], "nodeName": "node-b"})).collect();
        let slice: Arc<EndpointSlice> = Arc::new(
            serde_json::from_value(json!({
                "metadata": {"namespace": "ns", "name": "web-1", "labels": {"kubernetes.io/service-name": "web"}},
                "addressType": "IPv4", "ports": [{"name": "p", "port": 8080, "protocol": "TCP"}], "endpoints": eps,
            }))
            .unwrap(),
        );
        model::build(Family::V4, &[svc], &[slice], &node()).0
    }

    fn backend(k: &Recording, r: &exec::Recording) -> IpvsBackend<Recording, exec::Recording> {
        r.answer(|c| {
            (c.line() == "ip -o addr show").then(|| {
                Ok("1: lo    inet 127.0.0.1/8 scope host lo\n2: eth0    inet 192.168.0.2/24 scope global eth0\n3: kube-ipvs0    inet 172.30.0.10/32 scope global kube-ipvs0\n".into())
            })
        });
        IpvsBackend::new(
            k.clone(),
            r.clone(),
            Box::new(crate::nfcount::Fake(|_, _, _| Some(1))),
            vec!["10.180.0.0/16".parse().unwrap()],
            false,
            vec![],
        )
    }

    fn vk(a: &str, port: u16) -> VirtualKey {
        VirtualKey {
            addr: a.parse().unwrap(),
            port,
            protocol: Protocol::Tcp,
        }
    }

    fn reals(k: &Recording, key: &VirtualKey) -> Vec<RealKey> {
        k.state().virtual_servers[key].1.keys().copied().collect()
    }

    #[test]
    fn a_full_sync_reads_the_kernel_replaces_the_sets_and_writes_the_rules_once() {
        let k = Recording::default();
        // left over from before a restart: a Service deleted meanwhile, on the dummy
        k.0.lock().unwrap().addresses.insert("172.30.0.99".parse().unwrap());
        k.0.lock().unwrap().virtual_servers.insert(vk("172.30.0.99", 80), (plan::VirtualServer { scheduler: "rr".into(), persistent: None }, BTreeMap::new()));
        // not ferro's: another address, left alone
        k.0.lock().unwrap().virtual_servers.insert(vk("10.9.9.9", 53), (plan::VirtualServer { scheduler: "wrr".into(), persistent: None }, BTreeMap::new()));
        let r = exec::Recording::new();
        let mut b = backend(&k, &r);
        let rep = b.sync(&[model(&["10.180.0.1", "10.180.0.2"], true)], &node(), false).unwrap();
        assert!(rep.full);
        let st = k.state();
        assert!(st.dummy);
        let keys: Vec<String> = st.virtual_servers.keys().map(|k| k.to_string()).collect();
        assert_eq!(keys, ["tcp/10.9.9.9:53", "tcp/172.30.0.10:80", "tcp/192.168.0.2:30080"], "the deleted Service's server is gone, the stranger stays, the dummy's address is no node port");
        assert_eq!(st.addresses, ["172.30.0.10".parse().unwrap()].into_iter().collect());
        assert_eq!(reals(&k, &vk("172.30.0.10", 80)).len(), 2);
        assert_eq!(st.log.iter().filter(|l| l.starts_with("replace ")).count(), plan::SETS.len(), "every set replaced whole");
        let lines: Vec<String> = r.calls().iter().map(|c| c.line()).collect();
        assert_eq!(
            lines,
            crate::iptables::backend::FULL_SYNC_CALLS
        );
        let text = r.calls()[7].stdin.clone().unwrap();
        assert!(text.contains("-I PREROUTING -m comment --comment \"kubernetes service portals\" -j KUBE-SERVICES"));

        // one endpoint replaced: a partial sync touches exactly that, no listing, no rules
        let before = k.state().log.len();
        let rep = b.sync(&[model(&["10.180.0.2", "10.180.0.3"], true)], &node(), false).unwrap();
        assert!(!rep.full);
        let log = k.state().log[before..].to_vec();
        assert_eq!(
            log,
            [
                "apply: add KUBE-LOOP-BACK 10.180.0.3,tcp:8080,10.180.0.3",
                "apply: new real server tcp/172.30.0.10:80 -> 10.180.0.3:8080 weight 1",
                "apply: new real server tcp/192.168.0.2:30080 -> 10.180.0.3:8080 weight 1",
                "apply: delete real server tcp/172.30.0.10:80 -> 10.180.0.1:8080",
                "apply: delete real server tcp/192.168.0.2:30080 -> 10.180.0.1:8080",
                "apply: del KUBE-LOOP-BACK 10.180.0.1,tcp:8080,10.180.0.1",
            ]
        );
        assert_eq!(r.calls().len(), 9, "only the address listing");
    }

    #[test]
    fn a_refused_operation_fails_the_sync_and_the_next_one_is_full() {
        let k = Recording::default();
        let r = exec::Recording::new();
        let mut b = backend(&k, &r);
        b.sync(&[model(&["10.180.0.1"], false)], &node(), false).unwrap();
        k.0.lock().unwrap().refuse = Some("new real server".into());
        let e = b.sync(&[model(&["10.180.0.1", "10.180.0.2"], false)], &node(), false).unwrap_err();
        assert!(matches!(e, SyncError::Ipvs { family: Family::V4, .. }), "{e}");
        let rep = b.sync(&[model(&["10.180.0.1", "10.180.0.2"], false)], &node(), false).unwrap();
        assert!(rep.full, "the state after a refusal is read again");
        assert_eq!(reals(&k, &vk("172.30.0.10", 80)).len(), 2);
    }

    #[test]
    fn drift_is_a_missing_canary() {
        let k = Recording::default();
        let r = exec::Recording::new();
        let mut b = backend(&k, &r);
        b.counter = Box::new(crate::nfcount::Fake(|_, t, _| if t == "nat" { Some(0) } else { Some(1) }));
        assert!(!b.drifted(), "nothing applied, nothing to check");
        b.sync(&[model(&["10.180.0.1"], false)], &node(), false).unwrap();
        assert!(b.drifted());
        let rep = b.sync(&[model(&["10.180.0.1"], false)], &node(), false).unwrap();
        assert!(rep.full);
    }
}
