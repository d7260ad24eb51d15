//! A network namespace created by a test, deleted on drop.

use std::process::Command;

use anyhow::Result;

use crate::run;

/// `ip netns add <name>` (a leftover of the same name is deleted first), `lo` up.
pub struct NetNs {
    name: String,
}

impl NetNs {
    pub fn new(name: &str) -> Result<NetNs> {
        crate::require_root()?;
        let _ = Command::new("ip").args(["netns", "del", name]).output();
        run(Command::new("ip").args(["netns", "add", name]))?;
        let ns = NetNs {
            name: name.to_string(),
        };
        run(Command::new("ip").args(["-n", name, "link", "set", "lo", "up"]))?;
        Ok(ns)
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    /// `/run/netns/<name>`.
    pub fn path(&self) -> String {
        format!("/run/netns/{}", self.name)
    }

    /// A command that runs `program` inside the namespace (`ip netns exec`).
    pub fn command(&self, program: &str) -> Command {
        let mut c = Command::new("ip");
        c.args(["netns", "exec", &self.name, program]);
        c
    }
}

impl Drop for NetNs {
    fn drop(&mut self) {
        let _ = Command::new("ip")
            .args(["netns", "del", &self.name])
            .output();
    }
}
