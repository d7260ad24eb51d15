//! The etcd v3 backend: objects live in an etcd cluster, reads are served from a watch cache.
//!
//! - Keys: `<prefix>/<path>`, where [`KeyLayout`] turns the API's keys
//!   (`/<group>/<resource>/<namespace>/<name>`, group `core` for the core group) into upstream's
//!   layout (`/registry/pods/default/web`, `/registry/minions/node1`,
//!   `/registry/deployments/default/web`) and back; keys under the prefix that it does not
//!   know are ignored.
//! - Values: the object's JSON without `metadata.resourceVersion`; the revision of the etcd
//!   write is the resourceVersion, stamped into the value when a record is built (as upstream's
//!   etcd3 storage does on read), so the bytes served equal the embedded store's.
//! - Writes: one etcd transaction each, guarded by `mod_revision == expected` (updates and
//!   deletes) or `create_revision == 0` (creates). A write returns with etcd's answer to its
//!   transaction, as upstream's does, without waiting for the watch cache: [`Acked`] keeps what
//!   this server acknowledged that its cache has not applied yet, and a read after a write
//!   waits for the cache only then (a get for that key, a list for the latest acknowledged
//!   revision), so a read after a write still sees it, as with the embedded store.
//! - Reads (get, list, watch): from the [`Cache`], fed by one etcd watch over the prefix that
//!   resumes from the cache's revision when it breaks and relists when etcd has compacted that
//!   revision. At start the cache is loaded at a revision up to `history` revisions back and
//!   replayed to the current one, so watches resume across a restart of this server.
//! - Compaction: every `compaction_interval`, revisions older than the previous run's are
//!   compacted, coordinated between API servers through the `compact_rev_key` key (upstream's
//!   scheme: only the server whose compare-and-swap on its version wins compacts).

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use etcd_client::{
    Client, Compare, CompareOp, ConnectOptions, DeleteOptions, EventType, GetOptions, KvClient,
    PutOptions, Txn, TxnOp, TxnOpResponse, WatchOptions,
};
use futures::future::BoxFuture;

use super::cache::{record_from_stored, restamp, Cache, Change, Prepared};
use super::{Indexer, Listing, Op, Record, Revision, Store, StoreError, Watch};

/// Largest gRPC message accepted from etcd (a page of a listing, a watch response).
const MAX_MESSAGE: usize = 256 << 20;
/// Keys per range request when loading the cache.
const PAGE: i64 = 2_000;
/// The key through which API servers sharing an etcd take turns compacting (upstream's name,
/// outside any prefix: compaction is global to the etcd cluster).
const COMPACT_REV_KEY: &str = "compact_rev_key";

/// How to reach etcd and how to run the cache.
#[derive(Debug, Clone)]
pub struct EtcdOptions {
    /// Client URLs (`http://host:2379` or `https://...` with TLS).
    pub endpoints: Vec<String>,
    /// CA bundle to verify the etcd servers; with `cert_file`/`key_file`, mutual TLS.
    pub ca_file: Option<PathBuf>,
    pub cert_file: Option<PathBuf>,
    pub key_file: Option<PathBuf>,
    /// How often old revisions are compacted; zero disables compaction.
    pub compaction_interval: Duration,
    /// Events the watch cache keeps for watches to resume from.
    pub history: usize,
    /// Deadline of one write (and of the cache catching up with it).
    pub request_timeout: Duration,
    /// How long to wait for etcd at start before giving up.
    pub start_timeout: Duration,
    /// For tests only (zero otherwise): how long the cache's feeder holds each batch of watch
    /// events before applying it, making a cache that lags etcd on purpose.
    pub apply_delay: Duration,
}

impl EtcdOptions {
    pub fn new(endpoints: Vec<String>) -> EtcdOptions {
        EtcdOptions {
            endpoints,
            ca_file: None,
            cert_file: None,
            key_file: None,
            compaction_interval: Duration::from_secs(300),
            history: 20_000,
            request_timeout: Duration::from_secs(30),
            start_timeout: Duration::from_secs(20),
            apply_delay: Duration::ZERO,
        }
    }
}

/// Where the API's keys live in etcd.
#[derive(Debug, Clone)]
pub struct KeyLayout {
    /// Without a trailing slash (`/registry`).
    prefix: String,
    /// (API key prefix, path under the etcd prefix), e.g. `("/core/nodes/", "minions/")`;
    /// empty: the API key is used as it is.
    segments: Vec<(String, String)>,
}

impl KeyLayout {
    /// `<prefix><api key>`: `/registry/core/pods/default/web`.
    pub fn verbatim(prefix: &str) -> KeyLayout {
        KeyLayout { prefix: prefix.trim_end_matches('/').to_string(), segments: Vec::new() }
    }

    /// `<prefix>/<segment><rest>` for each `(api prefix, segment)` pair, both ending in `/`.
    pub fn mapped(prefix: &str, segments: Vec<(String, String)>) -> KeyLayout {
        KeyLayout { prefix: prefix.trim_end_matches('/').to_string(), segments }
    }

    pub fn prefix(&self) -> &str {
        &self.prefix
    }

    /// The etcd key range everything lives under (`/registry/`).
    pub fn range(&self) -> String {
        format!("{}/", self.prefix)
    }

    pub fn to_etcd(&self, key: &str) -> Option<String> {
        if self.segments.is_empty() {
            let key = key.strip_prefix('/').unwrap_or(key);
            return Some(format!("{}/{key}", self.prefix));
        }
        self.segments
            .iter()
            .find(|(api, _)| key.starts_with(api.as_str()))
            .map(|(api, seg)| format!("{}/{seg}{}", self.prefix, &key[api.len()..]))
            .or_else(|| custom_group(key.strip_prefix('/')?, false).map(|_| format!("{}{key}", self.prefix)))
    }

    /// The API key of an etcd key, or `None` for keys outside the layout.
    pub fn from_etcd(&self, key: &[u8]) -> Option<String> {
        let key = std::str::from_utf8(key).ok()?;
        let rest = key.strip_prefix(self.prefix.as_str())?.strip_prefix('/')?;
        if rest.is_empty() {
            return None;
        }
        if self.segments.is_empty() {
            return Some(format!("/{rest}"));
        }
        self.segments
            .iter()
            .find(|(_, seg)| rest.starts_with(seg.as_str()) && rest.len() > seg.len())
            .map(|(api, seg)| format!("{api}{}", &rest[seg.len()..]))
            .or_else(|| custom_group(rest, true).map(|_| format!("/{rest}")))
    }
}

/// The group of a key (`<group>/<plural>/...`, without the leading slash) of a kind served from
/// a CustomResourceDefinition: upstream keeps those under `<prefix>/<group>/<plural>/`, and
/// their groups have a dot (built-in resources' segments never do). `object`: a whole key
/// (not a list prefix), which names an object after the plural.
fn custom_group(rest: &str, object: bool) -> Option<&str> {
    let mut parts = rest.splitn(3, '/');
    let group = parts.next()?;
    let plural = parts.next()?;
    let tail = parts.next()?;
    (group.contains('.') && !plural.is_empty() && (!object || !tail.is_empty())).then_some(group)
}

