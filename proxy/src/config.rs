//! ferro-proxy's flags (upstream kube-proxy's names) and its `--config` file (a
//! KubeProxyConfiguration, kubeproxy.config.k8s.io/v1alpha1), validated into a [`Config`]
//! before anything on the host is touched. Flags override the file; unknown fields in the file
//! are refused with the field's name.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use clap::Parser;
use ipnet::IpNet;
use serde::Deserialize;

use crate::error::ConfigError;
use crate::model::Family;

/// The proxy modes (`--proxy-mode`, `mode:`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Mode {
    Iptables,
    Nftables,
    Ipvs,
}

impl Mode {
    pub fn as_str(self) -> &'static str {
        match self {
            Mode::Iptables => "iptables",
            Mode::Nftables => "nftables",
            Mode::Ipvs => "ipvs",
        }
    }

    fn parse(s: &str) -> Result<Mode, ConfigError> {
        match s {
            // upstream: an empty mode is the platform default, iptables on Linux
            "" | "iptables" => Ok(Mode::Iptables),
            "nftables" => Ok(Mode::Nftables),
            "ipvs" => Ok(Mode::Ipvs),
            other => Err(ConfigError::Invalid {
                field: "mode".into(),
                reason: format!("{other:?} is not a proxy mode (iptables, nftables, ipvs)"),
            }),
        }
    }
}

/// `ferro-proxy` flags.
#[derive(Debug, Clone, Default, Parser)]
#[command(name = "ferro-proxy", version, about = "ferro's kube-proxy: Services and EndpointSlices -> iptables, nftables or IPVS")]
pub struct Args {
    /// A KubeProxyConfiguration file (kubeproxy.config.k8s.io/v1alpha1); flags override it.
    #[arg(long)]
    pub config: Option<PathBuf>,
    /// kubeconfig to reach the API server (default: in-cluster, then ~/.kube/config).
    #[arg(long)]
    pub kubeconfig: Option<PathBuf>,
    /// API servers to use in turn with the kubeconfig's credentials, comma-separated (several
    /// ferro-control-plane replicas without a load balancer; default: the kubeconfig's server).
    #[arg(long = "api-servers", env = "FERRO_API_SERVERS", value_delimiter = ',')]
    pub api_servers: Vec<String>,
    /// This node's name in the API (default: the host name).
    #[arg(long = "hostname-override")]
    pub hostname_override: Option<String>,
    /// iptables (default), nftables or ipvs.
    #[arg(long = "proxy-mode", value_enum)]
    pub proxy_mode: Option<Mode>,
    /// The cluster's pod network(s), comma separated: traffic to a Service from outside them is
    /// masqueraded.
    #[arg(long = "cluster-cidr", value_delimiter = ',')]
    pub cluster_cidr: Vec<String>,
    /// Masquerade all traffic sent to Services.
    #[arg(long = "masquerade-all", num_args = 0..=1, default_missing_value = "true")]
    pub masquerade_all: Option<bool>,
    /// CIDRs of the node addresses NodePorts answer on (default: every local address).
    #[arg(long = "nodeport-addresses", value_delimiter = ',')]
    pub nodeport_addresses: Vec<String>,
    /// Where /healthz and /livez are served (default 0.0.0.0:10256; empty: off).
    #[arg(long = "healthz-bind-address")]
    pub healthz_bind_address: Option<String>,
    /// Where /metrics is served (default 127.0.0.1:10249; empty: off).
    #[arg(long = "metrics-bind-address")]
    pub metrics_bind_address: Option<String>,
    /// The longest time between two syncs (Go duration, default 30s).
    #[arg(long = "iptables-sync-period", alias = "sync-period")]
    pub sync_period: Option<String>,
    /// The shortest time between two syncs (Go duration, default 1s).
    #[arg(long = "iptables-min-sync-period", alias = "min-sync-period")]
    pub min_sync_period: Option<String>,
    /// Remove every rule ferro-proxy ever made, in every mode, and exit.
    #[arg(long)]
    pub cleanup: bool,
}

