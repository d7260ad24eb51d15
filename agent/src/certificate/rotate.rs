//! The rotation loop: reads the certificate in use, waits until its rotation deadline, asks for
//! a new one (retrying with backoff), and falls back to the bootstrap join once it has expired.
//! The decisions are [`super::plan`]'s; the side effects go through [`Rotation`], real in
//! [`ApiRotation`] and recorded in the tests.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use super::client::Reloadable;
use super::plan::{self, Step, Validity};
use super::store;
use crate::bootstrap::{self, BootstrapError};
use crate::clock::Clock;

#[derive(Debug, thiserror::Error)]
pub enum RotationError {
    #[error(transparent)]
    Request(#[from] BootstrapError),
    #[error("certificate request {name} was not answered within {after:?}")]
    Unanswered { name: String, after: Duration },
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("node kubeconfig {path}: {why}")]
    Kubeconfig { path: PathBuf, why: String },
    #[error("rebuilding the API client: {0}")]
    Client(#[source] ferro_runtime::apiclient::ClientError),
    #[error("the client certificate expired while its renewal was under way")]
    Expired,
}

/// What the loop does to the world.
#[async_trait::async_trait]
pub trait Rotation: Send + Sync {
    /// The validity of the client certificate the node's kubeconfig uses now (`None`: missing
    /// or unreadable).
    fn current(&self) -> Option<Validity>;
    /// Gets a new certificate with the current one, installs it, and makes the agent's clients
    /// use it.
    async fn rotate(&self) -> Result<(), RotationError>;
    /// Joins again with the bootstrap kubeconfig, and makes the agent's clients use the result.
    async fn bootstrap(&self) -> Result<(), RotationError>;
}

#[derive(Debug, Clone, Copy)]
pub struct Settings {
    /// `--rotate-certificates-before`, in seconds (0: only the 70-90 % point).
    pub renew_before: i64,
    pub bootstrap_configured: bool,
}

/// A wait is cut into pieces of at most this, so a certificate replaced behind the agent's back
/// (or a wall clock that jumped) is noticed.
const RECHECK: Duration = Duration::from_secs(3600);

fn secs(d: i64) -> Duration {
    Duration::from_secs(u64::try_from(d).unwrap_or(0))
}

/// Runs forever (abort the task to stop it).
pub async fn run(
    rotation: Arc<dyn Rotation>,
    settings: Settings,
    clock: Clock,
    mut jitter: impl FnMut() -> f64 + Send,
) {
    // the jittered point is drawn once per certificate
    let mut seen: Option<(Option<Validity>, i64)> = None;
    let mut failures = 0u32;
    loop {
        let current = rotation.current();
        let deadline = match seen {
            Some((v, d)) if v == current => d,
            _ => {
                let d = current.map_or(0, |v| plan::deadline(&v, jitter(), settings.renew_before));
                if let Some(v) = current {
                    tracing::info!(
                        not_after = %ts(v.not_after),
                        rotation_deadline = %ts(d),
                        "client certificate in use; rotating it at the deadline"
                    );
                }
                seen = Some((current, d));
                failures = 0;
                d
            }
        };
        let now = clock.now_ns() / 1_000_000_000;
        let until_expiry = current.map(|v| secs(v.not_after - now));
        let outcome = match plan::next_step(
            now,
            current.as_ref(),
            deadline,
            settings.bootstrap_configured,
        ) {
            Step::WaitUntil(t) => {
                tokio::time::sleep(secs(t - now).min(RECHECK)).await;
                continue;
            }
            Step::Rotate => {
                tracing::info!(attempt = failures + 1, "rotating the client certificate");
                // an attempt still waiting when the certificate expires is given up, so the
                // bootstrap fallback is not held back by a request nobody answers
                match until_expiry {
                    Some(left) => tokio::time::timeout(left, rotation.rotate())
                        .await
                        .unwrap_or(Err(RotationError::Expired)),
                    None => rotation.rotate().await,
                }
            }
            Step::Bootstrap => {
                tracing::warn!("the client certificate expired (or is unreadable) without a new one: joining again with the bootstrap kubeconfig");
                rotation.bootstrap().await
            }
            Step::Stranded => {
                failures = failures.saturating_add(1);
                tracing::error!("the client certificate expired (or is unreadable) and there is no --bootstrap-kubeconfig: the node cannot reach the API until a new kubeconfig is installed");
                tokio::time::sleep(plan::retry_delay(failures, None)).await;
                continue;
            }
        };
        match outcome {
            Ok(()) => {
                tracing::info!("client certificate rotated; new connections use it");
                seen = None;
            }
            Err(e) => {
                failures = failures.saturating_add(1);
                let now = clock.now_ns() / 1_000_000_000;
                if current.is_some_and(|v| v.not_after <= now) {
                    // expired meanwhile: the next step (the bootstrap fallback) at once
                    tracing::warn!(error = %e, "client certificate rotation failed and the certificate has expired");
                    continue;
                }
                let wait = plan::retry_delay(failures, current.map(|v| secs(v.not_after - now)));
                tracing::warn!(error = %e, retry_in = ?wait, "client certificate rotation failed; the current certificate stays in use");
                tokio::time::sleep(wait).await;
            }
        }
    }
}

fn ts(secs: i64) -> String {
    jiff::Timestamp::from_second(secs).map_or_else(|_| secs.to_string(), |t| t.to_string())
}

/// Upstream's certificate manager gives up on a request after 15 minutes and asks again.
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(15 * 60);

/// Rotation against the API, with the node's files.
pub struct ApiRotation {
    pub kubeconfig: PathBuf,
    pub bootstrap_kubeconfig: Option<PathBuf>,
    pub cert_dir: PathBuf,
    pub node_name: String,
    pub servers: Vec<http::Uri>,
    /// The agent's clients; replaced after each new certificate.
    pub client: Reloadable,
    pub request_timeout: Duration,
}

impl ApiRotation {
    /// Builds a client from the kubeconfig again and installs it for every loop of the agent.
    async fn reload(&self) -> Result<(), RotationError> {
        let c = ferro_runtime::apiclient::client(Some(&self.kubeconfig), &self.servers)
            .await
            .map_err(RotationError::Client)?;
        self.client.replace(c);
        Ok(())
    }
}

#[async_trait::async_trait]
impl Rotation for ApiRotation {
    fn current(&self) -> Option<Validity> {
        store::validity(&self.kubeconfig)
    }

