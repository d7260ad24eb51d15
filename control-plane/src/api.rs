//! The REST semantics of the API server over the store: create, get, list, watch, update,
//! patch, delete and their preconditions, independent of HTTP.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use base64::Engine as _;
use serde_json::{json, Value};

use crate::alloc::{AllocError, IpAllocator, PortAllocator};
use crate::service_alloc::{ClaimError, Item, Owner, ServiceAllocations};
use crate::error::ApiError;
use crate::managed;
use crate::resources::{self, Resource, Sub};
use crate::selector::{FieldSelector, LabelSelector};
use crate::store::{Event, EventKind, Op, Record, Revision, Store, StoreError};
use crate::strategy;
use crate::validation::FieldError;

/// Query options of list and watch.
#[derive(Debug, Default, Clone)]
pub struct ListOptions {
    pub label_selector: Option<String>,
    pub field_selector: Option<String>,
    pub limit: Option<usize>,
    pub continue_token: Option<String>,
    pub resource_version: Option<String>,
    pub timeout_seconds: Option<u64>,
    pub allow_bookmarks: bool,
    pub send_initial_events: bool,
}

/// Parsed selectors of a request.
pub struct Filter {
    pub labels: LabelSelector,
    pub fields: FieldSelector,
    pub namespace: Option<String>,
}

impl Filter {
    pub fn new(res: &Resource, ns: Option<&str>, opts: &ListOptions) -> Result<Filter, ApiError> {
        let labels = match opts.label_selector.as_deref() {
            Some(s) => LabelSelector::parse(s).map_err(|e| ApiError::bad_request(e.to_string()))?,
            None => LabelSelector::everything(),
        };
        let fields = FieldSelector::parse(opts.field_selector.as_deref().unwrap_or(""))
            .map_err(|e| ApiError::bad_request(e.to_string()))?;
        let supported = strategy::selectable_fields(res);
        for f in fields.fields() {
            if f != "metadata.name" && f != "metadata.namespace" && !supported.contains(&f) {
                return Err(ApiError::bad_request(format!(
                    "field label not supported: {f}"
                )));
            }
        }
        Ok(Filter { labels, fields, namespace: ns.map(str::to_string) })
    }

    pub fn matches(&self, r: &Record) -> bool {
        self.labels.matches(&r.attrs.labels)
            && self.fields.matches(|f| r.attrs.field(f).map(str::to_string))
    }
}

/// A page of a list.
pub struct ListPage {
    pub records: Vec<Record>,
    pub revision: Revision,
    pub continue_token: Option<String>,
    pub remaining: Option<i64>,
}

/// One watch notification, ready for the wire.
#[derive(Debug, Clone)]
pub enum WatchItem {
    Event { kind: &'static str, object: bytes::Bytes },
    Bookmark { revision: Revision, initial_events_end: bool },
    Error(ApiError),
}

/// Options of a delete.
#[derive(Debug, Default, Clone)]
pub struct DeleteOptions {
    pub grace_period_seconds: Option<i64>,
    pub propagation_policy: Option<String>,
    pub orphan_dependents: Option<bool>,
    pub precondition_uid: Option<String>,
    pub precondition_rv: Option<String>,
    pub dry_run: bool,
}

/// The patch formats of the PATCH verb.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PatchType {
    Json,
    Merge,
    Strategic,
    Apply,
}

impl PatchType {
    pub fn from_content_type(ct: &str) -> Option<PatchType> {
        match ct.split(';').next().unwrap_or("").trim() {
            "application/json-patch+json" => Some(PatchType::Json),
            "application/merge-patch+json" => Some(PatchType::Merge),
            "application/strategic-merge-patch+json" => Some(PatchType::Strategic),
            "application/apply-patch+yaml" | "application/apply-patch+json" => Some(PatchType::Apply),
            _ => None,
        }
    }
}

struct Snapshot {
    taken: Instant,
    records: Arc<Vec<Record>>,
}

pub struct Api {
    pub store: Arc<dyn Store>,
    /// Service ClusterIPs and NodePorts, claimed in the store (shared by every API server).
    pub allocations: ServiceAllocations,
    snapshots: Mutex<HashMap<(String, Revision), Snapshot>>,
}

const SNAPSHOT_TTL: Duration = Duration::from_secs(300);
const MAX_SNAPSHOTS: usize = 64;

fn now_rfc3339() -> String {
    jiff::Timestamp::now().round(jiff::Unit::Second).map(|t| t.to_string()).unwrap_or_default()
}

fn generated_suffix() -> String {
    use rand::Rng;
    // upstream's alphabet: no vowels, no confusable digits
    const ALPHABET: &[u8] = b"bcdfghjklmnpqrstvwxz2456789";
    let mut rng = rand::rng();
    (0..5).map(|_| ALPHABET[rng.random_range(0..ALPHABET.len())] as char).collect()
}

fn meta_str<'a>(obj: &'a Value, field: &str) -> Option<&'a str> {
    obj.get("metadata").and_then(|m| m.get(field)).and_then(|v| v.as_str())
}

fn set_meta(obj: &mut Value, field: &str, value: Value) {
    if !obj.get("metadata").map(|m| m.is_object()).unwrap_or(false) {
        obj["metadata"] = json!({});
    }
    obj["metadata"][field] = value;
}

fn remove_meta(obj: &mut Value, field: &str) {
    if let Some(Value::Object(m)) = obj.get_mut("metadata") {
        m.remove(field);
    }
}

/// Sets metadata.managedFields (removed when there are none).
fn set_managed(obj: &mut Value, entries: &[managed::Entry]) {
    let list = managed::entries_to_json(entries);
    if list.as_array().is_some_and(|a| a.is_empty()) {
        remove_meta(obj, "managedFields");
    } else {
        set_meta(obj, "managedFields", list);
    }
}

/// A namespace's spec.finalizers (empty for every other kind).
fn spec_finalizers(obj: &Value) -> Vec<Value> {
    obj.pointer("/spec/finalizers").and_then(|f| f.as_array()).cloned().unwrap_or_default()
}

fn finalizers(obj: &Value) -> Vec<String> {
    obj.pointer("/metadata/finalizers")
        .and_then(|f| f.as_array())
        .map(|a| a.iter().filter_map(|s| s.as_str().map(str::to_string)).collect())
        .unwrap_or_default()
}


/// NodeRestriction's label rule: a node writing a Node (its own: the Node authorizer saw to
/// that) may not add, change or remove restricted labels.
fn admit_node_labels(res: &Resource, name: &str, old: Option<&Value>, new: &Value) -> Result<(), ApiError> {
    if !res.is("nodes") || res.custom.is_some() {
        return Ok(());
    }
    let Some(user) = crate::rbac::escalation::requesting_user() else { return Ok(()) };
    if user.node_name().is_none() || user.is_admin() {
        return Ok(());
    }
    let changed = crate::auth::node_label_changes(old, new);
    if changed.is_empty() {
        return Ok(());
    }
    Err(ApiError::forbidden("nodes", name, format!("is not allowed to modify labels: {}", changed.join(", "))))
}

/// Which endpoint an update came through: the main resource, `/status`, or a
/// CertificateSigningRequest's `/approval`; each may change a different part of the object.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Endpoint {
    Main,
    Status,
    Approval,
}

impl Endpoint {
    pub fn of(sub: Option<Sub>) -> Endpoint {
        match sub {
            Some(Sub::Status) => Endpoint::Status,
            Some(Sub::Approval) => Endpoint::Approval,
            _ => Endpoint::Main,
        }
    }

    /// The subresource's name, as managedFields records it.
    pub fn subresource(self) -> &'static str {
        match self {
            Endpoint::Main => "",
            Endpoint::Status => "status",
            Endpoint::Approval => "approval",
        }
    }
}

