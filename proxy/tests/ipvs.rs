//! Privileged: IPVS mode against the parts of the kernel this machine has. Its kernel has no
//! ip_vs (CONFIG_IP_VS is not set) and no dummy links, so the virtual servers are tested
//! against the plan and recorded netlink messages only (unit tests in src/ipvs); here the
//! ipset executor writes real sets in a namespace of its own (read back with the `ipset`
//! tool, an independent reader), the mode's iptables rules load into the real iptables
//! matching those sets, and ferro-proxy refuses `--proxy-mode ipvs` at start with the reason.
#![allow(clippy::unwrap_used)]

mod common;

use std::collections::BTreeSet;
use std::process::Command;

use common::InNs;
use ferro_lab::netns::NetNs;
use ferro_proxy::exec::Runner;
use ferro_proxy::ipvs::ipset::Ipset;
use ferro_proxy::ipvs::plan::{self, set_name, SetEntry, SetKind};
use ferro_proxy::ipvs::rules;
use ferro_proxy::model::{Family, Protocol};

fn ns(tag: &str) -> NetNs {
    ferro_lab::require_root().unwrap();
    ferro_lab::require_bin("ipset", "ipset").unwrap();
    NetNs::new(&format!("fpx-{tag}-{}", std::process::id())).unwrap()
}

/// `ipset save` in `ns`, as (set -> sorted member lines).
fn saved(ns: &NetNs) -> std::collections::BTreeMap<String, BTreeSet<String>> {
    let out = InNs(ns.name().to_string()).run("ipset", &["save"], None).unwrap();
    let mut sets = std::collections::BTreeMap::new();
    for line in out.lines() {
        let w: Vec<&str> = line.split_whitespace().collect();
        match w.first() {
            Some(&"create") => {
                sets.insert(w[1].to_string(), BTreeSet::new());
            }
            Some(&"add") => {
                sets.entry(w[1].to_string()).or_insert_with(BTreeSet::new).insert(w[2].to_string());
            }
            _ => {}
        }
    }
    sets
}

fn ip(s: &str) -> std::net::IpAddr {
    s.parse().unwrap()
}

#[test]
#[ignore = "privileged: needs root, the ipset tool and a network namespace; run by scripts/test.sh"]
fn ipsets_are_written_through_netlink_as_the_ipset_tool_reads_them() {
    let ns = ns("ipset");
    let mut k = Ipset::new(Some(ns.path().into()));
    for family in [Family::V4, Family::V6] {
        for (base, kind) in plan::SETS {
            k.create(&set_name(base, family), *kind, family).unwrap();
        }
    }
    // creating again is not an error (a restart finds its sets)
    k.create("KUBE-CLUSTER-IP", SetKind::IpPort, Family::V4).unwrap();
    let entries = [
        ("KUBE-CLUSTER-IP", SetEntry::IpPort(ip("172.30.0.10"), Protocol::Tcp, 80), "172.30.0.10,tcp:80"),
        ("KUBE-LOOP-BACK", SetEntry::IpPortIp(ip("10.244.0.11"), Protocol::Udp, 53, ip("10.244.0.11")), "10.244.0.11,udp:53,10.244.0.11"),
        (
            "KUBE-LOAD-BALANCER-SOURCE-CIDR",
            SetEntry::IpPortNet(ip("203.0.113.50"), Protocol::Tcp, 443, "198.51.100.0/24".parse().unwrap()),
            "203.0.113.50,tcp:443,198.51.100.0/24",
        ),
        ("KUBE-NODE-PORT-TCP", SetEntry::Port(30080), "30080"),
        ("KUBE-NODE-PORT-SCTP-HASH", SetEntry::IpPort(ip("192.168.77.1"), Protocol::Sctp, 30090), "192.168.77.1,sctp:30090"),
        ("KUBE-IPVS-IPS", SetEntry::Ip(ip("172.30.0.10")), "172.30.0.10"),
        ("KUBE-6-CLUSTER-IP", SetEntry::IpPort(ip("fd00:30::10"), Protocol::Tcp, 80), "fd00:30::10,tcp:80"),
        ("KUBE-6-LB-SOURCE-CIDR", SetEntry::IpPortNet(ip("fd00:30::50"), Protocol::Tcp, 443, "2001:db8::/32".parse().unwrap()), "fd00:30::50,tcp:443,2001:db8::/32"),
    ];
    for (set, e, _) in &entries {
        k.add(set, e).unwrap();
        k.add(set, e).unwrap(); // adding twice is fine too
    }
    let got = saved(&ns);
    for (base, _) in plan::SETS {
        for f in [Family::V4, Family::V6] {
            assert!(got.contains_key(&set_name(base, f)), "{} missing: {got:?}", set_name(base, f));
        }
    }
    for (set, _, text) in &entries {
        assert!(got[*set].contains(*text), "{set}: {:?} lacks {text}", got[*set]);
    }
    // deletions, also of a member that is not there
    let (set, e, _) = &entries[0];
    k.del(set, e).unwrap();
    k.del(set, e).unwrap();
    assert!(saved(&ns)["KUBE-CLUSTER-IP"].is_empty());

    // a wrong entry for the set's type is refused with a clear error
    let err = k.add("KUBE-NODE-PORT-TCP", &SetEntry::Ip(ip("10.0.0.1"))).unwrap_err();
    assert!(err.to_string().contains("add KUBE-NODE-PORT-TCP 10.0.0.1"), "{err}");

    // a whole replacement: exactly the new members, the scratch set gone
    let new: BTreeSet<SetEntry> = [SetEntry::Port(30081), SetEntry::Port(30082)].into_iter().collect();
    k.replace("KUBE-NODE-PORT-TCP", SetKind::Port, Family::V4, &new).unwrap();
    let got = saved(&ns);
    assert_eq!(got["KUBE-NODE-PORT-TCP"], ["30081", "30082"].iter().map(|s| s.to_string()).collect());
    assert!(!got.keys().any(|k| k.ends_with("-TMP")), "{got:?}");

    for name in got.keys() {
        k.destroy(name).unwrap();
    }
    assert!(saved(&ns).is_empty());
}