/// [`Store`] on an etcd v3 cluster, reads served from a watch cache.
pub struct EtcdStore {
    client: Client,
    kv: KvClient,
    cache: Arc<Cache>,
    layout: KeyLayout,
    request_timeout: Duration,
    tasks: Vec<tokio::task::JoinHandle<()>>,
    /// When etcd last failed to tell its revision: reads are served from the cache without
    /// asking again for [`PROBE_QUIET`] (they stay available while etcd has no quorum).
    probe_failed: std::sync::Mutex<Option<Instant>>,
    /// The last etcd revision a consistent read waited for in vain (moved by keys outside the
    /// prefix, which no event brings): reads that find etcd still there do not wait again.
    unreached: std::sync::atomic::AtomicI64,
    acked: Acked,
    reads: ConsistentReads,
}

/// How this server's consistent reads were answered.
#[derive(Debug, Default)]
pub struct ConsistentReads {
    /// From the watch cache, at or past etcd's revision (or while etcd could not tell it).
    pub from_cache: std::sync::atomic::AtomicU64,
    /// From etcd: the cache did not reach etcd's revision in time.
    pub from_etcd: std::sync::atomic::AtomicU64,
}

/// Where a consistent read is answered from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Fresh {
    Cache,
    Etcd,
}

/// Writes this server acknowledged that its watch cache may not have applied yet: the
/// revision of each key's latest one, and the latest revision over all keys. Entries leave
/// once the cache is past them (checked as reads and writes go by), so the map holds only
/// what is in flight between etcd's answer and the watch event.
#[derive(Default)]
struct Acked {
    keys: std::sync::Mutex<std::collections::HashMap<Arc<str>, Revision>>,
    latest: std::sync::atomic::AtomicI64,
}

/// Above this many entries, a write sweeps the ones the cache has passed.
const ACKED_SWEEP: usize = 256;

impl Acked {
    fn note(&self, key: &Arc<str>, rev: Revision, cache_rev: Revision) {
        self.latest.fetch_max(rev, std::sync::atomic::Ordering::AcqRel);
        self.note_key(key, rev, cache_rev);
    }

    /// A revision of `key` etcd reported (a guarded write's conflict): the next read of the
    /// key waits for the cache to have it, so a retry reads what it conflicted with.
    fn note_key(&self, key: &Arc<str>, rev: Revision, cache_rev: Revision) {
        if rev <= cache_rev {
            return;
        }
        let mut keys = self.keys.lock().unwrap_or_else(|p| p.into_inner());
        let e = keys.entry(key.clone()).or_insert(rev);
        *e = (*e).max(rev);
        if keys.len() > ACKED_SWEEP {
            keys.retain(|_, r| *r > cache_rev);
        }
    }

    /// The revision a read of `key` must wait for, if the cache is behind this server's last
    /// acknowledged write of it.
    fn pending(&self, key: &str, cache_rev: Revision) -> Option<Revision> {
        let mut keys = self.keys.lock().unwrap_or_else(|p| p.into_inner());
        let rev = *keys.get(key)?;
        if rev <= cache_rev {
            keys.remove(key);
            return None;
        }
        Some(rev)
    }

    fn latest(&self) -> Revision {
        self.latest.load(std::sync::atomic::Ordering::Acquire)
    }
}

/// How long a consistent read waits for etcd's revision (and for a watch telling what moved
/// it), and for the cache to reach it before asking what moved it, and in all before reading
/// from etcd instead.
const SYNC_PROBE_TIMEOUT: Duration = Duration::from_secs(1);
const SYNC_FIRST_WAIT: Duration = Duration::from_millis(100);
const SYNC_WAIT: Duration = Duration::from_secs(1);
/// After a failed probe, reads skip probing for this long.
const PROBE_QUIET: Duration = Duration::from_secs(2);

impl Drop for EtcdStore {
    fn drop(&mut self) {
        for t in &self.tasks {
            t.abort();
        }
    }
}

fn etcd_err(e: etcd_client::Error) -> StoreError {
    StoreError::Io(format!("etcd: {e}"))
}

/// Whether a failed request certainly never reached etcd: the connection to the member the
/// client picked was refused (a member that is down). Sending it again, to whichever member
/// the client picks next, cannot apply it twice. Anything else (a reset connection, a timeout,
/// etcd's "request timed out") may have been applied and is not retried.
fn never_sent(e: &etcd_client::Error) -> bool {
    let mut source: Option<&(dyn std::error::Error + 'static)> = match e {
        etcd_client::Error::GRpcStatus(s) => Some(s),
        etcd_client::Error::TransportError(t) => Some(t),
        _ => None,
    };
    while let Some(err) = source {
        if err.downcast_ref::<std::io::Error>().is_some_and(|io| io.kind() == std::io::ErrorKind::ConnectionRefused) {
            return true;
        }
        source = err.source();
    }
    false
}

/// Tries a write transaction until it reaches etcd (see [`never_sent`]), at most 8 times, all
/// within `limit`.
async fn txn_once(kv: &KvClient, limit: Duration, what: &str, txn: Txn) -> Result<etcd_client::TxnResponse, StoreError> {
    let attempts = async {
        let mut tries = 0;
        loop {
            let mut kv = kv.clone();
            match kv.txn(txn.clone()).await {
                Err(e) if never_sent(&e) && tries < 8 => {
                    tries += 1;
                    tracing::debug!(error = %e, "an etcd member refused the connection; sending the write to another");
                }
                other => return other,
            }
        }
    };
    timed(limit, what, attempts).await
}

/// Whether a read may be sent again: a read changes nothing, so any answer saying the member
/// could not serve it (Unavailable: connection refused or reset, no leader, leader changed,
/// etcd's own request timeout) is retried on whichever member the client picks next, as
/// upstream's clientv3 retries its repeatable requests. Writes are retried only when
/// [`never_sent`].
fn read_retryable(e: &etcd_client::Error) -> bool {
    match e {
        etcd_client::Error::GRpcStatus(s) => s.code() == tonic::Code::Unavailable,
        etcd_client::Error::TransportError(_) => true,
        _ => false,
    }
}

/// First pause between two tries of a read; doubles up to [`READ_PAUSE_MAX`].
const READ_PAUSE: Duration = Duration::from_millis(20);
const READ_PAUSE_MAX: Duration = Duration::from_millis(500);

/// Runs a read until it is answered or fails with an error that is not [`read_retryable`],
/// all within `limit`: a member that is down or restarting costs the read a retry, never an
/// error, while a quorum of members answers.
async fn read_retrying<T, Fut>(limit: Duration, what: &str, mut attempt: impl FnMut() -> Fut) -> Result<T, etcd_client::Error>
where
    Fut: std::future::Future<Output = Result<T, etcd_client::Error>>,
{
    let deadline = tokio::time::Instant::now() + limit;
    let mut pause = READ_PAUSE;
    loop {
        match tokio::time::timeout_at(deadline, attempt()).await {
            Err(_) => return Err(etcd_client::Error::Internal(format!("{what} timed out after {limit:?}"))),
            Ok(Err(e)) if read_retryable(&e) && tokio::time::Instant::now() + pause < deadline => {
                tracing::debug!(error = %e, what, "an etcd member could not serve a read; asking again");
                tokio::time::sleep(pause).await;
                pause = (pause * 2).min(READ_PAUSE_MAX);
            }
            Ok(answer) => return answer,
        }
    }
}