impl Api {
    pub async fn new(
        store: Arc<dyn Store>,
        ips: IpAllocator,
        ports: PortAllocator,
    ) -> Result<Api, ApiError> {
        let api = Api {
            allocations: ServiceAllocations::new(store.clone(), ips, ports),
            store,
            snapshots: Mutex::new(HashMap::new()),
        };
        // Claims for Services stored before claims existed; the first leak sighting.
        api.allocations.repair().await?;
        Ok(api)
    }

    /// Upstream's PersistentVolumeClaimResize admission and resize validation: a claim's storage
    /// request may only grow, and only for a bound claim whose class allows expansion.
    async fn admit_claim_resize(&self, old: &Value, new: &Value) -> Result<Vec<FieldError>, ApiError> {
        let request = |v: &Value| v.pointer("/spec/resources/requests/storage").and_then(|q| q.as_str()).map(String::from);
        let (Some(before), Some(after)) = (request(old), request(new)) else { return Ok(Vec::new()) };
        let (Some(b), Some(a)) = (k8s_semantics::quantity::scaled(&before, 1), k8s_semantics::quantity::scaled(&after, 1)) else {
            return Ok(Vec::new());
        };
        if a == b {
            return Ok(Vec::new());
        }
        let field = "spec.resources.requests.storage";
        if a < b {
            return Ok(vec![FieldError::forbidden(field, "field can not be less than previous value")]);
        }
        let bound = old.pointer("/spec/volumeName").and_then(|v| v.as_str()).is_some_and(|v| !v.is_empty());
        let class = old.pointer("/spec/storageClassName").and_then(|v| v.as_str()).unwrap_or("");
        let expandable = if bound && !class.is_empty() {
            let classes = resources::find("storage.k8s.io", "v1", "storageclasses").ok_or_else(|| ApiError::internal("no storageclasses"))?;
            match self.current(&classes.key(None, class)).await? {
                Some(r) => r.json()?.get("allowVolumeExpansion").and_then(|v| v.as_bool()) == Some(true),
                None => false,
            }
        } else {
            false
        };
        if !expandable {
            return Ok(vec![FieldError::forbidden(
                field,
                "only dynamically provisioned pvc can be resized and the storageclass that provisions the pvc must support resize",
            )]);
        }
        Ok(Vec::new())
    }

    /// Upstream's DefaultStorageClass admission: a claim created without a class (no
    /// `spec.storageClassName`, no beta annotation) gets the default StorageClass, the newest
    /// one when several are marked default. `storageClassName: ""` asks for no class and stays.
    async fn default_storage_class(&self, claim: &mut Value) -> Result<(), ApiError> {
        let has_class = claim.pointer("/spec/storageClassName").is_some_and(|c| !c.is_null())
            || claim.pointer("/metadata/annotations/volume.beta.kubernetes.io~1storage-class").is_some();
        if has_class {
            return Ok(());
        }
        let classes = resources::find("storage.k8s.io", "v1", "storageclasses").ok_or_else(|| ApiError::internal("no storageclasses"))?;
        let listing = self.store.list(&classes.prefix(None)).await?;
        let mut defaults = Vec::new();
        for r in &listing.records {
            let c = r.json()?;
            let marked = ["storageclass.kubernetes.io~1is-default-class", "storageclass.beta.kubernetes.io~1is-default-class"]
                .iter()
                .any(|k| c.pointer(&format!("/metadata/annotations/{k}")).and_then(|v| v.as_str()) == Some("true"));
            if marked {
                let created = c.pointer("/metadata/creationTimestamp").and_then(|v| v.as_str()).unwrap_or("").to_string();
                let name = c.pointer("/metadata/name").and_then(|v| v.as_str()).unwrap_or("").to_string();
                defaults.push((created, name));
            }
        }
        // Newest first; among equals, the name sorting first (upstream's tie-break).
        defaults.sort_by(|a, b| b.0.cmp(&a.0).then(a.1.cmp(&b.1)));
        if let (Some((_, name)), Some(spec)) = (defaults.first(), claim.get_mut("spec").and_then(|s| s.as_object_mut())) {
            spec.insert("storageClassName".into(), json!(name));
        }
        Ok(())
    }

    pub fn service_ip_range_first(&self) -> IpAddr {
        self.allocations.first_ip()
    }

    /// Fails unless the namespace exists and is not terminating (upstream's NamespaceLifecycle,
    /// which also looks a namespace its informer does not hold up live before refusing: one
    /// created through another replica a moment ago exists).
    async fn check_namespace(&self, ns: &str, creating: bool) -> Result<(), ApiError> {
        let nsres = resources::find("", "v1", "namespaces").ok_or_else(|| ApiError::internal("no namespaces"))?;
        match self.current(&nsres.key(None, ns)).await? {
            None => Err(ApiError::not_found("namespaces", ns)),
            Some(r) if creating => {
                let v = r.json()?;
                if v.pointer("/metadata/deletionTimestamp").is_some() {
                    Err(ApiError::forbidden(
                        "",
                        "",
                        format!("unable to create new content in namespace {ns} because it is being terminated"),
                    ))
                } else {
                    Ok(())
                }
            }
            Some(_) => Ok(()),
        }
    }

    pub async fn get(&self, res: &Resource, ns: Option<&str>, name: &str) -> Result<Record, ApiError> {
        self.store
            .get(&res.key(ns, name))
            .await?
            .ok_or_else(|| ApiError::not_found(&res.group_resource(), name))
    }

    /// The stored object a write starts from: the cache's, and when the cache has none, the
    /// most recent state's (another API server may have created it a moment ago and its watch
    /// event not reached this one's cache yet: a delete or patch right after a create through
    /// another replica is not "not found"). An older version in the cache costs nothing more:
    /// the guarded write is refused and the retry reads after it.
    async fn current(&self, key: &str) -> Result<Option<Record>, StoreError> {
        match self.store.get(key).await? {
            Some(r) => Ok(Some(r)),
            None => self.store.get_latest(key).await,
        }
    }

    /// The stored object a write (a subresource's read-modify-write) starts from (see
    /// [`Api::current`]).
    pub async fn get_for_write(&self, res: &Resource, ns: Option<&str>, name: &str) -> Result<Record, ApiError> {
        self.current(&res.key(ns, name)).await?.ok_or_else(|| ApiError::not_found(&res.group_resource(), name))
    }

    /// A get of the most recent state (no `resourceVersion`): what any replica acknowledged
    /// before the request ([`Store::get_latest`]).
    pub async fn get_latest(&self, res: &Resource, ns: Option<&str>, name: &str) -> Result<Record, ApiError> {
        self.store
            .get_latest(&res.key(ns, name))
            .await?
            .ok_or_else(|| ApiError::not_found(&res.group_resource(), name))
    }

