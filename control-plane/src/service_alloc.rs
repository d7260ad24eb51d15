//! Service ClusterIP and NodePort allocation that every API server on one store shares.
//!
//! Each allocated address and port is a key of its own in the store, created with
//! create-if-absent: `/registry/ipaddresses/<ip>` (an object shaped as upstream's
//! networking.k8s.io/v1 IPAddress, at the key upstream keeps those at) and
//! `/registry/servicenodeports/<port>` (ferro's own, the same shape). Two API servers that pick
//! the same address at the same moment both try to create its key; the store (one etcd
//! transaction comparing create_revision with 0) lets exactly one succeed and the other picks
//! again. What one process keeps in memory is a hint, never the authority: the items it knows
//! to be claimed (listed from the store once, then its own claims and releases, the claims it
//! found taken, refreshed by every repair run), where a pick looks for a free one — so a pick
//! costs a few operations, not a listing of every claim (10,000 Services made one after the
//! other listed 50 million claims). An item another API server claimed since is found taken
//! by the create and the pick tries again.
//!
//! A claim names its Service (namespace, name and uid). A claim whose Service never got stored
//! (a crash between the claim and the Service write) or whose release was lost is a leak;
//! [`ServiceAllocations::repair`], run at start and then periodically by every API server,
//! deletes a claim that it found leaked on two consecutive runs with the same revision (an
//! in-flight create is never older than one run), and creates the claims of stored Services
//! that have none (stores written before claims existed).

use std::collections::{BTreeMap, HashSet};
use std::net::IpAddr;
use std::sync::{Arc, Mutex};

use serde_json::{json, Value};

use crate::alloc::{AllocError, IpAllocator, PortAllocator};
use crate::store::{Op, Revision, Store, StoreError};

/// Store key prefix of the address claims (`/registry/ipaddresses/` in etcd).
pub const IP_PREFIX: &str = "/networking.k8s.io/ipaddresses/";
/// Store key prefix of the NodePort claims (`/registry/servicenodeports/` in etcd).
pub const PORT_PREFIX: &str = "/ferro.dev/servicenodeports/";
const SERVICES_PREFIX: &str = "/core/services/";
const UID_ANNOTATION: &str = "ferro.dev/service-uid";
/// Picks retried when another API server took the picked item first.
const PICK_ATTEMPTS: usize = 16;

#[derive(Debug, thiserror::Error)]
pub enum ClaimError {
    #[error(transparent)]
    Alloc(#[from] AllocError),
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// The Service a claim belongs to.
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash)]
pub struct Owner {
    pub namespace: String,
    pub name: String,
    pub uid: String,
}

impl Owner {
    pub fn of(svc: &Value) -> Owner {
        let meta = |f: &str| svc.pointer(&format!("/metadata/{f}")).and_then(Value::as_str).unwrap_or("").to_string();
        Owner { namespace: meta("namespace"), name: meta("name"), uid: meta("uid") }
    }

    fn of_claim(claim: &Value) -> Owner {
        let s = |p: &str| claim.pointer(p).and_then(Value::as_str).unwrap_or("").to_string();
        Owner {
            namespace: s("/spec/parentRef/namespace"),
            name: s("/spec/parentRef/name"),
            uid: claim
                .pointer("/metadata/annotations")
                .and_then(|a| a.get(UID_ANNOTATION))
                .and_then(Value::as_str)
                .unwrap_or("")
                .to_string(),
        }
    }
}

/// One allocated item.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Item {
    Ip(IpAddr),
    Port(u16),
}

impl Item {
    pub fn key(&self) -> String {
        match self {
            Item::Ip(ip) => format!("{IP_PREFIX}{ip}"),
            Item::Port(p) => format!("{PORT_PREFIX}{p}"),
        }
    }

    fn parse(key: &str) -> Option<Item> {
        if let Some(ip) = key.strip_prefix(IP_PREFIX) {
            return ip.parse().ok().map(Item::Ip);
        }
        key.strip_prefix(PORT_PREFIX)?.parse().ok().map(Item::Port)
    }

