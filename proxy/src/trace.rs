//! What the packet tracers share: the packet, the path it takes through the netfilter hooks,
//! and the answer (every outcome the rules allow).
//!
//! The tracers ([`crate::iptables::trace`], [`crate::nftables::trace`]) read the text ferro-proxy
//! renders and follow the first packet of a new connection through it, as upstream's proxier
//! tests do with their tracePacket, but through the hooks the kernel runs (nat PREROUTING or
//! OUTPUT, the routing decision, filter INPUT or FORWARD or OUTPUT, nat POSTROUTING) with the
//! packet mark carried along, so masquerading is what `KUBE-POSTROUTING` / `masquerading` does
//! with the mark, not a guess. A rule whose match is random (`statistic`, `numgen`) or depends
//! on earlier connections (`recent`, affinity sets) is followed both ways: the answer is the set
//! of every outcome some packet can have.

use std::collections::BTreeSet;
use std::fmt;
use std::net::{IpAddr, SocketAddr};

use crate::model::Protocol;

/// The first packet of a new connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Packet {
    pub src: IpAddr,
    pub dst: IpAddr,
    pub protocol: Protocol,
    pub port: u16,
}

impl Packet {
    pub fn tcp(src: IpAddr, dst: IpAddr, port: u16) -> Packet {
        Packet {
            src,
            dst,
            protocol: Protocol::Tcp,
            port,
        }
    }
}

/// What happens to a packet in the end.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Verdict {
    /// Delivered to this endpoint (destination rewritten).
    Dnat(SocketAddr),
    /// Delivered to its original destination (no rule rewrote it).
    Accept,
    Drop,
    Reject,
}

/// One way the packet can go.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Outcome {
    pub verdict: Verdict,
    /// Its source is rewritten on the way out (always false when dropped or rejected).
    pub masquerade: bool,
}

impl fmt::Display for Outcome {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.verdict {
            Verdict::Dnat(a) => write!(f, "DNAT {a}")?,
            Verdict::Accept => write!(f, "ACCEPT")?,
            Verdict::Drop => return write!(f, "DROP"),
            Verdict::Reject => return write!(f, "REJECT"),
        }
        if self.masquerade {
            write!(f, " masqueraded")?;
        }
        Ok(())
    }
}

/// Every outcome the rules allow for one packet.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Trace {
    pub outcomes: BTreeSet<Outcome>,
}

impl Trace {
    /// The endpoints ("ip:port", "[ip]:port") the packet can reach.
    pub fn endpoints(&self) -> BTreeSet<String> {
        self.outcomes
            .iter()
            .filter_map(|o| match o.verdict {
                Verdict::Dnat(a) => Some(a.to_string()),
                _ => None,
            })
            .collect()
    }

    /// Whether it can be dropped (only dropped, with [`Trace::only`]).
    pub fn can(&self, v: Verdict) -> bool {
        self.outcomes.iter().any(|o| o.verdict == v)
    }

    /// Whether this is its only fate.
    pub fn only(&self, v: Verdict) -> bool {
        !self.outcomes.is_empty() && self.outcomes.iter().all(|o| o.verdict == v)
    }
}

impl fmt::Display for Trace {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let parts: Vec<String> = self.outcomes.iter().map(ToString::to_string).collect();
        write!(f, "{{{}}}", parts.join(", "))
    }
}

/// A netfilter hook.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Hook {
    Prerouting,
    Input,
    Forward,
    Output,
    Postrouting,
}

/// The packet as the rules see it at one point of one path.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PacketState {
    pub src: IpAddr,
    pub dst: IpAddr,
    pub protocol: Protocol,
    pub port: u16,
    pub mark: u32,
    pub dnat: Option<SocketAddr>,
    pub masquerade: bool,
}

/// How one path through a chain ends.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Flow {
    /// The end of the chain or a return: the caller goes on (a base chain's policy applies).
    Return,
    Accept,
    Drop,
    Reject,
    Dnat(SocketAddr),
    Masquerade,
}

/// A base chain: where a hook enters a table.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BaseChain {
    pub table: String,
    pub chain: String,
    pub priority: i32,
    /// Its policy drops (else accepts).
    pub policy_drop: bool,
}

/// The rules of one mode, as the walk needs them.
pub(crate) trait Rules {
    type Error: From<PathError>;
    /// The base chains of `hook` for this packet's family, in the order the kernel runs them.
    fn base_chains(&self, hook: Hook, family_v4: bool) -> Vec<BaseChain>;
    /// Every path through one base chain.
    fn run(&self, chain: &BaseChain, st: PacketState) -> Result<Vec<(PacketState, Flow)>, Self::Error>;
}

/// A rule that cannot do what it says where the packet meets it.
#[derive(Debug, thiserror::Error)]
pub enum PathError {
    #[error("chain {chain} rewrites the destination in the {hook:?} hook")]
    DnatOutsideDstnat { chain: String, hook: Hook },
    #[error("chain {chain} masquerades in the {hook:?} hook")]
    MasqueradeOutsidePostrouting { chain: String, hook: Hook },
}

