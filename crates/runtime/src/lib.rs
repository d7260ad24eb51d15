//! The control-loop runtime shared by ferro's controllers: informers (one watch per kind, a
//! local cache, change notifications) and work queues (deduplicated keys, one worker per key at
//! a time, retries with exponential backoff). Reconcilers are level-triggered: a key says
//! "look at this object again", never what changed. Plus the Event recorder the controllers
//! and the agent share, and systemd's notify protocol (READY, STOPPING, the watchdog) every
//! binary speaks.

pub mod apiclient;
pub mod controller;
pub mod events;
pub mod informer;
pub mod metrics;
pub mod queue;
pub mod systemd;

pub use controller::{spawn_resync, spawn_workers, Next};
pub use informer::{Change, Informer, ObjectKey};
pub use queue::WorkQueue;