    /// The claim object: upstream's IPAddress shape for addresses, the same shape for ports.
    fn claim(&self, owner: &Owner) -> Value {
        let (api_version, kind, name, labels) = match self {
            Item::Ip(ip) => (
                "networking.k8s.io/v1",
                "IPAddress",
                ip.to_string(),
                json!({
                    "ipaddress.kubernetes.io/ip-family": if ip.is_ipv4() { "IPv4" } else { "IPv6" },
                    "ipaddress.kubernetes.io/managed-by": "ipallocator.k8s.io",
                }),
            ),
            Item::Port(p) => ("ferro.dev/v1", "ServiceNodePort", p.to_string(), json!({})),
        };
        json!({
            "apiVersion": api_version,
            "kind": kind,
            "metadata": {
                "name": name,
                "labels": labels,
                "annotations": { UID_ANNOTATION: owner.uid },
                "creationTimestamp": jiff::Timestamp::now().round(jiff::Unit::Second).map(|t| t.to_string()).unwrap_or_default(),
            },
            "spec": { "parentRef": { "group": "", "resource": "services", "namespace": owner.namespace, "name": owner.name } },
        })
    }
}

/// The addresses and ports a stored Service holds.
pub fn service_items(svc: &Value) -> Vec<Item> {
    let mut out: Vec<Item> = svc
        .pointer("/spec/clusterIPs")
        .and_then(Value::as_array)
        .map(|a| a.iter().filter_map(|s| s.as_str()?.parse().ok()).map(Item::Ip).collect())
        .unwrap_or_default();
    if let Some(ip) = svc.pointer("/spec/clusterIP").and_then(|c| c.as_str()?.parse().ok()) {
        if !out.contains(&Item::Ip(ip)) {
            out.push(Item::Ip(ip));
        }
    }
    if let Some(ports) = svc.pointer("/spec/ports").and_then(Value::as_array) {
        out.extend(
            ports
                .iter()
                .filter_map(|p| p.get("nodePort")?.as_u64().and_then(|n| u16::try_from(n).ok()))
                .map(Item::Port),
        );
    }
    out
}

/// What one repair run did.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct RepairReport {
    /// Claims of stored Services that were missing and got created.
    pub created: Vec<Item>,
    /// Claims found leaked on two consecutive runs and deleted.
    pub released: Vec<Item>,
    /// Claims found leaked for the first time (deleted on the next run if still leaked).
    pub suspected: usize,
    /// Items two stored Services hold at once (reported, left alone).
    pub conflicts: Vec<Item>,
}

/// What a repair run does.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct RepairPlan {
    /// Claims to create for stored Services that hold an item without one.
    pub missing: Vec<(Item, Owner)>,
    /// Claims leaked on this run and the last, at the same revision: delete (guarded by it).
    pub release: Vec<(Item, Revision)>,
    /// Claims leaked on this run (the next run's `previous`).
    pub leaked: HashSet<(Item, Revision)>,
    /// Items two stored Services hold.
    pub conflicts: Vec<Item>,
}

/// What a repair run decides from the claims and the Services it listed: a pure function.
/// `previous` holds the leaks (key, revision) of the last run.
pub fn plan_repair(claims: &BTreeMap<Item, (Owner, Revision)>, services: &[Value], previous: &HashSet<(Item, Revision)>) -> RepairPlan {
    let mut held: BTreeMap<Item, Owner> = BTreeMap::new();
    let mut conflicts = Vec::new();
    for svc in services {
        let owner = Owner::of(svc);
        for item in service_items(svc) {
            if let Some(other) = held.get(&item) {
                if *other != owner {
                    conflicts.push(item);
                }
                continue;
            }
            held.insert(item, owner.clone());
        }
    }
    let missing = held
        .iter()
        .filter(|(item, _)| !claims.contains_key(item))
        .map(|(item, owner)| (*item, owner.clone()))
        .collect();
    let mut release = Vec::new();
    let mut leaked = HashSet::new();
    for (item, (owner, rev)) in claims {
        if held.get(item) == Some(owner) {
            continue;
        }
        if previous.contains(&(*item, *rev)) {
            release.push((*item, *rev));
        } else {
            leaked.insert((*item, *rev));
        }
    }
    RepairPlan { missing, release, leaked, conflicts }
}

pub struct ServiceAllocations {
    store: Arc<dyn Store>,
    /// Empty allocators holding the ranges (`--service-cluster-ip-range`,
    /// `--service-node-port-range`).
    ips: IpAllocator,
    ports: PortAllocator,
    leaked: Mutex<HashSet<(Item, Revision)>>,
    /// The items this server knows to be claimed (see the module's notes); None until listed.
    known: Mutex<Option<Known>>,
}

/// The hint: the ranges' allocators with the items known to be claimed marked.
struct Known {
    ips: IpAllocator,
    ports: PortAllocator,
}

