//! iptables mode: the renderer (model -> iptables-restore text, upstream's layout) and the
//! backend that applies it in one `iptables-restore --noflush` per family.

pub mod backend;
pub mod rules;
pub mod trace;
