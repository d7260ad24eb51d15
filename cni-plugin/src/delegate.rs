//! Delegated IPAM: `"ipam": {"type": "<plugin>", ...}` with any type other than `ferro`.
//!
//! As the CNI spec's delegation rules say, the IPAM plugin is found by name in the
//! directories of `CNI_PATH`, run with the same environment as ferro-cni (only
//! `CNI_COMMAND` differs when ferro-cni rolls back an ADD with a DEL) and the same network
//! configuration on stdin, byte for byte. Its ADD result supplies the addresses (and routes,
//! DNS) of the attachment; its errors are passed through unchanged (code, msg, details).

use std::io::Write;
use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use ipnet::IpNet;
use serde_json::Value;

use crate::commands::CniEnv;
use crate::error::CniError;
use crate::ipam::Allocation;
use crate::result::CniResult;

/// Finds `plugin` in the `:`-separated directories of `cni_path` (the first match wins, as
/// libcni's `FindInPath`). A name with a `/` is refused: the spec names plugins, not paths.
pub fn find_plugin(cni_path: &str, plugin: &str) -> Result<PathBuf, CniError> {
    if plugin.is_empty() || plugin.contains('/') {
        return Err(CniError::InvalidConfig(format!(
            "ipam.type {plugin:?} must be a plugin name, not a path"
        )));
    }
    cni_path
        .split(':')
        .filter(|d| !d.is_empty())
        .map(|d| Path::new(d).join(plugin))
        .find(|p| p.is_file())
        .ok_or_else(|| {
            CniError::io(
                format!("find ipam plugin {plugin:?} in CNI_PATH {cni_path:?}"),
                std::io::Error::from(std::io::ErrorKind::NotFound),
            )
        })
}

/// Runs `plugin` with this process's environment, the `CNI_*` variables of `env` (the
/// invocation's; unset ones are removed) with `CNI_COMMAND=command`, and `stdin`.
/// Success returns the parsed stdout (`None` when it is empty, as for DEL); failure returns
/// the plugin's own error ([`CniError::Delegated`]) when it printed one.
pub fn exec(
    plugin: &Path,
    command: &str,
    env: &CniEnv,
    stdin: &[u8],
) -> Result<Option<Value>, CniError> {
    let what = plugin.display().to_string();
    let mut cmd = Command::new(plugin);
    cmd.env("CNI_COMMAND", command);
    for (name, value) in [
        ("CNI_CONTAINERID", &env.container_id),
        ("CNI_NETNS", &env.netns),
        ("CNI_IFNAME", &env.ifname),
        ("CNI_ARGS", &env.args),
        ("CNI_PATH", &env.path),
    ] {
        match value {
            Some(v) => cmd.env(name, v),
            None => cmd.env_remove(name),
        };
    }
    let mut child = cmd
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .map_err(|e| CniError::io(format!("run ipam plugin {what}"), e))?;
    let written = child
        .stdin
        .take()
        .ok_or_else(|| CniError::io(format!("{what} stdin"), std::io::Error::other("no pipe")))
        .and_then(|mut s| {
            s.write_all(stdin)
                .map_err(|e| CniError::io(format!("write config to {what}"), e))
        });
    let out = child
        .wait_with_output()
        .map_err(|e| CniError::io(format!("wait for {what}"), e))?;
    let parsed: Option<Value> = if out.stdout.iter().all(u8::is_ascii_whitespace) {
        None
    } else {
        Some(
            serde_json::from_slice(&out.stdout).map_err(|source| CniError::Decode {
                what: format!("output of ipam plugin {what}"),
                source,
            })?,
        )
    };
    if !out.status.success() {
        return Err(match parsed.as_ref().and_then(Value::as_object) {
            Some(o) if o.get("code").and_then(Value::as_u64).is_some() => CniError::Delegated {
                plugin: what,
                code: o
                    .get("code")
                    .and_then(Value::as_u64)
                    .and_then(|c| u32::try_from(c).ok())
                    .unwrap_or(999),
                msg: o
                    .get("msg")
                    .and_then(Value::as_str)
                    .unwrap_or_default()
                    .to_string(),
                details: o
                    .get("details")
                    .and_then(Value::as_str)
                    .unwrap_or_default()
                    .to_string(),
            },
            _ => CniError::io(
                format!("ipam plugin {what} {command}"),
                std::io::Error::other(format!("exited with {}", out.status)),
            ),
        });
    }
    written?;
    Ok(parsed)
}

/// Turns an IPAM ADD result into allocations: each `ips[]` entry with its prefix and
/// gateway; a missing gateway is the subnet's first address, as the reference bridge plugin
/// computes it. Returns the allocations and the parsed result (for its routes and DNS).
pub fn allocations(result: &Value) -> Result<(Vec<Allocation>, CniResult), CniError> {
    let parsed = CniResult::from_prev(result)?;
    if parsed.ips.is_empty() {
        return Err(CniError::InvalidConfig(
            "ipam plugin returned no IP addresses".into(),
        ));
    }
    let allocs = parsed
        .ips
        .iter()
        .map(|ip| {
            let net: IpNet = ip.address;
            let gateway = ip.gateway.unwrap_or_else(|| first_host(net));
            Allocation {
                ip: net.addr(),
                prefix: net.prefix_len(),
                gateway,
            }
        })
        .collect();
    Ok((allocs, parsed))
}

fn first_host(net: IpNet) -> IpAddr {
    match net.trunc().network() {
        IpAddr::V4(v4) => IpAddr::V4(std::net::Ipv4Addr::from(u32::from(v4).wrapping_add(1))),
        IpAddr::V6(v6) => IpAddr::V6(std::net::Ipv6Addr::from(u128::from(v6).wrapping_add(1))),
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn allocations_fill_a_missing_gateway() {
        let (a, r) = allocations(&serde_json::json!({
            "cniVersion": "1.0.0",
            "ips": [{"address": "10.5.0.7/24"}, {"address": "fd00:5::9/64", "gateway": "fd00:5::fe"}],
            "routes": [{"dst": "0.0.0.0/0"}],
        }))
        .unwrap();
        assert_eq!(a[0].ip, "10.5.0.7".parse::<IpAddr>().unwrap());
        assert_eq!(a[0].prefix, 24);
        assert_eq!(a[0].gateway, "10.5.0.1".parse::<IpAddr>().unwrap());
        assert_eq!(a[1].gateway, "fd00:5::fe".parse::<IpAddr>().unwrap());
        assert_eq!(r.routes.len(), 1);
        assert!(allocations(&serde_json::json!({"cniVersion": "1.0.0"})).is_err());
    }

    #[test]
    fn find_plugin_searches_each_dir_and_refuses_paths() {
        let d1 = tempfile::tempdir().unwrap();
        let d2 = tempfile::tempdir().unwrap();
        std::fs::write(d2.path().join("myipam"), "").unwrap();
        let path = format!("{}:{}", d1.path().display(), d2.path().display());
        assert_eq!(
            find_plugin(&path, "myipam").unwrap(),
            d2.path().join("myipam")
        );
        assert_eq!(find_plugin(&path, "other").unwrap_err().code(), 5);
        assert_eq!(find_plugin(&path, "../x").unwrap_err().code(), 7);
    }
}
