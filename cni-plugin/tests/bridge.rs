//! ADD/DEL orchestration and planning against a recording fake dataplane (no root).
#![allow(clippy::unwrap_used)]

use ferro_cni::commands::{self, CniEnv};
use ferro_cni::config::NetConf;
use ferro_cni::dataplane::{ContainerLink, Dataplane, LinkInfo};
use ferro_cni::masq::{self, MasqSpec};
use ferro_cni::plan::{self, BridgeSpec, VethSpec};
use ferro_cni::result::CniResult;
use ferro_cni::CniError;
use serde_json::json;

#[derive(Default)]
struct Fake {
    calls: Vec<String>,
    fail_veth: bool,
    bad_netns: bool,
    fail_masq: bool,
    fail_masq_v6: bool,
    /// The IPAM dir whose reservations `release_links` counts (DEL's order).
    ipam: Option<std::path::PathBuf>,
    /// The host veth's MAC (default 02:00:00:00:00:02).
    host_mac: Option<String>,
    /// The bridge as `host_link` reads it (default: missing).
    bridge_after: Option<String>,
}

impl Dataplane for Fake {
    fn check_netns(&mut self, netns: &str) -> Result<(), CniError> {
        self.calls.push(format!("check_netns {netns}"));
        if self.bad_netns {
            return Err(CniError::InvalidEnv {
                name: "CNI_NETNS".into(),
                reason: "gone".into(),
            });
        }
        Ok(())
    }
    fn ensure_bridge(&mut self, spec: &BridgeSpec) -> Result<LinkInfo, CniError> {
        self.calls
            .push(format!("bridge {} {:?}", spec.name, spec.addresses));
        Ok(LinkInfo {
            index: 7,
            mac: Some("02:00:00:00:00:01".into()),
        })
    }
    fn enable_forwarding(&mut self, v4: bool, v6: bool) -> Result<(), CniError> {
        self.calls.push(format!("forward {v4} {v6}"));
        Ok(())
    }
    fn create_veth(
        &mut self,
        spec: &VethSpec,
        bridge: u32,
    ) -> Result<(LinkInfo, LinkInfo), CniError> {
        self.calls.push(format!(
            "veth {} {} on {bridge}",
            spec.host_name, spec.ifname
        ));
        if self.fail_veth {
            return Err(CniError::io("create veth", std::io::Error::other("boom")));
        }
        Ok((
            LinkInfo {
                index: 8,
                mac: Some(
                    self.host_mac
                        .clone()
                        .unwrap_or_else(|| "02:00:00:00:00:02".into()),
                ),
            },
            LinkInfo {
                index: 2,
                mac: Some("02:00:00:00:00:03".into()),
            },
        ))
    }
    fn host_link(&mut self, name: &str) -> Result<Option<LinkInfo>, CniError> {
        self.calls.push(format!("get {name}"));
        Ok(self.bridge_after.clone().map(|mac| LinkInfo {
            index: 7,
            mac: Some(mac),
        }))
    }
    fn delete_host_link(&mut self, name: &str) -> Result<bool, CniError> {
        self.calls.push(format!("delete {name}"));
        Ok(false)
    }
    fn delete_container_link(&mut self, netns: &str, ifname: &str) -> Result<(), CniError> {
        self.calls.push(format!("delete {ifname} in {netns}"));
        Ok(())
    }
    fn release_links(
        &mut self,
        netns: Option<&str>,
        ifname: &str,
        host: &str,
    ) -> Result<(), CniError> {
        let held = self.ipam.as_deref().map(ip_files);
        self.calls.push(format!(
            "release {ifname} in {netns:?} host {host} (reserved: {held:?})"
        ));
        Ok(())
    }
    fn container_link(
        &mut self,
        netns: &str,
        ifname: &str,
    ) -> Result<Option<ContainerLink>, CniError> {
        self.calls.push(format!("read {ifname} in {netns}"));
        Ok(None)
    }
    fn ensure_masq(&mut self, spec: &MasqSpec) -> Result<(), CniError> {
        self.calls.push(format!(
            "masq {} {} {} {}",
            spec.chain, spec.pod_ip, spec.subnet, spec.comment
        ));
        if self.fail_masq || (self.fail_masq_v6 && spec.pod_ip.is_ipv6()) {
            return Err(CniError::io(
                "iptables-restore",
                std::io::Error::other("boom"),
            ));
        }
        Ok(())
    }
    fn remove_masq(&mut self, chain: &str, v6: bool) -> Result<(), CniError> {
        self.calls.push(format!("unmasq {chain} v6={v6}"));
        Ok(())
    }
    fn verify_masq(&mut self, spec: &MasqSpec) -> Result<(), CniError> {
        self.calls
            .push(format!("verify masq {} {}", spec.chain, spec.pod_ip));
        Ok(())
    }
    fn gc_masq(
        &mut self,
        network: &str,
        keep: &[String],
        v6: bool,
    ) -> Result<Vec<String>, CniError> {
        self.calls
            .push(format!("gc masq {network} keep {keep:?} v6={v6}"));
        Ok(Vec::new())
    }
    fn gc_host_veths(&mut self, bridge: &str, keep: &[String]) -> Result<Vec<String>, CniError> {
        self.calls
            .push(format!("gc veths on {bridge} keep {keep:?}"));
        Ok(Vec::new())
    }
}

