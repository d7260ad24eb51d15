//! CNI commands: environment parsing and dispatch. Host paths come from the config, so
//! tests point them at a temp dir.

use serde_json::Value;

use crate::config::{self, IpamConf, NetConf};
use crate::dataplane::{ContainerLink, Dataplane, LinkInfo};
use crate::delegate;
use crate::error::CniError;
use crate::ipam::Store;
use crate::masq::{self, MasqSpec};
use crate::plan::{self, BridgeSpec, VethSpec};
use crate::result::CniResult;

/// `CNI_COMMAND`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Command {
    Add,
    Del,
    Check,
    Status,
    Gc,
    Version,
}

impl Command {
    pub fn parse(s: &str) -> Result<Command, CniError> {
        Ok(match s {
            "ADD" => Command::Add,
            "DEL" => Command::Del,
            "CHECK" => Command::Check,
            "STATUS" => Command::Status,
            "GC" => Command::Gc,
            "VERSION" => Command::Version,
            other => {
                return Err(CniError::InvalidEnv {
                    name: "CNI_COMMAND".into(),
                    reason: format!("unknown command {other:?}"),
                })
            }
        })
    }
}

/// The `CNI_*` environment of one invocation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CniEnv {
    pub command: Command,
    pub container_id: Option<String>,
    pub netns: Option<String>,
    pub ifname: Option<String>,
    pub args: Option<String>,
    pub path: Option<String>,
}

fn missing(name: &str) -> CniError {
    CniError::InvalidEnv {
        name: name.into(),
        reason: "required but not set".into(),
    }
}

impl CniEnv {
    /// Reads and checks the variables `command` requires (spec: ADD and CHECK need
    /// CONTAINERID, NETNS, IFNAME, PATH; DEL all but NETNS; VERSION, STATUS and GC none).
    pub fn from_vars(get: impl Fn(&str) -> Option<String>) -> Result<CniEnv, CniError> {
        let get = |k: &str| get(k).filter(|v| !v.is_empty());
        let command = Command::parse(&get("CNI_COMMAND").ok_or_else(|| missing("CNI_COMMAND"))?)?;
        let env = CniEnv {
            command,
            container_id: get("CNI_CONTAINERID"),
            netns: get("CNI_NETNS"),
            ifname: get("CNI_IFNAME"),
            args: get("CNI_ARGS"),
            path: get("CNI_PATH"),
        };
        let (need_id, need_netns, need_if, need_path) = match command {
            Command::Add | Command::Check => (true, true, true, true),
            Command::Del => (true, false, true, true),
            Command::Status | Command::Gc | Command::Version => (false, false, false, false),
        };
        if need_id && env.container_id.is_none() {
            return Err(missing("CNI_CONTAINERID"));
        }
        if need_netns && env.netns.is_none() {
            return Err(missing("CNI_NETNS"));
        }
        if need_if && env.ifname.is_none() {
            return Err(missing("CNI_IFNAME"));
        }
        if need_path && env.path.is_none() {
            return Err(missing("CNI_PATH"));
        }
        if let Some(id) = &env.container_id {
            if !id
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '-'))
            {
                return Err(CniError::InvalidEnv {
                    name: "CNI_CONTAINERID".into(),
                    reason: format!("{id:?} may only contain letters, digits, '_', '.' and '-'"),
                });
            }
        }
        if let Some(ifname) = &env.ifname {
            if ifname.len() > 15
                || ifname.contains(['/', ' ', ':'])
                || ifname == "."
                || ifname == ".."
            {
                return Err(CniError::InvalidEnv {
                    name: "CNI_IFNAME".into(),
                    reason: format!("{ifname:?} is not a valid interface name"),
                });
            }
        }
        Ok(env)
    }
}

/// The VERSION answer.
pub fn version_info() -> Value {
    serde_json::json!({
        "cniVersion": config::CURRENT_VERSION,
        "supportedVersions": config::SUPPORTED_VERSIONS,
    })
}

