//! Environment parsing and the commands that need no netlink.
#![allow(clippy::unwrap_used)]

use std::collections::HashMap;

use ferro_cni::commands::{self, CniEnv, Command};
use ferro_cni::config::NetConf;
use ferro_cni::ipam::{Range, RangeSet, Store};
use serde_json::json;

fn env(pairs: &[(&str, &str)]) -> Result<CniEnv, ferro_cni::CniError> {
    let map: HashMap<String, String> = pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    CniEnv::from_vars(|k| map.get(k).cloned())
}

const ADD: [(&str, &str); 5] = [
    ("CNI_COMMAND", "ADD"),
    ("CNI_CONTAINERID", "abc"),
    ("CNI_NETNS", "/var/run/netns/x"),
    ("CNI_IFNAME", "eth0"),
    ("CNI_PATH", "/opt/cni/bin"),
];

#[test]
fn env_requirements_per_command() {
    let e = env(&ADD).unwrap();
    assert_eq!(e.command, Command::Add);
    assert_eq!(e.ifname.as_deref(), Some("eth0"));
    for skip in ["CNI_CONTAINERID", "CNI_NETNS", "CNI_IFNAME", "CNI_PATH"] {
        let pairs: Vec<_> = ADD.iter().copied().filter(|(k, _)| *k != skip).collect();
        let err = env(&pairs).unwrap_err();
        assert_eq!(err.code(), 4);
        assert!(err.to_string().contains(skip), "{err}");
    }
    // DEL without netns is fine
    let del: Vec<_> = ADD
        .iter()
        .copied()
        .filter(|(k, _)| *k != "CNI_NETNS")
        .map(|(k, v)| {
            if k == "CNI_COMMAND" {
                (k, "DEL")
            } else {
                (k, v)
            }
        })
        .collect();
    assert_eq!(env(&del).unwrap().command, Command::Del);
    assert_eq!(env(&[("CNI_COMMAND", "GC")]).unwrap().command, Command::Gc);
    assert_eq!(env(&[]).unwrap_err().code(), 4);
    assert_eq!(env(&[("CNI_COMMAND", "FROB")]).unwrap_err().code(), 4);
    let mut bad = ADD.to_vec();
    bad[1] = ("CNI_CONTAINERID", "../../etc");
    assert_eq!(env(&bad).unwrap_err().code(), 4);
    bad = ADD.to_vec();
    bad[3] = ("CNI_IFNAME", "eth0/../x");
    assert_eq!(env(&bad).unwrap_err().code(), 4);
}

#[test]
fn run_without_a_dataplane_validates_then_refuses_add() {
    let conf = NetConf::parse(
        json!({"cniVersion": "1.0.0", "name": "n", "type": "ferro", "podCIDR": "10.1.0.0/16"})
            .to_string()
            .as_bytes(),
    )
    .unwrap();
    let e = commands::run(&env(&ADD).unwrap(), &conf).unwrap_err();
    assert_eq!(e.code(), 199);
    assert!(e.to_string().contains("not implemented yet"));
    let bad = NetConf::parse(
        json!({"cniVersion": "1.0.0", "type": "ferro", "podCIDR": "10.1.0.0/16"})
            .to_string()
            .as_bytes(),
    )
    .unwrap();
    assert_eq!(
        commands::run(&env(&ADD).unwrap(), &bad).unwrap_err().code(),
        7
    );
    let v = commands::run(&env(&[("CNI_COMMAND", "VERSION")]).unwrap(), &bad)
        .unwrap()
        .unwrap();
    assert_eq!(v["supportedVersions"], json!(["0.4.0", "1.0.0", "1.1.0"]));
}

#[test]
fn status_reports_missing_subnet_file_as_not_available() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("subnet.env");
    let conf = NetConf::parse(json!({"cniVersion": "1.1.0", "name": "n", "type": "ferro", "podCIDR": "node", "subnetFile": file}).to_string().as_bytes()).unwrap();
    let st = env(&[("CNI_COMMAND", "STATUS")]).unwrap();
    assert_eq!(commands::run(&st, &conf).unwrap_err().code(), 50);
    std::fs::write(&file, "FERRO_SUBNET=10.244.0.0/24\n").unwrap();
    assert_eq!(commands::run(&st, &conf).unwrap(), None);
}

#[test]
fn gc_uses_valid_attachments() {
    let dir = tempfile::tempdir().unwrap();
    let r = Range::new("10.1.0.0/24".parse().unwrap(), None, None, None).unwrap();
    let store = Store::new(dir.path(), "pods", vec![RangeSet(vec![r])]);
    let keep = store.allocate("keep", "eth0").unwrap();
    store.allocate("stale", "eth0").unwrap();
    let conf = NetConf::parse(
        json!({
            "cniVersion": "1.1.0", "name": "pods", "type": "ferro",
            "ipam": {"ranges": [[{"subnet": "10.1.0.0/24"}]], "dataDir": dir.path()},
            "cni.dev/valid-attachments": [{"containerID": "keep", "ifname": "eth0"}]
        })
        .to_string()
        .as_bytes(),
    )
    .unwrap();
    let gc_env = env(&[("CNI_COMMAND", "GC")]).unwrap();
    assert_eq!(commands::run(&gc_env, &conf).unwrap(), None);
    assert_eq!(store.find("keep", "eth0").unwrap(), vec![keep[0].ip]);
    assert!(store.find("stale", "eth0").unwrap().is_empty());

    let mut bad = conf.clone();
    bad.extra.insert(
        "cni.dev/valid-attachments".into(),
        json!([{"containerID": "x"}]),
    );
    assert_eq!(commands::run(&gc_env, &bad).unwrap_err().code(), 7);
}
