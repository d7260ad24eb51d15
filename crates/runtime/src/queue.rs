//! A work queue with upstream client-go semantics: a key is queued at most once, a key being
//! processed is not handed to a second worker (an add while processing is remembered and
//! queued again when the worker is done), failures are retried with per-key exponential backoff.

use std::collections::{HashMap, HashSet, VecDeque};
use std::hash::Hash;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use tokio::sync::Notify;

use crate::metrics::QueueMetrics;

/// Per-key backoff for `add_rate_limited`: base * 2^failures, capped (client-go's defaults are
/// 5 ms and 1000 s; ferro caps at 5 minutes so a repaired problem is noticed sooner).
const BASE_DELAY: Duration = Duration::from_millis(5);
const MAX_DELAY: Duration = Duration::from_secs(300);

struct State<K> {
    queue: VecDeque<K>,
    queued: HashSet<K>,
    processing: HashSet<K>,
    dirty: HashSet<K>,
    failures: HashMap<K, u32>,
    shut_down: bool,
    /// Set once the queue is named ([`WorkQueue::instrument`]).
    metrics: Option<Arc<QueueMetrics>>,
    /// When each queued key was added (for workqueue_queue_duration_seconds).
    added: HashMap<K, Instant>,
}

impl<K: Clone + Eq + Hash> State<K> {
    fn enqueue(&mut self, key: K) {
        if let Some(m) = &self.metrics {
            m.adds.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            self.added.insert(key.clone(), Instant::now());
        }
        self.queued.insert(key.clone());
        self.queue.push_back(key);
    }
}

/// A deduplicating work queue; cheap to clone (shared).
pub struct WorkQueue<K> {
    state: Arc<Mutex<State<K>>>,
    notify: Arc<Notify>,
}

impl<K> Clone for WorkQueue<K> {
    fn clone(&self) -> Self {
        WorkQueue { state: self.state.clone(), notify: self.notify.clone() }
    }
}

impl<K: Clone + Eq + Hash + Send + 'static> Default for WorkQueue<K> {
    fn default() -> Self {
        Self::new()
    }
}

