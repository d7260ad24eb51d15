//! ipMasq: the per-container masquerade chain in the node namespace's nat table.
//!
//! Everything here except [`Iptables`] is pure: the chain name, the parsing of
//! `iptables-save -t nat` output and the `iptables-restore --noflush` input that ADD and DEL
//! apply in one atomic step each. [`Iptables`] only runs the save/restore binaries.
//!
//! Layout (as the reference bridge plugin's ipMasq, in ferro's own chain names):
//! ```text
//! -A POSTROUTING -s <pod ip>/32 -m comment --comment "name: <net> id: <ctr>" -j FERRO-MASQ-<h>
//! -A FERRO-MASQ-<h> -d <subnet> -m comment --comment "name: <net> id: <ctr>" -j ACCEPT
//! -A FERRO-MASQ-<h> ! -d 224.0.0.0/4 -m comment --comment "name: <net> id: <ctr>" -j MASQUERADE
//! ```

use std::io::{self, Write};
use std::net::IpAddr;
use std::path::PathBuf;
use std::process::{Command, Stdio};

use ipnet::IpNet;

use crate::error::CniError;

/// Prefix of every chain ferro-cni creates for ipMasq.
pub const CHAIN_PREFIX: &str = "FERRO-MASQ-";

/// The kernel's limit on chain names (29 bytes with the trailing NUL).
pub const MAX_CHAIN_LEN: usize = 28;

/// FNV-1a (64 bit) with a 0 byte between parts; stable across Rust releases.
fn fnv1a64(parts: &[&str]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for (i, p) in parts.iter().enumerate() {
        if i > 0 {
            h = h.wrapping_mul(0x0100_0000_01b3);
        }
        for b in p.bytes() {
            h ^= u64::from(b);
            h = h.wrapping_mul(0x0100_0000_01b3);
        }
    }
    h
}

/// `FERRO-MASQ-` + 16 hex digits of a hash of (network, containerID): 27 characters.
pub fn chain_name(network: &str, container_id: &str) -> String {
    format!("{CHAIN_PREFIX}{:016X}", fnv1a64(&[network, container_id]))
}

/// The comment on every rule of one attachment. Network names and container ids are
/// validated to `[A-Za-z0-9_.-]`, so the text needs no escaping inside double quotes.
pub fn comment(network: &str, container_id: &str) -> String {
    format!("name: {network} id: {container_id}")
}

/// One family's masquerade rules for one container.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MasqSpec {
    pub chain: String,
    pub comment: String,
    pub pod_ip: IpAddr,
    /// The subnet of the range the address came from; traffic to it is not masqueraded.
    pub subnet: IpNet,
}

impl MasqSpec {
    pub fn new(network: &str, container_id: &str, pod_ip: IpAddr, prefix: u8) -> MasqSpec {
        let subnet = IpNet::new(pod_ip, prefix)
            .unwrap_or_else(|_| IpNet::from(pod_ip))
            .trunc();
        MasqSpec {
            chain: chain_name(network, container_id),
            comment: comment(network, container_id),
            pod_ip,
            subnet,
        }
    }

    pub fn is_v6(&self) -> bool {
        self.pod_ip.is_ipv6()
    }
}

/// What `iptables-save -t nat` shows of one chain.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Observed {
    /// The chain is declared (`:CHAIN - [0:0]`).
    pub chain_exists: bool,
    /// POSTROUTING rules jumping to the chain, as rule specs after `-A POSTROUTING `.
    pub jumps: Vec<String>,
}

/// Reads the state of `chain` from `iptables-save -t nat` output.
pub fn observe(save: &str, chain: &str) -> Observed {
    let mut o = Observed::default();
    let mut in_nat = false;
    let jump = format!("-j {chain}");
    for line in save.lines() {
        let line = line.trim_end();
        if let Some(table) = line.strip_prefix('*') {
            in_nat = table == "nat";
            continue;
        }
        if !in_nat {
            continue;
        }
        if let Some(decl) = line.strip_prefix(':') {
            if decl.split_whitespace().next() == Some(chain) {
                o.chain_exists = true;
            }
        } else if let Some(rule) = line.strip_prefix("-A POSTROUTING ") {
            if rule.ends_with(&jump) || rule.contains(&format!("{jump} ")) {
                o.jumps.push(rule.to_string());
            }
        }
    }
    o
}