fn is_compacted(e: &etcd_client::Error) -> bool {
    matches!(e, etcd_client::Error::GRpcStatus(s) if s.code() == tonic::Code::OutOfRange)
}

async fn timed<T>(
    limit: Duration,
    what: &str,
    f: impl std::future::Future<Output = Result<T, etcd_client::Error>>,
) -> Result<T, StoreError> {
    match tokio::time::timeout(limit, f).await {
        Ok(r) => r.map_err(etcd_err),
        Err(_) => Err(StoreError::Io(format!("etcd: {what} timed out after {limit:?}"))),
    }
}

fn read_pem(path: &std::path::Path) -> Result<Vec<u8>, StoreError> {
    std::fs::read(path).map_err(|e| StoreError::Io(format!("reading {}: {e}", path.display())))
}

async fn connect_client(opts: &EtcdOptions) -> Result<Client, StoreError> {
    if opts.endpoints.is_empty() {
        return Err(StoreError::Io("no etcd endpoints given".into()));
    }
    let mut copts = ConnectOptions::new()
        .with_connect_timeout(Duration::from_secs(5))
        .with_keep_alive(Duration::from_secs(30), Duration::from_secs(10));
    let tls_files = [&opts.ca_file, &opts.cert_file, &opts.key_file];
    if tls_files.iter().any(|f| f.is_some()) {
        let mut tls = etcd_client::TlsOptions::new();
        if let Some(ca) = &opts.ca_file {
            tls = tls.ca_certificate(etcd_client::Certificate::from_pem(read_pem(ca)?));
        }
        match (&opts.cert_file, &opts.key_file) {
            (Some(cert), Some(key)) => {
                tls = tls.identity(etcd_client::Identity::from_pem(read_pem(cert)?, read_pem(key)?));
            }
            (None, None) => {}
            _ => return Err(StoreError::Io("an etcd client certificate needs both a cert file and a key file".into())),
        }
        copts = copts.with_tls(tls);
    }
    Client::connect(&opts.endpoints, Some(copts)).await.map_err(etcd_err)
}

/// The range end of a prefix: the prefix with its last byte incremented.
fn prefix_end(prefix: &str) -> Vec<u8> {
    let mut end = prefix.as_bytes().to_vec();
    while let Some(last) = end.pop() {
        if last < 0xff {
            end.push(last + 1);
            return end;
        }
    }
    vec![0]
}

/// A change of the cache from an etcd event, or `None` for keys outside the layout.
fn change_of(layout: &KeyLayout, event: &etcd_client::Event) -> Option<Change> {
    let kv = event.kv()?;
    let key: Arc<str> = Arc::from(layout.from_etcd(kv.key())?);
    Some(match event.event_type() {
        EventType::Put => Change::Put {
            key,
            create_rev: kv.create_revision(),
            mod_rev: kv.mod_revision(),
            value: Bytes::copy_from_slice(kv.value()),
        },
        EventType::Delete => Change::Delete { key, rev: kv.mod_revision() },
    })
}

/// Every object under the layout's prefix at `rev` (0: the latest), in pages of one snapshot;
/// returns the records and the revision they reflect.
async fn load(
    kv: &mut KvClient,
    layout: &KeyLayout,
    indexer: &Indexer,
    rev: Revision,
    limit: Duration,
) -> Result<(Vec<Record>, Revision), etcd_client::Error> {
    load_prefix(kv, layout, indexer, &layout.range(), rev, limit).await
}

/// Every object whose etcd key starts with `prefix` at `rev` (0: the latest), as [`load`].
async fn load_prefix(
    kv: &mut KvClient,
    layout: &KeyLayout,
    indexer: &Indexer,
    prefix: &str,
    rev: Revision,
    limit: Duration,
) -> Result<(Vec<Record>, Revision), etcd_client::Error> {
    let end = prefix_end(prefix);
    let mut from = prefix.as_bytes().to_vec();
    let mut at = rev;
    let mut records = Vec::new();
    let mut ignored = 0usize;
    loop {
        let mut options = GetOptions::new().with_range(end.clone()).with_limit(PAGE);
        if at > 0 {
            options = options.with_revision(at);
        }
        let resp = read_retrying(limit, "listing", || {
            let (mut kv, from, options) = (kv.clone(), from.clone(), options.clone());
            async move { kv.get(from, Some(options)).await }
        })
        .await?;
        if at == 0 {
            at = resp.header().map(|h| h.revision()).unwrap_or(0);
        }
        for kv in resp.kvs() {
            let Some(key) = layout.from_etcd(kv.key()) else {
                ignored += 1;
                continue;
            };
            match record_from_stored(Arc::from(key), kv.create_revision(), kv.mod_revision(), kv.value(), indexer) {
                Ok(r) => records.push(r),
                Err(e) => {
                    ignored += 1;
                    tracing::warn!(error = %e, "ignoring a stored value that is not a JSON object");
                }
            }
        }
        match resp.kvs().last() {
            Some(last) if resp.more() => {
                from = last.key().to_vec();
                from.push(0);
            }
            _ => break,
        }
    }
    if ignored > 0 {
        tracing::warn!(ignored, prefix = layout.prefix(), "keys under the etcd prefix that ferro does not serve were ignored");
    }
    Ok((records, at))
}

impl EtcdStore {
    /// Connects, waits (up to `start_timeout`) for etcd to answer, loads the cache and starts
    /// its watch and the compaction loop. Must run inside a tokio runtime.
    pub async fn connect(opts: EtcdOptions, layout: KeyLayout, indexer: Indexer) -> Result<EtcdStore, StoreError> {
        let client = connect_client(&opts).await?;
        let mut kv = client.kv_client().max_decoding_message_size(MAX_MESSAGE);
        let deadline = Instant::now() + opts.start_timeout;
        let current = loop {
            let probe = GetOptions::new().with_prefix().with_count_only();
            let err = match tokio::time::timeout(Duration::from_secs(2), kv.get(layout.range(), Some(probe))).await {
                Ok(Ok(resp)) => break resp.header().map(|h| h.revision()).unwrap_or(0),
                Ok(Err(e)) => e.to_string(),
                Err(_) => "no answer within 2s".to_string(),
            };
            if Instant::now() >= deadline {
                return Err(StoreError::Io(format!(
                    "etcd at {} did not answer within {:?}: {err}",
                    opts.endpoints.join(","),
                    opts.start_timeout
                )));
            }
            tracing::warn!(endpoints = %opts.endpoints.join(","), error = %err, "waiting for etcd");
            tokio::time::sleep(Duration::from_millis(500)).await;
        };
        let cache = Arc::new(Cache::new(indexer, opts.history));
        let loaded = Self::load_with_history(&client, &mut kv, &layout, &cache, current, opts.history, opts.start_timeout).await?;
        tracing::info!(
            endpoints = %opts.endpoints.join(","),
            prefix = layout.prefix(),
            revision = cache.revision(),
            history_from = loaded,
            "etcd store ready"
        );
        let mut tasks = vec![tokio::spawn(feed(
            client.clone(),
            kv.clone(),
            layout.clone(),
            cache.clone(),
            opts.request_timeout,
            opts.apply_delay,
        ))];
        if !opts.compaction_interval.is_zero() {
            tasks.push(tokio::spawn(compactor(kv.clone(), opts.compaction_interval, opts.request_timeout)));
        }
        Ok(EtcdStore {
            client,
            kv,
            cache,
            layout,
            request_timeout: opts.request_timeout,
            tasks,
            probe_failed: Default::default(),
            unreached: Default::default(),
            acked: Acked::default(),
            reads: ConsistentReads::default(),
        })
    }