    async fn rotate(&self) -> Result<(), RotationError> {
        let key = rcgen::KeyPair::generate().map_err(|e| BootstrapError::Crypto(e.to_string()))?;
        let request = bootstrap::node_request(&key, &self.node_name)?;
        let name = bootstrap::request_name(key.public_key_raw(), &self.node_name);
        // authenticated with the current certificate: the approver checks selfnodeclient
        let cert = tokio::time::timeout(
            self.request_timeout,
            bootstrap::request_certificate(self.client.client(), &name, &request),
        )
        .await
        .map_err(|_| RotationError::Unanswered {
            name: name.clone(),
            after: self.request_timeout,
        })??;
        if store::parse(&cert).is_none() {
            return Err(BootstrapError::Failed {
                name,
                why: "the issued certificate does not parse".into(),
            }
            .into());
        }
        let io = |source| RotationError::Io {
            path: self.cert_dir.clone(),
            source,
        };
        let current = store::install(
            &self.cert_dir,
            &cert,
            key.serialize_pem().as_bytes(),
            jiff::Timestamp::now(),
        )
        .map_err(io)?;
        // a kubeconfig naming another certificate (embedded, or a file elsewhere) is rewritten
        // once to name the store's current pair, as the bootstrap writes it
        let kc_err = |why: String| RotationError::Kubeconfig {
            path: self.kubeconfig.clone(),
            why,
        };
        let kc = kube::config::Kubeconfig::read_from(&self.kubeconfig)
            .map_err(|e| kc_err(e.to_string()))?;
        if !store::points_at(&kc, &current) {
            let text = bootstrap::node_kubeconfig(&kc, &current).map_err(kc_err)?;
            store::write_private(&self.kubeconfig, text.as_bytes()).map_err(|source| {
                RotationError::Io {
                    path: self.kubeconfig.clone(),
                    source,
                }
            })?;
            tracing::info!(kubeconfig = %self.kubeconfig.display(), pem = %current.display(), "the node kubeconfig now names the rotated pair");
        }
        tracing::info!(csr = %name, pem = %current.display(), "new client certificate installed");
        self.reload().await
    }

