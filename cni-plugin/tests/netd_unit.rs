//! ferro-netd without root or network: planner, diff, renderers, flags.
#![allow(clippy::unwrap_used)]

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::path::{Path, PathBuf};

use clap::Parser as _;
use ferro_cni::netd::config::Args;
use ferro_cni::netd::plan::{
    annotations_to_patch, desired_entries, gateway_of, node_view, overlay_mtu, own_annotations,
    plan, vtep_addresses, Entries, LocalFacts, Mac, Op, RouteSpec, Skipped, ANN_PUBLIC_IP,
    ANN_VTEP_MAC,
};
use ferro_cni::netd::render::{
    conflist, masq_rules, observe_masq, render_masq, subnet_env, write_if_changed, MasqObserved,
};
use ipnet::IpNet;
use k8s_openapi::api::core::v1::Node;
use serde_json::json;

const VXLAN: u32 = 7;
const UNDERLAY: u32 = 2;

fn node(name: &str, cidrs: &[&str], mac: Option<&str>, ip: Option<&str>) -> Node {
    let mut ann = serde_json::Map::new();
    if let Some(m) = mac {
        ann.insert(ANN_VTEP_MAC.into(), json!(m));
    }
    if let Some(i) = ip {
        ann.insert(ANN_PUBLIC_IP.into(), json!(i));
    }
    let mut spec = serde_json::Map::new();
    if let Some(first) = cidrs.first() {
        spec.insert("podCIDR".into(), json!(first));
        spec.insert("podCIDRs".into(), json!(cidrs));
    }
    serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Node",
        "metadata": {"name": name, "annotations": ann},
        "spec": spec,
    }))
    .unwrap()
}

fn local(direct: bool) -> LocalFacts {
    LocalFacts {
        underlay_ip: "192.168.77.11".parse().unwrap(),
        underlay_index: UNDERLAY,
        underlay_nets: vec!["192.168.77.0/24".parse().unwrap()],
        vxlan_index: VXLAN,
        direct_routing: direct,
    }
}

fn mac(s: &str) -> Mac {
    s.parse().unwrap()
}
fn ip(s: &str) -> IpAddr {
    s.parse().unwrap()
}
fn net(s: &str) -> IpNet {
    s.parse().unwrap()
}

fn cluster() -> Vec<Node> {
    vec![
        node(
            "node1",
            &["10.244.1.0/24"],
            Some("02:00:00:00:00:01"),
            Some("192.168.77.11"),
        ),
        node(
            "node2",
            &["10.244.2.0/24"],
            Some("02:00:00:00:00:02"),
            Some("192.168.77.12"),
        ),
        node(
            "node3",
            &["10.244.3.0/24"],
            Some("02:00:00:00:00:03"),
            Some("10.9.9.13"),
        ),
        // Not ready: no pod CIDR, or no annotations yet.
        node(
            "node4",
            &[],
            Some("02:00:00:00:00:04"),
            Some("192.168.77.14"),
        ),
        node("node5", &["10.244.5.0/24"], None, None),
        // Malformed.
        node(
            "bad-cidr",
            &["10.244.300.0/24"],
            Some("02:00:00:00:00:06"),
            Some("192.168.77.16"),
        ),
        node(
            "bad-mac",
            &["10.244.7.0/24"],
            Some("zz:00:00:00:00:07"),
            Some("192.168.77.17"),
        ),
        node(
            "bad-ip",
            &["10.244.8.0/24"],
            Some("02:00:00:00:00:08"),
            Some("not-an-ip"),
        ),
    ]
}

