//! A network namespace created by a test, deleted on drop.

use std::fs::File;
use std::process::{Command, Output};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::thread::JoinHandle;

use anyhow::{bail, Context, Result};
use nix::sched::CloneFlags;

use crate::run;

/// `ip netns add <name>` (a leftover of the same name is deleted first), `lo` up.
pub struct NetNs {
    name: String,
    deleted: bool,
}

static UNIQUE: AtomicUsize = AtomicUsize::new(0);

impl NetNs {
    pub fn new(name: &str) -> Result<NetNs> {
        let ns = NetNs::new_bare(name)?;
        ns.ip(&["link", "set", "lo", "up"])?;
        Ok(ns)
    }

    /// Like [`NetNs::new`] but `lo` stays down: the namespace as a container runtime hands
    /// it to a CNI plugin (which is to bring `lo` up itself).
    pub fn new_bare(name: &str) -> Result<NetNs> {
        crate::require_root()?;
        let _ = Command::new("ip").args(["netns", "del", name]).output();
        run(Command::new("ip").args(["netns", "add", name]))?;
        Ok(NetNs {
            name: name.to_string(),
            deleted: false,
        })
    }

    /// `<prefix>-<pid>-<n>`, `n` counting up in this process: a name no other test of this
    /// process uses, and a leftover of a crashed run with the same pid is what `new` deletes.
    pub fn unique_name(prefix: &str) -> String {
        let n = UNIQUE.fetch_add(1, Ordering::SeqCst);
        format!("{prefix}-{}-{n}", std::process::id())
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

    /// `ip -n <name> ARGS`, which must succeed; its stdout.
    pub fn ip(&self, args: &[&str]) -> Result<String> {
        let out = run(Command::new("ip").args(["-n", &self.name]).args(args))?;
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    }

    /// `ip netns exec <name> ARGS`, whatever its exit status (an error only when it cannot
    /// be run).
    pub fn exec(&self, args: &[&str]) -> Result<Output> {
        let Some((program, rest)) = args.split_first() else {
            bail!("nothing to run in netns {}", self.name);
        };
        let mut cmd = self.command(program);
        cmd.args(rest);
        cmd.output()
            .with_context(|| format!("cannot run {args:?} in netns {}", self.name))
    }

    /// `ip netns exec <name> ARGS`, which must succeed; its stdout.
    pub fn exec_ok(&self, args: &[&str]) -> Result<String> {
        let out = self.exec(args)?;
        if !out.status.success() {
            bail!(
                "in netns {}: {args:?} failed ({}): {}{}",
                self.name,
                out.status,
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            );
        }
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    }

    /// Runs `f` on a new thread that has entered the namespace (`setns`), so sockets it
    /// opens live there; the caller's threads never change namespace. The handle yields an
    /// error instead of running `f` when the thread cannot enter.
    pub fn spawn_in<T, F>(&self, f: F) -> JoinHandle<Result<T>>
    where
        T: Send + 'static,
        F: FnOnce() -> T + Send + 'static,
    {
        // Opened here, so the thread enters this namespace even if it is deleted meanwhile.
        let path = self.path();
        let file = File::open(&path);
        std::thread::spawn(move || {
            let file = file.with_context(|| format!("cannot open {path}"))?;
            nix::sched::setns(&file, CloneFlags::CLONE_NEWNET)
                .with_context(|| format!("cannot enter {path}"))?;
            Ok(f())
        })
    }

    /// Deletes the namespace now (a test that checks what happens once it is gone); drop
    /// does nothing more.
    pub fn delete(&mut self) -> Result<()> {
        if !self.deleted {
            run(Command::new("ip").args(["netns", "del", &self.name]))?;
            self.deleted = true;
        }
        Ok(())
    }
}

impl Drop for NetNs {
    fn drop(&mut self) {
        if self.deleted {
            return;
        }
        match Command::new("ip")
            .args(["netns", "del", &self.name])
            .output()
        {
            Ok(o) if o.status.success() => {}
            Ok(o) => eprintln!(
                "netns clean-up: ip netns del {}: {}",
                self.name,
                String::from_utf8_lossy(&o.stderr)
            ),
            Err(e) => eprintln!("netns clean-up: ip netns del {}: {e}", self.name),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unique_names_carry_the_pid_and_differ() {
        let (a, b) = (NetNs::unique_name("fl-t"), NetNs::unique_name("fl-t"));
        assert_ne!(a, b);
        for n in [&a, &b] {
            assert!(
                n.starts_with(&format!("fl-t-{}-", std::process::id())),
                "{n}"
            );
        }
    }
}
