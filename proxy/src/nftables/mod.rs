//! nftables mode: the renderer (model -> one nft transaction), the tracer, the executor.