#[test]
fn desired_entries_for_the_peers_only() {
    let (d, skipped) = desired_entries("node1", &cluster(), &local(false));
    let want_fdb: Vec<(Mac, IpAddr)> = vec![
        (mac("02:00:00:00:00:02"), ip("192.168.77.12")),
        (mac("02:00:00:00:00:03"), ip("10.9.9.13")),
    ];
    assert_eq!(d.fdb.iter().copied().collect::<Vec<_>>(), want_fdb);
    assert_eq!(
        d.neigh,
        BTreeMap::from([
            (ip("10.244.2.0"), mac("02:00:00:00:00:02")),
            (ip("10.244.3.0"), mac("02:00:00:00:00:03")),
        ])
    );
    assert_eq!(
        d.routes,
        BTreeMap::from([
            (
                net("10.244.2.0/24"),
                RouteSpec {
                    gateway: ip("10.244.2.0"),
                    oif: VXLAN,
                    onlink: true
                }
            ),
            (
                net("10.244.3.0/24"),
                RouteSpec {
                    gateway: ip("10.244.3.0"),
                    oif: VXLAN,
                    onlink: true
                }
            ),
        ])
    );
    // Own node excluded silently; the others reported.
    assert_eq!(skipped.len(), 5, "{skipped:?}");
    assert!(skipped.contains(&Skipped::NotReady("node4".into())));
    assert!(skipped.contains(&Skipped::NotReady("node5".into())));
    let invalid: Vec<String> = skipped
        .iter()
        .filter_map(|s| match s {
            Skipped::Invalid(e) => Some(e.to_string()),
            _ => None,
        })
        .collect();
    assert_eq!(invalid.len(), 3);
    assert!(invalid
        .iter()
        .any(|e| e.contains("bad-cidr") && e.contains("10.244.300.0/24")));
    assert!(invalid
        .iter()
        .any(|e| e.contains("bad-mac") && e.contains(ANN_VTEP_MAC)));
    assert!(invalid
        .iter()
        .any(|e| e.contains("bad-ip") && e.contains(ANN_PUBLIC_IP)));
}

#[test]
fn direct_routing_only_for_peers_on_a_connected_subnet() {
    let (d, _) = desired_entries("node1", &cluster(), &local(true));
    // node2 is on 192.168.77.0/24: a plain route via its underlay address, no VXLAN entries.
    assert_eq!(
        d.routes[&net("10.244.2.0/24")],
        RouteSpec {
            gateway: ip("192.168.77.12"),
            oif: UNDERLAY,
            onlink: false
        }
    );
    assert!(!d.neigh.contains_key(&ip("10.244.2.0")));
    assert!(!d.fdb.iter().any(|(m, _)| *m == mac("02:00:00:00:00:02")));
    // node3 is elsewhere: through the overlay.
    assert_eq!(d.routes[&net("10.244.3.0/24")].oif, VXLAN);
    assert!(d.fdb.contains(&(mac("02:00:00:00:00:03"), ip("10.9.9.13"))));
}

#[test]
fn dual_stack_peer_gets_a_route_and_neighbour_per_family() {
    let nodes = vec![node(
        "node2",
        &["10.244.2.0/24", "fd00:10:244:2::/64"],
        Some("02:00:00:00:00:02"),
        Some("192.168.77.12"),
    )];
    let (d, skipped) = desired_entries("node1", &nodes, &local(true));
    assert!(skipped.is_empty());
    // IPv4 goes direct, IPv6 cannot (IPv4 underlay): VXLAN for it.
    assert_eq!(d.routes[&net("10.244.2.0/24")].oif, UNDERLAY);
    assert_eq!(
        d.routes[&net("fd00:10:244:2::/64")],
        RouteSpec {
            gateway: ip("fd00:10:244:2::"),
            oif: VXLAN,
            onlink: true
        }
    );
    assert_eq!(d.neigh[&ip("fd00:10:244:2::")], mac("02:00:00:00:00:02"));
    assert_eq!(d.fdb.len(), 1);
}

#[test]
fn peers_with_our_address_or_another_family_are_skipped() {
    let nodes = vec![
        node(
            "twin",
            &["10.244.9.0/24"],
            Some("02:00:00:00:00:09"),
            Some("192.168.77.11"),
        ),
        node(
            "v6",
            &["10.244.10.0/24"],
            Some("02:00:00:00:00:0a"),
            Some("fd00::10"),
        ),
    ];
    let (d, skipped) = desired_entries("node1", &nodes, &local(false));
    assert_eq!(d, Entries::default());
    assert_eq!(skipped.len(), 2);
    assert!(skipped.contains(&Skipped::SameUnderlay("twin".into())));
}