/// The KubeProxyConfiguration fields ferro-proxy supports; any other field is refused.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct KubeProxyConfiguration {
    pub api_version: Option<String>,
    pub kind: Option<String>,
    pub hostname_override: Option<String>,
    pub mode: Option<String>,
    #[serde(rename = "clusterCIDR")]
    pub cluster_cidr: Option<String>,
    pub node_port_addresses: Option<Vec<String>>,
    pub healthz_bind_address: Option<String>,
    pub metrics_bind_address: Option<String>,
    pub client_connection: Option<ClientConnection>,
    pub iptables: Option<ModeSettings>,
    pub nftables: Option<ModeSettings>,
    pub ipvs: Option<IpvsSettings>,
    /// Accepted and checked, not used: ferro-proxy watches with its informers.
    pub config_sync_period: Option<String>,
    /// Only ClusterCIDR (the default) is supported.
    pub detect_local_mode: Option<String>,
    /// Accepted; ferro-proxy has no feature gates and logs the ones given.
    pub feature_gates: Option<std::collections::BTreeMap<String, bool>>,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct ClientConnection {
    pub kubeconfig: Option<String>,
    pub qps: Option<f64>,
    pub burst: Option<i64>,
    pub content_type: Option<String>,
    pub accept_content_types: Option<String>,
}

/// `iptables:` and `nftables:` sections.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct ModeSettings {
    pub masquerade_all: Option<bool>,
    pub masquerade_bit: Option<i32>,
    pub sync_period: Option<String>,
    pub min_sync_period: Option<String>,
    /// iptables only; ferro-proxy never accepts NodePorts on 127.0.0.1 (see docs/design/proxy.md).
    pub localhost_node_ports: Option<bool>,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct IpvsSettings {
    pub sync_period: Option<String>,
    pub min_sync_period: Option<String>,
    pub scheduler: Option<String>,
    #[serde(rename = "excludeCIDRs")]
    pub exclude_cidrs: Option<Vec<String>>,
    #[serde(rename = "strictARP")]
    pub strict_arp: Option<bool>,
}

/// Validated configuration.
#[derive(Debug, Clone, PartialEq)]
pub struct Config {
    pub kubeconfig: Option<PathBuf>,
    /// `--api-servers`, as given (parsed when the client is built).
    pub api_servers: Vec<String>,
    pub node_name: String,
    pub mode: Mode,
    pub cluster_cidrs: Vec<IpNet>,
    pub masquerade_all: bool,
    pub nodeport_addresses: Vec<IpNet>,
    pub healthz_bind_address: Option<SocketAddr>,
    pub metrics_bind_address: Option<SocketAddr>,
    pub sync_period: Duration,
    pub min_sync_period: Duration,
    /// IPVS scheduler (rr by default).
    pub ipvs_scheduler: String,
    pub ipvs_strict_arp: bool,
    pub ipvs_exclude_cidrs: Vec<IpNet>,
    /// The IP families rendered: those of --cluster-cidr, else both.
    pub families: Vec<Family>,
    pub cleanup: bool,
}

pub const DEFAULT_HEALTHZ: &str = "0.0.0.0:10256";
pub const DEFAULT_METRICS: &str = "127.0.0.1:10249";
pub const DEFAULT_SYNC_PERIOD: Duration = Duration::from_secs(30);
pub const DEFAULT_MIN_SYNC_PERIOD: Duration = Duration::from_secs(1);

fn invalid(field: &str, reason: impl Into<String>) -> ConfigError {
    ConfigError::Invalid { field: field.to_string(), reason: reason.into() }
}

fn duration(field: &str, s: &str) -> Result<Duration, ConfigError> {
    k8s_semantics::parse_duration(s).map_err(|e| invalid(field, e.to_string()))
}

fn cidrs(field: &str, items: &[String]) -> Result<Vec<IpNet>, ConfigError> {
    items
        .iter()
        .map(|s| s.trim())
        .filter(|s| !s.is_empty())
        .map(|s| s.parse::<IpNet>().map(|n| n.trunc()).map_err(|_| invalid(field, format!("{s:?} is not a CIDR"))))
        .collect()
}

/// `host:port`; an empty string turns the server off.
fn bind(field: &str, s: &str) -> Result<Option<SocketAddr>, ConfigError> {
    if s.is_empty() {
        return Ok(None);
    }
    s.parse::<SocketAddr>().map(Some).map_err(|_| invalid(field, format!("{s:?} is not host:port")))
}

/// Parses a KubeProxyConfiguration (YAML or JSON).
pub fn parse_file(text: &str) -> Result<KubeProxyConfiguration, ConfigError> {
    let file: KubeProxyConfiguration =
        serde_yaml::from_str(text).map_err(|e| ConfigError::File { reason: e.to_string() })?;
    match file.api_version.as_deref() {
        None | Some("kubeproxy.config.k8s.io/v1alpha1") => {}
        Some(v) => return Err(invalid("apiVersion", format!("{v:?} is not kubeproxy.config.k8s.io/v1alpha1"))),
    }
    match file.kind.as_deref() {
        None | Some("KubeProxyConfiguration") => {}
        Some(k) => return Err(invalid("kind", format!("{k:?} is not KubeProxyConfiguration"))),
    }
    Ok(file)
}