fn host_net(ip: IpAddr) -> String {
    match ip {
        IpAddr::V4(_) => format!("{ip}/32"),
        IpAddr::V6(_) => format!("{ip}/128"),
    }
}

/// The `iptables-restore --noflush` input for ADD: drops jumps to the chain left by an earlier
/// ADD of the same container (so a repeated ADD does not duplicate them), declares (and so
/// empties) the chain, fills it and adds the jump. Applied as one transaction.
pub fn render_add(spec: &MasqSpec, observed: &Observed) -> String {
    let c = &spec.chain;
    let m = &spec.comment;
    let multicast = if spec.is_v6() {
        "ff00::/8"
    } else {
        "224.0.0.0/4"
    };
    let mut out = String::from("*nat\n");
    for j in &observed.jumps {
        out.push_str(&format!("-D POSTROUTING {j}\n"));
    }
    out.push_str(&format!(":{c} - [0:0]\n"));
    out.push_str(&format!(
        "-A {c} -d {} -m comment --comment \"{m}\" -j ACCEPT\n",
        spec.subnet
    ));
    out.push_str(&format!(
        "-A {c} ! -d {multicast} -m comment --comment \"{m}\" -j MASQUERADE\n"
    ));
    out.push_str(&format!(
        "-A POSTROUTING -s {} -m comment --comment \"{m}\" -j {c}\n",
        host_net(spec.pod_ip)
    ));
    out.push_str("COMMIT\n");
    out
}

/// The `iptables-restore --noflush` input for DEL, `None` when there is nothing to remove.
pub fn render_del(chain: &str, observed: &Observed) -> Option<String> {
    if !observed.chain_exists && observed.jumps.is_empty() {
        return None;
    }
    let mut out = String::from("*nat\n");
    for j in &observed.jumps {
        out.push_str(&format!("-D POSTROUTING {j}\n"));
    }
    if observed.chain_exists {
        out.push_str(&format!("-F {chain}\n-X {chain}\n"));
    }
    out.push_str("COMMIT\n");
    Some(out)
}

/// The nat-table lines of `save` (rules and declarations), without the table markers.
fn nat_lines(save: &str) -> Vec<&str> {
    let mut in_nat = false;
    let mut out = Vec::new();
    for line in save.lines() {
        let line = line.trim_end();
        if let Some(table) = line.strip_prefix('*') {
            in_nat = table == "nat";
        } else if in_nat && line != "COMMIT" && !line.starts_with('#') {
            out.push(line);
        }
    }
    out
}

/// CHECK of one family's masquerade rules: the chain holds exactly the rules ADD renders,
/// and POSTROUTING has exactly one jump to it, from the pod's address. `Err` describes the
/// first difference.
pub fn verify(save: &str, spec: &MasqSpec) -> Result<(), String> {
    let lines = nat_lines(save);
    let c = &spec.chain;
    if !lines.iter().any(|l| {
        l.strip_prefix(':')
            .and_then(|d| d.split_whitespace().next())
            == Some(c)
    }) {
        return Err(format!("masquerade chain {c} does not exist"));
    }
    let want: Vec<String> = render_add(spec, &Observed::default())
        .lines()
        .filter(|l| l.starts_with("-A "))
        .map(str::to_string)
        .collect();
    for w in &want {
        if !lines.contains(&w.as_str()) {
            return Err(format!("masquerade rule missing: {w}"));
        }
    }
    let in_chain = lines
        .iter()
        .filter(|l| l.starts_with(&format!("-A {c} ")))
        .count();
    let jumps = observe(save, c).jumps.len();
    let want_in_chain = want
        .iter()
        .filter(|l| l.starts_with(&format!("-A {c} ")))
        .count();
    if in_chain != want_in_chain {
        return Err(format!(
            "masquerade chain {c} has {in_chain} rules, want {want_in_chain}"
        ));
    }
    if jumps != 1 {
        return Err(format!("POSTROUTING has {jumps} jumps to {c}, want 1"));
    }
    Ok(())
}