#[test]
fn node_view_reads_pod_cidr_when_the_list_is_empty() {
    let n: Node = serde_json::from_value(json!({
        "metadata": {"name": "old"}, "spec": {"podCIDR": "10.244.4.7/24"}
    }))
    .unwrap();
    let v = node_view(&n).unwrap();
    assert_eq!(v.pod_cidrs, vec![net("10.244.4.0/24")]);
    assert_eq!(v.vtep_mac, None);
    let tiny = node("tiny", &["10.244.4.1/32"], None, None);
    assert!(node_view(&tiny).is_err());
}

#[test]
fn mac_parsing() {
    assert_eq!(mac("0A:1b:2c:3d:4e:5f").to_string(), "0a:1b:2c:3d:4e:5f");
    for bad in [
        "",
        "00:00:00:00:00:00",
        "01:00:5e:00:00:01",
        "02:00:00:00:00",
        "02:00:00:00:00:00:00",
        "2:0:0:0:0:1",
    ] {
        assert!(bad.parse::<Mac>().is_err(), "{bad}");
    }
}

#[test]
fn vtep_and_gateway_addresses() {
    let cidrs = [net("10.244.1.0/24"), net("fd00:1::/64")];
    assert_eq!(
        vtep_addresses(&cidrs),
        vec![net("10.244.1.0/32"), net("fd00:1::/128")]
    );
    assert_eq!(gateway_of(&cidrs[0]), net("10.244.1.1/24"));
    assert_eq!(gateway_of(&cidrs[1]), net("fd00:1::1/64"));
    assert_eq!(overlay_mtu(1500, ip("192.168.0.1")), 1450);
    assert_eq!(overlay_mtu(1500, ip("fd00::1")), 1430);
}

#[test]
fn plan_is_empty_when_observed_equals_desired() {
    let (d, _) = desired_entries("node1", &cluster(), &local(false));
    assert_eq!(plan(&d, &d), vec![]);
    assert_eq!(plan(&Entries::default(), &Entries::default()), vec![]);
}

#[test]
fn plan_from_scratch_adds_fdb_then_neighbours_then_routes() {
    let (d, _) = desired_entries("node1", &cluster(), &local(false));
    let ops = plan(&d, &Entries::default());
    assert_eq!(ops.len(), 6);
    let kind = |o: &Op| match o {
        Op::AddFdb { .. } => 0,
        Op::SetNeigh { .. } => 1,
        Op::SetRoute { .. } => 2,
        _ => 9,
    };
    let kinds: Vec<i32> = ops.iter().map(kind).collect();
    assert_eq!(kinds, vec![0, 0, 1, 1, 2, 2]);
}

#[test]
fn plan_touches_only_what_differs() {
    let (d, _) = desired_entries("node1", &cluster(), &local(false));
    let mut observed = d.clone();
    // node3's MAC changed (its netd recreated the device): the stale FDB pair goes, the new
    // one comes, the neighbour is replaced; the route is right and untouched.
    observed
        .fdb
        .remove(&(mac("02:00:00:00:00:03"), ip("10.9.9.13")));
    observed
        .fdb
        .insert((mac("02:00:00:00:00:33"), ip("10.9.9.13")));
    observed
        .neigh
        .insert(ip("10.244.3.0"), mac("02:00:00:00:00:33"));
    // A leftover of a node that left.
    observed.routes.insert(
        net("10.244.9.0/24"),
        RouteSpec {
            gateway: ip("10.244.9.0"),
            oif: VXLAN,
            onlink: true,
        },
    );
    observed
        .neigh
        .insert(ip("10.244.9.0"), mac("02:00:00:00:00:99"));
    observed
        .fdb
        .insert((mac("02:00:00:00:00:99"), ip("192.168.77.19")));
    let ops = plan(&d, &observed);
    assert_eq!(
        ops,
        vec![
            Op::DelRoute {
                dst: net("10.244.9.0/24"),
                route: RouteSpec {
                    gateway: ip("10.244.9.0"),
                    oif: VXLAN,
                    onlink: true
                }
            },
            Op::DelNeigh {
                ip: ip("10.244.9.0"),
                mac: mac("02:00:00:00:00:99")
            },
            Op::DelFdb {
                mac: mac("02:00:00:00:00:33"),
                dst: ip("10.9.9.13")
            },
            Op::DelFdb {
                mac: mac("02:00:00:00:00:99"),
                dst: ip("192.168.77.19")
            },
            Op::AddFdb {
                mac: mac("02:00:00:00:00:03"),
                dst: ip("10.9.9.13")
            },
            Op::SetNeigh {
                ip: ip("10.244.3.0"),
                mac: mac("02:00:00:00:00:03")
            },
        ]
    );
}

