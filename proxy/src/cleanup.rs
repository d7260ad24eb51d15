//! `--cleanup` and mode switches: remove every rule ferro-proxy (or kube-proxy, whose names it
//! shares) made, in every mode, from this network namespace. Pure parts compute the removal
//! from what `iptables-save` / `nft list tables` print; [`cleanup`] runs them through a
//! [`Runner`].

use std::fmt::Write as _;

use crate::error::ExecError;
use crate::exec::Runner;
use crate::model::Family;

/// Chains of the kube-proxy layout that are not per service (both iptables-writing modes).
const FIXED_CHAINS: [&str; 13] = [
    "KUBE-SERVICES",
    "KUBE-EXTERNAL-SERVICES",
    "KUBE-NODEPORTS",
    "KUBE-POSTROUTING",
    "KUBE-MARK-MASQ",
    "KUBE-FORWARD",
    "KUBE-PROXY-FIREWALL",
    "KUBE-PROXY-CANARY",
    "KUBE-LOAD-BALANCER",
    "KUBE-MARK-DROP",
    "KUBE-NODE-PORT",
    "KUBE-SOURCE-RANGES-FIREWALL",
    "KUBE-IPVS-FILTER",
];
/// Prefixes of the per-service and per-endpoint chains.
const CHAIN_PREFIXES: [&str; 5] = ["KUBE-SVC-", "KUBE-SVL-", "KUBE-EXT-", "KUBE-FW-", "KUBE-SEP-"];

/// Whether a chain is one of the proxy's.
pub fn is_proxy_chain(name: &str) -> bool {
    FIXED_CHAINS.contains(&name) || CHAIN_PREFIXES.iter().any(|p| name.starts_with(p))
}

/// Whether `mode` writes chain `chain` of `table` (iptables mode and IPVS mode share some
/// names, each in its own tables).
pub fn written_by(mode: crate::config::Mode, table: &str, chain: &str) -> bool {
    use crate::config::Mode;
    if chain == crate::iptables::rules::KUBE_PROXY_CANARY {
        return mode != Mode::Nftables;
    }
    match (mode, table) {
        (Mode::Iptables, "nat") => {
            ["KUBE-SERVICES", "KUBE-NODEPORTS", "KUBE-POSTROUTING", "KUBE-MARK-MASQ"].contains(&chain)
                || CHAIN_PREFIXES.iter().any(|p| chain.starts_with(p))
        }
        (Mode::Iptables, "filter") => {
            ["KUBE-SERVICES", "KUBE-EXTERNAL-SERVICES", "KUBE-NODEPORTS", "KUBE-FORWARD", "KUBE-PROXY-FIREWALL"].contains(&chain)
        }
        (Mode::Ipvs, "nat") => crate::ipvs::rules::NAT_CHAINS.contains(&chain),
        (Mode::Ipvs, "filter") => crate::ipvs::rules::FILTER_CHAINS.contains(&chain),
        _ => false,
    }
}

/// From `iptables-save` output (any tables), the `iptables-restore --noflush` text that deletes
/// the jumps from the built-in chains into proxy chains, then flushes and deletes every proxy
/// chain. None when there is nothing to remove.
pub fn iptables_removal(saved: &str) -> Option<String> {
    removal_where(saved, |_, c| is_proxy_chain(c))
}

