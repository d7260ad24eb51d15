//! Leader election for the loops: one replica at a time runs the scheduler and the controllers,
//! decided through a coordination.k8s.io/v1 Lease as upstream's client-go `leaderelection` does
//! (the same fields, timings and rules), so `kubectl get lease -n kube-system` reads the same.
//!
//! - [`decide`] is the whole rule, a pure function of what was last read of the Lease, when,
//!   whether this replica leads (and when it last renewed) and the time now.
//! - [`run`] is the executor: every retry period it reads the Lease, asks [`decide`], and writes
//!   the Lease with the resourceVersion it read (a replace guarded by optimistic concurrency: of
//!   two replicas writing the same version one gets 409 and reads again). It returns an error
//!   when leadership is lost; the caller ends the process (upstream's controller-manager exits
//!   too). At shutdown a leader gives the Lease back (client-go's ReleaseOnCancel: holder empty,
//!   a 1 s duration), so another replica takes over at its next retry instead of waiting for
//!   the lease to expire.
//!
//! Expiry is judged on this replica's clock from the moment it saw the record change (as
//! client-go's observedTime), never by comparing its clock with the renewTime another machine
//! wrote, so clock skew between replicas does not matter.
//!
//! A candidate also watches the Lease between its reads, so it sees each renewal when it is
//! written (not up to a retry period later, as a reader only every retry period does), and
//! it wakes at the moment the record it saw expires ([`next_wake`]) rather than at its next
//! retry: a holder killed with -9 is taken over within the lease duration of its last renewal
//! (13-15 s with the defaults), where polling alone takes 13-19 s.

use std::time::Duration;

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use futures::StreamExt as _;
use kube::api::PostParams;
use kube::runtime::{watcher, WatchStreamExt as _};
use kube::Api;
use tokio::time::Instant;

/// `--leader-elect-*` (upstream's names and defaults).
#[derive(Debug, Clone)]
pub struct Config {
    pub namespace: String,
    pub name: String,
    /// `<hostname>_<uuid>`, unique per process.
    pub identity: String,
    /// How long a candidate waits after the last change of the record before taking over.
    pub lease_duration: Duration,
    /// How long the leader keeps trying to renew before it gives up leading.
    pub renew_deadline: Duration,
    /// How often candidates try to acquire and the leader renews.
    pub retry_period: Duration,
}

impl Config {
    pub fn new(namespace: &str, name: &str, identity: String) -> Config {
        Config {
            namespace: namespace.to_string(),
            name: name.to_string(),
            identity,
            lease_duration: Duration::from_secs(15),
            renew_deadline: Duration::from_secs(10),
            retry_period: Duration::from_secs(2),
        }
    }

    /// Upstream's checks: lease duration > renew deadline > retry period × 1.2 (JitterFactor).
    pub fn validate(&self) -> Result<(), ElectionError> {
        if self.lease_duration <= self.renew_deadline {
            return Err(ElectionError::Config("--leader-elect-lease-duration must be greater than --leader-elect-renew-deadline".into()));
        }
        if self.renew_deadline.as_secs_f64() <= self.retry_period.as_secs_f64() * 1.2 {
            return Err(ElectionError::Config("--leader-elect-renew-deadline must be greater than 1.2 × --leader-elect-retry-period".into()));
        }
        if self.retry_period.is_zero() || self.identity.is_empty() || self.name.is_empty() {
            return Err(ElectionError::Config("leader election needs a retry period, an identity and a lease name".into()));
        }
        Ok(())
    }
}

#[derive(Debug, thiserror::Error)]
pub enum ElectionError {
    #[error("invalid leader election settings: {0}")]
    Config(String),
    #[error("leader election lost: {0}")]
    Lost(LostReason),
}

/// Why a leader stopped leading.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LostReason {
    #[error("the lease was not renewed within the renew deadline")]
    RenewDeadline,
    #[error("the lease is held by {0}")]
    TakenBy(String),
}

/// The parts of a Lease the election reads (client-go's LeaderElectionRecord).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Record {
    pub holder: String,
    pub lease_duration: Duration,
    pub acquire_time: Option<jiff::Timestamp>,
    pub renew_time: Option<jiff::Timestamp>,
    pub transitions: i32,
}