#[test]
fn plan_replaces_a_route_whose_next_hop_changed() {
    let (d, _) = desired_entries("node1", &cluster(), &local(false));
    let mut observed = d.clone();
    observed.routes.insert(
        net("10.244.2.0/24"),
        RouteSpec {
            gateway: ip("192.168.77.12"),
            oif: UNDERLAY,
            onlink: false,
        },
    );
    assert_eq!(
        plan(&d, &observed),
        vec![Op::SetRoute {
            dst: net("10.244.2.0/24"),
            route: d.routes[&net("10.244.2.0/24")]
        }]
    );
}

#[test]
fn annotations_are_patched_only_when_they_differ() {
    let want = own_annotations(mac("02:00:00:00:00:01"), ip("192.168.77.11"));
    let done = node(
        "node1",
        &[],
        Some("02:00:00:00:00:01"),
        Some("192.168.77.11"),
    );
    assert!(annotations_to_patch(&done, &want).is_empty());
    let stale = node("node1", &[], Some("02:00:00:00:00:99"), None);
    assert_eq!(annotations_to_patch(&stale, &want), want);
}

#[test]
fn subnet_file_golden() {
    assert_eq!(
        subnet_env(&[net("10.244.1.0/24")], 1450),
        "FERRO_SUBNET=10.244.1.0/24\nFERRO_MTU=1450\n"
    );
    let text = subnet_env(&[net("10.244.1.0/24"), net("fd00:1::/64")], 1450);
    assert_eq!(
        text,
        "FERRO_SUBNET=10.244.1.0/24,fd00:1::/64\nFERRO_MTU=1450\n"
    );
    // ferro-cni reads what ferro-netd writes.
    let nets = ferro_cni::config::parse_subnet_env(&text).unwrap();
    assert_eq!(nets, vec![net("10.244.1.0/24"), net("fd00:1::/64")]);
}

#[test]
fn conflist_golden_and_accepted_by_ferro_cni() {
    let text = conflist(
        "ferro0",
        1450,
        Path::new("/run/ferro/netd/subnet.env"),
        Some(&PathBuf::from("/var/lib/cni/networks")),
    );
    let want = r#"{
  "cniVersion": "1.0.0",
  "name": "ferro",
  "plugins": [
    {
      "type": "ferro",
      "bridge": "ferro0",
      "isGateway": true,
      "ipMasq": false,
      "mtu": 1450,
      "podCIDR": "node",
      "subnetFile": "/run/ferro/netd/subnet.env",
      "ipam": {
        "type": "ferro",
        "dataDir": "/var/lib/cni/networks"
      }
    },
    {
      "type": "portmap",
      "capabilities": {
        "portMappings": true
      }
    }
  ]
}
"#;
    assert_eq!(text, want);
    // The ferro entry, completed as a runtime does, is a valid ferro-cni config.
    let list: serde_json::Value = serde_json::from_str(&text).unwrap();
    let mut plugin = list["plugins"][0].clone();
    plugin["cniVersion"] = list["cniVersion"].clone();
    plugin["name"] = list["name"].clone();
    let conf = ferro_cni::config::NetConf::parse(plugin.to_string().as_bytes()).unwrap();
    conf.validate().unwrap();
    assert_eq!(conf.data_dir(), Path::new("/var/lib/cni/networks"));
    assert_eq!(conf.subnet_file, Path::new("/run/ferro/netd/subnet.env"));
    // Without --cni-data-dir the ipam section is left out (ferro-cni's default applies).
    let bare = conflist("ferro0", 1450, Path::new("/s"), None);
    assert!(!bare.contains("ipam"));
}

