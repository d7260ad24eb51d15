//! The pure decisions of client certificate rotation: when to rotate a certificate, what to do
//! at a given moment, how long to wait after a failure, and what the rotated files are called.

use std::time::Duration;

/// The validity of a certificate, seconds since the Unix epoch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Validity {
    pub not_before: i64,
    pub not_after: i64,
}

/// Upstream's certificate manager rotates at a random point between 70 % and 90 % of the
/// certificate's validity (measured from notBefore).
pub const ROTATE_FROM: f64 = 0.7;
pub const ROTATE_TO: f64 = 0.9;

/// When to rotate `v`: at `ROTATE_FROM + jitter * (ROTATE_TO - ROTATE_FROM)` of its validity
/// (`jitter` in 0..1, anything outside is clamped), or earlier when less than `renew_before`
/// seconds would then be left (`--rotate-certificates-before`; 0 leaves the 70-90 % point alone).
pub fn deadline(v: &Validity, jitter: f64, renew_before: i64) -> i64 {
    let total = (v.not_after - v.not_before).max(0);
    let jitter = if jitter.is_finite() {
        jitter.clamp(0.0, 1.0)
    } else {
        0.0
    };
    let fraction = ROTATE_FROM + jitter * (ROTATE_TO - ROTATE_FROM);
    // validities fit f64's 53 bits of integer precision many times over
    let at = v.not_before + (total as f64 * fraction) as i64;
    if renew_before > 0 {
        at.min(v.not_after.saturating_sub(renew_before))
    } else {
        at
    }
}

/// What the rotation loop does now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Step {
    /// The certificate is good: nothing to do until this time (seconds since the epoch).
    WaitUntil(i64),
    /// Ask for a new certificate, authenticated with the current one.
    Rotate,
    /// The certificate is missing, unreadable or expired and a bootstrap kubeconfig is
    /// configured: join again as at the first start.
    Bootstrap,
    /// The certificate is missing, unreadable or expired and there is no bootstrap
    /// kubeconfig: nothing can renew it; look again later (someone may install a new one).
    Stranded,
}

/// The step at `now` for the certificate in use (`None`: missing or unreadable), whose
/// rotation deadline is `deadline`.
pub fn next_step(
    now: i64,
    current: Option<&Validity>,
    deadline: i64,
    bootstrap_configured: bool,
) -> Step {
    match current {
        Some(v) if now < v.not_after => {
            if now >= deadline {
                Step::Rotate
            } else {
                Step::WaitUntil(deadline)
            }
        }
        _ if bootstrap_configured => Step::Bootstrap,
        _ => Step::Stranded,
    }
}

/// The wait before the next attempt after `failures` failures in a row (1 for the first):
/// 2 s doubling up to 5 minutes, never past `until_expiry` when that is shorter (so an
/// expiry is noticed and the bootstrap fallback runs in time), and never below a second.
pub fn retry_delay(failures: u32, until_expiry: Option<Duration>) -> Duration {
    const FIRST: Duration = Duration::from_secs(2);
    const MAX: Duration = Duration::from_secs(300);
    let shift = failures.saturating_sub(1).min(16);
    let d = FIRST.saturating_mul(1 << shift).min(MAX);
    match until_expiry {
        Some(left) if left < d => left.max(Duration::from_secs(1)),
        _ => d,
    }
}

/// The file a certificate issued at `issued` is kept in: `kubelet-client-<UTC time>.pem`, as
/// upstream's certificate store names them (`kubelet-client-current.pem` points at it).
pub fn pem_file_name(issued: jiff::Timestamp) -> String {
    format!(
        "kubelet-client-{}.pem",
        issued.strftime("%Y-%m-%d-%H-%M-%S")
    )
}

/// The jitter from eight random bytes: uniform in 0..1.
// 53 random bits over 2^53: both exact in f64
pub fn jitter_from(bytes: [u8; 8]) -> f64 {
    (u64::from_le_bytes(bytes) >> 11) as f64 / (1u64 << 53) as f64
}

#[cfg(test)]
mod tests {
    use super::*;

    const V: Validity = Validity {
        not_before: 1000,
        not_after: 11000,
    };

    #[test]
    fn the_deadline_is_between_70_and_90_percent_of_the_validity() {
        assert_eq!(deadline(&V, 0.0, 0), 8000);
        assert_eq!(deadline(&V, 0.5, 0), 9000);
        assert_eq!(deadline(&V, 1.0, 0), 10000);
        assert_eq!(deadline(&V, -3.0, 0), 8000, "clamped");
        assert_eq!(deadline(&V, 7.0, 0), 10000, "clamped");
        assert_eq!(deadline(&V, f64::NAN, 0), 8000);
    }

    #[test]
    fn renew_before_brings_the_deadline_forward_only() {
        assert_eq!(
            deadline(&V, 0.5, 5000),
            6000,
            "5000 s before notAfter comes first"
        );
        assert_eq!(
            deadline(&V, 0.5, 100),
            9000,
            "the jittered point comes first"
        );
        assert_eq!(
            deadline(&V, 0.5, 20000),
            -9000,
            "longer than the validity: at once"
        );
    }

    #[test]
    fn a_valid_certificate_waits_then_rotates() {
        assert_eq!(
            next_step(5000, Some(&V), 9000, false),
            Step::WaitUntil(9000)
        );
        assert_eq!(next_step(9000, Some(&V), 9000, false), Step::Rotate);
        assert_eq!(
            next_step(10999, Some(&V), 9000, true),
            Step::Rotate,
            "still valid: rotate, even with a bootstrap kubeconfig"
        );
    }

    #[test]
    fn an_expired_or_missing_certificate_falls_back_to_bootstrap_when_it_can() {
        assert_eq!(next_step(11000, Some(&V), 9000, true), Step::Bootstrap);
        assert_eq!(next_step(0, None, 0, true), Step::Bootstrap);
        assert_eq!(next_step(11000, Some(&V), 9000, false), Step::Stranded);
        assert_eq!(next_step(0, None, 0, false), Step::Stranded);
    }

    #[test]
    fn retries_back_off_and_stop_at_the_expiry() {
        let secs = |n, left: Option<u64>| retry_delay(n, left.map(Duration::from_secs)).as_secs();
        assert_eq!([1, 2, 3, 4].map(|n| secs(n, None)), [2, 4, 8, 16]);
        assert_eq!(secs(9, None), 300);
        assert_eq!(secs(u32::MAX, None), 300);
        assert_eq!(secs(9, Some(30)), 30, "not past the expiry");
        assert_eq!(secs(1, Some(0)), 1, "at least a second");
        assert_eq!(secs(1, Some(600)), 2);
    }

    #[test]
    fn rotated_files_are_named_by_their_time() {
        let t: jiff::Timestamp = "2026-11-27T04:05:06Z".parse().unwrap_or_default();
        assert_eq!(pem_file_name(t), "kubelet-client-2026-11-27-04-05-06.pem");
    }

    #[test]
    fn jitter_is_in_the_unit_interval() {
        assert_eq!(jitter_from([0; 8]), 0.0);
        let top = jitter_from([0xff; 8]);
        assert!(top < 1.0 && top > 0.999_999, "{top}");
    }
}