/// Runs the base chains of one hook over every state: the states that pass, and the outcomes
/// of those that stop there.
fn hook<R: Rules>(
    rules: &R,
    hook: Hook,
    states: Vec<PacketState>,
    done: &mut BTreeSet<Outcome>,
) -> Result<Vec<PacketState>, R::Error> {
    let Some(first) = states.first() else { return Ok(states) };
    let chains = rules.base_chains(hook, first.dst.is_ipv4());
    let mut states = states;
    for chain in &chains {
        let mut next = Vec::new();
        for st in states {
            for (mut s, flow) in rules.run(chain, st)? {
                let stop = |v| Outcome {
                    verdict: v,
                    masquerade: false,
                };
                match flow {
                    Flow::Return if chain.policy_drop => {
                        done.insert(stop(Verdict::Drop));
                    }
                    Flow::Return | Flow::Accept => next.push(s),
                    Flow::Drop => {
                        done.insert(stop(Verdict::Drop));
                    }
                    Flow::Reject => {
                        done.insert(stop(Verdict::Reject));
                    }
                    Flow::Dnat(to) => {
                        if !matches!(hook, Hook::Prerouting | Hook::Output) {
                            return Err(PathError::DnatOutsideDstnat {
                                chain: chain.chain.clone(),
                                hook,
                            }
                            .into());
                        }
                        s.dst = to.ip();
                        s.port = to.port();
                        s.dnat = Some(to);
                        next.push(s);
                    }
                    Flow::Masquerade => {
                        if hook != Hook::Postrouting {
                            return Err(PathError::MasqueradeOutsidePostrouting {
                                chain: chain.chain.clone(),
                                hook,
                            }
                            .into());
                        }
                        s.masquerade = true;
                        next.push(s);
                    }
                }
            }
        }
        // the same state reached twice (two random arms to one endpoint) is one path
        let mut uniq: Vec<PacketState> = Vec::with_capacity(next.len());
        for s in next {
            if !uniq.contains(&s) {
                uniq.push(s);
            }
        }
        states = uniq;
    }
    Ok(states)
}

/// Follows `packet` through the hooks: from a node address it is sent by the node (OUTPUT,
/// POSTROUTING, then INPUT if it stays on the node); else it arrives (PREROUTING, then INPUT
/// for a node address or FORWARD and POSTROUTING). `local` are the node's addresses
/// (loopback is always local).
pub(crate) fn walk<R: Rules>(rules: &R, packet: &Packet, local: &[IpAddr]) -> Result<Trace, R::Error> {
    let is_local = |ip: &IpAddr| ip.is_loopback() || local.contains(ip);
    let st = PacketState {
        src: packet.src,
        dst: packet.dst,
        protocol: packet.protocol,
        port: packet.port,
        mark: 0,
        dnat: None,
        masquerade: false,
    };
    let mut done = BTreeSet::new();
    let mut delivered = Vec::new();
    if is_local(&packet.src) {
        let out = hook(rules, Hook::Output, vec![st], &mut done)?;
        let out = hook(rules, Hook::Postrouting, out, &mut done)?;
        let (here, away): (Vec<_>, Vec<_>) = out.into_iter().partition(|s| is_local(&s.dst));
        delivered.extend(away);
        delivered.extend(hook(rules, Hook::Input, here, &mut done)?);
    } else {
        let pre = hook(rules, Hook::Prerouting, vec![st], &mut done)?;
        let (here, away): (Vec<_>, Vec<_>) = pre.into_iter().partition(|s| is_local(&s.dst));
        delivered.extend(hook(rules, Hook::Input, here, &mut done)?);
        let fwd = hook(rules, Hook::Forward, away, &mut done)?;
        delivered.extend(hook(rules, Hook::Postrouting, fwd, &mut done)?);
    }
    for s in delivered {
        let verdict = s.dnat.map(Verdict::Dnat).unwrap_or(Verdict::Accept);
        done.insert(Outcome {
            verdict,
            masquerade: s.masquerade,
        });
    }
    Ok(Trace { outcomes: done })
}

/// The three answers a match can give for a packet when some matches are random.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Tri {
    Yes,
    No,
    Either,
}

impl Tri {
    pub(crate) fn of(b: bool) -> Tri {
        if b {
            Tri::Yes
        } else {
            Tri::No
        }
    }

    /// Both must hold.
    pub(crate) fn and(self, other: Tri) -> Tri {
        match (self, other) {
            (Tri::No, _) | (_, Tri::No) => Tri::No,
            (Tri::Either, _) | (_, Tri::Either) => Tri::Either,
            _ => Tri::Yes,
        }
    }
}

/// Upstream's chain nesting never goes deeper than a few levels; deeper is a loop.
pub(crate) const MAX_DEPTH: usize = 32;

