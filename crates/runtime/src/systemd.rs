//! systemd's notify protocol (sd_notify(3)) for every ferro binary, with no libsystemd: each
//! message is one datagram of `KEY=VALUE` lines to the unix socket named by $NOTIFY_SOCKET (a
//! leading '@' names an abstract socket). Outside systemd (no $NOTIFY_SOCKET) every call is a
//! no-op, so the binaries run the same by hand, in the lab and under a unit.
//!
//! - [`Systemd::ready`] (`READY=1`) once the component really serves (Type=notify units stay
//!   "activating" until then), [`Systemd::status`] (`STATUS=...`, shown by `systemctl status`),
//!   [`Systemd::stopping`] (`STOPPING=1`) when a SIGTERM starts the shutdown.
//! - The watchdog (WatchdogSec=): systemd sets $WATCHDOG_USEC (and $WATCHDOG_PID, which must be
//!   this process, as sd_watchdog_enabled(3) checks). A task sends `WATCHDOG=1` every half
//!   interval, but only when the component's [`Heartbeat`] moved since the last one: the main
//!   loop beats it as it turns, so a wedged loop stops the keep-alives and systemd restarts the
//!   unit (the task itself turning proves nothing). A missed beat says why in `STATUS=`.

use std::ffi::OsStr;
use std::io;
use std::os::unix::net::UnixDatagram;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// Where the notifications go.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Target {
    Path(PathBuf),
    Abstract(Vec<u8>),
}

/// Sends notify messages to one socket (or nowhere, outside systemd).
#[derive(Debug, Clone, Default)]
pub struct Notifier {
    target: Option<Target>,
}

impl Notifier {
    /// The socket named by $NOTIFY_SOCKET; none when it is unset or empty.
    pub fn from_env() -> Notifier {
        Notifier::from_socket_value(std::env::var_os("NOTIFY_SOCKET").as_deref())
    }

    /// The socket a $NOTIFY_SOCKET value names: a path, or `@name` for an abstract socket.
    pub fn from_socket_value(value: Option<&OsStr>) -> Notifier {
        let target = value.filter(|v| !v.is_empty()).map(|v| {
            let bytes = v.as_encoded_bytes();
            match bytes.strip_prefix(b"@") {
                Some(name) => Target::Abstract(name.to_vec()),
                None => Target::Path(PathBuf::from(v)),
            }
        });
        Notifier { target }
    }

    /// Whether there is a socket to notify.
    pub fn enabled(&self) -> bool {
        self.target.is_some()
    }

    /// Sends `state` (newline-separated `KEY=VALUE` assignments) as one datagram. `Ok(false)`
    /// when there is no socket.
    pub fn send(&self, state: &str) -> io::Result<bool> {
        let Some(target) = &self.target else { return Ok(false) };
        let sock = UnixDatagram::unbound()?;
        match target {
            Target::Path(path) => sock.send_to(state.as_bytes(), path)?,
            Target::Abstract(name) => {
                use std::os::linux::net::SocketAddrExt as _;
                let addr = std::os::unix::net::SocketAddr::from_abstract_name(name)?;
                sock.send_to_addr(state.as_bytes(), &addr)?
            }
        };
        Ok(true)
    }

    /// [`Notifier::send`], a failure logged (a notification lost is no reason to stop serving:
    /// systemd then times the start out or restarts the unit, and says so in the journal).
    fn send_logged(&self, state: &str) {
        if let Err(e) = self.send(state) {
            tracing::warn!(error = %e, state, "sd_notify failed");
        }
    }
}

/// The watchdog interval systemd asks for, as sd_watchdog_enabled(3) reads it: $WATCHDOG_USEC
/// a positive number of microseconds, and $WATCHDOG_PID (when set) this process's pid.
pub fn watchdog_interval(usec: Option<&OsStr>, pid: Option<&OsStr>, my_pid: u32) -> Option<Duration> {
    let usec: u64 = usec?.to_str()?.trim().parse().ok()?;
    if usec == 0 {
        return None;
    }
    if let Some(pid) = pid {
        let pid: u32 = pid.to_str()?.trim().parse().ok()?;
        if pid != my_pid {
            return None;
        }
    }
    Some(Duration::from_micros(usec))
}

/// A counter the component's main loop moves each time it turns (or each time a real check of
/// its service succeeds, see [`Heartbeat::drive`]).
#[derive(Debug, Clone, Default)]
pub struct Heartbeat(Arc<AtomicU64>);