#[test]
#[ignore = "privileged: needs root, the ipset tool and a network namespace; run by scripts/test.sh"]
fn the_modes_iptables_rules_load_with_their_sets_and_only_then() {
    let ns = ns("ipvsrules");
    let mut run = InNs(ns.name().to_string());
    let cidrs = vec!["10.244.0.0/16".parse().unwrap(), "fd00:10::/64".parse().unwrap()];
    let text = rules::render(Family::V4, &cidrs, false, &rules::base_jumps());
    // before the sets exist the kernel refuses the rules: the sets are created first
    let refused = run.run("iptables-restore", &["-w", "--noflush"], Some(&text));
    assert!(refused.is_err(), "rules naming missing sets must not load");
    let mut k = Ipset::new(Some(ns.path().into()));
    for family in [Family::V4, Family::V6] {
        for (base, kind) in plan::SETS {
            k.create(&set_name(base, family), *kind, family).unwrap();
        }
    }
    run.run("iptables-restore", &["-w", "--noflush"], Some(&text)).unwrap();
    run.run("ip6tables-restore", &["-w", "--noflush"], Some(&rules::render(Family::V6, &cidrs, false, &rules::base_jumps())))
        .unwrap();
    let nat = run.run("iptables-save", &["-t", "nat"], None).unwrap();
    assert!(nat.contains("-A KUBE-SERVICES ! -s 10.244.0.0/16 -m comment --comment \"Kubernetes service cluster ip + port for masquerade purpose\" -m set --match-set KUBE-CLUSTER-IP dst,dst -j KUBE-MARK-MASQ"), "{nat}");
    assert!(nat.contains("-A PREROUTING -m comment --comment \"kubernetes service portals\" -j KUBE-SERVICES"));
    // a second load (a later full sync) finds every jump present: none is inserted twice
    let filter = run.run("iptables-save", &["-t", "filter"], None).unwrap();
    let missing = ferro_proxy::iptables::rules::missing_of(&format!("{filter}{nat}"), rules::base_jumps());
    assert!(missing.is_empty(), "{missing:?}");
    run.run("iptables-restore", &["-w", "--noflush"], Some(&rules::render(Family::V4, &cidrs, false, &missing)))
        .unwrap();
    let again = run.run("iptables-save", &["-t", "nat"], None).unwrap();
    assert_eq!(again.matches("-j KUBE-POSTROUTING").count(), 1, "{again}");
    // sets referenced by rules cannot be destroyed; --cleanup removes rules first
    assert!(k.destroy("KUBE-CLUSTER-IP").is_err());
}

#[test]
#[ignore = "privileged: needs root and a network namespace; run by scripts/test.sh"]
fn ferro_proxy_refuses_ipvs_mode_on_a_kernel_without_ipvs() {
    let ns = ns("ipvsmode");
    let probe = std::path::Path::new("/proc/net/ip_vs");
    assert!(!probe.exists(), "this test is about a kernel without IPVS; this one has it");
    let dir = tempfile::tempdir().unwrap();
    let kubeconfig = dir.path().join("kubeconfig");
    std::fs::write(
        &kubeconfig,
        "apiVersion: v1\nkind: Config\nclusters: [{name: c, cluster: {server: \"https://127.0.0.1:1\"}}]\nusers: [{name: u, user: {token: x}}]\ncontexts: [{name: c, context: {cluster: c, user: u}}]\ncurrent-context: c\n",
    )
    .unwrap();
    let out = Command::new("ip")
        .args(["netns", "exec", ns.name()])
        .arg(common::workspace_bin("ferro-proxy"))
        .args(["--proxy-mode", "ipvs", "--hostname-override", "n1", "--kubeconfig"])
        .arg(&kubeconfig)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{stderr}");
    assert!(stderr.contains("no IPVS") && stderr.contains("--proxy-mode iptables or nftables"), "{stderr}");
    // nothing was left behind in the namespace
    let nat = InNs(ns.name().to_string()).run("iptables-save", &["-t", "nat"], None).unwrap();
    assert!(!nat.contains("KUBE-"), "{nat}");
}