fn env(cmd: &str) -> CniEnv {
    let vars = [
        ("CNI_COMMAND", cmd),
        ("CNI_CONTAINERID", "abc"),
        ("CNI_NETNS", "/run/netns/x"),
        ("CNI_IFNAME", "eth0"),
        ("CNI_PATH", "/opt/cni/bin"),
    ];
    CniEnv::from_vars(|k| {
        vars.iter()
            .find(|(n, _)| *n == k)
            .map(|(_, v)| v.to_string())
    })
    .unwrap()
}

fn conf(dir: &std::path::Path, extra: serde_json::Value) -> NetConf {
    let mut v = json!({
        "cniVersion": "1.1.0", "name": "n", "type": "ferro", "isGateway": true,
        "ipam": {"ranges": [[{"subnet": "10.9.0.0/24"}]],
                 "routes": [{"dst": "192.168.0.0/16"}], "dataDir": dir},
    });
    if let (Some(o), Some(e)) = (v.as_object_mut(), extra.as_object()) {
        o.extend(e.clone());
    }
    NetConf::parse(v.to_string().as_bytes()).unwrap()
}

fn ip_files(dir: &std::path::Path) -> usize {
    std::fs::read_dir(dir.join("n"))
        .map(|rd| {
            rd.filter(|e| {
                e.as_ref()
                    .unwrap()
                    .file_name()
                    .to_string_lossy()
                    .parse::<std::net::IpAddr>()
                    .is_ok()
            })
            .count()
        })
        .unwrap_or(0)
}

#[test]
fn veth_names_are_stable_and_short() {
    let a = plan::host_veth_name("abc", "eth0");
    assert_eq!(a, plan::host_veth_name("abc", "eth0"));
    assert_ne!(a, plan::host_veth_name("abc", "eth1"));
    assert_ne!(
        plan::host_veth_name("ab", "ceth0"),
        plan::host_veth_name("abc", "eth0")
    );
    assert_eq!(a.len(), 12);
    assert!(a.starts_with("veth"));
}

#[test]
fn add_applies_the_plan_and_renders_the_result() {
    let dir = tempfile::tempdir().unwrap();
    let mut fake = Fake::default();
    let v = commands::run_with(&env("ADD"), &conf(dir.path(), json!({})), || Ok(&mut fake))
        .unwrap()
        .unwrap();
    let veth = plan::host_veth_name("abc", "eth0");
    assert_eq!(
        v,
        json!({
            "cniVersion": "1.1.0",
            "interfaces": [
                {"name": "ferro0", "mac": "02:00:00:00:00:01"},
                {"name": veth, "mac": "02:00:00:00:00:02"},
                {"name": "eth0", "mac": "02:00:00:00:00:03", "sandbox": "/run/netns/x"},
            ],
            "ips": [{"address": "10.9.0.2/24", "gateway": "10.9.0.1", "interface": 2}],
            "routes": [
                {"dst": "0.0.0.0/0", "gw": "10.9.0.1"},
                {"dst": "192.168.0.0/16", "gw": "10.9.0.1"},
            ],
        })
    );
    assert_eq!(
        fake.calls,
        vec![
            "check_netns /run/netns/x".to_string(),
            "bridge ferro0 [10.9.0.1/24]".into(),
            "forward true false".into(),
            format!("veth {veth} eth0 on 7"),
        ]
    );
    assert_eq!(ip_files(dir.path()), 1);
}

#[test]
fn a_bridge_following_its_ports_lowest_mac_is_read_again() {
    // The new port's MAC is lower than the bridge's: a bridge without a MAC of its own
    // takes it, so the result reports the bridge as read after the port joined.
    let dir = tempfile::tempdir().unwrap();
    let mut fake = Fake {
        host_mac: Some("02:00:00:00:00:00".into()),
        bridge_after: Some("02:00:00:00:00:00".into()),
        ..Fake::default()
    };
    let v = commands::run_with(&env("ADD"), &conf(dir.path(), json!({})), || Ok(&mut fake))
        .unwrap()
        .unwrap();
    assert_eq!(fake.calls.last().unwrap(), "get ferro0");
    assert_eq!(v["interfaces"][0]["mac"], "02:00:00:00:00:00");
}