impl Heartbeat {
    pub fn new() -> Heartbeat {
        Heartbeat::default()
    }

    /// The loop turned.
    pub fn beat(&self) {
        self.0.fetch_add(1, Ordering::Relaxed);
    }

    pub fn count(&self) -> u64 {
        self.0.load(Ordering::Relaxed)
    }

    /// For a component whose serving is not one loop (an API server, a gRPC server): every
    /// `period` a task runs `check`, a real request to the component's own service, and beats
    /// only when it succeeds. The task ends when the returned handle is aborted or dropped with
    /// the runtime.
    pub fn drive<F, Fut>(&self, period: Duration, mut check: F) -> tokio::task::JoinHandle<()>
    where
        F: FnMut() -> Fut + Send + 'static,
        Fut: std::future::Future<Output = Result<(), String>> + Send,
    {
        let hb = self.clone();
        tokio::spawn(async move {
            // the first check one period after the start (the service is still coming up)
            let mut tick = tokio::time::interval_at(tokio::time::Instant::now() + period, period);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                tick.tick().await;
                match check().await {
                    Ok(()) => hb.beat(),
                    Err(e) => tracing::warn!(error = %e, "liveness check failed: no watchdog keep-alive for it"),
                }
            }
        })
    }
}

/// What the watchdog does at one of its ticks: keep systemd's timer running only if the
/// heartbeat moved since the previous tick.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Tick {
    KeepAlive,
    /// The heartbeat has not moved for this many ticks (the message is sent once per stall).
    Stalled { ticks: u32 },
}

/// The watchdog's decisions, apart from the clock and the socket.
#[derive(Debug)]
pub struct WatchdogState {
    last_seen: u64,
    stalled: u32,
}

impl WatchdogState {
    /// Starts at the heartbeat's current count: the loop must turn before the first keep-alive.
    pub fn new(current: u64) -> WatchdogState {
        WatchdogState { last_seen: current, stalled: 0 }
    }

    pub fn tick(&mut self, current: u64) -> Tick {
        if current != self.last_seen {
            self.last_seen = current;
            self.stalled = 0;
            Tick::KeepAlive
        } else {
            self.stalled += 1;
            Tick::Stalled { ticks: self.stalled }
        }
    }
}

/// Sends `WATCHDOG=1` every `interval / 2` while `heartbeat` moves; on the first tick of a
/// stall a `STATUS=` line saying the loop stopped turning (systemd kills the unit with SIGABRT
/// when the interval passes without a keep-alive, and restarts it per Restart=).
pub fn spawn_watchdog(notifier: Notifier, interval: Duration, heartbeat: Heartbeat) -> tokio::task::JoinHandle<()> {
    let every = interval / 2;
    let mut state = WatchdogState::new(heartbeat.count());
    tokio::spawn(async move {
        let mut tick = tokio::time::interval_at(tokio::time::Instant::now() + every, every);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tick.tick().await;
            match state.tick(heartbeat.count()) {
                Tick::KeepAlive => notifier.send_logged("WATCHDOG=1"),
                Tick::Stalled { ticks: 1 } => {
                    tracing::warn!(?every, "main loop did not turn since the last watchdog tick: no keep-alive");
                    notifier.send_logged(&format!("STATUS=watchdog: the main loop has not turned for {every:?}"));
                }
                Tick::Stalled { .. } => {}
            }
        }
    })
}

/// One component's link to systemd: the notifier, its heartbeat and (when WatchdogSec= is set)
/// the keep-alive task. Make it in the tokio runtime at start; a no-op outside systemd.
#[derive(Debug)]
pub struct Systemd {
    notifier: Notifier,
    heartbeat: Heartbeat,
    watchdog: Option<(Duration, tokio::task::JoinHandle<()>)>,
}

impl Systemd {
    /// From $NOTIFY_SOCKET, $WATCHDOG_USEC and $WATCHDOG_PID; starts the keep-alive task when
    /// systemd asks for one (needs a tokio runtime).
    pub fn from_env() -> Systemd {
        let notifier = Notifier::from_env();
        let interval = watchdog_interval(
            std::env::var_os("WATCHDOG_USEC").as_deref(),
            std::env::var_os("WATCHDOG_PID").as_deref(),
            std::process::id(),
        );
        Systemd::new(notifier, interval)
    }