    pub async fn list(
        &self,
        res: &Resource,
        ns: Option<&str>,
        opts: &ListOptions,
    ) -> Result<ListPage, ApiError> {
        let filter = Filter::new(res, ns, opts)?;
        let prefix = res.prefix(ns);
        let (records, revision, start) = match opts.continue_token.as_deref().filter(|c| !c.is_empty()) {
            Some(token) => {
                let (rev, start) = decode_continue(token)?;
                let snap = {
                    let snaps = self.snapshots.lock().unwrap_or_else(|p| p.into_inner());
                    snaps.get(&(prefix.clone(), rev)).map(|s| s.records.clone())
                };
                match snap {
                    Some(records) => (records, rev, Some(start)),
                    None if rev == self.store.revision() => {
                        (Arc::new(self.store.list(&prefix).await?.records), rev, Some(start))
                    }
                    // the first page came from another API server (or this one forgot it):
                    // the store at that revision, while it has it
                    None => match self.store.list_at(&prefix, rev).await {
                        Ok(listing) => (Arc::new(listing.records), rev, Some(start)),
                        Err(StoreError::Compacted { .. }) => return Err(ApiError::gone("The provided continue parameter is too old to display a consistent list result. You can start a new list without the continue parameter.")),
                        Err(e) => return Err(e.into()),
                    },
                }
            }
            None => {
                if let Some(rv) = opts.resource_version.as_deref().filter(|v| !v.is_empty() && *v != "0") {
                    let rv: Revision = rv.parse().map_err(|_| {
                        ApiError::bad_request(format!("invalid resource version: {rv}"))
                    })?;
                    self.reach(rv).await?;
                }
                let listing = if opts.resource_version.as_deref().is_none_or(str::is_empty) {
                    // the most recent state: what any replica acknowledged before this request
                    self.store.list_latest(&prefix).await?
                } else {
                    self.store.list(&prefix).await?
                };
                (Arc::new(listing.records), listing.revision, None)
            }
        };
        let begin = match &start {
            Some(k) => records.partition_point(|r| &*r.key <= k.as_str()),
            None => 0,
        };
        let limit = opts.limit.filter(|l| *l > 0).unwrap_or(usize::MAX);
        let mut out = Vec::new();
        let mut last_key = None;
        let mut more = false;
        for r in records[begin..].iter() {
            if !filter.matches(r) {
                continue;
            }
            if out.len() == limit {
                more = true;
                break;
            }
            last_key = Some(r.key.to_string());
            out.push(r.clone());
        }
        let mut page = ListPage { records: out, revision, continue_token: None, remaining: None };
        if more {
            if let Some(last) = last_key {
                page.continue_token = Some(encode_continue(revision, &last));
                if filter.labels.is_empty() && filter.fields.is_empty() {
                    let after = records.partition_point(|r| *r.key <= *last);
                    page.remaining = Some((records.len() - after) as i64);
                }
                let mut snaps = self.snapshots.lock().unwrap_or_else(|p| p.into_inner());
                snaps.retain(|_, s| s.taken.elapsed() < SNAPSHOT_TTL);
                if snaps.len() >= MAX_SNAPSHOTS {
                    if let Some(oldest) = snaps.iter().min_by_key(|(_, s)| s.taken).map(|(k, _)| k.clone()) {
                        snaps.remove(&oldest);
                    }
                }
                snaps.entry((prefix, revision)).or_insert(Snapshot { taken: Instant::now(), records });
            }
        }
        Ok(page)
    }

    /// Starts a watch. Errors here are answered as HTTP errors; a revision too old to watch
    /// from is delivered as an ERROR event (upstream's behaviour), so clients relist.
    /// Like upstream's watch cache: waits up to 3 s for a revision to be readable here.
    async fn reach(&self, rv: Revision) -> Result<(), ApiError> {
        if self.store.wait_for(rv, Duration::from_secs(3)).await {
            Ok(())
        } else {
            Err(ApiError::too_large_resource_version(rv, self.store.revision()))
        }
    }

    pub fn watch(
        self: &Arc<Self>,
        res: &'static Resource,
        ns: Option<&str>,
        opts: &ListOptions,
    ) -> Result<tokio::sync::mpsc::Receiver<WatchItem>, ApiError> {
        let filter = Filter::new(res, ns, opts)?;
        let prefix = res.prefix(ns);
        let (tx, rx) = tokio::sync::mpsc::channel(1024);
        let rv_param = opts.resource_version.clone().unwrap_or_default();
        let initial = rv_param.is_empty() || rv_param == "0" || opts.send_initial_events;
        let requested: Option<Revision> = if rv_param.is_empty() || rv_param == "0" {
            None
        } else {
            Some(rv_param.parse().map_err(|_| {
                ApiError::bad_request(format!("invalid resource version: {rv_param}"))
            })?)
        };
        // With sendInitialEvents the resourceVersion means "not older than": the initial events
        // are the current state, which is at least that recent.
        let from = match requested {
            Some(rv) if opts.send_initial_events => {
                // the listing that makes the initial events waits for every acknowledged write
                let current = self.store.acknowledged();
                if rv > current {
                    return Err(ApiError::too_large_resource_version(rv, current));
                }
                None
            }
            other => other,
        };
        let this = self.clone();
        let timeout = Duration::from_secs(opts.timeout_seconds.unwrap_or(1800).max(1));
        let bookmarks = opts.allow_bookmarks;
        let send_initial_end = opts.send_initial_events && bookmarks;
        tokio::spawn(async move {
            let deadline = tokio::time::sleep(timeout);
            tokio::pin!(deadline);
            let run = this.run_watch(prefix, filter, from, initial, bookmarks, send_initial_end, &tx);
            tokio::select! {
                _ = &mut deadline => {}
                _ = run => {}
                _ = tx.closed() => {}
            }
        });
        Ok(rx)
    }

    #[allow(clippy::too_many_arguments)]
    async fn run_watch(
        &self,
        prefix: String,
        filter: Filter,
        from: Option<Revision>,
        initial: bool,
        bookmarks: bool,
        initial_end: bool,
        tx: &tokio::sync::mpsc::Sender<WatchItem>,
    ) {
        // The initial state is a listing at revision L followed by every event after L.
        let mut initial_records = Vec::new();
        let mut start = match from {
            Some(rev) => rev,
            None => match self.store.list(&prefix).await {
                Ok(listing) => {
                    initial_records = listing.records;
                    listing.revision
                }
                Err(e) => {
                    let _ = tx.send(WatchItem::Error(e.into())).await;
                    return;
                }
            },
        };
        let mut watch = match self.store.watch(start) {
            Ok(w) => w,
            Err(StoreError::Compacted { requested, oldest }) => {
                let _ = tx
                    .send(WatchItem::Error(ApiError::gone(format!(
                        "too old resource version: {requested} ({})",
                        oldest + 1
                    ))))
                    .await;
                return;
            }
            Err(e) => {
                let _ = tx.send(WatchItem::Error(e.into())).await;
                return;
            }
        };
        if initial {
            for r in initial_records.iter().filter(|r| filter.matches(r)) {
                if tx.send(WatchItem::Event { kind: "ADDED", object: r.value.clone() }).await.is_err() {
                    return;
                }
            }
            if initial_end {
                let _ = tx.send(WatchItem::Bookmark { revision: start, initial_events_end: true }).await;
            }
        }
        let mut last_bookmark = Instant::now();
        let handle = |ev: &Event, start: &mut Revision| -> Option<WatchItem> {
            if ev.rev <= *start || !ev.record.key.starts_with(prefix.as_str()) {
                return None;
            }
            *start = ev.rev;
            let now = filter.matches(&ev.record);
            let kind = match ev.kind {
                EventKind::Added => now.then_some("ADDED"),
                EventKind::Deleted => now.then_some("DELETED"),
                EventKind::Modified => {
                    let before = ev.prev.as_ref().map(|p| filter.matches(p)).unwrap_or(now);
                    match (before, now) {
                        (true, true) => Some("MODIFIED"),
                        (false, true) => Some("ADDED"),
                        (true, false) => Some("DELETED"),
                        (false, false) => None,
                    }
                }
            }?;
            Some(WatchItem::Event { kind, object: ev.record.value.clone() })
        };
        for ev in std::mem::take(&mut watch.backlog) {
            if let Some(item) = handle(&ev, &mut start) {
                if tx.send(item).await.is_err() {
                    return;
                }
            }
        }
        let bookmark_every = Duration::from_secs(if cfg!(debug_assertions) { 5 } else { 30 });
        loop {
            let next = tokio::time::timeout(bookmark_every, watch.recv()).await;
            match next {
                Ok(Ok(ev)) => {
                    if let Some(item) = handle(&ev, &mut start) {
                        if tx.send(item).await.is_err() {
                            return;
                        }
                    }
                }
                Ok(Err(tokio::sync::broadcast::error::RecvError::Lagged(_))) => {
                    let _ = tx
                        .send(WatchItem::Error(ApiError::gone(format!(
                            "too old resource version: {start}: the watcher fell behind"
                        ))))
                        .await;
                    return;
                }
                Ok(Err(_)) => return,
                Err(_) => {}
            }
            if bookmarks && last_bookmark.elapsed() >= bookmark_every {
                last_bookmark = Instant::now();
                if tx.send(WatchItem::Bookmark { revision: start, initial_events_end: false }).await.is_err() {
                    return;
                }
            }
        }
    }

