//! ferro-netd's command line (clap) and its validation into a [`Config`].
//!
//! Flags follow flannel's and kube-proxy's names where one exists. Everything is checked here,
//! before anything on the host is touched: a bad flag is a clear error at start, not a
//! failure in the middle of a reconcile.

use std::net::IpAddr;
use std::path::PathBuf;
use std::time::Duration;

use clap::Parser;
use ipnet::IpNet;

use crate::netd::error::ConfigError;

/// Default CNI configuration directory (containerd's `conf_dir`).
pub const DEFAULT_CNI_CONF_DIR: &str = "/etc/cni/net.d";
/// Name of the conflist ferro-netd writes in the CNI configuration directory.
pub const CONFLIST_NAME: &str = "10-ferro.conflist";
/// The VXLAN device ferro-netd owns (at most 15 characters).
pub const VXLAN_DEVICE: &str = "ferro.vxlan";
/// The node bridge ferro-cni attaches pods to.
pub const DEFAULT_BRIDGE: &str = "ferro0";
/// IANA's VXLAN port is 4789; 8472 is the Linux kernel's (and flannel's) default.
pub const DEFAULT_VXLAN_PORT: u16 = 8472;

/// `ferro-netd` flags.
#[derive(Debug, Clone, Parser)]
#[command(
    name = "ferro-netd",
    version,
    about = "ferro's node network daemon: pod CIDR -> CNI config, VXLAN overlay, masquerade"
)]
pub struct Args {
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
    /// Where the CNI conflist is written.
    #[arg(long = "cni-conf-dir", default_value = DEFAULT_CNI_CONF_DIR)]
    pub cni_conf_dir: PathBuf,
    /// The subnet file ferro-cni reads (`FERRO_SUBNET=...`, `FERRO_MTU=...`).
    #[arg(long = "subnet-file", default_value = crate::config::DEFAULT_SUBNET_FILE)]
    pub subnet_file: PathBuf,
    /// IPAM data directory put in the conflist (default: ferro-cni's, /var/lib/cni/networks).
    #[arg(long = "cni-data-dir")]
    pub cni_data_dir: Option<PathBuf>,
    /// VXLAN network identifier.
    #[arg(long = "vxlan-id", default_value_t = 1)]
    pub vxlan_id: u32,
    /// VXLAN UDP destination port.
    #[arg(long = "vxlan-port", default_value_t = DEFAULT_VXLAN_PORT)]
    pub vxlan_port: u16,
    /// Underlay interface (default: the one holding --node-ip, else the default route's).
    #[arg(long)]
    pub iface: Option<String>,
    /// This node's underlay address (default: the first global address of --iface).
    #[arg(long = "node-ip")]
    pub node_ip: Option<IpAddr>,
    /// The cluster's pod network(s), comma separated; pod traffic leaving them is
    /// masqueraded. Without it no masquerade rules are written.
    #[arg(long = "cluster-cidr", value_delimiter = ',')]
    pub cluster_cidr: Vec<String>,
    /// Full reconcile at least this often (e.g. 30s, 2s, 500ms, 1m).
    #[arg(long = "resync-period", default_value = "30s")]
    pub resync_period: String,
    /// The bridge ferro-cni attaches pods to.
    #[arg(long, default_value = DEFAULT_BRIDGE)]
    pub bridge: String,
    /// Route to nodes on the same underlay subnet directly, without encapsulation.
    #[arg(long = "direct-routing")]
    pub direct_routing: bool,
}

/// Validated configuration.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Config {
    pub kubeconfig: Option<PathBuf>,
    /// `--api-servers`, as given (parsed when the client is built).
    pub api_servers: Vec<String>,
    pub node_name: String,
    pub cni_conf_dir: PathBuf,
    pub subnet_file: PathBuf,
    pub cni_data_dir: Option<PathBuf>,
    pub vxlan_id: u32,
    pub vxlan_port: u16,
    pub iface: Option<String>,
    pub node_ip: Option<IpAddr>,
    pub cluster_cidrs: Vec<IpNet>,
    pub resync_period: Duration,
    pub bridge: String,
    pub direct_routing: bool,
}