    async fn bootstrap(&self) -> Result<(), RotationError> {
        let Some(bootstrap_kubeconfig) = self.bootstrap_kubeconfig.as_deref() else {
            return Err(RotationError::Kubeconfig {
                path: self.kubeconfig.clone(),
                why: "no bootstrap kubeconfig".into(),
            });
        };
        let join = bootstrap::Bootstrap {
            kubeconfig: &self.kubeconfig,
            bootstrap_kubeconfig,
            cert_dir: &self.cert_dir,
            node_name: &self.node_name,
            servers: &self.servers,
        };
        bootstrap::ensure(&join).await?;
        self.reload().await
    }
}

/// Uniform jitter in 0..1 from the system's random source (0.5 if it fails).
pub fn system_jitter() -> f64 {
    use ring::rand::SecureRandom as _;
    let mut b = [0u8; 8];
    match ring::rand::SystemRandom::new().fill(&mut b) {
        Ok(()) => plan::jitter_from(b),
        Err(_) => 0.5,
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use std::collections::VecDeque;
    use std::sync::Mutex;
    use tokio::sync::mpsc;

    /// Records what the loop does, at what time (seconds since the test's start); each rotation
    /// or bootstrap that succeeds issues a certificate for `lifetime` seconds from then.
    struct Fake {
        clock: Clock,
        start: i64,
        lifetime: i64,
        cert: Mutex<Option<Validity>>,
        /// Outcomes of the rotations in turn (then successes): `Some(ok)`, or `None` for one
        /// that is never answered.
        rotations: Mutex<VecDeque<Option<bool>>>,
        events: mpsc::UnboundedSender<(&'static str, i64)>,
    }

    impl Fake {
        fn now(&self) -> i64 {
            self.clock.now_ns() / 1_000_000_000
        }
        fn issue(&self) {
            let now = self.now();
            *self.cert.lock().unwrap() = Some(Validity {
                not_before: now,
                not_after: now + self.lifetime,
            });
        }
    }

    #[async_trait::async_trait]
    impl Rotation for Fake {
        fn current(&self) -> Option<Validity> {
            *self.cert.lock().unwrap()
        }
        async fn rotate(&self) -> Result<(), RotationError> {
            self.events
                .send(("rotate", self.now() - self.start))
                .unwrap();
            let outcome = self
                .rotations
                .lock()
                .unwrap()
                .pop_front()
                .unwrap_or(Some(true));
            if outcome.is_none() {
                std::future::pending::<()>().await;
            }
            if outcome == Some(true) {
                self.issue();
                Ok(())
            } else {
                Err(BootstrapError::Denied {
                    name: "node-csr-x".into(),
                    why: "no".into(),
                }
                .into())
            }
        }
        async fn bootstrap(&self) -> Result<(), RotationError> {
            self.events
                .send(("bootstrap", self.now() - self.start))
                .unwrap();
            self.issue();
            Ok(())
        }
    }

    /// Starts the loop on a certificate valid for 1000 s from now, with rotation outcomes
    /// `rotations` (then successes), jitter 0.5: the deadline is at 800 s.
    fn start(
        rotations: &[Option<bool>],
        bootstrap: bool,
    ) -> (
        tokio::task::JoinHandle<()>,
        mpsc::UnboundedReceiver<(&'static str, i64)>,
    ) {
        let clock = Clock::tokio();
        let (tx, rx) = mpsc::unbounded_channel();
        let fake = Fake {
            start: clock.now_ns() / 1_000_000_000,
            clock: clock.clone(),
            lifetime: 1000,
            cert: Mutex::new(None),
            rotations: Mutex::new(rotations.iter().copied().collect()),
            events: tx,
        };
        fake.issue();
        let settings = Settings {
            renew_before: 0,
            bootstrap_configured: bootstrap,
        };
        (
            tokio::spawn(run(Arc::new(fake), settings, clock, || 0.5)),
            rx,
        )
    }

    async fn events(
        rx: &mut mpsc::UnboundedReceiver<(&'static str, i64)>,
        n: usize,
    ) -> Vec<(&'static str, i64)> {
        let mut out = Vec::new();
        for _ in 0..n {
            out.push(rx.recv().await.unwrap());
        }
        out
    }

    #[tokio::test(start_paused = true)]
    async fn rotates_at_the_deadline_of_each_certificate() {
        let (task, mut rx) = start(&[], false);
        assert_eq!(
            events(&mut rx, 2).await,
            [("rotate", 800), ("rotate", 1600)]
        );
        task.abort();
    }

    #[tokio::test(start_paused = true)]
    async fn failures_are_retried_with_backoff_on_the_old_certificate() {
        let (task, mut rx) = start(&[Some(false); 3], false);
        assert_eq!(
            events(&mut rx, 5).await,
            [
                ("rotate", 800),
                ("rotate", 802),
                ("rotate", 806),
                ("rotate", 814),
                ("rotate", 1614)
            ]
        );
        task.abort();
    }

    #[tokio::test(start_paused = true)]
    async fn an_expiry_without_a_new_certificate_falls_back_to_bootstrap() {
        // 800, then 2 4 8 16 32 64: the seventh wait (128 s) is cut at the expiry (1000)
        let (task, mut rx) = start(&[Some(false); 7], true);
        let seen = events(&mut rx, 8).await;
        assert_eq!(
            seen.iter().map(|e| e.1).collect::<Vec<_>>(),
            [800, 802, 806, 814, 830, 862, 926, 1000]
        );
        assert_eq!(seen[7].0, "bootstrap");
        // the certificate the bootstrap got is rotated as usual
        assert_eq!(events(&mut rx, 1).await, [("rotate", 1800)]);
        task.abort();
    }

    #[tokio::test(start_paused = true)]
    async fn a_renewal_never_answered_is_given_up_at_the_expiry_for_the_bootstrap() {
        let (task, mut rx) = start(&[None], true);
        assert_eq!(
            events(&mut rx, 3).await,
            [("rotate", 800), ("bootstrap", 1000), ("rotate", 1800)]
        );
        task.abort();
    }

    #[tokio::test(start_paused = true)]
    async fn without_a_bootstrap_kubeconfig_an_expired_certificate_is_not_rotated_again() {
        let (task, mut rx) = start(&[Some(false); 7], false);
        let seen = events(&mut rx, 7).await;
        assert_eq!(seen.last(), Some(&("rotate", 926)));
        // well past the expiry: nothing else was attempted
        tokio::time::sleep(Duration::from_secs(5000)).await;
        assert!(rx.try_recv().is_err());
        task.abort();
    }
}
