//! The agent's wall clock, as one value handed to everything that compares timestamps (the pod
//! workers, the crash-loop back-off, probes' initial delays, the fake runtime).
//!
//! [`Clock::System`] is the machine's wall clock. [`Clock::Tokio`] starts at the machine's time
//! and then moves with tokio's clock, so that a test on tokio's paused clock sees timestamps
//! (container start and finish times, back-off windows, deadlines) advance exactly as far as
//! tokio's timers do, and a ten-second back-off takes no ten seconds.

/// A source of the current time in Unix nanoseconds.
#[derive(Debug, Clone, Default)]
pub enum Clock {
    #[default]
    System,
    Tokio { base_ns: i64, base: tokio::time::Instant },
}

fn system_ns() -> i64 {
    jiff::Timestamp::now().as_nanosecond().try_into().unwrap_or(i64::MAX)
}

impl Clock {
    /// The wall clock that follows tokio's clock from now on (needs a tokio runtime).
    pub fn tokio() -> Self {
        Clock::Tokio { base_ns: system_ns(), base: tokio::time::Instant::now() }
    }

    /// Now, in nanoseconds since the Unix epoch.
    pub fn now_ns(&self) -> i64 {
        match self {
            Clock::System => system_ns(),
            Clock::Tokio { base_ns, base } => {
                let moved = i64::try_from(base.elapsed().as_nanos()).unwrap_or(i64::MAX);
                base_ns.saturating_add(moved)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[tokio::test(start_paused = true)]
    async fn tokio_clock_moves_with_paused_time() {
        let c = Clock::tokio();
        let t0 = c.now_ns();
        tokio::time::sleep(Duration::from_secs(300)).await;
        assert_eq!(c.now_ns() - t0, 300_000_000_000);
    }

    #[test]
    fn system_clock_is_the_wall_clock() {
        let before = system_ns();
        let now = Clock::System.now_ns();
        assert!(now >= before && now - before < 60_000_000_000);
    }
}