    /// Checks apiVersion and kind of a body against the endpoint.
    pub fn check_type(obj: &Value, expect_kind: &str, expect_av: &str) -> Result<(), ApiError> {
        if !obj.is_object() {
            return Err(ApiError::bad_request("the body of the request must be a JSON object"));
        }
        let av = obj.get("apiVersion").and_then(|v| v.as_str()).unwrap_or("");
        let kind = obj.get("kind").and_then(|v| v.as_str()).unwrap_or("");
        if !av.is_empty() && av != expect_av {
            return Err(ApiError::bad_request(format!(
                "the API version in the data ({av}) does not match the expected API version ({expect_av})"
            )));
        }
        if !kind.is_empty() && kind != expect_kind {
            return Err(ApiError::bad_request(format!(
                "the kind in the data ({kind}) does not match the expected kind ({expect_kind})"
            )));
        }
        Ok(())
    }

    /// Typed decoding with upstream's field validation (`Strict` rejects unknown fields, `Warn`
    /// reports them as warnings, `Ignore` drops them silently).
    pub fn decode(
        res: &Resource,
        obj: Value,
        field_validation: &str,
        warnings: &mut Vec<String>,
    ) -> Result<Value, ApiError> {
        if let Some(c) = res.custom {
            return crate::crd::objects::decode(res, c, obj, field_validation, warnings);
        }
        let normalized = (res.normalize)(obj.clone()).map_err(|e| {
            ApiError::bad_request(format!("{} in version \"{}\" cannot be handled as a {}: {e}", res.kind, res.api_version(), res.kind))
        })?;
        if field_validation != "Ignore" {
            let mut unknown = Vec::new();
            unknown_fields(&obj, &normalized, String::new(), &mut unknown);
            if !unknown.is_empty() {
                if field_validation == "Strict" {
                    let list: Vec<String> =
                        unknown.iter().map(|f| format!("unknown field \"{f}\"")).collect();
                    return Err(ApiError::bad_request(format!(
                        "strict decoding error: {}",
                        list.join(", ")
                    )));
                }
                warnings.extend(unknown.into_iter().map(|f| format!("unknown field \"{f}\"")));
            }
        }
        if res.is("customresourcedefinitions") {
            let rules: usize = normalized
                .pointer("/spec/versions")
                .and_then(Value::as_array)
                .into_iter()
                .flatten()
                .filter_map(|v| v.pointer("/schema/openAPIV3Schema"))
                .map(|raw| crate::crd::schema::cel_rules(&crate::crd::schema::Schema::parse(raw, "", &mut Vec::new())))
                .sum();
            if rules > 0 {
                warnings.push(format!(
                    "{rules} x-kubernetes-validations rule(s) are stored but not evaluated: ferro-control-plane does not run CEL; objects are checked against the rest of the schema"
                ));
            }
        }
        Ok(with_type(res, normalized))
    }

    pub async fn create(
        &self,
        res: &'static Resource,
        ns: Option<&str>,
        mut obj: Value,
        dry_run: bool,
    ) -> Result<Record, ApiError> {
        crate::crd::controller::refuse_create(res)?;
        if res.is("customresourcedefinitions") {
            let fins = obj.pointer_mut("/metadata/finalizers");
            match fins.and_then(Value::as_array_mut) {
                Some(f) if f.iter().any(|x| x == crate::crd::CLEANUP_FINALIZER) => {}
                Some(f) => f.push(json!(crate::crd::CLEANUP_FINALIZER)),
                None => set_meta(&mut obj, "finalizers", json!([crate::crd::CLEANUP_FINALIZER])),
            }
        }
        if res.namespaced {
            let ns = ns.ok_or_else(|| ApiError::bad_request("a namespace is required"))?;
            match meta_str(&obj, "namespace") {
                Some(n) if !n.is_empty() && n != ns => {
                    return Err(ApiError::bad_request(
                        "the namespace of the provided object does not match the namespace sent on the request",
                    ))
                }
                _ => set_meta(&mut obj, "namespace", json!(ns)),
            }
            self.check_namespace(ns, true).await?;
        } else {
            remove_meta(&mut obj, "namespace");
        }
        if meta_str(&obj, "name").unwrap_or("").is_empty() {
            match meta_str(&obj, "generateName").filter(|g| !g.is_empty()) {
                Some(g) => {
                    let name = format!("{g}{}", generated_suffix());
                    set_meta(&mut obj, "name", json!(name));
                }
                None => {
                    return Err(ApiError::invalid(
                        res.kind,
                        res.group,
                        "",
                        &[FieldError::required("metadata.name", "name or generateName is required")],
                    ))
                }
            }
        }
        if meta_str(&obj, "resourceVersion").map(|v| !v.is_empty()).unwrap_or(false) {
            return Err(ApiError::bad_request("resourceVersion should not be set on objects to be created"));
        }
        let name = meta_str(&obj, "name").unwrap_or("").to_string();
        set_meta(&mut obj, "uid", json!(uuid::Uuid::new_v4().to_string()));
        set_meta(&mut obj, "creationTimestamp", json!(now_rfc3339()));
        remove_meta(&mut obj, "deletionTimestamp");
        remove_meta(&mut obj, "deletionGracePeriodSeconds");
        let given_fields = obj.pointer("/metadata/managedFields").and_then(Value::as_array).is_some_and(|a| !a.is_empty());
        if !given_fields {
            remove_meta(&mut obj, "managedFields");
        }
        if res.generation {
            set_meta(&mut obj, "generation", json!(1));
        } else {
            remove_meta(&mut obj, "generation");
        }
        if res.is("daemonsets") {
            strategy::daemonset_template_generation(None, &mut obj);
        }
        if res.has(Sub::Status) && !res.is("nodes") {
            if let Some(m) = obj.as_object_mut() {
                m.remove("status");
            }
        }
        strategy::apply_defaults(res, &mut obj);
        // RBAC's escalation check (upstream's policybased storage), before validation as there
        crate::rbac::escalation::admit(res, ns, &obj, None).await?;
        if crate::certificates::is_csr(res) {
            crate::certificates::prepare_create(&mut obj);
            crate::certificates::admit_create(&obj)?;
        }
        admit_node_labels(res, &name, None, &obj)?;
        if res.is("persistentvolumeclaims") {
            self.default_storage_class(&mut obj).await?;
        }
        if res.is("pods") && !dry_run {
            crate::sa_admission::admit_pod(self, ns.unwrap_or("default"), &name, &mut obj).await?;
        }
        let errs = strategy::validate(res, &obj);
        if !errs.is_empty() {
            return Err(ApiError::invalid(res.kind, res.group, &name, &errs));
        }
        let allocated = if res.is("services") {
            self.allocate_service(&mut obj, None, &name, dry_run).await?
        } else {
            Allocated::default()
        };
        // field ownership: the creator owns every field it set (an apply that creates brings
        // its own entry; a client may set managedFields itself, as upstream allows)
        let entries = if given_fields {
            managed::entries_of(&obj)
        } else {
            let mut e = Vec::new();
            let w = managed::writer();
            managed::record_update(&mut e, &json!({}), &obj, managed::shape_of(res), &w.manager, &res.api_version(), "", &now_rfc3339());
            e
        };
        set_managed(&mut obj, &entries);
        if dry_run {
            let existing = self.current(&res.key(ns, &name)).await?;
            if existing.is_some() {
                return Err(ApiError::already_exists(&res.group_resource(), &name));
            }
            let value = bytes::Bytes::from(serde_json::to_vec(&obj).map_err(ApiError::internal)?);
            return Ok(Record {
                key: Arc::from(res.key(ns, &name)),
                create_rev: 0,
                mod_rev: 0,
                value,
                attrs: Arc::new(Default::default()),
            });
        }
        match self.store.write(Op::Create { key: res.key(ns, &name), value: obj }).await {
            Ok(r) => Ok(r),
            Err(e) => {
                self.release(&allocated).await;
                Err(match e {
                    StoreError::AlreadyExists => ApiError::already_exists(&res.group_resource(), &name),
                    other => other.into(),
                })
            }
        }
    }