/// Runs one command that needs no dataplane (VERSION, STATUS, and GC of the IPAM store
/// only). ADD, DEL and CHECK need [`run_with`]; here they fail with code 199.
pub fn run(env: &CniEnv, conf: &NetConf) -> Result<Option<Value>, CniError> {
    if env.command == Command::Gc {
        conf.validate()?;
        return gc_ipam(env, conf).map(|_| None);
    }
    run_with(env, conf, || {
        Err::<NoDataplane, _>(CniError::NotImplemented(
            "ADD/DEL without a dataplane".into(),
        ))
    })
}

/// Placeholder dataplane type for [`run`]; never constructed.
pub enum NoDataplane {}

impl Dataplane for NoDataplane {
    fn check_netns(&mut self, _: &str) -> Result<(), CniError> {
        match *self {}
    }
    fn ensure_bridge(&mut self, _: &BridgeSpec) -> Result<LinkInfo, CniError> {
        match *self {}
    }
    fn enable_forwarding(&mut self, _: bool, _: bool) -> Result<(), CniError> {
        match *self {}
    }
    fn create_veth(&mut self, _: &VethSpec, _: u32) -> Result<(LinkInfo, LinkInfo), CniError> {
        match *self {}
    }
    fn host_link(&mut self, _: &str) -> Result<Option<LinkInfo>, CniError> {
        match *self {}
    }
    fn delete_host_link(&mut self, _: &str) -> Result<bool, CniError> {
        match *self {}
    }
    fn delete_container_link(&mut self, _: &str, _: &str) -> Result<(), CniError> {
        match *self {}
    }
    fn release_links(&mut self, _: Option<&str>, _: &str, _: &str) -> Result<(), CniError> {
        match *self {}
    }
    fn container_link(&mut self, _: &str, _: &str) -> Result<Option<ContainerLink>, CniError> {
        match *self {}
    }
    fn ensure_masq(&mut self, _: &MasqSpec) -> Result<(), CniError> {
        match *self {}
    }
    fn remove_masq(&mut self, _: &str, _: bool) -> Result<(), CniError> {
        match *self {}
    }
    fn verify_masq(&mut self, _: &MasqSpec) -> Result<(), CniError> {
        match *self {}
    }
    fn gc_masq(&mut self, _: &str, _: &[String], _: bool) -> Result<Vec<String>, CniError> {
        match *self {}
    }
    fn gc_host_veths(&mut self, _: &str, _: &[String]) -> Result<Vec<String>, CniError> {
        match *self {}
    }
}

/// Runs one command; `dataplane` is called only for ADD, DEL, CHECK and GC (after
/// validation). `Ok(Some(v))` is printed on stdout.
pub fn run_with<D: Dataplane>(
    env: &CniEnv,
    conf: &NetConf,
    dataplane: impl FnOnce() -> Result<D, CniError>,
) -> Result<Option<Value>, CniError> {
    if env.command == Command::Version {
        return Ok(Some(version_info()));
    }
    conf.validate()?;
    match env.command {
        Command::Version => Ok(Some(version_info())),
        Command::Add => {
            let result = add(env, conf, &mut dataplane()?)?;
            Ok(Some(result.render(&conf.cni_version)))
        }
        Command::Del => del(env, conf, &mut dataplane()?).map(|()| None),
        Command::Check => check(env, conf, &mut dataplane()?).map(|()| None),
        Command::Status => status(env, conf),
        Command::Gc => gc(env, conf, &mut dataplane()?).map(|_| None),
    }
}

fn required<'a>(v: &'a Option<String>, name: &str) -> Result<&'a str, CniError> {
    v.as_deref().ok_or_else(|| missing(name))
}

/// The delegated IPAM plugin of `conf`, found in `CNI_PATH`; `None` for the built-in IPAM.
fn delegated_ipam(env: &CniEnv, conf: &NetConf) -> Result<Option<std::path::PathBuf>, CniError> {
    let Some(IpamConf::Delegate { plugin_type, .. }) = &conf.ipam else {
        return Ok(None);
    };
    let path = required(&env.path, "CNI_PATH")?;
    delegate::find_plugin(path, plugin_type).map(Some)
}