#[test]
fn masq_rules_golden() {
    let pods = [net("10.244.1.0/24"), net("fd00:1::/64")];
    let cluster = [net("10.244.0.0/16"), net("fd00::/48")];
    assert_eq!(
        masq_rules(&pods, &cluster, false),
        vec![
            "-A FERRO-NETD-MASQ -s 10.244.1.0/24 -d 10.244.0.0/16 -j RETURN".to_string(),
            "-A FERRO-NETD-MASQ -s 10.244.1.0/24 ! -d 224.0.0.0/4 -j MASQUERADE --random-fully"
                .to_string(),
        ]
    );
    assert_eq!(
        masq_rules(&pods, &cluster, true),
        vec![
            "-A FERRO-NETD-MASQ -s fd00:1::/64 -d fd00::/48 -j RETURN".to_string(),
            "-A FERRO-NETD-MASQ -s fd00:1::/64 ! -d ff00::/8 -j MASQUERADE --random-fully"
                .to_string(),
        ]
    );
    assert!(masq_rules(&pods, &[], false).is_empty());
    assert!(masq_rules(&pods[..1], &cluster, true).is_empty());
}

#[test]
fn masq_restore_input_golden_and_idempotent() {
    let rules = masq_rules(&[net("10.244.1.0/24")], &[net("10.244.0.0/16")], false);
    let first = render_masq(&rules, &MasqObserved::default()).unwrap();
    assert_eq!(
        first,
        "*nat\n\
         :FERRO-NETD-MASQ - [0:0]\n\
         -A FERRO-NETD-MASQ -s 10.244.1.0/24 -d 10.244.0.0/16 -j RETURN\n\
         -A FERRO-NETD-MASQ -s 10.244.1.0/24 ! -d 224.0.0.0/4 -j MASQUERADE --random-fully\n\
         -A POSTROUTING -m comment --comment \"ferro-netd: masquerade pod traffic leaving the cluster\" -j FERRO-NETD-MASQ\n\
         COMMIT\n"
    );
    // What iptables-save prints after that: nothing to do.
    let saved = "# Generated by iptables-save v1.8.9 (nf_tables)\n\
        *nat\n\
        :PREROUTING ACCEPT [0:0]\n\
        :POSTROUTING ACCEPT [0:0]\n\
        :FERRO-MASQ-0123456789ABCDEF - [0:0]\n\
        :FERRO-NETD-MASQ - [0:0]\n\
        -A POSTROUTING -s 10.244.1.5/32 -j FERRO-MASQ-0123456789ABCDEF\n\
        -A POSTROUTING -m comment --comment \"ferro-netd: masquerade pod traffic leaving the cluster\" -j FERRO-NETD-MASQ\n\
        -A FERRO-NETD-MASQ -s 10.244.1.0/24 -d 10.244.0.0/16 -j RETURN\n\
        -A FERRO-NETD-MASQ -s 10.244.1.0/24 ! -d 224.0.0.0/4 -j MASQUERADE --random-fully\n\
        COMMIT\n";
    let o = observe_masq(saved);
    assert!(o.chain_exists);
    assert_eq!(o.jumps.len(), 1);
    assert_eq!(render_masq(&rules, &o), None);
    // A changed cluster CIDR refills the chain and keeps the single jump.
    let other = masq_rules(&[net("10.244.1.0/24")], &[net("10.0.0.0/8")], false);
    let text = render_masq(&other, &o).unwrap();
    assert!(text.contains(":FERRO-NETD-MASQ - [0:0]\n"));
    assert!(!text.contains("POSTROUTING"));
    // Two jumps (someone added one by hand) collapse to one.
    let mut twice = o.clone();
    twice.jumps.push("-j FERRO-NETD-MASQ".into());
    let text = render_masq(&rules, &twice).unwrap();
    assert_eq!(text.matches("-D POSTROUTING").count(), 2);
    assert_eq!(text.matches("-A POSTROUTING").count(), 1);
    // Without a cluster CIDR the nat table is left alone.
    assert_eq!(render_masq(&[], &MasqObserved::default()), None);
}

#[test]
fn atomic_write_only_when_changed() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("sub/dir/subnet.env");
    assert!(write_if_changed(&p, "a\n").unwrap());
    assert!(!write_if_changed(&p, "a\n").unwrap());
    assert!(write_if_changed(&p, "b\n").unwrap());
    assert_eq!(std::fs::read_to_string(&p).unwrap(), "b\n");
    let names: Vec<_> = std::fs::read_dir(p.parent().unwrap()).unwrap().collect();
    assert_eq!(names.len(), 1, "no temp file left behind");
}