    /// PUT semantics. `sub` is None for the main resource or Some(Status).
    pub async fn update(
        &self,
        res: &'static Resource,
        ns: Option<&str>,
        name: &str,
        obj: Value,
        endpoint: Endpoint,
        dry_run: bool,
    ) -> Result<(Record, bool), ApiError> {
        let status_endpoint = endpoint != Endpoint::Main;
        match meta_str(&obj, "name") {
            Some(n) if !n.is_empty() && n != name => {
                return Err(ApiError::bad_request(format!(
                    "the name of the object ({n}) does not match the name on the URL ({name})"
                )))
            }
            _ => {}
        }
        if let (Some(ns), Some(n)) = (ns, meta_str(&obj, "namespace")) {
            if !n.is_empty() && n != ns {
                return Err(ApiError::bad_request(
                    "the namespace of the provided object does not match the namespace sent on the request",
                ));
            }
        }
        let key = res.key(ns, name);
        let Some(current) = self.current(&key).await? else {
            if !status_endpoint && res.custom.is_none() && matches!(res.plural, "endpoints" | "leases" | "events" | "endpointslices") {
                let mut obj = obj;
                set_meta(&mut obj, "name", json!(name));
                remove_meta(&mut obj, "resourceVersion");
                return Ok((self.create(res, ns, obj, dry_run).await?, true));
            }
            return Err(ApiError::not_found(&res.group_resource(), name));
        };
        let precondition = match meta_str(&obj, "resourceVersion").filter(|v| !v.is_empty()) {
            Some(v) => Some(v.parse::<Revision>().map_err(|_| {
                ApiError::bad_request(format!("invalid resourceVersion {v:?}"))
            })?),
            None => None,
        };
        if let Some(p) = precondition {
            if p != current.mod_rev {
                return Err(ApiError::stale(&res.group_resource(), name));
            }
        }
        let record = self.update_from(res, ns, name, &current, obj, endpoint, dry_run).await?;
        Ok((record, false))
    }

    /// PUT namespaces/{name}/finalize: changes only spec.finalizers (the namespace
    /// controller removes "kubernetes" once the namespace is empty, which completes its deletion).
    pub async fn finalize_namespace(
        &self,
        res: &'static Resource,
        name: &str,
        obj: Value,
        dry_run: bool,
    ) -> Result<Record, ApiError> {
        let current = self.get(res, None, name).await?;
        let mut new = current.json()?;
        let fins = obj.pointer("/spec/finalizers").cloned().unwrap_or_else(|| json!([]));
        match new.get_mut("spec").and_then(|s| s.as_object_mut()) {
            Some(spec) => {
                spec.insert("finalizers".into(), fins);
            }
            None => new["spec"] = json!({"finalizers": fins}),
        }
        self.update_from(res, None, name, &current, new, Endpoint::Main, dry_run).await
    }

    /// Applies an update computed against `current`. Conflicts with concurrent writers come
    /// back as 409.
    #[allow(clippy::too_many_arguments)]
    async fn update_from(
        &self,
        res: &'static Resource,
        ns: Option<&str>,
        name: &str,
        current: &Record,
        mut obj: Value,
        endpoint: Endpoint,
        dry_run: bool,
    ) -> Result<Record, ApiError> {
        let status_endpoint = endpoint != Endpoint::Main;
        let old = current.json()?;
        // managedFields a client sets itself (and differently) are taken as they are (kubectl
        // moving client-side apply's ownership to its server-side apply manager; an apply's
        // own result); otherwise this write's changes are recorded for its manager
        let given_fields = obj
            .pointer("/metadata/managedFields")
            .filter(|m| m.as_array().is_some_and(|a| !a.is_empty()) && Some(*m) != old.pointer("/metadata/managedFields"))
            .map(|_| managed::entries_of(&obj));
        // Fields the server owns.
        for f in ["uid", "creationTimestamp", "deletionTimestamp", "deletionGracePeriodSeconds", "namespace", "generation", "name"] {
            match old.pointer(&format!("/metadata/{f}")) {
                Some(v) => set_meta(&mut obj, f, v.clone()),
                None => remove_meta(&mut obj, f),
            }
        }
        remove_meta(&mut obj, "managedFields");
        strategy::keep_unchangeable(res, endpoint, &old, &mut obj);
        if crate::certificates::is_csr(res) {
            crate::certificates::prepare_update(endpoint, &old, &mut obj, &now_rfc3339());
        }
        admit_node_labels(res, name, Some(&old), &obj)?;
        if old.pointer("/metadata/deletionTimestamp").is_some() {
            // finalizers may only be removed once deletion started
            let before = finalizers(&old);
            let after = finalizers(&obj);
            if after.iter().any(|f| !before.contains(f)) {
                return Err(ApiError::invalid(
                    res.kind,
                    res.group,
                    name,
                    &[FieldError::forbidden("metadata.finalizers", "no new finalizers can be added if the object is being deleted")],
                ));
            }
        }
        strategy::apply_defaults(res, &mut obj);
        crate::rbac::escalation::admit(res, ns, &obj, Some(&old)).await?;
        if res.generation && !status_endpoint && strategy::spec_changed(&old, &obj) {
            let g = old.pointer("/metadata/generation").and_then(|g| g.as_i64()).unwrap_or(0);
            set_meta(&mut obj, "generation", json!(g + 1));
        }
        if res.is("daemonsets") {
            strategy::daemonset_template_generation(Some(&old), &mut obj);
        }
        let mut errs = strategy::validate(res, &obj);
        errs.extend(strategy::validate_update(res, &old, &obj));
        if res.is("jobs") && status_endpoint {
            errs.extend(crate::job_status::validate_update(&old, &obj));
        }
        if res.is("persistentvolumeclaims") && !status_endpoint {
            errs.extend(self.admit_claim_resize(&old, &obj).await?);
        }
        if crate::certificates::is_csr(res) {
            errs.extend(crate::certificates::validate_update(endpoint, &old, &obj));
            if errs.is_empty() {
                crate::certificates::admit_update(endpoint, &old, &obj).await?;
            }
        }
        if !errs.is_empty() {
            return Err(ApiError::invalid(res.kind, res.group, name, &errs));
        }
        let allocated = if res.is("services") && !status_endpoint {
            self.allocate_service(&mut obj, Some(&old), name, dry_run).await?
        } else {
            Allocated::default()
        };
        let entries = match given_fields {
            Some(e) => e,
            None => {
                let mut e = managed::entries_of(&old);
                let w = managed::writer();
                let sub = endpoint.subresource();
                managed::record_update(&mut e, &old, &obj, managed::shape_of(res), &w.manager, &res.api_version(), sub, &now_rfc3339());
                e
            }
        };
        set_managed(&mut obj, &entries);
        // A no-op update writes nothing (the resourceVersion stays).
        let mut cmp = obj.clone();
        set_meta(&mut cmp, "resourceVersion", json!(current.mod_rev.to_string()));
        if cmp == old {
            self.release(&allocated).await;
            return Ok(current.clone());
        }
        if dry_run {
            let value = bytes::Bytes::from(serde_json::to_vec(&cmp).map_err(ApiError::internal)?);
            return Ok(Record { value, ..current.clone() });
        }
        // The last finalizer gone from an object being deleted: the delete completes (for a
        // namespace, once its spec.finalizers are gone too) — unless a grace period is still
        // running (upstream's ShouldDeleteDuringUpdate): a pod being deleted gracefully stays
        // until its kubelet deletes it with grace 0, whatever is written to it meanwhile.
        let grace_running = old.pointer("/metadata/deletionGracePeriodSeconds").and_then(Value::as_i64).is_some_and(|g| g > 0);
        if old.pointer("/metadata/deletionTimestamp").is_some()
            && !grace_running
            && finalizers(&obj).is_empty()
            && spec_finalizers(&obj).is_empty()
        {
            let deleted = self
                .store
                .write(Op::Delete { key: res.key(ns, name), expect: Some(current.mod_rev) })
                .await
                .map_err(|e| self.write_error(res, name, e))?;
            self.release(&allocated).await;
            self.release_service(res, &old).await;
            return Ok(deleted);
        }
        let result = self
            .store
            .write(Op::Update { key: res.key(ns, name), value: obj.clone(), expect: Some(current.mod_rev) })
            .await;
        match result {
            Ok(r) => {
                if res.is("services") && !status_endpoint {
                    self.release_replaced(&old, &obj).await;
                }
                Ok(r)
            }
            Err(e) => {
                self.release(&allocated).await;
                Err(self.write_error(res, name, e))
            }
        }
    }

