//! The network configuration a runtime sends on stdin for plugin type `ferro`.
//!
//! The top level deliberately does not deny unknown fields: the spec lets runtimes add keys
//! (`args`, `capabilities`, `cni.dev/valid-attachments`, `runtimeConfig`, ...) and keys a
//! conflist's other plugins understand, so unknown keys are kept in [`NetConf::extra`].
//! The built-in IPAM section is ferro's own schema and does deny unknown fields, so a typo
//! such as `rangestart` is an error instead of a silently ignored setting.

use std::net::IpAddr;
use std::path::{Path, PathBuf};

use ipnet::IpNet;
use serde::Deserialize;
use serde_json::{Map, Value};

use crate::error::CniError;
use crate::ipam::{Range, RangeSet};

/// cniVersions ferro-cni accepts.
pub const SUPPORTED_VERSIONS: [&str; 3] = ["0.4.0", "1.0.0", "1.1.0"];
/// The version ferro-cni speaks natively.
pub const CURRENT_VERSION: &str = "1.1.0";
/// Plugin type string.
pub const PLUGIN_TYPE: &str = "ferro";
/// Default subnet file written by ferro-netd.
pub const DEFAULT_SUBNET_FILE: &str = "/run/ferro/netd/subnet.env";
/// Default IPAM data directory (host-local's).
pub const DEFAULT_DATA_DIR: &str = "/var/lib/cni/networks";

fn default_bridge() -> String {
    "ferro0".to_string()
}
fn default_subnet_file() -> PathBuf {
    PathBuf::from(DEFAULT_SUBNET_FILE)
}
fn default_data_dir() -> PathBuf {
    PathBuf::from(DEFAULT_DATA_DIR)
}

/// Network configuration for type `ferro`.
#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct NetConf {
    pub cni_version: String,
    #[serde(default)]
    pub name: String,
    #[serde(rename = "type", default)]
    pub plugin_type: String,
    #[serde(default = "default_bridge")]
    pub bridge: String,
    #[serde(default)]
    pub is_gateway: bool,
    #[serde(default)]
    pub is_default_gateway: bool,
    #[serde(default)]
    pub ip_masq: bool,
    #[serde(default)]
    pub mtu: Option<u32>,
    #[serde(default)]
    pub hairpin_mode: bool,
    #[serde(default)]
    pub promisc_mode: bool,
    /// A CIDR, or `"node"` to read the node's pod CIDR from [`NetConf::subnet_file`].
    #[serde(rename = "podCIDR", default)]
    pub pod_cidr: Option<String>,
    #[serde(default = "default_subnet_file")]
    pub subnet_file: PathBuf,
    #[serde(default)]
    pub ipam: Option<IpamConf>,
    #[serde(default)]
    pub dns: Option<Value>,
    #[serde(default)]
    pub prev_result: Option<Value>,
    #[serde(default)]
    pub runtime_config: Option<Value>,
    /// Every other key (`args`, `capabilities`, `cni.dev/valid-attachments`, ...).
    #[serde(flatten)]
    pub extra: Map<String, Value>,
    /// The bytes [`NetConf::parse`] read, passed unchanged to a delegated IPAM plugin.
    #[serde(skip)]
    pub raw: Vec<u8>,
}

/// The `ipam` section: ferro's built-in allocator, or another IPAM plugin to delegate to.
#[derive(Debug, Clone)]
pub enum IpamConf {
    Builtin(BuiltinIpam),
    /// Any other `type`: the raw section, passed to that plugin unchanged.
    Delegate {
        plugin_type: String,
        raw: Value,
    },
}

impl<'de> Deserialize<'de> for IpamConf {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        use serde::de::Error;
        let raw = Value::deserialize(d)?;
        let ty = match raw.get("type") {
            None | Some(Value::Null) => None,
            Some(Value::String(s)) => Some(s.clone()),
            Some(_) => return Err(D::Error::custom("ipam.type must be a string")),
        };
        match ty.as_deref() {
            None | Some(PLUGIN_TYPE) => serde_json::from_value(raw)
                .map(IpamConf::Builtin)
                .map_err(D::Error::custom),
            Some(other) => Ok(IpamConf::Delegate {
                plugin_type: other.to_string(),
                raw,
            }),
        }
    }
}