    /// Loads the cache at up to `history` revisions before `current` and replays the changes
    /// since then, so watches can resume from before a restart of this server; when those
    /// revisions are compacted, loads at `current` with no history. Returns the revision
    /// watches may start after.
    async fn load_with_history(
        client: &Client,
        kv: &mut KvClient,
        layout: &KeyLayout,
        cache: &Cache,
        current: Revision,
        history: usize,
        limit: Duration,
    ) -> Result<Revision, StoreError> {
        let start = current.saturating_sub(history as i64).max(1);
        if start < current {
            match load(kv, layout, cache.indexer(), start, limit).await {
                Ok((records, _)) => {
                    cache.reset(records, start);
                    match replay(client, layout, cache, current, limit).await {
                        Ok(()) => return Ok(start),
                        Err(e) => tracing::warn!(error = %e, "replaying etcd history failed; starting without history"),
                    }
                }
                Err(e) if is_compacted(&e) => {}
                Err(e) => return Err(etcd_err(e)),
            }
        }
        let (records, rev) = load(kv, layout, cache.indexer(), current, limit).await.map_err(etcd_err)?;
        cache.reset(records, rev);
        Ok(rev)
    }

    /// Revision of a txn response.
    fn txn_rev(resp: &etcd_client::TxnResponse) -> Result<Revision, StoreError> {
        resp.header().map(|h| h.revision()).ok_or_else(|| StoreError::Io("etcd: txn response without header".into()))
    }

    /// The failure of a guarded write: the key's state from the else branch.
    fn precondition_failed(resp: &etcd_client::TxnResponse) -> StoreError {
        let current = resp.op_responses().into_iter().find_map(|r| match r {
            TxnOpResponse::Get(g) => Some(g.kvs().first().map(|kv| kv.mod_revision())),
            _ => None,
        });
        match current {
            Some(Some(rev)) => StoreError::Conflict { current: rev },
            _ => StoreError::NotFound,
        }
    }

    fn guard(key: &str, expect: Option<Revision>) -> Compare {
        match expect {
            Some(rev) => Compare::mod_revision(key, CompareOp::Equal, rev),
            None => Compare::create_revision(key, CompareOp::Greater, 0),
        }
    }

    async fn do_write(&self, op: Op) -> Result<Record, StoreError> {
        let api_key = op.key().to_string();
        let key = self
            .layout
            .to_etcd(&api_key)
            .ok_or_else(|| StoreError::InvalidValue(format!("no etcd key for {api_key}")))?;
        let record = match self.transact(op, key, api_key.clone()).await {
            Ok(r) => r,
            Err(StoreError::Conflict { current }) => {
                self.acked.note_key(&Arc::from(api_key), current, self.cache.revision());
                return Err(StoreError::Conflict { current });
            }
            Err(e) => return Err(e),
        };
        // Acknowledged with etcd's answer; reads of it wait for the cache (`caught_up`).
        self.acked.note(&record.key, record.mod_rev, self.cache.revision());
        Ok(record)
    }

    /// One write's transaction and the record it made.
    async fn transact(&self, op: Op, key: String, api_key: String) -> Result<Record, StoreError> {
        let indexer = self.cache.indexer();
        let kv = self.kv.clone();
        Ok(match op {
            Op::Create { key: _, value } => {
                let api_key: Arc<str> = Arc::from(api_key);
                let expecting = Expecting::new(&self.cache, api_key.clone(), Prepared::new(&api_key, value, indexer)?);
                let txn = Txn::new()
                    .when([Compare::create_revision(key.as_str(), CompareOp::Equal, 0)])
                    .and_then([TxnOp::put(key.as_str(), expecting.prepared.stored().clone(), None)])
                    .or_else([TxnOp::get(key.as_str(), Some(GetOptions::new().with_keys_only()))]);
                let resp = txn_once(&kv, self.request_timeout, "create", txn).await?;
                if !resp.succeeded() {
                    // The key another writer made (another API server, or this one's loop a
                    // moment ago): a read of it after this refusal waits for that write, as a
                    // read after a conflict does, so "already exists" is never followed by
                    // "not found" from a cache that lags.
                    if let StoreError::Conflict { current } = Self::precondition_failed(&resp) {
                        self.acked.note_key(&api_key, current, self.cache.revision());
                    }
                    return Err(StoreError::AlreadyExists);
                }
                let rev = Self::txn_rev(&resp)?;
                // the watch event of this write is applied with the prepared record
                expecting.applied().record(api_key, rev, rev)
            }
            Op::Update { key: _, value, expect } => {
                let api_key: Arc<str> = Arc::from(api_key);
                let expecting = Expecting::new(&self.cache, api_key.clone(), Prepared::new(&api_key, value, indexer)?);
                let txn = Txn::new()
                    .when([Self::guard(&key, expect)])
                    .and_then([TxnOp::put(
                        key.as_str(),
                        expecting.prepared.stored().clone(),
                        Some(PutOptions::new().with_prev_key()),
                    )])
                    .or_else([TxnOp::get(key.as_str(), None)]);
                let resp = txn_once(&kv, self.request_timeout, "update", txn).await?;
                if !resp.succeeded() {
                    return Err(Self::precondition_failed(&resp));
                }
                let rev = Self::txn_rev(&resp)?;
                let create_rev = resp
                    .op_responses()
                    .into_iter()
                    .find_map(|r| match r {
                        TxnOpResponse::Put(p) => p.prev_key().map(|kv| kv.create_revision()),
                        _ => None,
                    })
                    .unwrap_or(rev);
                expecting.applied().record(api_key, create_rev, rev)
            }
            Op::Delete { key: _, expect } => {
                let txn = Txn::new()
                    .when([Self::guard(&key, expect)])
                    .and_then([TxnOp::delete(key.as_str(), Some(DeleteOptions::new().with_prev_key()))])
                    .or_else([TxnOp::get(key.as_str(), None)]);
                let resp = txn_once(&kv, self.request_timeout, "delete", txn).await?;
                if !resp.succeeded() {
                    return Err(Self::precondition_failed(&resp));
                }
                let rev = Self::txn_rev(&resp)?;
                let prev = resp
                    .op_responses()
                    .into_iter()
                    .find_map(|r| match r {
                        TxnOpResponse::Delete(d) => d.prev_kvs().first().cloned(),
                        _ => None,
                    })
                    .ok_or(StoreError::NotFound)?;
                let last = record_from_stored(Arc::from(api_key), prev.create_revision(), prev.mod_revision(), prev.value(), indexer)?;
                restamp(&last, rev)?
            }
        })
    }

