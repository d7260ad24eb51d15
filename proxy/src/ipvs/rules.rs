//! The iptables rules of IPVS mode, as upstream's IPVS proxier writes them: a fixed set of
//! chains whose rules match the ipsets (the Services live in the sets and in IPVS, so the
//! text does not grow with the number of Services and is rewritten whole at every sync that
//! writes it).

use ipnet::IpNet;

use super::plan::set_name;
use crate::iptables::rules::{canary_rule, BaseJump, KUBE_PROXY_CANARY};
use crate::model::Family;

/// Upstream's masquerade mark (masqueradeBit 14).
const MARK: &str = "0x4000";

/// The jumps from the built-in chains into IPVS mode's chains.
pub fn base_jumps() -> Vec<BaseJump> {
    let j = |table, chain, rule: &str| BaseJump {
        table,
        chain,
        rule: rule.to_string(),
    };
    vec![
        j("nat", "PREROUTING", "-m comment --comment \"kubernetes service portals\" -j KUBE-SERVICES"),
        j("nat", "OUTPUT", "-m comment --comment \"kubernetes service portals\" -j KUBE-SERVICES"),
        j("nat", "POSTROUTING", "-m comment --comment \"kubernetes postrouting rules\" -j KUBE-POSTROUTING"),
        j("filter", "INPUT", "-m comment --comment \"kubernetes ipvs access filter\" -j KUBE-IPVS-FILTER"),
        j("filter", "INPUT", "-m comment --comment \"kubernetes health check rules\" -j KUBE-NODE-PORT"),
        j("filter", "INPUT", "-m conntrack --ctstate NEW -m comment --comment \"kubernetes load balancer firewall\" -j KUBE-PROXY-FIREWALL"),
        j("filter", "FORWARD", "-m comment --comment \"kubernetes forwarding rules\" -j KUBE-FORWARD"),
        j("filter", "FORWARD", "-m conntrack --ctstate NEW -m comment --comment \"kubernetes load balancer firewall\" -j KUBE-PROXY-FIREWALL"),
        j("filter", "OUTPUT", "-m conntrack --ctstate NEW -m comment --comment \"kubernetes load balancer firewall\" -j KUBE-PROXY-FIREWALL"),
    ]
}

/// The chains IPVS mode owns, per table.
pub const NAT_CHAINS: &[&str] = &["KUBE-SERVICES", "KUBE-POSTROUTING", "KUBE-NODE-PORT", "KUBE-LOAD-BALANCER", "KUBE-MARK-MASQ"];
pub const FILTER_CHAINS: &[&str] = &[
    "KUBE-FORWARD",
    "KUBE-NODE-PORT",
    "KUBE-PROXY-FIREWALL",
    "KUBE-SOURCE-RANGES-FIREWALL",
    "KUBE-IPVS-FILTER",
];