/// ferro's built-in, host-local compatible IPAM.
#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct BuiltinIpam {
    #[serde(rename = "type", default)]
    pub plugin_type: Option<String>,
    #[serde(default)]
    pub ranges: Vec<Vec<RangeConf>>,
    #[serde(default)]
    pub routes: Vec<RouteConf>,
    #[serde(default = "default_data_dir")]
    pub data_dir: PathBuf,
}

/// One range as written in the config; parsed and checked by [`NetConf::validate`].
#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct RangeConf {
    pub subnet: String,
    #[serde(default)]
    pub range_start: Option<String>,
    #[serde(default)]
    pub range_end: Option<String>,
    #[serde(default)]
    pub gateway: Option<String>,
}

/// A route from the IPAM section.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RouteConf {
    pub dst: String,
    #[serde(default)]
    pub gw: Option<String>,
}

fn invalid(msg: impl Into<String>) -> CniError {
    CniError::InvalidConfig(msg.into())
}

/// Checks a cniVersion against [`SUPPORTED_VERSIONS`].
pub fn check_version(version: &str) -> Result<(), CniError> {
    if SUPPORTED_VERSIONS.contains(&version) {
        Ok(())
    } else {
        Err(CniError::IncompatibleVersion {
            version: version.to_string(),
            supported: SUPPORTED_VERSIONS.join(", "),
        })
    }
}

fn valid_network_name(name: &str) -> bool {
    // The spec: ^[a-zA-Z0-9][a-zA-Z0-9_.\-]*$
    let mut chars = name.chars();
    matches!(chars.next(), Some(c) if c.is_ascii_alphanumeric())
        && chars.all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '-'))
}

fn parse_ip(field: &str, s: &str) -> Result<IpAddr, CniError> {
    s.parse()
        .map_err(|_| invalid(format!("{field}: {s:?} is not an IP address")))
}

/// Parses a subnet and checks it leaves room to allocate from.
pub fn parse_subnet(field: &str, s: &str) -> Result<IpNet, CniError> {
    let net: IpNet = s.parse().map_err(|_| {
        invalid(format!(
            "{field}: bad subnet {s:?}, want a CIDR such as 10.244.1.0/24"
        ))
    })?;
    let net = net.trunc();
    if net.prefix_len() + 2 > net.max_prefix_len() {
        return Err(invalid(format!(
            "{field}: subnet {net} is too small to allocate from"
        )));
    }
    Ok(net)
}

/// Parses ferro-netd's subnet file: `KEY=VALUE` lines; `FERRO_SUBNET` holds the node's pod
/// CIDR(s), comma separated for dual stack. Each CIDR becomes one range set.
pub fn parse_subnet_env(text: &str) -> Result<Vec<IpNet>, CniError> {
    let mut nets = Vec::new();
    for line in text.lines() {
        let line = line.trim();
        if let Some(value) = line.strip_prefix("FERRO_SUBNET=") {
            for cidr in value
                .trim_matches('"')
                .split(',')
                .filter(|s| !s.trim().is_empty())
            {
                nets.push(parse_subnet("FERRO_SUBNET", cidr.trim())?);
            }
        }
    }
    if nets.is_empty() {
        return Err(invalid("subnet file has no FERRO_SUBNET entry"));
    }
    Ok(nets)
}

fn range_from_conf(set: usize, idx: usize, rc: &RangeConf) -> Result<Range, CniError> {
    let field = |f: &str| format!("ipam.ranges[{set}][{idx}].{f}");
    let subnet = parse_subnet(&field("subnet"), &rc.subnet)?;
    let parse_in = |name: &str, v: &Option<String>| -> Result<Option<IpAddr>, CniError> {
        let Some(s) = v else { return Ok(None) };
        let ip = parse_ip(&field(name), s)?;
        if !subnet.contains(&ip) {
            return Err(invalid(format!(
                "{}: {ip} is outside subnet {subnet}",
                field(name)
            )));
        }
        Ok(Some(ip))
    };
    let start = parse_in("rangeStart", &rc.range_start)?;
    let end = parse_in("rangeEnd", &rc.range_end)?;
    let gateway = parse_in("gateway", &rc.gateway)?;
    Range::new(subnet, start, end, gateway)
        .map_err(|e| invalid(format!("ipam.ranges[{set}][{idx}]: {e}")))
}

