//! iptables mode: the renderer (model -> iptables-restore text), the tracer, the executor.