    /// Waits until the cache has applied `rev`, a write this server acknowledged.
    async fn caught_up(&self, rev: Revision, what: &str) {
        if self.cache.revision() < rev && !self.cache.wait_for(rev, self.request_timeout).await {
            tracing::warn!(rev, what, cache = self.cache.revision(), "the watch cache has not caught up with an acknowledged write yet");
        }
    }
}

/// The bytes kept in etcd: the object without `metadata.resourceVersion` (it is the revision).
/// The bytes a value is stored as (without `resourceVersion`), and the value as stored.
/// A write's prepared value, expected by the cache while the write is in flight: withdrawn
/// when the write fails or is abandoned (its event may never come), kept for the watch
/// event once etcd applied it.
struct Expecting<'a> {
    cache: &'a Cache,
    key: Arc<str>,
    prepared: Arc<Prepared>,
    applied: bool,
}

impl<'a> Expecting<'a> {
    fn new(cache: &'a Cache, key: Arc<str>, prepared: Prepared) -> Expecting<'a> {
        let prepared = Arc::new(prepared);
        cache.expect(key.clone(), prepared.clone());
        Expecting { cache, key, prepared, applied: false }
    }

    /// etcd applied the write: its event brings the prepared value.
    fn applied(mut self) -> Arc<Prepared> {
        self.applied = true;
        self.prepared.clone()
    }
}

impl Drop for Expecting<'_> {
    fn drop(&mut self) {
        if !self.applied {
            self.cache.withdraw(&self.key, &self.prepared);
        }
    }
}

/// A watch over every key from a revision, read until `until` within one deadline (what
/// [`replay`] and [`moved_outside_only`] read etcd's history with).
struct History {
    stream: etcd_client::WatchStream,
    deadline: tokio::time::Instant,
    until: Revision,
}

impl History {
    async fn open(client: &Client, from: Revision, until: Revision, limit: Duration) -> Result<History, StoreError> {
        let mut wc = client.watch_client().max_decoding_message_size(MAX_MESSAGE);
        let options = WatchOptions::new().with_all_keys().with_start_revision(from);
        let deadline = tokio::time::Instant::now() + limit;
        let stream = tokio::time::timeout_at(deadline, wc.watch("\0", Some(options)))
            .await
            .map_err(|_| StoreError::Io("etcd: history watch timed out".into()))?
            .map_err(etcd_err)?;
        Ok(History { stream, deadline, until })
    }

    /// The next response; an error once the deadline passed, the watch ended or was cancelled.
    async fn next(&mut self) -> Result<etcd_client::WatchResponse, StoreError> {
        let until = self.until;
        let resp = tokio::time::timeout_at(self.deadline, self.stream.message())
            .await
            .map_err(|_| StoreError::Io(format!("etcd: the history watch did not reach revision {until} in time")))?
            .map_err(etcd_err)?
            .ok_or_else(|| StoreError::Io("etcd: history watch ended".into()))?;
        if resp.canceled() {
            return Err(StoreError::Io(format!("etcd: history watch cancelled: {}", resp.cancel_reason())));
        }
        Ok(resp)
    }
}

/// Applies the changes between the cache's revision and `until` from a watch over every key
/// (every revision has at least one event there, so reaching `until` is certain); changes
/// outside the layout are skipped.
async fn replay(client: &Client, layout: &KeyLayout, cache: &Cache, until: Revision, limit: Duration) -> Result<(), StoreError> {
    let from = cache.revision() + 1;
    if from > until {
        return Ok(());
    }
    let mut history = History::open(client, from, until, limit).await?;
    loop {
        let resp = history.next().await?;
        let mut changes = Vec::new();
        let mut reached = 0;
        for event in resp.events() {
            let Some(kv) = event.kv() else { continue };
            if kv.mod_revision() > until {
                break;
            }
            reached = kv.mod_revision();
            changes.extend(change_of(layout, event));
        }
        cache.apply(changes);
        cache.advance(reached);
        if reached >= until || cache.revision() >= until {
            return Ok(());
        }
    }
}

enum WatchEnd {
    /// etcd no longer has the revision the watch asked for.
    Compacted(Revision),
    Failed(String),
}

/// Follows the prefix from `from` into the cache until the watch breaks.
async fn follow(client: &Client, layout: &KeyLayout, cache: &Cache, from: Revision, delay: Duration) -> WatchEnd {
    let mut wc = client.watch_client().max_decoding_message_size(MAX_MESSAGE);
    let options = WatchOptions::new().with_prefix().with_start_revision(from).with_progress_notify();
    let stream = tokio::time::timeout(Duration::from_secs(10), wc.watch(layout.range(), Some(options))).await;
    // The request sender stays alive with the stream: dropping it would end the watch.
    let mut stream = match stream {
        Ok(Ok(s)) => s,
        Ok(Err(e)) => return WatchEnd::Failed(e.to_string()),
        Err(_) => return WatchEnd::Failed("no answer to the watch request within 10s".into()),
    };
    loop {
        let resp = match stream.message().await {
            Ok(Some(r)) => r,
            Ok(None) => return WatchEnd::Failed("watch stream ended".into()),
            Err(e) => return WatchEnd::Failed(e.to_string()),
        };
        if resp.canceled() {
            if resp.compact_revision() > 0 {
                return WatchEnd::Compacted(resp.compact_revision());
            }
            return WatchEnd::Failed(format!("watch cancelled: {}", resp.cancel_reason()));
        }
        let events = resp.events();
        if events.is_empty() {
            // A progress notification (sent to synchronised watchers only): every change up to
            // the header's revision has been delivered.
            if !resp.created() {
                if let Some(h) = resp.header() {
                    cache.advance(h.revision());
                }
            }
            continue;
        }
        if !delay.is_zero() {
            tokio::time::sleep(delay).await;
        }
        let last = events.iter().filter_map(|e| e.kv()).map(|kv| kv.mod_revision()).max().unwrap_or(0);
        cache.apply(events.iter().filter_map(|e| change_of(layout, e)).collect());
        // Keys outside the layout move the revision too.
        cache.advance(last);
    }
}

