//! The volume engine of ferro-csi in the model room's shape: pure decisions (`plan`), a narrow
//! `Host` trait with the real host (`real`) and a recording fake (`fake`), the journal of
//! intents (`record`), and the engine that applies plans (`engine`, `controller`, `node`,
//! `ephemeral` for inline volumes).

pub mod controller;
pub mod engine;
pub mod ephemeral;
pub mod fake;
pub mod host;
pub mod names;
pub mod node;
pub mod plan;
pub mod real;
pub mod record;

#[cfg(test)]
mod tests;
