//! Pure renderers: the subnet file, the CNI conflist and the node-wide masquerade rules, and
//! the atomic file write used for the first two.

use std::io::Write;
use std::path::{Path, PathBuf};

use ipnet::IpNet;
use serde::Serialize;

/// The node-wide masquerade chain in the nat table.
pub const MASQ_CHAIN: &str = "FERRO-NETD-MASQ";
/// The comment on the POSTROUTING jump, so people can tell where it comes from.
pub const MASQ_JUMP_COMMENT: &str = "ferro-netd: masquerade pod traffic leaving the cluster";

/// `FERRO_SUBNET=<cidr>[,<cidr>]\nFERRO_MTU=<mtu>\n`, read by ferro-cni (`podCIDR: "node"`).
pub fn subnet_env(pod_cidrs: &[IpNet], mtu: u32) -> String {
    let cidrs: Vec<String> = pod_cidrs.iter().map(ToString::to_string).collect();
    format!("FERRO_SUBNET={}\nFERRO_MTU={mtu}\n", cidrs.join(","))
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct Conflist<'a> {
    cni_version: &'static str,
    name: &'static str,
    plugins: (FerroPlugin<'a>, PortmapPlugin),
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct FerroPlugin<'a> {
    #[serde(rename = "type")]
    plugin_type: &'static str,
    bridge: &'a str,
    is_gateway: bool,
    ip_masq: bool,
    mtu: u32,
    #[serde(rename = "podCIDR")]
    pod_cidr: &'static str,
    subnet_file: &'a Path,
    #[serde(skip_serializing_if = "Option::is_none")]
    ipam: Option<Ipam<'a>>,
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct Ipam<'a> {
    #[serde(rename = "type")]
    plugin_type: &'static str,
    data_dir: &'a Path,
}

#[derive(Serialize)]
struct PortmapPlugin {
    #[serde(rename = "type")]
    plugin_type: &'static str,
    capabilities: PortmapCaps,
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct PortmapCaps {
    port_mappings: bool,
}

/// The conflist: ferro (bridge, node pod CIDR from the subnet file, masquerade left to the
/// node-wide chain) chained with portmap.
pub fn conflist(bridge: &str, mtu: u32, subnet_file: &Path, data_dir: Option<&PathBuf>) -> String {
    let c = Conflist {
        cni_version: "1.0.0",
        name: "ferro",
        plugins: (
            FerroPlugin {
                plugin_type: crate::config::PLUGIN_TYPE,
                bridge,
                is_gateway: true,
                ip_masq: false,
                mtu,
                pod_cidr: "node",
                subnet_file,
                ipam: data_dir.map(|d| Ipam {
                    plugin_type: crate::config::PLUGIN_TYPE,
                    data_dir: d,
                }),
            },
            PortmapPlugin {
                plugin_type: "portmap",
                capabilities: PortmapCaps {
                    port_mappings: true,
                },
            },
        ),
    };
    // Serialising these plain structs cannot fail; fall back to an empty object anyway.
    let mut s = serde_json::to_string_pretty(&c).unwrap_or_else(|_| "{}".into());
    s.push('\n');
    s
}

/// Writes `contents` to `path` atomically (temp file in the same directory, fsync, rename),
/// unless the file already has exactly these contents. Returns whether it wrote.
pub fn write_if_changed(path: &Path, contents: &str) -> std::io::Result<bool> {
    if std::fs::read_to_string(path).is_ok_and(|old| old == contents) {
        return Ok(false);
    }
    let dir = path.parent().unwrap_or(Path::new("."));
    std::fs::create_dir_all(dir)?;
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let tmp = dir.join(format!(".{name}.tmp.{}", std::process::id()));
    let result = (|| {
        let mut f = std::fs::File::create(&tmp)?;
        f.write_all(contents.as_bytes())?;
        f.sync_all()?;
        std::fs::rename(&tmp, path)
    })();
    if result.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    result.map(|()| true)
}

/// The rules of [`MASQ_CHAIN`] for one address family, as `iptables-save` prints them:
/// traffic from this node's pods to the cluster's pod network returns untouched, traffic from
/// them to anything else but multicast is masqueraded. Empty when the node has no pod CIDR or
/// there is no cluster CIDR of that family.
pub fn masq_rules(pod_cidrs: &[IpNet], cluster_cidrs: &[IpNet], v6: bool) -> Vec<String> {
    let fam = |n: &&IpNet| matches!(n, IpNet::V6(_)) == v6;
    let pods: Vec<&IpNet> = pod_cidrs.iter().filter(fam).collect();
    let cluster: Vec<&IpNet> = cluster_cidrs.iter().filter(fam).collect();
    if pods.is_empty() || cluster.is_empty() {
        return Vec::new();
    }
    let multicast = if v6 { "ff00::/8" } else { "224.0.0.0/4" };
    let mut rules = Vec::new();
    for p in &pods {
        for c in &cluster {
            rules.push(format!("-A {MASQ_CHAIN} -s {p} -d {c} -j RETURN"));
        }
        rules.push(format!(
            "-A {MASQ_CHAIN} -s {p} ! -d {multicast} -j MASQUERADE --random-fully"
        ));
    }
    rules
}

/// What `iptables-save -t nat` shows of [`MASQ_CHAIN`].
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct MasqObserved {
    pub chain_exists: bool,
    /// The chain's rules, as printed (`-A FERRO-NETD-MASQ ...`).
    pub rules: Vec<String>,
    /// POSTROUTING rules jumping to the chain (after `-A POSTROUTING `).
    pub jumps: Vec<String>,
}

/// Parses `iptables-save -t nat` output.
pub fn observe_masq(save: &str) -> MasqObserved {
    let mut o = MasqObserved::default();
    let mut in_nat = false;
    let rule_prefix = format!("-A {MASQ_CHAIN} ");
    let jump = format!("-j {MASQ_CHAIN}");
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
            if decl.split_whitespace().next() == Some(MASQ_CHAIN) {
                o.chain_exists = true;
            }
        } else if line.starts_with(&rule_prefix) {
            o.rules.push(line.to_string());
        } else if let Some(rule) = line.strip_prefix("-A POSTROUTING ") {
            if rule.ends_with(&jump) || rule.contains(&format!("{jump} ")) {
                o.jumps.push(rule.to_string());
            }
        }
    }
    o
}

/// The `iptables-restore --noflush` input that makes the chain hold exactly `rules` with one
/// POSTROUTING jump to it, or `None` when that is already so (or `rules` is empty: without a
/// cluster CIDR ferro-netd leaves the nat table alone).
pub fn render_masq(rules: &[String], observed: &MasqObserved) -> Option<String> {
    if rules.is_empty() {
        return None;
    }
    if observed.chain_exists && observed.rules == rules && observed.jumps.len() == 1 {
        return None;
    }
    let mut out = String::from("*nat\n");
    // Declaring a chain with --noflush empties it (or creates it).
    out.push_str(&format!(":{MASQ_CHAIN} - [0:0]\n"));
    for r in rules {
        out.push_str(r);
        out.push('\n');
    }
    if observed.jumps.len() != 1 {
        for j in &observed.jumps {
            out.push_str(&format!("-D POSTROUTING {j}\n"));
        }
        out.push_str(&format!(
            "-A POSTROUTING -m comment --comment \"{MASQ_JUMP_COMMENT}\" -j {MASQ_CHAIN}\n"
        ));
    }
    out.push_str("COMMIT\n");
    Some(out)
}
