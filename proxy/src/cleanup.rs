//! `--cleanup` and mode switches: remove every rule ferro-proxy (or kube-proxy, whose names it
//! shares) made, in every mode, from this network namespace. Pure parts compute the removal
//! from what `iptables-save` / `nft list tables` print; [`cleanup`] runs them through a
//! [`Runner`].

use std::fmt::Write as _;

use crate::error::ExecError;
use crate::exec::Runner;
use crate::model::Family;

/// Chains of the kube-proxy layout that are not per service.
const FIXED_CHAINS: [&str; 10] = [
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
];
/// Prefixes of the per-service and per-endpoint chains.
const CHAIN_PREFIXES: [&str; 5] = ["KUBE-SVC-", "KUBE-SVL-", "KUBE-EXT-", "KUBE-FW-", "KUBE-SEP-"];

/// Whether a chain is one of the proxy's.
pub fn is_proxy_chain(name: &str) -> bool {
    FIXED_CHAINS.contains(&name) || CHAIN_PREFIXES.iter().any(|p| name.starts_with(p))
}

/// From `iptables-save` output (any tables), the `iptables-restore --noflush` text that deletes
/// the jumps from the built-in chains into proxy chains, then flushes and deletes every proxy
/// chain. None when there is nothing to remove.
pub fn iptables_removal(saved: &str) -> Option<String> {
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
            if is_proxy_chain(name) {
                chains.push(name);
                any = true;
            }
        } else if let Some(rule) = line.strip_prefix("-A ") {
            let mut parts = rule.split_whitespace();
            let chain = parts.next().unwrap_or_default();
            let target = rule.split(" -j ").nth(1).and_then(|t| t.split_whitespace().next()).unwrap_or_default();
            // Rules inside proxy chains go with the flush; jumps from other chains are deleted.
            if !is_proxy_chain(chain) && is_proxy_chain(target) {
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
    let (save, restore) = tools(family);
    let saved = runner.run(save, &[], None)?;
    match iptables_removal(&saved) {
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

/// What [`cleanup`] found and removed, per mode.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Removed {
    pub iptables: Vec<Family>,
    pub nftables: bool,
}

/// Removes every rule of every mode except `keep` (None: all). Each step is tried even if
/// another failed; the first error is returned after all were tried.
pub fn cleanup(runner: &mut dyn Runner, keep: Option<crate::config::Mode>, families: &[Family]) -> Result<Removed, ExecError> {
    use crate::config::Mode;
    let mut removed = Removed::default();
    let mut first_err = None;
    // IPVS mode also writes iptables rules (KUBE-SERVICES with ipsets), so iptables leftovers
    // are removed unless iptables itself is kept.
    if keep != Some(Mode::Iptables) && keep != Some(Mode::Ipvs) {
        for f in families {
            match cleanup_iptables(runner, *f) {
                Ok(true) => removed.iptables.push(*f),
                Ok(false) => {}
                Err(e) => {
                    tracing::warn!(family = ?f, error = %e, "removing iptables rules failed");
                    first_err.get_or_insert(e);
                }
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

    #[test]
    fn cleanup_runs_every_mode_and_reports() {
        let mut r = Recording::new();
        r.answer(|c| (c.program == "iptables-save").then(|| Ok(SAVED.to_string())));
        r.answer(|c| (c.line() == "nft list tables").then(|| Ok("table inet filter\ntable ip kube-proxy\ntable ip6 kube-proxy\n".into())));
        let removed = cleanup(&mut r, None, &[Family::V4, Family::V6]).unwrap();
        assert_eq!(removed, Removed { iptables: vec![Family::V4], nftables: true });
        let lines: Vec<String> = r.calls().iter().map(|c| c.line()).collect();
        assert_eq!(lines, ["iptables-save", "iptables-restore -w --noflush", "ip6tables-save", "nft list tables", "nft -f -"]);
        assert_eq!(r.calls()[4].stdin.as_deref(), Some("delete table ip kube-proxy\ndelete table ip6 kube-proxy\n"));
    }

    #[test]
    fn switching_modes_keeps_the_new_modes_rules() {
        let mut r = Recording::new();
        r.answer(|c| (c.line() == "nft list tables").then(|| Ok("table ip kube-proxy\n".into())));
        cleanup(&mut r, Some(crate::config::Mode::Nftables), &[Family::V4]).unwrap();
        let lines: Vec<String> = r.calls().iter().map(|c| c.line()).collect();
        assert_eq!(lines, ["iptables-save"]);
        let mut r = Recording::new();
        cleanup(&mut r, Some(crate::config::Mode::Iptables), &[Family::V4]).unwrap();
        let lines: Vec<String> = r.calls().iter().map(|c| c.line()).collect();
        assert_eq!(lines, ["nft list tables"]);
    }

    #[test]
    fn a_failing_step_does_not_stop_the_others() {
        let mut r = Recording::new();
        r.answer(|c| {
            (c.program == "iptables-save")
                .then(|| Err(ExecError::Failed { program: "iptables-save".into(), status: "exit 1".into(), stderr: "no".into() }))
        });
        r.answer(|c| (c.line() == "nft list tables").then(|| Ok("table ip kube-proxy\n".into())));
        assert!(cleanup(&mut r, None, &[Family::V4]).is_err());
        assert!(r.calls().iter().any(|c| c.line() == "nft -f -"));
    }
}