impl Record {
    pub fn of(lease: &Lease) -> Record {
        let spec = lease.spec.clone().unwrap_or_default();
        Record {
            holder: spec.holder_identity.unwrap_or_default(),
            lease_duration: Duration::from_secs(spec.lease_duration_seconds.unwrap_or(0).max(0) as u64),
            acquire_time: spec.acquire_time.map(|t| t.0),
            renew_time: spec.renew_time.map(|t| t.0),
            transitions: spec.lease_transitions.unwrap_or(0),
        }
    }
}

/// What the last read of the Lease gave.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Observation {
    /// The read failed (the API server did not answer).
    Unknown,
    /// There is no Lease.
    Absent,
    /// The record, and when this replica first saw it as it is now.
    Seen { record: Record, since: Instant },
}

/// One step of the election.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Decision {
    /// Create the Lease with this replica as holder.
    Create,
    /// Write this replica as holder over an expired or released record.
    Acquire,
    /// Renew this replica's record.
    Renew,
    /// Someone else holds a valid lease, or the Lease could not be read: try again later.
    Wait,
    /// Stop leading.
    Lost(LostReason),
}

/// The rule. `leading`: when this replica last wrote its record successfully, if it leads.
pub fn decide(identity: &str, observed: &Observation, leading: Option<Instant>, renew_deadline: Duration, now: Instant) -> Decision {
    if let Some(renewed) = leading {
        if now.saturating_duration_since(renewed) >= renew_deadline {
            return Decision::Lost(LostReason::RenewDeadline);
        }
        return match observed {
            Observation::Unknown => Decision::Wait,
            Observation::Absent => Decision::Create,
            Observation::Seen { record, .. } if record.holder == identity => Decision::Renew,
            // a leader that finds another holder lost the lease (it must have expired here)
            Observation::Seen { record, .. } => Decision::Lost(LostReason::TakenBy(record.holder.clone())),
        };
    }
    match observed {
        Observation::Unknown => Decision::Wait,
        Observation::Absent => Decision::Create,
        Observation::Seen { record, .. } if record.holder.is_empty() || record.holder == identity => Decision::Acquire,
        Observation::Seen { record, since } => {
            if now.saturating_duration_since(*since) >= record.lease_duration {
                Decision::Acquire
            } else {
                Decision::Wait
            }
        }
    }
}

/// When the executor next reads the Lease, given the round's read at `read_at`: after the
/// retry period; sooner, at the moment the record another replica holds expires by this
/// replica's clock; at once when a watch brought a released record after that read. A
/// leader waits the retry period.
pub fn next_wake(identity: &str, observed: &Observation, leading: bool, retry_period: Duration, read_at: Instant) -> Instant {
    let retry = read_at + retry_period;
    match observed {
        Observation::Seen { record, since } if !leading && record.holder.is_empty() && *since > read_at => *since,
        Observation::Seen { record, since } if !leading && !record.holder.is_empty() && record.holder != identity => {
            retry.min(*since + record.lease_duration)
        }
        _ => retry,
    }
}

/// Folds a fresh read into the observation: `since` moves only when the record changed.
pub fn observe(previous: &Observation, read: Option<Record>, now: Instant) -> Observation {
    match read {
        None => Observation::Absent,
        Some(record) => match previous {
            Observation::Seen { record: old, since } if *old == record => Observation::Seen { record, since: *since },
            _ => Observation::Seen { record, since: now },
        },
    }
}

/// The record this replica writes for a decision (`old`: the record it read, if any).
pub fn next_record(identity: &str, lease_duration: Duration, old: Option<&Record>, leading: bool, now: jiff::Timestamp) -> Record {
    let mut r = Record {
        holder: identity.to_string(),
        lease_duration,
        acquire_time: Some(now),
        renew_time: Some(now),
        transitions: 0,
    };
    if let Some(old) = old {
        if leading && old.holder == identity {
            r.acquire_time = old.acquire_time;
            r.transitions = old.transitions;
        } else {
            r.transitions = old.transitions + 1;
        }
    }
    r
}

