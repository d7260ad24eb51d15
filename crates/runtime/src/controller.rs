//! Workers that drain a work queue through a reconcile function, and the periodic resync.

use std::fmt::Display;
use std::future::Future;
use std::hash::Hash;
use std::sync::Arc;
use std::time::Duration;

use futures::FutureExt as _;

use crate::queue::WorkQueue;

/// What a reconcile asks for after a success.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Next {
    /// Nothing until the next change or resync.
    Done,
    /// Look again after this long (e.g. a deadline in the object).
    After(Duration),
}

/// Runs `workers` tasks taking keys from `queue` and reconciling them: an error (or a panic) is
/// logged and retried with the key's backoff; a success resets the backoff.
pub fn spawn_workers<K, F, Fut, E>(name: &'static str, queue: WorkQueue<K>, workers: usize, reconcile: F)
where
    K: Clone + Eq + Hash + Send + Sync + Display + 'static,
    F: Fn(K) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Result<Next, E>> + Send + 'static,
    E: Display + Send + 'static,
{
    let reconcile = Arc::new(reconcile);
    let metrics = queue.instrument(name);
    for _ in 0..workers.max(1) {
        let queue = queue.clone();
        let reconcile = reconcile.clone();
        let metrics = metrics.clone();
        tokio::spawn(async move {
            while let Some(key) = queue.get().await {
                let started = std::time::Instant::now();
                // A panic in one reconcile is that key's failure, as controller-runtime's
                // RecoverPanic: logged, retried with the key's backoff; the worker and the
                // key's place in the queue survive (a dead worker would leave the key
                // "processing" for ever, never reconciled again).
                let result = match std::panic::AssertUnwindSafe(reconcile(key.clone())).catch_unwind().await {
                    Ok(r) => r.map_err(|e| e.to_string()),
                    Err(panic) => {
                        let msg = panic
                            .downcast_ref::<&str>()
                            .map(|s| (*s).to_string())
                            .or_else(|| panic.downcast_ref::<String>().cloned())
                            .unwrap_or_else(|| "(no message)".into());
                        tracing::error!(controller = name, key = %key, panic = %msg, "reconcile panicked; retrying");
                        Err(format!("panicked: {msg}"))
                    }
                };
                metrics.work_duration.observe(started.elapsed().as_secs_f64());
                match result {
                    Ok(next) => {
                        queue.forget(&key);
                        if let Next::After(d) = next {
                            queue.add_after(key.clone(), d);
                        }
                    }
                    Err(e) => {
                        let n = queue.failures(&key);
                        if n < 3 {
                            tracing::debug!(controller = name, key = %key, error = %e, "reconcile failed; retrying");
                        } else {
                            tracing::warn!(controller = name, key = %key, error = %e, failures = n, "reconcile failed; retrying");
                        }
                        queue.add_rate_limited(key.clone());
                    }
                }
                queue.done(&key);
            }
        });
    }
}

/// Queues every key `keys` returns, every `period` (level-triggered repair of anything a
/// watch event did not cause).
pub fn spawn_resync<K, F>(queue: WorkQueue<K>, period: Duration, keys: F)
where
    K: Clone + Eq + Hash + Send + 'static,
    F: Fn() -> Vec<K> + Send + 'static,
{
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(period);
        tick.tick().await;
        loop {
            tick.tick().await;
            for k in keys() {
                queue.add(k);
            }
        }
    });
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicU32, Ordering};

    #[tokio::test]
    async fn failures_are_retried_until_success() {
        let q: WorkQueue<String> = WorkQueue::new();
        let calls = Arc::new(AtomicU32::new(0));
        let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
        let c = calls.clone();
        spawn_workers("test", q.clone(), 2, move |k: String| {
            let c = c.clone();
            let tx = tx.clone();
            async move {
                if c.fetch_add(1, Ordering::SeqCst) < 2 {
                    Err("not yet")
                } else {
                    tx.send(k).unwrap();
                    Ok(Next::Done)
                }
            }
        });
        q.add("a".to_string());
        assert_eq!(rx.recv().await.unwrap(), "a");
        assert_eq!(calls.load(Ordering::SeqCst), 3);
        assert_eq!(q.failures(&"a".to_string()), 0);
    }

    async fn next(rx: &mut tokio::sync::mpsc::UnboundedReceiver<String>) -> String {
        tokio::time::timeout(Duration::from_secs(60), rx.recv()).await.expect("the worker died with the panic").unwrap()
    }

    /// One worker: a reconcile that panics is retried, and the worker goes on with other keys.
    #[tokio::test]
    async fn a_panicking_reconcile_is_retried_and_the_worker_survives() {
        let q: WorkQueue<String> = WorkQueue::new();
        let calls = Arc::new(AtomicU32::new(0));
        let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
        let c = calls.clone();
        spawn_workers("test", q.clone(), 1, move |k: String| {
            let c = c.clone();
            let tx = tx.clone();
            async move {
                if k == "a" && c.fetch_add(1, Ordering::SeqCst) == 0 {
                    panic!("a bug met once");
                }
                tx.send(k).unwrap();
                Ok::<_, String>(Next::Done)
            }
        });
        // Without the recovery the worker is gone and nothing ever arrives: a guard against
        // hanging for ever, not a timing assertion.
        q.add("a".to_string());
        assert_eq!(next(&mut rx).await, "a", "retried after the panic");
        assert_eq!(calls.load(Ordering::SeqCst), 2);
        q.add("b".to_string());
        assert_eq!(next(&mut rx).await, "b", "the only worker is alive");
    }
}