fn parse(args: &[&str]) -> Result<ferro_cni::netd::config::Config, String> {
    let mut full = vec!["ferro-netd"];
    full.extend_from_slice(args);
    let a = Args::try_parse_from(full).map_err(|e| e.to_string())?;
    a.validate(|| Some("Host-A".into()))
        .map_err(|e| e.to_string())
}

#[test]
fn flags_defaults() {
    let c = parse(&[]).unwrap();
    assert_eq!(c.node_name, "host-a");
    assert_eq!(c.cni_conf_dir, Path::new("/etc/cni/net.d"));
    assert_eq!(
        c.conflist_path(),
        Path::new("/etc/cni/net.d/10-ferro.conflist")
    );
    assert_eq!(c.subnet_file, Path::new("/run/ferro/netd/subnet.env"));
    assert_eq!((c.vxlan_id, c.vxlan_port), (1, 8472));
    assert_eq!(c.resync_period, std::time::Duration::from_secs(30));
    assert_eq!(c.bridge, "ferro0");
    assert!(!c.direct_routing);
    assert!(c.cluster_cidrs.is_empty());
    let c = parse(&[
        "--hostname-override",
        "node1",
        "--cluster-cidr",
        "10.244.0.0/16,fd00::/48",
        "--resync-period",
        "500ms",
        "--node-ip",
        "192.168.77.11",
        "--direct-routing",
    ])
    .unwrap();
    assert_eq!(c.node_name, "node1");
    assert_eq!(
        c.cluster_cidrs,
        vec![net("10.244.0.0/16"), net("fd00::/48")]
    );
    assert_eq!(c.resync_period, std::time::Duration::from_millis(500));
    assert!(c.direct_routing);
}

#[test]
fn bad_flags_are_clear_errors() {
    let cases: &[(&[&str], &str)] = &[
        (&["--vxlan-id", "0"], "--vxlan-id"),
        (&["--vxlan-id", "16777216"], "--vxlan-id"),
        (&["--vxlan-port", "0"], "--vxlan-port"),
        (&["--vxlan-port", "70000"], "--vxlan-port"),
        (&["--cluster-cidr", "10.244.0.0/33"], "--cluster-cidr"),
        (&["--cluster-cidr", "banana"], "--cluster-cidr"),
        (&["--resync-period", "soon"], "--resync-period"),
        (&["--resync-period", "0s"], "--resync-period"),
        (&["--iface", "much-too-long-name"], "--iface"),
        (&["--bridge", "a/b"], "--bridge"),
        (&["--node-ip", "127.0.0.1"], "--node-ip"),
        (&["--node-ip", "1.2.3"], "--node-ip"),
        (
            &["--hostname-override", "Not_A_Node"],
            "--hostname-override",
        ),
        (&["--no-such-flag"], "--no-such-flag"),
    ];
    for (args, flag) in cases {
        let err = parse(args).unwrap_err();
        assert!(err.contains(flag), "{args:?}: {err}");
    }
    let a = Args::try_parse_from(["ferro-netd"]).unwrap();
    let err = a.validate(|| None).unwrap_err().to_string();
    assert!(err.contains("--hostname-override"), "{err}");
}

/// A recording fake of the executor: the kernel's owned entries live in memory.
#[derive(Default)]
struct FakeKernel {
    entries: std::sync::Mutex<Entries>,
    calls: std::sync::Mutex<Vec<String>>,
    fail_route_to: Option<IpNet>,
}

impl FakeKernel {
    fn calls(&self) -> Vec<String> {
        self.calls.lock().unwrap().clone()
    }
    fn log(&self, s: String) {
        self.calls.lock().unwrap().push(s);
    }
}