impl ServiceAllocations {
    pub fn new(store: Arc<dyn Store>, ips: IpAllocator, ports: PortAllocator) -> Self {
        ServiceAllocations { store, ips, ports, leaked: Mutex::default(), known: Mutex::new(None) }
    }

    fn known(&self) -> std::sync::MutexGuard<'_, Option<Known>> {
        self.known.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The hint from the store's claims (their keys only), of the most recent state: a claim
    /// another API server released just before must be seen free, or a range with a free
    /// item would be "full" (this server's cache may not hold that release yet).
    async fn list_known(&self) -> Result<Known, StoreError> {
        let mut k = Known { ips: self.ips.clone(), ports: self.ports.clone() };
        for prefix in [IP_PREFIX, PORT_PREFIX] {
            for r in &self.store.list_latest(prefix).await?.records {
                // claims outside the current ranges (a changed flag) are not ours to count
                let _outside = match Item::parse(&r.key) {
                    Some(Item::Ip(ip)) => k.ips.allocate(ip),
                    Some(Item::Port(p)) => k.ports.allocate(p),
                    None => Ok(()),
                };
            }
        }
        Ok(k)
    }

    /// Marks (`taken`) or unmarks `item` in the hint.
    fn note(&self, item: Item, taken: bool) {
        if let Some(k) = self.known().as_mut() {
            match (item, taken) {
                (Item::Ip(ip), true) => drop(k.ips.allocate(ip)),
                (Item::Ip(ip), false) => k.ips.release(ip),
                (Item::Port(p), true) => drop(k.ports.allocate(p)),
                (Item::Port(p), false) => k.ports.release(p),
            }
        }
    }

    /// A free item by the hint (listed first when there is none yet, and again when the hint
    /// says the range is full: releases by other servers are not in it), marked taken in it.
    async fn pick(&self, ip: bool, also_taken: &[u16]) -> Result<Item, ClaimError> {
        let pick = |k: &mut Known| -> Result<Item, AllocError> {
            if ip {
                return k.ips.allocate_next().map(Item::Ip);
            }
            let mut ports = k.ports.clone();
            for p in also_taken {
                let _outside = ports.allocate(*p);
            }
            let port = ports.allocate_next()?;
            let _ = k.ports.allocate(port);
            Ok(Item::Port(port))
        };
        if let Some(k) = self.known().as_mut() {
            match pick(k) {
                Err(AllocError::Full) => {}
                other => return Ok(other?),
            }
        }
        let mut fresh = self.list_known().await?;
        let item = pick(&mut fresh);
        *self.known() = Some(fresh);
        Ok(item?)
    }

    /// The first address of the range (the `kubernetes` Service's).
    pub fn first_ip(&self) -> IpAddr {
        self.ips.first()
    }

    async fn claims(&self, prefix: &str) -> Result<BTreeMap<Item, (Owner, Revision)>, StoreError> {
        // The most recent state (a consistent read): a claim another replica released just
        // before must not look taken, or a range with a free address would be "full" (seen once
        // in the etcd pass, another replica's delete not yet in this one's watch cache).
        let listing = self.store.list_latest(prefix).await?;
        let mut out = BTreeMap::new();
        for r in &listing.records {
            if let Some(item) = Item::parse(&r.key) {
                out.insert(item, (Owner::of_claim(&r.json()?), r.mod_rev));
            }
        }
        Ok(out)
    }

    /// Claims `item` for `owner` (checks only when `dry_run`). `Ok(true)`: claimed by this call;
    /// `Ok(false)`: the owner already held it.
    pub async fn claim(&self, item: Item, owner: &Owner, dry_run: bool) -> Result<bool, ClaimError> {
        match item {
            Item::Ip(ip) => self.ips.check(ip)?,
            Item::Port(p) => self.ports.check(p)?,
        }
        let taken = match item {
            Item::Ip(_) => AllocError::IpTaken,
            Item::Port(_) => AllocError::PortTaken,
        };
        let key = item.key();
        // Reads of a claim are of the most recent state: another API server may have made or
        // given it back a moment ago.
        if dry_run {
            return match self.store.get_latest(&key).await? {
                None => Ok(true),
                Some(r) if Owner::of_claim(&r.json()?) == *owner => Ok(false),
                Some(_) => Err(taken.into()),
            };
        }
        let result = match self.store.write(Op::Create { key: key.clone(), value: item.claim(owner) }).await {
            Ok(_) => Ok(true),
            Err(StoreError::AlreadyExists) => match self.store.get_latest(&key).await? {
                Some(r) if Owner::of_claim(&r.json()?) == *owner => Ok(false),
                _ => Err(taken.into()),
            },
            Err(e) => Err(e.into()),
        };
        match &result {
            Ok(_) | Err(ClaimError::Alloc(_)) => self.note(item, true),
            Err(_) => {}
        }
        result
    }

