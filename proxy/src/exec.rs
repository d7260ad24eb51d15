//! The one narrow door to the host for the iptables and nftables modes: run a kernel tool
//! (`iptables-restore`, `iptables-save`, `nft`, ...) with an optional stdin, in this process's
//! network namespace. [`Host`] runs it; [`Recording`] records calls and plays back answers, so
//! backends and cleanup are tested without root.

use std::collections::VecDeque;
use std::io::Write as _;
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex};

use crate::error::ExecError;

/// Runs kernel tools.
pub trait Runner: Send + 'static {
    /// Runs `program args...` with `stdin` (if any) and returns its stdout.
    fn run(&mut self, program: &str, args: &[&str], stdin: Option<&str>) -> Result<String, ExecError>;
}

/// The stack the kernel tools get: iptables-nft 1.8.9's `iptables-save` and `iptables -S`
/// recurse once per chain of the table and overflow the default 8 MiB stack (SIGSEGV, no
/// message) somewhere below 110,000 chains — the nat table at 10,000 Services × 10 endpoints
/// (16 MiB was enough there). 1 GiB is address space, not memory: only the pages a tool
/// touches are used.
pub const TOOL_STACK_BYTES: u64 = 1 << 30;

/// Raises this process's soft stack limit (RLIMIT_STACK) to [`TOOL_STACK_BYTES`], within the
/// hard limit, so that every tool it runs from now on inherits it (a resource limit passes to
/// children). This process's own threads are unaffected: their stacks are sized when they
/// are made. Returns the soft limit now in force. Called once at start by ferro-proxy.
pub fn raise_tool_stack_limit() -> Result<u64, nix::Error> {
    use nix::sys::resource::{getrlimit, setrlimit, Resource, RLIM_INFINITY};
    let (soft, hard) = getrlimit(Resource::RLIMIT_STACK)?;
    if soft == RLIM_INFINITY || soft >= TOOL_STACK_BYTES {
        return Ok(soft);
    }
    let want = if hard == RLIM_INFINITY { TOOL_STACK_BYTES } else { TOOL_STACK_BYTES.min(hard) };
    setrlimit(Resource::RLIMIT_STACK, want, hard)?;
    Ok(want)
}

/// The real tools on this host.
#[derive(Debug, Clone, Copy, Default)]
pub struct Host;

impl Runner for Host {
    fn run(&mut self, program: &str, args: &[&str], stdin: Option<&str>) -> Result<String, ExecError> {
        let spawn_err = |source| ExecError::Spawn { program: program.to_string(), source };
        let mut child = Command::new(program)
            .args(args)
            .stdin(if stdin.is_some() { Stdio::piped() } else { Stdio::null() })
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .map_err(spawn_err)?;
        if let (Some(text), Some(mut pipe)) = (stdin, child.stdin.take()) {
            // A tool that dies early closes the pipe; its exit status says why.
            if let Err(e) = pipe.write_all(text.as_bytes()) {
                tracing::debug!(program, error = %e, "writing stdin");
            }
        }
        let out = child.wait_with_output().map_err(spawn_err)?;
        if !out.status.success() {
            return Err(ExecError::Failed {
                program: format!("{program} {}", args.join(" ")),
                status: out.status.to_string(),
                stderr: String::from_utf8_lossy(&out.stderr).trim().to_string(),
            });
        }
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    }
}

/// One recorded call.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Call {
    pub program: String,
    pub args: Vec<String>,
    pub stdin: Option<String>,
}

impl Call {
    /// "program arg arg" (for assertions).
    pub fn line(&self) -> String {
        std::iter::once(self.program.as_str()).chain(self.args.iter().map(String::as_str)).collect::<Vec<_>>().join(" ")
    }
}

type Answer = Box<dyn FnMut(&Call) -> Option<Result<String, ExecError>> + Send>;

/// A recording fake: every call is logged; answers come from a rule (first match wins), else
/// empty success.
#[derive(Clone, Default)]
pub struct Recording {
    pub calls: Arc<Mutex<Vec<Call>>>,
    answers: Arc<Mutex<VecDeque<Answer>>>,
}

impl Recording {
    pub fn new() -> Recording {
        Recording::default()
    }

    /// Adds an answer rule: called for each call until it returns Some.
    pub fn answer(&self, f: impl FnMut(&Call) -> Option<Result<String, ExecError>> + Send + 'static) {
        self.answers.lock().unwrap_or_else(|p| p.into_inner()).push_back(Box::new(f));
    }

    pub fn calls(&self) -> Vec<Call> {
        self.calls.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }
}

impl Runner for Recording {
    fn run(&mut self, program: &str, args: &[&str], stdin: Option<&str>) -> Result<String, ExecError> {
        let call = Call {
            program: program.to_string(),
            args: args.iter().map(|s| s.to_string()).collect(),
            stdin: stdin.map(str::to_string),
        };
        self.calls.lock().unwrap_or_else(|p| p.into_inner()).push(call.clone());
        let mut answers = self.answers.lock().unwrap_or_else(|p| p.into_inner());
        for a in answers.iter_mut() {
            if let Some(r) = a(&call) {
                return r;
            }
        }
        Ok(String::new())
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn the_tools_inherit_the_raised_stack_limit() {
        let limit = raise_tool_stack_limit().unwrap();
        let shown = Host.run("sh", &["-c", "ulimit -s"], None).unwrap();
        let expected = if limit == nix::sys::resource::RLIM_INFINITY { "unlimited".to_string() } else { (limit / 1024).to_string() };
        assert_eq!(shown.trim(), expected);
        // where the hard limit allows, the tools get at least TOOL_STACK_BYTES
        let (_, hard) = nix::sys::resource::getrlimit(nix::sys::resource::Resource::RLIMIT_STACK).unwrap();
        if hard == nix::sys::resource::RLIM_INFINITY || hard >= TOOL_STACK_BYTES {
            assert!(limit >= TOOL_STACK_BYTES, "{limit}");
        }
    }
}
