//! The ADD result (spec "Success" result) and its rendering per cniVersion.

use std::net::IpAddr;

use ipnet::IpNet;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::error::CniError;

/// An ADD result, version independent.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct CniResult {
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub interfaces: Vec<Interface>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub ips: Vec<IpConfig>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub routes: Vec<Route>,
    #[serde(default, skip_serializing_if = "Dns::is_empty")]
    pub dns: Dns,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Interface {
    pub name: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mac: Option<String>,
    /// 1.1.0 only.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mtu: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sandbox: Option<String>,
    /// 1.1.0 only.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub socket_path: Option<String>,
    /// 1.1.0 only.
    #[serde(default, rename = "pciID", skip_serializing_if = "Option::is_none")]
    pub pci_id: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct IpConfig {
    pub address: IpNet,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gateway: Option<IpAddr>,
    /// Index into `interfaces`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub interface: Option<usize>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Route {
    pub dst: IpNet,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gw: Option<IpAddr>,
    /// 1.1.0 only.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mtu: Option<u32>,
    /// 1.1.0 only.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub advmss: Option<u32>,
    /// 1.1.0 only.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub priority: Option<u32>,
    /// 1.1.0 only.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub table: Option<u32>,
    /// 1.1.0 only.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub scope: Option<u32>,
}

impl Route {
    pub fn new(dst: IpNet, gw: Option<IpAddr>) -> Route {
        Route {
            dst,
            gw,
            mtu: None,
            advmss: None,
            priority: None,
            table: None,
            scope: None,
        }
    }
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Dns {
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub nameservers: Vec<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub domain: Option<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub search: Vec<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub options: Vec<String>,
}

impl Dns {
    pub fn is_empty(&self) -> bool {
        self.nameservers.is_empty()
            && self.domain.is_none()
            && self.search.is_empty()
            && self.options.is_empty()
    }
}

const FIELDS_SINCE_1_1: [(&str, &[&str]); 2] = [
    ("interfaces", &["mtu", "socketPath", "pciID"]),
    ("routes", &["mtu", "advmss", "priority", "table", "scope"]),
];

impl CniResult {
    /// Renders for `version` ("0.4.0", "1.0.0" or "1.1.0"): fields newer than the version
    /// are dropped, and 0.4.0 gets `"version": "4"|"6"` on each ip.
    pub fn render(&self, version: &str) -> Value {
        let mut v = serde_json::to_value(self).unwrap_or(Value::Null);
        let Value::Object(obj) = &mut v else {
            return v;
        };
        if version != "1.1.0" {
            for (list, fields) in FIELDS_SINCE_1_1 {
                if let Some(Value::Array(items)) = obj.get_mut(list) {
                    for item in items.iter_mut().filter_map(Value::as_object_mut) {
                        for f in fields {
                            item.remove(*f);
                        }
                    }
                }
            }
        }
        if version == "0.4.0" {
            if let Some(Value::Array(ips)) = obj.get_mut("ips") {
                for (ip, cfg) in ips.iter_mut().zip(&self.ips) {
                    if let Some(o) = ip.as_object_mut() {
                        let fam = if cfg.address.addr().is_ipv4() {
                            "4"
                        } else {
                            "6"
                        };
                        o.insert("version".into(), Value::from(fam));
                    }
                }
            }
        }
        obj.insert("cniVersion".into(), Value::from(version));
        v
    }

    /// Parses a `prevResult` of any supported version (0.4.0's `version` keys are ignored).
    pub fn from_prev(prev: &Value) -> Result<CniResult, CniError> {
        serde_json::from_value(prev.clone()).map_err(|source| CniError::Decode {
            what: "prevResult".into(),
            source,
        })
    }
}