impl Args {
    /// Reads the `--config` file if any (through `read`, so tests need no files), merges the
    /// flags over it and checks everything. `hostname` is the machine's host name.
    pub fn validate(
        self,
        read: impl FnOnce(&Path) -> std::io::Result<String>,
        hostname: impl FnOnce() -> Option<String>,
    ) -> Result<Config, ConfigError> {
        let file = match &self.config {
            Some(path) => {
                let text = read(path).map_err(|e| ConfigError::Read { path: path.clone(), source: e })?;
                parse_file(&text)?
            }
            None => KubeProxyConfiguration::default(),
        };
        let mode = match (self.proxy_mode, file.mode.as_deref()) {
            (Some(m), _) => m,
            (None, Some(s)) => Mode::parse(s)?,
            (None, None) => Mode::Iptables,
        };
        let section = match mode {
            Mode::Iptables => file.iptables.clone().unwrap_or_default(),
            Mode::Nftables => file.nftables.clone().unwrap_or_default(),
            Mode::Ipvs => ModeSettings {
                sync_period: file.ipvs.as_ref().and_then(|i| i.sync_period.clone()),
                min_sync_period: file.ipvs.as_ref().and_then(|i| i.min_sync_period.clone()),
                // ipvs takes masqueradeAll and the bit from the iptables section, as upstream
                masquerade_all: file.iptables.as_ref().and_then(|i| i.masquerade_all),
                masquerade_bit: file.iptables.as_ref().and_then(|i| i.masquerade_bit),
                localhost_node_ports: None,
            },
        };
        let section_name = mode.as_str();
        if let Some(bit) = section.masquerade_bit {
            if bit != 14 {
                return Err(invalid(
                    &format!("{section_name}.masqueradeBit"),
                    format!("{bit}: ferro-proxy uses upstream's default bit 14 (mark 0x4000) only"),
                ));
            }
        }
        if let Some(true) = file.iptables.as_ref().and_then(|i| i.localhost_node_ports) {
            return Err(invalid(
                "iptables.localhostNodePorts",
                "true is not supported: ferro-proxy never accepts NodePorts on 127.0.0.1 (it would need route_localnet, which exposes loopback services to the network)",
            ));
        }
        match file.detect_local_mode.as_deref() {
            None | Some("") | Some("ClusterCIDR") => {}
            Some(m) => return Err(invalid("detectLocalMode", format!("{m:?}: only ClusterCIDR is supported"))),
        }
        if let Some(s) = &file.config_sync_period {
            duration("configSyncPeriod", s)?;
        }
        for (gate, on) in file.feature_gates.iter().flatten() {
            tracing::warn!(gate, on, "feature gate ignored: ferro-proxy has no feature gates");
        }

        let sync_period = match (&self.sync_period, &section.sync_period) {
            (Some(s), _) => duration("--iptables-sync-period", s)?,
            (None, Some(s)) => duration(&format!("{section_name}.syncPeriod"), s)?,
            (None, None) => DEFAULT_SYNC_PERIOD,
        };
        let min_sync_period = match (&self.min_sync_period, &section.min_sync_period) {
            (Some(s), _) => duration("--iptables-min-sync-period", s)?,
            (None, Some(s)) => duration(&format!("{section_name}.minSyncPeriod"), s)?,
            (None, None) => DEFAULT_MIN_SYNC_PERIOD,
        };
        if sync_period.is_zero() {
            return Err(invalid(&format!("{section_name}.syncPeriod"), "must be greater than 0"));
        }
        if min_sync_period > sync_period {
            return Err(invalid(
                &format!("{section_name}.minSyncPeriod"),
                format!("{min_sync_period:?} must not be longer than syncPeriod {sync_period:?}"),
            ));
        }

        let cluster_cidrs = if !self.cluster_cidr.is_empty() {
            cidrs("--cluster-cidr", &self.cluster_cidr)?
        } else {
            let from_file: Vec<String> =
                file.cluster_cidr.as_deref().unwrap_or_default().split(',').map(str::to_string).collect();
            cidrs("clusterCIDR", &from_file)?
        };
        let nodeport_addresses = if !self.nodeport_addresses.is_empty() {
            cidrs("--nodeport-addresses", &self.nodeport_addresses)?
        } else {
            let items = file.node_port_addresses.clone().unwrap_or_default();
            // "primary" (upstream's: the node's primary IPs) is not supported yet
            if let Some(p) = items.iter().find(|s| s.as_str() == "primary") {
                return Err(invalid("nodePortAddresses", format!("{p:?} is not supported; give CIDRs")));
            }
            cidrs("nodePortAddresses", &items)?
        };
        for n in &nodeport_addresses {
            if n.contains(&"127.0.0.1".parse::<std::net::IpAddr>().map_err(|_| invalid("nodePortAddresses", "?"))?)
                && n.prefix_len() > 0
            {
                tracing::warn!(cidr = %n, "nodePortAddresses: NodePorts are never served on 127.0.0.0/8");
            }
        }
        let healthz = match (&self.healthz_bind_address, &file.healthz_bind_address) {
            (Some(s), _) => bind("--healthz-bind-address", s)?,
            (None, Some(s)) => bind("healthzBindAddress", s)?,
            (None, None) => bind("healthzBindAddress", DEFAULT_HEALTHZ)?,
        };
        let metrics = match (&self.metrics_bind_address, &file.metrics_bind_address) {
            (Some(s), _) => bind("--metrics-bind-address", s)?,
            (None, Some(s)) => bind("metricsBindAddress", s)?,
            (None, None) => bind("metricsBindAddress", DEFAULT_METRICS)?,
        };
        let node_name = match self.hostname_override.clone().or(file.hostname_override.clone()) {
            Some(n) if !n.trim().is_empty() => n.trim().to_lowercase(),
            _ => hostname()
                .map(|h| h.trim().to_lowercase())
                .filter(|h| !h.is_empty())
                .ok_or_else(|| invalid("--hostname-override", "not given and the host name is unknown"))?,
        };
        let kubeconfig = self
            .kubeconfig
            .clone()
            .or_else(|| file.client_connection.as_ref().and_then(|c| c.kubeconfig.clone()).map(PathBuf::from));
        let masquerade_all = self.masquerade_all.or(section.masquerade_all).unwrap_or(false);
        let ipvs = file.ipvs.clone().unwrap_or_default();
        let ipvs_scheduler = ipvs.scheduler.clone().filter(|s| !s.is_empty()).unwrap_or_else(|| "rr".into());
        if !matches!(ipvs_scheduler.as_str(), "rr" | "wrr" | "lc" | "wlc" | "lblc" | "lblcr" | "sh" | "dh" | "sed" | "nq" | "mh") {
            return Err(invalid("ipvs.scheduler", format!("{ipvs_scheduler:?} is not an IPVS scheduler")));
        }
        let ipvs_exclude_cidrs = cidrs("ipvs.excludeCIDRs", &ipvs.exclude_cidrs.clone().unwrap_or_default())?;
        let mut families: Vec<Family> = cluster_cidrs.iter().map(|n| Family::of(&n.addr())).collect();
        families.sort();
        families.dedup();
        if families.is_empty() {
            families = vec![Family::V4, Family::V6];
        }
        Ok(Config {
            kubeconfig,
            api_servers: self.api_servers.clone(),
            node_name,
            mode,
            cluster_cidrs,
            masquerade_all,
            nodeport_addresses,
            healthz_bind_address: healthz,
            metrics_bind_address: metrics,
            sync_period,
            min_sync_period,
            ipvs_scheduler,
            ipvs_strict_arp: ipvs.strict_arp.unwrap_or(false),
            ipvs_exclude_cidrs,
            families,
            cleanup: self.cleanup,
        })
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn args(flags: &[&str]) -> Args {
        let mut v = vec!["ferro-proxy"];
        v.extend_from_slice(flags);
        Args::try_parse_from(v).unwrap()
    }

    fn with_file(flags: &[&str], text: &str) -> Result<Config, ConfigError> {
        let mut a = args(flags);
        a.config = Some("/etc/ferro/proxy.yaml".into());
        let text = text.to_string();
        a.validate(move |_| Ok(text), || Some("Node-1".into()))
    }

    #[test]
    fn defaults_are_upstreams() {
        let c = args(&[]).validate(|_| unreachable!(), || Some("Node-1".into())).unwrap();
        assert_eq!(c.mode, Mode::Iptables);
        assert_eq!(c.node_name, "node-1");
        assert_eq!(c.sync_period, Duration::from_secs(30));
        assert_eq!(c.min_sync_period, Duration::from_secs(1));
        assert_eq!(c.healthz_bind_address, Some("0.0.0.0:10256".parse().unwrap()));
        assert_eq!(c.metrics_bind_address, Some("127.0.0.1:10249".parse().unwrap()));
        assert!(!c.masquerade_all);
        assert_eq!(c.families, [Family::V4, Family::V6]);
    }

    #[test]
    fn file_is_read_and_flags_override_it() {
        let text = "apiVersion: kubeproxy.config.k8s.io/v1alpha1\nkind: KubeProxyConfiguration\nmode: nftables\nclusterCIDR: 10.244.0.0/16\nnftables:\n  syncPeriod: 1m0s\n  minSyncPeriod: 250ms\n  masqueradeAll: true\nhostnameOverride: from-file\nmetricsBindAddress: \"\"\nclientConnection:\n  kubeconfig: /etc/ferro/proxy.kubeconfig\n";
        let c = with_file(&[], text).unwrap();
        assert_eq!(c.mode, Mode::Nftables);
        assert_eq!(c.sync_period, Duration::from_secs(60));
        assert_eq!(c.min_sync_period, Duration::from_millis(250));
        assert!(c.masquerade_all);
        assert_eq!(c.node_name, "from-file");
        assert_eq!(c.metrics_bind_address, None);
        assert_eq!(c.cluster_cidrs, ["10.244.0.0/16".parse::<IpNet>().unwrap()]);
        assert_eq!(c.families, [Family::V4]);
        assert_eq!(c.kubeconfig, Some(PathBuf::from("/etc/ferro/proxy.kubeconfig")));
        let c = with_file(&["--proxy-mode", "iptables", "--hostname-override", "flag", "--masquerade-all=false"], text).unwrap();
        assert_eq!(c.mode, Mode::Iptables);
        assert_eq!(c.node_name, "flag");
        // iptables section absent: defaults
        assert_eq!(c.sync_period, Duration::from_secs(30));
        assert!(!c.masquerade_all);
    }

    #[test]
    fn unknown_fields_are_refused_by_name() {
        let e = with_file(&[], "kind: KubeProxyConfiguration\nmode: iptables\nwinkernel: {}\n").unwrap_err().to_string();
        assert!(e.contains("unknown field `winkernel`"), "{e}");
        let e = with_file(&[], "iptables:\n  syncPeriod: 30s\n  bogus: 1\n").unwrap_err().to_string();
        assert!(e.contains("unknown field `bogus`"), "{e}");
    }

    #[test]
    fn bad_values_are_refused_with_the_field() {
        for (text, want) in [
            ("mode: userspace\n", "mode"),
            ("iptables:\n  syncPeriod: 30\n", "iptables.syncPeriod"),
            ("iptables:\n  minSyncPeriod: 1m\n  syncPeriod: 30s\n", "iptables.minSyncPeriod"),
            ("iptables:\n  masqueradeBit: 12\n", "iptables.masqueradeBit"),
            ("iptables:\n  localhostNodePorts: true\n", "iptables.localhostNodePorts"),
            ("clusterCIDR: 10.244.0.0/33\n", "clusterCIDR"),
            ("nodePortAddresses: [primary]\n", "nodePortAddresses"),
            ("healthzBindAddress: nowhere\n", "healthzBindAddress"),
            ("detectLocalMode: NodeCIDR\n", "detectLocalMode"),
            ("apiVersion: kubeproxy.config.k8s.io/v1beta9\n", "apiVersion"),
            ("ipvs:\n  scheduler: fastest\n", "ipvs.scheduler"),
        ] {
            let e = with_file(&[], text).unwrap_err().to_string();
            assert!(e.contains(want), "{text:?}: {e}");
        }
        let e = args(&["--cluster-cidr", "x"]).validate(|_| unreachable!(), || Some("n".into())).unwrap_err();
        assert!(e.to_string().contains("--cluster-cidr"), "{e}");
    }

    #[test]
    fn dual_stack_cluster_cidr_gives_both_families() {
        let c = args(&["--cluster-cidr", "10.244.0.0/16,fd00:10:244::/56"]).validate(|_| unreachable!(), || Some("n".into())).unwrap();
        assert_eq!(c.families, [Family::V4, Family::V6]);
        let c = args(&["--cluster-cidr", "fd00:10:244::/56"]).validate(|_| unreachable!(), || Some("n".into())).unwrap();
        assert_eq!(c.families, [Family::V6]);
    }
}