/// Bridge-mode ADD. Order: check the netns (code 4 if it cannot be opened, before anything
/// is created), reserve addresses (built-in IPAM, or the delegated plugin's ADD), bridge,
/// forwarding, veth, masquerade chains (ipMasq). Any failure after the reservation removes
/// the masquerade chains, deletes the veth and releases addresses this ADD reserved (with a
/// delegated plugin: its DEL).
pub fn add<D: Dataplane>(env: &CniEnv, conf: &NetConf, dp: &mut D) -> Result<CniResult, CniError> {
    let id = required(&env.container_id, "CNI_CONTAINERID")?;
    let netns = required(&env.netns, "CNI_NETNS")?;
    let ifname = required(&env.ifname, "CNI_IFNAME")?;
    dp.check_netns(netns)?;
    if let Some(plugin) = delegated_ipam(env, conf)? {
        let stdin = conf.raw_bytes();
        let out = delegate::exec(&plugin, "ADD", env, &stdin)?.ok_or_else(|| {
            CniError::InvalidConfig(format!(
                "ipam plugin {} printed no result",
                plugin.display()
            ))
        })?;
        let outcome = delegate::allocations(&out).and_then(|(allocs, ipam)| {
            let applied = plan::plan_add(conf, id, netns, ifname, &allocs).and_then(|mut plan| {
                merge_ipam_result(&mut plan, ipam, conf.dns.is_none());
                apply_add(dp, plan)
            });
            if applied.is_err() {
                rollback_dataplane(dp, conf, id, ifname, allocs.iter().map(|a| a.ip));
            }
            applied
        });
        if outcome.is_err() {
            let _ = delegate::exec(&plugin, "DEL", env, &stdin);
        }
        return outcome;
    }
    let sets = conf
        .range_sets()?
        .ok_or_else(|| CniError::InvalidConfig("no ipam ranges".into()))?;
    let store = Store::new(conf.data_dir(), &conf.name, sets);
    let (allocs, held_before) = store.allocate_noting_held(id, ifname)?;
    let outcome =
        plan::plan_add(conf, id, netns, ifname, &allocs).and_then(|plan| apply_add(dp, plan));
    match outcome {
        Ok(r) => Ok(r),
        Err(e) => {
            rollback_dataplane(dp, conf, id, ifname, allocs.iter().map(|a| a.ip));
            if !held_before {
                let _ = store.release(id, ifname);
            }
            Err(e)
        }
    }
}

/// Adds the routes (and DNS, when the config has none) of a delegated IPAM result to the
/// plan: the container gets them and the result reports them.
fn merge_ipam_result(plan: &mut plan::AddPlan, ipam: CniResult, take_dns: bool) {
    for r in ipam.routes {
        if !plan.veth.routes.iter().any(|x| x.dst == r.dst) {
            plan.veth.routes.push(r.clone());
            plan.result.routes.push(r);
        }
    }
    if take_dns && !ipam.dns.is_empty() {
        plan.result.dns = ipam.dns;
    }
}

/// Undoes the dataplane part of a failed ADD: masquerade chains, then the veth.
fn rollback_dataplane<D: Dataplane>(
    dp: &mut D,
    conf: &NetConf,
    id: &str,
    ifname: &str,
    ips: impl Iterator<Item = std::net::IpAddr>,
) {
    if conf.ip_masq {
        let chain = masq::chain_name(&conf.name, id);
        for v6 in masq_families(ips) {
            let _ = dp.remove_masq(&chain, v6);
        }
    }
    let _ = dp.delete_host_link(&plan::host_veth_name(id, ifname));
}

fn apply_add<D: Dataplane>(dp: &mut D, plan: plan::AddPlan) -> Result<CniResult, CniError> {
    let bridge = dp.ensure_bridge(&plan.bridge)?;
    if plan.forward_v4 || plan.forward_v6 {
        dp.enable_forwarding(plan.forward_v4, plan.forward_v6)?;
    }
    let (host, cont) = dp.create_veth(&plan.veth, bridge.index)?;
    for m in &plan.masq {
        dp.ensure_masq(m)?;
    }
    // A bridge without a MAC of its own (one ferro-cni did not create) takes its ports'
    // lowest: read it again when the new port's is lower.
    let bridge_mac = match (&bridge.mac, &host.mac) {
        (Some(b), Some(h)) if h.as_str() >= b.as_str() => bridge.mac.clone(),
        _ => dp
            .host_link(&plan.bridge.name)?
            .and_then(|l| l.mac)
            .or(bridge.mac),
    };
    let mut result = plan.result;
    for (iface, mac) in result
        .interfaces
        .iter_mut()
        .zip([bridge_mac, host.mac, cont.mac])
    {
        iface.mac = mac;
    }
    Ok(result)
}