    fn write_error(&self, res: &Resource, name: &str, e: StoreError) -> ApiError {
        match e {
            StoreError::Conflict { .. } => ApiError::stale(&res.group_resource(), name),
            StoreError::NotFound => ApiError::not_found(&res.group_resource(), name),
            other => other.into(),
        }
    }

    #[allow(clippy::too_many_arguments)]
    pub async fn patch(
        &self,
        res: &'static Resource,
        ns: Option<&str>,
        name: &str,
        patch_type: PatchType,
        patch: &Value,
        endpoint: Endpoint,
        field_validation: &str,
        warnings: &mut Vec<String>,
        dry_run: bool,
    ) -> Result<Record, ApiError> {
        let status_endpoint = endpoint != Endpoint::Main;
        let key = res.key(ns, name);
        for attempt in 0.. {
            let current = match self.current(&key).await? {
                Some(c) => c,
                None if patch_type == PatchType::Apply && !status_endpoint => {
                    // server-side apply creates; the applier owns its configuration
                    let mut obj = patch.clone();
                    Api::check_type(&obj, res.kind, &res.api_version())?;
                    set_meta(&mut obj, "name", json!(name));
                    let mut entries = Vec::new();
                    let w = managed::writer();
                    managed::plan_apply(&mut entries, &json!({}), patch, patch, managed::shape_of(res), &w.manager, &res.api_version(), "", w.force, &now_rfc3339());
                    set_managed(&mut obj, &entries);
                    let obj = Api::decode(res, obj, field_validation, warnings)?;
                    return self.create(res, ns, obj, dry_run).await;
                }
                None => return Err(ApiError::not_found(&res.group_resource(), name)),
            };
            let mut old = current.json()?;
            crate::crd::objects::served_value(res, &mut old);
            let mut patched = apply_patch(res, &old, patch_type, patch)?;
            Api::check_type(&patched, res.kind, &res.api_version())?;
            if patch_type == PatchType::Apply {
                apply_ownership(res, &old, patch, &mut patched, status_endpoint)?;
            }
            let precondition = match meta_str(&patched, "resourceVersion").filter(|v| !v.is_empty()) {
                Some(v) if meta_str(&old, "resourceVersion") != Some(v) => Some(v.to_string()),
                _ => None,
            };
            if precondition.is_some() {
                return Err(ApiError::stale(&res.group_resource(), name));
            }
            let patched = Api::decode(res, patched, field_validation, warnings)?;
            match self.update_from(res, ns, name, &current, patched, endpoint, dry_run).await {
                Err(e) if e.code == 409 && e.reason == "Conflict" && attempt < 8 => continue,
                other => return other,
            }
        }
        Err(ApiError::internal("patch retries exhausted"))
    }

    /// DELETE semantics. Returns the object as it is after the call and whether it is gone.
    pub async fn delete(
        &self,
        res: &'static Resource,
        ns: Option<&str>,
        name: &str,
        opts: &DeleteOptions,
    ) -> Result<(Record, bool), ApiError> {
        let key = res.key(ns, name);
        for attempt in 0.. {
            let current = self
                .current(&key)
                .await?
                .ok_or_else(|| ApiError::not_found(&res.group_resource(), name))?;
            let mut obj = current.json()?;
            if let Some(uid) = &opts.precondition_uid {
                let actual = meta_str(&obj, "uid").unwrap_or("");
                if uid != actual {
                    return Err(ApiError::conflict(
                        &res.group_resource(),
                        name,
                        &format!("Precondition failed: UID in precondition: {uid}, UID in object meta: {actual}"),
                    ));
                }
            }
            if let Some(rv) = &opts.precondition_rv {
                if *rv != current.mod_rev.to_string() {
                    return Err(ApiError::conflict(
                        &res.group_resource(),
                        name,
                        &format!("Precondition failed: ResourceVersion in precondition: {rv}, ResourceVersion in object meta: {}", current.mod_rev),
                    ));
                }
            }
            let mut changed = false;
            // Graceful deletion of pods bound to a node.
            if res.is("pods") {
                let bound = obj.pointer("/spec/nodeName").and_then(|n| n.as_str()).map(|n| !n.is_empty()).unwrap_or(false);
                let phase = obj.pointer("/status/phase").and_then(|p| p.as_str()).unwrap_or("");
                let terminal = phase == "Succeeded" || phase == "Failed";
                let default_grace = obj.pointer("/spec/terminationGracePeriodSeconds").and_then(|g| g.as_i64()).unwrap_or(30);
                let mut grace = opts.grace_period_seconds.unwrap_or(default_grace).max(0);
                if !bound || terminal {
                    grace = 0;
                }
                let existing = obj.pointer("/metadata/deletionGracePeriodSeconds").and_then(|g| g.as_i64());
                if grace == 0 && existing.is_some_and(|e| e > 0) {
                    // Shortened to 0 (the kubelet's final delete): with finalizers left, the
                    // pod goes as soon as they do.
                    set_meta(&mut obj, "deletionTimestamp", json!(now_rfc3339()));
                    set_meta(&mut obj, "deletionGracePeriodSeconds", json!(0));
                    changed = true;
                }
                if grace > 0 {
                    if existing.map(|e| grace < e).unwrap_or(true) {
                        let at = jiff::Timestamp::now()
                            .checked_add(jiff::SignedDuration::from_secs(grace))
                            .ok()
                            .and_then(|t| t.round(jiff::Unit::Second).ok())
                            .map(|t| t.to_string())
                            .unwrap_or_default();
                        set_meta(&mut obj, "deletionTimestamp", json!(at));
                        set_meta(&mut obj, "deletionGracePeriodSeconds", json!(grace));
                        changed = true;
                    }
                    if !changed {
                        return Ok((current, false));
                    }
                }
            }
            // Finalizers from the propagation policy.
            let policy = opts.propagation_policy.clone().or_else(|| {
                opts.orphan_dependents.map(|o| if o { "Orphan".to_string() } else { "Background".to_string() })
            });
            let mut fins = finalizers(&obj);
            let deleting = obj.pointer("/metadata/deletionTimestamp").is_some();
            match policy.as_deref() {
                Some("Orphan") if !fins.contains(&"orphan".to_string()) && !deleting => fins.push("orphan".into()),
                Some("Foreground") if !fins.contains(&"foregroundDeletion".to_string()) && !deleting => {
                    fins.push("foregroundDeletion".into())
                }
                Some("Orphan") | Some("Foreground") | Some("Background") | None => {}
                Some(other) => {
                    return Err(ApiError::invalid(
                        "DeleteOptions",
                        "",
                        "",
                        &[FieldError::not_supported("propagationPolicy", json!(other), &["Foreground", "Background", "Orphan"])],
                    ))
                }
            }
            if res.is("namespaces") && !deleting {
                obj["status"]["phase"] = json!("Terminating");
                changed = true;
            }
            let ns_finalizers = res.is("namespaces")
                && obj.pointer("/spec/finalizers").and_then(|f| f.as_array()).map(|a| !a.is_empty()).unwrap_or(false);
            if !fins.is_empty() || ns_finalizers || changed && obj.pointer("/metadata/deletionGracePeriodSeconds").and_then(|g| g.as_i64()).unwrap_or(0) > 0 {
                if !fins.is_empty() {
                    set_meta(&mut obj, "finalizers", json!(fins));
                }
                if obj.pointer("/metadata/deletionTimestamp").is_none() {
                    set_meta(&mut obj, "deletionTimestamp", json!(now_rfc3339()));
                    set_meta(&mut obj, "deletionGracePeriodSeconds", json!(0));
                }
                if opts.dry_run {
                    return Ok((current, false));
                }
                let mut cmp = obj.clone();
                set_meta(&mut cmp, "resourceVersion", json!(current.mod_rev.to_string()));
                if cmp == current.json()? {
                    return Ok((current, false));
                }
                match self.store.write(Op::Update { key: key.clone(), value: obj, expect: Some(current.mod_rev) }).await {
                    Ok(r) => return Ok((r, false)),
                    Err(StoreError::Conflict { .. }) if attempt < 8 => continue,
                    Err(e) => return Err(self.write_error(res, name, e)),
                }
            }
            if opts.dry_run {
                return Ok((current, true));
            }
            match self.store.write(Op::Delete { key: key.clone(), expect: Some(current.mod_rev) }).await {
                Ok(r) => {
                    self.release_service(res, &obj).await;
                    return Ok((r, true));
                }
                Err(StoreError::Conflict { .. }) if attempt < 8 => continue,
                Err(e) => return Err(self.write_error(res, name, e)),
            }
        }
        Err(ApiError::internal("delete retries exhausted"))
    }

