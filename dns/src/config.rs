//! Flags, resolved into one validated [`Config`] before anything on the host is touched.

use std::net::{IpAddr, SocketAddr};
use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::error::ConfigError;
use crate::forward::{parse_upstream, resolv_conf_servers};
use crate::model::Zone;

/// The link-local address pods get as their nameserver by default (upstream's NodeLocal
/// DNSCache uses the same).
pub const DEFAULT_LISTEN: &str = "169.254.20.10";

#[derive(Debug, Clone, clap::Parser)]
#[command(name = "ferro-dns", version, about = "ferro's node-local cluster DNS server")]
pub struct Args {
    /// Kubeconfig for the API server (else in-cluster or the default kubeconfig).
    #[arg(long)]
    pub kubeconfig: Option<PathBuf>,
    /// API servers to use in turn with the kubeconfig's credentials, comma-separated (several
    /// ferro-control-plane replicas without a load balancer; default: the kubeconfig's server).
    #[arg(long = "api-servers", env = "FERRO_API_SERVERS", value_delimiter = ',')]
    pub api_servers: Vec<String>,
    /// The cluster domain (the kubelet's clusterDomain).
    #[arg(long, default_value = "cluster.local")]
    pub cluster_domain: String,
    /// Addresses to answer on (UDP and TCP); repeat or separate with commas. The agents give
    /// pods these as clusterDNS.
    #[arg(long = "listen-address", value_delimiter = ',', default_value = DEFAULT_LISTEN)]
    pub listen_addresses: Vec<IpAddr>,
    #[arg(long, default_value_t = 53)]
    pub port: u16,
    /// Create this dummy interface (if missing), bring it up and put the listen addresses on it.
    #[arg(long)]
    pub setup_interface: Option<String>,
    /// Upstream resolvers for names outside the cluster domain (ip, ip:port, [ipv6]:port);
    /// repeat or separate with commas. Default: the nameservers of --resolv-conf.
    #[arg(long = "upstream", value_delimiter = ',')]
    pub upstreams: Vec<String>,
    /// Where the node's own resolvers are listed.
    #[arg(long, default_value = "/etc/resolv.conf")]
    pub resolv_conf: PathBuf,
    /// Answer REFUSED for names outside the cluster domain instead of forwarding them.
    #[arg(long)]
    pub no_forward: bool,
    /// TTL of the cluster's records and of negative answers (seconds).
    #[arg(long, default_value_t = 5)]
    pub ttl: u32,
    /// How long one upstream may take to answer (Go duration).
    #[arg(long, default_value = "2s")]
    pub forward_timeout: String,
    /// Threads answering UDP.
    #[arg(long, default_value_t = 2)]
    pub udp_threads: usize,
    /// Every Service is recomputed this often, whatever the watch said (Go duration).
    #[arg(long, default_value = "5m")]
    pub resync_period: String,
}

/// The validated configuration.
#[derive(Debug, Clone)]
pub struct Config {
    pub kubeconfig: Option<PathBuf>,
    /// `--api-servers`, as given (parsed when the client is built).
    pub api_servers: Vec<String>,
    pub zone: Zone,
    pub listen: Vec<SocketAddr>,
    pub setup_interface: Option<String>,
    /// None: forwarding off.
    pub upstreams: Option<Vec<SocketAddr>>,
    pub forward_timeout: Duration,
    pub udp_threads: usize,
    pub resync_period: Duration,
}

fn duration(flag: &str, s: &str) -> Result<Duration, ConfigError> {
    let d = k8s_semantics::duration::parse_duration(s).map_err(|e| ConfigError::Invalid(format!("{flag}: {e}")))?;
    if d.is_zero() {
        return Err(ConfigError::Invalid(format!("{flag}: must be more than 0")));
    }
    Ok(d)
}

