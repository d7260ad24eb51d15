//! ferro's pause binary, built static by the fixture (checked with `file`): it keeps running
//! until SIGTERM or SIGINT and then exits 0, and as PID 1 of a PID namespace it reaps the
//! orphans re-parented to it.
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
#[ignore = "privileged: needs root (PID and mount namespaces); run by scripts/test.sh"]
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

fn children(pid: u32) -> Vec<u32> {
    std::fs::read_to_string(format!("/proc/{pid}/task/{pid}/children"))
        .unwrap_or_default()
        .split_whitespace()
        .filter_map(|p| p.parse().ok())
        .collect()
}

#[test]
#[ignore = "privileged: needs root (PID and mount namespaces); run by scripts/test.sh"]
fn pause_as_pid_1_reaps_orphans_and_stops_on_sigterm() {
    ferro_lab::require_root().unwrap();
    let bin = ferro_lab::images::build_static_pause().unwrap();
    // pause becomes PID 1 of a new PID namespace; unshare waits for it.
    let mut unshare = Command::new("unshare")
        .args(["--pid", "--fork", "--kill-child"])
        .arg(&bin)
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    // On a failed assertion: unshare (started here, by pid) takes pause with it.
    struct KillOnDrop(u32);
    impl Drop for KillOnDrop {
        fn drop(&mut self) {
            let _ = kill(
                Pid::from_raw(i32::try_from(self.0).unwrap_or(0)),
                Signal::SIGKILL,
            );
        }
    }
    let _guard = KillOnDrop(unshare.id());
    let deadline = Instant::now() + Duration::from_secs(5);
    let pause = loop {
        if let Some(p) = children(unshare.id()).first() {
            break *p;
        }
        assert!(Instant::now() < deadline, "pause did not start");
        std::thread::sleep(Duration::from_millis(20));
    };
    // Orphans in its namespace: their parent shell exits at once, so they are re-parented to
    // pause, and exit a second later.
    let status = Command::new("nsenter")
        .args(["-t", &pause.to_string(), "-p", "--", "sh", "-c"])
        .arg("for i in 1 2 3; do (sleep 1 >/dev/null 2>&1 &); done; exit 0")
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .status()
        .unwrap();
    assert!(status.success());
    let adopted = children(pause);
    assert!(!adopted.is_empty(), "no orphan was re-parented to pause");
    let deadline = Instant::now() + Duration::from_secs(5);
    while !children(pause).is_empty() {
        assert!(
            Instant::now() < deadline,
            "pause left zombies: {:?}",
            children(pause)
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    kill(
        Pid::from_raw(i32::try_from(pause).unwrap()),
        Signal::SIGTERM,
    )
    .unwrap();
    let status = wait_exit(&mut unshare, 5);
    assert!(status.success(), "{status}");
}
