//! Crash-loop and image-pull backoff, as the upstream kubelet keeps it (client-go's
//! `flowcontrol.Backoff` without jitter): per key, a delay that starts at [`INITIAL`], doubles
//! on every further attempt and is capped at [`MAX`]. Pure: the caller passes every timestamp
//! (unix nanoseconds), so tests need no clock.
//!
//! Use (as upstream's `doBackOff`): before restarting a container, ask
//! [`Backoff::in_backoff`] with the previous attempt's `finishedAt`; when it answers `None`,
//! record the attempt with [`Backoff::next`] and start the container.
//!
//! One difference from upstream: an entry's "last update" is the event time passed to
//! [`Backoff::next`] (the finishedAt), not the wall clock when `next` ran, so the structure
//! stays pure. The expiry window (2 * max) is the same.

use std::collections::BTreeMap;
use std::time::Duration;

/// The first delay (upstream: 10 s).
pub const INITIAL: Duration = Duration::from_secs(10);
/// The largest delay (upstream MaxContainerBackOff: 300 s).
pub const MAX: Duration = Duration::from_secs(300);
/// A container that ran this long before finishing starts over at the initial delay.
pub const STABLE_RUN: Duration = Duration::from_secs(600);

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Entry {
    backoff: Duration,
    /// Unix ns of the event that last updated the entry.
    last_update: i64,
}

/// Per-key exponential backoff.
#[derive(Debug, Clone)]
pub struct Backoff {
    initial: Duration,
    max: Duration,
    entries: BTreeMap<String, Entry>,
}

/// `Default` is the kubelet's backoff ([`INITIAL`], [`MAX`]), not zero delays.
impl Default for Backoff {
    fn default() -> Self {
        Backoff::new(INITIAL, MAX)
    }
}

/// `later - earlier` in ns as a Duration; zero when `later` is not after `earlier`.
fn elapsed(earlier: i64, later: i64) -> Duration {
    let d = i128::from(later) - i128::from(earlier);
    if d <= 0 {
        Duration::ZERO
    } else {
        // i64 differences fit in u64 nanoseconds.
        Duration::from_nanos(u64::try_from(d).unwrap_or(u64::MAX))
    }
}

impl Backoff {
    pub fn new(initial: Duration, max: Duration) -> Self {
        Backoff { initial, max, entries: BTreeMap::new() }
    }

    /// Upstream `hasExpired`: the entry was last updated more than 2 * max before `event`, so
    /// the key is considered stable again.
    fn expired(&self, entry: &Entry, event: i64) -> bool {
        elapsed(entry.last_update, event) > self.max.saturating_mul(2)
    }

    /// Some(remaining) when `key` is still backing off at `now` counting from `since` (the
    /// event time, e.g. the container's finishedAt).
    pub fn in_backoff(&self, key: &str, since: i64, now: i64) -> Option<Duration> {
        let entry = self.entries.get(key)?;
        if self.expired(entry, since) {
            return None;
        }
        let waited = elapsed(since, now);
        if waited < entry.backoff {
            Some(entry.backoff - waited)
        } else {
            None
        }
    }

    /// Records a (re)start attempt for `key` at event time `since`: first time -> initial;
    /// else doubles up to max; an entry older than 2*max, or (when `ran_for` >= 10 min) a
    /// container that ran 10 minutes, resets to initial.
    pub fn next(&mut self, key: &str, since: i64, ran_for: Duration) {
        let backoff = match self.entries.get(key) {
            Some(e) if !self.expired(e, since) && ran_for < STABLE_RUN => e.backoff.saturating_mul(2).min(self.max),
            _ => self.initial.min(self.max),
        };
        self.entries.insert(key.to_string(), Entry { backoff, last_update: since });
    }

    /// The current delay of `key`, if it has an entry.
    pub fn current(&self, key: &str) -> Option<Duration> {
        self.entries.get(key).map(|e| e.backoff)
    }

    /// Forgets `key` (e.g. the container was removed or the pod deleted).
    pub fn reset(&mut self, key: &str) {
        self.entries.remove(key);
    }

    /// Drops entries not updated for 2*max before `now`.
    pub fn gc(&mut self, now: i64) {
        let limit = self.max.saturating_mul(2);
        self.entries.retain(|_, e| elapsed(e.last_update, now) <= limit);
    }

    /// Number of keys held (for metrics and tests).
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }
}