/// One table of upstream-style scenarios, traced over the rules both renderers make of the same
/// Services and EndpointSlices: the two modes must give the same answers.
#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use std::collections::BTreeSet;
    use std::sync::Arc;

    use crate::slim::Service;
    use crate::slim::EndpointSlice;
    use serde_json::{json, Value};

    use super::*;
    use crate::model::{self, Family, FamilyModel, NodeInfo};
    use crate::{iptables, nftables};

    const NODE_IP: &str = "192.168.0.2";
    /// A pod of the cluster that is no endpoint.
    const POD: &str = "10.180.0.9";
    /// An endpoint on this node and one on another.
    const LOCAL_EP: &str = "10.180.0.1";
    const REMOTE_EP: &str = "10.180.0.2";
    /// Clients outside the cluster.
    const OUTSIDE: &str = "203.0.113.5";
    const STRANGER: &str = "198.51.100.7";

    fn node() -> NodeInfo {
        NodeInfo {
            name: "node-a".into(),
            zone: None,
        }
    }

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    /// Service `name` (port "p" 80 -> 8080) with `spec` merged in, and `status`.
    fn svc(name: &str, cluster_ip: &str, spec: Value, status: Value) -> Arc<Service> {
        let mut s = json!({"clusterIP": cluster_ip, "ports": [{"name": "p", "port": 80, "targetPort": 8080, "protocol": "TCP"}]});
        for (k, v) in spec.as_object().unwrap() {
            s[k] = v.clone();
        }
        Arc::new(
            serde_json::from_value(json!({"metadata": {"namespace": "ns", "name": name}, "spec": s, "status": status}))
                .unwrap(),
        )
    }

    /// How an endpoint looks in its slice.
    #[derive(Clone, Copy)]
    enum Ep {
        /// Ready, on this node.
        Local,
        /// Ready, on another node.
        Remote,
        /// Serving and terminating (not ready), on another node.
        Terminating,
        /// Neither ready nor serving.
        NotReady,
    }

    fn slice(name: &str, protocol: &str, eps: &[(&str, Ep)]) -> Arc<EndpointSlice> {
        let eps: Vec<Value> = eps
            .iter()
            .map(|(a, e)| {
                let (ready, serving, terminating, node) = match e {
                    Ep::Local => (true, true, false, "node-a"),
                    Ep::Remote => (true, true, false, "node-b"),
                    Ep::Terminating => (false, true, true, "node-b"),
                    Ep::NotReady => (false, false, false, "node-b"),
                };
                json!({"addresses": [a], "nodeName": node, "conditions": {"ready": ready, "serving": serving, "terminating": terminating}})
            })
            .collect();
        Arc::new(
            serde_json::from_value(json!({
                "metadata": {"namespace": "ns", "name": format!("{name}-1"), "labels": {"kubernetes.io/service-name": name}},
                "addressType": "IPv4",
                "ports": [{"name": "p", "port": 8080, "protocol": protocol}],
                "endpoints": eps,
            }))
            .unwrap(),
        )
    }

    fn both() -> Vec<(&'static str, Ep)> {
        vec![(LOCAL_EP, Ep::Local), (REMOTE_EP, Ep::Remote)]
    }

    fn to(ep: &str, masquerade: bool) -> Outcome {
        Outcome {
            verdict: Verdict::Dnat(format!("{ep}:8080").parse().unwrap()),
            masquerade,
        }
    }

    fn stop(v: Verdict) -> Outcome {
        Outcome {
            verdict: v,
            masquerade: false,
        }
    }

    fn cfg_cidrs() -> Vec<ipnet::IpNet> {
        vec!["10.0.0.0/8".parse().unwrap()]
    }

    /// Both modes' full-sync text of `model`, loaded into their tracers.
    fn load(model: &FamilyModel, masquerade_all: bool) -> (iptables::trace::Ruleset, nftables::trace::Ruleset) {
        load_with(model, cfg_cidrs(), ip(NODE_IP), masquerade_all)
    }

    fn load_with(
        model: &FamilyModel,
        cluster_cidrs: Vec<ipnet::IpNet>,
        node_ip: IpAddr,
        masquerade_all: bool,
    ) -> (iptables::trace::Ruleset, nftables::trace::Ruleset) {
        let icfg = iptables::rules::RenderConfig {
            cluster_cidrs: cluster_cidrs.clone(),
            masquerade_all,
            node_ips: vec![node_ip],
            ..Default::default()
        };
        let mut ist = iptables::rules::State::default();
        let out = iptables::rules::render(
            model,
            &node(),
            &icfg,
            &mut ist,
            true,
            &iptables::rules::base_jumps(),
            &BTreeSet::new(),
        );
        let ipt = iptables::trace::Ruleset::parse(&out.text).unwrap_or_else(|e| panic!("{e}\n{}", out.text));
        let ncfg = nftables::rules::RenderConfig {
            cluster_cidrs,
            masquerade_all,
            ..Default::default()
        };
        let mut nst = nftables::rules::State::default();
        let out = nftables::rules::render(model, &node(), &ncfg, &mut nst, true);
        let nft = nftables::trace::Ruleset::parse(&out.text).unwrap_or_else(|e| panic!("{e}\n{}", out.text));
        (ipt, nft)
    }

    fn build(services: &[Arc<Service>], slices: &[Arc<EndpointSlice>]) -> FamilyModel {
        let (m, problems) = model::build(Family::V4, services, slices, &node());
        assert!(problems.is_empty(), "{problems:?}");
        m
    }

    struct Case {
        what: &'static str,
        src: &'static str,
        dst: &'static str,
        port: u16,
        protocol: Protocol,
        want: Vec<Outcome>,
    }

    fn case(what: &'static str, src: &'static str, dst: &'static str, port: u16, want: Vec<Outcome>) -> Case {
        Case {
            what,
            src,
            dst,
            port,
            protocol: Protocol::Tcp,
            want,
        }
    }

    struct Scenario {
        name: &'static str,
        services: Vec<Arc<Service>>,
        slices: Vec<Arc<EndpointSlice>>,
        masquerade_all: bool,
        cases: Vec<Case>,
    }

    fn scenario(name: &'static str, service: Arc<Service>, slice: Arc<EndpointSlice>, cases: Vec<Case>) -> Scenario {
        Scenario {
            name,
            services: vec![service],
            slices: vec![slice],
            masquerade_all: false,
            cases,
        }
    }

    fn scenarios() -> Vec<Scenario> {
        let lb = |ip: &str| json!({"loadBalancer": {"ingress": [{"ip": ip}]}});
        let np = |n: u16| json!({"type": "NodePort", "ports": [{"name": "p", "port": 80, "targetPort": 8080, "protocol": "TCP", "nodePort": n}]});
        let np_local = |n: u16| {
            let mut s = np(n);
            s["externalTrafficPolicy"] = json!("Local");
            s
        };
        vec![
            scenario(
                "cluster IP",
                svc("a", "172.30.0.41", json!({}), json!({})),
                slice("a", "TCP", &both()),
                vec![
                    case(
                        "from a pod: every endpoint, not masqueraded",
                        POD,
                        "172.30.0.41",
                        80,
                        vec![to(LOCAL_EP, false), to(REMOTE_EP, false)],
                    ),
                    case(
                        "from the node: masqueraded (outside the cluster CIDR)",
                        NODE_IP,
                        "172.30.0.41",
                        80,
                        vec![to(LOCAL_EP, true), to(REMOTE_EP, true)],
                    ),
                    case(
                        "from outside the cluster: masqueraded",
                        OUTSIDE,
                        "172.30.0.41",
                        80,
                        vec![to(LOCAL_EP, true), to(REMOTE_EP, true)],
                    ),
                    case(
                        "hairpin: an endpoint to itself is masqueraded",
                        LOCAL_EP,
                        "172.30.0.41",
                        80,
                        vec![to(LOCAL_EP, true), to(REMOTE_EP, false)],
                    ),
                ],
            ),
            scenario(
                "node port",
                svc("b", "172.30.0.42", np(30080), json!({})),
                slice("b", "TCP", &both()),
                vec![
                    case(
                        "from outside: masqueraded",
                        OUTSIDE,
                        NODE_IP,
                        30080,
                        vec![to(LOCAL_EP, true), to(REMOTE_EP, true)],
                    ),
                    case(
                        "from a pod: masqueraded",
                        POD,
                        NODE_IP,
                        30080,
                        vec![to(LOCAL_EP, true), to(REMOTE_EP, true)],
                    ),
                    case(
                        "from the node itself",
                        NODE_IP,
                        NODE_IP,
                        30080,
                        vec![to(LOCAL_EP, true), to(REMOTE_EP, true)],
                    ),
                    case(
                        "never on loopback",
                        "127.0.0.1",
                        "127.0.0.1",
                        30080,
                        vec![stop(Verdict::Accept)],
                    ),
                ],
            ),
            scenario(
                "externalTrafficPolicy Local",
                svc("c", "172.30.0.43", np_local(30081), json!({})),
                slice("c", "TCP", &both()),
                vec![
                    case(
                        "from outside: only the local endpoint, source kept",
                        OUTSIDE,
                        NODE_IP,
                        30081,
                        vec![to(LOCAL_EP, false)],
                    ),
                    case(
                        "from a pod: short-circuited to every endpoint",
                        POD,
                        NODE_IP,
                        30081,
                        vec![to(LOCAL_EP, false), to(REMOTE_EP, false)],
                    ),
                    case(
                        "from the node: masqueraded, every endpoint",
                        NODE_IP,
                        NODE_IP,
                        30081,
                        vec![to(LOCAL_EP, true), to(REMOTE_EP, true)],
                    ),
                    case(
                        "its cluster IP from outside: Cluster policy",
                        OUTSIDE,
                        "172.30.0.43",
                        80,
                        vec![to(LOCAL_EP, true), to(REMOTE_EP, true)],
                    ),
                ],
            ),
            scenario(
                "externalTrafficPolicy Local without a local endpoint",
                svc("d", "172.30.0.44", np_local(30082), json!({})),
                slice("d", "TCP", &[(REMOTE_EP, Ep::Remote)]),
                vec![
                    case(
                        "from outside: dropped",
                        OUTSIDE,
                        NODE_IP,
                        30082,
                        vec![stop(Verdict::Drop)],
                    ),
                    case(
                        "from a pod: short-circuited",
                        POD,
                        NODE_IP,
                        30082,
                        vec![to(REMOTE_EP, false)],
                    ),
                    case(
                        "its cluster IP from outside",
                        OUTSIDE,
                        "172.30.0.44",
                        80,
                        vec![to(REMOTE_EP, true)],
                    ),
                ],
            ),
            scenario(
                "internalTrafficPolicy Local",
                svc("e", "172.30.0.45", json!({"internalTrafficPolicy": "Local"}), json!({})),
                slice("e", "TCP", &both()),
                vec![
                    case(
                        "from a pod: only the local endpoint",
                        POD,
                        "172.30.0.45",
                        80,
                        vec![to(LOCAL_EP, false)],
                    ),
                    case(
                        "from the node: only the local endpoint, masqueraded",
                        NODE_IP,
                        "172.30.0.45",
                        80,
                        vec![to(LOCAL_EP, true)],
                    ),
                ],
            ),
            scenario(
                "internalTrafficPolicy Local without a local endpoint",
                svc("f", "172.30.0.46", json!({"internalTrafficPolicy": "Local"}), json!({})),
                slice("f", "TCP", &[(REMOTE_EP, Ep::Remote)]),
                vec![case(
                    "from a pod: dropped",
                    POD,
                    "172.30.0.46",
                    80,
                    vec![stop(Verdict::Drop)],
                )],
            ),
            scenario(
                "no endpoints",
                svc(
                    "g",
                    "172.30.0.47",
                    {
                        let mut s = np(30083);
                        s["externalIPs"] = json!(["192.0.2.10"]);
                        s
                    },
                    json!({}),
                ),
                slice("g", "TCP", &[]),
                vec![
                    case(
                        "cluster IP from a pod: rejected",
                        POD,
                        "172.30.0.47",
                        80,
                        vec![stop(Verdict::Reject)],
                    ),
                    case(
                        "cluster IP from the node: rejected",
                        NODE_IP,
                        "172.30.0.47",
                        80,
                        vec![stop(Verdict::Reject)],
                    ),
                    case(
                        "node port from outside: rejected",
                        OUTSIDE,
                        NODE_IP,
                        30083,
                        vec![stop(Verdict::Reject)],
                    ),
                    case(
                        "external IP from outside: rejected",
                        OUTSIDE,
                        "192.0.2.10",
                        80,
                        vec![stop(Verdict::Reject)],
                    ),
                ],
            ),
            scenario(
                "only endpoints that are not ready",
                svc("h", "172.30.0.48", json!({}), json!({})),
                slice("h", "TCP", &[(REMOTE_EP, Ep::NotReady)]),
                vec![case("rejected", POD, "172.30.0.48", 80, vec![stop(Verdict::Reject)])],
            ),
            scenario(
                "terminating fallback",
                svc("i", "172.30.0.49", json!({}), json!({})),
                slice("i", "TCP", &[(LOCAL_EP, Ep::Terminating), (REMOTE_EP, Ep::Terminating)]),
                vec![case(
                    "serving terminating endpoints when none is ready",
                    POD,
                    "172.30.0.49",
                    80,
                    vec![to(LOCAL_EP, false), to(REMOTE_EP, false)],
                )],
            ),
            scenario(
                "terminating endpoints beside a ready one",
                svc("j", "172.30.0.50", json!({}), json!({})),
                slice("j", "TCP", &[(LOCAL_EP, Ep::Local), (REMOTE_EP, Ep::Terminating)]),
                vec![case(
                    "only the ready one",
                    POD,
                    "172.30.0.50",
                    80,
                    vec![to(LOCAL_EP, false)],
                )],
            ),
            scenario(
                "load balancer source ranges",
                svc(
                    "k",
                    "172.30.0.51",
                    {
                        let mut s = np(30084);
                        s["type"] = json!("LoadBalancer");
                        s["loadBalancerSourceRanges"] = json!(["203.0.113.0/25"]);
                        s
                    },
                    lb("192.0.2.20"),
                ),
                slice("k", "TCP", &both()),
                vec![
                    case(
                        "an allowed source",
                        OUTSIDE,
                        "192.0.2.20",
                        80,
                        vec![to(LOCAL_EP, true), to(REMOTE_EP, true)],
                    ),
                    case(
                        "another source: dropped",
                        STRANGER,
                        "192.0.2.20",
                        80,
                        vec![stop(Verdict::Drop)],
                    ),
                    case(
                        "the node port is not behind the ranges",
                        STRANGER,
                        NODE_IP,
                        30084,
                        vec![to(LOCAL_EP, true), to(REMOTE_EP, true)],
                    ),
                ],
            ),
            scenario(
                "load balancer",
                svc(
                    "l",
                    "172.30.0.52",
                    {
                        let mut s = np(30085);
                        s["type"] = json!("LoadBalancer");
                        s
                    },
                    lb("192.0.2.21"),
                ),
                slice("l", "TCP", &both()),
                vec![case(
                    "from anywhere: masqueraded",
                    STRANGER,
                    "192.0.2.21",
                    80,
                    vec![to(LOCAL_EP, true), to(REMOTE_EP, true)],
                )],
            ),
            scenario(
                "external IPs",
                svc("m", "172.30.0.53", json!({"externalIPs": ["192.0.2.30"]}), json!({})),
                slice("m", "TCP", &both()),
                vec![
                    case(
                        "from outside: masqueraded",
                        OUTSIDE,
                        "192.0.2.30",
                        80,
                        vec![to(LOCAL_EP, true), to(REMOTE_EP, true)],
                    ),
                    case(
                        "from a pod: masqueraded (Cluster policy)",
                        POD,
                        "192.0.2.30",
                        80,
                        vec![to(LOCAL_EP, true), to(REMOTE_EP, true)],
                    ),
                    case(
                        "another port: untouched",
                        OUTSIDE,
                        "192.0.2.30",
                        81,
                        vec![stop(Verdict::Accept)],
                    ),
                ],
            ),
            scenario(
                "session affinity",
                svc("n", "172.30.0.54", json!({"sessionAffinity": "ClientIP"}), json!({})),
                slice("n", "TCP", &both()),
                vec![case(
                    "either endpoint (the affinity table decides)",
                    POD,
                    "172.30.0.54",
                    80,
                    vec![to(LOCAL_EP, false), to(REMOTE_EP, false)],
                )],
            ),
            scenario(
                "UDP",
                svc(
                    "o",
                    "172.30.0.55",
                    json!({"ports": [{"name": "p", "port": 80, "targetPort": 8080, "protocol": "UDP"}]}),
                    json!({}),
                ),
                slice("o", "UDP", &both()),
                vec![Case {
                    what: "a UDP packet",
                    src: POD,
                    dst: "172.30.0.55",
                    port: 80,
                    protocol: Protocol::Udp,
                    want: vec![to(LOCAL_EP, false), to(REMOTE_EP, false)],
                }],
            ),
            Scenario {
                masquerade_all: true,
                ..scenario(
                    "masquerade all",
                    svc("p", "172.30.0.56", json!({}), json!({})),
                    slice("p", "TCP", &both()),
                    vec![case(
                        "from a pod: masqueraded",
                        POD,
                        "172.30.0.56",
                        80,
                        vec![to(LOCAL_EP, true), to(REMOTE_EP, true)],
                    )],
                )
            },
        ]
    }

    #[test]
    fn both_modes_agree_with_upstreams_semantics() {
        let mut failures = Vec::new();
        let locals = [ip(NODE_IP)];
        for s in scenarios() {
            let m = build(&s.services, &s.slices);
            let (ipt, nft) = load(&m, s.masquerade_all);
            for c in &s.cases {
                let p = Packet {
                    src: ip(c.src),
                    dst: ip(c.dst),
                    protocol: c.protocol,
                    port: c.port,
                };
                let want = Trace {
                    outcomes: c.want.iter().copied().collect(),
                };
                let got_i = ipt.trace(&p, &locals).unwrap();
                let got_n = nft.trace(&p, &locals).unwrap();
                for (mode, got) in [("iptables", got_i), ("nftables", got_n)] {
                    if got != want {
                        failures.push(format!("{}: {} ({mode}): want {want}, got {got}", s.name, c.what));
                    }
                }
            }
        }
        assert!(failures.is_empty(), "{}", failures.join("\n"));
    }

    /// All scenarios' Services in one model, traced after a full sync of another model and a
    /// partial sync to this one: the partial transactions must leave what a full sync leaves.
    #[test]
    fn partial_syncs_leave_what_a_full_sync_leaves() {
        let all = scenarios();
        let services: Vec<Arc<Service>> = all.iter().flat_map(|s| s.services.clone()).collect();
        let slices: Vec<Arc<EndpointSlice>> = all.iter().flat_map(|s| s.slices.clone()).collect();
        let target = build(&services, &slices);
        // before: half the Services, the endpoints of the others swapped around
        let before_services: Vec<Arc<Service>> = services.iter().step_by(2).cloned().collect();
        let before_slices: Vec<Arc<EndpointSlice>> = slices
            .iter()
            .enumerate()
            .map(|(i, s)| {
                if i % 3 == 0 {
                    let name = s.metadata.labels.as_ref().unwrap()["kubernetes.io/service-name"].clone();
                    slice(&name, "TCP", &[(REMOTE_EP, Ep::Remote), ("10.180.0.3", Ep::Local)])
                } else {
                    s.clone()
                }
            })
            .collect();
        let before = build(&before_services, &before_slices);
        let packets: Vec<Packet> = all
            .iter()
            .flat_map(|s| {
                s.cases.iter().map(|c| Packet {
                    src: ip(c.src),
                    dst: ip(c.dst),
                    protocol: c.protocol,
                    port: c.port,
                })
            })
            .collect();
        let locals = [ip(NODE_IP)];
        let (full_i, full_n) = load(&target, false);

        let icfg = iptables::rules::RenderConfig {
            cluster_cidrs: cfg_cidrs(),
            node_ips: vec![ip(NODE_IP)],
            ..Default::default()
        };
        let mut ist = iptables::rules::State::default();
        let first = iptables::rules::render(
            &before,
            &node(),
            &icfg,
            &mut ist,
            true,
            &iptables::rules::base_jumps(),
            &BTreeSet::new(),
        );
        let mut ipt = iptables::trace::Ruleset::parse(&first.text).unwrap();
        let second = iptables::rules::render(&target, &node(), &icfg, &mut ist, false, &[], &BTreeSet::new());
        assert!(!second.full);
        ipt.apply(&second.text)
            .unwrap_or_else(|e| panic!("{e}\n{}", second.text));

        let ncfg = nftables::rules::RenderConfig {
            cluster_cidrs: cfg_cidrs(),
            ..Default::default()
        };
        let mut nst = nftables::rules::State::default();
        let first = nftables::rules::render(&before, &node(), &ncfg, &mut nst, true);
        let mut nft = nftables::trace::Ruleset::parse(&first.text).unwrap();
        let second = nftables::rules::render(&target, &node(), &ncfg, &mut nst, false);
        assert!(!second.full);
        nft.apply(&second.text)
            .unwrap_or_else(|e| panic!("{e}\n{}", second.text));

        for p in &packets {
            assert_eq!(
                ipt.trace(p, &locals).unwrap(),
                full_i.trace(p, &locals).unwrap(),
                "iptables {p:?}"
            );
            assert_eq!(
                nft.trace(p, &locals).unwrap(),
                full_n.trace(p, &locals).unwrap(),
                "nftables {p:?}"
            );
        }
        assert_eq!(ipt.chains("nat"), full_i.chains("nat"), "the same chains in the end");
        assert_eq!(nft.chains("ip", "kube-proxy"), full_n.chains("ip", "kube-proxy"));
    }

    /// Compares `text` with the golden file `name` under proxy/tests/golden; with
    /// FERRO_UPDATE_GOLDEN=1 the file is rewritten instead (review the diff before committing).
    fn golden(name: &str, text: &str) -> Result<(), String> {
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/golden").join(name);
        if std::env::var_os("FERRO_UPDATE_GOLDEN").is_some() {
            std::fs::write(&path, text).map_err(|e| format!("{}: {e}", path.display()))?;
            return Ok(());
        }
        let want = std::fs::read_to_string(&path).map_err(|e| format!("{}: {e}", path.display()))?;
        if want == text {
            return Ok(());
        }
        let (n, (w, g)) = want
            .lines()
            .chain(std::iter::repeat("<end of file>"))
            .zip(text.lines().chain(std::iter::repeat("<end of text>")))
            .enumerate()
            .find(|(_, (w, g))| w != g)
            .unwrap_or((0, ("", "")));
        Err(format!(
            "{name} differs from the rendering at line {}:\n  golden:   {w}\n  rendered: {g}\n(FERRO_UPDATE_GOLDEN=1 cargo test -p ferro-proxy golden rewrites it)",
            n + 1
        ))
    }

    /// Golden renderings: every scenario's Services in one IPv4 model and the dual-stack
    /// Services in the IPv6 one, as the full-sync text of each mode (IPVS: its operations
    /// from an empty kernel and its iptables text). A change to a rule shows
    /// up here as a diff a reviewer reads, next to the tracers that say whether it still routes.
    #[test]
    fn golden_renderings() {
        let all = scenarios();
        let services: Vec<Arc<Service>> = all.iter().flat_map(|s| s.services.clone()).collect();
        let slices: Vec<Arc<EndpointSlice>> = all.iter().flat_map(|s| s.slices.clone()).collect();
        let v4 = build(&services, &slices);
        let v6 = six_model();
        let mut failures = Vec::new();
        for (m, suffix, cidr, node_ip) in [
            (&v4, "v4", "10.0.0.0/8", NODE_IP),
            (&v6, "v6", "fd00:10::/64", "fd00:1::2"),
        ] {
            let icfg = iptables::rules::RenderConfig {
                cluster_cidrs: vec![cidr.parse().unwrap()],
                node_ips: vec![ip(node_ip)],
                ..Default::default()
            };
            let out = iptables::rules::render(
                m,
                &node(),
                &icfg,
                &mut iptables::rules::State::default(),
                true,
                &iptables::rules::base_jumps(),
                &BTreeSet::new(),
            );
            failures.extend(golden(&format!("iptables-{suffix}.rules"), &out.text).err());
            let ncfg = nftables::rules::RenderConfig {
                cluster_cidrs: vec![cidr.parse().unwrap()],
                ..Default::default()
            };
            let out = nftables::rules::render(m, &node(), &ncfg, &mut nftables::rules::State::default(), true);
            failures.extend(golden(&format!("nftables-{suffix}.nft"), &out.text).err());
            // IPVS mode: the operations from an empty kernel, then the mode's iptables text
            let plan = crate::ipvs::plan::desired(m, &node(), &crate::ipvs::plan::PlanConfig { node_ips: vec![ip(node_ip)] });
            let mut text: String = crate::ipvs::plan::diff(&Default::default(), &plan, m.family)
                .iter()
                .map(|op| format!("{op}\n"))
                .collect();
            text.push_str(&crate::ipvs::rules::render(
                m.family,
                &[cidr.parse().unwrap()],
                false,
                &crate::ipvs::rules::base_jumps(),
            ));
            failures.extend(golden(&format!("ipvs-{suffix}.txt"), &text).err());
        }
        assert!(failures.is_empty(), "{}", failures.join("\n"));
    }

    /// The IPv6 rules of a dual-stack Service (ip6 tables, `[ip]:port` destinations) trace as
    /// the IPv4 ones do.
    /// The dual-stack Services of the IPv6 tests: "six" (NodePort 30090, an endpoint here and
    /// one on node-b) and "none" (no endpoints), as the IPv6 model.
    fn six_model() -> FamilyModel {
        let service: Arc<Service> = Arc::new(
            serde_json::from_value(json!({
                "metadata": {"namespace": "ns", "name": "six"},
                "spec": {"clusterIP": "172.30.0.60", "clusterIPs": ["172.30.0.60", "fd00:30::60"], "type": "NodePort",
                         "ports": [{"name": "p", "port": 80, "targetPort": 8080, "protocol": "TCP", "nodePort": 30090}]},
            }))
            .unwrap(),
        );
        let empty: Arc<Service> = Arc::new(
            serde_json::from_value(json!({
                "metadata": {"namespace": "ns", "name": "none"},
                "spec": {"clusterIP": "172.30.0.61", "clusterIPs": ["172.30.0.61", "fd00:30::61"],
                         "ports": [{"name": "p", "port": 80, "targetPort": 8080, "protocol": "TCP"}]},
            }))
            .unwrap(),
        );
        let slice6: Arc<EndpointSlice> = Arc::new(
            serde_json::from_value(json!({
                "metadata": {"namespace": "ns", "name": "six-1", "labels": {"kubernetes.io/service-name": "six"}},
                "addressType": "IPv6",
                "ports": [{"name": "p", "port": 8080, "protocol": "TCP"}],
                "endpoints": [{"addresses": ["fd00:10::1"], "nodeName": "node-a"}, {"addresses": ["fd00:10::2"], "nodeName": "node-b"}],
            }))
            .unwrap(),
        );
        let (m, problems) = model::build(Family::V6, &[service, empty], &[slice6], &node());
        assert!(problems.is_empty(), "{problems:?}");
        m
    }

    #[test]
    fn ipv6_rules_trace_as_ipv4_ones_do() {
        let m = six_model();
        let node_ip = ip("fd00:1::2");
        let (ipt, nft) = load_with(&m, vec!["fd00:10::/64".parse().unwrap()], node_ip, false);
        let ep = |a: &str, masquerade| Outcome {
            verdict: Verdict::Dnat(format!("[{a}]:8080").parse().unwrap()),
            masquerade,
        };
        for (src, dst, port, want) in [
            (
                "fd00:10::9",
                "fd00:30::60",
                80,
                vec![ep("fd00:10::1", false), ep("fd00:10::2", false)],
            ),
            (
                "fd00:1::2",
                "fd00:30::60",
                80,
                vec![ep("fd00:10::1", true), ep("fd00:10::2", true)],
            ),
            (
                "2001:db8::5",
                "fd00:1::2",
                30090,
                vec![ep("fd00:10::1", true), ep("fd00:10::2", true)],
            ),
            (
                "fd00:10::1",
                "fd00:30::60",
                80,
                vec![ep("fd00:10::1", true), ep("fd00:10::2", false)],
            ),
            ("fd00:10::9", "fd00:30::61", 80, vec![stop(Verdict::Reject)]),
        ] {
            let p = Packet::tcp(ip(src), ip(dst), port);
            let want = Trace {
                outcomes: want.into_iter().collect(),
            };
            assert_eq!(ipt.trace(&p, &[node_ip]).unwrap(), want, "iptables {p:?}");
            assert_eq!(nft.trace(&p, &[node_ip]).unwrap(), want, "nftables {p:?}");
        }
    }

    /// Where upstream's two modes differ on purpose, ferro's do too: nftables mode rejects
    /// traffic to a ClusterIP port no Service has; iptables mode lets it go its way.
    #[test]
    fn an_unserved_cluster_ip_port_is_rejected_only_by_nftables() {
        let m = build(
            &[svc("a", "172.30.0.41", json!({}), json!({}))],
            &[slice("a", "TCP", &both())],
        );
        let (ipt, nft) = load(&m, false);
        let p = Packet::tcp(ip(POD), ip("172.30.0.41"), 81);
        assert!(ipt.trace(&p, &[ip(NODE_IP)]).unwrap().only(Verdict::Accept));
        assert!(nft.trace(&p, &[ip(NODE_IP)]).unwrap().only(Verdict::Reject));
    }
}