/// The record a leader writes to give the Lease back (client-go's release).
pub fn released_record(old: &Record, now: jiff::Timestamp) -> Record {
    Record {
        holder: String::new(),
        lease_duration: Duration::from_secs(1),
        acquire_time: Some(now),
        renew_time: Some(now),
        transitions: old.transitions,
    }
}

fn spec_of(r: &Record) -> LeaseSpec {
    LeaseSpec {
        holder_identity: Some(r.holder.clone()),
        lease_duration_seconds: Some(r.lease_duration.as_secs().try_into().unwrap_or(i32::MAX)),
        acquire_time: r.acquire_time.map(MicroTime),
        renew_time: r.renew_time.map(MicroTime),
        lease_transitions: Some(r.transitions),
        ..Default::default()
    }
}

/// Runs the election until leadership is lost (an error) or `shutdown` resolves (Ok, after
/// giving the Lease back if held). `start` runs once, when this replica first leads; what it
/// returns is kept alive until then.
pub async fn run<T>(
    client: kube::Client,
    cfg: &Config,
    start: impl FnOnce() -> T,
    shutdown: impl std::future::Future<Output = ()>,
) -> Result<(), ElectionError> {
    tokio::pin!(shutdown);
    let api: Api<Lease> = Api::namespaced(client, &cfg.namespace);
    let mut changes = watcher::watcher(api.clone(), watcher::Config::default().fields(&format!("metadata.name={}", cfg.name)))
        .default_backoff()
        .boxed();
    let mut observed = Observation::Unknown;
    let mut lease: Option<Lease> = None;
    let mut leading: Option<Instant> = None;
    let mut start = Some(start);
    let mut _running: Option<T> = None;
    let mut waiting_on: Option<String> = None;
    tracing::info!(lease = %format!("{}/{}", cfg.namespace, cfg.name), identity = %cfg.identity, "attempting to acquire the leader lease");
    loop {
        let now = Instant::now();
        let read_ok = match tokio::time::timeout(cfg.renew_deadline, api.get_opt(&cfg.name)).await {
            Ok(Ok(got)) => {
                observed = observe(&observed, got.as_ref().map(Record::of), now);
                lease = got;
                true
            }
            Ok(Err(e)) => {
                tracing::warn!(error = %e, "reading the leader lease failed");
                false
            }
            Err(_) => {
                tracing::warn!("reading the leader lease timed out");
                false
            }
        };
        // a failed read leaves nothing to write against
        let decision = decide(
            &cfg.identity,
            if read_ok { &observed } else { &Observation::Unknown },
            leading,
            cfg.renew_deadline,
            now,
        );
        let write = match &decision {
            Decision::Lost(reason) => {
                tracing::error!(reason = %reason, "leaderelection lost");
                return Err(ElectionError::Lost(reason.clone()));
            }
            Decision::Wait => {
                if let Observation::Seen { record, .. } = &observed {
                    if read_ok && waiting_on.as_deref() != Some(record.holder.as_str()) {
                        tracing::info!(holder = %record.holder, identity = %cfg.identity, "the leader lease is held by another replica; waiting for it to expire");
                        waiting_on = Some(record.holder.clone());
                    }
                }
                None
            }
            Decision::Create | Decision::Acquire | Decision::Renew => {
                let old = lease.as_ref().map(Record::of);
                let record = next_record(&cfg.identity, cfg.lease_duration, old.as_ref(), leading.is_some(), jiff::Timestamp::now());
                let mut new = lease.clone().unwrap_or_else(|| Lease {
                    metadata: ObjectMeta { name: Some(cfg.name.clone()), namespace: Some(cfg.namespace.clone()), ..Default::default() },
                    spec: None,
                });
                new.spec = Some(spec_of(&record));
                Some((decision.clone(), new))
            }
        };
        if let Some((decision, new)) = write {
            let pp = PostParams::default();
            let result = match decision {
                Decision::Create => tokio::time::timeout(cfg.renew_deadline, api.create(&pp, &new)).await,
                _ => tokio::time::timeout(cfg.renew_deadline, api.replace(&cfg.name, &pp, &new)).await,
            };
            match result {
                Ok(Ok(written)) => {
                    observed = observe(&observed, Some(Record::of(&written)), now);
                    lease = Some(written);
                    if leading.is_none() {
                        tracing::info!(lease = %format!("{}/{}", cfg.namespace, cfg.name), identity = %cfg.identity, "successfully acquired the leader lease");
                    }
                    leading = Some(now);
                    if let Some(start) = start.take() {
                        _running = Some(start());
                        // a leader never becomes a candidate again (it exits): no more watching
                        changes = futures::stream::pending().boxed();
                    }
                }
                // another replica wrote first (409): read again next round
                Ok(Err(kube::Error::Api(status))) if status.code == 409 => {
                    tracing::debug!(decision = ?decision, "the leader lease changed under this write");
                }
                Ok(Err(e)) => tracing::warn!(decision = ?decision, error = %e, "writing the leader lease failed"),
                Err(_) => tracing::warn!(decision = ?decision, "writing the leader lease timed out"),
            }
        }
        // until the next read: the Lease's changes as they are written (candidates only)
        let wake = loop {
            let wake = next_wake(&cfg.identity, &observed, leading.is_some(), cfg.retry_period, now);
            tokio::select! {
                _ = tokio::time::sleep_until(wake) => break wake,
                changed = changes.next(), if leading.is_none() => match changed {
                    Some(Ok(ev)) => {
                        if let Some(l) = applied(ev, &cfg.name) {
                            observed = observe(&observed, Some(Record::of(&l)), Instant::now());
                            lease = Some(l);
                        }
                    }
                    // the watcher retries with its backoff; reads every retry period go on
                    Some(Err(e)) => tracing::debug!(error = %e, "watching the leader lease"),
                    None => break wake,
                },
                _ = &mut shutdown => {
                    if let (Some(_), Some(held)) = (leading, lease.take()) {
                        release(&api, cfg, held).await;
                    }
                    return Ok(());
                }
            }
        };
        tracing::trace!(late_ms = wake.elapsed().as_millis() as u64, "leader election round");
    }
}