    /// With an explicit socket and watchdog interval (tests; `from_env` otherwise).
    pub fn new(notifier: Notifier, watchdog: Option<Duration>) -> Systemd {
        let heartbeat = Heartbeat::new();
        let watchdog = watchdog
            .filter(|_| notifier.enabled())
            .map(|interval| (interval, spawn_watchdog(notifier.clone(), interval, heartbeat.clone())));
        if let Some((interval, _)) = &watchdog {
            tracing::info!(?interval, "systemd watchdog enabled: keep-alives while the main loop turns");
        }
        Systemd { notifier, heartbeat, watchdog }
    }

    /// The heartbeat the main loop beats.
    pub fn heartbeat(&self) -> Heartbeat {
        self.heartbeat.clone()
    }

    /// The watchdog interval, when systemd asked for one.
    pub fn watchdog_interval(&self) -> Option<Duration> {
        self.watchdog.as_ref().map(|(d, _)| *d)
    }

    /// `READY=1` with a status line: the component serves.
    pub fn ready(&self, status: &str) {
        tracing::info!(status, "ready");
        self.notifier.send_logged(&format!("READY=1\nSTATUS={status}"));
    }

    /// `STATUS=...` (one line; newlines would start new assignments).
    pub fn status(&self, status: &str) {
        self.notifier.send_logged(&format!("STATUS={}", status.replace('\n', " ")));
    }

    /// `STOPPING=1`: a signal started the shutdown. The keep-alives stop with it (systemd does
    /// not watch a stopping unit; TimeoutStopSec= bounds it).
    pub fn stopping(&self) {
        if let Some((_, task)) = &self.watchdog {
            task.abort();
        }
        self.notifier.send_logged("STOPPING=1\nSTATUS=stopping");
    }
}