impl<K: Clone + Eq + Hash + Send + 'static> WorkQueue<K> {
    pub fn new() -> Self {
        WorkQueue {
            state: Arc::new(Mutex::new(State {
                queue: VecDeque::new(),
                queued: HashSet::new(),
                processing: HashSet::new(),
                dirty: HashSet::new(),
                failures: HashMap::new(),
                shut_down: false,
                metrics: None,
                added: HashMap::new(),
            })),
            notify: Arc::new(Notify::new()),
        }
    }

    fn lock(&self) -> MutexGuard<'_, State<K>> {
        // A poisoned queue lock means a worker panicked while holding it; the state itself is
        // still consistent (every mutation is a single step), so go on.
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Queues a key unless it is already queued; a key being processed is queued again when
    /// its worker calls `done`.
    pub fn add(&self, key: K) {
        let mut s = self.lock();
        if s.shut_down || s.queued.contains(&key) {
            return;
        }
        if s.processing.contains(&key) {
            s.dirty.insert(key);
            return;
        }
        s.enqueue(key);
        drop(s);
        self.notify.notify_one();
    }

    /// Names the queue for its metrics (client-go's `workqueue_*{name=...}`).
    pub fn instrument(&self, name: &'static str) -> Arc<QueueMetrics> {
        let m = crate::metrics::queue(name);
        let q = self.clone();
        m.set_depth(move || q.len());
        self.lock().metrics = Some(m.clone());
        m
    }

    /// Queues a key after a delay.
    pub fn add_after(&self, key: K, delay: Duration) {
        if delay.is_zero() {
            self.add(key);
            return;
        }
        let q = self.clone();
        tokio::spawn(async move {
            tokio::time::sleep(delay).await;
            q.add(key);
        });
    }

    /// Queues a key after its backoff, which doubles with every call until `forget`.
    pub fn add_rate_limited(&self, key: K) {
        let delay = {
            let mut s = self.lock();
            if let Some(m) = &s.metrics {
                m.retries.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            }
            let n = s.failures.entry(key.clone()).or_insert(0);
            let d = backoff(*n);
            *n = n.saturating_add(1);
            d
        };
        self.add_after(key, delay);
    }

    /// How many times the key failed since the last `forget`.
    pub fn failures(&self, key: &K) -> u32 {
        self.lock().failures.get(key).copied().unwrap_or(0)
    }

    /// Resets the key's backoff (after a successful reconcile).
    pub fn forget(&self, key: &K) {
        self.lock().failures.remove(key);
    }

    /// Waits for the next key; `None` once the queue is shut down. The caller must call
    /// `done` with the key when it has finished with it.
    pub async fn get(&self) -> Option<K> {
        loop {
            let notified = self.notify.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            {
                let mut s = self.lock();
                if let Some(key) = s.queue.pop_front() {
                    s.queued.remove(&key);
                    if let Some(t) = s.added.remove(&key) {
                        if let Some(m) = &s.metrics {
                            m.queue_duration.observe(t.elapsed().as_secs_f64());
                        }
                    }
                    s.processing.insert(key.clone());
                    let more = !s.queue.is_empty();
                    drop(s);
                    if more {
                        self.notify.notify_one();
                    }
                    return Some(key);
                }
                if s.shut_down {
                    return None;
                }
            }
            notified.await;
        }
    }

    /// Marks the key as processed; queues it again if it was added meanwhile.
    pub fn done(&self, key: &K) {
        let mut s = self.lock();
        s.processing.remove(key);
        if s.dirty.remove(key) && !s.queued.contains(key) && !s.shut_down {
            s.enqueue(key.clone());
            drop(s);
            self.notify.notify_one();
        }
    }

    /// Stops handing out keys; waiting `get`s return `None`.
    pub fn shut_down(&self) {
        self.lock().shut_down = true;
        self.notify.notify_waiters();
    }

    /// Keys waiting (not counting those being processed).
    pub fn len(&self) -> usize {
        self.lock().queue.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

fn backoff(failures: u32) -> Duration {
    let factor = 1u64.checked_shl(failures.min(40)).unwrap_or(u64::MAX);
    let ms = (BASE_DELAY.as_millis() as u64).saturating_mul(factor);
    Duration::from_millis(ms).min(MAX_DELAY)
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn deduplicates_queued_keys() {
        let q = WorkQueue::new();
        q.add("a");
        q.add("b");
        q.add("a");
        assert_eq!(q.len(), 2);
        assert_eq!(q.get().await, Some("a"));
        assert_eq!(q.get().await, Some("b"));
        assert!(q.is_empty());
    }

    #[tokio::test]
    async fn a_key_in_progress_is_requeued_once_when_done() {
        let q = WorkQueue::new();
        q.add("a");
        let k = q.get().await.unwrap();
        q.add("a");
        q.add("a");
        // not handed out again while in progress
        assert!(q.is_empty());
        q.done(&k);
        assert_eq!(q.len(), 1);
        assert_eq!(q.get().await, Some("a"));
        q.done(&"a");
        assert!(q.is_empty());
    }

    #[tokio::test]
    async fn shut_down_wakes_waiting_workers() {
        let q: WorkQueue<u32> = WorkQueue::new();
        let q2 = q.clone();
        let waiter = tokio::spawn(async move { q2.get().await });
        tokio::task::yield_now().await;
        q.shut_down();
        assert_eq!(waiter.await.unwrap(), None);
    }

    #[tokio::test]
    async fn waiting_worker_gets_a_key_added_later() {
        let q: WorkQueue<u32> = WorkQueue::new();
        let q2 = q.clone();
        let waiter = tokio::spawn(async move { q2.get().await });
        tokio::task::yield_now().await;
        q.add(7);
        assert_eq!(waiter.await.unwrap(), Some(7));
    }

    #[tokio::test]
    async fn rate_limited_adds_back_off_exponentially_until_forgotten() {
        let q: WorkQueue<&str> = WorkQueue::new();
        q.add_rate_limited("a");
        q.add_rate_limited("a");
        assert_eq!(q.failures(&"a"), 2);
        assert_eq!(q.get().await, Some("a"));
        q.done(&"a");
        q.forget(&"a");
        assert_eq!(q.failures(&"a"), 0);
    }

    #[test]
    fn backoff_doubles_and_is_capped() {
        assert_eq!(backoff(0), Duration::from_millis(5));
        assert_eq!(backoff(1), Duration::from_millis(10));
        assert_eq!(backoff(4), Duration::from_millis(80));
        assert_eq!(backoff(30), MAX_DELAY);
        assert_eq!(backoff(u32::MAX), MAX_DELAY);
    }
}
