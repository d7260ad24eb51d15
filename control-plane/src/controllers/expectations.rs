//! Expectations (upstream's ControllerExpectations): after a controller creates or deletes
//! pods, it does not act on the same owner again until its informer has seen those changes
//! (or a timeout passed), so a lagging cache never makes it create or delete twice.

use std::collections::{HashMap, HashSet};
use std::hash::Hash;
use std::sync::Mutex;
use std::time::{Duration, Instant};

const TIMEOUT: Duration = Duration::from_secs(300);

struct Pending {
    adds: i64,
    deletes: HashSet<String>,
    since: Instant,
}

pub struct Expectations<K> {
    inner: Mutex<HashMap<K, Pending>>,
}

impl<K: Eq + Hash + Clone> Default for Expectations<K> {
    fn default() -> Self {
        Expectations { inner: Mutex::new(HashMap::new()) }
    }
}

impl<K: Eq + Hash + Clone> Expectations<K> {
    /// What a change of an object the owner `key` creates and deletes (a pod) shows its
    /// expectations: a creation seen, a deletion started or done.
    pub fn observe<T: kube::ResourceExt>(&self, key: &K, change: &ferro_runtime::Change<T>) {
        match change {
            ferro_runtime::Change::Applied { old, new } => {
                if old.is_none() {
                    self.observed_add(key);
                }
                if new.meta().deletion_timestamp.is_some() {
                    self.observed_delete(key, &new.name_any());
                }
            }
            ferro_runtime::Change::Deleted(obj) => self.observed_delete(key, &obj.name_any()),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<K, Pending>> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Whether the owner may be reconciled: nothing pending, or pending for too long.
    pub fn satisfied(&self, key: &K) -> bool {
        match self.lock().get(key) {
            None => true,
            Some(p) => (p.adds <= 0 && p.deletes.is_empty()) || p.since.elapsed() > TIMEOUT,
        }
    }

    /// What holds the owner back, for explanations: `None` when [`Self::satisfied`].
    pub fn pending(&self, key: &K) -> Option<String> {
        if self.satisfied(key) {
            return None;
        }
        let m = self.lock();
        let p = m.get(key)?;
        let mut what = Vec::new();
        if p.adds > 0 {
            what.push(format!("{} pod creation(s)", p.adds));
        }
        if !p.deletes.is_empty() {
            let mut names: Vec<&str> = p.deletes.iter().map(String::as_str).collect();
            names.sort_unstable();
            what.push(format!("the deletion of {}", names.join(", ")));
        }
        Some(format!(
            "waits for its informer to show {} it made {} ago (expectations; given up after {})",
            what.join(" and "),
            super::explain::go_duration(p.since.elapsed()),
            super::explain::go_duration(TIMEOUT)
        ))
    }

    /// Records creations and deletions (pod names) about to be issued.
    pub fn expect(&self, key: &K, adds: usize, deletes: impl IntoIterator<Item = String>) {
        let mut m = self.lock();
        let p = m.entry(key.clone()).or_insert_with(|| Pending { adds: 0, deletes: HashSet::new(), since: Instant::now() });
        p.adds += adds as i64;
        p.deletes.extend(deletes);
        p.since = Instant::now();
    }

    /// The informer saw a pod created for the owner (or a create failed).
    pub fn observed_add(&self, key: &K) {
        if let Some(p) = self.lock().get_mut(key) {
            p.adds -= 1;
        }
    }

    /// The informer saw the pod deleted or terminating (or the delete failed).
    pub fn observed_delete(&self, key: &K, name: &str) {
        if let Some(p) = self.lock().get_mut(key) {
            p.deletes.remove(name);
        }
    }

    pub fn forget(&self, key: &K) {
        self.lock().remove(key);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn satisfied_once_everything_was_observed() {
        let e: Expectations<&str> = Expectations::default();
        assert!(e.satisfied(&"rs"));
        e.expect(&"rs", 2, ["p1".to_string()]);
        assert!(!e.satisfied(&"rs"));
        e.observed_add(&"rs");
        e.observed_add(&"rs");
        assert!(!e.satisfied(&"rs"));
        e.observed_delete(&"rs", "p1");
        assert!(e.satisfied(&"rs"));
        e.expect(&"rs", 1, []);
        e.forget(&"rs");
        assert!(e.satisfied(&"rs"));
    }
}