impl ferro_cni::netd::kernel::Kernel for FakeKernel {
    async fn underlay(
        &self,
        _iface: Option<&str>,
        node_ip: Option<IpAddr>,
    ) -> Result<ferro_cni::netd::kernel::Underlay, ferro_cni::netd::error::KernelError> {
        self.log("underlay".into());
        Ok(ferro_cni::netd::kernel::Underlay {
            name: "eth0".into(),
            index: UNDERLAY,
            mtu: 1500,
            ip: node_ip.unwrap_or(ip("192.168.77.11")),
            nets: vec![net("192.168.77.0/24")],
        })
    }
    async fn ensure_vxlan(
        &self,
        spec: &ferro_cni::netd::kernel::VxlanSpec,
    ) -> Result<(u32, Mac), ferro_cni::netd::error::KernelError> {
        self.log(format!(
            "vxlan {} vni={} port={} local={} dev={} mtu={} addrs={:?}",
            spec.name,
            spec.vni,
            spec.port,
            spec.local,
            spec.underlay_index,
            spec.mtu,
            spec.addresses
        ));
        Ok((VXLAN, mac("02:00:00:00:00:01")))
    }
    async fn ensure_bridge(
        &self,
        spec: &ferro_cni::netd::kernel::BridgeSpec,
    ) -> Result<(), ferro_cni::netd::error::KernelError> {
        self.log(format!(
            "bridge {} mtu={} addrs={:?}",
            spec.name, spec.mtu, spec.addresses
        ));
        Ok(())
    }
    async fn observe(&self, _vxlan: u32) -> Result<Entries, ferro_cni::netd::error::KernelError> {
        Ok(self.entries.lock().unwrap().clone())
    }
    async fn apply(&self, _vxlan: u32, op: &Op) -> Result<(), ferro_cni::netd::error::KernelError> {
        self.log(format!("op {op:?}"));
        let mut e = self.entries.lock().unwrap();
        match op {
            Op::SetRoute { dst, .. } if Some(*dst) == self.fail_route_to => {
                return Err(ferro_cni::netd::error::KernelError::Underlay(
                    "injected".into(),
                ))
            }
            Op::DelRoute { dst, .. } => {
                e.routes.remove(dst);
            }
            Op::DelNeigh { ip, .. } => {
                e.neigh.remove(ip);
            }
            Op::DelFdb { mac, dst } => {
                e.fdb.remove(&(*mac, *dst));
            }
            Op::AddFdb { mac, dst } => {
                e.fdb.insert((*mac, *dst));
            }
            Op::SetNeigh { ip, mac } => {
                e.neigh.insert(*ip, *mac);
            }
            Op::SetRoute { dst, route } => {
                e.routes.insert(*dst, *route);
            }
        }
        Ok(())
    }
    fn ensure_masq(
        &self,
        v6: bool,
        rules: &[String],
    ) -> Result<bool, ferro_cni::netd::error::KernelError> {
        if rules.is_empty() {
            return Ok(false);
        }
        self.log(format!("masq v6={v6} {rules:?}"));
        Ok(true)
    }
}

fn netd_config(dir: &Path) -> ferro_cni::netd::config::Config {
    let a = Args::try_parse_from([
        "ferro-netd",
        "--hostname-override",
        "node1",
        "--cni-conf-dir",
        dir.join("net.d").to_str().unwrap(),
        "--subnet-file",
        dir.join("run/subnet.env").to_str().unwrap(),
        "--node-ip",
        "192.168.77.11",
        "--cluster-cidr",
        "10.244.0.0/16",
    ])
    .unwrap();
    a.validate(|| None).unwrap()
}

#[tokio::test]
async fn reconcile_writes_nothing_until_the_node_has_a_pod_cidr() {
    use ferro_cni::netd::controller::reconcile;
    let dir = tempfile::tempdir().unwrap();
    let cfg = netd_config(dir.path());
    let k = FakeKernel::default();
    // Own node missing.
    let out = reconcile(&cfg, &k, &cluster()[1..]).await.unwrap();
    assert!(out.waiting.unwrap().contains("not found"));
    // Own node without a pod CIDR.
    let mut nodes = cluster();
    nodes[0] = node("node1", &[], None, None);
    let out = reconcile(&cfg, &k, &nodes).await.unwrap();
    assert!(out.waiting.unwrap().contains("no podCIDR"));
    assert!(k.calls().is_empty(), "{:?}", k.calls());
    assert!(!dir.path().join("net.d").exists());
    assert!(!dir.path().join("run").exists());
}