fn range_from_subnet(net: IpNet) -> Result<Range, CniError> {
    Range::new(net, None, None, None).map_err(|e| invalid(format!("podCIDR: {e}")))
}

impl NetConf {
    /// Parses the stdin bytes. Syntax and type errors are code 6; call [`NetConf::validate`]
    /// for semantic checks.
    pub fn parse(bytes: &[u8]) -> Result<Self, CniError> {
        let mut conf: NetConf =
            serde_json::from_slice(bytes).map_err(|source| CniError::Decode {
                what: "network configuration".into(),
                source,
            })?;
        conf.raw = bytes.to_vec();
        Ok(conf)
    }

    /// The bytes a delegated plugin gets on stdin: what was parsed, or (for a config built
    /// in code) its JSON rendering.
    pub fn raw_bytes(&self) -> Vec<u8> {
        if self.raw.is_empty() {
            let mut obj = self.extra.clone();
            obj.insert("cniVersion".into(), Value::from(self.cni_version.clone()));
            obj.insert("name".into(), Value::from(self.name.clone()));
            obj.insert("type".into(), Value::from(self.plugin_type.clone()));
            if let Some(IpamConf::Delegate { raw, .. }) = &self.ipam {
                obj.insert("ipam".into(), raw.clone());
            }
            if let Some(p) = &self.prev_result {
                obj.insert("prevResult".into(), p.clone());
            }
            return Value::Object(obj).to_string().into_bytes();
        }
        self.raw.clone()
    }

    /// Every check that needs no file: version (code 1), then name, type, bridge, mtu and the
    /// IPAM ranges (code 7).
    pub fn validate(&self) -> Result<(), CniError> {
        check_version(&self.cni_version)?;
        if self.name.is_empty() {
            return Err(invalid("missing network name"));
        }
        if !valid_network_name(&self.name) {
            return Err(invalid(format!(
                "network name {:?} must match ^[a-zA-Z0-9][a-zA-Z0-9_.-]*$",
                self.name
            )));
        }
        if self.plugin_type != PLUGIN_TYPE {
            return Err(invalid(format!(
                "plugin type is {:?}, want {PLUGIN_TYPE:?}",
                self.plugin_type
            )));
        }
        if self.bridge.is_empty() || self.bridge.len() > 15 || self.bridge.contains(['/', ' ']) {
            return Err(invalid(format!(
                "bridge name {:?} must be 1-15 characters without '/' or spaces",
                self.bridge
            )));
        }
        if let Some(mtu) = self.mtu {
            if !(68..=65535).contains(&mtu) {
                return Err(invalid(format!("mtu {mtu} is outside 68-65535")));
            }
        }
        if self.is_default_gateway && !self.is_gateway {
            // The reference bridge plugin turns isGateway on implicitly; ferro asks for it.
            return Err(invalid("isDefaultGateway requires isGateway"));
        }
        match (&self.ipam, self.pod_cidr.as_deref()) {
            (None, None) => Err(invalid(
                "missing ipam section and podCIDR: no addresses to assign",
            )),
            (Some(IpamConf::Delegate { .. }), Some(_)) => Err(invalid(
                "podCIDR only applies to the built-in ipam (type \"ferro\")",
            )),
            (Some(IpamConf::Delegate { plugin_type, .. }), None) => {
                if plugin_type.is_empty() {
                    return Err(invalid("ipam.type is empty"));
                }
                Ok(())
            }
            (Some(IpamConf::Builtin(b)), pod_cidr) => {
                if !b.ranges.is_empty() && pod_cidr.is_some() {
                    return Err(invalid("set either ipam.ranges or podCIDR, not both"));
                }
                if b.ranges.is_empty() && pod_cidr.is_none() {
                    return Err(invalid("ipam.ranges is empty and podCIDR is not set"));
                }
                for (i, r) in b.routes.iter().enumerate() {
                    parse_subnet_any(&format!("ipam.routes[{i}].dst"), &r.dst)?;
                    if let Some(gw) = &r.gw {
                        parse_ip(&format!("ipam.routes[{i}].gw"), gw)?;
                    }
                }
                if let Some(p) = pod_cidr {
                    if p != "node" {
                        parse_subnet("podCIDR", p)?;
                    }
                    return Ok(());
                }
                let sets = self.config_range_sets(b)?;
                check_range_sets(&sets)
            }
            (None, Some(p)) => {
                if p != "node" {
                    parse_subnet("podCIDR", p)?;
                }
                Ok(())
            }
        }
    }

