//! EtcdStore against a real etcd (Debian's etcd-server) on loopback: writes and their
//! preconditions, the values it serves (byte for byte what the embedded store serves), lists
//! and watches from its cache, compaction, resuming and relisting when its etcd watch breaks,
//! mutual TLS, and keys it did not write. Needs etcd installed, so these tests are in the tier
//! scripts/test.sh runs (--include-ignored); without etcd they fail, they never skip.
#![allow(clippy::unwrap_used)]

mod common;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::etcd::Etcd;
use ferro_control_plane::config::etcd_key_layout;
use ferro_control_plane::store::{
    EmbeddedStore, EmbeddedStoreOptions, EtcdOptions, EtcdStore, EventKind, Op, Record, Store, StoreError,
};
use serde_json::json;

fn options(url: &str, history: usize) -> EtcdOptions {
    EtcdOptions {
        history,
        compaction_interval: Duration::ZERO,
        request_timeout: Duration::from_secs(10),
        start_timeout: Duration::from_secs(10),
        ..EtcdOptions::new(vec![url.to_string()])
    }
}

async fn connect(url: &str, history: usize) -> EtcdStore {
    EtcdStore::connect(options(url, history), etcd_key_layout("/registry"), ferro_control_plane::strategy::indexer())
        .await
        .unwrap()
}

fn pod(name: &str, labels: serde_json::Value, node: &str) -> serde_json::Value {
    json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": "default", "labels": labels, "uid": format!("uid-{name}")},
        "spec": {"nodeName": node, "containers": [{"name": "c", "image": "busybox"}]},
    })
}

const POD_KEY: &str = "/core/pods/default/";

fn key(name: &str) -> String {
    format!("{POD_KEY}{name}")
}

/// A record's value with its resourceVersion written as `rev`.
fn with_rv(r: &Record, rev: i64) -> String {
    String::from_utf8(r.value.to_vec())
        .unwrap()
        .replace(&format!("\"resourceVersion\":\"{}\"", r.mod_rev), &format!("\"resourceVersion\":\"{rev}\""))
}

async fn wait_until(what: &str, mut cond: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(20);
    while !cond() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "privileged: needs etcd (Debian etcd-server), run by scripts/test.sh"]
async fn writes_with_preconditions_serve_the_embedded_stores_bytes() {
    let etcd = Etcd::start();
    let store = connect(&etcd.url(), 100).await;
    let dir = tempfile::tempdir().unwrap();
    let embedded = EmbeddedStore::open(
        &dir.path().join("store.redb"),
        ferro_control_plane::strategy::indexer(),
        EmbeddedStoreOptions::default(),
    )
    .unwrap();

    // The same writes through both stores give the same records, but for the revisions.
    let mut ops = vec![
        Op::Create { key: key("a"), value: pod("a", json!({"app": "web"}), "n1") },
        Op::Create { key: key("b"), value: pod("b", json!({}), "n2") },
    ];
    let mut revs = Vec::new();
    for op in ops.drain(..) {
        let e = store.write(op.clone()).await.unwrap();
        let m = embedded.write(op).await.unwrap();
        assert_eq!(with_rv(&m, e.mod_rev), String::from_utf8(e.value.to_vec()).unwrap());
        assert_eq!(e.attrs, m.attrs);
        assert_eq!(e.create_rev, e.mod_rev);
        revs.push((e.mod_rev, m.mod_rev));
    }
    // the value carries the etcd revision as resourceVersion; etcd keeps it without
    let a = store.get(&key("a")).await.unwrap().unwrap();
    assert_eq!(a.json().unwrap()["metadata"]["resourceVersion"], revs[0].0.to_string());
    let raw = etcd.ok(&["get", "/registry/pods/default/a", "--print-value-only"]);
    assert!(raw.contains("\"name\":\"a\"") && !raw.contains("resourceVersion"), "{raw}");

    // update guarded by the mod revision: a stale one conflicts, the current one wins
    let mut changed = pod("a", json!({"app": "web", "v": "2"}), "n1");
    changed["metadata"]["resourceVersion"] = json!("999");
    let err = store
        .write(Op::Update { key: key("a"), value: changed.clone(), expect: Some(revs[0].0 - 1) })
        .await
        .unwrap_err();
    assert!(matches!(err, StoreError::Conflict { current } if current == revs[0].0), "{err:?}");
    let e = store.write(Op::Update { key: key("a"), value: changed.clone(), expect: Some(revs[0].0) }).await.unwrap();
    let m = embedded.write(Op::Update { key: key("a"), value: changed, expect: Some(revs[0].1) }).await.unwrap();
    assert_eq!(with_rv(&m, e.mod_rev), String::from_utf8(e.value.to_vec()).unwrap());
    assert_eq!((e.create_rev, e.attrs.labels.get("v").map(String::as_str)), (revs[0].0, Some("2")));
    // the read after the acknowledged write sees it
    assert_eq!(store.get(&key("a")).await.unwrap().unwrap().mod_rev, e.mod_rev);

    assert!(matches!(
        store.write(Op::Create { key: key("a"), value: pod("a", json!({}), "") }).await,
        Err(StoreError::AlreadyExists)
    ));
    assert!(matches!(
        store.write(Op::Update { key: key("zz"), value: pod("zz", json!({}), ""), expect: None }).await,
        Err(StoreError::NotFound)
    ));
    assert!(matches!(
        store.write(Op::Delete { key: key("a"), expect: Some(1) }).await,
        Err(StoreError::Conflict { .. })
    ));
    // a delete returns the last state stamped with the deletion's revision
    let d = store.write(Op::Delete { key: key("a"), expect: Some(e.mod_rev) }).await.unwrap();
    let md = embedded.write(Op::Delete { key: key("a"), expect: None }).await.unwrap();
    assert_eq!(with_rv(&md, d.mod_rev), String::from_utf8(d.value.to_vec()).unwrap());
    assert!(d.mod_rev > e.mod_rev);
    assert!(store.get(&key("a")).await.unwrap().is_none());
    assert!(matches!(store.write(Op::Delete { key: key("a"), expect: None }).await, Err(StoreError::NotFound)));

    // lists serve the same bytes too
    let le = store.list(POD_KEY).await.unwrap();
    let lm = embedded.list(POD_KEY).await.unwrap();
    assert_eq!(le.records.len(), 1);
    assert_eq!(with_rv(&lm.records[0], le.records[0].mod_rev), String::from_utf8(le.records[0].value.to_vec()).unwrap());
    assert_eq!(le.revision, d.mod_rev);
}