    async fn release_service(&self, res: &Resource, svc: &Value) {
        if !res.is("services") {
            return;
        }
        let owner = Owner::of(svc);
        for item in crate::service_alloc::service_items(svc) {
            self.allocations.release(item, &owner).await;
        }
    }

    /// After an update: gives back what the old Service held and the new one does not.
    async fn release_replaced(&self, old: &Value, new: &Value) {
        let kept = crate::service_alloc::service_items(new);
        let owner = Owner::of(old);
        for item in crate::service_alloc::service_items(old).into_iter().filter(|i| !kept.contains(i)) {
            self.allocations.release(item, &owner).await;
        }
    }

    /// Gives back what one call of allocate_service claimed (its write failed or was a no-op).
    async fn release(&self, a: &Allocated) {
        for item in &a.items {
            self.allocations.release(*item, &a.owner).await;
        }
    }

    /// Allocates the cluster IP and node ports a Service needs (given or picked), claiming them
    /// in the store (a dry run only checks), recording what this call claimed so a failed write
    /// can give it back.
    async fn allocate_service(&self, svc: &mut Value, old: Option<&Value>, name: &str, dry_run: bool) -> Result<Allocated, ApiError> {
        let mut done = Allocated { owner: Owner::of(old.unwrap_or(svc)), items: Vec::new() };
        let result = self.allocate_service_inner(svc, old, &mut done, dry_run).await;
        match result {
            Ok(()) => Ok(done),
            Err(e) => {
                self.release(&done).await;
                Err(match e {
                    AllocFailure::Invalid(errs) => ApiError::invalid("Service", "", name, &errs),
                    AllocFailure::Store(e) => e.into(),
                })
            }
        }
    }

    async fn allocate_service_inner(&self, svc: &mut Value, old: Option<&Value>, done: &mut Allocated, dry_run: bool) -> Result<(), AllocFailure> {
        let ty = svc.pointer("/spec/type").and_then(|t| t.as_str()).unwrap_or("ClusterIP").to_string();
        let old_ips = old.map(cluster_ips).unwrap_or_default();
        if ty == "ExternalName" {
            return Ok(());
        }
        let owner = done.owner.clone();
        let requested = svc.pointer("/spec/clusterIP").and_then(|c| c.as_str()).unwrap_or("").to_string();
        if requested != "None" {
            let ip = if requested.is_empty() {
                if let Some(ip) = old_ips.first() {
                    *ip
                } else {
                    let ip = self.allocations.claim_next_ip(&owner, dry_run).await.map_err(|e| {
                        AllocFailure::from_claim(e, |e| {
                            vec![FieldError::invalid("spec.clusterIPs", json!([]), format!("failed to allocate IP: {e}"))]
                        })
                    })?;
                    if !dry_run {
                        done.items.push(Item::Ip(ip));
                    }
                    ip
                }
            } else {
                let ip: IpAddr = requested.parse().map_err(|_| {
                    AllocFailure::Invalid(vec![FieldError::invalid("spec.clusterIPs[0]", json!(requested), "must be a valid IP address, (e.g. 10.9.8.7 or 2001:db8::ffff)")])
                })?;
                if !old_ips.contains(&ip) {
                    let claimed = self.allocations.claim(Item::Ip(ip), &owner, dry_run).await.map_err(|e| {
                        AllocFailure::from_claim(e, |e| {
                            let msg = match e {
                                AllocError::IpTaken => "failed to allocate IP ".to_string() + &requested + ": provided IP is already allocated",
                                other => format!("failed to allocate IP {requested}: {other}"),
                            };
                            vec![FieldError::invalid("spec.clusterIPs", json!([requested]), &msg)]
                        })
                    })?;
                    if claimed && !dry_run {
                        done.items.push(Item::Ip(ip));
                    }
                }
                ip
            };
            svc["spec"]["clusterIP"] = json!(ip.to_string());
            svc["spec"]["clusterIPs"] = json!([ip.to_string()]);
            svc["spec"]["ipFamilies"] = json!([if ip.is_ipv4() { "IPv4" } else { "IPv6" }]);
            svc["spec"]["ipFamilyPolicy"] = json!("SingleStack");
        } else {
            svc["spec"]["clusterIPs"] = json!(["None"]);
            svc["spec"]["ipFamilies"] = json!(["IPv4"]);
            svc["spec"]["ipFamilyPolicy"] = json!("SingleStack");
        }
        if ty == "NodePort" || ty == "LoadBalancer" {
            let old_ports = old.map(node_ports).unwrap_or_default();
            let mut errs = Vec::new();
            let mut picked: Vec<u16> = Vec::new();
            let count = svc.pointer("/spec/ports").and_then(Value::as_array).map(Vec::len).unwrap_or(0);
            for i in 0..count {
                let requested = svc["spec"]["ports"][i].get("nodePort").and_then(|n| n.as_i64()).unwrap_or(0);
                if requested == 0 {
                    match self.allocations.claim_next_port(&owner, dry_run, &picked).await {
                        Ok(n) => {
                            picked.push(n);
                            if !dry_run {
                                done.items.push(Item::Port(n));
                            }
                            svc["spec"]["ports"][i]["nodePort"] = json!(n);
                        }
                        Err(ClaimError::Alloc(e)) => errs.push(FieldError::invalid(format!("spec.ports[{i}].nodePort"), json!(0), format!("failed to allocate port: {e}"))),
                        Err(ClaimError::Store(e)) => return Err(AllocFailure::Store(e)),
                    }
                } else {
                    let n = u16::try_from(requested).unwrap_or(0);
                    if old_ports.contains(&n) {
                        continue;
                    }
                    let claim = if picked.contains(&n) {
                        Err(ClaimError::Alloc(AllocError::PortTaken))
                    } else {
                        self.allocations.claim(Item::Port(n), &owner, dry_run).await
                    };
                    match claim {
                        Ok(claimed) => {
                            picked.push(n);
                            if claimed && !dry_run {
                                done.items.push(Item::Port(n));
                            }
                        }
                        Err(ClaimError::Alloc(e)) => errs.push(FieldError::invalid(format!("spec.ports[{i}].nodePort"), json!(requested), e.to_string())),
                        Err(ClaimError::Store(e)) => return Err(AllocFailure::Store(e)),
                    }
                }
            }
            if !errs.is_empty() {
                return Err(AllocFailure::Invalid(errs));
            }
        } else if let Some(Value::Array(list)) = svc.pointer_mut("/spec/ports") {
            for p in list.iter_mut().filter_map(|p| p.as_object_mut()) {
                p.remove("nodePort");
            }
        }
        Ok(())
    }
}