#[test]
fn failed_add_rolls_back_veth_and_fresh_reservation() {
    let dir = tempfile::tempdir().unwrap();
    let mut fake = Fake {
        fail_veth: true,
        ..Fake::default()
    };
    let e = commands::run_with(&env("ADD"), &conf(dir.path(), json!({})), || Ok(&mut fake))
        .unwrap_err();
    assert_eq!(e.code(), 5);
    assert_eq!(ip_files(dir.path()), 0);
    let veth = plan::host_veth_name("abc", "eth0");
    assert!(fake.calls.contains(&format!("delete {veth}")));
}

#[test]
fn bad_netns_is_code_4_before_any_reservation() {
    let dir = tempfile::tempdir().unwrap();
    let mut fake = Fake {
        bad_netns: true,
        ..Fake::default()
    };
    let e = commands::run_with(&env("ADD"), &conf(dir.path(), json!({})), || Ok(&mut fake))
        .unwrap_err();
    assert_eq!(e.code(), 4);
    assert_eq!(fake.calls, vec!["check_netns /run/netns/x".to_string()]);
    assert!(!dir.path().join("n").exists());
}

#[test]
fn ip_masq_add_installs_the_chain_after_the_veth() {
    let dir = tempfile::tempdir().unwrap();
    let mut fake = Fake::default();
    commands::run_with(
        &env("ADD"),
        &conf(dir.path(), json!({"ipMasq": true})),
        || Ok(&mut fake),
    )
    .unwrap();
    let chain = masq::chain_name("n", "abc");
    let veth = plan::host_veth_name("abc", "eth0");
    assert_eq!(
        fake.calls,
        vec![
            "check_netns /run/netns/x".to_string(),
            "bridge ferro0 [10.9.0.1/24]".into(),
            "forward true false".into(),
            format!("veth {veth} eth0 on 7"),
            format!("masq {chain} 10.9.0.2 10.9.0.0/24 name: n id: abc"),
        ]
    );
}

#[test]
fn ip_masq_failure_rolls_back_chain_veth_and_reservation() {
    let dir = tempfile::tempdir().unwrap();
    let mut fake = Fake {
        fail_masq: true,
        ..Fake::default()
    };
    let e = commands::run_with(
        &env("ADD"),
        &conf(dir.path(), json!({"ipMasq": true})),
        || Ok(&mut fake),
    )
    .unwrap_err();
    assert_eq!(e.code(), 5);
    assert_eq!(ip_files(dir.path()), 0);
    let chain = masq::chain_name("n", "abc");
    let veth = plan::host_veth_name("abc", "eth0");
    assert!(fake.calls.contains(&format!("unmasq {chain} v6=false")));
    assert!(fake.calls.contains(&format!("delete {veth}")));
}

#[test]
fn ip_masq_del_removes_the_chain_every_time() {
    let dir = tempfile::tempdir().unwrap();
    let c = conf(dir.path(), json!({"ipMasq": true}));
    let mut fake = Fake::default();
    commands::run_with(&env("ADD"), &c, || Ok(&mut fake)).unwrap();
    let chain = masq::chain_name("n", "abc");
    for _ in 0..2 {
        let mut fake = Fake::default();
        commands::run_with(&env("DEL"), &c, || Ok(&mut fake)).unwrap();
        assert_eq!(
            fake.calls,
            vec![
                format!("unmasq {chain} v6=false"),
                format!(
                    "release eth0 in Some(\"/run/netns/x\") host {} (reserved: None)",
                    plan::host_veth_name("abc", "eth0")
                ),
            ]
        );
        assert_eq!(ip_files(dir.path()), 0);
    }
}

