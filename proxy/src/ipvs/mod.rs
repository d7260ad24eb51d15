//! IPVS mode: the plan (virtual servers, real servers, ipsets, kube-ipvs0 addresses), the
//! iptables rules that go with it, and the executors (generic netlink IPVS, nfnetlink ipset).
//!
//! This machine's kernel is built without `ip_vs` (CONFIG_IP_VS is not set, and modules cannot
//! be loaded) and without the dummy link type: the IPVS and address executors are tested
//! against the plan and the netlink messages they record, never against a kernel here. The
//! ipsets and the iptables rules that match them are loaded into the real kernel in the
//! privileged tests.

pub mod plan;
pub mod ipset;
pub mod netlink;
pub mod rules;
pub mod backend;
pub mod exec;