/// As [`iptables_removal`], for the proxy chains `remove(table, chain)` selects: jumps into
/// them from any chain that stays are deleted.
pub fn removal_where(saved: &str, remove: impl Fn(&str, &str) -> bool) -> Option<String> {
    let mut out = String::new();
    let mut table: Option<&str> = None;
    let mut chains: Vec<&str> = Vec::new();
    let mut deletes: Vec<String> = Vec::new();
    let mut any = false;
    let flush = |out: &mut String, table: Option<&str>, chains: &mut Vec<&str>, deletes: &mut Vec<String>| {
        if let Some(t) = table {
            if !chains.is_empty() || !deletes.is_empty() {
                let _ = writeln!(out, "*{t}");
                for c in chains.iter() {
                    let _ = writeln!(out, ":{c} - [0:0]");
                }
                for d in deletes.iter() {
                    let _ = writeln!(out, "{d}");
                }
                for c in chains.iter() {
                    let _ = writeln!(out, "-X {c}");
                }
                let _ = writeln!(out, "COMMIT");
            }
        }
        chains.clear();
        deletes.clear();
    };
    for line in saved.lines() {
        if let Some(t) = line.strip_prefix('*') {
            flush(&mut out, table, &mut chains, &mut deletes);
            table = Some(t.trim());
        } else if let Some(rest) = line.strip_prefix(':') {
            let name = rest.split_whitespace().next().unwrap_or_default();
            if is_proxy_chain(name) && remove(table.unwrap_or_default(), name) {
                chains.push(name);
                any = true;
            }
        } else if let Some(rule) = line.strip_prefix("-A ") {
            let mut parts = rule.split_whitespace();
            let chain = parts.next().unwrap_or_default();
            let target = rule.split(" -j ").nth(1).and_then(|t| t.split_whitespace().next()).unwrap_or_default();
            let t = table.unwrap_or_default();
            let removed = |c: &str| is_proxy_chain(c) && remove(t, c);
            // Rules inside removed chains go with the flush; jumps from other chains are deleted.
            if !removed(chain) && removed(target) {
                deletes.push(format!("-D {rule}"));
                any = true;
            }
        }
    }
    flush(&mut out, table, &mut chains, &mut deletes);
    any.then_some(out)
}

/// The nftables tables ferro-proxy owns, from `nft list tables` output.
pub fn nft_tables(listed: &str) -> Vec<String> {
    listed
        .lines()
        .filter_map(|l| {
            let mut w = l.split_whitespace();
            match (w.next(), w.next(), w.next()) {
                (Some("table"), Some(fam @ ("ip" | "ip6")), Some("kube-proxy")) => Some(format!("{fam} kube-proxy")),
                _ => None,
            }
        })
        .collect()
}

fn tools(family: Family) -> (&'static str, &'static str) {
    match family {
        Family::V4 => ("iptables-save", "iptables-restore"),
        Family::V6 => ("ip6tables-save", "ip6tables-restore"),
    }
}

/// Removes the iptables rules of one family (all tables). Returns whether anything was there.
pub fn cleanup_iptables(runner: &mut dyn Runner, family: Family) -> Result<bool, ExecError> {
    cleanup_iptables_where(runner, family, |_, c| is_proxy_chain(c))
}

/// Removes the proxy chains `remove(table, chain)` selects, with the jumps into them.
pub fn cleanup_iptables_where(runner: &mut dyn Runner, family: Family, remove: impl Fn(&str, &str) -> bool) -> Result<bool, ExecError> {
    let (save, restore) = tools(family);
    let saved = runner.run(save, &[], None)?;
    match removal_where(&saved, remove) {
        Some(text) => {
            runner.run(restore, &["-w", "--noflush"], Some(&text))?;
            Ok(true)
        }
        None => Ok(false),
    }
}

/// Deletes ferro-proxy's nftables tables. Returns whether anything was there.
pub fn cleanup_nftables(runner: &mut dyn Runner) -> Result<bool, ExecError> {
    let tables = nft_tables(&runner.run("nft", &["list", "tables"], None)?);
    if tables.is_empty() {
        return Ok(false);
    }
    let mut text = String::new();
    for t in &tables {
        let _ = writeln!(text, "delete table {t}");
    }
    runner.run("nft", &["-f", "-"], Some(&text))?;
    Ok(true)
}

/// The ipsets IPVS mode made, from `ipset list -n` output.
pub fn ipvs_sets(listed: &str) -> Vec<String> {
    use crate::ipvs::{ipset::scratch_name, plan};
    let ours: std::collections::BTreeSet<String> = plan::SETS
        .iter()
        .flat_map(|(b, _)| [Family::V4, Family::V6].map(|f| plan::set_name(b, f)))
        .flat_map(|n| [scratch_name(&n), n])
        .collect();
    listed.lines().map(str::trim).filter(|n| ours.contains(*n)).map(str::to_string).collect()
}

