//! /healthz and /livez as upstream's ProxierHealthServer: healthy unless an update has been
//! waiting while the last sync is older than the health timeout (2 × syncPeriod), per IP
//! family; before the first sync every family counts as "waiting". /healthz is also 503 while
//! this node is being deleted or carries the cluster autoscaler's ToBeDeleted taint (so load
//! balancers drain it); /livez ignores the node.

use std::collections::BTreeMap;
use std::sync::Mutex;
use std::time::{Duration, SystemTime};

use crate::model::Family;

#[derive(Debug, Default)]
struct State {
    last_updated: BTreeMap<Family, SystemTime>,
    oldest_pending: BTreeMap<Family, SystemTime>,
    node_eligible: bool,
}

/// The health of the proxy's syncs, shared by the sync loop and the HTTP server.
#[derive(Debug)]
pub struct Health {
    timeout: Duration,
    families: Vec<Family>,
    state: Mutex<State>,
}

/// One answer: the status code and upstream's JSON body.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Answer {
    pub healthy: bool,
    pub body: String,
}

fn rfc3339(t: SystemTime) -> String {
    match jiff::Timestamp::try_from(t) {
        Ok(ts) => ts.to_string(),
        Err(_) => "0001-01-01T00:00:00Z".into(),
    }
}

impl Health {
    pub fn new(sync_period: Duration, families: Vec<Family>) -> Health {
        Health {
            timeout: sync_period * 2,
            families,
            state: Mutex::new(State { node_eligible: true, ..State::default() }),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// A change is waiting for the next sync (keeps the oldest time).
    pub fn queued(&self, now: SystemTime) {
        let mut s = self.lock();
        for f in &self.families {
            s.oldest_pending.entry(*f).or_insert(now);
        }
    }

    /// A family's rules reached the kernel.
    pub fn updated(&self, family: Family, now: SystemTime) {
        let mut s = self.lock();
        s.last_updated.insert(family, now);
        s.oldest_pending.remove(&family);
    }

    /// Whether /healthz may say 200 for this node (not being deleted, not tainted for deletion).
    pub fn set_node_eligible(&self, eligible: bool) {
        self.lock().node_eligible = eligible;
    }

    fn sync_healthy(&self, s: &State, now: SystemTime) -> bool {
        self.families.iter().all(|f| match s.oldest_pending.get(f) {
            None => true,
            Some(_) => s
                .last_updated
                .get(f)
                .is_some_and(|last| now.duration_since(*last).unwrap_or_default() <= self.timeout),
        })
    }

    /// The /healthz (`livez` false) or /livez answer at `now`.
    pub fn answer(&self, livez: bool, now: SystemTime) -> Answer {
        let s = self.lock();
        let synced = self.sync_healthy(&s, now);
        let last = s.last_updated.values().max().copied();
        let healthy = synced && (livez || s.node_eligible);
        let last = last.map(rfc3339).unwrap_or_else(|| "0001-01-01T00:00:00Z".into());
        let body = if livez {
            serde_json::json!({"lastUpdated": last, "currentTime": rfc3339(now)})
        } else {
            serde_json::json!({"lastUpdated": last, "currentTime": rfc3339(now), "nodeEligible": s.node_eligible})
        };
        Answer { healthy, body: body.to_string() }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn t(secs: u64) -> SystemTime {
        SystemTime::UNIX_EPOCH + Duration::from_secs(1_700_000_000 + secs)
    }

    #[test]
    fn unhealthy_until_first_sync_and_when_a_pending_update_is_overdue() {
        let h = Health::new(Duration::from_secs(30), vec![Family::V4, Family::V6]);
        h.queued(t(0));
        assert!(!h.answer(false, t(1)).healthy, "no sync yet");
        h.updated(Family::V4, t(1));
        assert!(!h.answer(false, t(2)).healthy, "v6 not synced yet");
        h.updated(Family::V6, t(2));
        assert!(h.answer(false, t(3)).healthy);
        // nothing pending: healthy however old the last sync
        assert!(h.answer(false, t(1000)).healthy);
        // pending, last sync 1000 s ago (> 60 s): unhealthy
        h.queued(t(1000));
        assert!(!h.answer(false, t(1001)).healthy);
        assert!(!h.answer(true, t(1001)).healthy);
        h.updated(Family::V4, t(1002));
        h.updated(Family::V6, t(1002));
        assert!(h.answer(false, t(1003)).healthy);
        // pending but the last sync is recent
        h.queued(t(1010));
        assert!(h.answer(false, t(1030)).healthy);
        assert!(!h.answer(false, t(1063)).healthy);
    }

    #[test]
    fn node_eligibility_affects_healthz_only() {
        let h = Health::new(Duration::from_secs(30), vec![Family::V4]);
        h.updated(Family::V4, t(0));
        h.set_node_eligible(false);
        let a = h.answer(false, t(1));
        assert!(!a.healthy);
        let body: serde_json::Value = serde_json::from_str(&a.body).unwrap();
        assert_eq!(body["nodeEligible"], false);
        assert_eq!(body["lastUpdated"], "2023-11-14T22:13:20Z");
        assert!(h.answer(true, t(1)).healthy);
        assert!(serde_json::from_str::<serde_json::Value>(&h.answer(true, t(1)).body).unwrap().get("nodeEligible").is_none());
    }
}