/// GC: the FERRO-MASQ chains of `network` (recognised by the comment on their rules or on
/// the POSTROUTING jumps to them) that are not in `keep`.
pub fn stale_chains(save: &str, network: &str, keep: &[String]) -> Vec<String> {
    let lines = nat_lines(save);
    let tag = format!("--comment \"{}", comment(network, ""));
    let mut out: Vec<String> = Vec::new();
    for decl in lines.iter().filter_map(|l| l.strip_prefix(':')) {
        let Some(chain) = decl.split_whitespace().next() else {
            continue;
        };
        if !chain.starts_with(CHAIN_PREFIX) || keep.iter().any(|k| k == chain) {
            continue;
        }
        let jump = format!("-j {chain}");
        let ours = lines.iter().any(|l| {
            (l.starts_with(&format!("-A {chain} "))
                || (l.starts_with("-A POSTROUTING ")
                    && (l.ends_with(&jump) || l.contains(&format!("{jump} ")))))
                && l.contains(&tag)
        });
        if ours {
            out.push(chain.to_string());
        }
    }
    out
}

/// The `iptables-restore --noflush` input removing `chains` (jumps first) in one
/// transaction, `None` when there is nothing to remove.
pub fn render_gc(save: &str, chains: &[String]) -> Option<String> {
    let mut jumps = String::new();
    let mut flush = String::new();
    for c in chains {
        let o = observe(save, c);
        for j in &o.jumps {
            jumps.push_str(&format!("-D POSTROUTING {j}\n"));
        }
        if o.chain_exists {
            flush.push_str(&format!("-F {c}\n-X {c}\n"));
        }
    }
    if jumps.is_empty() && flush.is_empty() {
        return None;
    }
    Some(format!("*nat\n{jumps}{flush}COMMIT\n"))
}

/// Runs `iptables-save` / `iptables-restore` (or the ip6tables ones) in the current
/// namespace. The binaries are named here, not looked up elsewhere, so they are visible.
#[derive(Debug, Clone)]
pub struct Iptables {
    pub v4: (PathBuf, PathBuf),
    pub v6: (PathBuf, PathBuf),
}

impl Default for Iptables {
    /// The `iptables` of the system (`PATH` lookup), whichever backend it selects.
    fn default() -> Self {
        Iptables {
            v4: ("iptables-save".into(), "iptables-restore".into()),
            v6: ("ip6tables-save".into(), "ip6tables-restore".into()),
        }
    }
}

fn run_failed(what: &str, e: io::Error) -> CniError {
    CniError::io(format!("run {what} (is iptables installed?)"), e)
}

impl Iptables {
    fn bins(&self, v6: bool) -> &(PathBuf, PathBuf) {
        if v6 {
            &self.v6
        } else {
            &self.v4
        }
    }

    /// `iptables-save -t nat`.
    pub fn save(&self, v6: bool) -> Result<String, CniError> {
        let bin = &self.bins(v6).0;
        let what = bin.display().to_string();
        let out = Command::new(bin)
            .args(["-t", "nat"])
            .stdin(Stdio::null())
            .output()
            .map_err(|e| run_failed(&what, e))?;
        if !out.status.success() {
            return Err(CniError::io(
                format!("{what} -t nat"),
                io::Error::other(String::from_utf8_lossy(&out.stderr).trim().to_string()),
            ));
        }
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    }

    /// `iptables-restore -w --noflush` with `rules` on stdin: all or nothing.
    pub fn restore(&self, v6: bool, rules: &str) -> Result<(), CniError> {
        let bin = &self.bins(v6).1;
        let what = bin.display().to_string();
        let mut child = Command::new(bin)
            .args(["-w", "10", "--noflush"])
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .map_err(|e| run_failed(&what, e))?;
        let written = child
            .stdin
            .take()
            .ok_or_else(|| CniError::io(format!("{what} stdin"), io::Error::other("no pipe")))
            .and_then(|mut s| {
                s.write_all(rules.as_bytes())
                    .map_err(|e| CniError::io(format!("write rules to {what}"), e))
            });
        let out = child
            .wait_with_output()
            .map_err(|e| CniError::io(format!("wait for {what}"), e))?;
        written?;
        if !out.status.success() {
            return Err(CniError::io(
                format!("{what} --noflush"),
                io::Error::other(String::from_utf8_lossy(&out.stderr).trim().to_string()),
            ));
        }
        Ok(())
    }