/// Parses a Go duration (`30s`, `500ms`, `1m30s`; the shared implementation) or a bare
/// number of seconds.
pub fn parse_duration(s: &str) -> Result<Duration, ConfigError> {
    let bad = || ConfigError::Invalid {
        flag: "--resync-period",
        reason: format!("{s:?} is not a duration such as 30s, 500ms or 1m"),
    };
    let s = s.trim();
    let d = if !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit()) {
        Duration::from_secs(s.parse().map_err(|_| bad())?)
    } else {
        k8s_semantics::parse_duration(s).map_err(|_| bad())?
    };
    if d < Duration::from_millis(100) {
        return Err(ConfigError::Invalid {
            flag: "--resync-period",
            reason: format!("{s:?} is shorter than 100ms"),
        });
    }
    Ok(d)
}

fn valid_ifname(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 15
        && name != "."
        && name != ".."
        && !name.contains(['/', ' ', ':', '\t', '\n'])
}

impl Args {
    /// Checks every flag; `hostname` is the machine's host name (passed in so tests do not
    /// depend on the machine).
    pub fn validate(
        self,
        hostname: impl FnOnce() -> Option<String>,
    ) -> Result<Config, ConfigError> {
        let node_name = match self.hostname_override {
            Some(n) => n,
            None => hostname().ok_or(ConfigError::Invalid {
                flag: "--hostname-override",
                reason: "not set and the host name cannot be read".into(),
            })?,
        }
        .trim()
        .to_lowercase();
        if node_name.is_empty()
            || node_name.len() > 253
            || !node_name
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '.')
        {
            return Err(ConfigError::Invalid {
                flag: "--hostname-override",
                reason: format!("{node_name:?} is not a valid node name (DNS subdomain)"),
            });
        }
        if self.vxlan_id == 0 || self.vxlan_id > 0x00ff_ffff {
            return Err(ConfigError::Invalid {
                flag: "--vxlan-id",
                reason: format!("{} is outside 1-16777215", self.vxlan_id),
            });
        }
        if self.vxlan_port == 0 {
            return Err(ConfigError::Invalid {
                flag: "--vxlan-port",
                reason: "0 is not a port".into(),
            });
        }
        if let Some(i) = &self.iface {
            if !valid_ifname(i) {
                return Err(ConfigError::Invalid {
                    flag: "--iface",
                    reason: format!("{i:?} is not an interface name (1-15 characters)"),
                });
            }
        }
        if !valid_ifname(&self.bridge) {
            return Err(ConfigError::Invalid {
                flag: "--bridge",
                reason: format!(
                    "{:?} is not an interface name (1-15 characters)",
                    self.bridge
                ),
            });
        }
        if let Some(ip) = self.node_ip {
            if ip.is_unspecified() || ip.is_loopback() || ip.is_multicast() {
                return Err(ConfigError::Invalid {
                    flag: "--node-ip",
                    reason: format!("{ip} cannot be a VXLAN endpoint"),
                });
            }
        }
        let mut cluster_cidrs = Vec::new();
        for c in self.cluster_cidr.iter().filter(|c| !c.trim().is_empty()) {
            let net: IpNet = c.trim().parse().map_err(|_| ConfigError::Invalid {
                flag: "--cluster-cidr",
                reason: format!("{c:?} is not a CIDR such as 10.244.0.0/16"),
            })?;
            cluster_cidrs.push(net.trunc());
        }
        let resync_period = parse_duration(&self.resync_period)?;
        Ok(Config {
            kubeconfig: self.kubeconfig,
            api_servers: self.api_servers,
            node_name,
            cni_conf_dir: self.cni_conf_dir,
            subnet_file: self.subnet_file,
            cni_data_dir: self.cni_data_dir,
            vxlan_id: self.vxlan_id,
            vxlan_port: self.vxlan_port,
            iface: self.iface,
            node_ip: self.node_ip,
            cluster_cidrs,
            resync_period,
            bridge: self.bridge,
            direct_routing: self.direct_routing,
        })
    }
}

impl Config {
    /// The conflist's path.
    pub fn conflist_path(&self) -> PathBuf {
        self.cni_conf_dir.join(CONFLIST_NAME)
    }
}
