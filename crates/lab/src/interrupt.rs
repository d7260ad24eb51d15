//! Ctrl-C for the programs that build a lab (the benchmarks): SIGINT, SIGTERM or SIGHUP only
//! raise a flag; the lab's waits look at it and panic, so the stack unwinds and every
//! fixture's `Drop` removes what it made (processes by pid, namespaces, mounts, loop devices,
//! files), as it does when the program ends. A second signal does what it does by default:
//! the program ends at once, leaving whatever the clean-up had not removed yet.
//!
//! Tests do not install it: the test harness goes on with the next test after a panic, so a
//! Ctrl-C there would not stop the run. [`check`] costs a load and does nothing without
//! [`unwind_on_signal`].

use std::sync::atomic::{AtomicI32, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use nix::sys::signal::{sigaction, SaFlags, SigAction, SigHandler, SigSet, Signal};

/// The signal received, 0 when none.
static RECEIVED: AtomicI32 = AtomicI32::new(0);

extern "C" fn raise_flag(sig: nix::libc::c_int) {
    // an atomic store is async-signal-safe
    RECEIVED.store(sig, Ordering::SeqCst);
}

/// Installs the handler for SIGINT, SIGTERM and SIGHUP (once per signal: the default
/// disposition comes back after the first, `SA_RESETHAND`).
pub fn unwind_on_signal() -> Result<()> {
    let action = SigAction::new(
        SigHandler::Handler(raise_flag),
        SaFlags::SA_RESETHAND | SaFlags::SA_RESTART,
        SigSet::empty(),
    );
    for sig in [Signal::SIGINT, Signal::SIGTERM, Signal::SIGHUP] {
        // SAFETY: the handler only stores into an atomic, which is async-signal-safe.
        #[allow(unsafe_code)]
        unsafe { sigaction(sig, &action) }.with_context(|| format!("installing a {sig} handler"))?;
    }
    Ok(())
}

/// The signal that arrived since [`unwind_on_signal`], if any.
pub fn received() -> Option<Signal> {
    match RECEIVED.load(Ordering::SeqCst) {
        0 => None,
        n => Signal::try_from(n).ok(),
    }
}

/// Panics when a signal arrived (not while the thread already unwinds: a panic in a `Drop`
/// during unwinding would abort the clean-up). Called by every wait of the lab.
pub fn check() {
    if let Some(sig) = received() {
        if !std::thread::panicking() {
            panic!("interrupted by {sig}: removing what the lab made (a second {sig} ends at once)");
        }
    }
}

/// Sleeps `d`, looking at the flag every 100 ms.
pub fn sleep(d: Duration) {
    let end = Instant::now() + d;
    loop {
        check();
        let left = end.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return;
        }
        std::thread::sleep(left.min(Duration::from_millis(100)));
    }
}

/// Runs `f`, looking at the flag every 100 ms while it waits: a benchmark's async part (a
/// burst of creates and the watch that follows them) is interruptible too.
pub async fn interruptible<F: std::future::Future>(f: F) -> F::Output {
    tokio::pin!(f);
    let mut tick = tokio::time::interval(Duration::from_millis(100));
    loop {
        tokio::select! {
            out = &mut f => return out,
            _ = tick.tick() => check(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn without_a_signal_check_and_sleep_return() {
        // the flag is process-wide: this test never raises it, and no other test of this crate does
        check();
        sleep(Duration::from_millis(10));
        assert_eq!(received(), None);
    }

    #[tokio::test]
    async fn interruptible_gives_the_futures_output() {
        let out = interruptible(async {
            tokio::time::sleep(Duration::from_millis(250)).await;
            7
        })
        .await;
        assert_eq!(out, 7);
    }
}