/// Bridge-mode CHECK against `prevResult`: the addresses are still reserved for this
/// attachment (with a delegated plugin: its CHECK passes), the bridge and host veth exist,
/// the container interface matches, and with ipMasq each address's masquerade chain and
/// jump are as ADD installed them.
pub fn check<D: Dataplane>(env: &CniEnv, conf: &NetConf, dp: &mut D) -> Result<(), CniError> {
    let id = required(&env.container_id, "CNI_CONTAINERID")?;
    let netns = required(&env.netns, "CNI_NETNS")?;
    let ifname = required(&env.ifname, "CNI_IFNAME")?;
    let prev = conf
        .prev_result
        .as_ref()
        .ok_or_else(|| CniError::InvalidConfig("CHECK needs prevResult".into()))?;
    let prev = CniResult::from_prev(prev)?;
    if let Some(plugin) = delegated_ipam(env, conf)? {
        delegate::exec(&plugin, "CHECK", env, &conf.raw_bytes())?;
    } else {
        let held = Store::new(conf.data_dir(), &conf.name, Vec::new()).find(id, ifname)?;
        for ip in &prev.ips {
            if !held.contains(&ip.address.addr()) {
                return Err(CniError::CheckFailed(format!(
                    "{} is not reserved for {id}/{ifname}",
                    ip.address.addr()
                )));
            }
        }
    }
    for name in [conf.bridge.clone(), plan::host_veth_name(id, ifname)] {
        if dp.host_link(&name)?.is_none() {
            return Err(CniError::CheckFailed(format!(
                "{name} does not exist in the node namespace"
            )));
        }
    }
    let observed = dp.container_link(netns, ifname)?;
    plan::verify_container(&prev, netns, ifname, observed.as_ref())?;
    if conf.ip_masq {
        for ip in &prev.ips {
            let a = ip.address;
            dp.verify_masq(&MasqSpec::new(&conf.name, id, a.addr(), a.prefix_len()))?;
        }
    }
    Ok(())
}

/// The families (`false` = IPv4, `true` = IPv6) among `ips`, IPv4 first.
fn masq_families(ips: impl Iterator<Item = std::net::IpAddr>) -> Vec<bool> {
    let ips: Vec<_> = ips.collect();
    [false, true]
        .into_iter()
        .filter(|v6| ips.iter().any(|ip| ip.is_ipv6() == *v6))
        .collect()
}

/// Bridge-mode DEL, idempotent: with ipMasq removes the masquerade jump and chain, deletes
/// the container's interface if the namespace and link still exist (the pair goes with it),
/// the host end if it is still around, then releases the addresses (with a delegated
/// plugin: its DEL, whose error is passed through). Missing pieces are not errors.
pub fn del<D: Dataplane>(env: &CniEnv, conf: &NetConf, dp: &mut D) -> Result<(), CniError> {
    let id = required(&env.container_id, "CNI_CONTAINERID")?;
    let ifname = required(&env.ifname, "CNI_IFNAME")?;
    let delegated = delegated_ipam(env, conf)?;
    if conf.ip_masq {
        // The families to clean: those of the configured ranges (when they still resolve),
        // of the addresses still reserved and of prevResult; IPv4 when none is known, both
        // with a delegated plugin and no prevResult.
        let mut ips = Vec::new();
        if delegated.is_none() {
            ips = Store::new(conf.data_dir(), &conf.name, Vec::new()).find(id, ifname)?;
            if let Ok(Some(sets)) = conf.range_sets() {
                ips.extend(
                    sets.iter()
                        .flat_map(|s| s.0.iter().map(|r| r.subnet.addr())),
                );
            }
        }
        if let Some(prev) = conf
            .prev_result
            .as_ref()
            .and_then(|p| CniResult::from_prev(p).ok())
        {
            ips.extend(prev.ips.iter().map(|i| i.address.addr()));
        }
        let mut families = masq_families(ips.into_iter());
        if families.is_empty() {
            families.push(false);
            if delegated.is_some() {
                families.push(true);
            }
        }
        let chain = masq::chain_name(&conf.name, id);
        for v6 in families {
            dp.remove_masq(&chain, v6)?;
        }
    }
    dp.release_links(
        env.netns.as_deref(),
        ifname,
        &plan::host_veth_name(id, ifname),
    )?;
    match delegated {
        Some(plugin) => delegate::exec(&plugin, "DEL", env, &conf.raw_bytes()).map(drop),
        None => Store::new(conf.data_dir(), &conf.name, Vec::new())
            .release(id, ifname)
            .map(drop),
    }
}