/// The cache's feeder: follows etcd, resumes after errors from the cache's revision (with
/// back-off), relists when that revision has been compacted.
async fn feed(client: Client, mut kv: KvClient, layout: KeyLayout, cache: Arc<Cache>, limit: Duration, delay: Duration) {
    const MIN_BACKOFF: Duration = Duration::from_millis(100);
    const MAX_BACKOFF: Duration = Duration::from_secs(5);
    let mut backoff = MIN_BACKOFF;
    loop {
        let from = cache.revision() + 1;
        let began = Instant::now();
        match follow(&client, &layout, &cache, from, delay).await {
            WatchEnd::Compacted(compacted) => {
                tracing::warn!(from, compacted, "etcd compacted the revision the watch cache needs; relisting");
                loop {
                    match load(&mut kv, &layout, cache.indexer(), 0, limit).await {
                        Ok((records, rev)) => {
                            cache.reset(records, rev);
                            tracing::info!(revision = rev, "watch cache relisted");
                            break;
                        }
                        Err(e) => {
                            tracing::warn!(error = %e, "relisting from etcd failed; retrying");
                            tokio::time::sleep(backoff).await;
                            backoff = (backoff * 2).min(MAX_BACKOFF);
                        }
                    }
                }
                backoff = MIN_BACKOFF;
                continue;
            }
            WatchEnd::Failed(e) => tracing::warn!(from, error = %e, "etcd watch failed; resuming"),
        }
        if began.elapsed() > Duration::from_secs(30) {
            backoff = MIN_BACKOFF;
        }
        tokio::time::sleep(backoff).await;
        backoff = (backoff * 2).min(MAX_BACKOFF);
    }
}

/// One round of upstream's compaction scheme: whoever moves `compact_rev_key` from version
/// `seen` to `seen + 1` compacts up to `rev` (the revision recorded by the previous round),
/// so between rounds at least one interval of history stays. Returns the key's version and the
/// current revision for the next round.
async fn compact_round(kv: &mut KvClient, seen: i64, rev: Revision, limit: Duration) -> Result<(i64, Revision), StoreError> {
    let txn = Txn::new()
        .when([Compare::version(COMPACT_REV_KEY, CompareOp::Equal, seen)])
        .and_then([TxnOp::put(COMPACT_REV_KEY, rev.to_string(), None)])
        .or_else([TxnOp::get(COMPACT_REV_KEY, None)]);
    let resp = timed(limit, "compaction bookkeeping", kv.txn(txn)).await?;
    let current = resp.header().map(|h| h.revision()).unwrap_or(0);
    if !resp.succeeded() {
        // Another API server compacted this round; follow its count.
        let version = resp
            .op_responses()
            .into_iter()
            .find_map(|r| match r {
                TxnOpResponse::Get(g) => g.kvs().first().map(|kv| kv.version()),
                _ => None,
            })
            .unwrap_or(0);
        return Ok((version, current));
    }
    if rev > 0 {
        match tokio::time::timeout(limit, kv.compact(rev, None)).await {
            Ok(Ok(_)) => tracing::info!(revision = rev, "compacted etcd"),
            Ok(Err(e)) if is_compacted(&e) => {}
            Ok(Err(e)) => return Err(etcd_err(e)),
            Err(_) => return Err(StoreError::Io("etcd: compaction timed out".into())),
        }
    }
    Ok((seen + 1, current))
}

async fn compactor(mut kv: KvClient, interval: Duration, limit: Duration) {
    let (mut seen, mut rev) = (0, 0);
    loop {
        tokio::time::sleep(interval).await;
        match compact_round(&mut kv, seen, rev, limit).await {
            Ok((s, r)) => (seen, rev) = (s, r),
            Err(e) => tracing::warn!(error = %e, "etcd compaction failed"),
        }
    }
}

impl Store for EtcdStore {
    fn revision(&self) -> Revision {
        self.cache.revision()
    }

    fn acknowledged(&self) -> Revision {
        self.cache.revision().max(self.acked.latest())
    }

    fn wait_for(&self, rev: Revision, within: std::time::Duration) -> BoxFuture<'_, bool> {
        // the cache's progress moves with events and with progress notifications alike
        Box::pin(self.cache.wait_for(rev, within))
    }

    fn get<'a>(&'a self, key: &'a str) -> BoxFuture<'a, Result<Option<Record>, StoreError>> {
        Box::pin(async move {
            if let Some(rev) = self.acked.pending(key, self.cache.revision()) {
                self.caught_up(rev, "get").await;
            }
            Ok(self.cache.get(key))
        })
    }

    fn list<'a>(&'a self, prefix: &'a str) -> BoxFuture<'a, Result<Listing, StoreError>> {
        Box::pin(async move {
            self.caught_up(self.acked.latest(), "list").await;
            Ok(self.cache.list(prefix))
        })
    }

    fn write(&self, op: Op) -> BoxFuture<'_, Result<Record, StoreError>> {
        Box::pin(self.do_write(op))
    }

    fn watch(&self, after: Revision) -> Result<Watch, StoreError> {
        self.cache.watch(after)
    }

    fn oldest_watchable(&self) -> Revision {
        self.cache.oldest_watchable()
    }

    fn get_latest<'a>(&'a self, key: &'a str) -> BoxFuture<'a, Result<Option<Record>, StoreError>> {
        Box::pin(async move {
            let fresh = self.freshness().await;
            let got = match fresh {
                Fresh::Cache => self.get(key).await,
                Fresh::Etcd => self.get_from_etcd(key).await,
            };
            self.count_read(key, fresh, got.is_ok());
            got
        })
    }

    fn list_latest<'a>(&'a self, prefix: &'a str) -> BoxFuture<'a, Result<Listing, StoreError>> {
        Box::pin(async move {
            let fresh = self.freshness().await;
            let got = match fresh {
                Fresh::Cache => self.list(prefix).await,
                Fresh::Etcd => self.list_from_etcd(prefix).await,
            };
            self.count_read(prefix, fresh, got.is_ok());
            got
        })
    }

    fn list_at<'a>(&'a self, prefix: &'a str, rev: Revision) -> BoxFuture<'a, Result<Listing, StoreError>> {
        Box::pin(async move {
            let eprefix = self.layout.to_etcd(prefix).ok_or_else(|| StoreError::InvalidValue(format!("no etcd key for {prefix}")))?;
            let mut kv = self.kv.clone();
            match load_prefix(&mut kv, &self.layout, self.cache.indexer(), &eprefix, rev, self.request_timeout).await {
                Ok((mut records, _)) => {
                    records.retain(|r| r.key.starts_with(prefix));
                    records.sort_by(|a, b| a.key.cmp(&b.key));
                    Ok(Listing { records, revision: rev })
                }
                Err(e) if is_compacted(&e) => Err(StoreError::Compacted { requested: rev, oldest: self.oldest_watchable() }),
                Err(e) => Err(etcd_err(e)),
            }
        })
    }
}