/// The Lease a watch event carries, if it is the election's (a deletion carries nothing: the
/// next read finds the Lease absent).
fn applied(ev: watcher::Event<Lease>, name: &str) -> Option<Lease> {
    match ev {
        watcher::Event::Apply(l) | watcher::Event::InitApply(l) if l.metadata.name.as_deref() == Some(name) => Some(l),
        _ => None,
    }
}

/// Gives the Lease back, if this replica still holds it at the version it last wrote.
async fn release(api: &Api<Lease>, cfg: &Config, mut held: Lease) {
    let old = Record::of(&held);
    if old.holder != cfg.identity {
        return;
    }
    held.spec = Some(spec_of(&released_record(&old, jiff::Timestamp::now())));
    match tokio::time::timeout(cfg.renew_deadline, api.replace(&cfg.name, &PostParams::default(), &held)).await {
        Ok(Ok(_)) => tracing::info!(identity = %cfg.identity, "released the leader lease"),
        Ok(Err(e)) => tracing::warn!(error = %e, "releasing the leader lease failed; the others take over when it expires"),
        Err(_) => tracing::warn!("releasing the leader lease timed out; the others take over when it expires"),
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    const DEADLINE: Duration = Duration::from_secs(10);

    fn held_by(holder: &str, since: Instant) -> Observation {
        Observation::Seen {
            record: Record { holder: holder.into(), lease_duration: Duration::from_secs(15), ..Default::default() },
            since,
        }
    }

    #[test]
    fn a_candidate_creates_a_missing_lease_and_waits_on_a_valid_one() {
        let t0 = Instant::now();
        assert_eq!(decide("me", &Observation::Absent, None, DEADLINE, t0), Decision::Create);
        assert_eq!(decide("me", &Observation::Unknown, None, DEADLINE, t0), Decision::Wait);
        let other = held_by("other", t0);
        assert_eq!(decide("me", &other, None, DEADLINE, t0 + Duration::from_secs(14)), Decision::Wait);
        assert_eq!(decide("me", &other, None, DEADLINE, t0 + Duration::from_secs(15)), Decision::Acquire);
        // released (empty holder): at once
        assert_eq!(decide("me", &held_by("", t0), None, DEADLINE, t0), Decision::Acquire);
    }

    #[test]
    fn expiry_counts_from_when_this_replica_saw_the_record_change_not_from_renew_time() {
        let t0 = Instant::now();
        let mut rec = Record { holder: "other".into(), lease_duration: Duration::from_secs(15), ..Default::default() };
        // a renewTime far in the past by this machine's clock (skew) does not make it expired
        rec.renew_time = Some(jiff::Timestamp::UNIX_EPOCH);
        let first = observe(&Observation::Unknown, Some(rec.clone()), t0);
        assert_eq!(decide("me", &first, None, DEADLINE, t0 + Duration::from_secs(1)), Decision::Wait);
        // the same record read again later keeps its first sighting
        let again = observe(&first, Some(rec.clone()), t0 + Duration::from_secs(10));
        assert_eq!(again, first);
        assert_eq!(decide("me", &again, None, DEADLINE, t0 + Duration::from_secs(15)), Decision::Acquire);
        // a renewal (any change) restarts the count
        rec.renew_time = Some(jiff::Timestamp::UNIX_EPOCH + jiff::SignedDuration::from_secs(2));
        let renewed = observe(&again, Some(rec), t0 + Duration::from_secs(12));
        assert_eq!(decide("me", &renewed, None, DEADLINE, t0 + Duration::from_secs(15)), Decision::Wait);
        assert_eq!(decide("me", &renewed, None, DEADLINE, t0 + Duration::from_secs(27)), Decision::Acquire);
    }

    #[test]
    fn a_leader_renews_until_the_deadline_or_until_someone_else_holds_it() {
        let t0 = Instant::now();
        let mine = held_by("me", t0);
        assert_eq!(decide("me", &mine, Some(t0), DEADLINE, t0 + Duration::from_secs(2)), Decision::Renew);
        // reads failing: keep trying until the renew deadline, then stop leading
        assert_eq!(decide("me", &Observation::Unknown, Some(t0), DEADLINE, t0 + Duration::from_secs(9)), Decision::Wait);
        assert_eq!(
            decide("me", &Observation::Unknown, Some(t0), DEADLINE, t0 + DEADLINE),
            Decision::Lost(LostReason::RenewDeadline)
        );
        assert_eq!(
            decide("me", &held_by("other", t0), Some(t0), DEADLINE, t0 + Duration::from_secs(1)),
            Decision::Lost(LostReason::TakenBy("other".into()))
        );
        assert_eq!(decide("me", &Observation::Absent, Some(t0), DEADLINE, t0), Decision::Create);
    }

    #[test]
    fn records_keep_acquire_time_on_renewal_and_count_transitions_on_takeover() {
        let t = |s: i64| jiff::Timestamp::from_second(s).unwrap();
        let d = Duration::from_secs(15);
        let created = next_record("me", d, None, false, t(100));
        assert_eq!((created.transitions, created.acquire_time, created.renew_time), (0, Some(t(100)), Some(t(100))));
        let renewed = next_record("me", d, Some(&created), true, t(102));
        assert_eq!((renewed.transitions, renewed.acquire_time, renewed.renew_time), (0, Some(t(100)), Some(t(102))));
        let taken = next_record("b", d, Some(&renewed), false, t(130));
        assert_eq!((taken.holder.as_str(), taken.transitions, taken.acquire_time), ("b", 1, Some(t(130))));
        let spec = spec_of(&taken);
        assert_eq!(spec.lease_duration_seconds, Some(15));
        assert_eq!(Record::of(&Lease { metadata: Default::default(), spec: Some(spec) }), taken);
    }

    #[test]
    fn a_released_record_has_no_holder_and_keeps_the_transitions() {
        let t = jiff::Timestamp::from_second(200).unwrap();
        let held = Record { holder: "me".into(), lease_duration: Duration::from_secs(15), transitions: 3, ..Default::default() };
        let r = released_record(&held, t);
        assert_eq!((r.holder.as_str(), r.lease_duration, r.transitions), ("", Duration::from_secs(1), 3));
        // a candidate takes a released lease at once, and counts a transition
        let obs = observe(&Observation::Unknown, Some(r.clone()), Instant::now());
        assert_eq!(decide("other", &obs, None, DEADLINE, Instant::now()), Decision::Acquire);
        assert_eq!(next_record("other", Duration::from_secs(15), Some(&r), false, t).transitions, 4);
    }

    #[test]
    fn settings_follow_upstreams_checks() {
        let mut c = Config::new("kube-system", "ferro-control-plane", "h_1".into());
        assert!(c.validate().is_ok());
        c.renew_deadline = Duration::from_secs(15);
        assert!(c.validate().is_err());
        c.renew_deadline = Duration::from_secs(2);
        assert!(c.validate().is_err());
    }

    /// A candidate retrying every 2 s against a holder that stopped renewing takes over at the
    /// first retry at least a lease duration after it first saw the record.
    #[test]
    fn a_candidate_takes_over_at_the_first_retry_after_the_lease_duration() {
        let t0 = Instant::now();
        let rec = Record { holder: "a".into(), lease_duration: Duration::from_secs(15), ..Default::default() };
        let mut obs = observe(&Observation::Unknown, Some(rec.clone()), t0);
        let mut steps = Vec::new();
        for k in 1..=9 {
            let now = t0 + Duration::from_secs(2 * k);
            obs = observe(&obs, Some(rec.clone()), now);
            steps.push(decide("b", &obs, None, DEADLINE, now));
        }
        let first_acquire = steps.iter().position(|d| *d == Decision::Acquire).unwrap();
        assert_eq!(first_acquire, 7, "at 16 s, the first retry after 15 s: {steps:?}");
    }

    /// Woken by [`next_wake`], a candidate reads at the record's expiry, not at its next retry.
    #[test]
    fn a_candidate_wakes_when_the_record_it_saw_expires() {
        let s = Duration::from_secs;
        let t0 = Instant::now();
        let retry = s(2);
        let rec = Record { holder: "a".into(), lease_duration: s(15), ..Default::default() };
        // the holder's last renewal, seen by the watch at t0 + 1 s; the candidate's rounds go
        // on every 2 s until the expiry is closer than that
        let obs = observe(&Observation::Unknown, Some(rec.clone()), t0 + s(1));
        assert_eq!(next_wake("b", &obs, false, retry, t0 + s(2)), t0 + s(4));
        assert_eq!(next_wake("b", &obs, false, retry, t0 + s(14)), t0 + s(16));
        let wake = next_wake("b", &obs, false, retry, t0 + s(15));
        assert_eq!(wake, t0 + s(16), "at the expiry, not at 17 s");
        assert_eq!(decide("b", &obs, None, DEADLINE, wake), Decision::Acquire);
        // the holder itself, a leader, and a record with no holder seen by the round's read
        // wait the retry period
        assert_eq!(next_wake("a", &obs, false, retry, t0 + s(15)), t0 + s(17));
        assert_eq!(next_wake("b", &obs, true, retry, t0 + s(15)), t0 + s(17));
        let released = Record { holder: String::new(), lease_duration: s(1), ..Default::default() };
        let read = observe(&obs, Some(released.clone()), t0 + s(3));
        assert_eq!(next_wake("b", &read, false, retry, t0 + s(3)), t0 + s(5));
        // a release the watch brings after the read: at once
        let watched = observe(&obs, Some(released), t0 + s(3) + Duration::from_millis(300));
        assert_eq!(next_wake("b", &watched, false, retry, t0 + s(3)), t0 + s(3) + Duration::from_millis(300));
        // a renewal seen by the watch moves the expiry
        let renewed = Record { renew_time: Some(jiff::Timestamp::from_second(5).unwrap()), ..rec };
        let moved = observe(&obs, Some(renewed), t0 + s(9));
        assert_eq!(next_wake("b", &moved, false, retry, t0 + s(22)), t0 + s(24));
        assert_eq!(next_wake("b", &moved, false, retry, t0 + s(23)), t0 + s(24));
        assert_eq!(decide("b", &moved, None, DEADLINE, t0 + s(23)), Decision::Wait);
        assert_eq!(decide("b", &moved, None, DEADLINE, t0 + s(24)), Decision::Acquire);
    }
}