/// STATUS: ready when the ranges resolve (for `podCIDR: "node"`, when ferro-netd has written
/// the subnet file); with a delegated plugin, its STATUS decides.
fn status(env: &CniEnv, conf: &NetConf) -> Result<Option<Value>, CniError> {
    if let Some(plugin) = delegated_ipam(env, conf)? {
        return delegate::exec(&plugin, "STATUS", env, &conf.raw_bytes()).map(|_| None);
    }
    conf.range_sets()
        .map_err(|e| CniError::NotAvailable(e.details()))?;
    Ok(None)
}

/// The `cni.dev/valid-attachments` of a GC config as (containerID, ifname) pairs.
pub fn valid_attachments(conf: &NetConf) -> Result<Vec<(String, String)>, CniError> {
    let Some(list) = conf.extra.get("cni.dev/valid-attachments") else {
        return Ok(Vec::new());
    };
    let Value::Array(items) = list else {
        return Err(CniError::InvalidConfig(
            "cni.dev/valid-attachments must be a list".into(),
        ));
    };
    items
        .iter()
        .enumerate()
        .map(|(i, item)| {
            let field = |k: &str| item.get(k).and_then(Value::as_str).map(str::to_string);
            match (field("containerID"), field("ifname")) {
                (Some(c), Some(n)) => Ok((c, n)),
                _ => Err(CniError::InvalidConfig(format!(
                    "cni.dev/valid-attachments[{i}] needs string containerID and ifname"
                ))),
            }
        })
        .collect()
}

/// GC of the addresses: releases every reservation of the built-in store not owned by a
/// valid attachment (returns them), or passes GC to the delegated plugin.
pub fn gc_ipam(env: &CniEnv, conf: &NetConf) -> Result<Vec<std::net::IpAddr>, CniError> {
    let valid = valid_attachments(conf)?;
    if let Some(plugin) = delegated_ipam(env, conf)? {
        delegate::exec(&plugin, "GC", env, &conf.raw_bytes())?;
        return Ok(Vec::new());
    }
    Store::new(conf.data_dir(), &conf.name, Vec::new()).gc(&valid)
}

/// What a GC removed.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct GcReport {
    pub addresses: Vec<std::net::IpAddr>,
    pub masq_chains: Vec<String>,
    pub host_veths: Vec<String>,
}

/// GC: the addresses ([`gc_ipam`]), the masquerade chains of this network (both families)
/// and the host veths on the bridge of every attachment not in `cni.dev/valid-attachments`.
pub fn gc<D: Dataplane>(env: &CniEnv, conf: &NetConf, dp: &mut D) -> Result<GcReport, CniError> {
    let valid = valid_attachments(conf)?;
    let keep_chains: Vec<String> = valid
        .iter()
        .map(|(c, _)| masq::chain_name(&conf.name, c))
        .collect();
    let keep_veths: Vec<String> = valid
        .iter()
        .map(|(c, i)| plan::host_veth_name(c, i))
        .collect();
    let mut report = GcReport {
        host_veths: dp.gc_host_veths(&conf.bridge, &keep_veths)?,
        ..GcReport::default()
    };
    for v6 in [false, true] {
        report
            .masq_chains
            .extend(dp.gc_masq(&conf.name, &keep_chains, v6)?);
    }
    report.addresses = gc_ipam(env, conf)?;
    Ok(report)
}