    /// Picks a free address and claims it (only picks when `dry_run`).
    pub async fn claim_next_ip(&self, owner: &Owner, dry_run: bool) -> Result<IpAddr, ClaimError> {
        match self.claim_next(owner, dry_run, true, &[]).await? {
            Item::Ip(ip) => Ok(ip),
            Item::Port(_) => Err(AllocError::Full.into()),
        }
    }

    /// Picks a free NodePort and claims it (only picks when `dry_run`). `also_taken`: ports this
    /// request picked already (a dry run claims nothing, so they are not in the store).
    pub async fn claim_next_port(&self, owner: &Owner, dry_run: bool, also_taken: &[u16]) -> Result<u16, ClaimError> {
        match self.claim_next(owner, dry_run, false, also_taken).await? {
            Item::Port(p) => Ok(p),
            Item::Ip(_) => Err(AllocError::Full.into()),
        }
    }

    async fn claim_next(&self, owner: &Owner, dry_run: bool, ip: bool, also_taken: &[u16]) -> Result<Item, ClaimError> {
        for _ in 0..PICK_ATTEMPTS {
            let item = self.pick(ip, also_taken).await?;
            let result = self.claim(item, owner, dry_run).await;
            match result {
                Ok(_) => {
                    if dry_run {
                        // picked, not held
                        self.note(item, false);
                    }
                    return Ok(item);
                }
                // another API server holds it (now marked in the hint): pick again
                Err(ClaimError::Alloc(AllocError::IpTaken | AllocError::PortTaken)) => continue,
                Err(e) => {
                    self.note(item, false);
                    return Err(e);
                }
            }
        }
        Err(AllocError::Full.into())
    }

    /// Gives `item` back if `owner` holds it. Failures are logged: the repair collects what a
    /// failed release leaves. The claim is read from the most recent state: another API server
    /// may have made it, and this server's cache may not hold it yet.
    pub async fn release(&self, item: Item, owner: &Owner) {
        let key = item.key();
        let result = async {
            let Some(r) = self.store.get_latest(&key).await? else { return Ok(()) };
            if Owner::of_claim(&r.json()?) != *owner {
                return Ok(());
            }
            match self.store.write(Op::Delete { key: key.clone(), expect: Some(r.mod_rev) }).await {
                Ok(_) | Err(StoreError::NotFound) => {
                    self.note(item, false);
                    Ok(())
                }
                Err(StoreError::Conflict { .. }) => Ok(()),
                Err(e) => Err(e),
            }
        }
        .await;
        if let Err(e) = result {
            tracing::warn!(claim = %key, error = %e, "releasing a service allocation failed; the repair will collect it");
        }
    }