/// A write is acknowledged with etcd's answer, before the watch cache has applied it; reads
/// through the same store still see every write it acknowledged (a get of the key, a list of
/// anything), and a guarded write that conflicted with another server's write (or a create
/// refused because the other made the key) makes the next read of that key see that write.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "privileged: needs etcd (Debian etcd-server), run by scripts/test.sh"]
async fn reads_see_every_acknowledged_write_and_what_a_write_conflicted_with() {
    let etcd = Etcd::start();
    let store = Arc::new(connect(&etcd.url(), 100).await);
    // writers in parallel, each reading back every write at once
    let mut tasks = Vec::new();
    for w in 0..8 {
        let store = store.clone();
        tasks.push(tokio::spawn(async move {
            for i in 0..25 {
                let name = format!("w{w}-{i}");
                let c = store.write(Op::Create { key: key(&name), value: pod(&name, json!({}), "") }).await.unwrap();
                assert!(store.acknowledged() >= c.mod_rev);
                let got = store.get(&key(&name)).await.unwrap().expect("a created pod is readable at once");
                assert_eq!(got.mod_rev, c.mod_rev);
                let u = store
                    .write(Op::Update { key: key(&name), value: pod(&name, json!({"i": i.to_string()}), ""), expect: Some(c.mod_rev) })
                    .await
                    .unwrap();
                assert_eq!(store.get(&key(&name)).await.unwrap().unwrap().mod_rev, u.mod_rev);
                let listing = store.list(POD_KEY).await.unwrap();
                assert!(listing.revision >= u.mod_rev);
                let listed = listing.records.iter().find(|r| *r.key == *key(&name)).expect("listed after its write");
                assert_eq!(listed.mod_rev, u.mod_rev);
                if i % 5 == 0 {
                    let d = store.write(Op::Delete { key: key(&name), expect: Some(u.mod_rev) }).await.unwrap();
                    assert!(store.get(&key(&name)).await.unwrap().is_none(), "a deleted pod is gone at once");
                    assert!(store.list(POD_KEY).await.unwrap().records.iter().all(|r| *r.key != *key(&name)));
                    assert!(store.acknowledged() >= d.mod_rev);
                }
            }
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }

    // Another API server writes a key this one has read: this one's guarded write conflicts,
    // and its next read of the key has the other server's write, whatever its cache's lag.
    let other = connect(&etcd.url(), 100).await;
    for i in 0..20 {
        let name = format!("shared-{i}");
        let mine = store.write(Op::Create { key: key(&name), value: pod(&name, json!({}), "") }).await.unwrap();
        let theirs = other
            .write(Op::Update { key: key(&name), value: pod(&name, json!({"by": "other"}), ""), expect: None })
            .await
            .unwrap();
        let err = store
            .write(Op::Update { key: key(&name), value: pod(&name, json!({"by": "me"}), ""), expect: Some(mine.mod_rev) })
            .await
            .unwrap_err();
        assert!(matches!(err, StoreError::Conflict { current } if current == theirs.mod_rev), "{err:?}");
        let now = store.get(&key(&name)).await.unwrap().unwrap();
        assert_eq!(now.mod_rev, theirs.mod_rev, "the read after a conflict has the write it conflicted with");
        assert_eq!(now.attrs.labels.get("by").map(String::as_str), Some("other"));
    }

    // Both servers create the same key at once (the pod admission's on-the-spot `default`
    // ServiceAccount against the leader's serviceaccount loop): the loser's create is refused
    // as existing, and its next read has the winner's object, never "not found" from a cache
    // the winner's event has not reached yet.
    let stores: [&EtcdStore; 2] = [&store, &other];
    for i in 0..100 {
        let name = format!("raced-{i}");
        let (a, b) = tokio::join!(
            stores[0].write(Op::Create { key: key(&name), value: pod(&name, json!({"by": "0"}), "") }),
            stores[1].write(Op::Create { key: key(&name), value: pod(&name, json!({"by": "1"}), "") })
        );
        let (winner, loser) = match (a, b) {
            (Ok(w), Err(e)) => (w, { assert!(matches!(e, StoreError::AlreadyExists), "{e:?}"); stores[1] }),
            (Err(e), Ok(w)) => (w, { assert!(matches!(e, StoreError::AlreadyExists), "{e:?}"); stores[0] }),
            other => panic!("one create wins, one is refused: {other:?}"),
        };
        let now = loser.get(&key(&name)).await.unwrap().expect("the read after \"already exists\" finds the object");
        assert_eq!(now.mod_rev, winner.mod_rev);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "privileged: needs etcd (Debian etcd-server), run by scripts/test.sh"]
async fn lists_and_watches_from_a_revision_with_backlog_and_across_a_restart() {
    let etcd = Etcd::start();
    let store = connect(&etcd.url(), 100).await;
    let mut revs = Vec::new();
    for name in ["a", "b", "c"] {
        revs.push(store.write(Op::Create { key: key(name), value: pod(name, json!({}), "") }).await.unwrap().mod_rev);
    }
    let l = store.list(POD_KEY).await.unwrap();
    assert_eq!(l.records.iter().map(|r| r.key.to_string()).collect::<Vec<_>>(), vec![key("a"), key("b"), key("c")]);
    assert_eq!(l.revision, revs[2]);
    assert!(store.list("/core/nodes/").await.unwrap().records.is_empty());

    // from the first write: the two later ones as backlog, then the live feed
    let mut w = store.watch(revs[0]).unwrap();
    assert_eq!(w.backlog.iter().map(|e| (e.kind, e.rev)).collect::<Vec<_>>(), vec![(EventKind::Added, revs[1]), (EventKind::Added, revs[2])]);
    let u = store
        .write(Op::Update { key: key("b"), value: pod("b", json!({"x": "1"}), ""), expect: None })
        .await
        .unwrap();
    let ev = tokio::time::timeout(Duration::from_secs(5), w.recv()).await.unwrap().unwrap();
    assert_eq!((ev.kind, ev.rev), (EventKind::Modified, u.mod_rev));
    assert_eq!(ev.prev.as_ref().unwrap().mod_rev, revs[1]);

    // A second store (a restarted API server) loads history from etcd: watches resume from a
    // revision before it started.
    drop(store);
    let again = connect(&etcd.url(), 100).await;
    assert_eq!(again.revision(), u.mod_rev);
    let w = again.watch(revs[0]).unwrap();
    assert_eq!(w.backlog.iter().map(|e| e.rev).collect::<Vec<_>>(), vec![revs[1], revs[2], u.mod_rev]);
    assert_eq!(w.backlog[2].kind, EventKind::Modified);
    assert_eq!(again.list(POD_KEY).await.unwrap().records.len(), 3);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "privileged: needs etcd (Debian etcd-server), run by scripts/test.sh"]
async fn watches_older_than_the_cache_are_compacted_and_etcd_is_compacted_on_schedule() {
    let etcd = Etcd::start();
    let opts = EtcdOptions { compaction_interval: Duration::from_millis(300), ..options(&etcd.url(), 3) };
    let store = EtcdStore::connect(opts, etcd_key_layout("/registry"), ferro_control_plane::strategy::indexer())
        .await
        .unwrap();
    let mut revs = Vec::new();
    for i in 0..6 {
        revs.push(store.write(Op::Create { key: key(&format!("p{i}")), value: pod("p", json!({}), "") }).await.unwrap().mod_rev);
    }
    // (a read waits for the cache to have every acknowledged write; a watch does not)
    assert_eq!(store.list(POD_KEY).await.unwrap().revision, revs[5]);
    // the cache keeps the last 3 events
    assert_eq!(store.watch(revs[2]).unwrap().backlog.len(), 3);
    match store.watch(revs[1]) {
        Err(StoreError::Compacted { requested, oldest }) => assert_eq!((requested, oldest), (revs[1], revs[2])),
        Err(e) => panic!("expected Compacted, got {e:?}"),
        Ok(_) => panic!("expected Compacted, got a watch"),
    }
    // a list at an earlier revision comes from etcd while etcd has it (a continued list)
    let at = store.list_at(POD_KEY, revs[1]).await.unwrap();
    assert_eq!((at.revision, at.records.len()), (revs[1], 2));
    // Compaction rounds every 300 ms: the second one compacts what the first recorded.
    let first = revs[0].to_string();
    wait_until("etcd to compact the first write's revision", || {
        let out = etcd.etcdctl(&["get", "/registry/pods/default/p0", "--rev", &first]);
        String::from_utf8_lossy(&out.stderr).contains("compacted")
    })
    .await;
    match store.list_at(POD_KEY, revs[0]).await {
        Err(StoreError::Compacted { requested, .. }) => assert_eq!(requested, revs[0]),
        other => panic!("expected Compacted, got {other:?}"),
    }
    // the store keeps serving and writing
    store.write(Op::Create { key: key("after"), value: pod("after", json!({}), "") }).await.unwrap();
    assert_eq!(store.list(POD_KEY).await.unwrap().records.len(), 7);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "privileged: needs etcd (Debian etcd-server), run by scripts/test.sh"]
async fn consistent_reads_go_to_etcd_when_the_cache_lags_and_stay_on_the_cache_for_keys_outside_the_prefix() {
    let etcd = Etcd::start();
    // a server whose cache applies each batch of events 10 s late, and one that writes
    let delay = Duration::from_secs(10);
    let lagging = EtcdStore::connect(
        EtcdOptions { apply_delay: delay, ..options(&etcd.url(), 100) },
        etcd_key_layout("/registry"),
        ferro_control_plane::strategy::indexer(),
    )
    .await
    .unwrap();
    let writer = connect(&etcd.url(), 100).await;
    let reads = |s: &EtcdStore| {
        let r = s.consistent_reads();
        (r.from_cache.load(Ordering::SeqCst), r.from_etcd.load(Ordering::SeqCst))
    };
    let a = writer.write(Op::Create { key: key("a"), value: pod("a", json!({"app": "web"}), "n1") }).await.unwrap();

    // the most recent state through the lagging server comes from etcd: the same bytes
    let got = lagging.get_latest(&key("a")).await.unwrap().expect("a write the other server acknowledged");
    assert_eq!((got.mod_rev, got.create_rev, &got.value), (a.mod_rev, a.create_rev, &a.value));
    assert_eq!(got.attrs.labels.get("app").map(String::as_str), Some("web"));
    let listed = lagging.list_latest(POD_KEY).await.unwrap();
    assert_eq!(listed.records.iter().map(|r| r.key.to_string()).collect::<Vec<_>>(), vec![key("a")]);
    assert!(listed.revision >= a.mod_rev, "{} < {}", listed.revision, a.mod_rev);
    assert_eq!(listed.records[0].value, a.value);
    // a key nobody wrote: not found from etcd as well
    assert!(lagging.get_latest(&key("nobody")).await.unwrap().is_none());
    assert_eq!(reads(&lagging), (0, 3));

    // once the cache has caught up, reads are answered from it
    let deadline = Instant::now() + delay * 4;
    while lagging.revision() < a.mod_rev {
        assert!(Instant::now() < deadline, "the lagging cache never applied the write");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(lagging.get_latest(&key("a")).await.unwrap().unwrap().value, a.value);
    assert_eq!(reads(&lagging), (1, 3));

    // a key outside the prefix moves etcd's revision and brings the cache no event: the cache
    // is still current, so reads stay on it (and the next ones do not ask what moved it)
    etcd.ok(&["put", "/elsewhere/x", "1"]);
    assert_eq!(lagging.get_latest(&key("a")).await.unwrap().unwrap().value, a.value);
    assert_eq!(lagging.list_latest(POD_KEY).await.unwrap().records.len(), 1);
    assert_eq!(reads(&lagging), (3, 3));
    assert!(lagging.revision() < a.mod_rev + 1, "no event outside the prefix reaches the cache");
}

/// A TCP relay between the store and etcd that a test can cut (every connection dropped, new
/// ones refused) and restore: a network partition without touching etcd.
struct Relay {
    addr: std::net::SocketAddr,
    open: Arc<AtomicBool>,
    conns: Arc<Mutex<Vec<tokio::task::JoinHandle<()>>>>,
    accept: tokio::task::JoinHandle<()>,
}

impl Relay {
    async fn start(target: u16) -> Relay {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let open = Arc::new(AtomicBool::new(true));
        let conns: Arc<Mutex<Vec<tokio::task::JoinHandle<()>>>> = Arc::default();
        let accept = tokio::spawn({
            let (open, conns) = (open.clone(), conns.clone());
            async move {
                while let Ok((mut inbound, _)) = listener.accept().await {
                    if !open.load(Ordering::SeqCst) {
                        continue;
                    }
                    conns.lock().unwrap().push(tokio::spawn(async move {
                        if let Ok(mut outbound) = tokio::net::TcpStream::connect(("127.0.0.1", target)).await {
                            let _ = tokio::io::copy_bidirectional(&mut inbound, &mut outbound).await;
                        }
                    }));
                }
            }
        });
        Relay { addr, open, conns, accept }
    }

    fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    fn cut(&self) {
        self.open.store(false, Ordering::SeqCst);
        for c in self.conns.lock().unwrap().drain(..) {
            c.abort();
        }
    }

    fn restore(&self) {
        self.open.store(true, Ordering::SeqCst);
    }
}

impl Drop for Relay {
    fn drop(&mut self) {
        self.cut();
        self.accept.abort();
    }
}

fn etcdctl_put_pod(etcd: &Etcd, name: &str) {
    let v = serde_json::to_string(&pod(name, json!({}), "")).unwrap();
    etcd.ok(&["put", &format!("/registry/pods/default/{name}"), &v]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "privileged: needs etcd (Debian etcd-server), run by scripts/test.sh"]
async fn the_cache_resumes_after_its_etcd_watch_breaks_and_relists_after_compaction() {
    let mut etcd = Etcd::start();
    let relay = Relay::start(etcd.client_port).await;
    let store = connect(&relay.url(), 100).await;
    let first = store.write(Op::Create { key: key("a"), value: pod("a", json!({}), "") }).await.unwrap();
    let mut w = store.watch(first.mod_rev).unwrap();

    // 1. etcd is killed and restarted: the watch breaks; the cache resumes from its revision
    // and misses nothing written meanwhile by someone else.
    etcd.restart();
    etcdctl_put_pod(&etcd, "b");
    etcdctl_put_pod(&etcd, "c");
    let mut seen = Vec::new();
    while seen.len() < 2 {
        let ev = tokio::time::timeout(Duration::from_secs(20), w.recv()).await.expect("events after etcd's restart").unwrap();
        seen.push(ev.record.key.to_string());
    }
    assert_eq!(seen, vec![key("b"), key("c")]);
    let d = store.write(Op::Create { key: key("d"), value: pod("d", json!({}), "") }).await.unwrap();
    let ev = tokio::time::timeout(Duration::from_secs(5), w.recv()).await.unwrap().unwrap();
    assert_eq!((ev.rev, ev.record.key.to_string()), (d.mod_rev, key("d")));

    // 2. Cut off while others write and etcd compacts past the cache's revision: once back,
    // the cache relists; its old watches end and a watch from before the relist is 410.
    relay.cut();
    etcdctl_put_pod(&etcd, "e");
    etcd.ok(&["del", "/registry/pods/default/b"]);
    let status = etcd.ok(&["endpoint", "status", "--write-out", "json"]);
    let rev = serde_json::from_str::<serde_json::Value>(&status).unwrap()[0]["Status"]["header"]["revision"].as_i64().unwrap();
    etcd.ok(&["compaction", &rev.to_string()]);
    relay.restore();
    wait_until("the cache to relist", || matches!(store.watch(d.mod_rev), Err(StoreError::Compacted { .. }))).await;
    let live = tokio::time::timeout(Duration::from_secs(5), async {
        loop {
            match w.recv().await {
                Ok(_) => continue,
                Err(e) => return e,
            }
        }
    })
    .await
    .unwrap();
    assert!(matches!(live, tokio::sync::broadcast::error::RecvError::Closed), "{live:?}");
    let names: Vec<String> = store.list(POD_KEY).await.unwrap().records.iter().map(|r| r.key.to_string()).collect();
    assert_eq!(names, vec![key("a"), key("c"), key("d"), key("e")]);
    assert_eq!(store.revision(), rev);
    // and it follows etcd again
    let f = store.write(Op::Create { key: key("f"), value: pod("f", json!({}), "") }).await.unwrap();
    // (acknowledged before the cache has it: the event comes from the backlog or live)
    let mut after = store.watch(rev).unwrap();
    let ev = match after.backlog.pop() {
        Some(ev) => ev,
        None => tokio::time::timeout(Duration::from_secs(5), after.recv()).await.unwrap().unwrap(),
    };
    assert_eq!((ev.rev, ev.record.key.to_string()), (f.mod_rev, key("f")));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "privileged: needs etcd (Debian etcd-server), run by scripts/test.sh"]
async fn keys_ferro_did_not_write_under_its_prefix_are_ignored() {
    let etcd = Etcd::start();
    etcd.ok(&["put", "/registry/somethingelse/x", "{}"]);
    etcd.ok(&["put", "/registry/pods/default/broken", "not json"]);
    etcd.ok(&["put", "/elsewhere/pods/default/a", "{}"]);
    etcdctl_put_pod(&etcd, "good");
    let store = connect(&etcd.url(), 100).await;
    let names: Vec<String> = store.list(POD_KEY).await.unwrap().records.iter().map(|r| r.key.to_string()).collect();
    assert_eq!(names, vec![key("good")]);
    // and while following
    etcd.ok(&["put", "/registry/pods/default/broken2", "[1,2"]);
    etcd.ok(&["put", "/registry/unknown/y", "{}"]);
    let ok = store.write(Op::Create { key: key("next"), value: pod("next", json!({}), "") }).await.unwrap();
    // (a list waits for the cache to reach this server's acknowledged writes)
    assert_eq!(store.list(POD_KEY).await.unwrap().records.len(), 2);
    assert_eq!(store.revision(), ok.mod_rev);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "privileged: needs etcd (Debian etcd-server), run by scripts/test.sh"]
async fn mutual_tls_and_refused_certificates() {
    let etcd = Etcd::start_tls();
    let tls = etcd.tls.as_ref().unwrap();
    let with = |ca: Option<&std::path::Path>, cert: Option<&std::path::Path>, key: Option<&std::path::Path>| EtcdOptions {
        ca_file: ca.map(Into::into),
        cert_file: cert.map(Into::into),
        key_file: key.map(Into::into),
        start_timeout: Duration::from_secs(3),
        ..options(&etcd.url(), 10)
    };
    let indexer = ferro_control_plane::strategy::indexer;
    let store = EtcdStore::connect(with(Some(&tls.ca), Some(&tls.client_cert), Some(&tls.client_key)), etcd_key_layout("/registry"), indexer())
        .await
        .unwrap();
    store.write(Op::Create { key: key("a"), value: pod("a", json!({}), "") }).await.unwrap();
    assert_eq!(store.list(POD_KEY).await.unwrap().records.len(), 1);

    // no client certificate: etcd refuses, and connect says so within its start timeout
    let started = Instant::now();
    let err = EtcdStore::connect(with(Some(&tls.ca), None, None), etcd_key_layout("/registry"), indexer()).await.err().unwrap();
    assert!(err.to_string().contains("did not answer within"), "{err}");
    assert!(started.elapsed() < Duration::from_secs(10));
    // a server certificate from another CA
    let other = tempfile::tempdir().unwrap();
    let other_ca = ferro_control_plane::pki::Ca::load_or_create(other.path()).unwrap();
    drop(other_ca);
    let err = EtcdStore::connect(
        with(Some(&other.path().join("ca.crt")), Some(&tls.client_cert), Some(&tls.client_key)),
        etcd_key_layout("/registry"),
        indexer(),
    )
    .await
    .err()
    .unwrap();
    assert!(err.to_string().contains("did not answer within"), "{err}");
    // half a client certificate is a configuration error
    let err = EtcdStore::connect(with(Some(&tls.ca), Some(&tls.client_cert), None), etcd_key_layout("/registry"), indexer()).await.err().unwrap();
    assert!(err.to_string().contains("both a cert file and a key file"), "{err}");
}

#[test]
#[ignore = "privileged: needs etcd (Debian etcd-server), run by scripts/test.sh"]
fn the_server_exits_with_a_clear_error_when_etcd_is_unreachable() {
    // a port nobody listens on
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let dir = tempfile::tempdir().unwrap();
    let started = Instant::now();
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_ferro-control-plane"))
        .args(["--data-dir", dir.path().to_str().unwrap(), "--bind-address", "127.0.0.1", "--secure-port", "0"])
        .args(["--etcd-servers", &format!("http://127.0.0.1:{port}")])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains(&format!("etcd at http://127.0.0.1:{port} did not answer within")), "{stderr}");
    assert!(started.elapsed() < Duration::from_secs(60));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "privileged: needs etcd (Debian etcd-server), run by scripts/test.sh"]
async fn writes_through_a_server_whose_cache_lags_find_what_another_server_wrote() {
    use ferro_control_plane::alloc::{Cidr, IpAllocator, PortAllocator};
    use ferro_control_plane::api::{Api, DeleteOptions, Endpoint, PatchType};
    use ferro_control_plane::resources;
    let etcd = Etcd::start();
    let api = |store: EtcdStore| async move {
        let ips = IpAllocator::new(Cidr::parse("10.96.0.0/24").unwrap());
        Api::new(Arc::new(store), ips, PortAllocator::parse("30000-32767").unwrap()).await.unwrap()
    };
    // a server whose cache applies each batch of events 10 s late, and one that writes
    let lagging = EtcdStore::connect(
        EtcdOptions { apply_delay: Duration::from_secs(10), ..options(&etcd.url(), 100) },
        etcd_key_layout("/registry"),
        ferro_control_plane::strategy::indexer(),
    )
    .await
    .unwrap();
    let (lagging, writer) = (api(lagging).await, api(connect(&etcd.url(), 100).await).await);
    let namespaces = resources::find("", "v1", "namespaces").unwrap();
    let cms = resources::find("", "v1", "configmaps").unwrap();
    writer.create(namespaces, None, json!({"metadata": {"name": "team"}}), false).await.unwrap();
    for name in ["deleted", "patched", "replaced"] {
        writer.create(cms, Some("team"), json!({"metadata": {"name": name}, "data": {"k": "v"}}), false).await.unwrap();
    }
    // through the lagging server, before its cache holds any of it
    lagging.delete(cms, Some("team"), "deleted", &DeleteOptions::default()).await.expect("delete");
    let patch = json!({"metadata": {"labels": {"by": "lagging"}}});
    let mut warnings = Vec::new();
    lagging
        .patch(cms, Some("team"), "patched", PatchType::Merge, &patch, Endpoint::Main, "Strict", &mut warnings, false)
        .await
        .expect("patch");
    let replaced = json!({"metadata": {"name": "replaced", "namespace": "team"}, "data": {"k": "w"}});
    lagging.update(cms, Some("team"), "replaced", replaced, Endpoint::Main, false).await.expect("update");
    lagging.create(cms, Some("team"), json!({"metadata": {"name": "new"}}), false).await.expect("the namespace exists");
    // what the writer sees
    let get = |name: &'static str| {
        let writer = &writer;
        async move { writer.get_latest(cms, Some("team"), name).await.ok().map(|r| r.json().unwrap()) }
    };
    assert!(get("new").await.is_some());
    assert!(get("deleted").await.is_none());
    assert_eq!(get("patched").await.unwrap().pointer("/metadata/labels/by"), Some(&json!("lagging")));
    assert_eq!(get("replaced").await.unwrap().pointer("/data/k"), Some(&json!("w")));
}
