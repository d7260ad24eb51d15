//! ferro's pause binary, built static by the fixture (checked with `file`): it keeps running
//! until SIGTERM or SIGINT and then exits 0. Its reaping of children is not tested yet.
#![allow(clippy::unwrap_used)]

use std::process::Command;
use std::time::{Duration, Instant};

use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;

fn wait_exit(child: &mut std::process::Child, secs: u64) -> std::process::ExitStatus {
    let deadline = Instant::now() + Duration::from_secs(secs);
    loop {
        if let Some(s) = child.try_wait().unwrap() {
            return s;
        }
        assert!(Instant::now() < deadline, "pause did not exit");
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn static_pause_stops_on_sigterm_and_sigint() {
    let bin = ferro_lab::images::build_static_pause().unwrap();
    ferro_lab::images::check_static(&bin).unwrap();
    for sig in [Signal::SIGTERM, Signal::SIGINT] {
        let mut child = Command::new(&bin).spawn().unwrap();
        std::thread::sleep(Duration::from_millis(200));
        assert!(
            child.try_wait().unwrap().is_none(),
            "pause exited by itself"
        );
        kill(Pid::from_raw(i32::try_from(child.id()).unwrap()), sig).unwrap();
        let status = wait_exit(&mut child, 5);
        assert!(status.success(), "{sig}: {status}");
    }
}

#[test]
fn a_dynamic_binary_is_not_static() {
    let err = ferro_lab::images::check_static(std::path::Path::new("/usr/bin/ls")).unwrap_err();
    assert!(err.to_string().contains("not static"), "{err}");
}