impl Args {
    /// Checks the flags; `read` reads the resolv.conf (injected for tests).
    pub fn validate(&self, read: impl Fn(&Path) -> std::io::Result<String>) -> Result<Config, ConfigError> {
        if self.listen_addresses.is_empty() {
            return Err(ConfigError::Invalid("--listen-address: at least one is needed".into()));
        }
        let listen: Vec<SocketAddr> = self.listen_addresses.iter().map(|ip| SocketAddr::new(*ip, self.port)).collect();
        let zone = Zone::new(&self.cluster_domain, self.ttl, self.listen_addresses.iter().copied().filter(|a| !a.is_unspecified()).collect())?;
        let upstreams = if self.no_forward {
            if !self.upstreams.is_empty() {
                return Err(ConfigError::Invalid("--upstream and --no-forward contradict each other".into()));
            }
            None
        } else {
            let all: Vec<SocketAddr> = if self.upstreams.is_empty() {
                let text = read(&self.resolv_conf)
                    .map_err(|e| ConfigError::ResolvConf { path: self.resolv_conf.display().to_string(), source: e })?;
                resolv_conf_servers(&text).into_iter().map(|ip| SocketAddr::new(ip, 53)).collect()
            } else {
                self.upstreams.iter().map(|u| parse_upstream(u)).collect::<Result<_, _>>().map_err(ConfigError::Upstream)?
            };
            // never forward to ourselves (a node whose resolv.conf names ferro-dns)
            let own = |u: &SocketAddr| listen.iter().any(|l| l == u || (l.ip().is_unspecified() && l.port() == u.port() && u.ip().is_loopback()));
            let kept: Vec<SocketAddr> = all.into_iter().filter(|u| !own(u)).collect();
            if kept.is_empty() {
                return Err(ConfigError::Upstream(format!(
                    "no upstream resolver left (none given, none in {} besides ferro-dns's own addresses): give --upstream, or --no-forward",
                    self.resolv_conf.display()
                )));
            }
            Some(kept)
        };
        Ok(Config {
            kubeconfig: self.kubeconfig.clone(),
            api_servers: self.api_servers.clone(),
            zone,
            listen,
            setup_interface: self.setup_interface.clone().filter(|s| !s.is_empty()),
            upstreams,
            forward_timeout: duration("--forward-timeout", &self.forward_timeout)?,
            udp_threads: self.udp_threads.clamp(1, 64),
            resync_period: duration("--resync-period", &self.resync_period)?,
        })
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use clap::Parser as _;

    fn args(a: &[&str]) -> Args {
        Args::parse_from(std::iter::once("ferro-dns").chain(a.iter().copied()))
    }

    fn conf(text: &'static str) -> impl Fn(&Path) -> std::io::Result<String> {
        move |_| Ok(text.to_string())
    }

    #[test]
    fn defaults_take_the_nodes_resolvers_but_never_ourselves() {
        let c = args(&[]).validate(conf("nameserver 169.254.20.10\nnameserver 10.0.0.2\n")).unwrap();
        assert_eq!(c.listen, ["169.254.20.10:53".parse().unwrap()]);
        assert_eq!(c.upstreams.unwrap(), ["10.0.0.2:53".parse().unwrap()]);
        assert_eq!(c.zone.domain.to_ascii(), "cluster.local.");
        assert_eq!(c.forward_timeout, Duration::from_secs(2));
        let e = args(&[]).validate(conf("nameserver 169.254.20.10\n")).unwrap_err().to_string();
        assert!(e.contains("--no-forward"), "{e}");
        let e = args(&[]).validate(|_| Err(std::io::Error::other("gone"))).unwrap_err().to_string();
        assert!(e.contains("/etc/resolv.conf"), "{e}");
    }

    #[test]
    fn explicit_upstreams_and_no_forward() {
        let c = args(&["--upstream", "127.0.0.1:5353,10.0.0.2", "--listen-address", "127.0.0.1", "--port", "5300", "--cluster-domain", "Example.Test."])
            .validate(conf(""))
            .unwrap();
        assert_eq!(c.upstreams.unwrap(), ["127.0.0.1:5353".parse().unwrap(), "10.0.0.2:53".parse().unwrap()]);
        assert_eq!(c.zone.domain.to_ascii(), "example.test.");
        assert!(args(&["--no-forward"]).validate(conf("")).unwrap().upstreams.is_none());
        assert!(args(&["--no-forward", "--upstream", "10.0.0.2"]).validate(conf("")).is_err());
        assert!(args(&["--upstream", "resolver.example"]).validate(conf("")).is_err());
        assert!(args(&["--forward-timeout", "0s", "--no-forward"]).validate(conf("")).is_err());
        assert!(args(&["--cluster-domain", "", "--no-forward"]).validate(conf("")).is_err());
    }
}
