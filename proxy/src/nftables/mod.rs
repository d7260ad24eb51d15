//! nftables mode: the renderer (model -> one nft transaction, upstream's layout with verdict
//! maps) and the backend that applies it with `nft -f`.

pub mod backend;
pub mod netlink;
pub mod rule;
pub mod rules;
pub mod trace;
