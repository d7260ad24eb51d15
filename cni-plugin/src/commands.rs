//! CNI commands: environment parsing and dispatch. Host paths come from the config, so
//! tests point them at a temp dir.

use serde_json::Value;

use crate::config::{self, IpamConf, NetConf};
use crate::error::CniError;
use crate::ipam::Store;

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

/// Runs one command against an already parsed config. `Ok(Some(v))` is printed on stdout.
pub fn run(env: &CniEnv, conf: &NetConf) -> Result<Option<Value>, CniError> {
    if env.command == Command::Version {
        return Ok(Some(version_info()));
    }
    conf.validate()?;
    match env.command {
        Command::Version => Ok(Some(version_info())),
        Command::Add => Err(CniError::NotImplemented(
            "ADD (bridge and veth setup)".into(),
        )),
        Command::Del => Err(CniError::NotImplemented("DEL (veth teardown)".into())),
        Command::Check => Err(CniError::NotImplemented("CHECK".into())),
        Command::Status => status(conf),
        Command::Gc => gc(conf).map(|_| None),
    }
}

/// STATUS: ready when the ranges resolve (for `podCIDR: "node"`, when ferro-netd has written
/// the subnet file).
fn status(conf: &NetConf) -> Result<Option<Value>, CniError> {
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

/// GC on the built-in IPAM store: releases every address not owned by a valid attachment.
/// Returns the released addresses.
pub fn gc(conf: &NetConf) -> Result<Vec<std::net::IpAddr>, CniError> {
    let valid = valid_attachments(conf)?;
    if let Some(IpamConf::Delegate { plugin_type, .. }) = &conf.ipam {
        return Err(CniError::NotImplemented(format!(
            "GC with delegated ipam {plugin_type:?}"
        )));
    }
    Store::new(conf.data_dir(), &conf.name, Vec::new()).gc(&valid)
}