enum AllocFailure {
    Invalid(Vec<FieldError>),
    Store(StoreError),
}

impl AllocFailure {
    fn from_claim(e: ClaimError, invalid: impl FnOnce(AllocError) -> Vec<FieldError>) -> AllocFailure {
        match e {
            ClaimError::Alloc(e) => AllocFailure::Invalid(invalid(e)),
            ClaimError::Store(e) => AllocFailure::Store(e),
        }
    }
}

/// What one allocate_service call claimed, and for whom.
#[derive(Default)]
struct Allocated {
    owner: Owner,
    items: Vec<Item>,
}

fn cluster_ips(svc: &Value) -> Vec<IpAddr> {
    let mut out: Vec<IpAddr> = svc
        .pointer("/spec/clusterIPs")
        .and_then(|c| c.as_array())
        .map(|a| a.iter().filter_map(|s| s.as_str()?.parse().ok()).collect())
        .unwrap_or_default();
    if let Some(ip) = svc.pointer("/spec/clusterIP").and_then(|c| c.as_str()?.parse().ok()) {
        if !out.contains(&ip) {
            out.push(ip);
        }
    }
    out
}

fn node_ports(svc: &Value) -> Vec<u16> {
    svc.pointer("/spec/ports")
        .and_then(|p| p.as_array())
        .map(|a| {
            a.iter()
                .filter_map(|p| p.get("nodePort")?.as_u64().and_then(|n| u16::try_from(n).ok()))
                .collect()
        })
        .unwrap_or_default()
}

/// Sets apiVersion and kind as upstream returns them.
pub fn with_type(res: &Resource, mut obj: Value) -> Value {
    if let Some(m) = obj.as_object_mut() {
        let mut out = serde_json::Map::new();
        out.insert("kind".into(), json!(res.kind));
        out.insert("apiVersion".into(), json!(res.api_version()));
        for (k, v) in std::mem::take(m) {
            if k != "kind" && k != "apiVersion" {
                out.insert(k, v);
            }
        }
        *m = out;
    }
    obj
}

/// Paths of fields present in `input` that decoding dropped.
fn unknown_fields(input: &Value, decoded: &Value, path: String, out: &mut Vec<String>) {
    match (input, decoded) {
        (Value::Object(a), Value::Object(b)) => {
            for (k, v) in a {
                let p = if path.is_empty() { k.clone() } else { format!("{path}.{k}") };
                match b.get(k) {
                    Some(d) => unknown_fields(v, d, p, out),
                    None if v.is_null() => {}
                    None => out.push(p),
                }
            }
        }
        (Value::Array(a), Value::Array(b)) => {
            for (i, (x, y)) in a.iter().zip(b.iter()).enumerate() {
                unknown_fields(x, y, format!("{path}[{i}]"), out);
            }
        }
        _ => {}
    }
}

/// Server-side apply's ownership on top of the merge: conflicts with other managers (409 unless
/// forced), fields the applier no longer applies removed, managedFields updated.
fn apply_ownership(res: &Resource, old: &Value, patch: &Value, merged: &mut Value, status_endpoint: bool) -> Result<(), ApiError> {
    let w = managed::writer();
    let mut entries = managed::entries_of(old);
    // through the status subresource an apply owns only what it says of status
    let applied = if status_endpoint { json!({"status": patch.get("status").cloned().unwrap_or(json!({}))}) } else { patch.clone() };
    let sub = if status_endpoint { "status" } else { "" };
    let plan = managed::plan_apply(&mut entries, old, &applied, merged, managed::shape_of(res), &w.manager, &res.api_version(), sub, w.force, &now_rfc3339());
    if !plan.conflicts.is_empty() && !w.force {
        let causes: Vec<Value> = plan
            .conflicts
            .iter()
            .map(|c| json!({"reason": "FieldManagerConflict", "message": format!("conflict with \"{}\" using {}", c.manager, c.api_version), "field": c.field}))
            .collect();
        let name = meta_str(old, "name").unwrap_or("");
        let mut err = ApiError::new(409, "Conflict", managed::conflict_message(&plan.conflicts)).with_details(res.group, res.plural, name);
        if let Some(Value::Object(d)) = err.details.as_mut() {
            d.insert("causes".into(), Value::Array(causes));
        }
        return Err(err);
    }
    for p in &plan.remove {
        managed::remove_at(merged, p);
    }
    set_managed(merged, &entries);
    Ok(())
}

pub fn apply_patch(res: &Resource, old: &Value, patch_type: PatchType, patch: &Value) -> Result<Value, ApiError> {
    match patch_type {
        PatchType::Json => {
            let p: json_patch::Patch = serde_json::from_value(patch.clone())
                .map_err(|e| ApiError::bad_request(format!("the server rejected our request due to an error in our request: {e}")))?;
            let mut doc = old.clone();
            json_patch::patch(&mut doc, &p).map_err(|e| ApiError::new(422, "Invalid", format!("the server rejected our request due to an error in our request: {e}")))?;
            Ok(doc)
        }
        PatchType::Merge => {
            if !patch.is_object() {
                return Err(ApiError::bad_request("the patch must be a JSON object"));
            }
            let mut doc = old.clone();
            json_patch::merge(&mut doc, patch);
            Ok(doc)
        }
        PatchType::Strategic if res.custom.is_some() => Err(ApiError::new(
            415,
            "UnsupportedMediaType",
            "the body of the request was in an unknown format - accepted media types include: application/json-patch+json, application/merge-patch+json, application/apply-patch+yaml",
        )),
        PatchType::Apply if res.custom.is_some() => {
            if !patch.is_object() {
                return Err(ApiError::bad_request("the patch must be a JSON object"));
            }
            let mut doc = old.clone();
            json_patch::merge(&mut doc, patch);
            Ok(doc)
        }
        PatchType::Strategic | PatchType::Apply => {
            if !patch.is_object() {
                return Err(ApiError::bad_request("the patch must be a JSON object"));
            }
            crate::smp::apply(res.kind, old, patch).map_err(|e| ApiError::bad_request(e.to_string()))
        }
    }
}

fn encode_continue(rev: Revision, last_key: &str) -> String {
    let token = json!({"v": "meta.k8s.io/v1", "rv": rev, "start": format!("{last_key}\u{0}")});
    base64::engine::general_purpose::URL_SAFE.encode(token.to_string())
}

fn decode_continue(token: &str) -> Result<(Revision, String), ApiError> {
    let bad = || ApiError::bad_request("continue key is not valid: incorrect encoded start resourceVersion (version meta.k8s.io/v1)");
    let raw = base64::engine::general_purpose::URL_SAFE
        .decode(token)
        .or_else(|_| base64::engine::general_purpose::URL_SAFE_NO_PAD.decode(token))
        .map_err(|_| bad())?;
    let v: Value = serde_json::from_slice(&raw).map_err(|_| bad())?;
    let rev = v.get("rv").and_then(|r| r.as_i64()).ok_or_else(bad)?;
    let start = v.get("start").and_then(|s| s.as_str()).ok_or_else(bad)?;
    Ok((rev, start.trim_end_matches('\u{0}').to_string()))
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn continue_tokens_round_trip() {
        let t = encode_continue(42, "/core/pods/default/a");
        assert_eq!(decode_continue(&t).unwrap(), (42, "/core/pods/default/a".to_string()));
        assert_eq!(decode_continue("garbage!").unwrap_err().code, 400);
    }

    #[test]
    fn unknown_field_paths() {
        let mut out = Vec::new();
        unknown_fields(
            &json!({"spec": {"containers": [{"name": "a", "imagee": "x"}], "foo": 1, "n": null}}),
            &json!({"spec": {"containers": [{"name": "a"}]}}),
            String::new(),
            &mut out,
        );
        assert_eq!(out, vec!["spec.containers[0].imagee", "spec.foo"]);
    }
}
