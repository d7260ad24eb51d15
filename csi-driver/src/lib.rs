//! ferro-csi: the CSI driver `loop.csi.ferro.dev`. Node-local volumes on loop devices:
//! a sparse (or fully allocated) backing file per volume, formatted ext4 or XFS at first
//! stage, or handed over as a raw block device. See docs/design/csi.md.

pub mod proto;
pub mod provisioner;
pub mod service;
pub mod volume;