    /// One repair run (see the module's notes).
    pub async fn repair(&self) -> Result<RepairReport, StoreError> {
        // Claims first, then Services, both of the most recent state: a Service created between
        // the two lists is seen.
        let mut claims = self.claims(IP_PREFIX).await?;
        claims.extend(self.claims(PORT_PREFIX).await?);
        let services: Vec<Value> = self
            .store
            .list_latest(SERVICES_PREFIX)
            .await?
            .records
            .iter()
            .map(|r| r.json())
            .collect::<Result<_, _>>()?;
        let previous = self.leaked.lock().unwrap_or_else(|p| p.into_inner()).clone();
        let RepairPlan { missing, release, leaked, conflicts } = plan_repair(&claims, &services, &previous);
        let mut report = RepairReport { suspected: leaked.len(), conflicts, ..Default::default() };
        for (item, owner) in missing {
            match self.store.write(Op::Create { key: item.key(), value: item.claim(&owner) }).await {
                Ok(_) => report.created.push(item),
                Err(StoreError::AlreadyExists) => {}
                Err(e) => return Err(e),
            }
        }
        for (item, rev) in release {
            match self.store.write(Op::Delete { key: item.key(), expect: Some(rev) }).await {
                Ok(_) => report.released.push(item),
                Err(StoreError::NotFound) | Err(StoreError::Conflict { .. }) => {}
                Err(e) => return Err(e),
            }
        }
        *self.leaked.lock().unwrap_or_else(|p| p.into_inner()) = leaked;
        // the hint starts again from the store (what other API servers released comes back)
        match self.list_known().await {
            Ok(k) => *self.known() = Some(k),
            Err(e) => tracing::warn!(error = %e, "listing the service allocations for the hint failed"),
        }
        if !report.created.is_empty() || !report.released.is_empty() || !report.conflicts.is_empty() {
            tracing::info!(created = ?report.created, released = ?report.released, conflicts = ?report.conflicts, "service allocations repaired");
        }
        Ok(report)
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn svc(ns: &str, name: &str, uid: &str, ip: &str, ports: &[u16]) -> Value {
        let ports: Vec<Value> = ports.iter().map(|p| json!({"port": 80, "nodePort": p})).collect();
        json!({"metadata": {"namespace": ns, "name": name, "uid": uid}, "spec": {"clusterIP": ip, "clusterIPs": [ip], "ports": ports}})
    }

    fn owner(ns: &str, name: &str, uid: &str) -> Owner {
        Owner { namespace: ns.into(), name: name.into(), uid: uid.into() }
    }

    fn ip(s: &str) -> Item {
        Item::Ip(s.parse().unwrap())
    }

    #[test]
    fn claim_objects_name_their_service_and_parse_back() {
        let o = owner("default", "web", "u1");
        let c = ip("10.96.0.7").claim(&o);
        assert_eq!(c["kind"], "IPAddress");
        assert_eq!(c["metadata"]["name"], "10.96.0.7");
        assert_eq!(Owner::of_claim(&c), o);
        assert_eq!(Item::parse(&ip("10.96.0.7").key()), Some(ip("10.96.0.7")));
        assert_eq!(Item::parse(&Item::Port(30001).key()), Some(Item::Port(30001)));
        assert_eq!(Item::parse("/core/services/default/web"), None);
        assert_eq!(
            service_items(&svc("default", "web", "u1", "10.96.0.7", &[30001])),
            vec![ip("10.96.0.7"), Item::Port(30001)]
        );
    }

    #[test]
    fn repair_creates_missing_claims_and_releases_a_leak_only_on_the_second_run() {
        let services = vec![svc("default", "web", "u1", "10.96.0.7", &[30001])];
        let mut claims = BTreeMap::new();
        claims.insert(ip("10.96.0.7"), (owner("default", "web", "u1"), 5));
        // a leak: the Service it names is gone (or a new Service of that name: another uid)
        claims.insert(ip("10.96.0.9"), (owner("default", "old", "u0"), 6));
        claims.insert(Item::Port(30002), (owner("default", "web", "u-previous"), 7));
        let RepairPlan { missing, release, leaked, conflicts } = plan_repair(&claims, &services, &HashSet::new());
        assert_eq!(missing, vec![(Item::Port(30001), owner("default", "web", "u1"))]);
        assert!(release.is_empty(), "never on the first sighting: the create may be in flight");
        assert_eq!(leaked.len(), 2);
        assert!(conflicts.is_empty());
        let RepairPlan { release, leaked: leaked2, .. } = plan_repair(&claims, &services, &leaked);
        assert_eq!(release, vec![(ip("10.96.0.9"), 6), (Item::Port(30002), 7)]);
        assert!(leaked2.is_empty());
        // re-created in between (another revision): a fresh suspicion, not a release
        claims.insert(ip("10.96.0.9"), (owner("default", "new", "u3"), 9));
        let RepairPlan { release, .. } = plan_repair(&claims, &services, &leaked);
        assert_eq!(release, vec![(Item::Port(30002), 7)]);
    }

    #[test]
    fn repair_reports_an_item_two_services_hold() {
        let services = vec![svc("a", "x", "u1", "10.96.0.7", &[]), svc("b", "y", "u2", "10.96.0.7", &[])];
        let RepairPlan { missing, conflicts, .. } = plan_repair(&BTreeMap::new(), &services, &HashSet::new());
        assert_eq!(missing.len(), 1);
        assert_eq!(conflicts, vec![ip("10.96.0.7")]);
    }

    /// A view of a store shared with other API servers whose plain reads (`get`, `list`)
    /// answer from a snapshot, as a watch cache that has not yet seen the other servers'
    /// writes does; the `_latest` reads and the writes go to the store.
    struct Lagging {
        store: Arc<dyn Store>,
        snapshot: Mutex<Option<BTreeMap<String, crate::store::Record>>>,
    }

    impl Lagging {
        fn new(store: &Arc<dyn Store>) -> Arc<Lagging> {
            Arc::new(Lagging { store: store.clone(), snapshot: Mutex::new(None) })
        }

        /// From now on plain reads answer what the store holds now.
        async fn freeze(&self) {
            let all = self.store.list("").await.unwrap().records;
            *self.snapshot.lock().unwrap() = Some(all.into_iter().map(|r| (r.key.to_string(), r)).collect());
        }
    }

    impl Store for Lagging {
        fn revision(&self) -> Revision {
            self.store.revision()
        }
        fn get<'a>(&'a self, key: &'a str) -> futures::future::BoxFuture<'a, Result<Option<crate::store::Record>, StoreError>> {
            let frozen = self.snapshot.lock().unwrap().as_ref().map(|m| m.get(key).cloned());
            match frozen {
                Some(r) => Box::pin(async move { Ok(r) }),
                None => self.store.get(key),
            }
        }
        fn list<'a>(&'a self, prefix: &'a str) -> futures::future::BoxFuture<'a, Result<crate::store::Listing, StoreError>> {
            let frozen = self.snapshot.lock().unwrap().as_ref().map(|m| {
                let records = m.iter().filter(|(k, _)| k.starts_with(prefix)).map(|(_, r)| r.clone()).collect();
                crate::store::Listing { records, revision: 0 }
            });
            match frozen {
                Some(l) => Box::pin(async move { Ok(l) }),
                None => self.store.list(prefix),
            }
        }
        fn write(&self, op: Op) -> futures::future::BoxFuture<'_, Result<crate::store::Record, StoreError>> {
            self.store.write(op)
        }
        fn watch(&self, after: Revision) -> Result<crate::store::Watch, StoreError> {
            self.store.watch(after)
        }
        fn oldest_watchable(&self) -> Revision {
            self.store.oldest_watchable()
        }
        fn get_latest<'a>(&'a self, key: &'a str) -> futures::future::BoxFuture<'a, Result<Option<crate::store::Record>, StoreError>> {
            self.store.get_latest(key)
        }
        fn list_latest<'a>(&'a self, prefix: &'a str) -> futures::future::BoxFuture<'a, Result<crate::store::Listing, StoreError>> {
            self.store.list_latest(prefix)
        }
    }