/// The whole iptables-restore text for `family` (to load with --noflush: the chains are
/// declared, so flushed and rewritten; `missing` base jumps are inserted).
pub fn render(family: Family, cluster_cidrs: &[IpNet], masquerade_all: bool, missing: &[BaseJump]) -> String {
    let s = |base: &str| set_name(base, family);
    let mut out = String::new();
    let mut w = |line: String| {
        out.push_str(&line);
        out.push('\n');
    };
    for table in ["mangle", "nat", "filter"] {
        w(format!("*{table}"));
        w(format!(":{KUBE_PROXY_CANARY} - [0:0]"));
        let chains: &[&str] = match table {
            "nat" => NAT_CHAINS,
            "filter" => FILTER_CHAINS,
            _ => &[],
        };
        for c in chains {
            w(format!(":{c} - [0:0]"));
        }
        w(canary_rule());
        for j in missing.iter().filter(|j| j.table == table) {
            w(format!("-I {} {}", j.chain, j.rule));
        }
        match table {
            "nat" => {
                w(format!(
                    "-A KUBE-POSTROUTING -m comment --comment \"Kubernetes endpoints dst ip:port, source ip for solving hairpin purpose\" -m set --match-set {} dst,dst,src -j MASQUERADE",
                    s("KUBE-LOOP-BACK")
                ));
                w(format!("-A KUBE-POSTROUTING -m mark ! --mark {MARK}/{MARK} -j RETURN"));
                w(format!("-A KUBE-POSTROUTING -j MARK --xor-mark {MARK}"));
                w("-A KUBE-POSTROUTING -m comment --comment \"kubernetes service traffic requiring SNAT\" -j MASQUERADE --random-fully".into());
                w(format!("-A KUBE-MARK-MASQ -j MARK --or-mark {MARK}"));
                let cluster = s("KUBE-CLUSTER-IP");
                if masquerade_all {
                    w(format!("-A KUBE-SERVICES -m comment --comment \"Kubernetes service cluster ip + port for masquerade purpose\" -m set --match-set {cluster} dst,dst -j KUBE-MARK-MASQ"));
                } else {
                    for cidr in cluster_cidrs.iter().filter(|n| family.contains_net(n)) {
                        w(format!("-A KUBE-SERVICES ! -s {cidr} -m comment --comment \"Kubernetes service cluster ip + port for masquerade purpose\" -m set --match-set {cluster} dst,dst -j KUBE-MARK-MASQ"));
                    }
                }
                let ext_local = s("KUBE-EXTERNAL-IP-LOCAL");
                let ext = s("KUBE-EXTERNAL-IP");
                // external IPs with policy Local: accepted without masquerading
                w(format!("-A KUBE-SERVICES -m comment --comment \"Kubernetes service external ip + port with externalTrafficPolicy=local\" -m set --match-set {ext_local} dst,dst -m physdev ! --physdev-is-in -m addrtype ! --src-type LOCAL -j ACCEPT"));
                w(format!("-A KUBE-SERVICES -m comment --comment \"Kubernetes service external ip + port with externalTrafficPolicy=local\" -m set --match-set {ext_local} dst,dst -m addrtype --dst-type LOCAL -j ACCEPT"));
                w(format!("-A KUBE-SERVICES -m comment --comment \"Kubernetes service external ip + port for masquerade and filter purpose\" -m set --match-set {ext} dst,dst -j KUBE-MARK-MASQ"));
                w(format!("-A KUBE-SERVICES -m comment --comment \"Kubernetes service external ip + port for masquerade and filter purpose\" -m set --match-set {ext} dst,dst -m physdev ! --physdev-is-in -m addrtype ! --src-type LOCAL -j ACCEPT"));
                w(format!("-A KUBE-SERVICES -m comment --comment \"Kubernetes service external ip + port for masquerade and filter purpose\" -m set --match-set {ext} dst,dst -m addrtype --dst-type LOCAL -j ACCEPT"));
                w(format!("-A KUBE-SERVICES -m comment --comment \"Kubernetes service load balancer ip + port for load balancer\" -m set --match-set {} dst,dst -j KUBE-LOAD-BALANCER", s("KUBE-LOAD-BALANCER")));
                w(format!("-A KUBE-LOAD-BALANCER -m comment --comment \"Kubernetes service load balancer ip + port with externalTrafficPolicy=local\" -m set --match-set {} dst,dst -j RETURN", s("KUBE-LOAD-BALANCER-LOCAL")));
                w("-A KUBE-LOAD-BALANCER -j KUBE-MARK-MASQ".into());
                w("-A KUBE-SERVICES -m addrtype --dst-type LOCAL -j KUBE-NODE-PORT".into());
                for (p, up) in [("tcp", "TCP"), ("udp", "UDP")] {
                    w(format!("-A KUBE-NODE-PORT -p {p} -m comment --comment \"Kubernetes nodeport {up} port with externalTrafficPolicy=local\" -m set --match-set {} dst -j RETURN", s(&format!("KUBE-NODE-PORT-LOCAL-{up}"))));
                    w(format!("-A KUBE-NODE-PORT -p {p} -m comment --comment \"Kubernetes nodeport {up} port for masquerade purpose\" -m set --match-set {} dst -j KUBE-MARK-MASQ", s(&format!("KUBE-NODE-PORT-{up}"))));
                }
                w(format!("-A KUBE-NODE-PORT -p sctp -m comment --comment \"Kubernetes nodeport SCTP port with externalTrafficPolicy=local\" -m set --match-set {} dst,dst -j RETURN", s("KUBE-NODE-PORT-LOCAL-SCTP-HASH")));
                w(format!("-A KUBE-NODE-PORT -p sctp -m comment --comment \"Kubernetes nodeport SCTP port for masquerade purpose\" -m set --match-set {} dst,dst -j KUBE-MARK-MASQ", s("KUBE-NODE-PORT-SCTP-HASH")));
                // the virtual servers' traffic is accepted here, whatever other rules follow
                w(format!("-A KUBE-SERVICES -m set --match-set {cluster} dst,dst -j ACCEPT"));
                w(format!("-A KUBE-SERVICES -m set --match-set {} dst,dst -j ACCEPT", s("KUBE-LOAD-BALANCER")));
            }
            "filter" => {
                w("-A KUBE-FORWARD -m conntrack --ctstate INVALID -j DROP".into());
                w(format!("-A KUBE-FORWARD -m comment --comment \"kubernetes forwarding rules\" -m mark --mark {MARK}/{MARK} -j ACCEPT"));
                w("-A KUBE-FORWARD -m comment --comment \"kubernetes forwarding conntrack rule\" -m conntrack --ctstate RELATED,ESTABLISHED -j ACCEPT".into());
                w(format!("-A KUBE-NODE-PORT -m comment --comment \"Kubernetes health check node port\" -m set --match-set {} dst -j ACCEPT", s("KUBE-HEALTH-CHECK-NODE-PORT")));
                w(format!("-A KUBE-PROXY-FIREWALL -m comment --comment \"Kubernetes service load balancer ip + port for load balancer with sourceRange\" -m set --match-set {} dst,dst -j KUBE-SOURCE-RANGES-FIREWALL", s("KUBE-LOAD-BALANCER-FW")));
                w(format!("-A KUBE-SOURCE-RANGES-FIREWALL -m comment --comment \"Kubernetes service load balancer ip + port + source cidr for packet filter purpose\" -m set --match-set {} dst,dst,src -j RETURN", s("KUBE-LOAD-BALANCER-SOURCE-CIDR")));
                w(format!("-A KUBE-SOURCE-RANGES-FIREWALL -m comment --comment \"Kubernetes service load balancer ip + port + source ip for packet filter purpose\" -m set --match-set {} dst,dst,src -j RETURN", s("KUBE-LOAD-BALANCER-SOURCE-IP")));
                w("-A KUBE-SOURCE-RANGES-FIREWALL -j DROP".into());
                // addresses on kube-ipvs0 answer only on their Services' ports
                for base in ["KUBE-LOAD-BALANCER", "KUBE-CLUSTER-IP", "KUBE-EXTERNAL-IP", "KUBE-EXTERNAL-IP-LOCAL"] {
                    w(format!("-A KUBE-IPVS-FILTER -m set --match-set {} dst,dst -j RETURN", s(base)));
                }
                w(format!("-A KUBE-IPVS-FILTER -m set --match-set {} dst -j RETURN", s("KUBE-HEALTH-CHECK-NODE-PORT")));
                w(format!("-A KUBE-IPVS-FILTER -m conntrack --ctstate NEW -m set --match-set {} dst -j REJECT", s("KUBE-IPVS-IPS")));
            }
            _ => {}
        }
        w("COMMIT".into());
    }
    out
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn the_text_matches_the_families_sets_and_stays_fixed_size() {
        let cidrs: Vec<IpNet> = vec!["10.244.0.0/16".parse().unwrap(), "fd00:10::/64".parse().unwrap()];
        let v4 = render(Family::V4, &cidrs, false, &base_jumps());
        assert!(v4.contains("-A KUBE-SERVICES ! -s 10.244.0.0/16 -m comment --comment \"Kubernetes service cluster ip + port for masquerade purpose\" -m set --match-set KUBE-CLUSTER-IP dst,dst -j KUBE-MARK-MASQ"), "{v4}");
        assert!(!v4.contains("fd00"), "the other family's CIDR is left out");
        assert!(v4.contains("-I PREROUTING -m comment --comment \"kubernetes service portals\" -j KUBE-SERVICES"));
        let v6 = render(Family::V6, &cidrs, false, &[]);
        assert!(v6.contains("--match-set KUBE-6-CLUSTER-IP dst,dst"), "{v6}");
        assert!(v6.contains("--match-set KUBE-6-LB-SOURCE-CIDR dst,dst,src -j RETURN"));
        assert!(!v6.contains("-I "), "no jump missing, none inserted");
        // every set the rules name is one the plan creates
        let names: std::collections::BTreeSet<String> =
            super::super::plan::SETS.iter().map(|(n, _)| set_name(n, Family::V6)).collect();
        for line in v6.lines().filter(|l| l.contains("--match-set")) {
            let set = line.split("--match-set ").nth(1).unwrap().split(' ').next().unwrap();
            assert!(names.contains(set), "{set} is not a planned set");
        }
        let all = render(Family::V4, &cidrs, true, &[]);
        assert!(all.contains("-m set --match-set KUBE-CLUSTER-IP dst,dst -j KUBE-MARK-MASQ") && !all.contains("! -s"), "masquerade-all marks every source");
    }
}