#[test]
fn ip_masq_dual_stack_has_a_chain_per_family_and_rolls_back_both() {
    let dir = tempfile::tempdir().unwrap();
    let c = conf(
        dir.path(),
        json!({"ipMasq": true, "ipam": {"ranges": [[{"subnet": "10.9.0.0/24"}],
                                                  [{"subnet": "fd00:9::/64"}]],
                                       "dataDir": dir.path()}}),
    );
    let mut fake = Fake::default();
    commands::run_with(&env("ADD"), &c, || Ok(&mut fake)).unwrap();
    let chain = masq::chain_name("n", "abc");
    let masqs: Vec<&String> = fake
        .calls
        .iter()
        .filter(|c| c.starts_with("masq "))
        .collect();
    assert_eq!(
        masqs,
        vec![
            &format!("masq {chain} 10.9.0.2 10.9.0.0/24 name: n id: abc"),
            &format!("masq {chain} fd00:9::2 fd00:9::/64 name: n id: abc"),
        ]
    );
    let mut fake = Fake::default();
    commands::run_with(&env("DEL"), &c, || Ok(&mut fake)).unwrap();
    assert_eq!(
        fake.calls[..2],
        [
            format!("unmasq {chain} v6=false"),
            format!("unmasq {chain} v6=true")
        ]
    );
    // The IPv4 chain is in place when the IPv6 one fails: the rollback removes both.
    let mut fake = Fake {
        fail_masq_v6: true,
        ..Fake::default()
    };
    let e = commands::run_with(&env("ADD"), &c, || Ok(&mut fake)).unwrap_err();
    assert_eq!(e.code(), 5);
    let i4 = fake
        .calls
        .iter()
        .position(|c| c.starts_with("masq "))
        .unwrap();
    let tail: Vec<&String> = fake.calls[i4..].iter().collect();
    assert_eq!(
        tail,
        vec![
            // host-local semantics: the next address after the last reserved one.
            &format!("masq {chain} 10.9.0.3 10.9.0.0/24 name: n id: abc"),
            &format!("masq {chain} fd00:9::3 fd00:9::/64 name: n id: abc"),
            &format!("unmasq {chain} v6=false"),
            &format!("unmasq {chain} v6=true"),
            &format!("delete {}", plan::host_veth_name("abc", "eth0")),
        ]
    );
    assert_eq!(ip_files(dir.path()), 0);
}

#[test]
fn del_releases_links_then_addresses_and_repeats_cleanly() {
    let dir = tempfile::tempdir().unwrap();
    let c = conf(dir.path(), json!({}));
    let mut fake = Fake::default();
    commands::run_with(&env("ADD"), &c, || Ok(&mut fake)).unwrap();
    assert_eq!(ip_files(dir.path()), 1);
    // The links are released while the address is still reserved, then it is released.
    for held in [1, 0] {
        let mut fake = Fake {
            ipam: Some(dir.path().to_path_buf()),
            ..Fake::default()
        };
        assert_eq!(
            commands::run_with(&env("DEL"), &c, || Ok(&mut fake)).unwrap(),
            None
        );
        assert_eq!(
            fake.calls,
            vec![format!(
                "release eth0 in Some(\"/run/netns/x\") host {} (reserved: Some({held}))",
                plan::host_veth_name("abc", "eth0")
            )]
        );
        assert_eq!(ip_files(dir.path()), 0);
    }
}

#[test]
fn verify_container_compares_prev_result_with_the_observed_link() {
    let prev: CniResult = serde_json::from_value(json!({
        "interfaces": [{"name": "br"}, {"name": "veth1"},
                       {"name": "eth0", "mac": "02:00:00:00:00:03", "sandbox": "/run/netns/x"}],
        "ips": [{"address": "10.9.0.2/24", "gateway": "10.9.0.1", "interface": 2}],
        "routes": [{"dst": "0.0.0.0/0", "gw": "10.9.0.1"}],
    }))
    .unwrap();
    let good = ContainerLink {
        mac: Some("02:00:00:00:00:03".into()),
        up: true,
        addresses: vec!["10.9.0.2/24".parse().unwrap()],
        routes: vec![
            ("10.9.0.0/24".parse().unwrap(), None),
            (
                "0.0.0.0/0".parse().unwrap(),
                Some("10.9.0.1".parse().unwrap()),
            ),
        ],
    };
    plan::verify_container(&prev, "/run/netns/x", "eth0", Some(&good)).unwrap();
    let code = |l: Option<&ContainerLink>, ns: &str| {
        plan::verify_container(&prev, ns, "eth0", l)
            .unwrap_err()
            .code()
    };
    assert_eq!(code(None, "/run/netns/x"), 101);
    assert_eq!(code(Some(&good), "/run/netns/other"), 101);
    let mut down = good.clone();
    down.up = false;
    assert_eq!(code(Some(&down), "/run/netns/x"), 101);
    let mut no_addr = good.clone();
    no_addr.addresses.clear();
    assert_eq!(code(Some(&no_addr), "/run/netns/x"), 101);
    let mut no_route = good.clone();
    no_route.routes.truncate(1);
    assert_eq!(code(Some(&no_route), "/run/netns/x"), 101);
    let mut other_mac = good;
    other_mac.mac = Some("02:00:00:00:00:04".into());
    assert_eq!(code(Some(&other_mac), "/run/netns/x"), 101);
}

