//! kubelet's CSI side. [`registry`]: plugins register through `<root>/plugins_registry` (the
//! pluginregistration v1 service), the agent records their CSI endpoint, asks NodeGetInfo, and
//! writes the node's CSINode entry and topology labels ([`node_info`], pure). [`mounter`]:
//! persistentVolumeClaim volumes staged and published through the registered driver, and
//! inline `csi:` volumes (the Ephemeral lifecycle mode) published through it.

pub mod mounter;
pub mod node_info;
pub mod registry;