/// Removes IPVS mode's ipsets (after its rules, which reference them) and its dummy link.
/// Returns whether anything was there. A host without the `ipset` tool never ran IPVS mode
/// (ferro's installer puts it in place with the proxy): nothing to remove.
pub fn cleanup_ipvs_leftovers(runner: &mut dyn Runner) -> Result<bool, ExecError> {
    let mut any = false;
    match runner.run("ipset", &["list", "-n"], None) {
        Ok(listed) => {
            let sets = ipvs_sets(&listed);
            for set in &sets {
                runner.run("ipset", &["destroy", set], None)?;
                any = true;
            }
        }
        Err(ExecError::Spawn { .. }) => {}
        Err(e) => return Err(e),
    }
    if runner.run("ip", &["-o", "link", "show", crate::ipvs::plan::DUMMY], None).is_ok() {
        runner.run("ip", &["link", "del", crate::ipvs::plan::DUMMY], None)?;
        any = true;
    }
    Ok(any)
}

/// What [`cleanup`] found and removed, per mode.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Removed {
    pub iptables: Vec<Family>,
    pub nftables: bool,
    pub ipvs: bool,
}

/// Removes every rule of every mode except `keep` (None: all). Each step is tried even if
/// another failed; the first error is returned after all were tried.
pub fn cleanup(runner: &mut dyn Runner, keep: Option<crate::config::Mode>, families: &[Family]) -> Result<Removed, ExecError> {
    use crate::config::Mode;
    let mut removed = Removed::default();
    let mut first_err = None;
    // iptables mode and IPVS mode both write iptables chains, some with the same names: a
    // kept mode keeps the chains it writes, everything else goes
    for f in families {
        let r = cleanup_iptables_where(runner, *f, |t, c| keep.is_none_or(|k| !written_by(k, t, c)));
        match r {
            Ok(true) => removed.iptables.push(*f),
            Ok(false) => {}
            Err(e) => {
                tracing::warn!(family = ?f, error = %e, "removing iptables rules failed");
                first_err.get_or_insert(e);
            }
        }
    }
    if keep != Some(Mode::Ipvs) {
        match cleanup_ipvs_leftovers(runner) {
            Ok(b) => removed.ipvs = b,
            Err(e) => {
                tracing::warn!(error = %e, "removing IPVS mode's sets and dummy link failed");
                first_err.get_or_insert(e);
            }
        }
    }
    if keep != Some(Mode::Nftables) {
        match cleanup_nftables(runner) {
            Ok(b) => removed.nftables = b,
            Err(e) => {
                tracing::warn!(error = %e, "removing nftables tables failed");
                first_err.get_or_insert(e);
            }
        }
    }
    match first_err {
        Some(e) => Err(e),
        None => Ok(removed),
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use crate::exec::Recording;

    const SAVED: &str = "# Generated by iptables-save v1.8.9
*mangle
:PREROUTING ACCEPT [0:0]
:KUBE-PROXY-CANARY - [0:0]
COMMIT
*filter
:INPUT ACCEPT [0:0]
:FORWARD ACCEPT [0:0]
:KUBE-FORWARD - [0:0]
:KUBE-SERVICES - [0:0]
:OTHER - [0:0]
-A INPUT -m conntrack --ctstate NEW -m comment --comment \"kubernetes service portals\" -j KUBE-SERVICES
-A FORWARD -m comment --comment \"kubernetes forwarding rules\" -j KUBE-FORWARD
-A FORWARD -j OTHER
-A KUBE-FORWARD -m conntrack --ctstate INVALID -j DROP
COMMIT
*nat
:POSTROUTING ACCEPT [0:0]
:FERRO-MASQ-0123456789ABCDEF - [0:0]
:KUBE-SVC-XPGD46QRK7WJZT7O - [0:0]
-A POSTROUTING -s 10.244.0.5/32 -j FERRO-MASQ-0123456789ABCDEF
COMMIT
";

    #[test]
    fn removal_deletes_jumps_then_chains_and_keeps_others() {
        let text = iptables_removal(SAVED).unwrap();
        assert_eq!(
            text,
            "*mangle\n:KUBE-PROXY-CANARY - [0:0]\n-X KUBE-PROXY-CANARY\nCOMMIT\n\
             *filter\n:KUBE-FORWARD - [0:0]\n:KUBE-SERVICES - [0:0]\n\
             -D INPUT -m conntrack --ctstate NEW -m comment --comment \"kubernetes service portals\" -j KUBE-SERVICES\n\
             -D FORWARD -m comment --comment \"kubernetes forwarding rules\" -j KUBE-FORWARD\n\
             -X KUBE-FORWARD\n-X KUBE-SERVICES\nCOMMIT\n\
             *nat\n:KUBE-SVC-XPGD46QRK7WJZT7O - [0:0]\n-X KUBE-SVC-XPGD46QRK7WJZT7O\nCOMMIT\n"
        );
        assert_eq!(iptables_removal("*nat\n:POSTROUTING ACCEPT [0:0]\nCOMMIT\n"), None);
    }

    fn no_dummy(r: &Recording) {
        r.answer(|c| {
            (c.line() == "ip -o link show kube-ipvs0")
                .then(|| Err(ExecError::Failed { program: "ip".into(), status: "exit 1".into(), stderr: "does not exist".into() }))
        });
    }

    #[test]
    fn cleanup_runs_every_mode_and_reports() {
        let mut r = Recording::new();
        no_dummy(&r);
        r.answer(|c| (c.program == "iptables-save").then(|| Ok(SAVED.to_string())));
        r.answer(|c| (c.line() == "ipset list -n").then(|| Ok("OTHER\nKUBE-CLUSTER-IP\nKUBE-6-LB-SOURCE-CIDR-TMP\n".into())));
        r.answer(|c| (c.line() == "nft list tables").then(|| Ok("table inet filter\ntable ip kube-proxy\ntable ip6 kube-proxy\n".into())));
        let removed = cleanup(&mut r, None, &[Family::V4, Family::V6]).unwrap();
        assert_eq!(removed, Removed { iptables: vec![Family::V4], nftables: true, ipvs: true });
        let lines: Vec<String> = r.calls().iter().map(|c| c.line()).collect();
        assert_eq!(
            lines,
            [
                "iptables-save",
                "iptables-restore -w --noflush",
                "ip6tables-save",
                "ipset list -n",
                "ipset destroy KUBE-CLUSTER-IP",
                "ipset destroy KUBE-6-LB-SOURCE-CIDR-TMP",
                "ip -o link show kube-ipvs0",
                "nft list tables",
                "nft -f -"
            ]
        );
        assert_eq!(r.calls()[8].stdin.as_deref(), Some("delete table ip kube-proxy\ndelete table ip6 kube-proxy\n"));
    }

    #[test]
    fn switching_modes_keeps_the_new_modes_rules() {
        let mut r = Recording::new();
        no_dummy(&r);
        r.answer(|c| (c.line() == "nft list tables").then(|| Ok("table ip kube-proxy\n".into())));
        cleanup(&mut r, Some(crate::config::Mode::Nftables), &[Family::V4]).unwrap();
        let lines: Vec<String> = r.calls().iter().map(|c| c.line()).collect();
        assert_eq!(lines, ["iptables-save", "ipset list -n", "ip -o link show kube-ipvs0"]);
        let mut r = Recording::new();
        no_dummy(&r);
        cleanup(&mut r, Some(crate::config::Mode::Iptables), &[Family::V4]).unwrap();
        let lines: Vec<String> = r.calls().iter().map(|c| c.line()).collect();
        assert_eq!(lines, ["iptables-save", "ipset list -n", "ip -o link show kube-ipvs0", "nft list tables"]);
        let mut r = Recording::new();
        cleanup(&mut r, Some(crate::config::Mode::Ipvs), &[Family::V4]).unwrap();
        let lines: Vec<String> = r.calls().iter().map(|c| c.line()).collect();
        assert_eq!(lines, ["iptables-save", "nft list tables"], "IPVS mode keeps its sets and dummy");
    }

    /// iptables-save after iptables mode and IPVS mode both ran (a switch back and forth).
    const BOTH: &str = "*nat
:KUBE-SERVICES - [0:0]
:KUBE-NODEPORTS - [0:0]
:KUBE-NODE-PORT - [0:0]
:KUBE-SVC-XPGD46QRK7WJZT7O - [0:0]
-A PREROUTING -m comment --comment \"kubernetes service portals\" -j KUBE-SERVICES
-A KUBE-SERVICES -m comment --comment \"kubernetes service nodeports\" -m addrtype --dst-type LOCAL -j KUBE-NODEPORTS
-A KUBE-SERVICES -d 172.30.0.10/32 -p tcp -m tcp --dport 80 -j KUBE-SVC-XPGD46QRK7WJZT7O
-A KUBE-SERVICES -m addrtype --dst-type LOCAL -j KUBE-NODE-PORT
COMMIT
*filter
:KUBE-SERVICES - [0:0]
:KUBE-FORWARD - [0:0]
:KUBE-IPVS-FILTER - [0:0]
-A INPUT -m comment --comment \"kubernetes ipvs access filter\" -j KUBE-IPVS-FILTER
-A FORWARD -m conntrack --ctstate NEW -m comment --comment \"kubernetes service portals\" -j KUBE-SERVICES
-A FORWARD -m comment --comment \"kubernetes forwarding rules\" -j KUBE-FORWARD
COMMIT
";

    #[test]
    fn each_iptables_writing_mode_keeps_its_own_chains_of_a_shared_name() {
        let ipvs = removal_where(BOTH, |t, c| !written_by(crate::config::Mode::Ipvs, t, c)).unwrap();
        assert_eq!(
            ipvs,
            "*nat\n:KUBE-NODEPORTS - [0:0]\n:KUBE-SVC-XPGD46QRK7WJZT7O - [0:0]\n\
             -D KUBE-SERVICES -m comment --comment \"kubernetes service nodeports\" -m addrtype --dst-type LOCAL -j KUBE-NODEPORTS\n\
             -D KUBE-SERVICES -d 172.30.0.10/32 -p tcp -m tcp --dport 80 -j KUBE-SVC-XPGD46QRK7WJZT7O\n\
             -X KUBE-NODEPORTS\n-X KUBE-SVC-XPGD46QRK7WJZT7O\nCOMMIT\n\
             *filter\n:KUBE-SERVICES - [0:0]\n\
             -D FORWARD -m conntrack --ctstate NEW -m comment --comment \"kubernetes service portals\" -j KUBE-SERVICES\n\
             -X KUBE-SERVICES\nCOMMIT\n",
            "IPVS mode keeps nat KUBE-SERVICES and KUBE-NODE-PORT, filter KUBE-FORWARD and KUBE-IPVS-FILTER"
        );
        let ipt = removal_where(BOTH, |t, c| !written_by(crate::config::Mode::Iptables, t, c)).unwrap();
        assert_eq!(
            ipt,
            "*nat\n:KUBE-NODE-PORT - [0:0]\n\
             -D KUBE-SERVICES -m addrtype --dst-type LOCAL -j KUBE-NODE-PORT\n-X KUBE-NODE-PORT\nCOMMIT\n\
             *filter\n:KUBE-IPVS-FILTER - [0:0]\n\
             -D INPUT -m comment --comment \"kubernetes ipvs access filter\" -j KUBE-IPVS-FILTER\n-X KUBE-IPVS-FILTER\nCOMMIT\n"
        );
    }

    #[test]
    fn a_failing_step_does_not_stop_the_others() {
        let mut r = Recording::new();
        r.answer(|c| {
            (c.program == "iptables-save")
                .then(|| Err(ExecError::Failed { program: "iptables-save".into(), status: "exit 1".into(), stderr: "no".into() }))
        });
        no_dummy(&r);
        r.answer(|c| (c.line() == "nft list tables").then(|| Ok("table ip kube-proxy\n".into())));
        assert!(cleanup(&mut r, None, &[Family::V4]).is_err());
        assert!(r.calls().iter().any(|c| c.line() == "nft -f -"));
    }
}
