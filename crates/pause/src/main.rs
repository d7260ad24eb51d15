//! `pause`: the process that holds a pod sandbox's namespaces.
//!
//! It blocks SIGTERM, SIGINT and SIGCHLD and takes them with `sigwait`, so no signal handler
//! (and no `unsafe`) is needed, and, as PID 1 of the pod's PID namespace, it still receives
//! them (the kernel drops signals without a handler for PID 1 unless they are blocked).
//! SIGCHLD reaps every exited child (orphans are re-parented to PID 1); SIGTERM or SIGINT
//! exits with status 0. Built static (`-C target-feature=+crt-static`) so the image needs
//! nothing but this file.

use std::process::ExitCode;

use nix::sys::signal::{SigSet, Signal};
use nix::sys::wait::{waitpid, WaitPidFlag, WaitStatus};
use nix::unistd::Pid;

fn reap() {
    loop {
        match waitpid(Pid::from_raw(-1), Some(WaitPidFlag::WNOHANG)) {
            Ok(WaitStatus::StillAlive) | Err(_) => return,
            Ok(_) => {}
        }
    }
}

fn main() -> ExitCode {
    if std::env::args().nth(1).as_deref() == Some("-v") {
        println!("ferro-pause {}", env!("CARGO_PKG_VERSION"));
        return ExitCode::SUCCESS;
    }
    let mut set = SigSet::empty();
    for s in [Signal::SIGTERM, Signal::SIGINT, Signal::SIGCHLD] {
        set.add(s);
    }
    if let Err(e) = set.thread_block() {
        eprintln!("pause: block signals: {e}");
        return ExitCode::FAILURE;
    }
    loop {
        match set.wait() {
            Ok(Signal::SIGCHLD) => reap(),
            Ok(Signal::SIGTERM | Signal::SIGINT) => {
                reap();
                return ExitCode::SUCCESS;
            }
            Ok(_) => {}
            Err(e) => {
                eprintln!("pause: sigwait: {e}");
                return ExitCode::FAILURE;
            }
        }
    }
}