#[test]
fn check_needs_prev_result_and_the_reservation() {
    let dir = tempfile::tempdir().unwrap();
    let mut fake = Fake::default();
    let e = commands::run_with(&env("CHECK"), &conf(dir.path(), json!({})), || {
        Ok(&mut fake)
    })
    .unwrap_err();
    assert_eq!(e.code(), 7);
    let prev = json!({"prevResult": {
        "interfaces": [{"name": "eth0", "sandbox": "/run/netns/x"}],
        "ips": [{"address": "10.9.0.2/24", "interface": 0}],
    }});
    let e =
        commands::run_with(&env("CHECK"), &conf(dir.path(), prev), || Ok(&mut fake)).unwrap_err();
    assert_eq!(e.code(), 101, "{e}");
    assert!(e.to_string().contains("not reserved"), "{e}");
}

fn delegated_env(cmd: &str, id: &str) -> CniEnv {
    let vars = [
        ("CNI_COMMAND", cmd),
        ("CNI_CONTAINERID", id),
        ("CNI_NETNS", "/run/netns/x"),
        ("CNI_IFNAME", "eth0"),
        ("CNI_PATH", "/nonexistent:/usr/lib/cni"),
    ];
    CniEnv::from_vars(|k| {
        vars.iter()
            .find(|(n, _)| *n == k)
            .map(|(_, v)| v.to_string())
    })
    .unwrap()
}

fn host_local_conf(dir: &std::path::Path) -> NetConf {
    assert!(
        std::path::Path::new("/usr/lib/cni/host-local").exists(),
        "/usr/lib/cni/host-local is missing: apt-get install -y containernetworking-plugins"
    );
    let v = json!({
        "cniVersion": "1.0.0", "name": "n", "type": "ferro", "isGateway": true,
        "ipam": {"type": "host-local", "ranges": [[{"subnet": "10.9.0.0/24", "rangeEnd": "10.9.0.2"}]],
                 "routes": [{"dst": "192.168.0.0/16"}], "dataDir": dir},
    });
    NetConf::parse(v.to_string().as_bytes()).unwrap()
}

#[test]
fn delegated_host_local_add_merges_its_result_and_del_releases() {
    let dir = tempfile::tempdir().unwrap();
    let conf = host_local_conf(dir.path());
    let mut dp = Fake::default();
    let out = commands::run_with(&delegated_env("ADD", "abc"), &conf, || Ok(&mut dp))
        .unwrap()
        .unwrap();
    assert_eq!(out["ips"][0]["address"], "10.9.0.2/24", "{out}");
    assert_eq!(out["ips"][0]["gateway"], "10.9.0.1");
    assert_eq!(out["ips"][0]["interface"], 2);
    // The default route of isGateway, then host-local's route.
    assert_eq!(
        out["routes"],
        json!([{"dst": "0.0.0.0/0", "gw": "10.9.0.1"}, {"dst": "192.168.0.0/16"}])
    );
    assert!(
        dp.calls
            .iter()
            .any(|c| c.contains("bridge ferro0 [10.9.0.1/24]")),
        "{:?}",
        dp.calls
    );
    assert_eq!(ip_files(dir.path()), 1, "host-local's reservation");
    // The single address is taken: host-local's own error comes back unchanged.
    let e = commands::run_with(&delegated_env("ADD", "other"), &conf, || Ok(&mut dp)).unwrap_err();
    let v = e.to_json("1.0.0");
    assert!(
        v["msg"]
            .as_str()
            .unwrap()
            .contains("no IP addresses available"),
        "{v}"
    );
    assert_eq!(ip_files(dir.path()), 1);
    commands::run_with(&delegated_env("DEL", "abc"), &conf, || Ok(&mut dp)).unwrap();
    assert_eq!(ip_files(dir.path()), 0);
}

#[test]
fn delegated_add_failure_runs_the_ipam_del() {
    let dir = tempfile::tempdir().unwrap();
    let conf = host_local_conf(dir.path());
    let mut dp = Fake {
        fail_veth: true,
        ..Fake::default()
    };
    let e = commands::run_with(&delegated_env("ADD", "abc"), &conf, || Ok(&mut dp)).unwrap_err();
    assert_eq!(e.code(), 5, "{e}");
    assert_eq!(ip_files(dir.path()), 0, "the IPAM DEL released the address");
    assert!(
        dp.calls.iter().any(|c| c.starts_with("delete veth")),
        "{:?}",
        dp.calls
    );
}