/// The backoff key of one container of one pod: upstream keys by pod and container name plus
/// the spec hash, so a changed spec starts without the old delay.
pub fn container_key(pod_uid: &str, container: &str, hash: u64) -> String {
    format!("{pod_uid}_{container}_{hash:016x}")
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    const S: i64 = 1_000_000_000;
    const T0: i64 = 1_700_000_000 * S;

    fn secs(n: u64) -> Duration {
        Duration::from_secs(n)
    }

    #[test]
    fn doubles_from_initial_and_caps_at_max() {
        let mut b = Backoff::default();
        assert_eq!(b.current("k"), None);
        let mut seen = Vec::new();
        let mut t = T0;
        for _ in 0..8 {
            b.next("k", t, secs(1));
            seen.push(b.current("k").unwrap().as_secs());
            t += 60 * S;
        }
        assert_eq!(seen, [10, 20, 40, 80, 160, 300, 300, 300]);
    }

    #[test]
    fn custom_initial_and_max() {
        let mut b = Backoff::new(secs(1), secs(3));
        b.next("k", T0, Duration::ZERO);
        b.next("k", T0 + S, Duration::ZERO);
        b.next("k", T0 + 2 * S, Duration::ZERO);
        assert_eq!(b.current("k"), Some(secs(3)));
    }

    #[test]
    fn in_backoff_window() {
        let mut b = Backoff::default();
        assert_eq!(b.in_backoff("k", T0, T0), None, "unknown key is not backing off");
        b.next("k", T0, secs(1));
        assert_eq!(b.in_backoff("k", T0, T0), Some(secs(10)));
        assert_eq!(b.in_backoff("k", T0, T0 + 4 * S), Some(secs(6)));
        assert_eq!(b.in_backoff("k", T0, T0 + 10 * S), None);
        assert_eq!(b.in_backoff("k", T0, T0 + 11 * S), None);
        // A clock before the event counts as no time waited.
        assert_eq!(b.in_backoff("k", T0, T0 - S), Some(secs(10)));
        // Other keys are independent.
        assert_eq!(b.in_backoff("other", T0, T0), None);

        // Second crash 15 s later: 20 s from that finishedAt.
        let t1 = T0 + 15 * S;
        b.next("k", t1, secs(5));
        assert_eq!(b.in_backoff("k", t1, t1 + 5 * S), Some(secs(15)));
        assert_eq!(b.in_backoff("k", t1, t1 + 20 * S), None);
    }

    #[test]
    fn in_backoff_is_none_once_the_entry_expired() {
        let mut b = Backoff::default();
        b.next("k", T0, secs(1));
        b.next("k", T0 + S, secs(1));
        // A new event more than 2 * max after the last update: stable again.
        let later = T0 + S + 601 * S;
        assert_eq!(b.in_backoff("k", later, later), None);
        let just_inside = T0 + S + 600 * S;
        assert_eq!(b.in_backoff("k", just_inside, just_inside), Some(secs(20)));
    }

    #[test]
    fn resets_after_a_ten_minute_run() {
        let mut b = Backoff::default();
        for i in 0..5 {
            b.next("k", T0 + i * 30 * S, secs(20));
        }
        assert_eq!(b.current("k"), Some(secs(160)));
        b.next("k", T0 + 200 * S, secs(599));
        assert_eq!(b.current("k"), Some(secs(300)));
        b.next("k", T0 + 300 * S, secs(600));
        assert_eq!(b.current("k"), Some(secs(10)));
        b.next("k", T0 + 320 * S, secs(1));
        assert_eq!(b.current("k"), Some(secs(20)));
    }

    #[test]
    fn resets_after_twice_max_idle() {
        let mut b = Backoff::default();
        b.next("k", T0, secs(1));
        b.next("k", T0 + 10 * S, secs(1));
        b.next("k", T0 + 20 * S, secs(1));
        assert_eq!(b.current("k"), Some(secs(40)));
        // Exactly 2 * max later is not yet expired (upstream: strictly greater).
        b.next("k", T0 + 620 * S, secs(1));
        assert_eq!(b.current("k"), Some(secs(80)));
        b.next("k", T0 + 1221 * S, secs(1));
        assert_eq!(b.current("k"), Some(secs(10)));
    }

    #[test]
    fn reset_forgets_the_key() {
        let mut b = Backoff::default();
        b.next("k", T0, secs(1));
        b.next("k", T0 + S, secs(1));
        b.reset("k");
        assert_eq!(b.current("k"), None);
        assert_eq!(b.in_backoff("k", T0 + S, T0 + S), None);
        b.next("k", T0 + 2 * S, secs(1));
        assert_eq!(b.current("k"), Some(secs(10)));
    }

    #[test]
    fn gc_drops_stale_entries() {
        let mut b = Backoff::default();
        b.next("old", T0, secs(1));
        b.next("new", T0 + 300 * S, secs(1));
        b.gc(T0 + 600 * S);
        assert_eq!(b.len(), 2, "exactly 2 * max is kept");
        b.gc(T0 + 601 * S);
        assert_eq!(b.current("old"), None);
        assert_eq!(b.current("new"), Some(secs(10)));
        b.gc(T0 + 2000 * S);
        assert!(b.is_empty());
    }

    #[test]
    fn keys_are_stable_and_distinct() {
        assert_eq!(container_key("uid-1", "app", 0xab), "uid-1_app_00000000000000ab");
        assert_ne!(container_key("uid-1", "app", 1), container_key("uid-1", "app", 2));
        assert_ne!(container_key("uid-1", "app", 1), container_key("uid-2", "app", 1));
    }
}
