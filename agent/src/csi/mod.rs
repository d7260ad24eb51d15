//! kubelet's CSI side. [`registry`]: plugins register through `<root>/plugins_registry` (the
//! pluginregistration v1 service), the agent records their CSI endpoint, asks NodeGetInfo, and
//! writes the node's CSINode entry and topology labels ([`node_info`], pure). Mounting CSI
//! volumes for pods comes next (docs/design/agent.md).

pub mod node_info;
pub mod registry;