    #[tokio::test]
    async fn claims_made_and_released_by_another_server_count_though_this_ones_cache_lags() {
        use crate::alloc::Cidr;
        use crate::store::{EmbeddedStore, EmbeddedStoreOptions};
        let dir = tempfile::tempdir().unwrap();
        let store: Arc<dyn Store> =
            Arc::new(EmbeddedStore::open(&dir.path().join("s.redb"), crate::strategy::indexer(), EmbeddedStoreOptions::default()).unwrap());
        let (view_a, view_b) = (Lagging::new(&store), Lagging::new(&store));
        let servers = |view: &Arc<Lagging>| {
            let ips = IpAllocator::new(Cidr::parse("10.96.0.0/29").unwrap());
            ServiceAllocations::new(view.clone(), ips, PortAllocator::parse("30000-30001").unwrap())
        };
        let (a, b) = (servers(&view_a), servers(&view_b));
        // b's cache has seen none of a's claims; a fills the range
        view_b.freeze().await;
        let web = owner("default", "web", "u1");
        let mut taken = Vec::new();
        loop {
            match a.claim_next_ip(&web, false).await {
                Ok(ip) => taken.push(ip),
                Err(ClaimError::Alloc(AllocError::Full)) => break,
                Err(e) => panic!("{e}"),
            }
        }
        assert!(taken.len() >= 3, "{taken:?}");
        // a's cache holds every claim from now on
        view_a.freeze().await;
        // b gives one of a's addresses back: it is gone from the store
        let freed = Item::Ip(taken[1]);
        b.release(freed, &web).await;
        assert!(store.get(&freed.key()).await.unwrap().is_none(), "b did not release the claim its cache did not hold");
        // a, whose hint and cache say the range is full, finds it
        let again = a.claim_next_ip(&owner("default", "api", "u2"), false).await.unwrap();
        assert_eq!(Item::Ip(again), freed);
        // a release by a server that does not own the claim leaves it
        b.release(freed, &web).await;
        assert!(store.get(&freed.key()).await.unwrap().is_some());
    }
}
