//! Result rendering per version and prevResult parsing.
#![allow(clippy::unwrap_used)]

use ferro_cni::result::{CniResult, Dns, Interface, IpConfig, Route};
use serde_json::json;

fn sample() -> CniResult {
    CniResult {
        interfaces: vec![
            Interface {
                name: "ferro0".into(),
                mac: Some("0a:58:0a:f4:01:01".into()),
                ..Default::default()
            },
            Interface {
                name: "eth0".into(),
                mac: Some("0a:58:0a:f4:01:05".into()),
                mtu: Some(1450),
                sandbox: Some("/var/run/netns/cni-1234".into()),
                ..Default::default()
            },
        ],
        ips: vec![
            IpConfig {
                address: "10.244.1.5/24".parse().unwrap(),
                gateway: Some("10.244.1.1".parse().unwrap()),
                interface: Some(1),
            },
            IpConfig {
                address: "fd00:10:244:1::5/64".parse().unwrap(),
                gateway: None,
                interface: Some(1),
            },
        ],
        routes: vec![
            Route::new(
                "0.0.0.0/0".parse().unwrap(),
                Some("10.244.1.1".parse().unwrap()),
            ),
            Route {
                mtu: Some(1400),
                priority: Some(10),
                ..Route::new("::/0".parse().unwrap(), None)
            },
        ],
        dns: Dns {
            nameservers: vec!["10.96.0.10".into()],
            search: vec!["default.svc.cluster.local".into()],
            ..Default::default()
        },
    }
}

#[test]
fn render_1_1_0() {
    assert_eq!(
        sample().render("1.1.0"),
        json!({
            "cniVersion": "1.1.0",
            "interfaces": [
                {"name": "ferro0", "mac": "0a:58:0a:f4:01:01"},
                {"name": "eth0", "mac": "0a:58:0a:f4:01:05", "mtu": 1450, "sandbox": "/var/run/netns/cni-1234"}
            ],
            "ips": [
                {"address": "10.244.1.5/24", "gateway": "10.244.1.1", "interface": 1},
                {"address": "fd00:10:244:1::5/64", "interface": 1}
            ],
            "routes": [
                {"dst": "0.0.0.0/0", "gw": "10.244.1.1"},
                {"dst": "::/0", "mtu": 1400, "priority": 10}
            ],
            "dns": {"nameservers": ["10.96.0.10"], "search": ["default.svc.cluster.local"]}
        })
    );
}

#[test]
fn render_1_0_0_drops_1_1_fields() {
    let v = sample().render("1.0.0");
    assert_eq!(v["cniVersion"], "1.0.0");
    assert_eq!(
        v["interfaces"][1],
        json!({"name": "eth0", "mac": "0a:58:0a:f4:01:05", "sandbox": "/var/run/netns/cni-1234"})
    );
    assert_eq!(v["routes"][1], json!({"dst": "::/0"}));
    assert_eq!(
        v["ips"][0],
        json!({"address": "10.244.1.5/24", "gateway": "10.244.1.1", "interface": 1})
    );
}

#[test]
fn render_0_4_0_adds_ip_version() {
    let v = sample().render("0.4.0");
    assert_eq!(v["cniVersion"], "0.4.0");
    assert_eq!(v["ips"][0]["version"], "4");
    assert_eq!(v["ips"][1]["version"], "6");
    assert_eq!(v["ips"][1]["interface"], 1);
    assert!(v["interfaces"][1].get("mtu").is_none());
}

#[test]
fn empty_result_renders_only_version() {
    assert_eq!(
        CniResult::default().render("1.1.0"),
        json!({"cniVersion": "1.1.0"})
    );
}

#[test]
fn prev_result_round_trips_from_each_version() {
    for version in ["0.4.0", "1.0.0", "1.1.0"] {
        let rendered = sample().render(version);
        let parsed = CniResult::from_prev(&rendered).unwrap();
        assert_eq!(parsed.ips, sample().ips, "{version}");
        assert_eq!(parsed.interfaces.len(), 2);
        assert_eq!(parsed.render(version), rendered, "{version}");
    }
    let e = CniResult::from_prev(&json!({"ips": [{"address": "not-an-ip"}]})).unwrap_err();
    assert_eq!(e.code(), 6);
}