    /// Installs (or replaces) one container's chain and jump.
    pub fn ensure(&self, spec: &MasqSpec) -> Result<(), CniError> {
        let observed = observe(&self.save(spec.is_v6())?, &spec.chain);
        self.restore(spec.is_v6(), &render_add(spec, &observed))
    }

    /// CHECK: the rules of `spec` are in place (code 101 otherwise).
    pub fn verify(&self, spec: &MasqSpec) -> Result<(), CniError> {
        verify(&self.save(spec.is_v6())?, spec).map_err(CniError::CheckFailed)
    }

    /// GC: removes the chains of `network` not in `keep`; returns the removed ones.
    pub fn gc(&self, network: &str, keep: &[String], v6: bool) -> Result<Vec<String>, CniError> {
        let save = self.save(v6)?;
        let stale = stale_chains(&save, network, keep);
        if let Some(rules) = render_gc(&save, &stale) {
            self.restore(v6, &rules)?;
        }
        Ok(stale)
    }

    /// Removes the jumps to `chain` and the chain; nothing to remove is success.
    pub fn remove(&self, chain: &str, v6: bool) -> Result<(), CniError> {
        let observed = observe(&self.save(v6)?, chain);
        match render_del(chain, &observed) {
            Some(rules) => self.restore(v6, &rules),
            None => Ok(()),
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn spec() -> MasqSpec {
        MasqSpec::new("testnet", "ctr-a", "10.77.0.5".parse().unwrap(), 24)
    }

    #[test]
    fn chain_name_fits_and_is_stable() {
        let c = chain_name("testnet", "ctr-a");
        assert_eq!(c, chain_name("testnet", "ctr-a"));
        assert_ne!(c, chain_name("testnet", "ctr-b"));
        assert_ne!(chain_name("ab", "c"), chain_name("a", "bc"));
        assert!(c.starts_with(CHAIN_PREFIX));
        assert_eq!(c.len(), 27);
        assert!(c.len() <= MAX_CHAIN_LEN);
    }

    #[test]
    fn add_rules_golden() {
        let s = spec();
        let c = &s.chain;
        let want = format!(
            "*nat\n\
             :{c} - [0:0]\n\
             -A {c} -d 10.77.0.0/24 -m comment --comment \"name: testnet id: ctr-a\" -j ACCEPT\n\
             -A {c} ! -d 224.0.0.0/4 -m comment --comment \"name: testnet id: ctr-a\" -j MASQUERADE\n\
             -A POSTROUTING -s 10.77.0.5/32 -m comment --comment \"name: testnet id: ctr-a\" -j {c}\n\
             COMMIT\n"
        );
        assert_eq!(render_add(&s, &Observed::default()), want);
    }

    #[test]
    fn add_rules_v6_golden() {
        let s = MasqSpec::new("n6", "c6", "fd00:77::5".parse().unwrap(), 64);
        let c = &s.chain;
        let want = format!(
            "*nat\n\
             :{c} - [0:0]\n\
             -A {c} -d fd00:77::/64 -m comment --comment \"name: n6 id: c6\" -j ACCEPT\n\
             -A {c} ! -d ff00::/8 -m comment --comment \"name: n6 id: c6\" -j MASQUERADE\n\
             -A POSTROUTING -s fd00:77::5/128 -m comment --comment \"name: n6 id: c6\" -j {c}\n\
             COMMIT\n"
        );
        assert_eq!(render_add(&s, &Observed::default()), want);
    }

    fn saved(c: &str) -> String {
        format!(
            "# Generated by iptables-save v1.8.9 (nf_tables)\n\
             *filter\n:INPUT ACCEPT [0:0]\n-A INPUT -j {c}\nCOMMIT\n\
             *nat\n\
             :PREROUTING ACCEPT [0:0]\n\
             :POSTROUTING ACCEPT [0:0]\n\
             :{c} - [0:0]\n\
             :{c}X - [0:0]\n\
             -A POSTROUTING -s 10.77.0.5/32 -m comment --comment \"name: testnet id: ctr-a\" -j {c}\n\
             -A POSTROUTING -s 10.77.0.9/32 -j {c}X\n\
             -A {c} -d 10.77.0.0/24 -j ACCEPT\n\
             COMMIT\n"
        )
    }

    #[test]
    fn observe_finds_the_chain_and_only_its_jumps() {
        let c = spec().chain;
        let o = observe(&saved(&c), &c);
        assert!(o.chain_exists);
        assert_eq!(
            o.jumps,
            vec![format!(
                "-s 10.77.0.5/32 -m comment --comment \"name: testnet id: ctr-a\" -j {c}"
            )]
        );
        assert_eq!(observe("*nat\nCOMMIT\n", &c), Observed::default());
    }

    #[test]
    fn repeated_add_replaces_the_old_jump() {
        let s = spec();
        let c = &s.chain;
        let text = render_add(&s, &observe(&saved(c), c));
        let mut lines = text.lines();
        assert_eq!(lines.next(), Some("*nat"));
        assert_eq!(
            lines.next().unwrap(),
            format!(
                "-D POSTROUTING -s 10.77.0.5/32 -m comment --comment \"name: testnet id: ctr-a\" -j {c}"
            )
        );
        assert_eq!(text.matches("-A POSTROUTING").count(), 1);
    }

    #[test]
    fn verify_accepts_what_add_renders_and_reports_drift() {
        let s = spec();
        let c = &s.chain;
        let rules: String = render_add(&s, &Observed::default())
            .lines()
            .filter(|l| l.starts_with("-A "))
            .map(|l| format!("{l}\n"))
            .collect();
        let save = format!("*nat\n:POSTROUTING ACCEPT [0:0]\n:{c} - [0:0]\n{rules}COMMIT\n");
        assert_eq!(verify(&save, &s), Ok(()));
        let missing = save.replace(" -j MASQUERADE", " -j RETURN");
        assert!(verify(&missing, &s).unwrap_err().contains("missing"));
        let extra = save.replace("COMMIT", &format!("-A {c} -j ACCEPT\nCOMMIT"));
        assert!(verify(&extra, &s).unwrap_err().contains("3 rules"));
        assert!(verify("*nat\nCOMMIT\n", &s)
            .unwrap_err()
            .contains("does not exist"));
    }

    #[test]
    fn gc_finds_chains_of_the_network_not_kept() {
        let keep = MasqSpec::new("testnet", "keep", "10.77.0.2".parse().unwrap(), 24);
        let stale = spec();
        let other = MasqSpec::new("othernet", "x", "10.78.0.2".parse().unwrap(), 24);
        let mut save = String::from("*nat\n:POSTROUTING ACCEPT [0:0]\n");
        for s in [&keep, &stale, &other] {
            save.push_str(&format!(":{} - [0:0]\n", s.chain));
        }
        for s in [&keep, &stale, &other] {
            for l in render_add(s, &Observed::default())
                .lines()
                .filter(|l| l.starts_with("-A "))
            {
                save.push_str(l);
                save.push('\n');
            }
        }
        save.push_str("COMMIT\n");
        let found = stale_chains(&save, "testnet", std::slice::from_ref(&keep.chain));
        assert_eq!(found, vec![stale.chain.clone()]);
        let c = &stale.chain;
        let want = format!(
            "*nat\n\
             -D POSTROUTING -s 10.77.0.5/32 -m comment --comment \"name: testnet id: ctr-a\" -j {c}\n\
             -F {c}\n\
             -X {c}\n\
             COMMIT\n"
        );
        assert_eq!(render_gc(&save, &found), Some(want));
        assert_eq!(render_gc(&save, &[]), None);
    }

    #[test]
    fn del_rules_golden_and_nothing_when_absent() {
        let c = spec().chain;
        let want = format!(
            "*nat\n\
             -D POSTROUTING -s 10.77.0.5/32 -m comment --comment \"name: testnet id: ctr-a\" -j {c}\n\
             -F {c}\n\
             -X {c}\n\
             COMMIT\n"
        );
        assert_eq!(render_del(&c, &observe(&saved(&c), &c)), Some(want));
        assert_eq!(render_del(&c, &Observed::default()), None);
    }
}