#[tokio::test]
async fn reconcile_converges_then_does_nothing() {
    use ferro_cni::netd::controller::reconcile;
    let dir = tempfile::tempdir().unwrap();
    let cfg = netd_config(dir.path());
    let k = FakeKernel::default();
    let mut nodes = cluster();
    nodes[0] = node("node1", &["10.244.1.0/24"], None, None);
    let out = reconcile(&cfg, &k, &nodes).await.unwrap();
    assert_eq!(out.waiting, None);
    assert_eq!(out.applied, 6);
    assert_eq!(
        out.patch,
        own_annotations(mac("02:00:00:00:00:01"), ip("192.168.77.11"))
    );
    let calls = k.calls();
    assert_eq!(
        calls[1],
        "vxlan ferro.vxlan vni=1 port=8472 local=192.168.77.11 dev=2 mtu=1450 addrs=[10.244.1.0/32]"
    );
    assert_eq!(calls[2], "bridge ferro0 mtu=1450 addrs=[10.244.1.1/24]");
    assert!(calls.last().unwrap().starts_with("masq v6=false"));
    assert_eq!(
        std::fs::read_to_string(dir.path().join("run/subnet.env")).unwrap(),
        "FERRO_SUBNET=10.244.1.0/24\nFERRO_MTU=1450\n"
    );
    assert!(dir.path().join("net.d/10-ferro.conflist").exists());
    let (want, _) = desired_entries("node1", &nodes, &local(false));
    assert_eq!(*k.entries.lock().unwrap(), want);
    // Level-triggered and idempotent: the second run applies nothing.
    let out = reconcile(&cfg, &k, &nodes).await.unwrap();
    assert_eq!(out.applied, 0);
    // node3 leaves: exactly its three entries go.
    nodes.remove(2);
    let before = k.calls().len();
    let out = reconcile(&cfg, &k, &nodes).await.unwrap();
    assert_eq!(out.applied, 3);
    let ops: Vec<String> = k.calls()[before..]
        .iter()
        .filter(|c| c.starts_with("op "))
        .cloned()
        .collect();
    assert_eq!(ops.len(), 3, "{ops:?}");
    assert!(ops.iter().all(|o| o.starts_with("op Del")), "{ops:?}");
}

#[tokio::test]
async fn a_broken_own_annotation_is_repaired_not_fatal() {
    use ferro_cni::netd::controller::reconcile;
    let dir = tempfile::tempdir().unwrap();
    let cfg = netd_config(dir.path());
    let k = FakeKernel::default();
    let mut nodes = cluster();
    nodes[0] = node(
        "node1",
        &["10.244.1.0/24"],
        Some("garbage"),
        Some("also garbage"),
    );
    let out = reconcile(&cfg, &k, &nodes).await.unwrap();
    assert_eq!(out.waiting, None);
    assert_eq!(
        out.patch,
        own_annotations(mac("02:00:00:00:00:01"), ip("192.168.77.11"))
    );
    // A malformed own pod CIDR, though, stops everything: there is nothing sane to write.
    nodes[0] = node("node1", &["10.244.1.0/99"], None, None);
    let out = reconcile(&cfg, &k, &nodes).await.unwrap();
    assert!(out.waiting.unwrap().contains("10.244.1.0/99"));
}

#[tokio::test]
async fn a_failing_op_does_not_stop_the_others() {
    use ferro_cni::netd::controller::reconcile;
    let dir = tempfile::tempdir().unwrap();
    let cfg = netd_config(dir.path());
    let k = FakeKernel {
        fail_route_to: Some(net("10.244.2.0/24")),
        ..FakeKernel::default()
    };
    let mut nodes = cluster();
    nodes[0] = node("node1", &["10.244.1.0/24"], None, None);
    let out = reconcile(&cfg, &k, &nodes).await.unwrap();
    assert_eq!(out.errors.len(), 1);
    assert!(
        out.errors[0].to_string().contains("injected"),
        "{:?}",
        out.errors
    );
    assert_eq!(out.applied, 5);
    // The rest was done: the other peer's route, masquerade, the files, the annotations.
    assert!(!out.patch.is_empty());
    assert!(k.calls().last().unwrap().starts_with("masq"));
    assert!(dir.path().join("net.d/10-ferro.conflist").exists());
    let e = k.entries.lock().unwrap().clone();
    assert!(e.routes.contains_key(&net("10.244.3.0/24")));
    assert!(!e.routes.contains_key(&net("10.244.2.0/24")));
}