impl Drop for Systemd {
    fn drop(&mut self) {
        if let Some((_, task)) = &self.watchdog {
            task.abort();
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use std::os::unix::net::UnixDatagram;

    /// A real datagram socket standing in for systemd's notify socket.
    struct FakeSystemd {
        _dir: tempfile::TempDir,
        path: PathBuf,
        sock: UnixDatagram,
    }

    impl FakeSystemd {
        fn new() -> FakeSystemd {
            let dir = tempfile::tempdir().unwrap();
            let path = dir.path().join("notify");
            let sock = UnixDatagram::bind(&path).unwrap();
            FakeSystemd { _dir: dir, path, sock }
        }

        fn notifier(&self) -> Notifier {
            Notifier::from_socket_value(Some(self.path.as_os_str()))
        }

        /// The next datagram (blocking: the sender is already under way).
        fn recv(&self) -> String {
            let mut buf = [0u8; 4096];
            let n = self.sock.recv(&mut buf).unwrap();
            String::from_utf8(buf[..n].to_vec()).unwrap()
        }

        /// The next datagram, waiting in the runtime (so paused time moves on meanwhile).
        async fn recv_async(&self) -> String {
            let sock = self.sock.try_clone().unwrap();
            sock.set_nonblocking(true).unwrap();
            let sock = tokio::net::UnixDatagram::from_std(sock).unwrap();
            let mut buf = [0u8; 4096];
            let n = sock.recv(&mut buf).await.unwrap();
            String::from_utf8(buf[..n].to_vec()).unwrap()
        }
    }

    #[test]
    fn no_socket_is_a_no_op() {
        let n = Notifier::from_socket_value(None);
        assert!(!n.enabled());
        assert!(!n.send("READY=1").unwrap());
        assert!(!Notifier::from_socket_value(Some(OsStr::new(""))).enabled());
    }

    #[test]
    fn ready_status_and_stopping_reach_a_path_socket() {
        let fake = FakeSystemd::new();
        let sd = Systemd { notifier: fake.notifier(), heartbeat: Heartbeat::new(), watchdog: None };
        sd.ready("serving on 6443");
        assert_eq!(fake.recv(), "READY=1\nSTATUS=serving on 6443");
        sd.status("two\nlines");
        assert_eq!(fake.recv(), "STATUS=two lines");
        sd.stopping();
        assert_eq!(fake.recv(), "STOPPING=1\nSTATUS=stopping");
    }

    #[test]
    fn abstract_socket_with_at_sign() {
        use std::os::linux::net::SocketAddrExt as _;
        let name = format!("ferro-notify-test-{}", std::process::id());
        let addr = std::os::unix::net::SocketAddr::from_abstract_name(name.as_bytes()).unwrap();
        let sock = UnixDatagram::bind_addr(&addr).unwrap();
        let n = Notifier::from_socket_value(Some(OsStr::new(&format!("@{name}"))));
        assert!(n.send("READY=1").unwrap());
        let mut buf = [0u8; 64];
        let len = sock.recv(&mut buf).unwrap();
        assert_eq!(&buf[..len], b"READY=1");
    }

    #[test]
    fn a_missing_socket_is_an_error_not_a_panic() {
        let dir = tempfile::tempdir().unwrap();
        let n = Notifier::from_socket_value(Some(dir.path().join("absent").as_os_str()));
        assert!(n.send("READY=1").is_err());
    }

    #[test]
    fn watchdog_interval_as_sd_watchdog_enabled() {
        let s = |v: &str| Some(OsStr::new(v).to_os_string());
        assert_eq!(watchdog_interval(s("30000000").as_deref(), None, 7), Some(Duration::from_secs(30)));
        assert_eq!(watchdog_interval(s("30000000").as_deref(), s("7").as_deref(), 7), Some(Duration::from_secs(30)));
        assert_eq!(watchdog_interval(s("30000000").as_deref(), s("8").as_deref(), 7), None, "meant for another process");
        assert_eq!(watchdog_interval(s("0").as_deref(), None, 7), None);
        assert_eq!(watchdog_interval(s("soon").as_deref(), None, 7), None);
        assert_eq!(watchdog_interval(None, s("7").as_deref(), 7), None);
        assert_eq!(watchdog_interval(s("30000000").as_deref(), s("x").as_deref(), 7), None);
    }

    #[test]
    fn keep_alive_only_when_the_heartbeat_moved() {
        let mut st = WatchdogState::new(5);
        assert_eq!(st.tick(5), Tick::Stalled { ticks: 1 }, "no turn since start");
        assert_eq!(st.tick(6), Tick::KeepAlive);
        assert_eq!(st.tick(9), Tick::KeepAlive);
        assert_eq!(st.tick(9), Tick::Stalled { ticks: 1 });
        assert_eq!(st.tick(9), Tick::Stalled { ticks: 2 });
        assert_eq!(st.tick(10), Tick::KeepAlive, "a loop that turns again is alive again");
    }

    #[tokio::test(start_paused = true)]
    async fn watchdog_task_sends_keep_alives_while_the_loop_turns_and_says_when_it_stalls() {
        let fake = FakeSystemd::new();
        let sd = Systemd::new(fake.notifier(), Some(Duration::from_secs(20)));
        assert_eq!(sd.watchdog_interval(), Some(Duration::from_secs(20)));
        let hb = sd.heartbeat();
        // the loop turns: the next tick (after 10 s of paused time) keeps the timer running
        hb.beat();
        assert_eq!(fake.recv_async().await, "WATCHDOG=1");
        hb.beat();
        assert_eq!(fake.recv_async().await, "WATCHDOG=1");
        // the loop stops turning: no keep-alive, a status line instead
        let stalled = fake.recv_async().await;
        assert!(stalled.starts_with("STATUS=watchdog: the main loop has not turned"), "{stalled}");
        // and it turns again
        hb.beat();
        assert_eq!(fake.recv_async().await, "WATCHDOG=1");
        sd.stopping();
        assert_eq!(fake.recv_async().await, "STOPPING=1\nSTATUS=stopping");
    }

    #[tokio::test(start_paused = true)]
    async fn drive_beats_only_on_successful_checks() {
        let hb = Heartbeat::new();
        let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<bool>();
        let results = Arc::new(std::sync::Mutex::new(vec![Ok(()), Err("refused".to_string()), Ok(())]));
        let task = hb.drive(Duration::from_secs(5), move || {
            let next = results.lock().unwrap().pop();
            let tx = tx.clone();
            async move {
                let r = next.unwrap_or(Err("done".into()));
                tx.send(r.is_ok()).unwrap();
                r
            }
        });
        // popped in reverse: ok, err, ok
        assert!(rx.recv().await.unwrap());
        assert!(!rx.recv().await.unwrap());
        assert!(rx.recv().await.unwrap());
        assert!(!rx.recv().await.unwrap());
        task.abort();
        assert_eq!(hb.count(), 2);
    }

    #[test]
    fn no_watchdog_task_without_a_socket() {
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        rt.block_on(async {
            let sd = Systemd::new(Notifier::default(), Some(Duration::from_secs(20)));
            assert_eq!(sd.watchdog_interval(), None);
            sd.ready("x");
            sd.stopping();
        });
    }
}