impl EtcdStore {
    /// Where a consistent read (upstream's consistent read from the watch cache) is answered
    /// from: etcd's current revision (a linearizable count-only range, one round trip), then
    /// the cache if it has applied that revision. Events in flight arrive in milliseconds; when
    /// the cache has not reached the revision after [`SYNC_FIRST_WAIT`], a watch over every
    /// key from the cache's revision tells whether only keys outside the prefix moved it
    /// (etcd's compaction key, another tenant: no event of the cache's watch brings those):
    /// then the cache is current, and later reads at that revision do not ask again.
    /// Otherwise the cache gets until [`SYNC_WAIT`] and the read goes to etcd, as upstream
    /// falls back to etcd when its cache does not catch up. (Upstream asks etcd for a progress
    /// notification instead of the watch; etcd before 3.4.25 may send one ahead of events
    /// still in flight (etcd#15220), and Debian 12 ships 3.4.23.) When etcd cannot tell its
    /// revision (no quorum, unreachable) the cache answers as it is: reads stay available, as
    /// docs/operations.md says.
    async fn freshness(&self) -> Fresh {
        use std::sync::atomic::Ordering;
        let quiet = self.probe_failed.lock().unwrap_or_else(|p| p.into_inner()).is_some_and(|t| t.elapsed() < PROBE_QUIET);
        if quiet {
            return Fresh::Cache;
        }
        let probe = GetOptions::new().with_count_only();
        let answer = read_retrying(SYNC_PROBE_TIMEOUT, "revision probe", || {
            let (mut kv, range, probe) = (self.kv.clone(), self.layout.range(), probe.clone());
            async move { kv.get(range, Some(probe)).await }
        })
        .await;
        let current = match answer {
            Ok(resp) => resp.header().map(|h| h.revision()).unwrap_or(0),
            Err(e) => {
                tracing::warn!(error = %e, "etcd did not tell its revision; reading from the watch cache as it is");
                *self.probe_failed.lock().unwrap_or_else(|p| p.into_inner()) = Some(Instant::now());
                return Fresh::Cache;
            }
        };
        if self.cache.revision() >= current || self.unreached.load(Ordering::Acquire) == current {
            return Fresh::Cache;
        }
        if self.cache.wait_for(current, SYNC_FIRST_WAIT).await {
            return Fresh::Cache;
        }
        match moved_outside_only(&self.client, &self.layout, self.cache.revision() + 1, current, SYNC_PROBE_TIMEOUT).await {
            Ok(true) => {
                tracing::debug!(etcd = current, cache = self.cache.revision(), "only keys outside the prefix moved etcd's revision");
                self.unreached.store(current, Ordering::Release);
                return Fresh::Cache;
            }
            Ok(false) => {}
            Err(e) => tracing::debug!(error = %e, "could not tell what moved etcd's revision"),
        }
        if self.cache.wait_for(current, SYNC_WAIT).await {
            return Fresh::Cache;
        }
        tracing::debug!(etcd = current, cache = self.cache.revision(), "the watch cache is behind etcd; reading from etcd");
        Fresh::Etcd
    }

    /// A linearizable get of one key from etcd.
    async fn get_from_etcd(&self, key: &str) -> Result<Option<Record>, StoreError> {
        let ekey = self.layout.to_etcd(key).ok_or_else(|| StoreError::InvalidValue(format!("no etcd key for {key}")))?;
        let resp = read_retrying(self.request_timeout, "consistent get", || {
            let (mut kv, ekey) = (self.kv.clone(), ekey.clone());
            async move { kv.get(ekey, None).await }
        })
        .await
        .map_err(etcd_err)?;
        match resp.kvs().first() {
            None => Ok(None),
            Some(kv) => record_from_stored(Arc::from(key), kv.create_revision(), kv.mod_revision(), kv.value(), self.cache.indexer()).map(Some),
        }
    }

    /// A linearizable list of a prefix from etcd (in pages of one snapshot).
    async fn list_from_etcd(&self, prefix: &str) -> Result<Listing, StoreError> {
        let eprefix = self.layout.to_etcd(prefix).ok_or_else(|| StoreError::InvalidValue(format!("no etcd key for {prefix}")))?;
        let mut kv = self.kv.clone();
        let (mut records, revision) =
            load_prefix(&mut kv, &self.layout, self.cache.indexer(), &eprefix, 0, self.request_timeout).await.map_err(etcd_err)?;
        records.retain(|r| r.key.starts_with(prefix));
        records.sort_by(|a, b| a.key.cmp(&b.key));
        Ok(Listing { records, revision })
    }

    fn count_read(&self, key: &str, fresh: Fresh, success: bool) {
        use std::sync::atomic::Ordering;
        let (counter, fallback) = match fresh {
            Fresh::Cache => (&self.reads.from_cache, "false"),
            Fresh::Etcd => (&self.reads.from_etcd, "true"),
        };
        counter.fetch_add(1, Ordering::Relaxed);
        let success = if success { "true" } else { "false" };
        crate::metrics::CONSISTENT_READS.inc(&[fallback, &resource_of(key), success]);
    }

    /// How this server's consistent reads were answered so far.
    pub fn consistent_reads(&self) -> &ConsistentReads {
        &self.reads
    }
}

/// Upstream's `resource` label of an API key: `pods`, `deployments.apps`.
fn resource_of(key: &str) -> String {
    let mut parts = key.trim_start_matches('/').split('/');
    match (parts.next(), parts.next()) {
        (Some("core"), Some(r)) => r.to_string(),
        (Some(g), Some(r)) => format!("{r}.{g}"),
        _ => String::new(),
    }
}