    fn config_range_sets(&self, b: &BuiltinIpam) -> Result<Vec<RangeSet>, CniError> {
        b.ranges
            .iter()
            .enumerate()
            .map(|(s, set)| {
                if set.is_empty() {
                    return Err(invalid(format!("ipam.ranges[{s}] is an empty range set")));
                }
                set.iter()
                    .enumerate()
                    .map(|(i, rc)| range_from_conf(s, i, rc))
                    .collect::<Result<Vec<_>, _>>()
                    .map(RangeSet)
            })
            .collect()
    }

    /// The range sets to allocate from, reading the subnet file if `podCIDR` is `"node"`.
    /// Returns `None` when IPAM is delegated. Call after [`NetConf::validate`].
    pub fn range_sets(&self) -> Result<Option<Vec<RangeSet>>, CniError> {
        let sets = match (&self.ipam, self.pod_cidr.as_deref()) {
            (Some(IpamConf::Delegate { .. }), _) => return Ok(None),
            (_, Some("node")) => {
                let text = std::fs::read_to_string(&self.subnet_file).map_err(|e| {
                    CniError::io(
                        format!("read subnet file {}", self.subnet_file.display()),
                        e,
                    )
                })?;
                parse_subnet_env(&text)?
                    .into_iter()
                    .map(|n| range_from_subnet(n).map(|r| RangeSet(vec![r])))
                    .collect::<Result<Vec<_>, _>>()?
            }
            (_, Some(cidr)) => vec![RangeSet(vec![range_from_subnet(parse_subnet(
                "podCIDR", cidr,
            )?)?])],
            (Some(IpamConf::Builtin(b)), None) => self.config_range_sets(b)?,
            (None, None) => return Err(invalid("no ipam configured")),
        };
        check_range_sets(&sets)?;
        Ok(Some(sets))
    }

    /// The built-in IPAM data directory.
    pub fn data_dir(&self) -> &Path {
        match &self.ipam {
            Some(IpamConf::Builtin(b)) => &b.data_dir,
            _ => Path::new(DEFAULT_DATA_DIR),
        }
    }
}

fn parse_subnet_any(field: &str, s: &str) -> Result<IpNet, CniError> {
    s.parse::<IpNet>()
        .map(|n| n.trunc())
        .map_err(|_| invalid(format!("{field}: bad subnet {s:?}")))
}

/// One family per range set, and no two ranges (in any set) overlapping.
pub fn check_range_sets(sets: &[RangeSet]) -> Result<(), CniError> {
    let all: Vec<(usize, usize, &Range)> = sets
        .iter()
        .enumerate()
        .flat_map(|(s, set)| set.0.iter().enumerate().map(move |(i, r)| (s, i, r)))
        .collect();
    for set in sets {
        if let Some(first) = set.0.first() {
            if set.0.iter().any(|r| r.is_ipv4() != first.is_ipv4()) {
                return Err(invalid("a range set mixes IPv4 and IPv6 ranges"));
            }
        }
    }
    for (n, (s1, i1, a)) in all.iter().enumerate() {
        for (s2, i2, b) in &all[n + 1..] {
            if a.overlaps(b) {
                return Err(invalid(format!(
                    "ranges overlap: ipam.ranges[{s1}][{i1}] ({a}) and ipam.ranges[{s2}][{i2}] ({b})"
                )));
            }
        }
    }
    Ok(())
}
