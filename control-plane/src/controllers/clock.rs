//! The controllers' clock: the system's, or a manual one that tests set (no test waits for
//! real minutes to see a CronJob run).

use std::sync::Arc;
use std::time::Duration;

use jiff::Timestamp;
use tokio::sync::watch;

#[derive(Clone, Debug, Default)]
pub enum Clock {
    #[default]
    System,
    /// Time stands still until [`Clock::set`] moves it.
    Manual(Arc<watch::Sender<Timestamp>>),
}

impl Clock {
    pub fn manual(start: Timestamp) -> Clock {
        Clock::Manual(Arc::new(watch::channel(start).0))
    }

    pub fn now(&self) -> Timestamp {
        match self {
            Clock::System => Timestamp::now(),
            Clock::Manual(tx) => *tx.borrow(),
        }
    }

    /// A manual clock that follows a file holding an RFC 3339 timestamp (re-read every 20 ms),
    /// so a test can drive the clock of a control plane it runs as a process. Call within a
    /// tokio runtime.
    pub fn from_file(path: std::path::PathBuf) -> Result<Clock, String> {
        let read = |p: &std::path::Path| -> Result<Timestamp, String> {
            let text = std::fs::read_to_string(p).map_err(|e| format!("clock file {}: {e}", p.display()))?;
            text.trim().parse::<Timestamp>().map_err(|e| format!("clock file {}: {e}", p.display()))
        };
        let clock = Clock::manual(read(&path)?);
        let c = clock.clone();
        tokio::spawn(async move {
            loop {
                tokio::time::sleep(Duration::from_millis(20)).await;
                // a half-written file reads as an error: the next round sees it whole
                if let Ok(t) = read(&path) {
                    if t != c.now() {
                        c.set(t);
                    }
                }
            }
        });
        Ok(clock)
    }

    /// Moves a manual clock (a system clock ignores it).
    pub fn set(&self, t: Timestamp) {
        if let Clock::Manual(tx) = self {
            tx.send_replace(t);
        }
    }

    /// Returns once the clock reads `t` or later.
    pub async fn sleep_until(&self, t: Timestamp) {
        match self {
            Clock::System => {
                let left = t.duration_since(Timestamp::now());
                if left.is_positive() {
                    tokio::time::sleep(Duration::try_from(left).unwrap_or(Duration::ZERO)).await;
                }
            }
            Clock::Manual(tx) => {
                let mut rx = tx.subscribe();
                // Err: the sender is gone, time never moves again.
                let _ = rx.wait_for(|now| *now >= t).await;
            }
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_manual_clock_wakes_sleepers_when_set_past_their_time() {
        let start: Timestamp = "2026-11-26T10:00:00Z".parse().unwrap();
        let clock = Clock::manual(start);
        let due: Timestamp = "2026-11-26T10:01:00Z".parse().unwrap();
        let c = clock.clone();
        let sleeper = tokio::spawn(async move { c.sleep_until(due).await });
        tokio::task::yield_now().await;
        assert!(!sleeper.is_finished());
        clock.set("2026-11-26T10:00:59Z".parse().unwrap());
        tokio::task::yield_now().await;
        assert!(!sleeper.is_finished());
        clock.set(due);
        sleeper.await.unwrap();
        assert_eq!(clock.now(), due);
    }
}