/// Whether every change in revisions `from..=until` is outside the layout: a watch over every
/// key from `from` (every revision has at least one event there), ended at the first change
/// inside the layout.
async fn moved_outside_only(client: &Client, layout: &KeyLayout, from: Revision, until: Revision, limit: Duration) -> Result<bool, StoreError> {
    if from > until {
        return Ok(true);
    }
    let mut history = History::open(client, from, until, limit).await?;
    loop {
        let resp = history.next().await?;
        let mut reached = 0;
        for kv in resp.events().iter().filter_map(|e| e.kv()) {
            if kv.mod_revision() > until {
                return Ok(true);
            }
            if layout.from_etcd(kv.key()).is_some() {
                return Ok(false);
            }
            reached = kv.mod_revision();
        }
        if reached >= until {
            return Ok(true);
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn layouts_map_keys_both_ways() {
        let v = KeyLayout::verbatim("/registry/");
        assert_eq!(v.to_etcd("/core/pods/ns/a").unwrap(), "/registry/core/pods/ns/a");
        assert_eq!(v.from_etcd(b"/registry/core/pods/ns/a").unwrap(), "/core/pods/ns/a");
        assert_eq!(v.from_etcd(b"/registryx/a"), None);
        assert_eq!(v.from_etcd(b"/other/a"), None);

        let m = KeyLayout::mapped(
            "/registry",
            vec![
                ("/core/nodes/".into(), "minions/".into()),
                ("/core/services/".into(), "services/specs/".into()),
                ("/core/endpoints/".into(), "services/endpoints/".into()),
                ("/apps/deployments/".into(), "deployments/".into()),
            ],
        );
        assert_eq!(m.to_etcd("/core/nodes/n1").unwrap(), "/registry/minions/n1");
        assert_eq!(m.to_etcd("/core/services/default/kubernetes").unwrap(), "/registry/services/specs/default/kubernetes");
        assert_eq!(m.to_etcd("/apps/deployments/a/b").unwrap(), "/registry/deployments/a/b");
        assert_eq!(m.to_etcd("/batch/jobs/a/b"), None);
        for key in ["/core/nodes/n1", "/core/services/default/k", "/core/endpoints/default/k", "/apps/deployments/a/b"] {
            assert_eq!(m.from_etcd(m.to_etcd(key).unwrap().as_bytes()).unwrap(), key);
        }
        // keys ferro does not write under the prefix
        assert_eq!(m.from_etcd(b"/registry/secrets/a/b"), None);
        assert_eq!(m.from_etcd(b"/registry/minions/"), None);
        assert_eq!(m.from_etcd(b"/registry"), None);
        // custom resources: upstream's <prefix>/<group>/<plural>/...
        assert_eq!(m.to_etcd("/example.com/widgets/ns/a").unwrap(), "/registry/example.com/widgets/ns/a");
        assert_eq!(m.from_etcd(b"/registry/example.com/widgets/ns/a").unwrap(), "/example.com/widgets/ns/a");
        assert_eq!(m.from_etcd(b"/registry/example.com/widgets"), None);
        assert_eq!(m.to_etcd("/example.com/widgets/").unwrap(), "/registry/example.com/widgets/");
        assert_eq!(m.range(), "/registry/");
    }

    #[test]
    fn acknowledged_writes_are_waited_for_until_the_cache_has_them() {
        let acked = Acked::default();
        let a: Arc<str> = Arc::from("/core/pods/default/a");
        let b: Arc<str> = Arc::from("/core/pods/default/b");
        assert_eq!((acked.pending(&a, 0), acked.latest()), (None, 0));
        acked.note(&a, 5, 3);
        acked.note(&b, 7, 3);
        // an older answer for a key never lowers what a read waits for
        acked.note(&a, 4, 3);
        assert_eq!((acked.pending(&a, 3), acked.pending(&b, 3), acked.latest()), (Some(5), Some(7), 7));
        // the cache passed a: its entry goes, b still waits
        assert_eq!((acked.pending(&a, 6), acked.pending(&b, 6)), (None, Some(7)));
        assert!(!acked.keys.lock().unwrap().contains_key(&a));
        // a conflict's revision makes reads of the key wait but lists do not
        let c: Arc<str> = Arc::from("/core/pods/default/c");
        acked.note_key(&c, 9, 6);
        assert_eq!((acked.pending(&c, 6), acked.latest()), (Some(9), 7));
        acked.note_key(&c, 5, 6);
        assert_eq!(acked.pending(&c, 6), Some(9));
        // one the cache has already: nothing to wait for, nothing kept
        let d: Arc<str> = Arc::from("/core/pods/default/d");
        acked.note_key(&d, 6, 6);
        assert!(!acked.keys.lock().unwrap().contains_key(&d));
        // the map sweeps what the cache passed once it grows
        for i in 0..ACKED_SWEEP as i64 + 10 {
            acked.note(&Arc::from(format!("/k/{i}")), 10 + i, 9);
        }
        acked.note(&Arc::from("/k/last"), 1000, 10 + ACKED_SWEEP as i64);
        assert!(acked.keys.lock().unwrap().len() <= 12, "{}", acked.keys.lock().unwrap().len());
        assert_eq!(acked.latest(), 1000);
    }

    #[test]
    fn consistent_reads_are_counted_by_upstreams_resource_names() {
        assert_eq!(resource_of("/core/pods/default/a"), "pods");
        assert_eq!(resource_of("/core/nodes/"), "nodes");
        assert_eq!(resource_of("/apps/deployments/ns/"), "deployments.apps");
        assert_eq!(resource_of("/example.com/widgets/ns/a"), "widgets.example.com");
        assert_eq!(resource_of("/"), "");
    }

    #[test]
    fn reads_are_retried_when_a_member_is_unavailable_and_only_then() {
        let unavailable = || etcd_client::Error::GRpcStatus(tonic::Status::unavailable("etcdserver: no leader"));
        assert!(read_retryable(&unavailable()));
        assert!(!read_retryable(&etcd_client::Error::GRpcStatus(tonic::Status::invalid_argument("bad range"))));
        assert!(!read_retryable(&etcd_client::Error::GRpcStatus(tonic::Status::out_of_range("compacted"))));
        let rt = tokio::runtime::Builder::new_current_thread().enable_time().start_paused(true).build().unwrap();
        rt.block_on(async {
            // two members refuse, the third answers
            let tries = std::cell::Cell::new(0);
            let got = read_retrying(Duration::from_secs(5), "get", || {
                tries.set(tries.get() + 1);
                let n = tries.get();
                async move { if n < 3 { Err(unavailable()) } else { Ok(n) } }
            })
            .await;
            assert_eq!(got.unwrap(), 3);
            // an answer that is not Unavailable is returned at once
            tries.set(0);
            let got: Result<(), _> = read_retrying(Duration::from_secs(5), "get", || {
                tries.set(tries.get() + 1);
                async { Err(etcd_client::Error::GRpcStatus(tonic::Status::out_of_range("compacted"))) }
            })
            .await;
            assert!(is_compacted(&got.unwrap_err()));
            assert_eq!(tries.get(), 1);
            // nobody answers: the last error once the limit is near, not a try after it
            let start = tokio::time::Instant::now();
            let got: Result<(), _> = read_retrying(Duration::from_secs(2), "get", || async { Err(unavailable()) }).await;
            assert!(got.unwrap_err().to_string().contains("no leader"));
            assert!(start.elapsed() <= Duration::from_secs(2));
        });
    }

    #[test]
    fn only_refused_connections_count_as_never_sent() {
        let status = |kind: std::io::ErrorKind| {
            etcd_client::Error::GRpcStatus(tonic::Status::from_error(Box::new(std::io::Error::new(kind, "x"))))
        };
        assert!(never_sent(&status(std::io::ErrorKind::ConnectionRefused)));
        // a reset or a timeout may come after etcd applied the write
        assert!(!never_sent(&status(std::io::ErrorKind::ConnectionReset)));
        assert!(!never_sent(&status(std::io::ErrorKind::TimedOut)));
        assert!(!never_sent(&etcd_client::Error::GRpcStatus(tonic::Status::unavailable(
            "etcdserver: request timed out, possibly due to previous leader failure"
        ))));
    }

    #[test]
    fn stored_values_drop_the_resource_version_and_prefix_ends() {
        let v = serde_json::json!({"metadata": {"name": "a", "resourceVersion": "7"}, "x": 1});
        let indexer = super::super::embedded::labels_only();
        assert_eq!(&Prepared::new("/a", v, &indexer).unwrap().stored()[..], br#"{"metadata":{"name":"a"},"x":1}"#);
        assert!(Prepared::new("/a", serde_json::json!([1]), &indexer).is_err());
        assert_eq!(prefix_end("/registry/"), b"/registry0".to_vec());
    }
}
